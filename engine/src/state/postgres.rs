//! The PostgreSQL state store, for several engine replicas sharing one database.
//!
//! The same tables and guarantees as the embedded SQLite store (one conformance suite
//! checks both): every method commits before it returns, a tick is claimed by exactly one
//! `INSERT … ON CONFLICT DO NOTHING` however many replicas race for it, and the schema is
//! migrated under an advisory lock so replicas starting together migrate once.
//!
//! The `postgres` client blocks on a runtime of its own; a call made on a tokio worker
//! runs on a scoped thread so the engine's runtime is never blocked inside itself.

mod access;
mod devices;
mod events;
mod trials;

use super::prelude::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

use super::queries;
use super::schema::Dialect;
use super::{
    now, ArtifactRecord, ArtifactUse, AttemptRecord, CacheEntry, ItemEnd, ItemRecord, Origin,
    Phase, Provenance, RunFilter, RunId, RunRecord, ScheduleEntry, StageRecord, StateError,
    StateStore, Success, TickRecord, LAST_TICK, UNSTARTED_SINCE,
};
use postgres::types::ToSql;
use postgres::{Client, GenericClient, NoTls, Row};

/// PostgreSQL's own schema history, frozen: what brings a database made before the
/// shared schema (`state/schema.rs`) to it, one step per version
/// (`drivetrain_schema.version` says how many ran). New databases get the shared schema
/// instead; changes go there.
const HISTORY: &[&str] = &[
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
    reason TEXT,
    engine_pid BIGINT,
    overrides TEXT NOT NULL DEFAULT '{}',
    selection TEXT,
    scheduled_time TEXT,
    executor TEXT
);
CREATE INDEX runs_by_time ON runs(created_at);
CREATE INDEX runs_by_pipeline ON runs(pipeline, phase);
CREATE TABLE stages (
    seq BIGSERIAL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    started_at TEXT,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    vals TEXT NOT NULL DEFAULT '{}',
    origin TEXT NOT NULL DEFAULT 'ran',
    origin_run TEXT,
    cache_key TEXT,
    provenance TEXT NOT NULL DEFAULT '{}',
    inputs TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, stage)
);
CREATE TABLE attempts (
    seq BIGSERIAL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    phase TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    handle TEXT,
    PRIMARY KEY (run_id, stage, attempt)
);
CREATE TABLE map_items (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    idx BIGINT NOT NULL,
    item TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    handle TEXT,
    PRIMARY KEY (run_id, stage, idx)
);
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
CREATE TABLE schedules (
    pipeline TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    suspended BOOLEAN NOT NULL DEFAULT FALSE,
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
"#,
    // 2: the heartbeat of the engine running a run, so a replica can take over the runs of
    // one that died.
    "ALTER TABLE runs ADD COLUMN heartbeat_at TEXT",
    // 3: ticks by when they were recorded, so the scheduler finds new unstarted ones (a
    // `schedule trigger`) every loop without reading them all.
    "CREATE INDEX ticks_by_record ON schedule_ticks(recorded_at)",
    // 4: what each attempt used (JSON), and its stage's latest.
    "ALTER TABLE attempts ADD COLUMN usage TEXT; ALTER TABLE stages ADD COLUMN usage TEXT",
    // 5: what each map item's last attempt used.
    "ALTER TABLE map_items ADD COLUMN usage TEXT",
    // 6: the run list's order within each filter, so a filtered list reads only the rows
    // it shows (`StateStore::find_runs`).
    "CREATE INDEX runs_by_time_id ON runs(created_at, id); \
     CREATE INDEX runs_by_pipeline_time ON runs(pipeline, created_at, id); \
     CREATE INDEX runs_by_phase_time ON runs(phase, created_at, id); \
     CREATE INDEX runs_by_trigger_time ON runs(trigger, created_at, id)",
];

/// Any key of this store's advisory lock for migrations.
const MIGRATION_LOCK: i64 = 0x6472_6976_6574_7261; // "drivetra"

fn db(what: impl Into<String>) -> impl FnOnce(postgres::Error) -> StateError {
    let what = what.into();
    move |e| StateError::Database {
        what,
        source: Box::new(e),
    }
}

/// The PostgreSQL state store.
pub struct PostgresState {
    url: String,
    /// Always `Some` but while being dropped.
    client: Mutex<Option<Client>>,
}

impl Drop for PostgresState {
    fn drop(&mut self) {
        // Closing the connection blocks on the client's runtime too.
        let client = self
            .client
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        off_runtime(move || drop(client));
    }
}

impl std::fmt::Debug for PostgresState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("PostgresState").finish_non_exhaustive()
    }
}

