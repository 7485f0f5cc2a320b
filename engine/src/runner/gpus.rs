//! The GPUs of the machine, handed to the stages that ask for them through the home's
//! ledger ([`crate::state::DeviceStore`]): every engine of the home claims there, so two
//! attempts never hold one device, whichever engines run them.

use std::sync::Arc;
use std::time::Duration;

use crate::state::{Claimed, GpuAsk, GpuClaim, RunId, StateError, StateStore};

/// How often a waiting attempt asks the ledger again (devices another engine frees wake
/// nobody here).
const POLL: Duration = Duration::from_millis(250);

/// The machine's GPUs as this run's engine sees them.
pub(super) struct GpuPool {
    state: Arc<dyn StateStore>,
    run: RunId,
    host: String,
    /// The devices' names (`CUDA_VISIBLE_DEVICES` values), in the order handed out.
    devices: Vec<String>,
    released: tokio::sync::Notify,
}

impl std::fmt::Debug for GpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPool")
            .field("host", &self.host)
            .field("devices", &self.devices)
            .finish()
    }
}

/// This machine's name, as devices are numbered per machine.
pub(crate) fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

impl GpuPool {
    pub(super) fn new(state: Arc<dyn StateStore>, run: RunId, devices: Vec<String>) -> Self {
        GpuPool {
            state,
            run,
            host: host(),
            devices,
            released: tokio::sync::Notify::new(),
        }
    }

    /// Waits until `n` devices are claimed for `holder`; their names. `waiting` hears who
    /// holds them each time that changes while it waits.
    pub(super) async fn acquire(
        &self,
        n: usize,
        holder: &str,
        mut waiting: impl FnMut(&[GpuClaim]),
    ) -> Result<Vec<String>, StateError> {
        let mut last: Option<Vec<GpuClaim>> = None;
        loop {
            let notified = self.released.notified();
            let stale = crate::engine::recover::stale_before();
            let ask = GpuAsk {
                host: &self.host,
                devices: &self.devices,
                count: n,
                run: &self.run,
                holder,
                stale_before: &stale,
            };
            match self.state.claim_gpus(&ask)? {
                Claimed::Granted(devices) => return Ok(devices),
                Claimed::Busy(held) => {
                    if last.as_ref() != Some(&held) {
                        waiting(&held);
                        last = Some(held);
                    }
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }

    pub(super) fn release(&self, holder: &str) -> Result<(), StateError> {
        let r = self.state.release_gpus(&self.run, Some(holder));
        self.released.notify_waiters();
        r
    }
}

/// Who holds the devices a stage waits for, in words.
pub(super) fn held_by(held: &[GpuClaim]) -> String {
    let mut out: Vec<String> = held
        .iter()
        .map(|c| format!("{} by run {} ({})", c.device, c.run, c.holder))
        .collect();
    out.dedup();
    out.join(", ")
}
