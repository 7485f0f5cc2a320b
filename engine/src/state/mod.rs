//! The state store: every run, stage and attempt, recorded before it is acted on.
//!
//! [`StateStore`] is the contract the run loop writes through; [`SqliteState`] is the
//! embedded default (one WAL-mode file, `.drivetrain/state.db`) with versioned
//! migrations. A transition is written (and committed) before the engine acts on it, so an
//! engine killed at any point leaves a record of what it was doing.
//!
//! The SQLite store is in `sqlite`, the PostgreSQL store beside it in `postgres` (the
//! `postgres` feature, which the binary turns on); the suite every store's tests run, in
//! [`conformance`].

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

mod access;
mod devices;
mod events;
#[cfg(feature = "postgres")]
mod postgres;
mod queries;
mod schema;
pub mod sources;
mod sqlite;
mod trials;
pub use access::{
    tally, AccessStore, ApprovalRecord, ApprovalRequest, ApprovalStore, AuditEntry, KeyClaim,
    KeyRecord, KeyStore, Quota, Refusal, TokenRecord, Vote,
};
pub use devices::{
    Capacity, CapacityClaim, Claimed, DeviceStore, GpuAsk, GpuClaim, GpuWait, InQueue,
};
pub use events::{
    InboxObject, OutboxItem, OutboxStore, RunTrigger, TriggerRecord, TriggerStore, Waiting,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresState;
pub use sqlite::{SqliteState, LAST_TICK, UNSTARTED_SINCE};
pub use trials::{MetricRow, TrialRecord, TrialStore, MAX_METRIC_ROWS};

#[cfg(any(test, feature = "testing"))]
pub mod conformance;

pub use crate::names::StageName;

/// A run's id: `YYYYMMDD-HHMMSS-xxxxxxxx`, sortable by creation time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct RunId(pub String);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl RunId {
    /// A new id: the current time and 32 bits that never repeat within this process
    /// (a counter from a random start, through a bijective mix) and differ between
    /// processes by that random start.
    pub fn generate(now: chrono::DateTime<chrono::Utc>) -> RunId {
        use std::hash::{BuildHasher, Hasher};
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::OnceLock;
        static START: OnceLock<u32> = OnceLock::new();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let start = *START.get_or_init(|| {
            // std seeds each RandomState from the OS's random source.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.finish() as u32
        });
        let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        // Odd multipliers and xor-shifts are bijections on u32: distinct in, distinct out.
        let mut x = n.wrapping_mul(0x9E37_79B1);
        x ^= x >> 16;
        x = x.wrapping_mul(0x85EB_CA6B);
        x ^= x >> 13;
        RunId(format!("{}-{x:08x}", now.format("%Y%m%d-%H%M%S")))
    }
}

/// Phases of runs, stages and attempts (Argo's, kept apart: `Failed` is the stage's own
/// failure, `Error` an infrastructure or engine fault).
/// What runs are listed by (`drivetrain list`, `GET /api/v1/runs`, the web view); every
/// field given must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    pub pipeline: Option<String>,
    pub phase: Option<Phase>,
    /// `cli`, `api`, `schedule`, `trigger`, `rerun`, `retry`.
    pub trigger: Option<String>,
    /// Created at or after this RFC 3339 time (UTC with milliseconds sorts as text).
    pub since: Option<String>,
    /// Of one of these projects (`None`: any).
    pub projects: Option<Vec<String>>,
}

impl RunFilter {
    /// The `WHERE` clause (empty, or starting with ` WHERE`) and its arguments in order,
    /// with `placeholder(n)` for the n-th (from 1): `?n` for SQLite, `$n` for PostgreSQL.
    pub fn sql(&self, placeholder: impl Fn(usize) -> String) -> (String, Vec<String>) {
        let mut clauses = Vec::new();
        let mut args = Vec::new();
        let fields = [
            ("pipeline = ", self.pipeline.clone()),
            ("phase = ", self.phase.map(|p| p.as_str().to_owned())),
            ("trigger = ", self.trigger.clone()),
            ("created_at >= ", self.since.clone()),
        ];
        for (test, value) in fields {
            if let Some(v) = value {
                args.push(v);
                clauses.push(format!("{test}{}", placeholder(args.len())));
            }
        }
        if let Some(projects) = &self.projects {
            let mut marks = Vec::new();
            for p in projects {
                args.push(p.clone());
                marks.push(placeholder(args.len()));
            }
            clauses.push(match marks.is_empty() {
                true => "1 = 0".to_owned(),
                false => format!("project IN ({})", marks.join(", ")),
            });
        }
        let clause = match clauses.is_empty() {
            true => String::new(),
            false => format!(" WHERE {}", clauses.join(" AND ")),
        };
        (clause, args)
    }
}

