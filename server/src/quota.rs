//! Project quotas in `serve` (`drivetrain project quota`): a project's runs in flight and
//! the GPUs they claim stay within its quota; the rest wait `Pending`, first come first
//! served, holding no process. A run claims the most GPUs any one of its stages uses.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use drivetrain_engine::state::Quota;
use drivetrain_engine::Pipeline;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One project's places: a permit per run in flight, one per GPU claimed.
#[derive(Debug)]
struct Places {
    runs: Arc<Semaphore>,
    gpus: Arc<Semaphore>,
    /// The quota the permits were sized for.
    quota: Mutex<Quota>,
}

/// Every project's places, sized by its quota as last read.
#[derive(Debug, Default)]
pub struct Quotas {
    places: Mutex<BTreeMap<String, Arc<Places>>>,
}

/// What a run holds while it is in flight.
#[derive(Debug)]
pub struct Held {
    _run: Option<OwnedSemaphorePermit>,
    _gpus: Option<OwnedSemaphorePermit>,
}

/// A bound as permits: none is as many as a semaphore holds.
fn permits(bound: Option<u32>) -> usize {
    bound.map_or(Semaphore::MAX_PERMITS, |b| b as usize)
}

/// Brings `s` from `from` permits to `to` (taking away only what is free now; the rest
/// as runs end).
fn resize(s: &Semaphore, from: usize, to: usize) {
    if to > from {
        s.add_permits(to - from);
    } else {
        s.forget_permits(from - to);
    }
}

/// The GPUs a run of `pipeline` claims: the most any one stage uses.
pub fn demand(pipeline: &Pipeline) -> u32 {
    pipeline
        .stages
        .iter()
        .map(|s| s.gpus() as u32)
        .max()
        .unwrap_or(0)
}

impl Quotas {
    /// The places of `project` under `quota` (resized when the quota changed).
    fn places(&self, project: &str, quota: Quota) -> Arc<Places> {
        let mut all = self.places.lock().unwrap_or_else(|e| e.into_inner());
        let p = all
            .entry(project.to_owned())
            .or_insert_with(|| {
                Arc::new(Places {
                    runs: Arc::new(Semaphore::new(permits(quota.max_runs))),
                    gpus: Arc::new(Semaphore::new(permits(quota.max_gpus))),
                    quota: Mutex::new(quota),
                })
            })
            .clone();
        let mut seen = p.quota.lock().unwrap_or_else(|e| e.into_inner());
        if *seen != quota {
            resize(&p.runs, permits(seen.max_runs), permits(quota.max_runs));
            resize(&p.gpus, permits(seen.max_gpus), permits(quota.max_gpus));
            *seen = quota;
        }
        drop(seen);
        p
    }

    /// Waits for a place for a run of `project` claiming `gpus`, in turn; `Err` says why
    /// it can never have one.
    pub async fn enter(&self, project: &str, quota: Quota, gpus: u32) -> Result<Held, String> {
        if quota.max_gpus.is_some_and(|m| gpus > m) {
            return Err(format!(
                "it claims {gpus} GPUs; project `{project}`'s quota is {} (drivetrain project quota)",
                quota.max_gpus.unwrap_or_default()
            ));
        }
        let p = self.places(project, quota);
        let run = match quota.max_runs {
            Some(_) => Some(
                p.runs
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let gpus = match (quota.max_gpus, gpus) {
            (Some(_), n) if n > 0 => Some(
                p.gpus
                    .clone()
                    .acquire_many_owned(n)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        Ok(Held {
            _run: run,
            _gpus: gpus,
        })
    }
}
