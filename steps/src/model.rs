//! The reference model: logistic regression predicting whether a frame is risky (a hard
//! brake, cut-in, pedestrian close call or lost lane) from its signals, and its metrics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Frame columns the model reads (nulls count as the column's mean), and two indicators.
pub const FEATURES: &[&str] = &[
    "speed_mps",
    "accel_x",
    "accel_y",
    "yaw_rate",
    "steering",
    "brake_pressure",
    "lateral_offset_m",
    "lane_confidence",
    "object_distance_m",
    "object_rel_speed_mps",
    "is_night",
    "is_rain",
];

/// A trained model, as `model/model.json` holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Model {
    pub features: Vec<String>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub weights: Vec<f64>,
    pub bias: f64,
    pub epochs: u32,
}

/// The raw feature vector of a row.
pub fn raw_features(row: &Map<String, Value>) -> Vec<Option<f64>> {
    FEATURES
        .iter()
        .map(|f| match *f {
            "is_night" => Some(f64::from(u8::from(
                row.get("time_of_day").and_then(Value::as_str) == Some("night"),
            ))),
            "is_rain" => Some(f64::from(u8::from(
                row.get("weather").and_then(Value::as_str) == Some("rain"),
            ))),
            name => row.get(name).and_then(Value::as_f64),
        })
        .collect()
}

/// Per-feature mean and standard deviation over `rows`, for standardizing.
pub fn normalization(rows: &[Vec<Option<f64>>]) -> (Vec<f64>, Vec<f64>) {
    let d = FEATURES.len();
    let mut mean = vec![0.0; d];
    let mut std = vec![1.0; d];
    for j in 0..d {
        let vals: Vec<f64> = rows.iter().filter_map(|r| r[j]).collect();
        if vals.is_empty() {
            continue;
        }
        let m = vals.iter().sum::<f64>() / vals.len() as f64;
        let v = vals.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / vals.len() as f64;
        mean[j] = m;
        std[j] = if v > 1e-12 { v.sqrt() } else { 1.0 };
    }
    (mean, std)
}

/// Standardizes a raw feature vector.
pub fn standardize(raw: &[Option<f64>], mean: &[f64], std: &[f64]) -> Vec<f64> {
    raw.iter()
        .zip(mean.iter().zip(std))
        .map(|(x, (m, s))| (x.unwrap_or(*m) - m) / s)
        .collect()
}

pub fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

impl Model {
    pub fn probability(&self, row: &Map<String, Value>) -> f64 {
        let x = standardize(&raw_features(row), &self.mean, &self.std);
        sigmoid(self.bias + x.iter().zip(&self.weights).map(|(a, b)| a * b).sum::<f64>())
    }
}

#[derive(Default, Clone, Copy)]
struct Counts {
    tp: u64,
    fp: u64,
    fn_: u64,
    tn: u64,
}

impl Counts {
    fn add(&mut self, predicted: bool, actual: bool) {
        match (predicted, actual) {
            (true, true) => self.tp += 1,
            (true, false) => self.fp += 1,
            (false, true) => self.fn_ += 1,
            (false, false) => self.tn += 1,
        }
    }
    fn recall(&self) -> Option<f64> {
        let p = self.tp + self.fn_;
        (p > 0).then(|| self.tp as f64 / p as f64)
    }
    fn precision(&self) -> Option<f64> {
        let p = self.tp + self.fp;
        (p > 0).then(|| self.tp as f64 / p as f64)
    }
}

/// Metrics of `model` on labelled rows: `accuracy`, `f1`, `loss`, `frames`, and
/// `recall` / `precision` overall (`all`) and per corner-case slice (frames a rule
/// matched). A slice without positives has no recall (null).
pub fn evaluate(model: &Model, rows: &[Map<String, Value>]) -> Value {
    let mut all = Counts::default();
    let mut slices: BTreeMap<String, Counts> = BTreeMap::new();
    let mut loss = 0.0;
    for r in rows {
        let actual = r.get("label").and_then(Value::as_bool).unwrap_or(false);
        let p = model.probability(r).clamp(1e-9, 1.0 - 1e-9);
        loss -= if actual { p.ln() } else { (1.0 - p).ln() };
        let predicted = p >= 0.5;
        all.add(predicted, actual);
        for rule in r
            .get("rules")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .split(',')
        {
            if !rule.is_empty() {
                slices
                    .entry(rule.to_owned())
                    .or_default()
                    .add(predicted, actual);
            }
        }
    }
    let n = rows.len().max(1) as f64;
    let f1 = match (all.precision(), all.recall()) {
        (Some(p), Some(r)) if p + r > 0.0 => 2.0 * p * r / (p + r),
        _ => 0.0,
    };
    let mut recall = Map::new();
    let mut precision = Map::new();
    recall.insert("all".into(), json!(all.recall()));
    precision.insert("all".into(), json!(all.precision()));
    for (s, c) in &slices {
        recall.insert(s.clone(), json!(c.recall()));
        precision.insert(s.clone(), json!(c.precision()));
    }
    json!({
        "frames": rows.len(),
        "accuracy": (all.tp + all.tn) as f64 / n,
        "f1": f1,
        "loss": loss / n,
        "recall": recall,
        "precision": precision,
    })
}

/// A model from its `model.json` bytes.
pub(crate) fn load(bytes: &[u8]) -> anyhow::Result<Model> {
    serde_json::from_slice(bytes).map_err(|e| anyhow::anyhow!("not a model: {e}"))
}
