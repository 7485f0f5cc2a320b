//! The embedded SQLite state store: one WAL-mode file with versioned migrations.

use super::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use super::{
    now, ArtifactRecord, ArtifactUse, AttemptRecord, CacheEntry, ItemEnd, ItemRecord, Origin,
    Phase, Provenance, RunFilter, RunId, RunRecord, ScheduleEntry, StageRecord, StateError,
    StateStore, Success, TickRecord,
};

fn sql(what: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> StateError {
    let what = what.into();
    move |source| StateError::Sqlite { what, source }
}

mod access;
mod devices;
mod events;
mod migrations;
mod rows;
mod trials;
use super::queries;
use super::schema::Dialect;
use migrations::HISTORY;
use rows::*;
pub use rows::{LAST_TICK, UNSTARTED_SINCE};

/// Whether SQLite failed for want of space (`SQLITE_FULL`, or an I/O error writing).
fn disk_full(e: &StateError) -> bool {
    matches!(e, StateError::Sqlite {
        source: rusqlite::Error::SqliteFailure(f, _), ..
    } if matches!(f.code, rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::SystemIoFailure))
}

/// The embedded SQLite state store.
#[derive(Debug)]
pub struct SqliteState {
    conn: Mutex<Connection>,
    /// The space the engine keeps free beside the database (`reserve`, made by the
    /// commands that run pipelines): given up, and the write tried once more, when the
    /// disk is full, so the outcome being recorded is kept.
    reserve: Option<std::path::PathBuf>,
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
        let mut state = Self::init(conn)?;
        state.reserve = Some(path.with_file_name("reserve"));
        Ok(state)
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
        if current(&conn)? < Dialect::Sqlite.version() {
            conn.execute_batch("BEGIN IMMEDIATE")
                .map_err(sql("lock for migration"))?;
            let version = current(&conn)?;
            let mut batch = String::new();
            for (to, m) in Dialect::Sqlite.steps(version, HISTORY) {
                batch.push_str(&format!("{m};\nPRAGMA user_version = {to};\n"));
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
            reserve: None,
        })
    }

    fn with<T>(&self, f: impl Fn(&Connection) -> Result<T, StateError>) -> Result<T, StateError> {
        // A poisoned lock means a panic mid-statement; SQLite rolled the statement back.
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        match f(&conn) {
            Err(e) if disk_full(&e) => match &self.reserve {
                Some(reserve) if std::fs::remove_file(reserve).is_ok() => {
                    eprintln!(
                        "warning: the state store's disk is full: gave up the reserve beside it to record this"
                    );
                    f(&conn)
                }
                _ => Err(e),
            },
            done => done,
        }
    }
}

impl StateStore for SqliteState {
    fn record_success(&self, s: &Success<'_>) -> Result<(), StateError> {
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            if let Some(attempt) = s.attempt {
                write_attempt_end(
                    &tx,
                    s.run,
                    s.stage,
                    attempt,
                    Phase::Succeeded,
                    s.exit_code,
                    None,
                )?;
            }
            write_artifacts(&tx, s.artifacts)?;
            write_stage_results(&tx, s.run, s.stage, s.outputs, s.values)?;
            if let Some(entry) = s.cache {
                write_cache_entry(&tx, entry)?;
            }
            write_stage(&tx, s.run, s.stage, Phase::Succeeded, s.exit_code, s.reason)?;
            tx.commit().map_err(sql("commit"))
        })
    }
}

