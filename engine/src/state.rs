//! The state store: every run, stage and attempt, recorded before it is acted on.
//!
//! [`StateStore`] is the contract the run loop writes through; [`SqliteState`] is the
//! embedded default (one WAL-mode file, `.drivetrain/state.db`) with versioned
//! migrations. A transition is written (and committed) before the engine acts on it, so an
//! engine killed at any point leaves a record of what it was doing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

/// A run's id: `YYYYMMDD-HHMMSS-xxxx`, sortable by creation time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RunId(pub String);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl RunId {
    /// A new id from the current time and a little entropy (pid, clock nanoseconds).
    pub fn generate(now: chrono::DateTime<chrono::Utc>) -> RunId {
        let nanos = now.timestamp_subsec_nanos() as u64;
        let salt =
            (nanos ^ ((std::process::id() as u64) << 16)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48;
        RunId(format!(
            "{}-{:04x}",
            now.format("%Y%m%d-%H%M%S"),
            salt & 0xffff
        ))
    }
}

/// Phases of runs, stages and attempts (Argo's, kept apart: `Failed` is the stage's own
/// failure, `Error` an infrastructure or engine fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Error,
    /// Not run: its `when` was false, or a required input's producer was skipped.
    Skipped,
    /// Not run: something it depends on failed.
    Omitted,
    Cancelled,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Error => "Error",
            Phase::Skipped => "Skipped",
            Phase::Omitted => "Omitted",
            Phase::Cancelled => "Cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "Pending" => Phase::Pending,
            "Running" => Phase::Running,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            "Error" => Phase::Error,
            "Skipped" => Phase::Skipped,
            "Omitted" => Phase::Omitted,
            "Cancelled" => Phase::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, Phase::Pending | Phase::Running)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

fn sql(what: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> StateError {
    let what = what.into();
    move |source| StateError::Sqlite { what, source }
}

/// A run as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    pub id: RunId,
    pub pipeline: String,
    /// The pipeline file as given to `run`.
    pub file: String,
    /// sha256 of the pipeline file's bytes.
    pub spec_digest: String,
    pub params: serde_json::Value,
    /// `cli`, `schedule`, `api`, `rerun`, …
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
    pub selection: Option<Vec<String>>,
    /// The cron tick a `schedule`-triggered run is for (RFC 3339).
    pub scheduled_time: Option<String>,
    /// The executor the run was started on (`local`, `kubernetes`).
    pub executor: Option<String>,
}

/// A stage of a run as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageRecord {
    pub stage: String,
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
}

/// How a stage came by its outputs, recorded with the cache key and its components.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Provenance {
    /// `ran`, `cached` (a cache hit) or `reused` (a rerun or retry took it from its parent).
    pub origin: String,
    /// The run whose outputs a `cached` or `reused` stage took.
    pub origin_run: Option<String>,
    pub cache_key: Option<String>,
    /// What the cache key was made of: component → digest (`command`, `image`,
    /// `input:NAME`, `file:PATH`, …), the rendered definition, and the cache lookup.
    pub provenance: serde_json::Value,
    /// Input name → the artifact (`{manifest, digest}`) the stage read.
    pub inputs: serde_json::Value,
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
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleEntry {
    pub pipeline: String,
    pub file: String,
    pub suspended: bool,
    pub anchor: String,
}

/// One decided tick of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
}

/// One attempt of a stage as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub stage: String,
    pub attempt: u32,
    pub phase: Phase,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    /// The executor's handle (a process group id locally), for re-attaching.
    pub handle: Option<String>,
}

/// What the run loop records. Every method commits before it returns.
pub trait StateStore: Send + Sync {
    /// Records a new run in phase `Running`.
    fn create_run(&self, run: &RunRecord) -> Result<(), StateError>;
    fn finish_run(&self, run: &RunId, phase: Phase, reason: Option<&str>)
        -> Result<(), StateError>;
    /// Marks a run `Running` again under engine process `pid` (a resume).
    fn reopen_run(&self, run: &RunId, pid: u32) -> Result<(), StateError>;
    fn run(&self, run: &RunId) -> Result<RunRecord, StateError>;
    /// The most recent runs first.
    fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError>;
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
    /// Stages whose rendered definition contains `text` (a source URL, a drive log's
    /// name), as (run, stage).
    fn stages_mentioning(&self, text: &str) -> Result<Vec<(RunId, String)>, StateError>;
    /// Records an attempt as `Running` before its process starts.
    fn start_attempt(&self, run: &RunId, stage: &str, attempt: u32) -> Result<(), StateError>;
    fn set_attempt_handle(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        handle: &str,
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
        phase: Phase,
        reason: Option<&str>,
        outputs: &serde_json::Value,
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
    /// Records how a stage came by its outputs and, for a stage that ran, which
    /// artifacts it read (for lineage).
    fn set_provenance(&self, run: &RunId, stage: &str, p: &Provenance) -> Result<(), StateError>;
    /// Records the artifacts a stage published (for lineage and gc).
    fn add_artifacts(&self, artifacts: &[ArtifactRecord]) -> Result<(), StateError>;
    /// The stage that published the artifact with this digest.
    fn artifact(&self, digest: &str) -> Result<Option<ArtifactRecord>, StateError>;
    /// Every stage that read the artifact with this digest.
    fn artifact_uses(&self, digest: &str) -> Result<Vec<ArtifactUse>, StateError>;
    /// Records (or replaces) a cache entry.
    fn put_cache_entry(&self, e: &CacheEntry) -> Result<(), StateError>;
    fn cache_entry(&self, key: &str) -> Result<Option<CacheEntry>, StateError>;
    /// The newest `limit` cache entries of a pipeline's stage other than `except_key`,
    /// newest first (for `explain`, which compares with the closest).
    fn recent_cache_entries(
        &self,
        pipeline: &str,
        stage: &str,
        except_key: &str,
        limit: usize,
    ) -> Result<Vec<CacheEntry>, StateError>;
    fn cache_entries(&self) -> Result<Vec<CacheEntry>, StateError>;
    /// Removes cache entries created before `before` (RFC 3339); returns how many.
    fn expire_cache_entries(&self, before: &str) -> Result<usize, StateError>;
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
}

/// The schema, one migration per step; `user_version` says how many have run.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    file TEXT NOT NULL,
    spec_digest TEXT NOT NULL,
    params TEXT NOT NULL,
    trigger TEXT NOT NULL,
    parent TEXT,
    phase TEXT NOT NULL,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    reason TEXT
);
CREATE TABLE stages (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at TEXT,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    vals TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, stage)
);
CREATE TABLE attempts (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    phase TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    handle TEXT,
    PRIMARY KEY (run_id, stage, attempt)
);
CREATE INDEX runs_by_time ON runs(created_at);
"#,
    // 2: the process running a run, so `cancel` can reach it and `resume` can tell a
    // dead engine from a live one.
    "ALTER TABLE runs ADD COLUMN engine_pid INTEGER",
    // 3: the items of map stages, one row each, so a map of 100,000 items is not held
    // in the engine's memory.
    r#"
CREATE TABLE map_items (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    idx INTEGER NOT NULL,
    item TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, stage, idx)
);
"#,
    // 4: the executor handle of an item's running attempt, so `resume` can stop it.
    "ALTER TABLE map_items ADD COLUMN handle TEXT",
    // 5: caching, reruns and lineage: how each stage came by its outputs, cache
    // entries, and which stage published and read each artifact.
    r#"
