//! Rows to records and records to rows: the column lists and the mapping of each table.

use rusqlite::{params, Connection};

use super::super::queries;
use super::{
    now, sql, ArtifactRecord, CacheEntry, ExecuteCached, Origin, Phase, Provenance, RunId,
    RunRecord, ScheduleEntry, StageRecord, StateError, TickRecord,
};

pub(super) fn json_col(s: String) -> serde_json::Value {
    serde_json::from_str(&s).unwrap_or(serde_json::Value::Null)
}

pub(super) fn phase_col(s: String) -> Phase {
    Phase::parse(&s).unwrap_or(Phase::Error)
}

pub(super) fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
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
        project: r.get(16)?,
    })
}

pub(super) fn tick_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TickRecord> {
    Ok(TickRecord {
        id: r.get(0)?,
        pipeline: r.get(1)?,
        scheduled_time: r.get(2)?,
        outcome: r.get(3)?,
        run_id: r.get(4)?,
        reason: r.get(5)?,
    })
}

pub(super) fn schedule_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScheduleEntry> {
    Ok(ScheduleEntry {
        pipeline: r.get(0)?,
        file: r.get(1)?,
        suspended: r.get::<_, i64>(2)? != 0,
        anchor: r.get(3)?,
    })
}

pub(super) const RUN_COLUMNS: &str =
    "id, pipeline, file, spec_digest, params, trigger, parent, phase, \
     created_at, finished_at, reason, engine_pid, overrides, selection, scheduled_time, executor, \
     project";

pub(super) fn cache_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CacheEntry> {
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

pub(super) const STAGE_COLUMNS: &str =
    "stage, phase, attempts, started_at, finished_at, exit_code, reason, \
     outputs, vals, origin, origin_run, cache_key, provenance, inputs, usage";

pub(super) fn stage_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StageRecord> {
    Ok(StageRecord {
        stage: crate::names::StageName(r.get(0)?),
        phase: phase_col(r.get(1)?),
        attempts: r.get(2)?,
        started_at: r.get(3)?,
        finished_at: r.get(4)?,
        exit_code: r.get(5)?,
        reason: r.get(6)?,
        outputs: json_col(r.get(7)?),
        values: json_col(r.get(8)?),
        how: Provenance {
            origin: Origin::from_columns(&r.get::<_, String>(9)?, r.get(10)?),
            cache_key: r.get(11)?,
            provenance: json_col(r.get(12)?),
            inputs: json_col(r.get(13)?),
        },
        usage: r
            .get::<_, Option<String>>(14)?
            .and_then(|u| serde_json::from_str(&u).ok()),
    })
}

/// Inserts a run's record.
pub(super) fn insert_run(c: &Connection, run: &RunRecord) -> Result<(), StateError> {
    c.execute_cached(
        queries::sqlite::INSERT_RUN,
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
            run.project,
        ],
    )
    .map(|_| ())
    .map_err(sql(format!("create run {}", run.id)))
}

/// Claims a tick unless it is decided already; true when this call did.
pub(super) fn insert_tick(c: &Connection, t: &TickRecord) -> Result<bool, StateError> {
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

pub(super) const CACHE_COLUMNS: &str =
    "key, pipeline, stage, run_id, outputs, vals, components, created_at";

/// The writes the run loop makes for every stage, on a connection or inside a
/// transaction: the store's methods run them alone, `record_success` together.
pub(super) fn write_stage(
    c: &Connection,
    run: &RunId,
    stage: &str,
    phase: Phase,
    exit_code: Option<i32>,
    reason: Option<&str>,
) -> Result<(), StateError> {
    let t = now();
    let started = (phase == Phase::Running).then_some(t.as_str());
    let finished = phase.is_terminal().then_some(t.as_str());
    c.execute_cached(
        queries::sqlite::WRITE_STAGE,
        params![
            run.0,
            stage,
            phase.as_str(),
            started,
            finished,
            exit_code,
            reason
        ],
    )
    .map(|_| ())
    .map_err(sql(format!("record stage {stage} of run {run}")))
}

pub(super) fn write_stage_results(
    c: &Connection,
    run: &RunId,
    stage: &str,
    outputs: &serde_json::Value,
    values: &serde_json::Value,
) -> Result<(), StateError> {
    c.execute_cached(
        queries::sqlite::WRITE_STAGE_RESULTS,
        params![run.0, stage, outputs.to_string(), values.to_string()],
    )
    .map(|_| ())
    .map_err(sql(format!("record results of stage {stage} of run {run}")))
}

pub(super) fn write_attempt_end(
    c: &Connection,
    run: &RunId,
    stage: &str,
    attempt: u32,
    phase: Phase,
    exit_code: Option<i32>,
    reason: Option<&str>,
) -> Result<(), StateError> {
    c.execute_cached(
        queries::sqlite::WRITE_ATTEMPT_END,
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
}

pub(super) fn write_artifacts(
    c: &Connection,
    artifacts: &[ArtifactRecord],
) -> Result<(), StateError> {
    for a in artifacts {
        c.execute_cached(
            "INSERT OR IGNORE INTO artifacts (digest, manifest, run_id, stage, output, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![a.digest, a.manifest, a.run_id, a.stage, a.output, a.created_at],
        )
        .map_err(sql(format!("record artifact {}", a.digest)))?;
    }
    Ok(())
}

pub(super) fn write_cache_entry(c: &Connection, e: &CacheEntry) -> Result<(), StateError> {
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
}
