//! The local executor: each attempt is a child process in its own process group.
//!
//! argv goes to `execve` as it is (no shell). The child gets the engine's `PATH`, `HOME`,
//! `LANG` and `TZ` and the attempt's environment, nothing else; stdout and stderr both go
//! to the attempt's log file. Cancelling (a timeout, a user's cancel) kills the whole
//! group, and so does a normal exit, so nothing a stage started outlives it.
//! `distributed: {workers: N}` starts N ranks in one group with the rendezvous environment
//! torchrun and Horovod read ([`Rank::env`]); when one rank fails, the others are killed
//! (gang semantics). A stage without `distributed:` is a world of one with the same
//! variables, so `init_process_group(init_method="env://")` works there too.
//!
//! Each attempt also gets a private mount namespace (as root, or through an unprivileged
//! user namespace where the kernel allows one) in which the paths of
//! [`AttemptSpec::access`] are bind-mounted read-only or writable: the store and the
//! engine's home are read-only, the attempt's own directory and outputs writable, its
//! inputs read-only again. A stage then cannot change an artifact even through the hard
//! links its inputs are, not with `chmod`, not by writing into the store directly. Where no
//! namespace can be had, attempts run without one ([`Isolation::Auto`]) and the run loop's
//! check of every input against its manifest still catches a write.
//!
//! An isolated attempt cannot undo its mounts: before `exec` it loses every capability
//! but Docker's default set less `CAP_MKNOD` ([`KEPT_CAPS`]) from its bounding, inheritable
//! and ambient sets, and gets `no_new_privs`. A stage the root engine starts is still uid
//! 0, but without `CAP_SYS_ADMIN` it cannot unmount, remount or mount, nor `setns` into
//! another namespace, and without `CAP_SYS_PTRACE` it cannot reach `/proc/1/root`. It
//! also runs in a user namespace of its own (uid 0 mapped to 0), so `/proc/PID/root` of
//! no process outside it is open to it, not even of a root process with no capabilities
//! (which a stage with a superset of them could otherwise enter); where the kernel
//! refuses a user namespace to root, the mount namespace alone is made.

use std::ffi::{CStr, CString};
use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt as _;
use std::process::Stdio;

use async_trait::async_trait;
use drivetrain_engine::executor::{
    AttemptOutcome, AttemptSpec, Executor, ExecutorError, PathAccess, Rank, RunningAttempt,
};
use futures::FutureExt as _;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Runs attempts as local processes.
#[derive(Debug, Default, Clone)]
pub struct LocalExecutor {
    pub isolation: Isolation,
}

/// Whether attempts get a private mount namespace enforcing [`AttemptSpec::access`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Where the kernel allows one; otherwise without, and a warning once.
    #[default]
    Auto,
    /// Always: an attempt fails to start when no namespace can be had.
    Required,
    /// Never.
    Off,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "" => Ok(Isolation::Auto),
            "required" => Ok(Isolation::Required),
            "off" => Ok(Isolation::Off),
            other => Err(format!(
                "isolation `{other}` is not one of auto, required, off"
            )),
        }
    }
}

impl LocalExecutor {
    /// The executor configured from `DRIVETRAIN_ISOLATION` (`auto`, `required`, `off`).
    pub fn from_env() -> Result<Self, String> {
        Ok(LocalExecutor {
            isolation: std::env::var("DRIVETRAIN_ISOLATION")
                .unwrap_or_default()
                .parse()?,
        })
    }
}

/// Capabilities an isolated attempt keeps: Docker's default set for containers
/// (`CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW
/// SYS_CHROOT AUDIT_WRITE SETFCAP`) less `MKNOD`, which without a device cgroup would let
/// a root stage make a node for the disk under the store.
pub const KEPT_CAPS: &[u32] = &[0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31];

