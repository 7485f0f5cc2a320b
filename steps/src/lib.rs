//! Built-in steps of the driving-data loop: their names, versions, inputs, outputs and
//! configuration types.
//!
//! Each step's `with:` block is a serde type here, checked at `drivetrain validate` time
//! through the engine's located deserializer, and published as JSON Schema. [`all`] is
//! the one explicit list the binary registers. The steps' execution (MCAP ingest,
//! DataFusion mining, training) builds on these types.

use std::marker::PhantomData;

use drivetrain_engine::step::{check_typed_config, Step};
use drivetrain_engine::yaml::{Node, YamlPath};
use drivetrain_engine::Diagnostic;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// A step described by static metadata and a config type `C`.
struct Builtin<C> {
    name: &'static str,
    version: &'static str,
    summary: &'static str,
    inputs: &'static [(&'static str, bool)],
    outputs: &'static [&'static str],
    config: PhantomData<fn() -> C>,
}

impl<C: DeserializeOwned + JsonSchema + 'static> Step for Builtin<C> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn version(&self) -> &'static str {
        self.version
    }

    fn summary(&self) -> &'static str {
        self.summary
    }

    fn outputs(&self) -> &'static [&'static str] {
        self.outputs
    }

    fn inputs(&self) -> &'static [(&'static str, bool)] {
        self.inputs
    }

    fn check_config(&self, with: Option<&Node<'_>>, path: &YamlPath) -> Vec<Diagnostic> {
        check_typed_config::<C>(with, path)
    }

    fn config_schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(C)).unwrap_or_default()
    }
}

fn builtin<C: DeserializeOwned + JsonSchema + 'static>(
    name: &'static str,
    summary: &'static str,
    inputs: &'static [(&'static str, bool)],
    outputs: &'static [&'static str],
) -> Box<dyn Step> {
    Box::new(Builtin::<C> {
        name,
        version: env!("CARGO_PKG_VERSION"),
        summary,
        inputs,
        outputs,
        config: PhantomData,
    })
}

/// Every built-in step, in the order of the driving loop.
pub fn all() -> Vec<Box<dyn Step>> {
    vec![
        builtin::<FleetSimConfig>(
            "fleet-sim",
            "write synthetic fleet drive logs (MCAP) with rare events injected",
            &[],
            &["logs"],
        ),
        builtin::<IngestConfig>(
            "ingest",
            "drive logs (MCAP, JSON lines, TuSimple labels) to Parquet frame tables",
            &[("logs", false)],
            &["frames", "index"],
        ),
        builtin::<MineConfig>(
            "mine-corner-cases",
            "named SQL rules over the frames to tagged corner-case frames",
            &[("frames", true)],
            &["corner_cases"],
        ),
        builtin::<LabelExportConfig>(
            "label-export",
            "budgeted, de-duplicated frames to Label Studio and COCO tasks",
            &[("corner_cases", true), ("frames", false)],
            &["tasks"],
        ),
        builtin::<LabelImportConfig>(
            "label-import",
            "completed labels to a split training dataset (Parquet)",
            &[("tasks", false), ("labels", false)],
            &["dataset"],
        ),
        builtin::<TrainConfig>(
            "train",
            "the reference lane model, trained data-parallel across ranks",
            &[("dataset", true)],
            &["model", "metrics"],
        ),
        builtin::<ValidateConfig>(
            "validate",
            "the candidate against production on every slice, against a gate",
            &[
                ("model", true),
                ("dataset", true),
                ("corner_cases", false),
                ("baseline", false),
            ],
            &["report"],
        ),
        builtin::<PromoteConfig>(
            "promote",
            "register the model version with its lineage and move an alias",
            &[("model", true), ("report", false)],
            &["registration"],
        ),
    ]
}

/// `fleet-sim`: synthetic drives.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetSimConfig {
    /// Number of drives. Default 4.
    #[serde(default)]
    pub drives: Option<u32>,
    /// Length of each drive, as a duration (`10m`). Default `2m`.
    #[serde(default)]
    pub duration: Option<String>,
    /// Signal rate in Hz (10 to 20). Default 10.
    #[serde(default)]
    pub rate_hz: Option<f64>,
    /// Seed; the same seed writes the same bytes.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Rare events per minute of driving, by kind.
    #[serde(default)]
    pub events: Option<EventRates>,
}

