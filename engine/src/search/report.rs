//! A search's trials as people read them (`drivetrain trials`, the API, the web view):
//! one row a trial with the budget it used and the best value of the search's metric it
//! reported, and each trial's curve of that metric.

use serde::Serialize;

use super::SearchPlan;
use crate::state::{MetricRow, TrialRecord};

/// One trial, for a table.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct TrialRow {
    /// `t000`, `t001`, …: the same on every try of the run.
    pub id: String,
    pub index: usize,
    pub params: serde_json::Map<String, serde_json::Value>,
    /// `pending`, `running`, `paused`, `promoted`, `pruned`, `failed`, `stale` or
    /// `succeeded`.
    pub state: String,
    /// The rung it runs, ran or is decided to run (0 first).
    pub rung: usize,
    /// The last step it reported (the budget it used where it reported no step).
    pub steps: i64,
    /// The budget of the last rung it ended.
    pub budget_used: u64,
    /// The best value of the search's metric it reported.
    pub metric: Option<f64>,
    /// The metric it ended each rung with.
    pub rung_metrics: Vec<f64>,
    pub attempts: u32,
    /// Why it failed, was pruned or went stale.
    pub reason: Option<String>,
    pub started_at: Option<String>,
    pub updated_at: String,
}

/// The rows of `trials`, with what `metrics` says of each.
pub fn rows(plan: &SearchPlan, trials: &[TrialRecord], metrics: &[MetricRow]) -> Vec<TrialRow> {
    trials
        .iter()
        .map(|r| {
            let t = &r.trial;
            let mut steps = None;
            let mut best: Option<f64> = None;
            for m in metrics.iter().filter(|m| m.trial == t.index) {
                steps = steps.max(m.step);
                if m.name == plan.metric && best.is_none_or(|b| plan.better(m.value, b)) {
                    best = Some(m.value);
                }
            }
            TrialRow {
                id: t.id.clone(),
                index: t.index,
                params: t.params.clone(),
                state: t.state.as_str().to_owned(),
                rung: t.rung,
                steps: steps.map_or(t.used as i64, |s| s.max(0)),
                budget_used: t.used,
                metric: best,
                rung_metrics: t.metrics.clone(),
                attempts: t.attempts,
                reason: t.reason.clone(),
                started_at: r.started_at.clone(),
                updated_at: r.updated_at.clone(),
            }
        })
        .collect()
}

/// Each trial's curve of the search's metric: `[step, value]` points in the order
/// reported (a value without a step at the count of values before it).
pub fn curves(
    plan: &SearchPlan,
    trials: &[TrialRecord],
    metrics: &[MetricRow],
) -> Vec<(String, Vec<[f64; 2]>)> {
    trials
        .iter()
        .map(|r| {
            let mut points: Vec<[f64; 2]> = Vec::new();
            for m in metrics
                .iter()
                .filter(|m| m.trial == r.trial.index && m.name == plan.metric)
            {
                let x = m.step.map_or(points.len() as f64 + 1.0, |s| s as f64);
                points.push([x, m.value]);
            }
            (r.trial.id.clone(), points)
        })
        .collect()
}