/// Drops every capability not in [`KEPT_CAPS`] from the bounding set (so `exec` cannot
/// give it back, even to uid 0), clears the inheritable and ambient sets, and sets
/// `no_new_privs`. Between `fork` and `exec`: system calls on stack memory only (which is
/// why this is not the `caps` crate: its errors allocate).
#[allow(unsafe_code)]
fn drop_capabilities() -> std::io::Result<()> {
    use nix::libc;
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    for cap in 0..64u32 {
        if KEPT_CAPS.contains(&cap) {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r < 0 {
            // EINVAL past the kernel's last capability: done.
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(std::io::Error::last_os_error());
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget/capset read and write the two structs above, sized for version 3.
    unsafe {
        check(libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) as libc::c_int)?;
        for d in &mut data {
            d.inheritable = 0;
        }
        check(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) as libc::c_int)?;
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

/// Everything the child needs to isolate itself, allocated before `fork` (the child may
/// only make system calls until it execs).
struct MountPlan {
    /// The user namespace the attempt enters first, mapping the engine's uid and gid to
    /// themselves (root included: a process in a child user namespace cannot reach
    /// `/proc/PID/root` of the engine's, whatever its uid and capabilities).
    user: [(CString, CString); 3],
    /// Root may go on without the user namespace where the kernel refuses one (a
    /// seccomp filter, a sysctl): it can make the mount namespace alone.
    root: bool,
    mounts: Vec<(CString, bool)>,
}

impl MountPlan {
    fn new(access: &[PathAccess]) -> std::io::Result<Self> {
        let uid = nix::unistd::geteuid();
        let gid = nix::unistd::getegid();
        let c = |s: String| CString::new(s).expect("no NUL");
        let user = [
            (c("/proc/self/setgroups".into()), c("deny".into())),
            (c("/proc/self/uid_map".into()), c(format!("{uid} {uid} 1"))),
            (c("/proc/self/gid_map".into()), c(format!("{gid} {gid} 1"))),
        ];
        let mut mounts = Vec::with_capacity(access.len());
        for a in access {
            let path = CString::new(a.path.as_os_str().as_bytes()).map_err(|_| {
                std::io::Error::other(format!("path {} has a NUL byte", a.path.display()))
            })?;
            mounts.push((path, a.writable));
        }
        Ok(MountPlan {
            user,
            root: uid.is_root(),
            mounts,
        })
    }

    /// In the child, between `fork` and `exec`: system calls only, no allocation.
    fn apply(&self) -> std::io::Result<()> {
        use nix::mount::{mount, MsFlags};
        use nix::sched::{unshare, CloneFlags};
        let none: Option<&CStr> = None;
        match unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS) {
            Ok(()) => {
                for (file, text) in &self.user {
                    let fd = nix::fcntl::open(
                        file.as_c_str(),
                        nix::fcntl::OFlag::O_WRONLY,
                        nix::sys::stat::Mode::empty(),
                    )?;
                    nix::unistd::write(&fd, text.as_bytes())?;
                }
            }
            Err(_) if self.root => unshare(CloneFlags::CLONE_NEWNS)?,
            Err(e) => return Err(e.into()),
        }
        // Nothing mounted here propagates back to the engine's namespace.
        mount(
            none,
            c"/",
            none,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            none,
        )?;
        for (path, writable) in &self.mounts {
            let p = path.as_c_str();
            mount(Some(p), p, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)?;
            let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT;
            if !writable {
                flags |= MsFlags::MS_RDONLY;
            }
            mount(none, p, none, flags, none)?;
        }
        drop_capabilities()
    }
}

/// Whether this process can give its children mount namespaces: found once, by starting
/// `true` in one.
pub fn namespaces_work() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let Ok(plan) = MountPlan::new(&[]) else {
            return false;
        };
        let mut cmd = std::process::Command::new("true");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: `apply` only makes system calls on memory allocated before the fork.
        #[allow(unsafe_code)]
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || plan.apply());
        }
        let works = cmd.status().map(|s| s.success()).unwrap_or(false);
        if !works {
            tracing::warn!(
                "no mount namespace for stages here (not root, and no unprivileged user namespaces): \
                 inputs are checked after each attempt instead of protected"
            );
        }
        works
    })
}

/// Environment variables the engine passes through to every stage.
const PASS_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];

struct Started {
    pgid: i32,
    children: Vec<(usize, Child)>,
    /// Set when the command could not be started (does not exist, not executable).
    failed_to_start: Option<String>,
    cancelled: bool,
}