ALTER TABLE runs ADD COLUMN overrides TEXT NOT NULL DEFAULT '{}';
ALTER TABLE runs ADD COLUMN selection TEXT;
ALTER TABLE stages ADD COLUMN origin TEXT NOT NULL DEFAULT 'ran';
ALTER TABLE stages ADD COLUMN origin_run TEXT;
ALTER TABLE stages ADD COLUMN cache_key TEXT;
ALTER TABLE stages ADD COLUMN provenance TEXT NOT NULL DEFAULT '{}';
ALTER TABLE stages ADD COLUMN inputs TEXT NOT NULL DEFAULT '{}';
CREATE TABLE cache_entries (
    key TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    run_id TEXT NOT NULL,
    outputs TEXT NOT NULL,
    vals TEXT NOT NULL,
    components TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX cache_by_stage ON cache_entries(pipeline, stage, created_at);
CREATE TABLE artifacts (
    digest TEXT PRIMARY KEY,
    manifest TEXT NOT NULL,
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    output TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE artifact_uses (
    digest TEXT NOT NULL,
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    input TEXT NOT NULL,
    PRIMARY KEY (digest, run_id, stage, input)
);
CREATE INDEX uses_by_stage ON artifact_uses(run_id, stage);
"#,
    // 6: schedules and their ticks, decided once each.
    r#"
CREATE TABLE schedules (
    pipeline TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    suspended INTEGER NOT NULL DEFAULT 0,
    anchor TEXT NOT NULL
);
CREATE TABLE schedule_ticks (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    scheduled_time TEXT NOT NULL,
    outcome TEXT NOT NULL,
    run_id TEXT,
    reason TEXT,
    recorded_at TEXT NOT NULL
);
CREATE INDEX ticks_by_time ON schedule_ticks(pipeline, scheduled_time);
CREATE INDEX runs_by_pipeline ON runs(pipeline, phase);
ALTER TABLE runs ADD COLUMN scheduled_time TEXT;
"#,
    // 7: the executor a run was started on (`--executor` may differ from the pipeline's),
    // so a resume or a cancel after a crash reaches the same one.
    r#"
ALTER TABLE runs ADD COLUMN executor TEXT;
"#,
    // 8: the heartbeat of the engine running a run, so a replica on another machine can
    // tell a dead engine and take its runs over.
    r#"
ALTER TABLE runs ADD COLUMN heartbeat_at TEXT;
"#,
    // 9: ticks by when they were recorded, so the scheduler finds new unstarted ones (a
    // `schedule trigger`) every loop without reading them all.
    r#"
CREATE INDEX ticks_by_record ON schedule_ticks(recorded_at);
"#,
];

/// The embedded SQLite state store.
#[derive(Debug)]
pub struct SqliteState {
    conn: Mutex<Connection>,
}

/// The time stamps the state stores record: RFC 3339, milliseconds, UTC.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Runs a query and collects its rows, naming `what` in errors.
fn query<T, C: FromIterator<T>>(
    c: &Connection,
    sql_text: &str,
    args: impl rusqlite::Params,
    what: &str,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<C, StateError> {
    let mut stmt = c.prepare_cached(sql_text).map_err(sql(what))?;
    let rows = stmt.query_map(args, row).map_err(sql(what))?;
    rows.collect::<Result<C, _>>().map_err(sql(what))
}

/// `execute` through the connection's statement cache: the engine runs the same few
/// statements for every stage and tick, and parsing them each time showed in profiles.
trait ExecuteCached {
    fn execute_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
}

impl ExecuteCached for Connection {
    fn execute_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }
}

impl SqliteState {
    /// Opens (creating and migrating) the database at `path`, in WAL mode.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let conn = Connection::open(path).map_err(sql(format!("open {}", path.display())))?;
        Self::init(conn)
    }

    /// An in-memory database, for tests.
    pub fn in_memory() -> Result<Self, StateError> {
        Self::init(Connection::open_in_memory().map_err(sql("open in memory"))?)
    }

    fn init(conn: Connection) -> Result<Self, StateError> {
        conn.set_prepared_statement_cache_capacity(64);
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(sql("set busy timeout"))?;
        // Switching to WAL can answer SQLITE_BUSY without calling the busy handler while
        // another process opens the same new file: try again for as long as the timeout.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match conn.pragma_update(None, "journal_mode", "WAL") {
                Ok(()) => break,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => return Err(sql("enable WAL")(e)),
            }
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql("set synchronous"))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(sql("enable foreign keys"))?;
        // Two processes opening a new database at once (a server and a command) must not
        // both migrate it: the version is read under the write lock.
        let current = |conn: &Connection| -> Result<usize, StateError> {
            conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
                .map(|v| v.max(0) as usize)
                .map_err(sql("read schema version"))
        };
        if current(&conn)? < MIGRATIONS.len() {
            conn.execute_batch("BEGIN IMMEDIATE")
                .map_err(sql("lock for migration"))?;
            let version = current(&conn)?;
            let mut batch = String::new();
            for (i, m) in MIGRATIONS.iter().enumerate().skip(version) {
                batch.push_str(&format!("{m};\nPRAGMA user_version = {};\n", i + 1));
            }
            let applied = conn.execute_batch(&batch);
            match applied {
                Ok(()) => conn
                    .execute_batch("COMMIT")
                    .map_err(sql("commit migrations"))?,
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(sql(format!("migration from version {version}"))(e));
                }
            }
        }
        Ok(SqliteState {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        // A poisoned lock means a panic mid-statement; SQLite rolled the statement back.
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        f(&conn)
    }
}

fn json_col(s: String) -> serde_json::Value {
    serde_json::from_str(&s).unwrap_or(serde_json::Value::Null)
}

fn phase_col(s: String) -> Phase {
    Phase::parse(&s).unwrap_or(Phase::Error)
}

fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: RunId(r.get(0)?),
        pipeline: r.get(1)?,
        file: r.get(2)?,
        spec_digest: r.get(3)?,
        params: json_col(r.get(4)?),
        trigger: r.get(5)?,
        parent: r.get::<_, Option<String>>(6)?.map(RunId),
        phase: phase_col(r.get(7)?),
        created_at: r.get(8)?,
        finished_at: r.get(9)?,
        reason: r.get(10)?,
        engine_pid: r.get(11)?,
        overrides: json_col(r.get(12)?),
        selection: r
            .get::<_, Option<String>>(13)?
            .and_then(|s| serde_json::from_str(&s).ok()),
        scheduled_time: r.get(14)?,
        executor: r.get(15)?,
    })
}

fn tick_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TickRecord> {
    Ok(TickRecord {
        id: r.get(0)?,
        pipeline: r.get(1)?,
        scheduled_time: r.get(2)?,
        outcome: r.get(3)?,
        run_id: r.get(4)?,
        reason: r.get(5)?,
    })
}

fn schedule_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScheduleEntry> {
    Ok(ScheduleEntry {
        pipeline: r.get(0)?,
        file: r.get(1)?,
        suspended: r.get::<_, i64>(2)? != 0,
        anchor: r.get(3)?,
    })
}

const RUN_COLUMNS: &str = "id, pipeline, file, spec_digest, params, trigger, parent, phase, \
     created_at, finished_at, reason, engine_pid, overrides, selection, scheduled_time, executor";

fn cache_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CacheEntry> {
    Ok(CacheEntry {
        key: r.get(0)?,
        pipeline: r.get(1)?,
        stage: r.get(2)?,
        run_id: r.get(3)?,
        outputs: json_col(r.get(4)?),
        values: json_col(r.get(5)?),
        components: json_col(r.get(6)?),
        created_at: r.get(7)?,
    })
}

const STAGE_COLUMNS: &str = "stage, phase, attempts, started_at, finished_at, exit_code, reason, \
     outputs, vals, origin, origin_run, cache_key, provenance, inputs";