impl PostgresState {
    /// Connects to `url` (`postgres://user@host:port/db`) and migrates the schema.
    pub fn open(url: &str) -> Result<Self, StateError> {
        let store = PostgresState {
            url: url.to_owned(),
            client: Mutex::new(Some(off_runtime(|| Self::connect(url))?)),
        };
        store.with(|c| {
            let mut tx = c.transaction().map_err(db("begin migration"))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .map_err(db("lock for migration"))?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS drivetrain_schema (version BIGINT NOT NULL)",
            )
            .map_err(db("create the schema table"))?;
            let version: i64 = tx
                .query_opt("SELECT version FROM drivetrain_schema", &[])
                .map_err(db("read schema version"))?
                .map(|r| r.get(0))
                .unwrap_or(0);
            if version == 0 {
                tx.execute("INSERT INTO drivetrain_schema (version) VALUES (0)", &[])
                    .map_err(db("record schema version"))?;
            }
            for (to, m) in Dialect::Postgres.steps(version.max(0) as usize, HISTORY) {
                tx.batch_execute(&m)
                    .map_err(db(format!("migration to version {to}")))?;
                tx.execute("UPDATE drivetrain_schema SET version = $1", &[&(to as i64)])
                    .map_err(db("record schema version"))?;
            }
            tx.commit().map_err(db("commit migrations"))
        })?;
        Ok(store)
    }

    fn connect(url: &str) -> Result<Client, StateError> {
        Client::connect(url, NoTls).map_err(db("connect"))
    }

    /// Runs `f` with the connection, reconnecting once if the server closed it.
    fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StateError> + Send,
    ) -> Result<T, StateError> {
        let mut guard = self.client.lock().unwrap_or_else(|e| e.into_inner());
        let slot: &mut Option<Client> = &mut guard;
        off_runtime(|| {
            let client = match slot {
                Some(c) if !c.is_closed() => c,
                _ => slot.insert(Self::connect(&self.url)?),
            };
            f(client)
        })
    }
}

/// Runs `f` where the blocking client may start its own runtime: on a scoped thread when
/// called from inside a tokio runtime, in place otherwise.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

fn json_col(s: String) -> serde_json::Value {
    serde_json::from_str(&s).unwrap_or(serde_json::Value::Null)
}

fn phase_col(s: String) -> Phase {
    Phase::parse(&s).unwrap_or(Phase::Error)
}