pub use crate::phase::Phase;

/// A state store failure: the infrastructure's fault.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The database could not be opened, migrated, read or written.
    #[error("state store {what}")]
    Sqlite {
        what: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A server database's failure (PostgreSQL).
    #[error("state store {what}: {source}")]
    Database {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A row that must exist does not.
    #[error("no run `{0}` in the state store")]
    UnknownRun(String),
    /// An attempt that already ended cannot start again.
    #[error("attempt {attempt} of `{stage}` already ended")]
    AttemptEnded { stage: String, attempt: u32 },
}

/// A run as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct RunRecord {
    pub id: RunId,
    pub pipeline: String,
    /// The pipeline file as given to `run`.
    pub file: String,
    /// sha256 of the pipeline file's bytes.
    pub spec_digest: String,
    pub params: serde_json::Value,
    /// `cli`, `schedule`, `trigger` (a trigger's batch or call), `api`, `rerun`, …
    pub trigger: String,
    pub parent: Option<RunId>,
    pub phase: Phase,
    pub created_at: String,
    pub finished_at: Option<String>,
    pub reason: Option<String>,
    /// The process of the engine running it, while it runs.
    pub engine_pid: Option<i64>,
    /// What a rerun changed: `{"params": {…}, "images": {stage: image}}`.
    pub overrides: serde_json::Value,
    /// The stages a rerun or retry executes; the others are reused or not run. `None`:
    /// every stage.
    pub selection: Option<Vec<StageName>>,
    /// The cron tick a `schedule`-triggered run is for (RFC 3339).
    pub scheduled_time: Option<String>,
    /// The executor the run was started on (`local`, `kubernetes`, `slurm`).
    pub executor: Option<String>,
    /// The project it belongs to (its pipeline's `project:`, `default` without one).
    pub project: String,
}

/// A stage of a run as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct StageRecord {
    pub stage: StageName,
    pub phase: Phase,
    pub attempts: u32,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    /// Output name → `{key, digest}` of its published manifest.
    pub outputs: serde_json::Value,
    /// The stage's `values.json`, if it wrote one.
    pub values: serde_json::Value,
    /// How it came by its outputs.
    #[serde(flatten)]
    pub how: Provenance,
    /// What its last attempt used, where the executor measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::executor::ResourceUsage>,
}

/// How a stage came by its outputs, recorded with the cache key and its components.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Provenance {
    #[serde(flatten)]
    pub origin: Origin,
    pub cache_key: Option<String>,
    /// What the cache key was made of: component → digest (`command`, `image`,
    /// `input:NAME`, `file:PATH`, …), the rendered definition, and the cache lookup.
    pub provenance: serde_json::Value,
    /// Input name → the artifact (`{manifest, digest}`) the stage read.
    pub inputs: serde_json::Value,
}

/// How a stage came by its outputs: the two columns `origin` and `origin_run` of a state
/// store, and the two fields of the same names in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "OriginColumns")]
pub enum Origin {
    /// Its command ran in this run (also a stage that has not succeeded).
    Ran,
    /// A cache hit: the outputs an attempt of `run` made under the same cache key.
    Cached { run: String },
    /// A rerun or retry took the outputs from `run`, the run it was started from.
    Reused { run: String },
}

