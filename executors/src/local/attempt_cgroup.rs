//! One attempt's cgroups, under the engine's ([`Cgroups`]): its `resources`' limits, joined
//! by its process before it execs, and what it used.
//!
//! Making a cgroup and removing it is most of what cgroups cost an attempt: `mkdir` makes
//! the control files of every controller and `rmdir` tears them down, both under the
//! kernel's global `cgroup_mutex` (on a 1,000-wide fan-out of `true`, 12 % of all CPU
//! time, and a third of a millisecond per stage at `--parallelism 2`: bench/README.md,
//! "Containment"). So a v1 cgroup set whose attempt has ended goes back to the executor's
//! [`CgroupPool`] when it is empty (its processes are gone, which a PID namespace
//! guarantees once the first one is reaped) and holds at most [`LEFTOVER`] of charged
//! memory (what its stage left in the page cache), with its peak reset. The next attempt
//! takes it, writes only the limits that differ from the last ones, and counts its CPU
//! time, OOM kills and refused forks from what the cgroup had counted before. A set that
//! is not empty, was cancelled, or is v2 (whose `memory.peak` cannot be reset before Linux
//! 6.12) is removed as before. The pool's sets are removed with the executor, and those of
//! an engine that died go when the next engine starts ([`engine_dir`]).

use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use drivetrain_engine::plan::Resources;

use super::cgroups::{engine_dir, Cgroups, PIDS_MAX};

/// The most memory a v1 cgroup may still have charged to it when its attempt ends and
/// be reused: the next attempt's peak can read this much more than it used. Not less: what
/// the kernel frees after the attempt's namespaces close is still charged for a moment
/// (with 1 MiB, a third of the runs of the reuse test found more and made a new cgroup).
pub const LEFTOVER: u64 = 8 << 20;

/// What an attempt used, from its cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub peak_memory_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    /// Processes the kernel killed for the memory limit.
    pub oom_kills: u64,
    /// `fork`s refused at the pids limit.
    pub forks_refused: u64,
}

/// The executor's cgroup sets whose attempts have ended, ready for the next ones.
#[derive(Debug, Default)]
pub struct CgroupPool {
    free: Mutex<Vec<Set>>,
    made: AtomicU64,
}

/// The limits an attempt's `resources` ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Limits {
    memory: Option<u64>,
    /// CPU time per 100 ms period, in µs.
    cpu_quota: Option<u64>,
    pids: Option<u64>,
}

impl Limits {
    fn of(resources: &Resources) -> Limits {
        let pids = std::env::var("DRIVETRAIN_PIDS_MAX")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(PIDS_MAX);
        Limits {
            memory: resources.memory.as_ref().map(|q| q.value as u64),
            cpu_quota: resources
                .cpu
                .as_ref()
                .map(|q| ((q.value * 100_000.0).ceil() as u64).max(1000)),
            pids: Some(pids),
        }
    }
}

/// Counters a cgroup keeps across attempts.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    cpu_ns: u64,
    oom_kills: u64,
    forks_refused: u64,
}

/// The cgroups one attempt at a time is in: `memory`, `pids` and `cpuacct` (v1), or one
/// directory (v2).
#[derive(Debug)]
struct Set {
    dirs: Vec<PathBuf>,
    /// `tasks` (v1) or `cgroup.procs` (v2) of each, open for the child to join by writing `0`.
    procs: Vec<OwnedFd>,
    memory: Option<PathBuf>,
    cpu: Option<PathBuf>,
    pids: Option<PathBuf>,
    v2: bool,
    /// The limits as last written (a new cgroup has none).
    limits: Limits,
    /// What the cgroups had counted before this attempt.
    before: Counters,
}

/// One attempt's cgroups: taken from the pool (or made) before it starts, given back (or
/// removed) when it is dropped.
pub(super) struct AttemptCgroup {
    set: Option<Set>,
    /// The v1 `cpu` cgroup of a quota: this attempt's alone, removed with it.
    quota: Option<(PathBuf, OwnedFd)>,
    pool: Weak<CgroupPool>,
    /// The counters when the attempt ended ([`AttemptCgroup::usage`]): the next
    /// attempt's starting point.
    ended: Option<Counters>,
}

