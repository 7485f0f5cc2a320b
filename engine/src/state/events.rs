//! What triggers and notifications keep in the state store: the inbox of discovered
//! objects (each consumed by exactly one run), each trigger's cursor and pause, and the
//! outbox of notifications (delivered at least once, de-duplicated by id).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{RunId, RunRecord, StateError};

/// An object a trigger discovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct InboxObject {
    /// The object's URL (`s3://fleet/incoming/veh7/a.mcap`).
    pub url: String,
    /// Its ETag, or its version where the store has versions (`""` where neither):
    /// with the URL, what makes it the same object when it is announced twice.
    pub etag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// When the store says it was last modified (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified: Option<String>,
    /// Its `group_by` group (`""` without one).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// When the trigger first saw it.
    pub discovered_at: String,
    /// What came with it: a webhook call's body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// Objects waiting in one group of a trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    pub group: String,
    pub count: u64,
    /// When the oldest of them was discovered.
    pub oldest: String,
}

/// A trigger as the state store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct TriggerRecord {
    pub pipeline: String,
    pub trigger: String,
    /// The pipeline file it was registered from.
    pub file: String,
    /// The greatest key listed so far: the next listing starts after it.
    pub cursor: Option<String>,
    pub paused: bool,
    pub paused_at: Option<String>,
    /// When the whole prefix was last listed.
    pub rescanned_at: Option<String>,
    /// When waiting objects were last weighed, and what was decided.
    pub evaluated_at: Option<String>,
    pub last_reason: Option<String>,
    /// Objects waiting for a run, and when the oldest of them was discovered.
    pub waiting: u64,
    pub oldest_waiting: Option<String>,
    /// Objects consumed by runs, and skipped on a `resume --skip`.
    pub consumed: u64,
    pub skipped: u64,
}

impl TriggerRecord {
    /// How long the oldest waiting object has waited, in seconds (none waiting: `None`).
    pub fn lag_seconds(&self) -> Option<f64> {
        let oldest = chrono::DateTime::parse_from_rfc3339(self.oldest_waiting.as_deref()?).ok()?;
        Some(
            (chrono::Utc::now() - oldest.with_timezone(&chrono::Utc)).num_milliseconds() as f64
                / 1000.0,
        )
    }
}

/// The objects a run consumed, and the trigger that started it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct RunTrigger {
    #[serde(rename = "name")]
    pub trigger: String,
    pub objects: Vec<InboxObject>,
}

/// A notification in the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct OutboxItem {
    /// `RUN/EVENT/SINK`: one per run, event and sink.
    pub id: String,
    pub pipeline: String,
    pub run_id: String,
    /// `started`, `succeeded`, `failed`, `error`, `cancelled`.
    pub event: String,
    /// The sink, as JSON ([`crate::events::Sink`]; secrets by name only).
    pub sink: serde_json::Value,
    /// The CloudEvent (JSON).
    pub body: serde_json::Value,
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    pub attempts: u32,
    /// When the next delivery is due (pending).
    pub next_at: String,
    pub last_error: Option<String>,
    pub created_at: String,
    pub delivered_at: Option<String>,
}

/// Triggers' objects and cursors.
pub trait TriggerStore: Send + Sync {
    /// Registers a trigger of the pipeline in `file` (a known one keeps its state and
    /// takes the file); `paused` is its state when new.
    fn ensure_trigger(
        &self,
        pipeline: &str,
        trigger: &str,
        file: &str,
        paused: bool,
    ) -> Result<(), StateError>;
    /// Records discovered objects (those already known, by URL and ETag, are left as
    /// they are) and, in the same transaction, moves the cursor (when `cursor` is given)
    /// and notes a full listing (`rescanned`). Returns how many objects were new.
    fn add_objects(
        &self,
        pipeline: &str,
        trigger: &str,
        objects: &[InboxObject],
        cursor: Option<&str>,
        rescanned: bool,
    ) -> Result<usize, StateError>;
    /// The objects waiting, by group.
    fn waiting(&self, pipeline: &str, trigger: &str) -> Result<Vec<Waiting>, StateError>;
    /// In one transaction: the oldest waiting objects of `group`, at most `max`; if there
    /// are at least `min`, the run `run` makes of them is created and they become its
    /// (its params may list them), else nothing changes
    /// (and the answer is empty). Of any number of callers at once, each object goes to
    /// one.
    fn claim_batch(
        &self,
        pipeline: &str,
        trigger: &str,
        group: &str,
        min: usize,
        max: usize,
        run: &(dyn Fn(&[InboxObject]) -> RunRecord + Sync),
    ) -> Result<Vec<InboxObject>, StateError>;
    /// The trigger and objects a run consumed, if a trigger started it.
    fn run_trigger(&self, run: &RunId) -> Result<Option<RunTrigger>, StateError>;
    /// Runs that consumed an object with this URL, with the trigger.
    fn object_runs(&self, url: &str) -> Result<Vec<(RunId, String)>, StateError>;
    /// Whether a trigger is paused, and its cursor (none: not registered), read by key
    /// without the inbox counts ([`TriggerStore::triggers`]): what its loop asks often.
    #[allow(clippy::type_complexity)]
    fn trigger_state(
        &self,
        pipeline: &str,
        trigger: &str,
    ) -> Result<Option<(bool, Option<String>)>, StateError>;
    /// Every trigger known, with its inbox counts.
    fn triggers(&self) -> Result<Vec<TriggerRecord>, StateError>;
    /// Pauses or resumes; resuming with `skip` marks what waits as skipped (returned:
    /// how many).
    fn set_trigger_paused(
        &self,
        pipeline: &str,
        trigger: &str,
        paused: bool,
        skip: bool,
    ) -> Result<u64, StateError>;
    /// Notes what the last weighing of waiting objects decided.
    fn note_evaluation(
        &self,
        pipeline: &str,
        trigger: &str,
        reason: &str,
    ) -> Result<(), StateError>;
}

/// The notifications outbox.
pub trait OutboxStore: Send + Sync {
    /// Runs whose start or end has not been weighed for notifications yet (in no order):
    /// those never weighed, and those weighed while running that have ended since (a
    /// resumed run counts as weighed running again). Through the index on `notified`, so
    /// the cost is that of the runs in flight, not of the history.
    fn unnotified_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError>;
    /// In one transaction: the notifications of `run` (those already there, by id, are
    /// kept) and the note that it was weighed in `phase`.
    fn enqueue_notifications(
        &self,
        run: &RunId,
        phase: &str,
        items: &[OutboxItem],
    ) -> Result<(), StateError>;
    /// Notifications of no phase (a missed deadline); those already there, by id, are
    /// kept.
    fn add_notifications(&self, items: &[OutboxItem]) -> Result<(), StateError>;
    /// Pending notifications due by `now`, oldest first.
    fn due_notifications(&self, now: &str, limit: usize) -> Result<Vec<OutboxItem>, StateError>;
    /// A delivery's outcome: delivered (`error` none), to retry at `retry_at`, or dead
    /// (neither).
    fn notification_outcome(
        &self,
        id: &str,
        error: Option<&str>,
        retry_at: Option<&str>,
    ) -> Result<(), StateError>;
    /// Notifications in `state` (`pending`, `delivered`, `dead`; all with none), newest
    /// first.
    fn notifications(
        &self,
        state: Option<&str>,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StateError>;
    /// How many notifications there are in each state.
    fn notification_counts(&self) -> Result<BTreeMap<String, u64>, StateError>;
}