fn count(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

const RUN_COLUMNS: &str = "id, pipeline, file, spec_digest, params, trigger, parent, phase, \
     created_at, finished_at, reason, engine_pid, overrides, selection, scheduled_time, executor, \
     project";

fn run_from_row(r: &Row) -> RunRecord {
    RunRecord {
        id: RunId(r.get(0)),
        pipeline: r.get(1),
        file: r.get(2),
        spec_digest: r.get(3),
        params: json_col(r.get(4)),
        trigger: r.get(5),
        parent: r.get::<_, Option<String>>(6).map(RunId),
        phase: phase_col(r.get(7)),
        created_at: r.get(8),
        finished_at: r.get(9),
        reason: r.get(10),
        engine_pid: r.get(11),
        overrides: json_col(r.get(12)),
        selection: r
            .get::<_, Option<String>>(13)
            .and_then(|s| serde_json::from_str(&s).ok()),
        scheduled_time: r.get(14),
        executor: r.get(15),
        project: r.get(16),
    }
}

const STAGE_COLUMNS: &str = "stage, phase, attempts, started_at, finished_at, exit_code, reason, \
     outputs, vals, origin, origin_run, cache_key, provenance, inputs, usage";

fn stage_from_row(r: &Row) -> StageRecord {
    StageRecord {
        stage: super::StageName(r.get(0)),
        phase: phase_col(r.get(1)),
        attempts: count(r.get(2)),
        started_at: r.get(3),
        finished_at: r.get(4),
        exit_code: r.get(5),
        reason: r.get(6),
        outputs: json_col(r.get(7)),
        values: json_col(r.get(8)),
        how: Provenance {
            origin: Origin::from_columns(r.get(9), r.get(10)),
            cache_key: r.get(11),
            provenance: json_col(r.get(12)),
            inputs: json_col(r.get(13)),
        },
        usage: r
            .get::<_, Option<String>>(14)
            .and_then(|u| serde_json::from_str(&u).ok()),
    }
}

const CACHE_COLUMNS: &str = "key, pipeline, stage, run_id, outputs, vals, components, created_at";

fn cache_from_row(r: &Row) -> CacheEntry {
    CacheEntry {
        key: r.get(0),
        pipeline: r.get(1),
        stage: r.get(2),
        run_id: r.get(3),
        outputs: json_col(r.get(4)),
        values: json_col(r.get(5)),
        components: json_col(r.get(6)),
        created_at: r.get(7),
    }
}

/// Inserts a run's record.
fn insert_run(c: &mut impl GenericClient, run: &RunRecord) -> Result<(), StateError> {
    let params = run.params.to_string();
    let overrides = run.overrides.to_string();
    let selection = run
        .selection
        .as_ref()
        .map(|s| serde_json::to_string(s).unwrap_or_default());
    let parent = run.parent.as_ref().map(|p| p.0.clone());
    exec(
        c,
        queries::pg::INSERT_RUN,
        &[
            &run.id.0,
            &run.pipeline,
            &run.file,
            &run.spec_digest,
            &params,
            &run.trigger,
            &parent,
            &run.phase.as_str(),
            &run.created_at,
            &run.engine_pid,
            &overrides,
            &selection,
            &run.scheduled_time,
            &run.executor,
            &run.project,
        ],
        format!("create run {}", run.id),
    )
    .map(|_| ())
}

/// Claims a tick unless it is decided already; true when this call did.
fn insert_tick(c: &mut impl GenericClient, t: &TickRecord) -> Result<bool, StateError> {
    exec(
        c,
        "INSERT INTO schedule_ticks (id, pipeline, scheduled_time, outcome, run_id, reason, recorded_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
        &[&t.id, &t.pipeline, &t.scheduled_time, &t.outcome, &t.run_id, &t.reason, &now()],
        format!("claim tick {}", t.id),
    )
    .map(|n| n == 1)
}

fn tick_from_row(r: &Row) -> TickRecord {
    TickRecord {
        id: r.get(0),
        pipeline: r.get(1),
        scheduled_time: r.get(2),
        outcome: r.get(3),
        run_id: r.get(4),
        reason: r.get(5),
    }
}

/// One statement, its row count.
fn exec(
    c: &mut impl GenericClient,
    q: &str,
    args: &[&(dyn ToSql + Sync)],
    what: impl Into<String>,
) -> Result<u64, StateError> {
    c.execute(q, args).map_err(db(what))
}

/// The rows of one query, mapped.
fn rows<T>(
    c: &mut impl GenericClient,
    q: &str,
    args: &[&(dyn ToSql + Sync)],
    what: impl Into<String>,
    map: impl Fn(&Row) -> T,
) -> Result<Vec<T>, StateError> {
    Ok(c.query(q, args)
        .map_err(db(what))?
        .iter()
        .map(map)
        .collect())
}

/// The first row of one query, mapped.
fn row<T>(
    c: &mut impl GenericClient,
    q: &str,
    args: &[&(dyn ToSql + Sync)],
    what: impl Into<String>,
    map: impl Fn(&Row) -> T,
) -> Result<Option<T>, StateError> {
    Ok(c.query_opt(q, args).map_err(db(what))?.as_ref().map(map))
}

/// The writes [`StateStore::record_success`] makes, each also a method of its own.
fn write_stage(
    c: &mut impl GenericClient,
    run: &RunId,
    stage: &str,
    phase: Phase,
    exit_code: Option<i32>,
    reason: Option<&str>,
) -> Result<(), StateError> {
    let t = now();
    let started = (phase == Phase::Running).then_some(t.as_str());
    let finished = phase.is_terminal().then_some(t.as_str());
    exec(
        c,
        queries::pg::WRITE_STAGE,
        &[
            &run.0,
            &stage,
            &phase.as_str(),
            &started,
            &finished,
            &exit_code,
            &reason,
        ],
        format!("record stage {stage} of run {run}"),
    )
    .map(|_| ())
}

fn write_stage_results(
    c: &mut impl GenericClient,
    run: &RunId,
    stage: &str,
    outputs: &serde_json::Value,
    values: &serde_json::Value,
) -> Result<(), StateError> {
    let (outputs, values) = (outputs.to_string(), values.to_string());
    exec(
        c,
        queries::pg::WRITE_STAGE_RESULTS,
        &[&run.0, &stage, &outputs, &values],
        format!("record results of stage {stage} of run {run}"),
    )
    .map(|_| ())
}

fn write_attempt_end(
    c: &mut impl GenericClient,
    run: &RunId,
    stage: &str,
    attempt: u32,
    phase: Phase,
    exit_code: Option<i32>,
    reason: Option<&str>,
) -> Result<(), StateError> {
    exec(
        c,
        queries::pg::WRITE_ATTEMPT_END,
        &[
            &run.0,
            &stage,
            &i64::from(attempt),
            &phase.as_str(),
            &now(),
            &exit_code,
            &reason,
        ],
        format!("finish attempt {attempt} of {stage}"),
    )
    .map(|_| ())
}

fn write_artifacts(
    c: &mut impl GenericClient,
    artifacts: &[ArtifactRecord],
) -> Result<(), StateError> {
    for a in artifacts {
        exec(
            c,
            "INSERT INTO artifacts (digest, manifest, run_id, stage, output, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            &[
                &a.digest,
                &a.manifest,
                &a.run_id,
                &a.stage,
                &a.output,
                &a.created_at,
            ],
            format!("record artifact {}", a.digest),
        )?;
    }
    Ok(())
}

fn write_cache_entry(c: &mut impl GenericClient, e: &CacheEntry) -> Result<(), StateError> {
    let (outputs, values, components) = (
        e.outputs.to_string(),
        e.values.to_string(),
        e.components.to_string(),
    );
    exec(
        c,
        &format!(
            "INSERT INTO cache_entries ({CACHE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (key) DO UPDATE SET pipeline = $2, stage = $3, run_id = $4, \
               outputs = $5, vals = $6, components = $7, created_at = $8"
        ),
        &[
            &e.key,
            &e.pipeline,
            &e.stage,
            &e.run_id,
            &outputs,
            &values,
            &components,
            &e.created_at,
        ],
        format!("record cache entry of {}", e.stage),
    )
    .map(|_| ())
}