fn kill_group(pgid: i32) {
    if pgid > 0 {
        // ESRCH (the group is gone) is the expected case after a clean exit.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

#[async_trait]
impl RunningAttempt for Started {
    fn handle(&self) -> String {
        format!("pgid:{}", self.pgid)
    }

    async fn wait(&mut self) -> AttemptOutcome {
        if let Some(reason) = self.failed_to_start.take() {
            return AttemptOutcome::Failed {
                exit_code: None,
                reason,
            };
        }
        let world = self.children.len();
        let mut failure: Option<AttemptOutcome> = None;
        while !self.children.is_empty() {
            // Wait for whichever rank ends first.
            let (idx, status) = {
                let mut waits = Vec::with_capacity(self.children.len());
                for (i, (_, child)) in self.children.iter_mut().enumerate() {
                    waits.push(async move { (i, child.wait().await) }.boxed());
                }
                futures::future::select_all(waits).await.0
            };
            let (rank, _) = self.children.remove(idx);
            let status = match status {
                Ok(s) => s,
                Err(e) => {
                    failure.get_or_insert(AttemptOutcome::Failed {
                        exit_code: None,
                        reason: format!("cannot wait for the process: {e}"),
                    });
                    kill_group(self.pgid);
                    continue;
                }
            };
            if self.cancelled {
                continue;
            }
            if !status.success() && failure.is_none() {
                use std::os::unix::process::ExitStatusExt;
                let who = if world > 1 {
                    format!("rank {rank} ")
                } else {
                    String::new()
                };
                let reason = match (status.code(), status.signal()) {
                    (Some(c), _) => format!("{who}exited with code {c}"),
                    (None, Some(sig)) => format!("{who}was killed by signal {sig}"),
                    _ => format!("{who}ended abnormally"),
                };
                failure = Some(AttemptOutcome::Failed {
                    exit_code: status.code(),
                    reason: if world > 1 {
                        format!("{reason}; the other ranks were stopped")
                    } else {
                        reason
                    },
                });
                // Gang semantics: one rank down stops them all.
                kill_group(self.pgid);
            }
        }
        // Whatever the stage left running in its group goes with it.
        kill_group(self.pgid);
        if self.cancelled {
            return AttemptOutcome::Cancelled;
        }
        failure.unwrap_or(AttemptOutcome::Succeeded)
    }

    async fn cancel(&mut self) {
        self.cancelled = true;
        kill_group(self.pgid);
        for (_, child) in &mut self.children {
            let _ = child.wait().await;
        }
        self.children.clear();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[async_trait]
impl Executor for LocalExecutor {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn reap(&self, handle: &str) -> bool {
        let Some(pgid) = handle
            .strip_prefix("pgid:")
            .and_then(|p| p.parse::<i32>().ok())
        else {
            return false;
        };
        if pgid <= 1 {
            return false;
        }
        killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok()
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        let Some(program) = spec.argv.first().cloned() else {
            return Err(ExecutorError("empty argv".into()));
        };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|e| ExecutorError(format!("cannot open log {}: {e}", spec.log.display())))?;
        let workers = spec
            .distributed
            .as_ref()
            .map(|d| d.workers as usize)
            .unwrap_or(1);
        // Every attempt gets a rendezvous port, a world of one too: a single-process
        // `torch.distributed` job initialises from the environment like any other.
        let port =
            free_port().map_err(|e| ExecutorError(format!("no free port for MASTER_PORT: {e}")))?;
        let framework = spec
            .distributed
            .as_ref()
            .map(|d| d.framework)
            .unwrap_or_default();
        let isolate = match self.isolation {
            Isolation::Off => false,
            _ if spec.access.is_empty() => false,
            Isolation::Auto => namespaces_work(),
            Isolation::Required => {
                if !namespaces_work() {
                    return Err(ExecutorError(
                        "isolation is required but this process cannot create mount namespaces"
                            .into(),
                    ));
                }
                true
            }
        };
        let plan = if isolate {
            Some(std::sync::Arc::new(
                MountPlan::new(&spec.access).map_err(|e| ExecutorError(e.to_string()))?,
            ))
        } else {
            None
        };
        let mut started = Started {
            pgid: 0,
            children: Vec::with_capacity(workers),
            failed_to_start: None,
            cancelled: false,
        };
        for rank in 0..workers {
            let out = log
                .try_clone()
                .map_err(|e| ExecutorError(format!("cannot share the log: {e}")))?;
            let err = log
                .try_clone()
                .map_err(|e| ExecutorError(format!("cannot share the log: {e}")))?;
            let mut cmd = Command::new(&program);
            cmd.args(&spec.argv[1..])
                .current_dir(&spec.workdir)
                .env_clear()
                .envs(
                    PASS_THROUGH
                        .iter()
                        .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))),
                )
                .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                // The first rank leads a new group; the others join it.
                .process_group(started.pgid);
            if let Some(plan) = &plan {
                let plan = plan.clone();
                // SAFETY: `apply` only makes system calls on memory allocated before the
                // fork.
                #[allow(unsafe_code)]
                unsafe {
                    cmd.pre_exec(move || plan.apply());
                }
            }
            // All ranks on this one machine: one node, local ranks = ranks.
            let place = Rank {
                rank: rank as u32,
                world: workers as u32,
                local_rank: rank as u32,
                local_world: workers as u32,
                node: 0,
                nodes: 1,
            };
            cmd.envs(place.env("127.0.0.1", port, framework));
            match cmd.spawn() {
                Ok(child) => {
                    if started.pgid == 0 {
                        started.pgid = child.id().map(|p| p as i32).unwrap_or(0);
                    }
                    started.children.push((rank, child));
                }
                Err(e) => {
                    kill_group(started.pgid);
                    started.failed_to_start = Some(match e.kind() {
                        std::io::ErrorKind::NotFound => format!(
                            "stage `{}`: command `{program}` not found (in {} or on PATH)",
                            spec.stage,
                            spec.workdir.display()
                        ),
                        std::io::ErrorKind::PermissionDenied => {
                            format!(
                                "stage `{}`: command `{program}` is not executable",
                                spec.stage
                            )
                        }
                        _ => format!("stage `{}`: cannot start `{program}`: {e}", spec.stage),
                    });
                    for (_, mut c) in started.children.drain(..) {
                        let _ = c.wait().await;
                    }
                    break;
                }
            }
        }
        Ok(Box::new(started))
    }
}
