//! The GPUs of the machine, handed to the stages that ask for them through the home's
//! ledger ([`crate::state::DeviceStore`]): every engine of the home claims there, so two
//! attempts never hold one device, whichever engines run them.

use std::sync::Arc;
use std::time::Duration;

use crate::plan::{Priority, Scheduling};
use crate::state::{Claimed, GpuAsk, GpuClaim, InQueue, RunId, StateError, StateStore};

/// How often a waiting attempt asks the ledger again (devices another engine frees wake
/// nobody here).
const POLL: Duration = Duration::from_millis(250);
/// A wait not asked again for this long is given up (its engine stopped asking without
/// saying so); askers ask every [`POLL`].
const WAIT_STALE_S: i64 = 10;

/// Told of every change to the ledger this process makes (devices given back, claims
/// marked preempted), so its other engines (`serve`'s runs) look again at once; engines
/// of other processes see it at their next [`POLL`].
static LEDGER: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The machine's GPUs as this run's engine sees them.
pub(super) struct GpuPool {
    state: Arc<dyn StateStore>,
    run: RunId,
    /// The run's project (`""` counts as `default`).
    project: String,
    host: String,
    /// The devices' names (`CUDA_VISIBLE_DEVICES` values), in the order handed out.
    devices: Vec<String>,
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

/// What an attempt asks of the pool.
pub(super) struct Want<'a> {
    pub count: usize,
    pub holder: &'a str,
    pub scheduling: &'a Scheduling,
    /// Its priority, a class resolved ([`priority_of`]).
    pub priority: i64,
}

/// Gives up a wait the asker dropped (a cancel): a wait left in the ledger would keep
/// devices for nobody until it went stale.
struct Queued<'a> {
    pool: &'a GpuPool,
    holder: &'a str,
    done: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.pool.state.give_up_gpus(&self.pool.run, self.holder);
        }
    }
}

impl GpuPool {
    pub(super) fn new(
        state: Arc<dyn StateStore>,
        run: RunId,
        project: String,
        devices: Vec<String>,
    ) -> Self {
        let project = match project.as_str() {
            "" => crate::access::DEFAULT_PROJECT.to_owned(),
            _ => project,
        };
        GpuPool {
            state,
            run,
            project,
            host: host(),
            devices,
        }
    }

    /// Waits until the devices are claimed for `want.holder`; their names. `waiting`
    /// hears where it stands each time that changes while it waits.
    pub(super) async fn acquire(
        &self,
        want: Want<'_>,
        mut waiting: impl FnMut(&InQueue),
    ) -> Result<Vec<String>, StateError> {
        let mut last: Option<InQueue> = None;
        let mut queued = Queued {
            pool: self,
            holder: want.holder,
            done: false,
        };
        loop {
            let notified = LEDGER.notified();
            let stale = crate::engine::recover::stale_before();
            let waits_stale = (chrono::Utc::now() - chrono::Duration::seconds(WAIT_STALE_S))
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let ask = GpuAsk {
                host: &self.host,
                devices: &self.devices,
                count: want.count,
                run: &self.run,
                holder: want.holder,
                queue: want.scheduling.queue(),
                project: &self.project,
                priority: want.priority,
                preemptible: want.scheduling.preemptible,
                stale_before: &stale,
                waits_stale_before: &waits_stale,
            };
            match self.state.claim_gpus(&ask)? {
                Claimed::Granted(devices) => {
                    queued.done = true;
                    return Ok(devices);
                }
                Claimed::Busy(at) => {
                    let marked = last.as_ref().map_or(0, |l| l.preempting.len());
                    if at.preempting.len() > marked {
                        LEDGER.notify_waiters();
                    }
                    if last.as_ref() != Some(&at) {
                        waiting(&at);
                        last = Some(at);
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
        LEDGER.notify_waiters();
        r
    }

    /// Returns once an attempt of higher priority asked for `holder`'s devices: who.
    pub(super) async fn preempted(&self, holder: &str) -> String {
        loop {
            let notified = LEDGER.notified();
            if let Ok(Some(by)) = self.state.gpu_preempted(&self.run, holder) {
                return by;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

/// A priority as a number: a class's from the home's classes.
pub(super) fn priority_of(state: &dyn StateStore, p: &Priority) -> Result<i64, String> {
    let class = match p {
        Priority::Value(v) => return Ok(*v),
        Priority::Class(c) => c,
    };
    let classes = state
        .priority_classes()
        .map_err(|e| format!("the home's priority classes: {e}"))?;
    if let Some((_, v)) = classes.iter().find(|(n, _)| n == class) {
        return Ok(*v);
    }
    let known: Vec<String> = classes.iter().map(|(n, v)| format!("{n} ({v})")).collect();
    Err(format!(
        "priority class `{class}` is not defined in this home (defined: {}); define it with `drivetrain queue class {class} VALUE`, or write a number",
        match known.len() {
            0 => "none".to_owned(),
            _ => known.join(", "),
        }
    ))
}

/// Why a stage waits for its devices and where it stands, in words: who holds them,
/// its place in the host's queue, and who is being preempted for it.
pub(super) fn why_waiting(n: usize, queue: &str, at: &InQueue) -> String {
    let mut why = format!("waiting for {n} GPU(s): {}", held_by(&at.held));
    why.push_str(&format!(
        "; place {} of {} waiting for this machine's GPUs (queue `{queue}`)",
        at.position, at.waiting
    ));
    if !at.preempting.is_empty() {
        why.push_str(&format!("; preempting {}", held_by(&at.preempting)));
    }
    why
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