impl Origin {
    /// `ran`, `cached` or `reused`.
    pub fn name(&self) -> &'static str {
        match self {
            Origin::Ran => "ran",
            Origin::Cached { .. } => "cached",
            Origin::Reused { .. } => "reused",
        }
    }

    /// The run whose outputs a cached or reused stage took.
    pub fn run(&self) -> Option<&str> {
        match self {
            Origin::Ran => None,
            Origin::Cached { run } | Origin::Reused { run } => Some(run),
        }
    }

    /// From a state store's two columns. The engine writes `cached` and `reused` with
    /// their run, both columns in one statement, so a row without it (or with a name the
    /// engine never writes) can only have been edited by hand: it reads as `Ran`, the
    /// origin that claims no other run's outputs.
    pub fn from_columns(name: &str, run: Option<String>) -> Origin {
        match (name, run) {
            ("cached", Some(run)) => Origin::Cached { run },
            ("reused", Some(run)) => Origin::Reused { run },
            _ => Origin::Ran,
        }
    }
}

// [`Origin`] as stored and served (no doc comment: the schema of what flattens it would take it).
#[derive(Serialize, schemars::JsonSchema)]
struct OriginColumns {
    /// `ran`, `cached` (a cache hit) or `reused` (a rerun or retry took it from its parent).
    origin: OriginName,
    /// The run whose outputs a `cached` or `reused` stage took.
    origin_run: Option<String>,
}

#[derive(Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
enum OriginName {
    Ran,
    Cached,
    Reused,
}

impl From<Origin> for OriginColumns {
    fn from(o: Origin) -> OriginColumns {
        let (origin, origin_run) = match o {
            Origin::Ran => (OriginName::Ran, None),
            Origin::Cached { run } => (OriginName::Cached, Some(run)),
            Origin::Reused { run } => (OriginName::Reused, Some(run)),
        };
        OriginColumns { origin, origin_run }
    }
}

impl schemars::JsonSchema for Origin {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        OriginColumns::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        OriginColumns::json_schema(generator)
    }
}

/// A cache entry: the outputs a stage attempt with this key produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheEntry {
    pub key: String,
    pub pipeline: String,
    pub stage: String,
    pub run_id: String,
    pub outputs: serde_json::Value,
    pub values: serde_json::Value,
    /// Component → digest, for `explain`.
    pub components: serde_json::Value,
    pub created_at: String,
}

/// A schedule the server keeps: where its pipeline is, whether it is suspended, and the
/// moment ticks count from (registration or the last resume).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ScheduleEntry {
    pub pipeline: String,
    pub file: String,
    pub suspended: bool,
    pub anchor: String,
}

/// One decided tick of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct TickRecord {
    /// `pipeline@scheduled-time`.
    pub id: String,
    pub pipeline: String,
    pub scheduled_time: String,
    /// `fired` or `skipped`.
    pub outcome: String,
    pub run_id: Option<String>,
    pub reason: Option<String>,
}

/// Where an artifact came from: the stage of the run that published it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactRecord {
    pub digest: String,
    pub manifest: String,
    pub run_id: String,
    pub stage: String,
    pub output: String,
    pub created_at: String,
}

/// A stage that read an artifact.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactUse {
    pub digest: String,
    pub run_id: String,
    pub stage: String,
    pub input: String,
}

/// One item of a map stage as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemRecord {
    pub index: usize,
    pub item: serde_json::Value,
    pub phase: Phase,
    pub attempts: u32,
    pub reason: Option<String>,
    pub outputs: serde_json::Value,
    pub handle: Option<String>,
    /// What its last attempt used, where the executor measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::executor::ResourceUsage>,
    /// When its last attempt started and ended.
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// The values its last succeeded attempt reported (`null` before).
    pub values: serde_json::Value,
}

/// How an item of a map stage ended, as [`StageStore::finish_item`] records it.
#[derive(Debug, Clone, Copy)]
pub struct ItemEnd<'a> {
    pub phase: Phase,
    pub reason: Option<&'a str>,
    /// Its outputs (name → artifact), `{}` for none.
    pub outputs: &'a serde_json::Value,
    /// The values it reported, `null` for none.
    pub values: &'a serde_json::Value,
}

/// One attempt of a stage as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct AttemptRecord {
    pub stage: StageName,
    pub attempt: u32,
    pub phase: Phase,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    /// The executor's handle (a process group id locally), for re-attaching.
    pub handle: Option<String>,
    /// When it was given the GPUs it waited for from `started_at` (none if it did not
    /// wait), and why it waited: who held them, its place in the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_for: Option<String>,
}