impl RunStore for SqliteState {
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
                queries::sqlite::FINISH_RUN,
                params![run.0, phase.as_str(), now(), reason],
            )
            .map(|_| ())
            .map_err(sql(format!("finish run {run}")))
        })
    }

    fn reopen_run(&self, run: &RunId, pid: u32) -> Result<(), StateError> {
        self.with(|c| {
            let n = c
                .execute_cached(queries::sqlite::REOPEN_RUN, params![run.0, pid])
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
        self.find_runs(&RunFilter::default(), limit)
    }

    fn find_runs(&self, filter: &RunFilter, limit: usize) -> Result<Vec<RunRecord>, StateError> {
        let (clause, args) = filter.sql(|n| format!("?{n}"));
        let q = format!(
            "SELECT {RUN_COLUMNS} FROM runs{clause} ORDER BY created_at DESC, id DESC LIMIT {}",
            limit.min(i64::MAX as usize)
        );
        self.with(|c| {
            query(
                c,
                &q,
                rusqlite::params_from_iter(args.iter()),
                "list runs",
                run_from_row,
            )
        })
    }

    fn run_counts(&self) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::RUN_COUNTS,
                params![],
                "count runs",
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)),
            )
            .map(|rows: Vec<(String, u64)>| rows.into_iter().collect())
        })
    }

    fn heartbeat(&self, run: &RunId) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::HEARTBEAT, params![run.0, now()])
                .map(|_| ())
                .map_err(sql(format!("record the heartbeat of run {run}")))
        })
    }

    fn ask_cancel(&self, run: &RunId) -> Result<bool, StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::ASK_CANCEL, params![run.0, now()])
                .map(|n| n > 0)
                .map_err(sql(format!("record a cancel of run {run}")))
        })
    }

    fn cancel_asked(&self, run: &RunId) -> Result<bool, StateError> {
        self.with(|c| {
            c.prepare_cached(queries::sqlite::CANCEL_ASKED)
                .and_then(|mut s| {
                    s.query_row(params![run.0], |r| r.get::<_, Option<String>>(0))
                        .optional()
                })
                .map(|asked| asked.flatten().is_some())
                .map_err(sql(format!("read whether run {run} is to be cancelled")))
        })
    }

    fn keep_source(&self, digest: &str, source: &str) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::KEEP_SOURCE, params![digest, source])
                .map(|_| ())
                .map_err(sql(format!("keep the pipeline {digest}")))
        })
    }

    fn source(&self, digest: &str) -> Result<Option<String>, StateError> {
        self.with(|c| {
            c.prepare_cached(queries::sqlite::SOURCE)
                .and_then(|mut s| s.query_row(params![digest], |r| r.get(0)).optional())
                .map_err(sql(format!("read the pipeline {digest}")))
        })
    }

    fn stale_runs(&self, before: &str) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::STALE_RUNS,
                params![before],
                "read stale runs",
                |r| Ok(RunId(r.get(0)?)),
            )
        })
    }

    fn take_over(&self, run: &RunId, before: &str) -> Result<bool, StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::TAKE_OVER, params![run.0, before, now()])
                .map(|n| n == 1)
                .map_err(sql(format!("take over run {run}")))
        })
    }

    fn running_runs(&self, pipeline: &str) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::RUNNING_RUNS,
                params![pipeline],
                "read running runs",
                |r| Ok(RunId(r.get(0)?)),
            )
        })
    }
}

impl StageStore for SqliteState {
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
                "SELECT run_id, stage FROM stages WHERE instr(provenance, ?1) > 0 OR instr(vals, ?1) > 0 ORDER BY run_id, rowid",
                params![text],
                "search stages",
                |r| Ok((RunId(r.get(0)?), r.get(1)?)),
            )
        })
    }

    fn set_provenance(&self, run: &RunId, stage: &str, p: &Provenance) -> Result<(), StateError> {
        let what = format!("record provenance of {stage}");
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            tx.execute_cached(
                queries::sqlite::SET_PROVENANCE,
                params![
                    run.0,
                    stage,
                    p.origin.name(),
                    p.origin.run(),
                    p.cache_key,
                    p.provenance.to_string(),
                    p.inputs.to_string()
                ],
            )
            .map_err(sql(what.clone()))?;
            tx.execute_cached(queries::sqlite::CLEAR_ARTIFACT_USES, params![run.0, stage])
                .map_err(sql(what.clone()))?;
            if p.origin == Origin::Ran {
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
}

impl AttemptStore for SqliteState {
    fn start_attempt(&self, run: &RunId, stage: &str, attempt: u32) -> Result<(), StateError> {
        let t = now();
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            // Again, for an attempt still running, when a restarted engine re-attaches to
            // it; never for one that ended.
            let changed = tx
                .execute_cached(
                    queries::sqlite::START_ATTEMPT,
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
                queries::sqlite::START_STAGE,
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
                queries::sqlite::SET_ATTEMPT_HANDLE,
                params![run.0, stage, attempt, handle],
            )
            .map(|_| ())
            .map_err(sql(format!("record handle of {stage}")))
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
            c.execute_cached(
                queries::sqlite::SET_ATTEMPT_WAITED,
                params![run.0, stage, attempt, now(), why],
            )
            .map(|_| ())
            .map_err(sql(format!("record the wait of {stage}")))
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

    fn set_attempt_usage(
        &self,
        run: &RunId,
        stage: &str,
        attempt: u32,
        usage: &crate::executor::ResourceUsage,
    ) -> Result<(), StateError> {
        let text = serde_json::to_string(usage).unwrap_or_default();
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            tx.execute_cached(
                queries::sqlite::SET_ATTEMPT_USAGE,
                params![run.0, stage, attempt, text],
            )
            .map_err(sql(format!(
                "record what attempt {attempt} of {stage} used"
            )))?;
            tx.execute_cached(
                queries::sqlite::SET_STAGE_USAGE,
                params![run.0, stage, text],
            )
            .map_err(sql(format!("record what {stage} used")))?;
            tx.commit().map_err(sql("commit"))
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
            c.execute_cached(
                queries::sqlite::SET_ITEM_USAGE,
                params![run.0, stage, idx as i64, text],
            )
            .map(|_| ())
            .map_err(sql(format!("record what item {idx} of {stage} used")))
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
            tx.execute_cached(queries::sqlite::CLEAR_MAP_ITEMS, params![run.0, stage])
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
                queries::sqlite::START_ITEM,
                params![run.0, stage, idx as i64, attempt, now()],
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
        end: ItemEnd<'_>,
    ) -> Result<(), StateError> {
        let (phase, reason, outputs) = (end.phase, end.reason, end.outputs);
        let values = (!end.values.is_null()).then(|| end.values.to_string());
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::FINISH_ITEM,
                params![
                    run.0,
                    stage,
                    idx as i64,
                    phase.as_str(),
                    reason,
                    outputs.to_string(),
                    now(),
                    values
                ],
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
                queries::sqlite::SET_ITEM_HANDLE,
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
                queries::sqlite::MAP_ITEMS,
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
                        usage: r
                            .get::<_, Option<String>>(7)?
                            .and_then(|u| serde_json::from_str(&u).ok()),
                        started_at: r.get(8)?,
                        finished_at: r.get(9)?,
                        values: r
                            .get::<_, Option<String>>(10)?
                            .map(json_col)
                            .unwrap_or_default(),
                    })
                },
            )
        })
    }

    fn item_counts(&self, run: &RunId, stage: &str) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::ITEM_COUNTS,
                params![run.0, stage],
                "count items",
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)),
            )
        })
    }

    fn attempts(&self, run: &RunId) -> Result<Vec<AttemptRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT stage, attempt, phase, started_at, finished_at, exit_code, reason, handle, \
                 waited_until, waited_for \
                 FROM attempts WHERE run_id = ?1 ORDER BY rowid",
                params![run.0],
                "read attempts",
                |r| {
                    Ok(AttemptRecord {
                        stage: super::StageName(r.get(0)?),
                        attempt: r.get(1)?,
                        phase: phase_col(r.get(2)?),
                        started_at: r.get(3)?,
                        finished_at: r.get(4)?,
                        exit_code: r.get(5)?,
                        reason: r.get(6)?,
                        handle: r.get(7)?,
                        waited_until: r.get(8)?,
                        waited_for: r.get(9)?,
                    })
                },
            )
        })
    }
}