fn stage_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StageRecord> {
    Ok(StageRecord {
        stage: r.get(0)?,
        phase: phase_col(r.get(1)?),
        attempts: r.get(2)?,
        started_at: r.get(3)?,
        finished_at: r.get(4)?,
        exit_code: r.get(5)?,
        reason: r.get(6)?,
        outputs: json_col(r.get(7)?),
        values: json_col(r.get(8)?),
        how: Provenance {
            origin: r.get(9)?,
            origin_run: r.get(10)?,
            cache_key: r.get(11)?,
            provenance: json_col(r.get(12)?),
            inputs: json_col(r.get(13)?),
        },
    })
}

/// Inserts a run's record.
fn insert_run(c: &Connection, run: &RunRecord) -> Result<(), StateError> {
    c.execute_cached(
        "INSERT INTO runs (id, pipeline, file, spec_digest, params, trigger, parent, phase, \
         created_at, engine_pid, overrides, selection, scheduled_time, executor) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            run.id.0,
            run.pipeline,
            run.file,
            run.spec_digest,
            run.params.to_string(),
            run.trigger,
            run.parent.as_ref().map(|p| &p.0),
            run.phase.as_str(),
            run.created_at,
            run.engine_pid,
            run.overrides.to_string(),
            run.selection
                .as_ref()
                .map(|s| serde_json::to_string(s).unwrap_or_default()),
            run.scheduled_time,
            run.executor,
        ],
    )
    .map(|_| ())
    .map_err(sql(format!("create run {}", run.id)))
}

/// Claims a tick unless it is decided already; true when this call did.
fn insert_tick(c: &Connection, t: &TickRecord) -> Result<bool, StateError> {
    c.execute_cached(
        "INSERT OR IGNORE INTO schedule_ticks (id, pipeline, scheduled_time, outcome, run_id, reason, recorded_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![t.id, t.pipeline, t.scheduled_time, t.outcome, t.run_id, t.reason, now()],
    )
    .map(|n| n == 1)
    .map_err(sql(format!("claim tick {}", t.id)))
}

/// The scheduled time of schedule `s`'s newest tick, manual triggers aside (a manual
/// tick at a cron tick's second must not stand for it): walks the index backwards.
/// Shared with the PostgreSQL store.
pub const LAST_TICK: &str = "SELECT scheduled_time FROM schedule_ticks t \
     WHERE t.pipeline = s.pipeline AND t.id NOT LIKE '%+manual' \
     ORDER BY scheduled_time DESC LIMIT 1";

/// Fired ticks without a run, recorded at or after the placeholder that follows.
/// Shared with the PostgreSQL store.
pub const UNSTARTED_SINCE: &str =
    "SELECT t.id, t.pipeline, t.scheduled_time, t.outcome, t.run_id, t.reason FROM schedule_ticks t \
     LEFT JOIN runs r ON r.id = t.run_id \
     WHERE t.outcome = 'fired' AND t.run_id IS NOT NULL AND r.id IS NULL AND t.recorded_at >=";

const CACHE_COLUMNS: &str = "key, pipeline, stage, run_id, outputs, vals, components, created_at";

impl StateStore for SqliteState {
    fn create_run(&self, run: &RunRecord) -> Result<(), StateError> {
        self.with(|c| insert_run(c, run))
    }

