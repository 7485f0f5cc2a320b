//! The PostgreSQL store's ledger of GPUs ([`DeviceStore`]): a claim locks the ledger's
//! tables for its transaction, so replicas on other machines claim one after another.

use postgres::GenericClient;

use super::super::devices::{
    claim_in, CapacityClaim, Claimed, DeviceStore, GpuAsk, GpuClaim, GpuWait, LedgerTx,
};
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
            priority: r.get(5),
            preemptible: r.get(6),
            preempted_by: r.get(7),
            queue: r.get(8),
            project: r.get(9),
        },
    )
}

fn waits(c: &mut impl GenericClient) -> Result<Vec<GpuWait>, StateError> {
    rows(c, queries::pg::GPU_WAITS, &[], "read the GPU queue", |r| {
        GpuWait {
            host: r.get(0),
            run: RunId(r.get(1)),
            holder: r.get(2),
            queue: r.get(3),
            priority: r.get(4),
            count: r.get::<_, i64>(5).max(0) as usize,
            since: r.get(6),
            project: r.get(7),
            cpu_millis: r.get::<_, i64>(8).max(0) as u64,
            memory_bytes: r.get::<_, i64>(9).max(0) as u64,
        }
    })
}

fn capacity(c: &mut impl GenericClient) -> Result<Vec<CapacityClaim>, StateError> {
    rows(
        c,
        queries::pg::CAPACITY_CLAIMS,
        &[],
        "read the CPU and memory held",
        |r| CapacityClaim {
            host: r.get(0),
            run: RunId(r.get(1)),
            holder: r.get(2),
            cpu_millis: r.get::<_, i64>(3).max(0) as u64,
            memory_bytes: r.get::<_, i64>(4).max(0) as u64,
            claimed_at: r.get(5),
        },
    )
}

impl LedgerTx for postgres::Transaction<'_> {
    fn free_dead(&mut self, ask: &GpuAsk<'_>) -> Result<(), StateError> {
        exec(
            self,
            queries::pg::FREE_DEAD_GPUS,
            &[&ask.run.0, &ask.stale_before],
            "free dead GPU claims",
        )?;
        exec(
            self,
            queries::pg::FREE_DEAD_GPU_WAITS,
            &[&ask.run.0, &ask.stale_before, &ask.waits_stale_before],
            "free dead GPU waits",
        )?;
        exec(
            self,
            queries::pg::FREE_DEAD_CAPACITY,
            &[&ask.run.0, &ask.stale_before],
            "free dead CPU and memory claims",
        )?;
        Ok(())
    }

    fn claims(&mut self) -> Result<Vec<GpuClaim>, StateError> {
        claims(self)
    }

    fn waits(&mut self) -> Result<Vec<GpuWait>, StateError> {
        waits(self)
    }

    fn upsert_wait(&mut self, ask: &GpuAsk<'_>, at: &str) -> Result<(), StateError> {
        let count = ask.count as i64;
        exec(
            self,
            queries::pg::WAIT_FOR_GPUS,
            &[
                &ask.host,
                &ask.run.0,
                &ask.holder,
                &ask.queue,
                &ask.priority,
                &count,
                &at,
                &ask.project,
                &(ask.cpu_millis as i64),
                &(ask.memory_bytes as i64),
            ],
            "wait for GPUs",
        )
        .map(|_| ())
    }

    fn drop_wait(&mut self, run: &RunId, holder: &str) -> Result<(), StateError> {
        exec(
            self,
            queries::pg::STOP_WAITING,
            &[&run.0, &holder],
            "stop waiting for GPUs",
        )
        .map(|_| ())
    }

    fn insert_claim(&mut self, ask: &GpuAsk<'_>, device: &str, at: &str) -> Result<(), StateError> {
        exec(
            self,
            queries::pg::CLAIM_GPU,
            &[
                &ask.host,
                &device,
                &ask.run.0,
                &ask.holder,
                &at,
                &ask.priority,
                &ask.preemptible,
                &ask.queue,
                &ask.project,
            ],
            format!("claim GPU {device}"),
        )
        .map(|_| ())
    }

    fn weights(&mut self) -> Result<Vec<(String, i64)>, StateError> {
        rows(
            self,
            queries::pg::PROJECT_WEIGHTS,
            &[],
            "read the projects' weights",
            |r| (r.get(0), r.get(1)),
        )
    }

    fn capacity_claims(&mut self) -> Result<Vec<CapacityClaim>, StateError> {
        capacity(self)
    }

    fn insert_capacity(&mut self, ask: &GpuAsk<'_>, at: &str) -> Result<(), StateError> {
        exec(
            self,
            queries::pg::CLAIM_CAPACITY,
            &[
                &ask.host,
                &ask.run.0,
                &ask.holder,
                &(ask.cpu_millis as i64),
                &(ask.memory_bytes as i64),
                &at,
            ],
            "claim CPU and memory",
        )
        .map(|_| ())
    }

    fn unmark(&mut self, run: &RunId, holder: &str) -> Result<(), StateError> {
        exec(
            self,
            queries::pg::UNMARK_PREEMPTED_BY,
            &[&run.0, &holder],
            "unmark preempted GPU claims",
        )
        .map(|_| ())
    }

    fn mark_preempted(
        &mut self,
        victim: &GpuClaim,
        ask: &GpuAsk<'_>,
        by: &str,
    ) -> Result<(), StateError> {
        exec(
            self,
            queries::pg::PREEMPT_GPUS,
            &[&victim.run.0, &victim.holder, &by, &ask.run.0, &ask.holder],
            "preempt a GPU claim",
        )
        .map(|_| ())
    }
}

