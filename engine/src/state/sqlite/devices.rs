//! The SQLite store's ledger of GPUs ([`DeviceStore`]): a claim is one `BEGIN IMMEDIATE`
//! transaction, so engines of the home claim one after another.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::super::devices::{
    claim_in, CapacityClaim, Claimed, DeviceStore, GpuAsk, GpuClaim, GpuWait, LedgerTx,
};
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
                priority: r.get(5)?,
                preemptible: r.get(6)?,
                preempted_by: r.get(7)?,
                queue: r.get(8)?,
                project: r.get(9)?,
            })
        })
        .map_err(sql("read the GPU ledger"))?;
    rows.collect::<Result<_, _>>()
        .map_err(sql("read the GPU ledger"))
}

fn waits(c: &Connection) -> Result<Vec<GpuWait>, StateError> {
    let mut st = c
        .prepare_cached(queries::sqlite::GPU_WAITS)
        .map_err(sql("read the GPU queue"))?;
    let rows = st
        .query_map([], |r| {
            Ok(GpuWait {
                host: r.get(0)?,
                run: RunId(r.get(1)?),
                holder: r.get(2)?,
                queue: r.get(3)?,
                priority: r.get(4)?,
                count: r.get::<_, i64>(5)?.max(0) as usize,
                since: r.get(6)?,
                project: r.get(7)?,
                cpu_millis: r.get::<_, i64>(8)?.max(0) as u64,
                memory_bytes: r.get::<_, i64>(9)?.max(0) as u64,
            })
        })
        .map_err(sql("read the GPU queue"))?;
    rows.collect::<Result<_, _>>()
        .map_err(sql("read the GPU queue"))
}

fn capacity(c: &Connection) -> Result<Vec<CapacityClaim>, StateError> {
    let mut st = c
        .prepare_cached(queries::sqlite::CAPACITY_CLAIMS)
        .map_err(sql("read the CPU and memory held"))?;
    let rows = st
        .query_map([], |r| {
            Ok(CapacityClaim {
                host: r.get(0)?,
                run: RunId(r.get(1)?),
                holder: r.get(2)?,
                cpu_millis: r.get::<_, i64>(3)?.max(0) as u64,
                memory_bytes: r.get::<_, i64>(4)?.max(0) as u64,
                claimed_at: r.get(5)?,
            })
        })
        .map_err(sql("read the CPU and memory held"))?;
    rows.collect::<Result<_, _>>()
        .map_err(sql("read the CPU and memory held"))
}

impl LedgerTx for rusqlite::Transaction<'_> {
    fn free_dead(&mut self, ask: &GpuAsk<'_>) -> Result<(), StateError> {
        self.execute_cached(
            queries::sqlite::FREE_DEAD_GPUS,
            params![ask.run.0, ask.stale_before],
        )
        .map_err(sql("free dead GPU claims"))?;
        self.execute_cached(
            queries::sqlite::FREE_DEAD_GPU_WAITS,
            params![ask.run.0, ask.stale_before, ask.waits_stale_before],
        )
        .map_err(sql("free dead GPU waits"))?;
        self.execute_cached(
            queries::sqlite::FREE_DEAD_CAPACITY,
            params![ask.run.0, ask.stale_before],
        )
        .map_err(sql("free dead CPU and memory claims"))?;
        Ok(())
    }

    fn claims(&mut self) -> Result<Vec<GpuClaim>, StateError> {
        claims(self)
    }

    fn waits(&mut self) -> Result<Vec<GpuWait>, StateError> {
        waits(self)
    }

    fn upsert_wait(&mut self, ask: &GpuAsk<'_>, at: &str) -> Result<(), StateError> {
        self.execute_cached(
            queries::sqlite::WAIT_FOR_GPUS,
            params![
                ask.host,
                ask.run.0,
                ask.holder,
                ask.queue,
                ask.priority,
                ask.count as i64,
                at,
                ask.project,
                ask.cpu_millis as i64,
                ask.memory_bytes as i64
            ],
        )
        .map(|_| ())
        .map_err(sql("wait for GPUs"))
    }

    fn drop_wait(&mut self, run: &RunId, holder: &str) -> Result<(), StateError> {
        self.execute_cached(queries::sqlite::STOP_WAITING, params![run.0, holder])
            .map(|_| ())
            .map_err(sql("stop waiting for GPUs"))
    }

    fn insert_claim(&mut self, ask: &GpuAsk<'_>, device: &str, at: &str) -> Result<(), StateError> {
        self.execute_cached(
            queries::sqlite::CLAIM_GPU,
            params![
                ask.host,
                device,
                ask.run.0,
                ask.holder,
                at,
                ask.priority,
                ask.preemptible,
                ask.queue,
                ask.project
            ],
        )
        .map(|_| ())
        .map_err(sql(format!("claim GPU {device}")))
    }

    fn weights(&mut self) -> Result<Vec<(String, i64)>, StateError> {
        let mut st = self
            .prepare_cached(queries::sqlite::PROJECT_WEIGHTS)
            .map_err(sql("read the projects' weights"))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql("read the projects' weights"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sql("read the projects' weights"))
    }

    fn capacity_claims(&mut self) -> Result<Vec<CapacityClaim>, StateError> {
        capacity(self)
    }

    fn insert_capacity(&mut self, ask: &GpuAsk<'_>, at: &str) -> Result<(), StateError> {
        self.execute_cached(
            queries::sqlite::CLAIM_CAPACITY,
            params![
                ask.host,
                ask.run.0,
                ask.holder,
                ask.cpu_millis as i64,
                ask.memory_bytes as i64,
                at
            ],
        )
        .map(|_| ())
        .map_err(sql("claim CPU and memory"))
    }

    fn unmark(&mut self, run: &RunId, holder: &str) -> Result<(), StateError> {
        self.execute_cached(queries::sqlite::UNMARK_PREEMPTED_BY, params![run.0, holder])
            .map(|_| ())
            .map_err(sql("unmark preempted GPU claims"))
    }

    fn mark_preempted(
        &mut self,
        victim: &GpuClaim,
        ask: &GpuAsk<'_>,
        by: &str,
    ) -> Result<(), StateError> {
        self.execute_cached(
            queries::sqlite::PREEMPT_GPUS,
            params![victim.run.0, victim.holder, by, ask.run.0, ask.holder],
        )
        .map(|_| ())
        .map_err(sql("preempt a GPU claim"))
    }
}

