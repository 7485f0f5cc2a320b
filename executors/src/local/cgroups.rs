//! `resources:` enforced on a local attempt through cgroups, and what it used.
//!
//! Each attempt gets a cgroup of its own under the engine's, in each hierarchy it needs:
//! v1 controllers (`memory`, `pids`, `cpu`, `cpuacct`) where the host mounts them (this
//! machine and CI do), else the v2 unified hierarchy with those controllers enabled for
//! the engine's subtree. Limits come from the stage: `memory` → `memory.limit_in_bytes`
//! (v1) or `memory.max` with no swap (v2); `cpu` → a CFS quota of that many cores per
//! 100 ms period; every attempt gets a `pids` limit ([`PIDS_MAX`], or
//! `DRIVETRAIN_PIDS_MAX`), so a fork storm ends at the limit, not at the host's. The
//! child joins before it execs (it writes `0` to descriptors of v1's `tasks` or v2's
//! `cgroup.procs` the engine opened), so nothing of the stage runs outside. When the attempt ends the engine reads
//! the kernel's OOM-kill count, peak memory and CPU time, then removes the cgroups.
//!
//! Where the host gives none of this (no controllers, not permitted), [`Cgroups::detect`]
//! says why once; `doctor` and every run that asked for `resources` say so.

use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use drivetrain_engine::plan::Resources;

/// Processes (and threads) an attempt may have at once unless `DRIVETRAIN_PIDS_MAX` says.
pub const PIDS_MAX: u64 = 4096;

/// Where the engine makes its attempts' cgroups.
#[derive(Debug, Clone)]
pub enum Cgroups {
    /// One directory per v1 controller: the engine's own cgroup in that hierarchy.
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    /// The engine's cgroup in the unified hierarchy, and the controllers its children get
    /// (a `cgroup.subtree_control` line: `+memory +pids +cpu`).
    V2 { dir: PathBuf, subtree: String },
    /// None here, and why.
    None(String),
}

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

impl Cgroups {
    /// This host's cgroups, found once.
    pub fn host() -> &'static Cgroups {
        static HOST: std::sync::OnceLock<Cgroups> = std::sync::OnceLock::new();
        HOST.get_or_init(|| {
            let found = Cgroups::detect();
            if let Cgroups::None(why) = &found {
                tracing::warn!("no cgroups for stages here: {why}; `resources` are not enforced");
            }
            found
        })
    }

    /// Reads `/proc/self/mountinfo` and `/proc/self/cgroup`; v1 when it has `memory`.
    pub fn detect() -> Cgroups {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        // What is mounted where, the last mount on a path hiding those before it.
        let mut mounts: Vec<(&str, &str, &str)> = Vec::new();
        for l in mountinfo.lines() {
            let Some((left, right)) = l.split_once(" - ") else {
                continue;
            };
            let mut r = right.split_whitespace();
            let (Some(fstype), Some(_), Some(options), Some(point)) =
                (r.next(), r.next(), r.next(), left.split_whitespace().nth(4))
            else {
                continue;
            };
            mounts.retain(|(p, _, _)| *p != point);
            mounts.push((point, fstype, options));
        }
        let v1 = |controller: &str| -> Option<PathBuf> {
            let mount = mounts.iter().find_map(|(point, fstype, options)| {
                (*fstype == "cgroup" && options.split(',').any(|o| o == controller))
                    .then(|| PathBuf::from(point))
            })?;
            let path = own.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then_some(path)
            })?;
            let dir = mount.join(path.trim_start_matches('/'));
            writable(&dir).then_some(dir)
        };
        let memory = v1("memory");
        if memory.is_some() {
            return Cgroups::V1 {
                memory,
                pids: v1("pids"),
                cpu: v1("cpu"),
                cpuacct: v1("cpuacct"),
            };
        }
        let unified = mounts
            .iter()
            .find_map(|(point, fstype, _)| (*fstype == "cgroup2").then(|| PathBuf::from(point)));
        let Some(unified) = unified else {
            return Cgroups::None("no cgroup hierarchy is mounted".into());
        };
        let path = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/");
        let dir = unified.join(path.trim_start_matches('/'));
        let controllers =
            std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Cgroups::None(format!(
                "the memory controller is not delegated to {}",
                dir.display()
            ));
        }
        let wanted: Vec<String> = ["memory", "pids", "cpu"]
            .into_iter()
            .filter(|c| controllers.split_whitespace().any(|x| x == *c))
            .map(|c| format!("+{c}"))
            .collect();
        let subtree = wanted.join(" ");
        match v2_delegate(&dir, &subtree) {
            Ok(()) => Cgroups::V2 { dir, subtree },
            Err(why) => Cgroups::None(why),
        }
    }

    /// Whether attempts get cgroups here.
    pub fn active(&self) -> bool {
        !matches!(self, Cgroups::None(_))
    }

    /// Which of the controllers attempts need (`memory`, `pids`, `cpu`) these cgroups do
    /// not have (a v2 parent may delegate only some; a v1 host may not mount one).
    pub fn lacking(&self) -> Vec<&'static str> {
        let has = |c: &str| match self {
            Cgroups::V1 {
                memory, pids, cpu, ..
            } => match c {
                "memory" => memory.is_some(),
                "pids" => pids.is_some(),
                _ => cpu.is_some(),
            },
            Cgroups::V2 { subtree, .. } => subtree.split_whitespace().any(|x| x == format!("+{c}")),
            Cgroups::None(_) => false,
        };
        ["memory", "pids", "cpu"]
            .into_iter()
            .filter(|c| !has(c))
            .collect()
    }
}

