//! The PostgreSQL store's ledger of GPUs ([`DeviceStore`]): a claim locks the ledger's
//! table for its transaction, so replicas on other machines claim one after another.

use postgres::GenericClient;

use super::super::devices::{pick, Claimed, DeviceStore, GpuAsk, GpuClaim};
use super::{exec, now, queries, rows, PostgresState, RunId, StateError};

fn claims(c: &mut impl GenericClient) -> Result<Vec<GpuClaim>, StateError> {
    rows(
        c,
        queries::pg::GPU_CLAIMS,
        &[],
        "read the GPU ledger",
        |r| GpuClaim {
            host: r.get(0),
            device: r.get(1),
            run: RunId(r.get(2)),
            holder: r.get(3),
            claimed_at: r.get(4),
        },
    )
}

impl DeviceStore for PostgresState {
    fn claim_gpus(&self, ask: &GpuAsk<'_>) -> Result<Claimed, StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            tx.batch_execute("LOCK TABLE gpu_claims IN SHARE ROW EXCLUSIVE MODE")
                .map_err(super::db("lock the GPU ledger"))?;
            exec(
                &mut tx,
                queries::pg::FREE_DEAD_GPUS,
                &[&ask.run.0, &ask.stale_before],
                "free dead GPU claims",
            )?;
            let taken = claims(&mut tx)?;
            let Some(devices) = pick(ask, &taken) else {
                tx.commit().map_err(super::db("commit"))?;
                return Ok(Claimed::Busy(
                    taken.into_iter().filter(|c| c.host == ask.host).collect(),
                ));
            };
            let at = now();
            for d in &devices {
                exec(
                    &mut tx,
                    queries::pg::CLAIM_GPU,
                    &[&ask.host, d, &ask.run.0, &ask.holder, &at],
                    format!("claim GPU {d}"),
                )?;
            }
            tx.commit().map_err(super::db("commit a GPU claim"))?;
            Ok(Claimed::Granted(devices))
        })
    }

    fn release_gpus(&self, run: &RunId, holder: Option<&str>) -> Result<(), StateError> {
        self.with(|c| {
            match holder {
                Some(h) => exec(
                    c,
                    queries::pg::RELEASE_GPUS,
                    &[&run.0, &h],
                    format!("release the GPUs of run {run}"),
                ),
                None => exec(
                    c,
                    queries::pg::RELEASE_RUN_GPUS,
                    &[&run.0],
                    format!("release the GPUs of run {run}"),
                ),
            }
            .map(|_| ())
        })
    }

    fn gpu_claims(&self) -> Result<Vec<GpuClaim>, StateError> {
        self.with(claims)
    }
}
