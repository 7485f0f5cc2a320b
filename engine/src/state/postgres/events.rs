//! The PostgreSQL store's triggers and outbox ([`TriggerStore`], [`OutboxStore`]): the
//! SQLite store's statements, and `FOR UPDATE SKIP LOCKED` where replicas claim objects.

use std::collections::BTreeMap;

use postgres::Row;

use super::super::events::{
    InboxObject, OutboxItem, OutboxStore, RunTrigger, TriggerRecord, TriggerStore, Waiting,
};
use super::{
    exec, insert_run, json_col, now, queries, rows, run_from_row, PostgresState, RunId, RunRecord,
    StateError, RUN_COLUMNS,
};

fn object_from_row(r: &Row, at: usize) -> InboxObject {
    InboxObject {
        url: r.get(at),
        etag: r.get(at + 1),
        size: r.get(at + 2),
        modified: r.get(at + 3),
        group: r.get(at + 4),
        discovered_at: r.get(at + 5),
        payload: r.get(at + 6),
    }
}

fn outbox_from_row(r: &Row) -> OutboxItem {
    OutboxItem {
        id: r.get(0),
        pipeline: r.get(1),
        run_id: r.get(2),
        event: r.get(3),
        sink: json_col(r.get(4)),
        body: json_col(r.get(5)),
        state: r.get(6),
        attempts: u32::try_from(r.get::<_, i64>(7)).unwrap_or(0),
        next_at: r.get(8),
        last_error: r.get(9),
        created_at: r.get(10),
        delivered_at: r.get(11),
    }
}

fn count(r: &Row, i: usize) -> u64 {
    u64::try_from(r.get::<_, i64>(i)).unwrap_or(0)
}

/// Puts notifications in the outbox (those there already, by id, stay as they are).
fn enqueue(tx: &mut postgres::Transaction<'_>, items: &[OutboxItem]) -> Result<(), StateError> {
    for i in items {
        exec(
            tx,
            queries::pg::ENQUEUE_NOTIFICATION,
            &[
                &i.id,
                &i.pipeline,
                &i.run_id,
                &i.event,
                &i.sink.to_string(),
                &i.body.to_string(),
                &i.next_at,
            ],
            "enqueue a notification",
        )?;
    }
    Ok(())
}