/// How a stage succeeded, for [`StateStore::record_success`].
#[derive(Debug, Clone, Copy)]
pub struct Success<'a> {
    pub run: &'a RunId,
    pub stage: &'a str,
    /// The stage's last attempt, still to be recorded as ended (none for a map stage,
    /// whose items record their own).
    pub attempt: Option<u32>,
    pub artifacts: &'a [ArtifactRecord],
    pub outputs: &'a serde_json::Value,
    pub values: &'a serde_json::Value,
    pub cache: Option<&'a CacheEntry>,
    pub exit_code: Option<i32>,
    pub reason: Option<&'a str>,
}

/// The store's traits, to call their methods on a `dyn StateStore`:
/// `use drivetrain_engine::state::prelude::*`.
pub mod prelude {
    pub use super::{
        AccessStore, ApprovalStore, ArtifactIndex, AttemptStore, CacheStore, DeviceStore, KeyStore,
        OutboxStore, RunStore, ScheduleStore, StageStore, StateStore, TrialStore, TriggerStore,
    };
}

/// What the run loop records: every capability below (a function that needs one takes
/// it alone, as `&dyn RunStore`), and a stage's success all at once. Every method
/// commits before it returns.
pub trait StateStore:
    RunStore
    + StageStore
    + AttemptStore
    + ArtifactIndex
    + CacheStore
    + ScheduleStore
    + TriggerStore
    + OutboxStore
    + AccessStore
    + ApprovalStore
    + KeyStore
    + DeviceStore
    + TrialStore
    + Send
    + Sync
{
    /// A stage that succeeded, all at once: its last attempt's end, the artifacts it
    /// published, its outputs and values, its cache entry, then its phase, so a stage
    /// recorded as succeeded always has its outputs. A backend with transactions commits
    /// it as one (SQLite and PostgreSQL do: one commit per stage instead of five); this
    /// default records the parts one by one, in that order.
    fn record_success(&self, s: &Success<'_>) -> Result<(), StateError> {
        if let Some(attempt) = s.attempt {
            self.finish_attempt(s.run, s.stage, attempt, Phase::Succeeded, s.exit_code, None)?;
        }
        self.add_artifacts(s.artifacts)?;
        self.set_stage_results(s.run, s.stage, s.outputs, s.values)?;
        if let Some(entry) = s.cache {
            self.put_cache_entry(entry)?;
        }
        self.set_stage(s.run, s.stage, Phase::Succeeded, s.exit_code, s.reason)
    }
}

/// Runs: their records, the list and its filters, and the leases engines hold on them.
pub trait RunStore: Send + Sync {
    /// Records a new run in phase `Running`.
    fn create_run(&self, run: &RunRecord) -> Result<(), StateError>;
    fn finish_run(&self, run: &RunId, phase: Phase, reason: Option<&str>)
        -> Result<(), StateError>;
    /// Marks a run `Running` again under engine process `pid` (a resume).
    fn reopen_run(&self, run: &RunId, pid: u32) -> Result<(), StateError>;
    /// Whether engines on other machines may drive runs of this store (a database they
    /// share): then a recorded pid says nothing of them, and only heartbeats do.
    fn shared(&self) -> bool {
        false
    }
    fn run(&self, run: &RunId) -> Result<RunRecord, StateError>;
    /// The most recent runs first.
    fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError>;
    /// The most recent runs that pass `filter` first, at most `limit`: filtered by the
    /// database, through an index for each filter ([`RunFilter::sql`]).
    fn find_runs(&self, filter: &RunFilter, limit: usize) -> Result<Vec<RunRecord>, StateError>;
    /// Runs of `pipeline` still running.
    fn running_runs(&self, pipeline: &str) -> Result<Vec<RunId>, StateError>;
    /// How many runs there are in each phase (for `/metrics`), without reading them.
    fn run_counts(&self) -> Result<BTreeMap<String, u64>, StateError>;
    /// The engine running `run` is alive: it records so every few seconds
    /// ([`crate::runner::heartbeat_interval`]).
    fn heartbeat(&self, run: &RunId) -> Result<(), StateError>;
    /// Running runs whose engine has not recorded a heartbeat since `before`: it died,
    /// wherever it ran.
    fn stale_runs(&self, before: &str) -> Result<Vec<RunId>, StateError>;
    /// Takes over a running run whose heartbeat is older than `before` (or that never
    /// beat) for resuming it: true for exactly one of any number of replicas asking at
    /// once (the heartbeat is renewed and the dead engine's pid forgotten in one
    /// conditional update).
    fn take_over(&self, run: &RunId, before: &str) -> Result<bool, StateError>;
    /// Records that `run` is to be cancelled, for whichever engine drives it now or next
    /// ([`RunStore::cancel_asked`]); false if there is no such run or it has ended.
    fn ask_cancel(&self, run: &RunId) -> Result<bool, StateError>;
    /// Whether a cancel of `run` has been asked.
    fn cancel_asked(&self, run: &RunId) -> Result<bool, StateError>;
    /// Keeps the text of a pipeline a run runs, by its digest (once per digest).
    fn keep_source(&self, digest: &str, source: &str) -> Result<(), StateError>;
    /// The text of the pipeline with `digest`, if a run kept it.
    fn source(&self, digest: &str) -> Result<Option<String>, StateError>;
}