impl StateStore for PostgresState {
    /// One transaction, as the SQLite store's: a stage recorded as succeeded always has
    /// its attempt's end, artifacts, outputs and cache entry.
    fn record_success(&self, s: &Success<'_>) -> Result<(), StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(db("begin"))?;
            if let Some(attempt) = s.attempt {
                write_attempt_end(
                    &mut tx,
                    s.run,
                    s.stage,
                    attempt,
                    Phase::Succeeded,
                    s.exit_code,
                    None,
                )?;
            }
            write_artifacts(&mut tx, s.artifacts)?;
            write_stage_results(&mut tx, s.run, s.stage, s.outputs, s.values)?;
            if let Some(entry) = s.cache {
                write_cache_entry(&mut tx, entry)?;
            }
            write_stage(
                &mut tx,
                s.run,
                s.stage,
                Phase::Succeeded,
                s.exit_code,
                s.reason,
            )?;
            tx.commit().map_err(db("commit"))
        })
    }
}

impl RunStore for PostgresState {
    /// Engines of several machines (serve's replicas, a CLI elsewhere) share it.
    fn shared(&self) -> bool {
        true
    }

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
            exec(
                c,
                queries::pg::FINISH_RUN,
                &[&run.0, &phase.as_str(), &now(), &reason],
                format!("finish run {run}"),
            )
            .map(|_| ())
        })
    }

    fn reopen_run(&self, run: &RunId, pid: u32) -> Result<(), StateError> {
        self.with(|c| {
            let n = exec(
                c,
                queries::pg::REOPEN_RUN,
                &[&run.0, &i64::from(pid)],
                format!("reopen run {run}"),
            )?;
            if n == 0 {
                return Err(StateError::UnknownRun(run.0.clone()));
            }
            Ok(())
        })
    }

    fn run(&self, run: &RunId) -> Result<RunRecord, StateError> {
        self.with(|c| {
            row(
                c,
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"),
                &[&run.0],
                format!("read run {run}"),
                run_from_row,
            )?
            .ok_or_else(|| StateError::UnknownRun(run.0.clone()))
        })
    }

    fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError> {
        self.find_runs(&RunFilter::default(), limit)
    }

    fn find_runs(&self, filter: &RunFilter, limit: usize) -> Result<Vec<RunRecord>, StateError> {
        let (clause, args) = filter.sql(|n| format!("${n}"));
        let q = format!(
            "SELECT {RUN_COLUMNS} FROM runs{clause} ORDER BY created_at DESC, id DESC LIMIT {}",
            limit.min(i64::MAX as usize)
        );
        let args: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        self.with(|c| rows(c, &q, &args, "list runs", run_from_row))
    }

    fn running_runs(&self, pipeline: &str) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::RUNNING_RUNS,
                &[&pipeline],
                "read running runs",
                |r| RunId(r.get(0)),
            )
        })
    }

    fn heartbeat(&self, run: &RunId) -> Result<(), StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::HEARTBEAT,
                &[&run.0, &now()],
                format!("record the heartbeat of run {run}"),
            )
            .map(|_| ())
        })
    }

    fn ask_cancel(&self, run: &RunId) -> Result<bool, StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::ASK_CANCEL,
                &[&run.0, &now()],
                format!("record a cancel of run {run}"),
            )
            .map(|n| n > 0)
        })
    }

    fn cancel_asked(&self, run: &RunId) -> Result<bool, StateError> {
        self.with(|c| {
            row(
                c,
                queries::pg::CANCEL_ASKED,
                &[&run.0],
                format!("read whether run {run} is to be cancelled"),
                |r| r.get::<_, Option<String>>(0),
            )
            .map(|asked| asked.flatten().is_some())
        })
    }

    fn keep_source(&self, digest: &str, source: &str) -> Result<(), StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::KEEP_SOURCE,
                &[&digest, &source],
                format!("keep the pipeline {digest}"),
            )
            .map(|_| ())
        })
    }

    fn source(&self, digest: &str) -> Result<Option<String>, StateError> {
        self.with(|c| {
            row(
                c,
                queries::pg::SOURCE,
                &[&digest],
                format!("read the pipeline {digest}"),
                |r| r.get::<_, String>(0),
            )
        })
    }

    fn stale_runs(&self, before: &str) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::STALE_RUNS,
                &[&before],
                "read stale runs",
                |r| RunId(r.get(0)),
            )
        })
    }

    fn take_over(&self, run: &RunId, before: &str) -> Result<bool, StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::TAKE_OVER,
                &[&run.0, &before, &now()],
                format!("take over run {run}"),
            )
            .map(|n| n == 1)
        })
    }

    fn run_counts(&self) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            rows(c, queries::pg::RUN_COUNTS, &[], "count runs", |r| {
                (r.get::<_, String>(0), r.get::<_, i64>(1) as u64)
            })
            .map(|v| v.into_iter().collect())
        })
    }
}