impl ArtifactIndex for SqliteState {
    fn add_artifacts(&self, artifacts: &[ArtifactRecord]) -> Result<(), StateError> {
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            write_artifacts(&tx, artifacts)?;
            tx.commit().map_err(sql("commit"))
        })
    }

    fn artifact(&self, digest: &str) -> Result<Option<ArtifactRecord>, StateError> {
        self.with(|c| {
            c.query_row(queries::sqlite::ARTIFACT, params![digest], |r| {
                Ok(ArtifactRecord {
                    digest: r.get(0)?,
                    manifest: r.get(1)?,
                    run_id: r.get(2)?,
                    stage: r.get(3)?,
                    output: r.get(4)?,
                    created_at: r.get(5)?,
                })
            })
            .optional()
            .map_err(sql(format!("read artifact {digest}")))
        })
    }

    fn artifacts_starting(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StateError> {
        // Hex digits sort before `g`: every digest that starts with the prefix is below.
        let end = format!("{prefix}g");
        self.with(|c| {
            query(
                c,
                queries::sqlite::ARTIFACTS_BETWEEN,
                params![prefix, end, limit as i64],
                "find artifacts",
                |r| r.get(0),
            )
        })
    }

    fn artifact_uses(&self, digest: &str) -> Result<Vec<ArtifactUse>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::ARTIFACT_USES,
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
}

impl CacheStore for SqliteState {
    fn put_cache_entry(&self, e: &CacheEntry) -> Result<(), StateError> {
        self.with(|c| write_cache_entry(c, e))
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
        project: &str,
        stage: &str,
        except_key: &str,
        limit: usize,
    ) -> Result<Vec<CacheEntry>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!(
                    "SELECT {CACHE_COLUMNS} FROM cache_entries WHERE pipeline = ?1 AND stage = ?2 \
                     AND key != ?3 AND run_id IN (SELECT id FROM runs WHERE project = ?5) \
                     ORDER BY created_at DESC LIMIT ?4"
                ),
                params![pipeline, stage, except_key, limit as i64, project],
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
            c.execute_cached(queries::sqlite::EXPIRE_CACHE_ENTRIES, params![before])
                .map_err(sql("expire cache entries"))
        })
    }
}

impl ScheduleStore for SqliteState {
    fn upsert_schedule(&self, pipeline: &str, file: &str, anchor: &str) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::UPSERT_SCHEDULE,
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
                queries::sqlite::SCHEDULE,
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
                queries::sqlite::SCHEDULES,
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
                    queries::sqlite::SET_SUSPENDED,
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
                queries::sqlite::TICKS,
                params![pipeline, limit as i64],
                "read ticks",
                tick_from_row,
            )
        })
    }
}
#[cfg(test)]
mod tests;
