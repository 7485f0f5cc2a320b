//! The SQLite store's triggers and outbox ([`TriggerStore`], [`OutboxStore`]).

use std::collections::BTreeMap;

use rusqlite::{params, Connection, TransactionBehavior};

use super::super::events::{
    InboxObject, OutboxItem, OutboxStore, RunTrigger, TriggerRecord, TriggerStore, Waiting,
};
use super::rows::{insert_run, run_from_row, RUN_COLUMNS};
use super::{now, queries, query, sql, ExecuteCached, RunId, RunRecord, SqliteState, StateError};

fn object_from_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<InboxObject> {
    Ok(InboxObject {
        url: r.get(at)?,
        etag: r.get(at + 1)?,
        size: r.get(at + 2)?,
        modified: r.get(at + 3)?,
        group: r.get(at + 4)?,
        discovered_at: r.get(at + 5)?,
        payload: r.get(at + 6)?,
    })
}

fn outbox_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<OutboxItem> {
    Ok(OutboxItem {
        id: r.get(0)?,
        pipeline: r.get(1)?,
        run_id: r.get(2)?,
        event: r.get(3)?,
        sink: super::rows::json_col(r.get(4)?),
        body: super::rows::json_col(r.get(5)?),
        state: r.get(6)?,
        attempts: r.get(7)?,
        next_at: r.get(8)?,
        last_error: r.get(9)?,
        created_at: r.get(10)?,
        delivered_at: r.get(11)?,
    })
}

/// A write transaction that takes the lock at once: two processes that read and then
/// write in deferred transactions can each hold the read and wait for the other.
fn immediate(c: &Connection) -> Result<rusqlite::Transaction<'_>, StateError> {
    rusqlite::Transaction::new_unchecked(c, TransactionBehavior::Immediate).map_err(sql("begin"))
}

/// Puts notifications in the outbox (those there already, by id, stay as they are).
fn enqueue(tx: &Connection, items: &[OutboxItem]) -> Result<(), StateError> {
    for i in items {
        tx.execute_cached(
            queries::sqlite::ENQUEUE_NOTIFICATION,
            params![
                i.id,
                i.pipeline,
                i.run_id,
                i.event,
                i.sink.to_string(),
                i.body.to_string(),
                i.next_at
            ],
        )
        .map_err(sql("enqueue a notification"))?;
    }
    Ok(())
}

