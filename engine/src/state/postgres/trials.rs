//! The PostgreSQL store's trials and metrics ([`TrialStore`]).

use super::super::trials::{MetricRow, TrialColumns, TrialRecord, TrialStore};
use super::{exec, now, queries, rows, PostgresState, RunId, StateError};
use crate::search::rungs::Trial;

impl TrialStore for PostgresState {
    fn put_trial(
        &self,
        run: &RunId,
        stage: &str,
        t: &Trial,
        (outputs, values): (&serde_json::Value, &serde_json::Value),
    ) -> Result<(), StateError> {
        let params = serde_json::Value::Object(t.params.clone()).to_string();
        let metrics = serde_json::to_string(&t.metrics).unwrap_or_else(|_| "[]".into());
        let (outputs, values) = (outputs.to_string(), values.to_string());
        let (idx, rung, used) = (t.index as i64, t.rung as i64, t.used as i64);
        let attempts = i64::from(t.attempts);
        self.with(|c| {
            exec(
                c,
                queries::pg::PUT_TRIAL,
                &[
                    &run.0,
                    &stage,
                    &idx,
                    &t.id,
                    &params,
                    &t.state.as_str(),
                    &rung,
                    &metrics,
                    &used,
                    &attempts,
                    &t.reason,
                    &outputs,
                    &now(),
                    &values,
                ],
                format!("record trial {} of {stage}", t.id),
            )
            .map(|_| ())
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
            exec(
                c,
                queries::pg::SET_TRIAL_HANDLE,
                &[&run.0, &stage, &(index as i64), &handle],
                format!("record handle of trial {index} of {stage}"),
            )
            .map(|_| ())
        })
    }

    fn trials(&self, run: &RunId, stage: &str) -> Result<Vec<TrialRecord>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::TRIALS,
                &[&run.0, &stage],
                "read trials",
                |r| {
                    TrialColumns {
                        idx: r.get(0),
                        id: r.get(1),
                        params: r.get(2),
                        state: r.get(3),
                        rung: r.get(4),
                        metrics: r.get(5),
                        used: r.get(6),
                        attempts: r.get(7),
                        reason: r.get(8),
                        outputs: r.get(9),
                        started_at: r.get(10),
                        updated_at: r.get(11),
                        handle: r.get(12),
                        values: r.get(13),
                    }
                    .record()
                },
            )
        })
    }

    fn add_metrics(&self, run: &RunId, stage: &str, rows: &[MetricRow]) -> Result<(), StateError> {
        if rows.is_empty() {
            return Ok(());
        }
        let idx: Vec<i64> = rows.iter().map(|m| m.trial as i64).collect();
        let step: Vec<Option<i64>> = rows.iter().map(|m| m.step).collect();
        let name: Vec<&str> = rows.iter().map(|m| m.name.as_str()).collect();
        let value: Vec<f64> = rows.iter().map(|m| m.value).collect();
        let at: Vec<&str> = rows.iter().map(|m| m.at.as_str()).collect();
        self.with(|c| {
            // One statement for every row: arrays unnested server-side.
            exec(
                c,
                "INSERT INTO trial_metrics (run_id, stage, idx, step, name, value, at) \
                 SELECT $1, $2, i, s, n, v, a FROM unnest($3::BIGINT[], $4::BIGINT[], \
                 $5::TEXT[], $6::DOUBLE PRECISION[], $7::TEXT[]) AS u(i, s, n, v, a)",
                &[&run.0, &stage, &idx, &step, &name, &value, &at],
                format!("record metrics of {stage}"),
            )
            .map(|_| ())
        })
    }

    fn metrics(&self, run: &RunId, stage: &str) -> Result<Vec<MetricRow>, StateError> {
        let q = format!("{} ORDER BY seq", queries::pg::METRICS);
        self.with(|c| {
            rows(c, &q, &[&run.0, &stage], "read metrics", |r| MetricRow {
                trial: r.get::<_, i64>(0).max(0) as usize,
                step: r.get(1),
                name: r.get(2),
                value: r.get(3),
                at: r.get(4),
            })
        })
    }
}