/// Stages of a run: phase, outputs and values, and how each came by them.
pub trait StageStore: Send + Sync {
    /// Sets a stage's phase (creating its row); `reason` and `exit_code` replace earlier ones.
    fn set_stage(
        &self,
        run: &RunId,
        stage: &str,
        phase: Phase,
        exit_code: Option<i32>,
        reason: Option<&str>,
    ) -> Result<(), StateError>;
    /// Records a succeeded stage's outputs and values.
    fn set_stage_results(
        &self,
        run: &RunId,
        stage: &str,
        outputs: &serde_json::Value,
        values: &serde_json::Value,
    ) -> Result<(), StateError>;
    fn stages(&self, run: &RunId) -> Result<Vec<StageRecord>, StateError>;
    /// One stage of a run.
    fn stage(&self, run: &RunId, stage: &str) -> Result<Option<StageRecord>, StateError>;
    /// Stages whose rendered definition or values contain `text` (a source URL, a drive
    /// log's name), as (run, stage).
    fn stages_mentioning(&self, text: &str) -> Result<Vec<(RunId, String)>, StateError>;
    /// Records how a stage came by its outputs and, for a stage that ran, which
    /// artifacts it read (for lineage).
    fn set_provenance(&self, run: &RunId, stage: &str, p: &Provenance) -> Result<(), StateError>;
}

/// Attempts of a stage and items of a map stage: their starts, handles, ends and usage.
pub trait AttemptStore: Send + Sync {
    /// Records an attempt as `Running` before its process starts.
    fn start_attempt(&self, run: &RunId, stage: &str, attempt: u32) -> Result<(), StateError>;
    fn set_attempt_handle(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        handle: &str,
    ) -> Result<(), StateError>;
    /// Records that the attempt waited for its GPUs until now, and why.
    fn set_attempt_waited(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        why: &str,
    ) -> Result<(), StateError>;
    fn finish_attempt(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        phase: Phase,
        exit_code: Option<i32>,
        reason: Option<&str>,
    ) -> Result<(), StateError>;
    fn attempts(&self, run: &RunId) -> Result<Vec<AttemptRecord>, StateError>;
    /// Records what an attempt used, on the attempt and as its stage's latest.
    fn set_attempt_usage(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        usage: &crate::executor::ResourceUsage,
    ) -> Result<(), StateError>;
    /// Records the items of a map stage as `Pending` (replacing earlier ones).
    fn add_map_items(
        &self,
        run: &RunId,
        stage: &str,
        items: &[serde_json::Value],
    ) -> Result<(), StateError>;
    /// Records an item's attempt as `Running`.
    fn start_item(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        attempt: u32,
    ) -> Result<(), StateError>;
    /// Records how an item ended.
    fn finish_item(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        end: ItemEnd<'_>,
    ) -> Result<(), StateError>;
    /// Records what an item's last attempt used.
    fn set_item_usage(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        usage: &crate::executor::ResourceUsage,
    ) -> Result<(), StateError>;
    /// Records the executor handle of an item's running attempt.
    fn set_item_handle(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        handle: &str,
    ) -> Result<(), StateError>;
    /// Every item of a map stage, in order.
    fn map_items(&self, run: &RunId, stage: &str) -> Result<Vec<ItemRecord>, StateError>;
    /// How many items of a map stage are in each phase.
    fn item_counts(&self, run: &RunId, stage: &str) -> Result<BTreeMap<String, u64>, StateError>;
}