impl CgroupPool {
    /// Cgroups for the attempt named `name` with `resources`' limits: a set of the pool's
    /// when one is free, else a new one.
    pub(super) fn take(
        self: &Arc<Self>,
        host: &Cgroups,
        name: &str,
        resources: &Resources,
    ) -> std::io::Result<Option<AttemptCgroup>> {
        if !host.active() {
            return Ok(None);
        }
        let limits = Limits::of(resources);
        let reused = loop {
            let Some(mut set) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                break None;
            };
            match set.limit(&limits) {
                Ok(()) => break Some(set),
                // A limit under what the cgroup still holds, say: a new one instead.
                Err(_) => set.remove(),
            }
        };
        let set = match reused {
            Some(set) => set,
            None => {
                let n = self.made.fetch_add(1, Ordering::Relaxed);
                let mut set = Set::make(host, &format!("slot-{n}"))?;
                if let Err(e) = set.limit(&limits) {
                    set.remove();
                    return Err(e);
                }
                set
            }
        };
        let mut made = AttemptCgroup {
            set: Some(set),
            quota: None,
            pool: Arc::downgrade(self),
            ended: None,
        };
        // v1's `cpu` hierarchy only for a quota (one cgroup less per attempt without).
        if let (
            Cgroups::V1 {
                cpu: Some(parent), ..
            },
            Some(quota),
        ) = (host, limits.cpu_quota)
        {
            let dir = engine_dir(parent).join(safe_name(name));
            std::fs::create_dir_all(&dir)?;
            let joinable = std::fs::write(dir.join("cpu.cfs_period_us"), "100000")
                .and_then(|()| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
                .and_then(|()| open_tasks(&dir));
            match joinable {
                Ok(tasks) => made.quota = Some((dir, tasks)),
                Err(e) => {
                    remove_dirs(vec![dir]);
                    return Err(e);
                }
            }
        }
        Ok(Some(made))
    }
}

impl Drop for CgroupPool {
    fn drop(&mut self) {
        for set in self
            .free
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            set.remove();
        }
    }
}

/// A name the kernel takes for a cgroup directory.
fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `tasks`, not `cgroup.procs`: the child moves only itself (its one thread), which the
/// kernel does without the global `cgroup_threadgroup_rwsem` and its RCU grace period
/// (bench/cgroup_migration.py: ~0.1 ms, not ~8 ms).
fn open_tasks(dir: &std::path::Path) -> std::io::Result<OwnedFd> {
    let tasks = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("tasks"))?;
    Ok(tasks.into())
}

impl Set {
    /// New cgroups named `name` under the engine's, in every hierarchy but v1's `cpu`.
    fn make(host: &Cgroups, name: &str) -> std::io::Result<Set> {
        let mut set = Set {
            dirs: Vec::new(),
            procs: Vec::new(),
            memory: None,
            cpu: None,
            pids: None,
            v2: false,
            limits: Limits::default(),
            before: Counters::default(),
        };
        let made = set.make_in(host, name);
        match made {
            Ok(()) => Ok(set),
            Err(e) => {
                set.remove();
                Err(e)
            }
        }
    }

