//! A search's trials and the metrics they push ([`TrialStore`]): each trial one row,
//! written whole whenever the search decides something about it (before it acts), and
//! each metric a trial reports one row (run, stage, trial, step, name, value, time).

use serde::Serialize;

use super::{RunId, StateError};
use crate::search::rungs::Trial;

/// A trial as stored: the search's view of it, the outputs of its last rung that
/// succeeded, and when it was first started and last changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialRecord {
    #[serde(flatten)]
    pub trial: Trial,
    pub outputs: serde_json::Value,
    /// The `values.json` of its last rung that succeeded (`{}` when none).
    pub values: serde_json::Value,
    pub started_at: Option<String>,
    pub updated_at: String,
    /// The executor's handle of its last attempt (to stop it when its engine is gone).
    pub handle: Option<String>,
}

/// One value a trial reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricRow {
    /// The trial's index.
    pub trial: usize,
    /// The step it reported at (none when it gave none).
    pub step: Option<i64>,
    pub name: String,
    pub value: f64,
    /// When the engine read it (RFC 3339).
    pub at: String,
}

/// The most metric rows one trial keeps; past it the trial is told and its further rows
/// are counted, not kept.
pub const MAX_METRIC_ROWS: usize = 100_000;

/// Trials and their metrics.
pub trait TrialStore: Send + Sync {
    /// Records `trial` as it is now (inserted the first time), with the outputs and
    /// values of its last rung that succeeded (`{}` when none).
    fn put_trial(
        &self,
        run: &RunId,
        stage: &str,
        trial: &Trial,
        kept: (&serde_json::Value, &serde_json::Value),
    ) -> Result<(), StateError>;

    /// Records the executor's handle of a trial's running attempt.
    fn set_trial_handle(
        &self,
        run: &RunId,
        stage: &str,
        index: usize,
        handle: &str,
    ) -> Result<(), StateError>;

    /// Every trial of a stage's search, by index.
    fn trials(&self, run: &RunId, stage: &str) -> Result<Vec<TrialRecord>, StateError>;

    /// Appends metric rows of a stage's trials, in one commit.
    fn add_metrics(&self, run: &RunId, stage: &str, rows: &[MetricRow]) -> Result<(), StateError>;

    /// Every metric row of a stage's trials, in the order reported.
    fn metrics(&self, run: &RunId, stage: &str) -> Result<Vec<MetricRow>, StateError>;
}

/// A stored trial's fields, from the text columns they are kept in.
pub(super) struct TrialColumns {
    pub idx: i64,
    pub id: String,
    pub params: String,
    pub state: String,
    pub rung: i64,
    pub metrics: String,
    pub used: i64,
    pub attempts: i64,
    pub reason: Option<String>,
    pub outputs: String,
    pub started_at: Option<String>,
    pub updated_at: String,
    pub handle: Option<String>,
    pub values: String,
}

impl TrialColumns {
    pub(super) fn record(self) -> TrialRecord {
        use crate::search::rungs::TrialState;
        TrialRecord {
            trial: Trial {
                index: self.idx.max(0) as usize,
                id: self.id,
                params: serde_json::from_str(&self.params).unwrap_or_default(),
                // A state this engine does not know (written by a newer one) runs again.
                state: TrialState::parse(&self.state).unwrap_or(TrialState::Running),
                rung: self.rung.max(0) as usize,
                metrics: serde_json::from_str(&self.metrics).unwrap_or_default(),
                used: self.used.max(0) as u64,
                attempts: self.attempts.clamp(0, i64::from(u32::MAX)) as u32,
                reason: self.reason,
            },
            outputs: serde_json::from_str(&self.outputs).unwrap_or_default(),
            values: serde_json::from_str(&self.values).unwrap_or_default(),
            started_at: self.started_at,
            updated_at: self.updated_at,
            handle: self.handle,
        }
    }
}