impl StageStore for PostgresState {
    fn set_stage(
        &self,
        run: &RunId,
        stage: &str,
        phase: Phase,
        exit_code: Option<i32>,
        reason: Option<&str>,
    ) -> Result<(), StateError> {
        self.with(|c| write_stage(c, run, stage, phase, exit_code, reason))
    }

    fn set_stage_results(
        &self,
        run: &RunId,
        stage: &str,
        outputs: &serde_json::Value,
        values: &serde_json::Value,
    ) -> Result<(), StateError> {
        self.with(|c| write_stage_results(c, run, stage, outputs, values))
    }

    fn stages(&self, run: &RunId) -> Result<Vec<StageRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                &format!("SELECT {STAGE_COLUMNS} FROM stages WHERE run_id = $1 ORDER BY seq"),
                &[&run.0],
                "read stages",
                stage_from_row,
            )
        })
    }

    fn stage(&self, run: &RunId, stage: &str) -> Result<Option<StageRecord>, StateError> {
        self.with(|c| {
            row(
                c,
                &format!("SELECT {STAGE_COLUMNS} FROM stages WHERE run_id = $1 AND stage = $2"),
                &[&run.0, &stage],
                format!("read stage {stage} of run {run}"),
                stage_from_row,
            )
        })
    }

    fn stages_mentioning(&self, text: &str) -> Result<Vec<(RunId, String)>, StateError> {
        self.with(|c| {
            rows(
                c,
                "SELECT run_id, stage FROM stages WHERE strpos(provenance, $1) > 0 OR strpos(vals, $1) > 0 ORDER BY run_id, seq",
                &[&text],
                "search stages",
                |r| (RunId(r.get(0)), r.get(1)),
            )
        })
    }

    fn set_provenance(&self, run: &RunId, stage: &str, p: &Provenance) -> Result<(), StateError> {
        let what = format!("record provenance of {stage}");
        let (provenance, inputs) = (p.provenance.to_string(), p.inputs.to_string());
        self.with(|c| {
            let mut tx = c.transaction().map_err(db("begin"))?;
            exec(
                &mut tx,
                queries::pg::SET_PROVENANCE,
                &[
                    &run.0,
                    &stage,
                    &p.origin.name(),
                    &p.origin.run(),
                    &p.cache_key,
                    &provenance,
                    &inputs,
                ],
                what.clone(),
            )?;
            exec(
                &mut tx,
                queries::pg::CLEAR_ARTIFACT_USES,
                &[&run.0, &stage],
                what.clone(),
            )?;
            if p.origin == Origin::Ran {
                for (name, art) in p.inputs.as_object().into_iter().flatten() {
                    let Some(digest) = art.get("digest").and_then(|d| d.as_str()) else {
                        continue;
                    };
                    exec(
                        &mut tx,
                        "INSERT INTO artifact_uses (digest, run_id, stage, input) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                        &[&digest, &run.0, &stage, name],
                        what.clone(),
                    )?;
                }
            }
            tx.commit().map_err(db("commit"))
        })
    }
}

impl AttemptStore for PostgresState {
    fn start_attempt(&self, run: &RunId, stage: &str, attempt: u32) -> Result<(), StateError> {
        let t = now();
        let n = i64::from(attempt);
        self.with(|c| {
            let mut tx = c.transaction().map_err(db("begin"))?;
            // Again, for an attempt still running, when a restarted engine re-attaches to
            // it; never for one that ended.
            let changed = exec(
                &mut tx,
                queries::pg::START_ATTEMPT,
                &[&run.0, &stage, &n, &t],
                format!("record attempt {attempt} of {stage}"),
            )?;
            if changed == 0 {
                return Err(StateError::AttemptEnded {
                    stage: stage.to_owned(),
                    attempt,
                });
            }
            exec(
                &mut tx,
                queries::pg::START_STAGE,
                &[&run.0, &stage, &n, &t],
                format!("record stage {stage}"),
            )?;
            tx.commit().map_err(db("commit"))
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
            exec(
                c,
                queries::pg::SET_ATTEMPT_HANDLE,
                &[&run.0, &stage, &i64::from(attempt), &handle],
                format!("record handle of {stage}"),
            )
            .map(|_| ())
        })
    }

