//! The home's ledger of GPUs: every engine of a home (`serve`, each `drivetrain run`, each
//! replica on a shared PostgreSQL) claims devices here, so no device is held by two
//! attempts at once. A claim lives as long as its run's engine: claims of a run that has
//! ended, or whose heartbeat is older than the caller's `stale_before`, are freed by the
//! next claim (kill -9 safe), and a resumed run's engine frees its dead predecessor's.

use super::{RunId, StateError};

/// One device held.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuClaim {
    /// The machine the device is on (devices are numbered per machine).
    pub host: String,
    pub device: String,
    pub run: RunId,
    /// Who in the run holds it: `stage#attempt`, `stage/items/3#1`.
    pub holder: String,
    pub claimed_at: String,
}

/// A claim's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// These devices, now held.
    Granted(Vec<String>),
    /// Not enough free: the claims that hold the rest.
    Busy(Vec<GpuClaim>),
}

/// What a claim asks.
#[derive(Debug, Clone)]
pub struct GpuAsk<'a> {
    pub host: &'a str,
    /// The machine's devices, in the order they are handed out.
    pub devices: &'a [String],
    pub count: usize,
    pub run: &'a RunId,
    pub holder: &'a str,
    /// Claims of runs whose heartbeat is older than this are a dead engine's.
    pub stale_before: &'a str,
}

/// The ledger.
pub trait DeviceStore: Send + Sync {
    /// Claims `count` of `devices` on `host` for `holder` of `run`, all or none, after
    /// freeing dead claims; one of any number of engines racing gets each device.
    fn claim_gpus(&self, ask: &GpuAsk<'_>) -> Result<Claimed, StateError>;
    /// Gives back what `holder` of `run` holds (every holder of the run with `None`).
    fn release_gpus(&self, run: &RunId, holder: Option<&str>) -> Result<(), StateError>;
    /// Every claim, by host and device.
    fn gpu_claims(&self) -> Result<Vec<GpuClaim>, StateError>;
}

/// The devices of `ask` not in `taken` (its host's), in order: the first `count`, or
/// `None` when there are fewer.
pub(super) fn pick(ask: &GpuAsk<'_>, taken: &[GpuClaim]) -> Option<Vec<String>> {
    let free: Vec<String> = ask
        .devices
        .iter()
        .filter(|d| !taken.iter().any(|c| c.host == ask.host && &c.device == *d))
        .take(ask.count)
        .cloned()
        .collect();
    (free.len() == ask.count).then_some(free)
}