/// Injected event rates, per minute.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRates {
    #[serde(default)]
    pub hard_brake: Option<f64>,
    #[serde(default)]
    pub cut_in: Option<f64>,
    #[serde(default)]
    pub pedestrian_close_call: Option<f64>,
    #[serde(default)]
    pub low_lane_confidence: Option<f64>,
}

/// `ingest`: logs to frame tables.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// A store URL or directory of drive logs; default: the `logs` input.
    #[serde(default)]
    pub source: Option<String>,
    /// The log format. Default `auto` (by extension and magic bytes).
    #[serde(default)]
    pub format: Option<LogFormat>,
}

/// Drive log formats `ingest` reads.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Auto,
    Mcap,
    Jsonl,
    Tusimple,
}

/// `mine-corner-cases`: named SQL rules.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MineConfig {
    /// Rule name → SQL boolean expression over the frame columns (window functions allowed).
    pub rules: IndexMap<String, String>,
}

/// `label-export`: selection for labeling.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelExportConfig {
    /// The most frames to send to labeling.
    pub budget: u32,
    /// Diversity: at most this many frames per drive per rule.
    #[serde(default)]
    pub max_per_drive_per_rule: Option<u32>,
    /// Frames of one drive closer than this (a duration) count as duplicates.
    #[serde(default)]
    pub dedup_window: Option<String>,
    /// Export formats. Default both.
    #[serde(default)]
    pub formats: Vec<LabelFormat>,
}

/// Labeling task formats.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LabelFormat {
    LabelStudio,
    Coco,
}

/// `label-import`: labels back into a dataset.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelImportConfig {
    /// A store URL of completed labels; default: the `labels` input, else the demo
    /// ground truth of `tasks`.
    #[serde(default)]
    pub source: Option<String>,
    /// Fractions for train / val / test. Default 0.8 / 0.1 / 0.1.
    #[serde(default)]
    pub split: Option<Split>,
    #[serde(default)]
    pub seed: Option<u64>,
}

/// Dataset split fractions.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Split {
    pub train: f64,
    pub val: f64,
    #[serde(default)]
    pub test: Option<f64>,
}

/// `train`: the reference trainer.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    #[serde(default)]
    pub epochs: Option<u32>,
    /// Global batch size, split across ranks.
    #[serde(default)]
    pub batch_size: Option<u32>,
    #[serde(default)]
    pub learning_rate: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
}

/// `validate`: the promotion gate.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateConfig {
    /// A condition over the metrics, e.g. `candidate.iou >= production.iou - 0.01`.
    pub gate: String,
    /// The registered model to compare with; default: the `production` alias.
    #[serde(default)]
    pub baseline: Option<String>,
}

/// `promote`: registry update.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteConfig {
    /// The registered model's name.
    pub model: String,
    /// The alias to move: `candidate` or `production`.
    pub alias: String,
    /// The registry URL; default: the object-store registry of the artifact store.
    #[serde(default)]
    pub registry: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_outputs_declared() {
        let steps = all();
        let mut names: Vec<_> = steps.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), steps.len());
        assert!(steps.iter().all(|s| !s.outputs().is_empty()));
    }

    #[test]
    fn configs_are_checked_with_locations() {
        let node = drivetrain_engine::yaml::parse("budget: lots\nformats: [coco, yolo]\n").unwrap();
        let step = all()
            .into_iter()
            .find(|s| s.name() == "label-export")
            .unwrap();
        let diags = step.check_config(Some(&node), &YamlPath::root().key("with"));
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].path.as_deref(), Some("with.budget"));
        let schema = step.config_schema();
        assert!(schema["properties"]["budget"].is_object());
    }

    #[test]
    fn a_missing_with_block_reports_required_fields() {
        let step = all()
            .into_iter()
            .find(|s| s.name() == "mine-corner-cases")
            .unwrap();
        let diags = step.check_config(None, &YamlPath::root().key("with"));
        assert_eq!(diags[0].code, "missing-field");
        assert!(diags[0].message.contains("rules"));
    }
}