    fn set_attempt_waited(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        why: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::SET_ATTEMPT_WAITED,
                &[&run.0, &stage, &i64::from(attempt), &now(), &why],
                format!("record the wait of {stage}"),
            )
            .map(|_| ())
        })
    }

    fn set_item_usage(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        usage: &crate::executor::ResourceUsage,
    ) -> Result<(), StateError> {
        let text = serde_json::to_string(usage).unwrap_or_default();
        self.with(|c| {
            exec(
                c,
                queries::pg::SET_ITEM_USAGE,
                &[&run.0, &stage, &(idx as i64), &text],
                format!("record what item {idx} of {stage} used"),
            )
            .map(|_| ())
        })
    }

    fn set_attempt_usage(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        usage: &crate::executor::ResourceUsage,
    ) -> Result<(), StateError> {
        let text = serde_json::to_string(usage).unwrap_or_default();
        self.with(|c| {
            let mut tx = c.transaction().map_err(db("begin"))?;
            exec(
                &mut tx,
                queries::pg::SET_ATTEMPT_USAGE,
                &[&run.0, &stage, &i64::from(attempt), &text],
                format!("record what attempt {attempt} of {stage} used"),
            )?;
            exec(
                &mut tx,
                queries::pg::SET_STAGE_USAGE,
                &[&run.0, &stage, &text],
                format!("record what {stage} used"),
            )?;
            tx.commit().map_err(db("commit"))
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
        self.with(|c| write_attempt_end(c, run, stage, attempt, phase, exit_code, reason))
    }

    fn attempts(&self, run: &RunId) -> Result<Vec<AttemptRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                "SELECT stage, attempt, phase, started_at, finished_at, exit_code, reason, handle, \
                 waited_until, waited_for \
                 FROM attempts WHERE run_id = $1 ORDER BY seq",
                &[&run.0],
                "read attempts",
                |r| AttemptRecord {
                    stage: super::StageName(r.get(0)),
                    attempt: count(r.get(1)),
                    phase: phase_col(r.get(2)),
                    started_at: r.get(3),
                    finished_at: r.get(4),
                    exit_code: r.get(5),
                    reason: r.get(6),
                    handle: r.get(7),
                    waited_until: r.get(8),
                    waited_for: r.get(9),
                },
            )
        })
    }

    fn add_map_items(
        &self,
        run: &RunId,
        stage: &str,
        items: &[serde_json::Value],
    ) -> Result<(), StateError> {
        let idx: Vec<i64> = (0..items.len() as i64).collect();
        let texts: Vec<String> = items.iter().map(|i| i.to_string()).collect();
        self.with(|c| {
            let mut tx = c.transaction().map_err(db("begin"))?;
            exec(
                &mut tx,
                queries::pg::CLEAR_MAP_ITEMS,
                &[&run.0, &stage],
                format!("reset items of {stage}"),
            )?;
            // One statement for every item: arrays unnested server-side.
            exec(
                &mut tx,
                "INSERT INTO map_items (run_id, stage, idx, item, phase) \
                 SELECT $1, $2, i, t, 'Pending' FROM unnest($3::BIGINT[], $4::TEXT[]) AS u(i, t)",
                &[&run.0, &stage, &idx, &texts],
                format!("record items of {stage}"),
            )?;
            tx.commit().map_err(db("commit"))
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
            exec(
                c,
                queries::pg::START_ITEM,
                &[&run.0, &stage, &(idx as i64), &i64::from(attempt), &now()],
                format!("record item {idx} of {stage}"),
            )
            .map(|_| ())
        })
    }

    fn finish_item(
        &self,
        run: &RunId,
        stage: &str,
        idx: usize,
        end: ItemEnd<'_>,
    ) -> Result<(), StateError> {
        let (phase, reason, outputs) = (end.phase, end.reason, end.outputs);
        let values = (!end.values.is_null()).then(|| end.values.to_string());
        let outputs = outputs.to_string();
        self.with(|c| {
            exec(
                c,
                queries::pg::FINISH_ITEM,
                &[
                    &run.0,
                    &stage,
                    &(idx as i64),
                    &phase.as_str(),
                    &reason,
                    &outputs,
                    &now(),
                    &values,
                ],
                format!("finish item {idx} of {stage}"),
            )
            .map(|_| ())
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
            exec(
                c,
                queries::pg::SET_ITEM_HANDLE,
                &[&run.0, &stage, &(idx as i64), &handle],
                format!("record handle of item {idx} of {stage}"),
            )
            .map(|_| ())
        })
    }

    fn map_items(&self, run: &RunId, stage: &str) -> Result<Vec<ItemRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::MAP_ITEMS,
                &[&run.0, &stage],
                "read items",
                |r| ItemRecord {
                    index: r.get::<_, i64>(0) as usize,
                    item: json_col(r.get(1)),
                    phase: phase_col(r.get(2)),
                    attempts: count(r.get(3)),
                    reason: r.get(4),
                    outputs: json_col(r.get(5)),
                    handle: r.get(6),
                    usage: r
                        .get::<_, Option<String>>(7)
                        .and_then(|u| serde_json::from_str(&u).ok()),
                    started_at: r.get(8),
                    finished_at: r.get(9),
                    values: r
                        .get::<_, Option<String>>(10)
                        .map(json_col)
                        .unwrap_or_default(),
                },
            )
        })
    }

    fn item_counts(&self, run: &RunId, stage: &str) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::ITEM_COUNTS,
                &[&run.0, &stage],
                "count items",
                |r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64),
            )
            .map(|v| v.into_iter().collect())
        })
    }
}