/// What goes unenforced without each of the `lacking` controllers, for people.
pub(super) fn unenforced(lacking: &[&str]) -> String {
    lacking
        .iter()
        .map(|c| match *c {
            "pids" => "no limit on an attempt's processes",
            "memory" => "`resources.memory` is not enforced",
            _ => "`resources.cpu` is not enforced",
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes the engine's v2 cgroup `dir` hand `subtree` to the attempts' cgroups under
/// `dir/drivetrain/`. cgroup v2 enables controllers for a cgroup's children only while it
/// holds no process itself ("no internal processes"), so an engine alone in its cgroup (a
/// systemd unit with `Delegate=yes`, a container's engine) first moves into a leaf of it,
/// `drivetrain-engine.PID`, as runc and systemd do; one that shares its cgroup with other
/// processes says so instead of moving them.
fn v2_delegate(dir: &Path, subtree: &str) -> Result<(), String> {
    let enable = |d: &Path| std::fs::write(d.join("cgroup.subtree_control"), subtree);
    let me = std::process::id();
    // Leaves of engines that are gone.
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("drivetrain-engine.") {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
    // The engine's own children (a probe, a stage not yet in its cgroup) go along.
    let ours = |pid: u32| pid == me || parent_of(pid) == Some(me);
    let leaf = dir.join(format!("drivetrain-engine.{me}"));
    for _ in 0..20 {
        match enable(dir) {
            Ok(()) => break,
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {}
            Err(e) => {
                return Err(format!(
                    "cannot enable controllers under {}: {e}",
                    dir.display()
                ))
            }
        }
        let procs: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let others = procs.iter().filter(|p| !ours(**p)).count();
        if others > 0 {
            return Err(format!(
                "the engine's cgroup {} holds {others} other process(es), and cgroup v2 gives \
                 controllers to a cgroup's children only once it holds none: run the engine \
                 in a cgroup of its own (a systemd unit with Delegate=yes)",
                dir.display()
            ));
        }
        std::fs::create_dir_all(&leaf)
            .map_err(|e| format!("cannot make {} for the engine: {e}", leaf.display()))?;
        for pid in procs {
            // A child that has ended meanwhile is no error.
            let _ = std::fs::write(leaf.join("cgroup.procs"), pid.to_string());
        }
    }
    if let Err(e) = enable(dir) {
        return Err(format!(
            "cannot enable controllers under {} (the engine moved into {}): {e}",
            dir.display(),
            leaf.display()
        ));
    }
    let base = dir.join("drivetrain");
    std::fs::create_dir_all(&base)
        .and_then(|()| enable(&base))
        .map_err(|e| format!("cannot enable controllers under {}: {e}", base.display()))
}

/// The parent of process `pid`, from `/proc/PID/stat` (its fourth field, after the name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// One attempt's cgroups: made before it starts, removed when it has ended.
pub(super) struct AttemptCgroup {
    dirs: Vec<PathBuf>,
    /// `tasks` (v1) or `cgroup.procs` (v2) of each, open for the child to join by writing `0`.
    procs: Vec<OwnedFd>,
    memory: Option<PathBuf>,
    cpu: Option<PathBuf>,
    pids: Option<PathBuf>,
    v2: bool,
}

impl AttemptCgroup {
    /// Makes the attempt's cgroups named `name` and sets `resources`' limits.
    pub(super) fn create(
        host: &Cgroups,
        name: &str,
        resources: &Resources,
    ) -> std::io::Result<Option<AttemptCgroup>> {
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let pids_max = std::env::var("DRIVETRAIN_PIDS_MAX")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(PIDS_MAX);
        let memory = resources.memory.as_ref().map(|q| q.value as u64);
        let cpu_quota = resources
            .cpu
            .as_ref()
            .map(|q| ((q.value * 100_000.0).ceil() as u64).max(1000));
        let mut made = AttemptCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            memory: None,
            cpu: None,
            pids: None,
            v2: false,
        };
        let mut mk = |parent: &Path| -> std::io::Result<PathBuf> {
            let dir = engine_dir(parent).join(&name);
            std::fs::create_dir_all(&dir)?;
            made.dirs.push(dir.clone());
            // `tasks`, not `cgroup.procs`: the child moves only itself (its one thread),
            // which the kernel does without the global `cgroup_threadgroup_rwsem` and
            // its RCU grace period (bench/cgroup_migration.py: ~0.1 ms, not ~8 ms).
            let tasks = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("tasks"))?;
            made.procs.push(tasks.into());
            Ok(dir)
        };
        match host {
            Cgroups::None(_) => return Ok(None),
            Cgroups::V1 {
                memory: mem,
                pids,
                cpu,
                cpuacct,
            } => {
                if let Some(parent) = mem {
                    let dir = mk(parent)?;
                    if let Some(bytes) = memory {
                        std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())?;
                        // No swap instead of the limit, where the host has swap accounting.
                        let _ = std::fs::write(
                            dir.join("memory.memsw.limit_in_bytes"),
                            bytes.to_string(),
                        );
                    }
                    made.memory = Some(dir);
                }
                if let Some(parent) = pids {
                    let dir = mk(parent)?;
                    std::fs::write(dir.join("pids.max"), pids_max.to_string())?;
                    made.pids = Some(dir);
                }
                // The cpu hierarchy only for a quota (one cgroup less to make per attempt).
                if let (Some(parent), Some(quota)) = (cpu, cpu_quota) {
                    let dir = mk(parent)?;
                    std::fs::write(dir.join("cpu.cfs_period_us"), "100000")?;
                    std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
                }
                if let Some(parent) = cpuacct {
                    made.cpu = Some(mk(parent)?);
                }
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
                let dir = engine.join(&name);
                std::fs::create_dir_all(&dir)?;
                made.dirs.push(dir.clone());
                if let Some(bytes) = memory {
                    std::fs::write(dir.join("memory.max"), bytes.to_string())?;
                    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                }
                let _ = std::fs::write(dir.join("pids.max"), pids_max.to_string());
                if let Some(quota) = cpu_quota {
                    let _ = std::fs::write(dir.join("cpu.max"), format!("{quota} 100000"));
                }
                let procs = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))?;
                made.procs.push(procs.into());
                made.memory = Some(dir.clone());
                made.cpu = Some(dir.clone());
                made.pids = Some(dir);
                made.v2 = true;
            }
        }
        Ok(Some(made))
    }

    /// The descriptors the child writes `0` to, joining every cgroup of the attempt.
    pub(super) fn procs(&self) -> Vec<RawFd> {
        self.procs.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// The file listing the attempt's processes now (host pids): `cgroup.procs` of its
    /// memory (else pids) cgroup.
    pub(super) fn members(&self) -> Option<PathBuf> {
        let dir = self.memory.as_ref().or(self.pids.as_ref())?;
        Some(dir.join("cgroup.procs"))
    }

    /// The pids limit this attempt has.
    pub(super) fn pids_max(&self) -> Option<String> {
        let dir = self.pids.as_ref()?;
        std::fs::read_to_string(dir.join("pids.max"))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// What the attempt used, read once it has ended.
    pub(super) fn usage(&self) -> Usage {
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
        let forks_refused = field(&read(&self.pids, "pids.events"), "max").unwrap_or(0);
        if self.v2 {
            let cpu = read(&self.cpu, "cpu.stat");
            Usage {
                peak_memory_bytes: read(&self.memory, "memory.peak").trim().parse().ok(),
                cpu_seconds: field(&cpu, "usage_usec").map(|us| us as f64 / 1e6),
                oom_kills: field(&read(&self.memory, "memory.events"), "oom_kill").unwrap_or(0),
                forks_refused,
            }
        } else {
            Usage {
                peak_memory_bytes: read(&self.memory, "memory.max_usage_in_bytes")
                    .trim()
                    .parse()
                    .ok(),
                cpu_seconds: read(&self.cpu, "cpuacct.usage")
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|ns| ns as f64 / 1e9),
                oom_kills: field(&read(&self.memory, "memory.oom_control"), "oom_kill")
                    .unwrap_or(0),
                forks_refused,
            }
        }
    }
}

impl Drop for AttemptCgroup {
    /// Removes the cgroups; one that still holds a process (a kill not yet through) is
    /// retried for a moment on a thread of its own, off the run loop's path, and one left
    /// then goes when the next engine starts ([`engine_dir`]).
    fn drop(&mut self) {
        self.procs.clear();
        let mut dirs = std::mem::take(&mut self.dirs);
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
}

/// This engine's directory under `parent` (`drivetrain/PID`), made once; the first time,
/// the directories of engines no longer running are removed with what is left in them.
fn engine_dir(parent: &Path) -> PathBuf {
    static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let base = parent.join("drivetrain");
    let mine = base.join(std::process::id().to_string());
    let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
    if !swept.contains(&base) {
        swept.push(base.clone());
        for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok();
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if pid.is_some() && !alive {
                remove_tree(&entry.path());
            }
        }
    }
    mine
}

/// Removes an empty cgroup and its children (cgroup directories hold no files to delete).
fn remove_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}