impl TriggerStore for PostgresState {
    fn ensure_trigger(
        &self,
        pipeline: &str,
        trigger: &str,
        file: &str,
        paused: bool,
    ) -> Result<(), StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::ENSURE_TRIGGER,
                &[&pipeline, &trigger, &paused, &file],
                "register a trigger",
            )
            .map(|_| ())
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
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            let mut new = 0;
            for o in objects {
                new += exec(
                    &mut tx,
                    queries::pg::ADD_OBJECT,
                    &[
                        &pipeline,
                        &trigger,
                        &o.url,
                        &o.etag,
                        &o.size,
                        &o.modified,
                        &o.group,
                        &o.discovered_at,
                        &o.payload,
                    ],
                    "record a discovered object",
                )? as usize;
            }
            if let Some(cursor) = cursor {
                exec(
                    &mut tx,
                    queries::pg::MOVE_CURSOR,
                    &[&pipeline, &trigger, &cursor],
                    "move the cursor",
                )?;
            }
            if rescanned {
                exec(
                    &mut tx,
                    queries::pg::NOTE_RESCAN,
                    &[&pipeline, &trigger, &now()],
                    "note a rescan",
                )?;
            }
            tx.commit().map_err(super::db("commit"))?;
            Ok(new)
        })
    }

    fn waiting(&self, pipeline: &str, trigger: &str) -> Result<Vec<Waiting>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::WAITING,
                &[&pipeline, &trigger],
                "read the inbox",
                |r| Waiting {
                    group: r.get(0),
                    count: count(r, 1),
                    oldest: r.get(2),
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
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            // Rows another replica is claiming are passed over, not waited for: each
            // object goes to one run.
            let objects = rows(
                &mut tx,
                &format!("{} FOR UPDATE SKIP LOCKED", queries::pg::CLAIMABLE),
                &[&pipeline, &trigger, &group, &(max as i64)],
                "read waiting objects",
                |r| object_from_row(r, 0),
            )?;
            if objects.is_empty() || objects.len() < min {
                return Ok(Vec::new());
            }
            let run = run(&objects);
            insert_run(&mut tx, &run)?;
            for o in &objects {
                let n = exec(
                    &mut tx,
                    queries::pg::CONSUME_OBJECT,
                    &[&pipeline, &trigger, &o.url, &o.etag, &run.id.0],
                    "consume an object",
                )?;
                if n != 1 {
                    return Err(StateError::UnknownRun(format!("inbox object {}", o.url)));
                }
            }
            tx.commit().map_err(super::db("commit"))?;
            Ok(objects)
        })
    }

    fn run_trigger(&self, run: &RunId) -> Result<Option<RunTrigger>, StateError> {
        self.with(|c| {
            let found = rows(
                c,
                queries::pg::RUN_TRIGGER,
                &[&run.0],
                "read a run's objects",
                |r| (r.get::<_, String>(0), object_from_row(r, 1)),
            )?;
            Ok(found
                .first()
                .map(|(t, _)| t.clone())
                .map(|trigger| RunTrigger {
                    trigger,
                    objects: found.into_iter().map(|(_, o)| o).collect(),
                }))
        })
    }

    fn object_runs(&self, url: &str) -> Result<Vec<(RunId, String)>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::OBJECT_RUNS,
                &[&url],
                "read an object's runs",
                |r| (RunId(r.get(0)), r.get(1)),
            )
        })
    }

    fn trigger_state(
        &self,
        pipeline: &str,
        trigger: &str,
    ) -> Result<Option<(bool, Option<String>)>, StateError> {
        self.with(|c| {
            super::row(
                c,
                queries::pg::TRIGGER_STATE,
                &[&pipeline, &trigger],
                "read a trigger",
                |r| (r.get::<_, bool>(0), r.get::<_, Option<String>>(1)),
            )
        })
    }

    fn triggers(&self) -> Result<Vec<TriggerRecord>, StateError> {
        self.with(|c| {
            rows(c, queries::pg::TRIGGERS, &[], "read triggers", |r| {
                TriggerRecord {
                    pipeline: r.get(0),
                    trigger: r.get(1),
                    cursor: r.get(2),
                    paused: r.get(3),
                    paused_at: r.get(4),
                    rescanned_at: r.get(5),
                    evaluated_at: r.get(6),
                    last_reason: r.get(7),
                    waiting: count(r, 8),
                    oldest_waiting: r.get(9),
                    consumed: count(r, 10),
                    skipped: count(r, 11),
                    file: r.get(12),
                }
            })
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
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            let at = paused.then(now);
            let n = exec(
                &mut tx,
                queries::pg::SET_TRIGGER_PAUSED,
                &[&pipeline, &trigger, &paused, &at],
                "pause a trigger",
            )?;
            if n == 0 {
                return Err(StateError::UnknownRun(format!(
                    "trigger {pipeline}/{trigger}"
                )));
            }
            let skipped = match skip {
                true => exec(
                    &mut tx,
                    queries::pg::SKIP_WAITING,
                    &[&pipeline, &trigger],
                    "skip waiting objects",
                )?,
                false => 0,
            };
            tx.commit().map_err(super::db("commit"))?;
            Ok(skipped)
        })
    }

    fn note_evaluation(
        &self,
        pipeline: &str,
        trigger: &str,
        reason: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::NOTE_EVALUATION,
                &[&pipeline, &trigger, &now(), &reason],
                "note an evaluation",
            )
            .map(|_| ())
        })
    }
}

impl OutboxStore for PostgresState {
    fn unnotified_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE notified IS NULL OR (notified IN \
                     ('Running', 'Pending') AND phase NOT IN ('Running', 'Pending')) LIMIT $1"
                ),
                &[&(limit as i64)],
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
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            enqueue(&mut tx, items)?;
            exec(
                &mut tx,
                queries::pg::MARK_NOTIFIED,
                &[&run.0, &phase],
                "note a run notified",
            )?;
            tx.commit().map_err(super::db("commit"))
        })
    }

    fn add_notifications(&self, items: &[OutboxItem]) -> Result<(), StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            enqueue(&mut tx, items)?;
            tx.commit().map_err(super::db("commit"))
        })
    }

    fn due_notifications(&self, now: &str, limit: usize) -> Result<Vec<OutboxItem>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::DUE_NOTIFICATIONS,
                &[&now, &(limit as i64)],
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
            let what = "record a delivery";
            match (error, retry_at) {
                (None, _) => exec(c, queries::pg::NOTIFICATION_SENT, &[&id, &now()], what),
                (Some(e), Some(at)) => {
                    exec(c, queries::pg::NOTIFICATION_RETRY, &[&id, &e, &at], what)
                }
                (Some(e), None) => exec(c, queries::pg::NOTIFICATION_DEAD, &[&id, &e], what),
            }
            .map(|_| ())
        })
    }

    fn notifications(
        &self,
        state: Option<&str>,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::NOTIFICATIONS,
                &[&state.unwrap_or(""), &(limit as i64)],
                "read notifications",
                outbox_from_row,
            )
        })
    }

    fn notification_counts(&self) -> Result<BTreeMap<String, u64>, StateError> {
        self.with(|c| {
            Ok(rows(
                c,
                queries::pg::NOTIFICATION_COUNTS,
                &[],
                "count notifications",
                |r| (r.get::<_, String>(0), count(r, 1)),
            )?
            .into_iter()
            .collect())
        })
    }
}