impl ArtifactIndex for PostgresState {
    fn add_artifacts(&self, artifacts: &[ArtifactRecord]) -> Result<(), StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(db("begin"))?;
            write_artifacts(&mut tx, artifacts)?;
            tx.commit().map_err(db("commit"))
        })
    }

    fn artifact(&self, digest: &str) -> Result<Option<ArtifactRecord>, StateError> {
        self.with(|c| {
            row(
                c,
                queries::pg::ARTIFACT,
                &[&digest],
                format!("read artifact {digest}"),
                |r| ArtifactRecord {
                    digest: r.get(0),
                    manifest: r.get(1),
                    run_id: r.get(2),
                    stage: r.get(3),
                    output: r.get(4),
                    created_at: r.get(5),
                },
            )
        })
    }

    fn artifacts_starting(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StateError> {
        // Hex digits sort before `g`: every digest that starts with the prefix is below.
        let end = format!("{prefix}g");
        self.with(|c| {
            rows(
                c,
                queries::pg::ARTIFACTS_BETWEEN,
                &[&prefix, &end, &(limit as i64)],
                "find artifacts",
                |r| r.get::<_, String>(0),
            )
        })
    }

    fn artifact_uses(&self, digest: &str) -> Result<Vec<ArtifactUse>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::ARTIFACT_USES,
                &[&digest],
                "read artifact uses",
                |r| ArtifactUse {
                    digest: r.get(0),
                    run_id: r.get(1),
                    stage: r.get(2),
                    input: r.get(3),
                },
            )
        })
    }
}

impl CacheStore for PostgresState {
    fn put_cache_entry(&self, e: &CacheEntry) -> Result<(), StateError> {
        self.with(|c| write_cache_entry(c, e))
    }

    fn cache_entry(&self, key: &str) -> Result<Option<CacheEntry>, StateError> {
        self.with(|c| {
            row(
                c,
                &format!("SELECT {CACHE_COLUMNS} FROM cache_entries WHERE key = $1"),
                &[&key],
                "read cache entry",
                cache_from_row,
            )
        })
    }

    fn recent_cache_entries(
        &self,
        pipeline: &str,
        project: &str,
        stage: &str,
        except_key: &str,
        limit: usize,
    ) -> Result<Vec<CacheEntry>, StateError> {
        let limit = limit as i64;
        self.with(|c| {
            rows(
                c,
                &format!(
                    "SELECT {CACHE_COLUMNS} FROM cache_entries WHERE pipeline = $1 AND stage = $2 \
                     AND key != $3 AND run_id IN (SELECT id FROM runs WHERE project = $5) \
                     ORDER BY created_at DESC LIMIT $4"
                ),
                &[&pipeline, &stage, &except_key, &limit, &project],
                "read cache entries",
                cache_from_row,
            )
        })
    }

    fn cache_entries(&self) -> Result<Vec<CacheEntry>, StateError> {
        self.with(|c| {
            rows(
                c,
                &format!("SELECT {CACHE_COLUMNS} FROM cache_entries ORDER BY created_at"),
                &[],
                "read cache entries",
                cache_from_row,
            )
        })
    }

    fn expire_cache_entries(&self, before: &str) -> Result<usize, StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::EXPIRE_CACHE_ENTRIES,
                &[&before],
                "expire cache entries",
            )
            .map(|n| n as usize)
        })
    }
}

impl ScheduleStore for PostgresState {
    fn upsert_schedule(&self, pipeline: &str, file: &str, anchor: &str) -> Result<(), StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::UPSERT_SCHEDULE,
                &[&pipeline, &file, &anchor],
                format!("register schedule {pipeline}"),
            )
            .map(|_| ())
        })
    }

    fn schedule(&self, pipeline: &str) -> Result<Option<ScheduleEntry>, StateError> {
        self.with(|c| {
            row(
                c,
                queries::pg::SCHEDULE,
                &[&pipeline],
                "read schedule",
                schedule_from_row,
            )
        })
    }

    fn schedules(&self) -> Result<Vec<ScheduleEntry>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::SCHEDULES,
                &[],
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
            let n = exec(
                c,
                queries::pg::SET_SUSPENDED,
                &[&pipeline, &suspended, &anchor],
                format!("suspend schedule {pipeline}"),
            )?;
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
            rows(
                c,
                &format!("SELECT pipeline, file, suspended, anchor, ({LAST_TICK}) FROM schedules s ORDER BY pipeline"),
                &[],
                "read schedules",
                |r| (schedule_from_row(r), r.get(4)),
            )
        })
    }

    fn unstarted_ticks_since(&self, since: &str) -> Result<Vec<TickRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                &format!("{UNSTARTED_SINCE} $1 ORDER BY t.scheduled_time"),
                &[&since],
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
            let mut tx = c.transaction().map_err(db("begin"))?;
            let mut out = Vec::with_capacity(ticks.len());
            for (tick, run) in ticks {
                // A failed statement aborts the whole transaction but for a savepoint.
                let mut one = tx.savepoint("tick").map_err(db("savepoint"))?;
                let claimed = insert_tick(&mut one, tick).and_then(|claimed| match run {
                    Some(run) if claimed => insert_run(&mut one, run).map(|()| true),
                    _ => Ok(claimed),
                });
                if claimed.is_ok() {
                    one.commit().map_err(db("release savepoint"))?;
                } else {
                    one.rollback().map_err(db("roll back to savepoint"))?;
                }
                out.push(claimed);
            }
            tx.commit().map_err(db("commit"))?;
            Ok(out)
        })
    }

    fn ticks(&self, pipeline: &str, limit: usize) -> Result<Vec<TickRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::TICKS,
                &[&pipeline, &(limit as i64)],
                "read ticks",
                tick_from_row,
            )
        })
    }
}

