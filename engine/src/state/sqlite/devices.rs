//! The SQLite store's ledger of GPUs ([`DeviceStore`]): a claim is one `BEGIN IMMEDIATE`
//! transaction, so engines of the home claim one after another.

use rusqlite::{params, Connection, TransactionBehavior};

use super::super::devices::{pick, Claimed, DeviceStore, GpuAsk, GpuClaim};
use super::{now, queries, sql, ExecuteCached, RunId, SqliteState, StateError};

fn claims(c: &Connection) -> Result<Vec<GpuClaim>, StateError> {
    let mut st = c
        .prepare_cached(queries::sqlite::GPU_CLAIMS)
        .map_err(sql("read the GPU ledger"))?;
    let rows = st
        .query_map([], |r| {
            Ok(GpuClaim {
                host: r.get(0)?,
                device: r.get(1)?,
                run: RunId(r.get(2)?),
                holder: r.get(3)?,
                claimed_at: r.get(4)?,
            })
        })
        .map_err(sql("read the GPU ledger"))?;
    rows.collect::<Result<_, _>>()
        .map_err(sql("read the GPU ledger"))
}

impl DeviceStore for SqliteState {
    fn claim_gpus(&self, ask: &GpuAsk<'_>) -> Result<Claimed, StateError> {
        self.with(|c| {
            let tx = rusqlite::Transaction::new_unchecked(c, TransactionBehavior::Immediate)
                .map_err(sql("begin"))?;
            tx.execute_cached(
                queries::sqlite::FREE_DEAD_GPUS,
                params![ask.run.0, ask.stale_before],
            )
            .map_err(sql("free dead GPU claims"))?;
            let taken = claims(&tx)?;
            let Some(devices) = pick(ask, &taken) else {
                tx.commit().map_err(sql("commit"))?;
                return Ok(Claimed::Busy(
                    taken.into_iter().filter(|c| c.host == ask.host).collect(),
                ));
            };
            let at = now();
            for d in &devices {
                tx.execute_cached(
                    queries::sqlite::CLAIM_GPU,
                    params![ask.host, d, ask.run.0, ask.holder, at],
                )
                .map_err(sql(format!("claim GPU {d}")))?;
            }
            tx.commit().map_err(sql("commit a GPU claim"))?;
            Ok(Claimed::Granted(devices))
        })
    }

    fn release_gpus(&self, run: &RunId, holder: Option<&str>) -> Result<(), StateError> {
        self.with(|c| {
            match holder {
                Some(h) => c.execute_cached(queries::sqlite::RELEASE_GPUS, params![run.0, h]),
                None => c.execute_cached(queries::sqlite::RELEASE_RUN_GPUS, params![run.0]),
            }
            .map(|_| ())
            .map_err(sql(format!("release the GPUs of run {run}")))
        })
    }

    fn gpu_claims(&self) -> Result<Vec<GpuClaim>, StateError> {
        self.with(claims)
    }
}
