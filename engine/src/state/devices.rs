//! The home's ledger of GPUs: every engine of a home (`serve`, each `drivetrain run`, each
//! replica on a shared PostgreSQL) claims devices here, so no device is held by two
//! attempts at once. A claim lives as long as its run's engine: claims of a run that has
//! ended, or whose heartbeat is older than the caller's `stale_before`, are freed by the
//! next claim (kill -9 safe), and a resumed run's engine frees its dead predecessor's.
//!
//! Attempts that cannot be admitted wait in the ledger too, so every engine admits them
//! in one order: priority, then the time they started waiting. Devices a waiter ahead
//! needs are kept for it; a waiter that still cannot be admitted marks preemptible
//! claims of lower priority (the lowest, the youngest first, no more than it needs), and
//! their engines stop those attempts ([`DeviceStore::gpu_preempted`]).

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
    pub queue: String,
    /// The run's project (its weight shares the GPUs when projects contend).
    pub project: String,
    pub priority: i64,
    pub preemptible: bool,
    /// Set once a waiter of higher priority asked for the device: `holder of run R
    /// (priority P)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
}

/// An attempt waiting for devices.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuWait {
    pub host: String,
    pub run: RunId,
    pub holder: String,
    pub queue: String,
    pub project: String,
    pub priority: i64,
    pub count: usize,
    /// The CPU (thousandths of a core) and memory it asks besides.
    #[serde(default)]
    pub cpu_millis: u64,
    #[serde(default)]
    pub memory_bytes: u64,
    /// When it started waiting: the order among equal priorities.
    pub since: String,
}

/// CPU and memory an attempt holds on a machine (what its stage declares in
/// `resources`, as much as the machine has at most).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CapacityClaim {
    pub host: String,
    pub run: RunId,
    pub holder: String,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub claimed_at: String,
}

/// A machine's CPU (thousandths of a core) and memory: what its attempts may hold
/// together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// Where a waiting attempt stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InQueue {
    /// The claims on its host (who holds the devices).
    pub held: Vec<GpuClaim>,
    /// Who holds the machine's CPU and memory, where it waits for them.
    pub capacity: Vec<CapacityClaim>,
    /// Its place among the host's waiters, from 1.
    pub position: usize,
    /// How many wait on the host, itself included.
    pub waiting: usize,
    /// The claims being preempted for it or those ahead (marked, not yet given back).
    pub preempting: Vec<GpuClaim>,
}

/// A claim's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// These devices, now held.
    Granted(Vec<String>),
    /// Not admitted yet: why, and where it stands.
    Busy(InQueue),
}

/// What a claim asks.
#[derive(Debug, Clone)]
pub struct GpuAsk<'a> {
    pub host: &'a str,
    /// The machine's devices, in the order they are handed out.
    pub devices: &'a [String],
    pub count: usize,
    /// CPU (thousandths of a core) and memory asked besides (0: none), at most the
    /// machine's `capacity`.
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub capacity: Capacity,
    pub run: &'a RunId,
    pub holder: &'a str,
    pub queue: &'a str,
    pub project: &'a str,
    pub priority: i64,
    pub preemptible: bool,
    /// Claims and waits of runs whose heartbeat is older than this are a dead engine's.
    pub stale_before: &'a str,
    /// Waits not asked again since this are given up (their asker stopped asking).
    pub waits_stale_before: &'a str,
}