fn schedule_from_row(r: &Row) -> ScheduleEntry {
    ScheduleEntry {
        pipeline: r.get(0),
        file: r.get(1),
        suspended: r.get(2),
        anchor: r.get(3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::conformance;
    use crate::testing::Postgres;

    /// Against a real PostgreSQL (initdb + pg_ctl on a loopback port).
    #[test]
    fn postgres_passes_the_conformance_suite() {
        let pg = Postgres::start();
        let store = PostgresState::open(&pg.url()).unwrap();
        conformance::check(&store);
        // Reopening finds the schema migrated and the data there.
        let again = PostgresState::open(&pg.url()).unwrap();
        assert!(!again.list_runs(10).unwrap().is_empty());
        conformance::exclusive_claims(&|| Box::new(PostgresState::open(&pg.url()).unwrap()));
        conformance::exclusive_gpus(&|| Box::new(PostgresState::open(&pg.url()).unwrap()));
        conformance::exclusive_batches(&|| Box::new(PostgresState::open(&pg.url()).unwrap()));
    }

    /// Every column (table, name, type, nullable, default) and index (its definition) of
    /// the database at `url`.
    fn describe(url: &str) -> std::collections::BTreeSet<String> {
        let mut c = Client::connect(url, NoTls).unwrap();
        let columns = c
            .query(
                "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text, \
                 coalesce(column_default::text, '') FROM information_schema.columns \
                 WHERE table_schema = 'public'",
                &[],
            )
            .unwrap();
        let indexes = c
            .query(
                "SELECT indexdef::text FROM pg_indexes WHERE schemaname = 'public'",
                &[],
            )
            .unwrap();
        columns
            .iter()
            .map(|r| {
                let f = |i| r.get::<_, String>(i);
                format!(
                    "{}.{}: {} nullable={} default={}",
                    f(0),
                    f(1),
                    f(2),
                    f(3),
                    f(4)
                )
            })
            .chain(indexes.iter().map(|r| r.get::<_, String>(0)))
            .collect()
    }

    /// A database made before the shared schema, at any version of PostgreSQL's own
    /// history, opens to exactly the tables, columns and indexes of a new one.
    #[test]
    fn a_database_of_the_old_history_opens_to_the_shared_schema() {
        let pg = Postgres::start();
        let base = pg.url();
        let url = |db: &str| format!("{}/{db}", base.strip_suffix("/postgres").unwrap());
        let mut admin = Client::connect(&base, NoTls).unwrap();
        PostgresState::open(&url("postgres")).unwrap();
        let new = describe(&base);
        assert!(
            new.iter().any(|l| l.starts_with("runs.heartbeat_at: text")),
            "{new:#?}"
        );
        for version in [1, 3, HISTORY.len()] {
            let db = format!("v{version}");
            admin
                .batch_execute(&format!("CREATE DATABASE {db}"))
                .unwrap();
            let mut old = Client::connect(&url(&db), NoTls).unwrap();
            for m in &HISTORY[..version] {
                old.batch_execute(m).unwrap();
            }
            old.batch_execute(&format!(
                "CREATE TABLE drivetrain_schema (version BIGINT NOT NULL); \
                 INSERT INTO drivetrain_schema (version) VALUES ({version})"
            ))
            .unwrap();
            drop(old);
            PostgresState::open(&url(&db)).unwrap();
            let got = describe(&url(&db));
            let missing: Vec<_> = new.difference(&got).collect();
            let extra: Vec<_> = got.difference(&new).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "from version {version}: missing {missing:#?}, extra {extra:#?}"
            );
        }
    }

    /// Inside a tokio runtime (where the engine calls it) the blocking client still works.
    #[tokio::test]
    async fn works_inside_a_runtime() {
        let pg = Postgres::start();
        let store = PostgresState::open(&pg.url()).unwrap();
        store.create_run(&conformance::run_record("rt")).unwrap();
        assert_eq!(store.list_runs(5).unwrap().len(), 1);
    }

    #[test]
    fn a_bad_url_is_a_clear_error() {
        let err = PostgresState::open("postgres://nobody@127.0.0.1:1/x").unwrap_err();
        assert!(err.to_string().contains("connect"), "{err}");
    }
}
