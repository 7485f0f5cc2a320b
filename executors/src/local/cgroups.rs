//! The host's cgroups: where the engine makes its attempts' (`attempt_cgroup.rs`).
//!
//! Each attempt gets a cgroup of its own under the engine's, in each hierarchy it needs:
//! v1 controllers (`memory`, `pids`, `cpu`, `cpuacct`) where the host mounts them (this
//! machine and CI do), else the v2 unified hierarchy with those controllers enabled for
//! the engine's subtree. Limits come from the stage: `memory` → `memory.limit_in_bytes`
//! (v1) or `memory.max` with no swap (v2); `cpu` → a CFS quota of that many cores per
//! 100 ms period; every attempt gets a `pids` limit ([`PIDS_MAX`], or
//! `DRIVETRAIN_PIDS_MAX`), so a fork storm ends at the limit, not at the host's. The
//! child joins before it execs (it writes `0` to descriptors of v1's `tasks` or v2's
//! //! `cgroup.procs` the engine opened), so nothing of the stage runs outside. When the
//! attempt ends the engine reads the kernel's OOM-kill count, peak memory and CPU time,
//! and keeps the cgroups for the next attempt or removes them.
//!
//! Where the host gives none of this (no controllers, not permitted), [`Cgroups::detect`]
//! says why once; `doctor` and every run that asked for `resources` say so.

use std::path::{Path, PathBuf};

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

/// This engine's directory under `parent` (`drivetrain/PID-NS`: its pid and its PID
/// namespace's inode), made once; the first time, the directories of engines of the same
/// PID namespace no longer running are removed with what is left in them. An engine of
/// another PID namespace (a container's, a test's) is not judged by a pid that means
/// something else here: its pooled, empty cgroups were removed under it (`ENODEV` when
/// its next attempt joined one).
pub(super) fn engine_dir(parent: &Path) -> PathBuf {
    static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let base = parent.join("drivetrain");
    let ns = pid_namespace();
    let mine = base.join(format!("{}-{ns}", std::process::id()));
    let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
    if !swept.contains(&base) {
        swept.push(base.clone());
        for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // `PID` alone: an engine of an earlier drivetrain, judged as before.
            let (pid, theirs) = name.split_once('-').unwrap_or((&name, &ns));
            let Ok(pid) = pid.parse::<i32>() else {
                continue;
            };
            let alive = Path::new(&format!("/proc/{pid}")).exists();
            if theirs == ns && !alive {
                remove_tree(&entry.path());
            }
        }
    }
    mine
}

/// The inode of this process's PID namespace (`/proc/self/ns/pid` is `pid:[INODE]`),
/// read once.
fn pid_namespace() -> String {
    static NS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("pid:[")?.strip_suffix(']')?.to_owned())
            })
            .unwrap_or_default()
    })
    .clone()
}

/// Removes an empty cgroup and its children (cgroup directories hold no files to delete).
pub(super) fn remove_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}