impl DeviceStore for SqliteState {
    fn claim_gpus(&self, ask: &GpuAsk<'_>) -> Result<Claimed, StateError> {
        self.with(|c| {
            let mut tx = rusqlite::Transaction::new_unchecked(c, TransactionBehavior::Immediate)
                .map_err(sql("begin"))?;
            let claimed = claim_in(&mut tx, ask)?;
            tx.commit().map_err(sql("commit a GPU claim"))?;
            Ok(claimed)
        })
    }

    fn release_gpus(&self, run: &RunId, holder: Option<&str>) -> Result<(), StateError> {
        let what = format!("release the GPUs of run {run}");
        self.with(|c| {
            match holder {
                Some(h) => c
                    .execute_cached(queries::sqlite::RELEASE_GPUS, params![run.0, h])
                    .and_then(|_| {
                        c.execute_cached(queries::sqlite::RELEASE_CAPACITY, params![run.0, h])
                    }),
                None => c
                    .execute_cached(queries::sqlite::RELEASE_RUN_GPUS, params![run.0])
                    .and_then(|_| {
                        c.execute_cached(queries::sqlite::STOP_RUN_WAITING, params![run.0])
                    })
                    .and_then(|_| {
                        c.execute_cached(queries::sqlite::UNMARK_PREEMPTED_BY_RUN, params![run.0])
                    })
                    .and_then(|_| {
                        c.execute_cached(queries::sqlite::RELEASE_RUN_CAPACITY, params![run.0])
                    }),
            }
            .map(|_| ())
            .map_err(sql(what.clone()))
        })
    }

    fn give_up_gpus(&self, run: &RunId, holder: &str) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::STOP_WAITING, params![run.0, holder])
                .and_then(|_| {
                    c.execute_cached(queries::sqlite::UNMARK_PREEMPTED_BY, params![run.0, holder])
                })
                .map(|_| ())
                .map_err(sql(format!(
                    "stop waiting for GPUs ({holder} of run {run})"
                )))
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
        self.with(|c| {
            match value {
                Some(v) => {
                    c.execute_cached(queries::sqlite::SET_PRIORITY_CLASS, params![name, v, now()])
                }
                None => c.execute_cached(queries::sqlite::DROP_PRIORITY_CLASS, params![name]),
            }
            .map(|_| ())
            .map_err(sql(format!("set priority class {name}")))
        })
    }

    fn priority_classes(&self) -> Result<Vec<(String, i64)>, StateError> {
        self.with(|c| {
            let mut st = c
                .prepare_cached(queries::sqlite::PRIORITY_CLASSES)
                .map_err(sql("read the priority classes"))?;
            let rows = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(sql("read the priority classes"))?;
            rows.collect::<Result<_, _>>()
                .map_err(sql("read the priority classes"))
        })
    }

    fn gpu_preempted(&self, run: &RunId, holder: &str) -> Result<Option<String>, StateError> {
        self.with(|c| {
            c.prepare_cached(queries::sqlite::GPU_PREEMPTED)
                .and_then(|mut st| {
                    st.query_row(params![run.0, holder], |r| r.get(0))
                        .optional()
                })
                .map_err(sql("read a GPU claim"))
        })
    }
}