    fn make_in(&mut self, host: &Cgroups, name: &str) -> std::io::Result<()> {
        match host {
            Cgroups::None(_) => Err(std::io::Error::other("no cgroups here")),
            Cgroups::V1 {
                memory,
                pids,
                cpuacct,
                ..
            } => {
                let mut mk = |parent: &Option<PathBuf>| -> std::io::Result<Option<PathBuf>> {
                    let Some(parent) = parent else {
                        return Ok(None);
                    };
                    let dir = engine_dir(parent).join(name);
                    std::fs::create_dir_all(&dir)?;
                    self.dirs.push(dir.clone());
                    self.procs.push(open_tasks(&dir)?);
                    Ok(Some(dir))
                };
                let memory = mk(memory)?;
                let pids = mk(pids)?;
                let cpu = mk(cpuacct)?;
                (self.memory, self.pids, self.cpu) = (memory, pids, cpu);
                Ok(())
            }
            Cgroups::V2 { dir: base, subtree } => {
                // This engine's directory hands the controllers on to its attempts too.
                let engine = engine_dir(base);
                static ENABLED: std::sync::OnceLock<std::io::Result<()>> =
                    std::sync::OnceLock::new();
                if let Err(e) = ENABLED.get_or_init(|| {
                    std::fs::create_dir_all(&engine)?;
                    std::fs::write(engine.join("cgroup.subtree_control"), subtree)
                }) {
                    return Err(std::io::Error::new(e.kind(), e.to_string()));
                }
                let dir = engine.join(name);
                std::fs::create_dir_all(&dir)?;
                self.dirs.push(dir.clone());
                let procs = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))?;
                self.procs.push(procs.into());
                self.memory = Some(dir.clone());
                self.cpu = Some(dir.clone());
                self.pids = Some(dir);
                self.v2 = true;
                Ok(())
            }
        }
    }

    /// Writes the limits of `to` that differ from those written last.
    fn limit(&mut self, to: &Limits) -> std::io::Result<()> {
        let write = |dir: &Option<PathBuf>, file: &str, value: &str| match dir {
            Some(dir) => std::fs::write(dir.join(file), value),
            None => Ok(()),
        };
        let was = self.limits;
        if self.v2 {
            if was.memory != to.memory {
                let (max, swap) = match to.memory {
                    Some(bytes) => (bytes.to_string(), "0"),
                    None => ("max".to_string(), "max"),
                };
                write(&self.memory, "memory.max", &max)?;
                let _ = write(&self.memory, "memory.swap.max", swap);
            }
            if was.pids != to.pids {
                let max = to.pids.map_or("max".into(), |p| p.to_string());
                let _ = write(&self.pids, "pids.max", &max);
            }
            if was.cpu_quota != to.cpu_quota {
                let quota = to.cpu_quota.map_or("max".into(), |q| q.to_string());
                let _ = write(&self.cpu, "cpu.max", &format!("{quota} 100000"));
            }
        } else {
            if was.memory != to.memory {
                // The memory+swap limit is never under the memory limit: lifted first,
                // then set to it (no swap instead of the limit, where the host accounts
                // swap; a host that does not has no such file).
                let _ = write(&self.memory, "memory.memsw.limit_in_bytes", "-1");
                let bytes = to.memory.map_or("-1".into(), |b| b.to_string());
                write(&self.memory, "memory.limit_in_bytes", &bytes)?;
                if to.memory.is_some() {
                    let _ = write(&self.memory, "memory.memsw.limit_in_bytes", &bytes);
                }
            }
            if was.pids != to.pids {
                let max = to.pids.map_or("max".into(), |p| p.to_string());
                write(&self.pids, "pids.max", &max)?;
            }
        }
        self.limits = Limits {
            cpu_quota: if self.v2 { to.cpu_quota } else { None },
            ..*to
        };
        Ok(())
    }

    /// Whether the set can serve another attempt: no process left in it, no more than
    /// [`LEFTOVER`] charged to it; its peak is then reset.
    fn reset(&self) -> bool {
        if self.v2 {
            return false;
        }
        let read = |dir: &Option<PathBuf>, file: &str| {
            dir.as_ref()
                .and_then(|d| std::fs::read_to_string(d.join(file)).ok())
        };
        let empty = match &self.pids {
            Some(_) => read(&self.pids, "pids.current").is_some_and(|n| n.trim() == "0"),
            None => self.dirs.first().is_some_and(|d| {
                std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| p.is_empty())
            }),
        };
        if !empty {
            return false;
        }
        let Some(memory) = &self.memory else {
            return true;
        };
        let charged =
            read(&self.memory, "memory.usage_in_bytes").and_then(|u| u.trim().parse::<u64>().ok());
        charged.is_some_and(|c| c <= LEFTOVER)
            && std::fs::write(memory.join("memory.max_usage_in_bytes"), "0").is_ok()
    }

    /// Removes the cgroups; one that still holds a process (a kill not yet through) is
    /// retried for a moment on a thread of its own, off the run loop's path, and one left
    /// then goes when the next engine starts ([`engine_dir`]).
    fn remove(mut self) {
        self.procs.clear();
        remove_dirs(std::mem::take(&mut self.dirs));
    }
}