    fn finish_run(
        &self,
        run: &RunId,
        phase: Phase,
        reason: Option<&str>,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE runs SET phase = ?2, finished_at = ?3, reason = ?4, engine_pid = NULL WHERE id = ?1",
                params![run.0, phase.as_str(), now(), reason],
            )
            .map(|_| ())
            .map_err(sql(format!("finish run {run}")))
        })
    }

    fn reopen_run(&self, run: &RunId, pid: u32) -> Result<(), StateError> {
        self.with(|c| {
            let n = c
                .execute_cached(
                    "UPDATE runs SET phase = 'Running', finished_at = NULL, reason = NULL, engine_pid = ?2 \
                     WHERE id = ?1",
                    params![run.0, pid],
                )
                .map_err(sql(format!("reopen run {run}")))?;
            if n == 0 {
                return Err(StateError::UnknownRun(run.0.clone()));
            }
            Ok(())
        })
    }

    fn run(&self, run: &RunId) -> Result<RunRecord, StateError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                params![run.0],
                run_from_row,
            )
            .optional()
            .map_err(sql(format!("read run {run}")))?
            .ok_or_else(|| StateError::UnknownRun(run.0.clone()))
        })
    }

    fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError> {
        let q =
            format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at DESC, id DESC LIMIT ?1");
        self.with(|c| query(c, &q, params![limit as i64], "list runs", run_from_row))
    }

    fn set_stage(
        &self,
        run: &RunId,
        stage: &str,
        phase: Phase,
        exit_code: Option<i32>,
        reason: Option<&str>,
    ) -> Result<(), StateError> {
        let t = now();
        let started = (phase == Phase::Running).then_some(t.as_str());
        let finished = phase.is_terminal().then_some(t.as_str());
        self.with(|c| {
            c.execute_cached(
                "INSERT INTO stages (run_id, stage, phase, started_at, finished_at, exit_code, reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (run_id, stage) DO UPDATE SET phase = ?3, \
                   started_at = COALESCE(stages.started_at, ?4), finished_at = ?5, \
                   exit_code = ?6, reason = ?7",
                params![run.0, stage, phase.as_str(), started, finished, exit_code, reason],
            )
            .map(|_| ())
            .map_err(sql(format!("record stage {stage} of run {run}")))
        })
    }

    fn set_stage_results(
        &self,
        run: &RunId,
        stage: &str,
        outputs: &serde_json::Value,
        values: &serde_json::Value,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE stages SET outputs = ?3, vals = ?4 WHERE run_id = ?1 AND stage = ?2",
                params![run.0, stage, outputs.to_string(), values.to_string()],
            )
            .map(|_| ())
            .map_err(sql(format!("record results of stage {stage} of run {run}")))
        })
    }

    fn stages(&self, run: &RunId) -> Result<Vec<StageRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!("SELECT {STAGE_COLUMNS} FROM stages WHERE run_id = ?1 ORDER BY rowid"),
                params![run.0],
                "read stages",
                stage_from_row,
            )
        })
    }

    fn stage(&self, run: &RunId, stage: &str) -> Result<Option<StageRecord>, StateError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {STAGE_COLUMNS} FROM stages WHERE run_id = ?1 AND stage = ?2"),
                params![run.0, stage],
                stage_from_row,
            )
            .optional()
            .map_err(sql(format!("read stage {stage} of run {run}")))
        })
    }

    fn stages_mentioning(&self, text: &str) -> Result<Vec<(RunId, String)>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT run_id, stage FROM stages WHERE instr(provenance, ?1) > 0 ORDER BY run_id, rowid",
                params![text],
                "search stages",
                |r| Ok((RunId(r.get(0)?), r.get(1)?)),
            )
        })
    }

    fn start_attempt(&self, run: &RunId, stage: &str, attempt: u32) -> Result<(), StateError> {
        let t = now();
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            // Again, for an attempt still running, when a restarted engine re-attaches to
            // it; never for one that ended.
            let changed = tx
                .execute_cached(
                    "INSERT INTO attempts (run_id, stage, attempt, phase, started_at) VALUES (?1, ?2, ?3, 'Running', ?4) \
                     ON CONFLICT (run_id, stage, attempt) DO UPDATE SET phase = 'Running' WHERE attempts.phase = 'Running'",
                    params![run.0, stage, attempt, t],
                )
                .map_err(sql(format!("record attempt {attempt} of {stage}")))?;
            if changed == 0 {
                return Err(StateError::AttemptEnded {
                    stage: stage.to_owned(),
                    attempt,
                });
            }
            tx.execute_cached(
                "INSERT INTO stages (run_id, stage, phase, attempts, started_at) VALUES (?1, ?2, 'Running', ?3, ?4) \
                 ON CONFLICT (run_id, stage) DO UPDATE SET phase = 'Running', attempts = ?3, \
                   started_at = COALESCE(stages.started_at, ?4)",
                params![run.0, stage, attempt, t],
            )
            .map_err(sql(format!("record stage {stage}")))?;
            tx.commit().map_err(sql("commit"))
        })
    }

    fn set_attempt_handle(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        handle: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE attempts SET handle = ?4 WHERE run_id = ?1 AND stage = ?2 AND attempt = ?3",
                params![run.0, stage, attempt, handle],
            )
            .map(|_| ())
            .map_err(sql(format!("record handle of {stage}")))
        })
    }

    fn finish_attempt(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        phase: Phase,
        exit_code: Option<i32>,
        reason: Option<&str>,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE attempts SET phase = ?4, finished_at = ?5, exit_code = ?6, reason = ?7 \
                 WHERE run_id = ?1 AND stage = ?2 AND attempt = ?3",
                params![
                    run.0,
                    stage,
                    attempt,
                    phase.as_str(),
                    now(),
                    exit_code,
                    reason
                ],
            )
            .map(|_| ())
            .map_err(sql(format!("finish attempt {attempt} of {stage}")))
        })
    }

    fn add_map_items(
        &self,
        run: &RunId,
        stage: &str,
        items: &[serde_json::Value],
    ) -> Result<(), StateError> {
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            tx.execute_cached("DELETE FROM map_items WHERE run_id = ?1 AND stage = ?2", params![run.0, stage])
                .map_err(sql(format!("reset items of {stage}")))?;
            {
                let mut stmt = tx
                    .prepare("INSERT INTO map_items (run_id, stage, idx, item, phase) VALUES (?1, ?2, ?3, ?4, 'Pending')")
                    .map_err(sql("record items"))?;
                for (i, item) in items.iter().enumerate() {
                    stmt.execute(params![run.0, stage, i as i64, item.to_string()])
                        .map_err(sql(format!("record item {i} of {stage}")))?;
                }
            }
            tx.commit().map_err(sql("commit"))
        })
    }

    fn start_item(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        attempt: u32,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE map_items SET phase = 'Running', attempts = ?4 WHERE run_id = ?1 AND stage = ?2 AND idx = ?3",
                params![run.0, stage, idx as i64, attempt],
            )
            .map(|_| ())
            .map_err(sql(format!("record item {idx} of {stage}")))
        })
    }

    fn finish_item(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        phase: Phase,
        reason: Option<&str>,
        outputs: &serde_json::Value,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE map_items SET phase = ?4, reason = ?5, outputs = ?6 WHERE run_id = ?1 AND stage = ?2 AND idx = ?3",
                params![run.0, stage, idx as i64, phase.as_str(), reason, outputs.to_string()],
            )
            .map(|_| ())
            .map_err(sql(format!("finish item {idx} of {stage}")))
        })
    }

    fn set_item_handle(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        handle: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE map_items SET handle = ?4 WHERE run_id = ?1 AND stage = ?2 AND idx = ?3",
                params![run.0, stage, idx as i64, handle],
            )
            .map(|_| ())
            .map_err(sql(format!("record handle of item {idx} of {stage}")))
        })
    }

    fn map_items(&self, run: &RunId, stage: &str) -> Result<Vec<ItemRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT idx, item, phase, attempts, reason, outputs, handle FROM map_items \
                 WHERE run_id = ?1 AND stage = ?2 ORDER BY idx",
                params![run.0, stage],
                "read items",
                |r| {
                    Ok(ItemRecord {
                        index: r.get::<_, i64>(0)? as usize,
                        item: json_col(r.get(1)?),
                        phase: phase_col(r.get(2)?),
                        attempts: r.get(3)?,
                        reason: r.get(4)?,
                        outputs: json_col(r.get(5)?),
                        handle: r.get(6)?,
                    })
                },
            )
        })
    }

    fn item_counts(&self, run: &RunId, stage: &str) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT phase, COUNT(*) FROM map_items WHERE run_id = ?1 AND stage = ?2 GROUP BY phase",
                params![run.0, stage],
                "count items",
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)),
            )
        })
    }

    fn set_provenance(&self, run: &RunId, stage: &str, p: &Provenance) -> Result<(), StateError> {
        let what = format!("record provenance of {stage}");
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            tx.execute_cached(
                "INSERT INTO stages (run_id, stage, phase, origin, origin_run, cache_key, provenance, inputs) \
                 VALUES (?1, ?2, 'Pending', ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (run_id, stage) DO UPDATE SET origin = ?3, origin_run = ?4, \
                   cache_key = ?5, provenance = ?6, inputs = ?7",
                params![
                    run.0,
                    stage,
                    p.origin,
                    p.origin_run,
                    p.cache_key,
                    p.provenance.to_string(),
                    p.inputs.to_string()
                ],
            )
            .map_err(sql(what.clone()))?;
            tx.execute_cached(
                "DELETE FROM artifact_uses WHERE run_id = ?1 AND stage = ?2",
                params![run.0, stage],
            )
            .map_err(sql(what.clone()))?;
            if p.origin == "ran" {
                if let Some(inputs) = p.inputs.as_object() {
                    for (name, art) in inputs {
                        let Some(digest) = art.get("digest").and_then(|d| d.as_str()) else {
                            continue;
                        };
                        tx.execute_cached(
                            "INSERT OR IGNORE INTO artifact_uses (digest, run_id, stage, input) \
                             VALUES (?1, ?2, ?3, ?4)",
                            params![digest, run.0, stage, name],
                        )
                        .map_err(sql(what.clone()))?;
                    }
                }
            }
            tx.commit().map_err(sql("commit"))
        })
    }

    fn add_artifacts(&self, artifacts: &[ArtifactRecord]) -> Result<(), StateError> {
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            for a in artifacts {
                tx.execute_cached(
                    "INSERT OR IGNORE INTO artifacts (digest, manifest, run_id, stage, output, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![a.digest, a.manifest, a.run_id, a.stage, a.output, a.created_at],
                )
                .map_err(sql(format!("record artifact {}", a.digest)))?;
            }
            tx.commit().map_err(sql("commit"))
        })
    }

    fn artifact(&self, digest: &str) -> Result<Option<ArtifactRecord>, StateError> {
        self.with(|c| {
            c.query_row(
                "SELECT digest, manifest, run_id, stage, output, created_at FROM artifacts WHERE digest = ?1",
                params![digest],
                |r| {
                    Ok(ArtifactRecord {
                        digest: r.get(0)?,
                        manifest: r.get(1)?,
                        run_id: r.get(2)?,
                        stage: r.get(3)?,
                        output: r.get(4)?,
                        created_at: r.get(5)?,
                    })
                },
            )
            .optional()
            .map_err(sql(format!("read artifact {digest}")))
        })
    }

    fn artifact_uses(&self, digest: &str) -> Result<Vec<ArtifactUse>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT digest, run_id, stage, input FROM artifact_uses WHERE digest = ?1 \
                 ORDER BY run_id, stage, input",
                params![digest],
                "read artifact uses",
                |r| {
                    Ok(ArtifactUse {
                        digest: r.get(0)?,
                        run_id: r.get(1)?,
                        stage: r.get(2)?,
                        input: r.get(3)?,
                    })
                },
            )
        })
    }

    fn put_cache_entry(&self, e: &CacheEntry) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                &format!("INSERT OR REPLACE INTO cache_entries ({CACHE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![
                    e.key,
                    e.pipeline,
                    e.stage,
                    e.run_id,
                    e.outputs.to_string(),
                    e.values.to_string(),
                    e.components.to_string(),
                    e.created_at
                ],
            )
            .map(|_| ())
            .map_err(sql(format!("record cache entry of {}", e.stage)))
        })
    }

    fn cache_entry(&self, key: &str) -> Result<Option<CacheEntry>, StateError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {CACHE_COLUMNS} FROM cache_entries WHERE key = ?1"),
                params![key],
                cache_from_row,
            )
            .optional()
            .map_err(sql("read cache entry"))
        })
    }

    fn recent_cache_entries(
        &self,
        pipeline: &str,
        stage: &str,
        except_key: &str,
        limit: usize,
    ) -> Result<Vec<CacheEntry>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!(
                    "SELECT {CACHE_COLUMNS} FROM cache_entries WHERE pipeline = ?1 AND stage = ?2 \
                     AND key != ?3 ORDER BY created_at DESC LIMIT ?4"
                ),
                params![pipeline, stage, except_key, limit as i64],
                "read cache entries",
                cache_from_row,
            )
        })
    }

    fn cache_entries(&self) -> Result<Vec<CacheEntry>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!("SELECT {CACHE_COLUMNS} FROM cache_entries ORDER BY created_at"),
                [],
                "read cache entries",
                cache_from_row,
            )
        })
    }

    fn expire_cache_entries(&self, before: &str) -> Result<usize, StateError> {
        self.with(|c| {
            c.execute_cached(
                "DELETE FROM cache_entries WHERE created_at < ?1",
                params![before],
            )
            .map_err(sql("expire cache entries"))
        })
    }

    fn upsert_schedule(&self, pipeline: &str, file: &str, anchor: &str) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "INSERT INTO schedules (pipeline, file, anchor) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (pipeline) DO UPDATE SET file = ?2",
                params![pipeline, file, anchor],
            )
            .map(|_| ())
            .map_err(sql(format!("register schedule {pipeline}")))
        })
    }

    fn schedule(&self, pipeline: &str) -> Result<Option<ScheduleEntry>, StateError> {
        // One row by its key: the scheduler asks for every pipeline on every tick.
        self.with(|c| {
            c.query_row(
                "SELECT pipeline, file, suspended, anchor FROM schedules WHERE pipeline = ?1",
                params![pipeline],
                schedule_from_row,
            )
            .optional()
            .map_err(sql(format!("read schedule {pipeline}")))
        })
    }

    fn schedules(&self) -> Result<Vec<ScheduleEntry>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT pipeline, file, suspended, anchor FROM schedules ORDER BY pipeline",
                [],
                "read schedules",
                schedule_from_row,
            )
        })
    }

    fn set_suspended(
        &self,
        pipeline: &str,
        suspended: bool,
        anchor: Option<&str>,
    ) -> Result<(), StateError> {
        self.with(|c| {
            let n = c
                .execute_cached(
                    "UPDATE schedules SET suspended = ?2, anchor = COALESCE(?3, anchor) WHERE pipeline = ?1",
                    params![pipeline, suspended as i64, anchor],
                )
                .map_err(sql(format!("suspend schedule {pipeline}")))?;
            if n == 0 {
                return Err(StateError::UnknownRun(format!("schedule {pipeline}")));
            }
            Ok(())
        })
    }

    fn claim_tick(&self, t: &TickRecord) -> Result<bool, StateError> {
        self.with(|c| insert_tick(c, t))
    }

    fn schedules_with_last_tick(&self) -> Result<Vec<(ScheduleEntry, Option<String>)>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!("SELECT pipeline, file, suspended, anchor, ({LAST_TICK}) FROM schedules s ORDER BY pipeline"),
                params![],
                "read schedules",
                |r| Ok((schedule_from_row(r)?, r.get(4)?)),
            )
        })
    }

    fn unstarted_ticks_since(&self, since: &str) -> Result<Vec<TickRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!("{UNSTARTED_SINCE} ?1 ORDER BY t.scheduled_time"),
                params![since],
                "read unstarted ticks",
                tick_from_row,
            )
        })
    }

    fn claim_ticks(
        &self,
        ticks: &[(TickRecord, Option<RunRecord>)],
    ) -> Result<Vec<Result<bool, StateError>>, StateError> {
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            let mut out = Vec::with_capacity(ticks.len());
            for (tick, run) in ticks {
                tx.execute_batch("SAVEPOINT tick")
                    .map_err(sql("savepoint"))?;
                let claimed = insert_tick(&tx, tick).and_then(|claimed| match run {
                    Some(run) if claimed => insert_run(&tx, run).map(|()| true),
                    _ => Ok(claimed),
                });
                if claimed.is_err() {
                    tx.execute_batch("ROLLBACK TO tick")
                        .map_err(sql("roll back to savepoint"))?;
                }
                tx.execute_batch("RELEASE tick")
                    .map_err(sql("release savepoint"))?;
                out.push(claimed);
            }
            tx.commit().map_err(sql("commit"))?;
            Ok(out)
        })
    }

    fn ticks(&self, pipeline: &str, limit: usize) -> Result<Vec<TickRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT id, pipeline, scheduled_time, outcome, run_id, reason FROM schedule_ticks \
                 WHERE pipeline = ?1 ORDER BY scheduled_time DESC LIMIT ?2",
                params![pipeline, limit as i64],
                "read ticks",
                tick_from_row,
            )
        })
    }

    fn run_counts(&self) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT phase, COUNT(*) FROM runs GROUP BY phase",
                params![],
                "count runs",
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)),
            )
            .map(|rows: Vec<(String, u64)>| rows.into_iter().collect())
        })
    }

    fn heartbeat(&self, run: &RunId) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE runs SET heartbeat_at = ?2 WHERE id = ?1",
                params![run.0, now()],
            )
            .map(|_| ())
            .map_err(sql(format!("record the heartbeat of run {run}")))
        })
    }

    fn stale_runs(&self, before: &str) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT id FROM runs WHERE phase = 'Running' AND heartbeat_at < ?1 ORDER BY created_at",
                params![before],
                "read stale runs",
                |r| Ok(RunId(r.get(0)?)),
            )
        })
    }

    fn take_over(&self, run: &RunId, before: &str) -> Result<bool, StateError> {
        self.with(|c| {
            c.execute_cached(
                "UPDATE runs SET heartbeat_at = ?3, engine_pid = NULL \
                 WHERE id = ?1 AND phase = 'Running' AND (heartbeat_at IS NULL OR heartbeat_at < ?2)",
                params![run.0, before, now()],
            )
            .map(|n| n == 1)
            .map_err(sql(format!("take over run {run}")))
        })
    }

    fn running_runs(&self, pipeline: &str) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT id FROM runs WHERE pipeline = ?1 AND phase IN ('Running', 'Pending') ORDER BY created_at",
                params![pipeline],
                "read running runs",
                |r| Ok(RunId(r.get(0)?)),
            )
        })
    }

    fn attempts(&self, run: &RunId) -> Result<Vec<AttemptRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT stage, attempt, phase, started_at, finished_at, exit_code, reason, handle \
                 FROM attempts WHERE run_id = ?1 ORDER BY rowid",
                params![run.0],
                "read attempts",
                |r| {
                    Ok(AttemptRecord {
                        stage: r.get(0)?,
                        attempt: r.get(1)?,
                        phase: phase_col(r.get(2)?),
                        started_at: r.get(3)?,
                        finished_at: r.get(4)?,
                        exit_code: r.get(5)?,
                        reason: r.get(6)?,
                        handle: r.get(7)?,
                    })
                },
            )
        })
    }
}