impl TriggerStore for SqliteState {
    fn ensure_trigger(
        &self,
        pipeline: &str,
        trigger: &str,
        file: &str,
        paused: bool,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::ENSURE_TRIGGER,
                params![pipeline, trigger, paused, file],
            )
            .map(|_| ())
            .map_err(sql(format!("register trigger {pipeline}/{trigger}")))
        })
    }

    fn add_objects(
        &self,
        pipeline: &str,
        trigger: &str,
        objects: &[InboxObject],
        cursor: Option<&str>,
        rescanned: bool,
    ) -> Result<usize, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let mut new = 0;
            for o in objects {
                new += tx
                    .execute_cached(
                        queries::sqlite::ADD_OBJECT,
                        params![
                            pipeline,
                            trigger,
                            o.url,
                            o.etag,
                            o.size,
                            o.modified,
                            o.group,
                            o.discovered_at,
                            o.payload
                        ],
                    )
                    .map_err(sql("record a discovered object"))?;
            }
            if let Some(cursor) = cursor {
                tx.execute_cached(
                    queries::sqlite::MOVE_CURSOR,
                    params![pipeline, trigger, cursor],
                )
                .map_err(sql("move the cursor"))?;
            }
            if rescanned {
                tx.execute_cached(
                    queries::sqlite::NOTE_RESCAN,
                    params![pipeline, trigger, now()],
                )
                .map_err(sql("note a rescan"))?;
            }
            tx.commit().map_err(sql("commit"))?;
            Ok(new)
        })
    }

    fn waiting(&self, pipeline: &str, trigger: &str) -> Result<Vec<Waiting>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::WAITING,
                params![pipeline, trigger],
                "read the inbox",
                |r| {
                    Ok(Waiting {
                        group: r.get(0)?,
                        count: r.get::<_, i64>(1)? as u64,
                        oldest: r.get(2)?,
                    })
                },
            )
        })
    }

    fn claim_batch(
        &self,
        pipeline: &str,
        trigger: &str,
        group: &str,
        min: usize,
        max: usize,
        run: &(dyn Fn(&[InboxObject]) -> RunRecord + Sync),
    ) -> Result<Vec<InboxObject>, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let objects: Vec<InboxObject> = query(
                &tx,
                queries::sqlite::CLAIMABLE,
                params![pipeline, trigger, group, max as i64],
                "read waiting objects",
                |r| object_from_row(r, 0),
            )?;
            if objects.is_empty() || objects.len() < min {
                return Ok(Vec::new());
            }
            let run = run(&objects);
            insert_run(&tx, &run)?;
            for o in &objects {
                let n = tx
                    .execute_cached(
                        queries::sqlite::CONSUME_OBJECT,
                        params![pipeline, trigger, o.url, o.etag, run.id.0],
                    )
                    .map_err(sql("consume an object"))?;
                if n != 1 {
                    // Read as waiting in this very transaction: cannot happen.
                    return Err(StateError::UnknownRun(format!("inbox object {}", o.url)));
                }
            }
            tx.commit().map_err(sql("commit"))?;
            Ok(objects)
        })
    }

    fn run_trigger(&self, run: &RunId) -> Result<Option<RunTrigger>, StateError> {
        self.with(|c| {
            let rows: Vec<(String, InboxObject)> = query(
                c,
                queries::sqlite::RUN_TRIGGER,
                params![run.0],
                "read a run's objects",
                |r| Ok((r.get(0)?, object_from_row(r, 1)?)),
            )?;
            Ok(rows
                .first()
                .map(|(t, _)| t.clone())
                .map(|trigger| RunTrigger {
                    trigger,
                    objects: rows.into_iter().map(|(_, o)| o).collect(),
                }))
        })
    }

    fn object_runs(&self, url: &str) -> Result<Vec<(RunId, String)>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::OBJECT_RUNS,
                params![url],
                "read an object's runs",
                |r| Ok((RunId(r.get(0)?), r.get(1)?)),
            )
        })
    }

    fn trigger_state(
        &self,
        pipeline: &str,
        trigger: &str,
    ) -> Result<Option<(bool, Option<String>)>, StateError> {
        self.with(|c| {
            let found: Vec<(bool, Option<String>)> = query(
                c,
                queries::sqlite::TRIGGER_STATE,
                params![pipeline, trigger],
                "read a trigger",
                |r| Ok((r.get::<_, i64>(0)? != 0, r.get(1)?)),
            )?;
            Ok(found.into_iter().next())
        })
    }

    fn triggers(&self) -> Result<Vec<TriggerRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::TRIGGERS,
                params![],
                "read triggers",
                |r| {
                    Ok(TriggerRecord {
                        pipeline: r.get(0)?,
                        trigger: r.get(1)?,
                        cursor: r.get(2)?,
                        paused: r.get::<_, i64>(3)? != 0,
                        paused_at: r.get(4)?,
                        rescanned_at: r.get(5)?,
                        evaluated_at: r.get(6)?,
                        last_reason: r.get(7)?,
                        waiting: r.get::<_, i64>(8)? as u64,
                        oldest_waiting: r.get(9)?,
                        consumed: r.get::<_, i64>(10)? as u64,
                        skipped: r.get::<_, i64>(11)? as u64,
                        file: r.get(12)?,
                    })
                },
            )
        })
    }

    fn set_trigger_paused(
        &self,
        pipeline: &str,
        trigger: &str,
        paused: bool,
        skip: bool,
    ) -> Result<u64, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let at = paused.then(now);
            let n = tx
                .execute_cached(
                    queries::sqlite::SET_TRIGGER_PAUSED,
                    params![pipeline, trigger, paused, at],
                )
                .map_err(sql("pause a trigger"))?;
            if n == 0 {
                return Err(StateError::UnknownRun(format!(
                    "trigger {pipeline}/{trigger}"
                )));
            }
            let skipped = match skip {
                true => tx
                    .execute_cached(queries::sqlite::SKIP_WAITING, params![pipeline, trigger])
                    .map_err(sql("skip waiting objects"))?,
                false => 0,
            };
            tx.commit().map_err(sql("commit"))?;
            Ok(skipped as u64)
        })
    }

    fn note_evaluation(
        &self,
        pipeline: &str,
        trigger: &str,
        reason: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::NOTE_EVALUATION,
                params![pipeline, trigger, now(), reason],
            )
            .map(|_| ())
            .map_err(sql("note an evaluation"))
        })
    }
}

impl OutboxStore for SqliteState {
    fn unnotified_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE notified IS NULL OR (notified IN \
                     ('Running', 'Pending') AND phase NOT IN ('Running', 'Pending')) LIMIT ?1"
                ),
                params![limit as i64],
                "read runs to notify of",
                run_from_row,
            )
        })
    }

    fn enqueue_notifications(
        &self,
        run: &RunId,
        phase: &str,
        items: &[OutboxItem],
    ) -> Result<(), StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            enqueue(&tx, items)?;
            tx.execute_cached(queries::sqlite::MARK_NOTIFIED, params![run.0, phase])
                .map_err(sql("note a run notified"))?;
            tx.commit().map_err(sql("commit"))
        })
    }

    fn add_notifications(&self, items: &[OutboxItem]) -> Result<(), StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            enqueue(&tx, items)?;
            tx.commit().map_err(sql("commit"))
        })
    }

    fn due_notifications(&self, now: &str, limit: usize) -> Result<Vec<OutboxItem>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::DUE_NOTIFICATIONS,
                params![now, limit as i64],
                "read due notifications",
                outbox_from_row,
            )
        })
    }

    fn notification_outcome(
        &self,
        id: &str,
        error: Option<&str>,
        retry_at: Option<&str>,
    ) -> Result<(), StateError> {
        self.with(|c| {
            let done = match (error, retry_at) {
                (None, _) => {
                    c.execute_cached(queries::sqlite::NOTIFICATION_SENT, params![id, now()])
                }
                (Some(e), Some(at)) => {
                    c.execute_cached(queries::sqlite::NOTIFICATION_RETRY, params![id, e, at])
                }
                (Some(e), None) => {
                    c.execute_cached(queries::sqlite::NOTIFICATION_DEAD, params![id, e])
                }
            };
            done.map(|_| ()).map_err(sql("record a delivery"))
        })
    }

    fn notifications(
        &self,
        state: Option<&str>,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::NOTIFICATIONS,
                params![state.unwrap_or(""), limit as i64],
                "read notifications",
                outbox_from_row,
            )
        })
    }

    fn notification_counts(&self) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::NOTIFICATION_COUNTS,
                params![],
                "count notifications",
                |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)),
            )
        })
    }
}