impl DeviceStore for PostgresState {
    fn claim_gpus(&self, ask: &GpuAsk<'_>) -> Result<Claimed, StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            tx.batch_execute(
                "LOCK TABLE gpu_claims, gpu_waits, capacity_claims IN SHARE ROW EXCLUSIVE MODE",
            )
            .map_err(super::db("lock the GPU ledger"))?;
            let claimed = claim_in(&mut tx, ask)?;
            tx.commit().map_err(super::db("commit a GPU claim"))?;
            Ok(claimed)
        })
    }

    fn release_gpus(&self, run: &RunId, holder: Option<&str>) -> Result<(), StateError> {
        let what = format!("release the GPUs of run {run}");
        self.with(|c| {
            match holder {
                Some(h) => {
                    exec(c, queries::pg::RELEASE_GPUS, &[&run.0, &h], what.clone())?;
                    exec(c, queries::pg::RELEASE_CAPACITY, &[&run.0, &h], what)
                }
                None => {
                    exec(c, queries::pg::RELEASE_RUN_GPUS, &[&run.0], what.clone())?;
                    exec(c, queries::pg::STOP_RUN_WAITING, &[&run.0], what.clone())?;
                    exec(
                        c,
                        queries::pg::RELEASE_RUN_CAPACITY,
                        &[&run.0],
                        what.clone(),
                    )?;
                    exec(c, queries::pg::UNMARK_PREEMPTED_BY_RUN, &[&run.0], what)
                }
            }
            .map(|_| ())
        })
    }

    fn give_up_gpus(&self, run: &RunId, holder: &str) -> Result<(), StateError> {
        let what = format!("stop waiting for GPUs ({holder} of run {run})");
        self.with(|c| {
            exec(
                c,
                queries::pg::STOP_WAITING,
                &[&run.0, &holder],
                what.clone(),
            )?;
            exec(
                c,
                queries::pg::UNMARK_PREEMPTED_BY,
                &[&run.0, &holder],
                what,
            )
            .map(|_| ())
        })
    }

    fn gpu_claims(&self) -> Result<Vec<GpuClaim>, StateError> {
        self.with(claims)
    }

    fn capacity_claims(&self) -> Result<Vec<CapacityClaim>, StateError> {
        self.with(capacity)
    }

    fn gpu_waits(&self) -> Result<Vec<GpuWait>, StateError> {
        self.with(waits)
    }

    fn set_priority_class(&self, name: &str, value: Option<i64>) -> Result<(), StateError> {
        let what = format!("set priority class {name}");
        self.with(|c| {
            match value {
                Some(v) => exec(
                    c,
                    queries::pg::SET_PRIORITY_CLASS,
                    &[&name, &v, &now()],
                    what.clone(),
                ),
                None => exec(c, queries::pg::DROP_PRIORITY_CLASS, &[&name], what.clone()),
            }
            .map(|_| ())
        })
    }

    fn priority_classes(&self) -> Result<Vec<(String, i64)>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::PRIORITY_CLASSES,
                &[],
                "read the priority classes",
                |r| (r.get(0), r.get(1)),
            )
        })
    }

    fn gpu_preempted(&self, run: &RunId, holder: &str) -> Result<Option<String>, StateError> {
        self.with(|c| {
            let found = rows(
                c,
                queries::pg::GPU_PREEMPTED,
                &[&run.0, &holder],
                "read a GPU claim",
                |r| r.get::<_, String>(0),
            )?;
            Ok(found.into_iter().next())
        })
    }
}