/// The conformance suite every [`StateStore`] implementation's tests call, so SQLite
/// and the server databases behave the same. Panics on the first broken guarantee.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use super::*;

    /// A run record for tests.
    pub fn run_record(id: &str) -> RunRecord {
        RunRecord {
            id: RunId(id.into()),
            pipeline: "p".into(),
            file: "p.yaml".into(),
            spec_digest: "sha256:d".into(),
            params: serde_json::json!({"n": 1}),
            trigger: "cli".into(),
            parent: None,
            phase: Phase::Running,
            created_at: now(),
            finished_at: None,
            reason: None,
            engine_pid: Some(7),
            overrides: serde_json::json!({}),
            selection: None,
            scheduled_time: None,
            executor: Some("local".into()),
        }
    }

    /// Runs every check against `store`, which must be empty.
    pub fn check(store: &dyn StateStore) {
        heartbeats_and_take_over(store);
        runs_stages_and_attempts(store);
        map_items(store);
        listing(store);
        provenance_and_cache(store);
        schedules_and_ticks(store);
        ticks_in_batches(store);
    }

    /// Replicas racing for the same ticks, each through its own connection (`open`),
    /// claim every tick exactly once.
    pub fn exclusive_claims(open: &(dyn Fn() -> Box<dyn StateStore> + Sync)) {
        const TICKS: usize = 40;
        let won: Vec<Vec<usize>> = std::thread::scope(|sc| {
            let racers: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        let s = open();
                        (0..TICKS)
                            .filter(|i| {
                                s.claim_tick(&TickRecord {
                                    id: format!("race@{i}"),
                                    pipeline: "race".into(),
                                    scheduled_time: format!("2026-03-01T00:{i:02}:00Z"),
                                    outcome: "fired".into(),
                                    run_id: Some(format!("race-{i}")),
                                    reason: None,
                                })
                                .unwrap()
                            })
                            .collect()
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = won.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (0..TICKS).collect::<Vec<_>>(), "each tick won once");
    }

    fn heartbeats_and_take_over(s: &dyn StateStore) {
        let id = RunId("conf-hb".into());
        s.create_run(&run_record("conf-hb")).unwrap();
        let past = "2000-01-01T00:00:00.000Z";
        let future = "2999-01-01T00:00:00.000Z";
        assert!(
            s.stale_runs(future).unwrap().is_empty(),
            "a run that never beat is not judged by heartbeats"
        );
        let silent = RunId("conf-hb-silent".into());
        s.create_run(&run_record("conf-hb-silent")).unwrap();
        assert!(
            s.take_over(&silent, past).unwrap(),
            "one that never beat can be taken"
        );
        assert!(!s.take_over(&silent, past).unwrap(), "once");
        s.finish_run(&silent, Phase::Failed, None).unwrap();
        s.heartbeat(&id).unwrap();
        assert!(s.stale_runs(past).unwrap().is_empty(), "beating: alive");
        assert_eq!(s.stale_runs(future).unwrap(), std::slice::from_ref(&id));
        assert!(s.take_over(&id, future).unwrap());
        assert_eq!(s.run(&id).unwrap().engine_pid, None);
        assert!(
            !s.take_over(&id, past).unwrap(),
            "taken over: its heartbeat is fresh again"
        );
        s.finish_run(&id, Phase::Failed, Some("x")).unwrap();
        assert!(
            s.stale_runs(future).unwrap().is_empty(),
            "ended runs are not stale"
        );
        assert!(!s.take_over(&id, future).unwrap());
    }

    /// What the scheduler reads and writes once per loop for all schedules.
    fn ticks_in_batches(s: &dyn StateStore) {
        let before = now();
        s.upsert_schedule("batch-a", "a.yaml", "2026-01-01T00:00:00Z")
            .unwrap();
        s.upsert_schedule("batch-b", "b.yaml", "2026-01-01T00:00:00Z")
            .unwrap();
        let tick = |t: &str, run: Option<&str>| TickRecord {
            id: format!("batch-a@{t}"),
            pipeline: "batch-a".into(),
            scheduled_time: t.into(),
            outcome: if run.is_some() { "fired" } else { "skipped" }.into(),
            run_id: run.map(String::from),
            reason: run.is_none().then(|| "missed".into()),
        };
        let run = |id: &str| RunRecord {
            pipeline: "batch-a".into(),
            ..run_record(id)
        };
        let last = |s: &dyn StateStore| -> BTreeMap<String, Option<String>> {
            s.schedules_with_last_tick()
                .unwrap()
                .into_iter()
                .filter(|(e, _)| e.pipeline.starts_with("batch-"))
                .map(|(e, last)| (e.pipeline, last))
                .collect()
        };
        assert_eq!(
            last(s),
            BTreeMap::from([("batch-a".into(), None), ("batch-b".into(), None)])
        );
        let claims = s
            .claim_ticks(&[
                (
                    tick("2026-03-01T01:00:00Z", Some("batch-r1")),
                    Some(run("batch-r1")),
                ),
                (tick("2026-03-01T02:00:00Z", None), None),
            ])
            .unwrap();
        assert!(claims.iter().all(|c| matches!(c, Ok(true))), "{claims:?}");
        assert_eq!(
            s.run(&RunId("batch-r1".into())).unwrap().pipeline,
            "batch-a"
        );
        // A manual trigger later than every cron tick does not stand for one.
        assert!(s
            .claim_tick(&TickRecord {
                id: "batch-a@2026-03-01T05:00:00Z+manual".into(),
                ..tick("2026-03-01T05:00:00Z", Some("batch-manual"))
            })
            .unwrap());
        assert_eq!(last(s)["batch-a"].as_deref(), Some("2026-03-01T02:00:00Z"));
        assert_eq!(last(s)["batch-b"], None);
        // The queued manual tick has no run: found among ticks recorded since `before`.
        let unstarted: Vec<String> = s
            .unstarted_ticks_since(&before)
            .unwrap()
            .into_iter()
            .filter(|t| t.pipeline == "batch-a")
            .map(|t| t.id)
            .collect();
        assert_eq!(unstarted, ["batch-a@2026-03-01T05:00:00Z+manual"]);
        assert!(s.unstarted_ticks_since("9999").unwrap().is_empty());
        // One transaction, each tick on its own: taken ones and failed runs record nothing.
        let claims = s
            .claim_ticks(&[
                (
                    tick("2026-03-01T01:00:00Z", Some("batch-r1b")),
                    Some(run("batch-r1b")),
                ),
                (
                    tick("2026-03-01T03:00:00Z", Some("batch-r1")),
                    Some(run("batch-r1")),
                ),
                (
                    tick("2026-03-01T04:00:00Z", Some("batch-r4")),
                    Some(run("batch-r4")),
                ),
            ])
            .unwrap();
        assert!(matches!(claims[0], Ok(false)), "claimed before: {claims:?}");
        assert!(claims[1].is_err(), "a run id taken: {claims:?}");
        assert!(matches!(claims[2], Ok(true)), "{claims:?}");
        assert!(s.run(&RunId("batch-r1b".into())).is_err());
        assert!(s.run(&RunId("batch-r4".into())).is_ok());
        let times: Vec<String> = s
            .ticks("batch-a", 10)
            .unwrap()
            .into_iter()
            .map(|t| t.scheduled_time)
            .collect();
        assert_eq!(
            times,
            [
                "2026-03-01T05:00:00Z",
                "2026-03-01T04:00:00Z",
                "2026-03-01T02:00:00Z",
                "2026-03-01T01:00:00Z"
            ],
            "the failed tick is not claimed"
        );
    }

    fn schedules_and_ticks(s: &dyn StateStore) {
        s.upsert_schedule("nightly", "a.yaml", "2026-01-01T00:00:00Z")
            .unwrap();
        // Registering again updates the file, not the anchor.
        s.upsert_schedule("nightly", "b.yaml", "2026-05-05T00:00:00Z")
            .unwrap();
        let e = s.schedule("nightly").unwrap().unwrap();
        assert_eq!(
            (e.file.as_str(), e.anchor.as_str(), e.suspended),
            ("b.yaml", "2026-01-01T00:00:00Z", false)
        );
        s.set_suspended("nightly", true, None).unwrap();
        assert!(s.schedule("nightly").unwrap().unwrap().suspended);
        s.set_suspended("nightly", false, Some("2026-02-01T00:00:00Z"))
            .unwrap();
        assert_eq!(
            s.schedule("nightly").unwrap().unwrap().anchor,
            "2026-02-01T00:00:00Z"
        );
        assert!(s.set_suspended("nope", true, None).is_err());
        assert_eq!(s.schedules().unwrap().len(), 1);
        let tick = |t: &str| TickRecord {
            id: format!("nightly@{t}"),
            pipeline: "nightly".into(),
            scheduled_time: t.into(),
            outcome: "fired".into(),
            run_id: Some(format!("run-{t}")),
            reason: None,
        };
        assert!(s.claim_tick(&tick("2026-02-02T03:00:00Z")).unwrap());
        assert!(
            !s.claim_tick(&tick("2026-02-02T03:00:00Z")).unwrap(),
            "a tick is claimed once"
        );
        assert!(s.claim_tick(&tick("2026-02-03T03:00:00Z")).unwrap());
        let ticks = s.ticks("nightly", 10).unwrap();
        assert_eq!(
            ticks[0].scheduled_time, "2026-02-03T03:00:00Z",
            "newest first"
        );
        assert_eq!(s.ticks("nightly", 1).unwrap().len(), 1);
        // Claimed, no run yet: both are unstarted, oldest first; a started one is not.
        let unstarted = |s: &dyn StateStore| -> Vec<String> {
            s.unstarted_ticks_since("")
                .unwrap()
                .into_iter()
                .filter(|t| t.pipeline == "nightly")
                .map(|t| t.scheduled_time)
                .collect()
        };
        assert_eq!(
            unstarted(s),
            vec!["2026-02-02T03:00:00Z", "2026-02-03T03:00:00Z"]
        );
        s.create_run(&run_record("run-2026-02-02T03:00:00Z"))
            .unwrap();
        assert_eq!(unstarted(s), vec!["2026-02-03T03:00:00Z"]);
        assert!(s.run_counts().unwrap().get("Running").copied().unwrap_or(0) >= 1);
        assert!(s
            .claim_tick(&TickRecord {
                outcome: "skipped".into(),
                run_id: None,
                ..tick("2026-02-04T03:00:00Z")
            })
            .unwrap());
        assert_eq!(
            unstarted(s),
            vec!["2026-02-03T03:00:00Z"],
            "skipped ticks start nothing"
        );
        let mut r = run_record("conf-sched-run");
        r.pipeline = "nightly".into();
        s.create_run(&r).unwrap();
        assert_eq!(s.running_runs("nightly").unwrap(), [r.id.clone()]);
        s.finish_run(&r.id, Phase::Succeeded, None).unwrap();
        assert!(s.running_runs("nightly").unwrap().is_empty());
    }

    fn provenance_and_cache(s: &dyn StateStore) {
        let mut rec = run_record("conf-prov");
        rec.parent = Some(RunId("conf-r1".into()));
        rec.selection = Some(vec!["b".into()]);
        rec.overrides = serde_json::json!({"params": {"n": 2}});
        s.create_run(&rec).unwrap();
        let id = rec.id.clone();
        let back = s.run(&id).unwrap();
        assert_eq!(back.selection, rec.selection);
        assert_eq!(back.overrides, rec.overrides);
        assert_eq!(back.parent, rec.parent);

        // A stage that ran records the artifacts it read; a reused one does not.
        let art =
            serde_json::json!({"manifest": "runs/x/a/1/manifests/o.json", "digest": "sha256:aa"});
        let ran = Provenance {
            origin: "ran".into(),
            origin_run: None,
            cache_key: Some("sha256:k1".into()),
            provenance: serde_json::json!({"components": {"input:data": "sha256:aa"}}),
            inputs: serde_json::json!({"data": art}),
        };
        s.set_provenance(&id, "b", &ran).unwrap();
        s.set_stage(&id, "b", Phase::Succeeded, Some(0), None)
            .unwrap();
        let reused = Provenance {
            origin: "reused".into(),
            origin_run: Some("conf-r1".into()),
            cache_key: None,
            provenance: serde_json::json!({}),
            inputs: serde_json::json!({"data": art}),
        };
        s.set_provenance(&id, "c", &reused).unwrap();
        let stages = s.stages(&id).unwrap();
        let b = stages.iter().find(|x| x.stage == "b").unwrap();
        assert_eq!(b.phase, Phase::Succeeded, "provenance keeps the phase");
        assert_eq!(
            (b.how.origin.as_str(), b.how.cache_key.as_deref()),
            ("ran", Some("sha256:k1"))
        );
        assert_eq!(b.how.inputs["data"]["digest"], "sha256:aa");
        assert_eq!(s.stage(&id, "b").unwrap().as_ref(), Some(b));
        assert_eq!(s.stage(&id, "nope").unwrap(), None);
        assert_eq!(
            s.stages_mentioning("input:data").unwrap(),
            [(id.clone(), "b".to_owned())]
        );
        let c = stages.iter().find(|x| x.stage == "c").unwrap();
        assert_eq!(
            (c.how.origin.as_str(), c.how.origin_run.as_deref()),
            ("reused", Some("conf-r1"))
        );
        let uses = s.artifact_uses("sha256:aa").unwrap();
        assert_eq!(uses.len(), 1, "{uses:?}");
        assert_eq!(
            (uses[0].stage.as_str(), uses[0].input.as_str()),
            ("b", "data")
        );

        let a = ArtifactRecord {
            digest: "sha256:aa".into(),
            manifest: "runs/x/a/1/manifests/o.json".into(),
            run_id: "x".into(),
            stage: "a".into(),
            output: "o".into(),
            created_at: now(),
        };
        s.add_artifacts(std::slice::from_ref(&a)).unwrap();
        s.add_artifacts(std::slice::from_ref(&a)).unwrap();
        assert_eq!(s.artifact("sha256:aa").unwrap(), Some(a));
        assert_eq!(s.artifact("sha256:none").unwrap(), None);

        let entry = |key: &str, at: &str| CacheEntry {
            key: key.into(),
            pipeline: "p".into(),
            stage: "b".into(),
            run_id: id.0.clone(),
            outputs: serde_json::json!({"o": art}),
            values: serde_json::json!({"v": 1}),
            components: serde_json::json!({"definition": "sha256:d"}),
            created_at: at.into(),
        };
        s.put_cache_entry(&entry("sha256:k1", "2026-01-01T00:00:00.000Z"))
            .unwrap();
        s.put_cache_entry(&entry("sha256:k2", "2026-02-01T00:00:00.000Z"))
            .unwrap();
        // Replacing an entry keeps one row per key.
        s.put_cache_entry(&entry("sha256:k1", "2026-01-02T00:00:00.000Z"))
            .unwrap();
        assert_eq!(s.cache_entries().unwrap().len(), 2);
        assert_eq!(
            s.cache_entry("sha256:k1").unwrap().unwrap().created_at,
            "2026-01-02T00:00:00.000Z"
        );
        assert_eq!(s.cache_entry("sha256:nope").unwrap(), None);
        let others = s.recent_cache_entries("p", "b", "sha256:k2", 10).unwrap();
        assert_eq!(others.len(), 1);
        assert_eq!(others[0].key, "sha256:k1");
        let all = s.recent_cache_entries("p", "b", "", 10).unwrap();
        let keys: Vec<&str> = all.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["sha256:k2", "sha256:k1"], "newest first");
        assert_eq!(s.recent_cache_entries("p", "b", "", 1).unwrap().len(), 1);
        assert_eq!(
            s.expire_cache_entries("2026-01-15T00:00:00.000Z").unwrap(),
            1
        );
        assert_eq!(s.cache_entries().unwrap().len(), 1);
    }

    fn runs_stages_and_attempts(s: &dyn StateStore) {
        let id = RunId("conf-r1".into());
        s.create_run(&run_record("conf-r1")).unwrap();
        assert!(
            s.create_run(&run_record("conf-r1")).is_err(),
            "a run id is unique"
        );
        s.start_attempt(&id, "a", 1).unwrap();
        s.set_attempt_handle(&id, "a", 1, "pgid:42").unwrap();
        s.start_attempt(&id, "a", 1)
            .expect("a running attempt starts again (a restarted engine re-attaches)");
        assert_eq!(
            s.attempts(&id).unwrap()[0].handle.as_deref(),
            Some("pgid:42")
        );
        s.finish_attempt(&id, "a", 1, Phase::Failed, Some(3), Some("exit 3"))
            .unwrap();
        assert!(
            s.start_attempt(&id, "a", 1).is_err(),
            "an attempt is recorded once"
        );
        s.start_attempt(&id, "a", 2).unwrap();
        s.finish_attempt(&id, "a", 2, Phase::Succeeded, Some(0), None)
            .unwrap();
        s.set_stage(&id, "a", Phase::Succeeded, Some(0), None)
            .unwrap();
        s.set_stage_results(
            &id,
            "a",
            &serde_json::json!({"out": {"digest": "x"}}),
            &serde_json::json!({"ok": true}),
        )
        .unwrap();
        s.set_stage(&id, "b", Phase::Skipped, None, Some("when was false"))
            .unwrap();
        assert_eq!(s.run(&id).unwrap().engine_pid, Some(7));
        s.finish_run(&id, Phase::Succeeded, None).unwrap();

        let r = s.run(&id).unwrap();
        assert_eq!(r.phase, Phase::Succeeded);
        assert!(r.finished_at.is_some());
        assert_eq!(r.engine_pid, None, "a finished run has no engine");
        assert_eq!(r.params["n"], 1);
        let stages = s.stages(&id).unwrap();
        assert_eq!(stages.len(), 2);
        assert_eq!((stages[0].phase, stages[0].attempts), (Phase::Succeeded, 2));
        assert_eq!(stages[0].values["ok"], true);
        assert_eq!(stages[0].outputs["out"]["digest"], "x");
        assert_eq!(stages[1].reason.as_deref(), Some("when was false"));
        let attempts = s.attempts(&id).unwrap();
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].handle.as_deref(), Some("pgid:42"));
        assert_eq!(attempts[0].exit_code, Some(3));
        assert!(matches!(
            s.run(&RunId("conf-nope".into())),
            Err(StateError::UnknownRun(_))
        ));

        s.reopen_run(&id, 9).unwrap();
        let r = s.run(&id).unwrap();
        assert_eq!(
            (r.phase, r.engine_pid, r.finished_at),
            (Phase::Running, Some(9), None)
        );
        assert!(matches!(
            s.reopen_run(&RunId("conf-nope".into()), 1),
            Err(StateError::UnknownRun(_))
        ));
    }

    fn map_items(s: &dyn StateStore) {
        let id = RunId("conf-r2".into());
        s.create_run(&run_record("conf-r2")).unwrap();
        let items: Vec<serde_json::Value> =
            (0..1000).map(|i| serde_json::json!({"drive": i})).collect();
        s.add_map_items(&id, "m", &items).unwrap();
        s.start_item(&id, "m", 3, 1).unwrap();
        s.set_item_handle(&id, "m", 3, "pgid:9").unwrap();
        s.finish_item(
            &id,
            "m",
            3,
            Phase::Succeeded,
            None,
            &serde_json::json!({"o": 1}),
        )
        .unwrap();
        s.finish_item(
            &id,
            "m",
            4,
            Phase::Failed,
            Some("exit 1"),
            &serde_json::json!({}),
        )
        .unwrap();
        let listed = s.map_items(&id, "m").unwrap();
        assert_eq!(listed.len(), 1000);
        assert_eq!((listed[3].phase, listed[3].attempts), (Phase::Succeeded, 1));
        assert_eq!(listed[3].handle.as_deref(), Some("pgid:9"));
        assert_eq!(listed[3].item["drive"], 3);
        assert_eq!(listed[3].outputs["o"], 1);
        let counts = s.item_counts(&id, "m").unwrap();
        assert_eq!(
            (counts["Pending"], counts["Succeeded"], counts["Failed"]),
            (998, 1, 1)
        );
        s.add_map_items(&id, "m", &items[..10]).unwrap();
        assert_eq!(
            s.item_counts(&id, "m").unwrap()["Pending"],
            10,
            "adding again starts over"
        );
    }

    fn listing(s: &dyn StateStore) {
        let runs = s.list_runs(10).unwrap();
        assert!(runs.len() >= 2);
        assert!(
            runs.windows(2).all(|w| w[0].created_at >= w[1].created_at),
            "newest first"
        );
        assert_eq!(s.list_runs(1).unwrap().len(), 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_passes_the_conformance_suite() {
        conformance::check(&SqliteState::in_memory().unwrap());
    }

    /// A server and a command opening a new database at the same moment both succeed.
    #[test]
    fn concurrent_first_opens_migrate_once() {
        for round in 0..20 {
            let path = std::env::temp_dir()
                .join(format!("dt-state-race-{}-{round}.db", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let openers: Vec<_> = (0..4)
                .map(|_| {
                    let p = path.clone();
                    std::thread::spawn(move || SqliteState::open(&p).map(|_| ()))
                })
                .collect();
            for o in openers {
                o.join().unwrap().unwrap();
            }
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }

    #[test]
    fn a_file_database_survives_reopening_and_migrates_once() {
        let dir = std::env::temp_dir().join(format!("dt-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        let _ = std::fs::remove_file(&path);
        SqliteState::open(&path)
            .unwrap()
            .create_run(&conformance::run_record("r1"))
            .unwrap();
        let s = SqliteState::open(&path).unwrap();
        assert_eq!(s.list_runs(10).unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sqlite_connections_claim_ticks_exclusively() {
        let dir = std::env::temp_dir().join(format!("dt-state-claims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        let _ = std::fs::remove_file(&path);
        conformance::exclusive_claims(&|| Box::new(SqliteState::open(&path).unwrap()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_ids_sort_by_time() {
        let a = RunId::generate(chrono::DateTime::from_timestamp(1_700_000_000, 5).unwrap());
        let b = RunId::generate(chrono::DateTime::from_timestamp(1_700_000_001, 5).unwrap());
        assert!(a < b);
        assert_eq!(a.0.len(), "20231114-221320-0000".len());
    }
}