/// Published artifacts and the stages that read them (lineage and `forget`).
pub trait ArtifactIndex: Send + Sync {
    /// Records the artifacts a stage published (for lineage and gc).
    fn add_artifacts(&self, artifacts: &[ArtifactRecord]) -> Result<(), StateError>;
    /// The stage that published the artifact with this digest.
    fn artifact(&self, digest: &str) -> Result<Option<ArtifactRecord>, StateError>;
    /// The digests of artifacts that start with `prefix` (`sha256:` and hex digits), at
    /// most `limit`, in order: a short digest as `lineage` prints it, made whole.
    fn artifacts_starting(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StateError>;
    /// Every stage that read the artifact with this digest.
    fn artifact_uses(&self, digest: &str) -> Result<Vec<ArtifactUse>, StateError>;
}

/// The cache: entries by key, the recent ones of a stage (for `explain`), expiry.
pub trait CacheStore: Send + Sync {
    /// Records (or replaces) a cache entry.
    fn put_cache_entry(&self, e: &CacheEntry) -> Result<(), StateError>;
    fn cache_entry(&self, key: &str) -> Result<Option<CacheEntry>, StateError>;
    /// The newest `limit` cache entries of a pipeline's stage other than `except_key`,
    /// made by runs of `project` (no other project's), newest first (for `explain`,
    /// which compares with the closest).
    fn recent_cache_entries(
        &self,
        pipeline: &str,
        project: &str,
        stage: &str,
        except_key: &str,
        limit: usize,
    ) -> Result<Vec<CacheEntry>, StateError>;
    fn cache_entries(&self) -> Result<Vec<CacheEntry>, StateError>;
    /// Removes cache entries created before `before` (RFC 3339); returns how many.
    fn expire_cache_entries(&self, before: &str) -> Result<usize, StateError>;
}

/// Schedules and their ticks, each claimed once across replicas.
pub trait ScheduleStore: Send + Sync {
    /// Registers a schedule (ticks count from `anchor`), or updates its file.
    fn upsert_schedule(&self, pipeline: &str, file: &str, anchor: &str) -> Result<(), StateError>;
    fn schedule(&self, pipeline: &str) -> Result<Option<ScheduleEntry>, StateError>;
    fn schedules(&self) -> Result<Vec<ScheduleEntry>, StateError>;
    /// Suspends or resumes; resuming with an anchor makes ticks count from it (no backlog).
    fn set_suspended(
        &self,
        pipeline: &str,
        suspended: bool,
        anchor: Option<&str>,
    ) -> Result<(), StateError>;
    /// Records a tick unless it is recorded already; returns whether this call did.
    fn claim_tick(&self, tick: &TickRecord) -> Result<bool, StateError>;
    /// The newest `limit` ticks of a schedule, newest first.
    fn ticks(&self, pipeline: &str, limit: usize) -> Result<Vec<TickRecord>, StateError>;
    /// Every schedule with the scheduled time of its newest tick (manual triggers aside),
    /// in one read: the scheduler asks every loop.
    fn schedules_with_last_tick(&self) -> Result<Vec<(ScheduleEntry, Option<String>)>, StateError>;
    /// Ticks of any schedule claimed to fire since `since` (when they were recorded) whose
    /// run does not exist, oldest first: what `schedule trigger` queued for the server.
    fn unstarted_ticks_since(&self, since: &str) -> Result<Vec<TickRecord>, StateError>;
    /// Claims ticks in one transaction, recording with each claimed tick the run it
    /// fires. For each tick: `Ok(true)` claimed by this call (with its run), `Ok(false)`
    /// decided by someone else already (no run recorded), or the error that stopped its
    /// claim or run, in which case neither is recorded.
    #[allow(clippy::type_complexity)]
    fn claim_ticks(
        &self,
        ticks: &[(TickRecord, Option<RunRecord>)],
    ) -> Result<Vec<Result<bool, StateError>>, StateError>;
}

/// The time stamps the state stores record: RFC 3339, milliseconds, UTC.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