fn remove_dirs(mut dirs: Vec<PathBuf>) {
    // Empty as soon as its processes are reaped, as a rule: removed here and now.
    dirs.retain(|d| std::fs::remove_dir(d).is_err() && d.exists());
    if dirs.is_empty() {
        return;
    }
    let remove = move || {
        for dir in dirs.iter().rev() {
            for _ in 0..500 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    _ => break,
                }
            }
        }
    };
    if std::thread::Builder::new()
        .name("cgroup-rmdir".into())
        .spawn(remove.clone())
        .is_err()
    {
        remove();
    }
}

impl AttemptCgroup {
    fn set(&self) -> &Set {
        self.set.as_ref().expect("taken only when dropped")
    }

    /// The descriptors the child writes `0` to, joining every cgroup of the attempt.
    pub(super) fn procs(&self) -> Vec<RawFd> {
        let set = self.set();
        set.procs
            .iter()
            .chain(self.quota.as_ref().map(|(_, fd)| fd))
            .map(|f| f.as_raw_fd())
            .collect()
    }

    /// The file listing the attempt's processes now (host pids): `cgroup.procs` of its
    /// memory (else pids) cgroup.
    pub(super) fn members(&self) -> Option<PathBuf> {
        let set = self.set();
        let dir = set.memory.as_ref().or(set.pids.as_ref())?;
        Some(dir.join("cgroup.procs"))
    }

    /// The pids limit this attempt has.
    pub(super) fn pids_max(&self) -> Option<String> {
        let set = self.set();
        set.pids.as_ref()?;
        set.limits.pids.map(|p| p.to_string())
    }

    /// What the attempt used, read once it has ended.
    pub(super) fn usage(&mut self) -> Usage {
        let set = self.set();
        let read = |dir: &Option<PathBuf>, file: &str| {
            dir.as_ref()
                .and_then(|d| std::fs::read_to_string(d.join(file)).ok())
                .unwrap_or_default()
        };
        let field = |text: &str, key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok())?
            })
        };
        let forks_refused = field(&read(&set.pids, "pids.events"), "max").unwrap_or(0);
        let (peak, cpu_ns, oom_kills) = if set.v2 {
            let cpu = read(&set.cpu, "cpu.stat");
            (
                read(&set.memory, "memory.peak").trim().parse().ok(),
                field(&cpu, "usage_usec").map(|us| us * 1000),
                field(&read(&set.memory, "memory.events"), "oom_kill").unwrap_or(0),
            )
        } else {
            (
                read(&set.memory, "memory.max_usage_in_bytes")
                    .trim()
                    .parse()
                    .ok(),
                read(&set.cpu, "cpuacct.usage").trim().parse::<u64>().ok(),
                field(&read(&set.memory, "memory.oom_control"), "oom_kill").unwrap_or(0),
            )
        };
        let before = set.before;
        self.ended = Some(Counters {
            cpu_ns: cpu_ns.unwrap_or(0),
            oom_kills,
            forks_refused,
        });
        Usage {
            peak_memory_bytes: peak,
            cpu_seconds: cpu_ns.map(|ns| ns.saturating_sub(before.cpu_ns) as f64 / 1e9),
            oom_kills: oom_kills.saturating_sub(before.oom_kills),
            forks_refused: forks_refused.saturating_sub(before.forks_refused),
        }
    }
}

impl Drop for AttemptCgroup {
    /// Gives the set back to the pool when it can serve another attempt, else removes it.
    fn drop(&mut self) {
        if let Some((dir, fd)) = self.quota.take() {
            drop(fd);
            remove_dirs(vec![dir]);
        }
        let Some(mut set) = self.set.take() else {
            return;
        };
        if let (Some(ended), Some(pool)) = (self.ended, self.pool.upgrade()) {
            if set.reset() {
                set.before = ended;
                pool.free
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(set);
                return;
            }
        }
        set.remove();
    }
}