/// The ledger.
pub trait DeviceStore: Send + Sync {
    /// Claims `count` of `devices` on `host` for `holder` of `run`, all or none, after
    /// freeing dead claims and waits, in the order of priority and waiting time; one of
    /// any number of engines racing gets each device. A `Busy` asker is recorded as
    /// waiting until it asks again, is granted, or gives up ([`DeviceStore::release_gpus`]).
    fn claim_gpus(&self, ask: &GpuAsk<'_>) -> Result<Claimed, StateError>;
    /// Gives back what `holder` of `run` holds (a granted holder waits no more); with
    /// `None` everything of the run: what its holders hold, its waits, and its waiters'
    /// marks for preemption.
    fn release_gpus(&self, run: &RunId, holder: Option<&str>) -> Result<(), StateError>;
    /// `holder` of `run` stops waiting (a cancel): its wait goes, and the claims it
    /// marked for preemption go unmarked, so nobody is stopped for it.
    fn give_up_gpus(&self, run: &RunId, holder: &str) -> Result<(), StateError>;
    /// Every claim, by host and device.
    fn gpu_claims(&self) -> Result<Vec<GpuClaim>, StateError>;
    /// The CPU and memory held, by host.
    fn capacity_claims(&self) -> Result<Vec<CapacityClaim>, StateError>;
    /// Every waiter, in the order they are admitted.
    fn gpu_waits(&self) -> Result<Vec<GpuWait>, StateError>;
    /// Who preempts `holder` of `run`, once one has asked for its devices.
    fn gpu_preempted(&self, run: &RunId, holder: &str) -> Result<Option<String>, StateError>;
    /// Names a priority (`scheduling.priority: NAME`); `None` forgets the name.
    fn set_priority_class(&self, name: &str, value: Option<i64>) -> Result<(), StateError>;
    /// The home's priority classes, by name.
    fn priority_classes(&self) -> Result<Vec<(String, i64)>, StateError>;
}

/// One claim's transaction, as each backend runs it: [`claim_in`] is the ledger's logic,
/// the same for every backend.
pub(super) trait LedgerTx {
    fn free_dead(&mut self, ask: &GpuAsk<'_>) -> Result<(), StateError>;
    fn claims(&mut self) -> Result<Vec<GpuClaim>, StateError>;
    fn waits(&mut self) -> Result<Vec<GpuWait>, StateError>;
    fn upsert_wait(&mut self, ask: &GpuAsk<'_>, at: &str) -> Result<(), StateError>;
    fn drop_wait(&mut self, run: &RunId, holder: &str) -> Result<(), StateError>;
    fn insert_claim(&mut self, ask: &GpuAsk<'_>, device: &str, at: &str) -> Result<(), StateError>;
    fn capacity_claims(&mut self) -> Result<Vec<CapacityClaim>, StateError>;
    fn insert_capacity(&mut self, ask: &GpuAsk<'_>, at: &str) -> Result<(), StateError>;
    /// Marks `victim`'s claims as preempted by `ask`'s asker (`by`: in words).
    fn mark_preempted(
        &mut self,
        victim: &GpuClaim,
        ask: &GpuAsk<'_>,
        by: &str,
    ) -> Result<(), StateError>;
    /// Unmarks the claims `holder` of `run` marked.
    fn unmark(&mut self, run: &RunId, holder: &str) -> Result<(), StateError>;
    /// Projects' weights where one was set.
    fn weights(&mut self) -> Result<Vec<(String, i64)>, StateError>;
}

/// A claim inside its backend's transaction. First on what is recorded, the asker placed
/// in the queue where it would stand: granted, it takes the devices and leaves the queue
/// (no more statements than that). Otherwise the dead are freed, the wait recorded, and
/// the ledger decides again ([`decide`]), granting or marking what is preempted.
pub(super) fn claim_in(tx: &mut impl LedgerTx, ask: &GpuAsk<'_>) -> Result<Claimed, StateError> {
    let at = super::now();
    let claims: Vec<GpuClaim> = tx
        .claims()?
        .into_iter()
        .filter(|c| c.host == ask.host)
        .collect();
    let capacity = capacity_on(tx, ask)?;
    let all_waits = tx.waits()?;
    // (Waiting anywhere: a wait of the asker's on another machine goes too once granted.)
    let queued = all_waits.iter().any(|w| is_asker(ask, w));
    let mut with_me: Vec<GpuWait> = all_waits
        .into_iter()
        .filter(|w| w.host == ask.host)
        .collect();
    if !queued {
        let me = GpuWait {
            host: ask.host.to_owned(),
            run: ask.run.clone(),
            holder: ask.holder.to_owned(),
            queue: ask.queue.to_owned(),
            project: ask.project.to_owned(),
            priority: ask.priority,
            count: ask.count,
            cpu_millis: ask.cpu_millis,
            memory_bytes: ask.memory_bytes,
            since: at.clone(),
        };
        let place = with_me.partition_point(|w| order(w) <= order(&me));
        with_me.insert(place, me);
    }
    fair_share(tx, &claims, &mut with_me)?;
    if let Decision::Grant(devices) = decide(ask, &claims, &capacity, &with_me) {
        return grant(tx, ask, devices, queued, &at);
    }
    tx.free_dead(ask)?;
    tx.upsert_wait(ask, &at)?;
    let (claims, mut waits) = on_host(tx, ask.host)?;
    let capacity = capacity_on(tx, ask)?;
    fair_share(tx, &claims, &mut waits)?;
    match decide(ask, &claims, &capacity, &waits) {
        Decision::Grant(devices) => grant(tx, ask, devices, true, &at),
        Decision::Wait {
            position,
            waiting,
            preempt,
        } => {
            let by = format!(
                "{} of run {} (priority {})",
                ask.holder, ask.run, ask.priority
            );
            let mut held = claims;
            for c in held.iter_mut() {
                if c.preempted_by.is_none() && preempt.iter().any(|v| same_holder(v, c)) {
                    tx.mark_preempted(c, ask, &by)?;
                    c.preempted_by = Some(by.clone());
                }
            }
            let preempting = held
                .iter()
                .filter(|c| c.preempted_by.is_some())
                .cloned()
                .collect();
            Ok(Claimed::Busy(InQueue {
                held,
                capacity,
                position,
                waiting,
                preempting,
            }))
        }
    }
}

/// The CPU and memory held on the asker's host, where it asks for some (an ask of GPUs
/// alone reads none: no statement more).
fn capacity_on(tx: &mut impl LedgerTx, ask: &GpuAsk<'_>) -> Result<Vec<CapacityClaim>, StateError> {
    if ask.cpu_millis == 0 && ask.memory_bytes == 0 {
        return Ok(Vec::new());
    }
    Ok(tx
        .capacity_claims()?
        .into_iter()
        .filter(|c| c.host == ask.host)
        .collect())
}

/// The claims and the waits (in order) on `host`.
fn on_host(
    tx: &mut impl LedgerTx,
    host: &str,
) -> Result<(Vec<GpuClaim>, Vec<GpuWait>), StateError> {
    let claims = tx
        .claims()?
        .into_iter()
        .filter(|c| c.host == host)
        .collect();
    let waits = tx.waits()?.into_iter().filter(|w| w.host == host).collect();
    Ok((claims, waits))
}

fn grant(
    tx: &mut impl LedgerTx,
    ask: &GpuAsk<'_>,
    devices: Vec<String>,
    queued: bool,
    at: &str,
) -> Result<Claimed, StateError> {
    if queued {
        tx.drop_wait(ask.run, ask.holder)?;
        // Given devices that came free otherwise, it stops nobody more.
        tx.unmark(ask.run, ask.holder)?;
    }
    for d in &devices {
        tx.insert_claim(ask, d, at)?;
    }
    if ask.cpu_millis > 0 || ask.memory_bytes > 0 {
        tx.insert_capacity(ask, at)?;
    }
    Ok(Claimed::Granted(devices))
}

/// Orders the waiters of one priority by their project's share: the GPUs its attempts
/// hold on the host over its weight (default 1), fewest first, then as they came. Only
/// where projects contend (waiters of two projects at one priority) are weights read.
fn fair_share(
    tx: &mut impl LedgerTx,
    claims: &[GpuClaim],
    waits: &mut [GpuWait],
) -> Result<(), StateError> {
    let contend = waits
        .windows(2)
        .any(|w| w[0].priority == w[1].priority && w[0].project != w[1].project);
    if !contend {
        return Ok(());
    }
    let weights = tx.weights()?;
    let share = |project: &str| {
        let held = claims.iter().filter(|c| c.project == project).count() as f64;
        let weight = weights
            .iter()
            .find(|(p, _)| p == project)
            .map_or(1, |(_, w)| (*w).max(1));
        held / weight as f64
    };
    waits.sort_by(|a, b| {
        std::cmp::Reverse(a.priority)
            .cmp(&std::cmp::Reverse(b.priority))
            .then(share(&a.project).total_cmp(&share(&b.project)))
            .then_with(|| order(a).cmp(&order(b)))
    });
    Ok(())
}

/// The ledger's order of waiters (as `GPU_WAITS` reads them): priority, then waiting
/// time, then who.
fn order(w: &GpuWait) -> (std::cmp::Reverse<i64>, &str, &str, &str) {
    (std::cmp::Reverse(w.priority), &w.since, &w.run.0, &w.holder)
}

fn is_asker(ask: &GpuAsk<'_>, w: &GpuWait) -> bool {
    &w.run == ask.run && w.holder == ask.holder
}

fn same_holder(a: &GpuClaim, b: &GpuClaim) -> bool {
    a.run == b.run && a.holder == b.holder
}

/// What the ledger does with an ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    Grant(Vec<String>),
    Wait {
        position: usize,
        waiting: usize,
        /// One claim of each holder to preempt now.
        preempt: Vec<GpuClaim>,
    },
}

/// Admission on one host: `claims`, `capacity` and `waits` are the host's, `waits` in
/// order and holding the asker. The asker is admitted when the free devices, CPU and
/// memory, less what the waiters ahead of it ask, are enough for what it asks;
/// otherwise it may preempt (for GPUs: preemption frees devices, not CPU or memory).
pub(super) fn decide(
    ask: &GpuAsk<'_>,
    claims: &[GpuClaim],
    capacity: &[CapacityClaim],
    waits: &[GpuWait],
) -> Decision {
    let position = waits
        .iter()
        .position(|w| is_asker(ask, w))
        .unwrap_or(waits.len());
    let before = &waits[..position];
    let ahead: usize = before.iter().map(|w| w.count).sum();
    let free: Vec<&String> = ask
        .devices
        .iter()
        .filter(|d| !claims.iter().any(|c| &c.device == *d))
        .collect();
    let gpus_fit = ask.count == 0 || free.len() >= ahead + ask.count;
    if gpus_fit && capacity_fits(ask, capacity, before) {
        // The first devices stay for those ahead (they take the first free too).
        let got = match ask.count {
            0 => Vec::new(),
            n => free[ahead..ahead + n]
                .iter()
                .map(|d| (*d).clone())
                .collect(),
        };
        return Decision::Grant(got);
    }
    let freeing = holders(claims.iter().filter(|c| c.preempted_by.is_some()));
    let freeing: usize = freeing.iter().map(|(_, n)| n).sum();
    let need = match ask.count {
        0 => 0,
        n => (ahead + n).saturating_sub(free.len() + freeing),
    };
    Decision::Wait {
        position: position + 1,
        waiting: waits.len().max(position + 1),
        preempt: victims(ask, claims, need),
    }
}

/// Whether the CPU and memory `ask` asks fit the machine besides what is held and what
/// the waiters `before` it ask.
fn capacity_fits(ask: &GpuAsk<'_>, held: &[CapacityClaim], before: &[GpuWait]) -> bool {
    let fits = |want: u64, held: u64, ahead: u64, of: u64| {
        want == 0 || held.saturating_add(ahead).saturating_add(want) <= of
    };
    fits(
        ask.cpu_millis,
        held.iter().map(|c| c.cpu_millis).sum(),
        before.iter().map(|w| w.cpu_millis).sum(),
        ask.capacity.cpu_millis,
    ) && fits(
        ask.memory_bytes,
        held.iter().map(|c| c.memory_bytes).sum(),
        before.iter().map(|w| w.memory_bytes).sum(),
        ask.capacity.memory_bytes,
    )
}

/// Each holder's first claim and how many devices it holds, in the claims' order.
fn holders<'a>(claims: impl Iterator<Item = &'a GpuClaim>) -> Vec<(&'a GpuClaim, usize)> {
    let mut out: Vec<(&GpuClaim, usize)> = Vec::new();
    for c in claims {
        match out.iter_mut().find(|(h, _)| same_holder(h, c)) {
            Some((_, n)) => *n += 1,
            None => out.push((c, 1)),
        }
    }
    out
}

/// The holders to preempt so that `need` more devices come free: preemptible, of lower
/// priority than the asker, not yet marked; the lowest priority and then the youngest
/// first, then any not needed dropped again. None when even all would not be enough
/// (preempting then would stop work and admit nobody).
fn victims(ask: &GpuAsk<'_>, claims: &[GpuClaim], need: usize) -> Vec<GpuClaim> {
    if need == 0 {
        return Vec::new();
    }
    let mut candidates = holders(
        claims
            .iter()
            .filter(|c| c.preemptible && c.priority < ask.priority && c.preempted_by.is_none()),
    );
    candidates.sort_by(|(a, _), (b, _)| {
        (a.priority, std::cmp::Reverse(&a.claimed_at))
            .cmp(&(b.priority, std::cmp::Reverse(&b.claimed_at)))
    });
    let mut taken: Vec<(&GpuClaim, usize)> = Vec::new();
    let mut freed = 0;
    for (c, n) in candidates {
        if freed >= need {
            break;
        }
        freed += n;
        taken.push((c, n));
    }
    if freed < need {
        return Vec::new();
    }
    // The last taken freed what was still missing; an earlier one may not be needed.
    let mut i = taken.len();
    while i > 0 {
        i -= 1;
        if freed - taken[i].1 >= need {
            freed -= taken[i].1;
            taken.remove(i);
        }
    }
    taken.into_iter().map(|(c, _)| c.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(
        device: &str,
        run: &str,
        holder: &str,
        priority: i64,
        preemptible: bool,
        at: &str,
    ) -> GpuClaim {
        GpuClaim {
            host: "h".into(),
            device: device.into(),
            run: RunId(run.into()),
            holder: holder.into(),
            claimed_at: at.into(),
            queue: "default".into(),
            project: "default".into(),
            priority,
            preemptible,
            preempted_by: None,
        }
    }

    fn wait(run: &str, holder: &str, priority: i64, count: usize, since: &str) -> GpuWait {
        GpuWait {
            host: "h".into(),
            run: RunId(run.into()),
            holder: holder.into(),
            queue: "default".into(),
            project: "default".into(),
            priority,
            count,
            cpu_millis: 0,
            memory_bytes: 0,
            since: since.into(),
        }
    }

    fn ask<'a>(
        run: &'a RunId,
        holder: &'a str,
        count: usize,
        priority: i64,
        devices: &'a [String],
    ) -> GpuAsk<'a> {
        GpuAsk {
            host: "h",
            devices,
            count,
            cpu_millis: 0,
            memory_bytes: 0,
            capacity: Capacity {
                cpu_millis: 2000,
                memory_bytes: 1 << 30,
            },
            run,
            holder,
            queue: "default",
            project: "default",
            priority,
            preemptible: false,
            stale_before: "",
            waits_stale_before: "",
        }
    }

    fn devices(n: usize) -> Vec<String> {
        (0..n).map(|i| i.to_string()).collect()
    }

    #[test]
    fn a_waiter_ahead_keeps_the_free_devices() {
        let all = devices(2);
        let me = RunId("b".into());
        let held = [claim("0", "x", "t#1", 0, false, "1")];
        // a (ahead) wants 1, I want 1: one free, it is a's.
        let waits = [wait("a", "s#1", 5, 1, "2"), wait("b", "s#1", 0, 1, "1")];
        match decide(&ask(&me, "s#1", 1, 0, &all), &held, &[], &waits) {
            Decision::Wait {
                position,
                waiting,
                preempt,
            } => {
                assert_eq!((position, waiting), (2, 2));
                assert!(preempt.is_empty(), "x is not preemptible");
            }
            d => panic!("{d:?}"),
        }
        // Alone, I get the free one.
        let waits = [wait("b", "s#1", 0, 1, "1")];
        assert_eq!(
            decide(&ask(&me, "s#1", 1, 0, &all), &held, &[], &waits),
            Decision::Grant(vec!["1".into()])
        );
    }

    #[test]
    fn preemption_takes_the_lowest_then_the_youngest_and_no_more_than_needed() {
        let all = devices(4);
        let me = RunId("hi".into());
        let held = [
            claim("0", "r1", "a#1", 1, true, "2026-01-01T00:00:01Z"),
            claim("1", "r2", "b#1", 1, true, "2026-01-01T00:00:02Z"),
            claim("2", "r3", "c#1", 0, true, "2026-01-01T00:00:03Z"),
            claim("3", "r4", "d#1", 0, false, "2026-01-01T00:00:00Z"),
        ];
        let waits = [wait("hi", "t#1", 10, 2, "9")];
        let Decision::Wait { preempt, .. } =
            decide(&ask(&me, "t#1", 2, 10, &all), &held, &[], &waits)
        else {
            panic!("granted");
        };
        let names: Vec<&str> = preempt.iter().map(|c| c.holder.as_str()).collect();
        // c (priority 0), then b (priority 1, younger than a); never d (not preemptible).
        assert_eq!(names, ["c#1", "b#1"]);
        // Equal or higher priority is never preempted.
        let Decision::Wait { preempt, .. } =
            decide(&ask(&me, "t#1", 2, 1, &all), &held, &[], &waits)
        else {
            panic!("granted");
        };
        // Only c is below 1, and its one device would not be enough: nobody is stopped.
        assert!(preempt.is_empty(), "{preempt:?}");
    }
}
