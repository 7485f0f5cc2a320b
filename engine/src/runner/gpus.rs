//! The GPUs of the machine, handed to the stages that ask for them through the home's
//! ledger ([`crate::state::DeviceStore`]): every engine of the home claims there, so two
//! attempts never hold one device, whichever engines run them.

use std::sync::Arc;
use std::time::Duration;

use crate::plan::{Priority, Scheduling};
use crate::state::{Capacity, Claimed, GpuAsk, GpuClaim, InQueue, RunId, StateError, StateStore};

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
    /// The machine's CPU and memory, which the attempts of all its engines share.
    capacity: Capacity,
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

/// The machine's CPU and memory: its cores (`DRIVETRAIN_LOCAL_CPUS` overrides them) and
/// its memory (`MemTotal`).
fn machine() -> Capacity {
    let cores = std::env::var("DRIVETRAIN_LOCAL_CPUS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(u64::MAX, |kib| kib.saturating_mul(1024));
    Capacity {
        cpu_millis: cores * 1000,
        memory_bytes: memory,
    }
}

/// What an attempt asks of the pool.
#[derive(Clone, Copy)]
pub(super) struct Want<'a> {
    pub count: usize,
    /// CPU (thousandths of a core) and memory its stage declares (0: none).
    pub cpu_millis: u64,
    pub memory_bytes: u64,
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
            capacity: machine(),
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
                // More than the machine has would never fit: it runs alone instead.
                cpu_millis: want.cpu_millis.min(self.capacity.cpu_millis),
                memory_bytes: want.memory_bytes.min(self.capacity.memory_bytes),
                capacity: self.capacity,
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
pub(super) fn why_waiting(want: &Want<'_>, queue: &str, at: &InQueue) -> String {
    let mut asks = Vec::new();
    if want.count > 0 {
        asks.push(format!("{} GPU(s)", want.count));
    }
    if want.cpu_millis > 0 {
        asks.push(format!("{} CPU(s)", want.cpu_millis as f64 / 1000.0));
    }
    if want.memory_bytes > 0 {
        asks.push(format!(
            "{} MiB of memory",
            want.memory_bytes.div_ceil(1 << 20)
        ));
    }
    let mut holders: Vec<String> = Vec::new();
    if want.count > 0 {
        holders.push(held_by(&at.held));
    }
    if want.cpu_millis > 0 || want.memory_bytes > 0 {
        // (One row a holder: no holder twice.)
        let cpu: Vec<String> = at
            .capacity
            .iter()
            .map(|c| format!("run {} ({})", c.run, c.holder))
            .collect();
        holders.push(format!(
            "the machine's CPU and memory held by {}",
            cpu.join(", ")
        ));
    }
    let mut why = format!("waiting for {}: {}", asks.join(", "), holders.join("; "));
    why.push_str(&format!(
        "; place {} of {} waiting on this machine (queue `{queue}`)",
        at.position, at.waiting
    ));
    if !at.preempting.is_empty() {
        why.push_str(&format!("; preempting {}", held_by(&at.preempting)));
    }
    why
}

/// Who holds the devices a stage waits for, in words.
pub(super) fn held_by(held: &[GpuClaim]) -> String {
    let out: Vec<String> = held
        .iter()
        .map(|c| format!("{} by run {} ({})", c.device, c.run, c.holder))
        .collect();
    out.join(", ")
}
