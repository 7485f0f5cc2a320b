//! The SQLite store's trials and metrics ([`TrialStore`]).

use rusqlite::params;

use super::super::trials::{MetricRow, TrialColumns, TrialRecord, TrialStore};
use super::{now, queries, sql, ExecuteCached, RunId, SqliteState, StateError};
use crate::search::rungs::Trial;

impl TrialStore for SqliteState {
    fn put_trial(
        &self,
        run: &RunId,
        stage: &str,
        t: &Trial,
        (outputs, values): (&serde_json::Value, &serde_json::Value),
    ) -> Result<(), StateError> {
        let params = serde_json::Value::Object(t.params.clone()).to_string();
        let metrics = serde_json::to_string(&t.metrics).unwrap_or_else(|_| "[]".into());
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::PUT_TRIAL,
                params![
                    run.0,
                    stage,
                    t.index as i64,
                    t.id,
                    params,
                    t.state.as_str(),
                    t.rung as i64,
                    metrics,
                    t.used as i64,
                    i64::from(t.attempts),
                    t.reason,
                    outputs.to_string(),
                    now(),
                    values.to_string()
                ],
            )
            .map(|_| ())
            .map_err(sql(format!("record trial {} of {stage}", t.id)))
        })
    }

    fn set_trial_handle(
        &self,
        run: &RunId,
        stage: &str,
        index: usize,
        handle: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::SET_TRIAL_HANDLE,
                params![run.0, stage, index as i64, handle],
            )
            .map(|_| ())
            .map_err(sql(format!("record handle of trial {index} of {stage}")))
        })
    }

    fn trials(&self, run: &RunId, stage: &str) -> Result<Vec<TrialRecord>, StateError> {
        self.with(|c| {
            let mut st = c
                .prepare_cached(queries::sqlite::TRIALS)
                .map_err(sql("read trials"))?;
            let rows = st
                .query_map(params![run.0, stage], |r| {
                    Ok(TrialColumns {
                        idx: r.get(0)?,
                        id: r.get(1)?,
                        params: r.get(2)?,
                        state: r.get(3)?,
                        rung: r.get(4)?,
                        metrics: r.get(5)?,
                        used: r.get(6)?,
                        attempts: r.get(7)?,
                        reason: r.get(8)?,
                        outputs: r.get(9)?,
                        started_at: r.get(10)?,
                        updated_at: r.get(11)?,
                        handle: r.get(12)?,
                        values: r.get(13)?,
                    }
                    .record())
                })
                .map_err(sql("read trials"))?;
            rows.collect::<Result<_, _>>().map_err(sql("read trials"))
        })
    }

    fn add_metrics(&self, run: &RunId, stage: &str, rows: &[MetricRow]) -> Result<(), StateError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let tx = c.unchecked_transaction().map_err(sql("begin"))?;
            {
                let mut st = tx
                    .prepare_cached(
                        "INSERT INTO trial_metrics (run_id, stage, idx, step, name, value, at) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )
                    .map_err(sql("record metrics"))?;
                for m in rows {
                    st.execute(params![
                        run.0,
                        stage,
                        m.trial as i64,
                        m.step,
                        m.name,
                        m.value,
                        m.at
                    ])
                    .map_err(sql(format!("record metrics of {stage}")))?;
                }
            }
            tx.commit().map_err(sql("commit"))
        })
    }

    fn metrics(&self, run: &RunId, stage: &str) -> Result<Vec<MetricRow>, StateError> {
        self.with(|c| {
            let q = format!("{} ORDER BY rowid", queries::sqlite::METRICS);
            let mut st = c.prepare_cached(&q).map_err(sql("read metrics"))?;
            let rows = st
                .query_map(params![run.0, stage], |r| {
                    Ok(MetricRow {
                        trial: r.get::<_, i64>(0)?.max(0) as usize,
                        step: r.get(1)?,
                        name: r.get(2)?,
                        value: r.get(3)?,
                        at: r.get(4)?,
                    })
                })
                .map_err(sql("read metrics"))?;
            rows.collect::<Result<_, _>>().map_err(sql("read metrics"))
        })
    }
}
