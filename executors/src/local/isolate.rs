//! Isolating an attempt: its namespaces and mounts (see the executor's docs for every
//! layer) and the process that enters them, started without `fork`.
//!
//! `fork` copies the engine's page tables and makes each page the engine writes afterwards
//! a copy-on-write fault with a TLB shoot-down; the child then throws it all away at
//! `exec`. On a 1,000-stage fan-out that was most of the engine's time (a profile:
//! `copy_page_range`, `ptep_clear_flush`, `exit_mmap` under `begin_new_exec`), and it grows
//! with the engine's memory. [`spawn`] starts the child the way `posix_spawn` does
//! instead: `clone(CLONE_VM | CLONE_VFORK)` onto a stack of its own, this thread waiting
//! until the child has exec'ed or failed; the clone itself makes its PID, mount and
//! network namespaces (and, when the engine is not root, its user namespace). The child
//! resets signal handlers, joins the attempt's process group and cgroups, sets up stdio
//! and the working directory, mounts, enters the stage user namespace (a root engine's),
//! drops capabilities, installs its seccomp filter ([`MountPlan::apply`]) and execs.
//! Sharing the
//! engine's memory, it only makes system calls on what [`Launch`] prepared before the
//! clone, and reports a failure through [`Launch::failure`].
//!
//! A started child is a [`RawChild`]: waited for through a pidfd the runtime polls.
//!
//! Unsafe code lives here, each block with what makes it sound.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::sync::Arc;

use drivetrain_engine::executor::PathAccess;
use nix::libc;
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;

use super::{kernel, seccomp, userns};

/// Capabilities an isolated attempt keeps: Docker's default set for containers
/// (`CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW
/// SYS_CHROOT AUDIT_WRITE SETFCAP`) less `MKNOD`, which without a device cgroup would let
/// a root stage make a node for the disk under the store.
pub const KEPT_CAPS: &[u32] = &[0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31];

/// Drops every capability not in [`KEPT_CAPS`] from the bounding set (so `exec` cannot
/// give it back, even to uid 0), clears the inheritable and ambient sets, and sets
/// `no_new_privs`. Between the clone and `exec`: system calls on stack memory only (which is
/// why this is not the `caps` crate: its errors allocate).
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

/// Everything the child needs to isolate itself, allocated before the clone (the child may
/// only make system calls until it execs).
pub(super) struct MountPlan {
    user: Userns,
    /// A PID namespace of its own (a clone flag), with a `/proc` of its own: the stage
    /// sees and signals only its own processes, and they all end with its first one.
    pid: bool,
    /// A network namespace of its own with loopback only (`network: none`).
    pub(super) net: bool,
    /// `cgroup.procs` of each of the attempt's cgroups, which the child joins first.
    pub(super) cgroups: Vec<RawFd>,
    /// The system calls it may not make, installed last.
    seccomp: Option<&'static seccompiler::BpfProgram>,
    /// Its private `/dev`.
    pub(super) dev: kernel::Dev,
    mounts: Vec<Mount>,
    /// The writable paths given to the stage user, what stays the engine's under them,
    /// and the log: taken back when the attempt has ended ([`MountPlan::take_back`]).
    given: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    log: PathBuf,
}

/// The user namespace an attempt runs in.
enum Userns {
    /// The engine is not root: a new one (a clone flag), mapping the engine's uid and gid
    /// to themselves; the stage can do no more than the engine's user.
    Own([(CString, CString); 3]),
    /// The engine is root: the stage namespace ([`userns::stage_userns`]), entered once
    /// the mounts are made; the stage is host `nobody`.
    Stage(RawFd),
    /// None: root where the kernel refuses one, and isolation is not `required`.
    Host,
}

/// Which layers attempts get here: what the kernel gave the probes ([`available`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layers {
    pub mount: bool,
    pub user: bool,
    pub pid: bool,
    pub seccomp: bool,
}

/// One mount of an attempt's namespace, in the order they are made.
struct Mount {
    path: CString,
    writable: bool,
    kind: Kind,
}

enum Kind {
    /// Bound onto itself, then remounted read-only or writable.
    Bind,
    /// An empty read-only tmpfs over a directory.
    HideDir,
    /// An empty read-only file over a file: `.empty`, made in the tmpfs of a directory
    /// hidden before it (`/dev/null` where there is none: a device stays writable).
    HideFile { empty: Option<CString> },
    /// Under a hidden directory: its tree is captured (`open_tree`) before anything is
    /// hidden, and put back (`move_mount`) onto `dirs`, made in the tmpfs first.
    Reattach {
        dirs: Vec<CString>,
        /// The captured tree's descriptor, set by the child (the plan is shared memory
        /// with it, and its children start one at a time).
        fd: AtomicI32,
    },
}

impl MountPlan {
    /// The plan for an attempt that may reach `access`, with `layers`. `reach`: what its
    /// user must be able to get to (its program, `PATH`, working directory) where that is
    /// not the engine's user; `log`: the engine's log file, never given to the stage.
    pub(super) fn new(
        access: &[PathAccess],
        layers: Layers,
        reach: &[PathBuf],
        log: &Path,
    ) -> std::io::Result<Self> {
        let c = |s: String| CString::new(s).expect("no NUL");
        let user = match (layers.user, nix::unistd::geteuid().is_root()) {
            (false, _) => Userns::Host,
            (true, false) => {
                let uid = nix::unistd::geteuid();
                let gid = nix::unistd::getegid();
                Userns::Own([
                    (c("/proc/self/setgroups".into()), c("deny".into())),
                    (c("/proc/self/uid_map".into()), c(format!("{uid} {uid} 1"))),
                    (c("/proc/self/gid_map".into()), c(format!("{gid} {gid} 1"))),
                ])
            }
            (true, true) => match userns::stage_userns() {
                Some(fd) => Userns::Stage(fd),
                None => {
                    return Err(std::io::Error::other(refused(
                        "the kernel refused it a user namespace",
                    )))
                }
            },
        };
        let c_path = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::other(format!("path {} has a NUL byte", p.display())))
        };
        let mut mounts = Vec::with_capacity(access.len());
        let read_only: Vec<PathBuf> = access
            .iter()
            .filter(|a| !a.writable)
            .map(|a| a.path.clone())
            .collect();
        let mut given = Vec::new();
        if let Userns::Stage(_) = user {
            // The stage user owns what it may write, and can get to what it needs.
            let keep: Vec<&Path> = read_only.iter().map(PathBuf::as_path).collect();
            for a in access.iter().filter(|a| a.writable && !a.hidden) {
                userns::give(&a.path, &keep, log, (userns::STAGE_ID, userns::STAGE_ID))?;
                // Another attempt may be writing a shared path still: it stays given.
                if !a.shared {
                    given.push(a.path.clone());
                }
            }
            let targets: Vec<PathBuf> = reach
                .iter()
                .cloned()
                .chain(access.iter().filter(|a| !a.hidden).map(|a| a.path.clone()))
                .collect();
            let mut hidden: Vec<PathBuf> = Vec::new();
            for (dir, entry) in userns::closed_on_the_way(&targets) {
                if !hidden.contains(&dir) {
                    mounts.push(Mount {
                        path: c_path(&dir)?,
                        writable: false,
                        kind: Kind::HideDir,
                    });
                    hidden.push(dir);
                }
                mounts.push(Mount {
                    path: c_path(&entry)?,
                    writable: false,
                    kind: Kind::Reattach {
                        dirs: vec![c_path(&entry)?],
                        fd: AtomicI32::new(-1),
                    },
                });
            }
        }
        // Which hidden paths are directories, asked once each.
        let hidden_dir: Vec<bool> = access.iter().map(|a| a.hidden && a.path.is_dir()).collect();
        for (i, a) in access.iter().enumerate() {
            let earlier_dirs = || (0..i).filter(|&j| hidden_dir[j]).map(|j| &access[j].path);
            let under = earlier_dirs().find(|h| a.path.starts_with(h));
            let kind = match (a.hidden, under) {
                (true, _) if hidden_dir[i] => Kind::HideDir,
                (true, _) => Kind::HideFile {
                    empty: earlier_dirs()
                        .next()
                        .map(|h| c_path(&h.join(".empty")))
                        .transpose()?,
                },
                (false, Some(h)) => Kind::Reattach {
                    dirs: a
                        .path
                        .ancestors()
                        .take_while(|d| d.starts_with(h) && *d != h.as_path())
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .map(c_path)
                        .collect::<std::io::Result<_>>()?,
                    fd: AtomicI32::new(-1),
                },
                (false, None) => Kind::Bind,
            };
            mounts.push(Mount {
                path: c_path(&a.path)?,
                writable: a.writable,
                kind,
            });
        }
        Ok(MountPlan {
            user,
            pid: layers.pid,
            net: false,
            cgroups: Vec::new(),
            dev: kernel::Dev::new(&[], None, false),
            seccomp: if layers.seccomp {
                Some(seccomp::filter().map_err(std::io::Error::other)?)
            } else {
                None
            },
            mounts,
            given,
            read_only,
            log: log.to_path_buf(),
        })
    }

    /// Gives the engine back what the stage user was given, once no process of the
    /// attempt is left.
    pub(super) fn take_back(&self) -> std::io::Result<()> {
        let engine = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let keep: Vec<&Path> = self.read_only.iter().map(PathBuf::as_path).collect();
        for path in &self.given {
            userns::give(path, &keep, &self.log, engine)?;
        }
        Ok(())
    }

    /// The namespaces the child is cloned into.
    fn clone_flags(&self) -> nix::sched::CloneFlags {
        use nix::sched::CloneFlags;
        let mut flags = CloneFlags::CLONE_NEWNS;
        if self.pid {
            flags |= CloneFlags::CLONE_NEWPID;
        }
        if let Userns::Own(_) = self.user {
            flags |= CloneFlags::CLONE_NEWUSER;
        }
        if self.net {
            flags |= CloneFlags::CLONE_NEWNET;
        }
        flags
    }

    /// In the child, between the clone and `exec`: system calls only, no allocation.
    fn apply(&self) -> std::io::Result<()> {
        use nix::mount::{mount, MsFlags};
        let none: Option<&CStr> = None;
        if let Userns::Own(maps) = &self.user {
            for (file, text) in maps {
                let fd = nix::fcntl::open(
                    file.as_c_str(),
                    nix::fcntl::OFlag::O_WRONLY,
                    nix::sys::stat::Mode::empty(),
                )?;
                nix::unistd::write(&fd, text.as_bytes())?;
            }
        }
        // Nothing mounted here propagates back to the engine's namespace.
        mount(
            none,
            c"/",
            none,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            none,
        )?;
        // What stays visible under a hidden directory is taken before anything is hidden.
        for m in &self.mounts {
            if let Kind::Reattach { fd, .. } = &m.kind {
                let tree = kernel::open_tree(&m.path, libc::AT_RECURSIVE as libc::c_uint)?;
                fd.store(tree, Ordering::SeqCst);
            }
        }
        let read_only =
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        for m in &self.mounts {
            let p = m.path.as_c_str();
            match &m.kind {
                Kind::HideDir => {
                    mount(
                        Some(c"tmpfs"),
                        p,
                        Some(c"tmpfs"),
                        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                        Some(c"mode=0755,size=64k"),
                    )?;
                    continue;
                }
                // Read-only, as everything of the home is: writing to it is refused,
                // not swallowed by `/dev/null`.
                Kind::HideFile { empty } => {
                    let source = match empty {
                        Some(e) => {
                            let fd = nix::fcntl::open(
                                e.as_c_str(),
                                nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
                                nix::sys::stat::Mode::from_bits_truncate(0o444),
                            )?;
                            drop(fd);
                            e.as_c_str()
                        }
                        None => c"/dev/null",
                    };
                    mount(Some(source), p, none, MsFlags::MS_BIND, none)?;
                }
                Kind::Reattach { dirs, fd } => {
                    for d in dirs {
                        match nix::unistd::mkdir(
                            d.as_c_str(),
                            nix::sys::stat::Mode::from_bits_truncate(0o755),
                        ) {
                            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    kernel::move_tree(fd.swap(-1, Ordering::SeqCst), p)?;
                }
                Kind::Bind => {
                    mount(Some(p), p, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)?;
                }
            }
            let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT;
            if !m.writable {
                flags |= MsFlags::MS_RDONLY;
            }
            mount(none, p, none, flags, none)?;
        }
        // The hiding tmpfs read-only too, once what stays under it is back.
        for m in &self.mounts {
            if let Kind::HideDir = m.kind {
                mount(
                    none,
                    m.path.as_c_str(),
                    none,
                    MsFlags::MS_REMOUNT | read_only,
                    none,
                )?;
            }
        }
        if self.pid {
            mount(
                Some(c"proc"),
                c"/proc",
                Some(c"proc"),
                read_only - MsFlags::MS_RDONLY,
                none,
            )?;
        }
        self.dev.mount()?;
        kernel::protect()?;
        if self.net {
            kernel::loopback_up()?;
        }
        if let Userns::Stage(fd) = self.user {
            userns::enter(fd)?;
        }
        drop_capabilities()?;
        if let Some(program) = self.seccomp {
            seccomp::install(program)?;
        }
        Ok(())
    }
}

/// Why an attempt that must have every layer cannot start: `missing` says which.
pub(super) fn refused(missing: &str) -> String {
    format!(
        "cannot isolate the attempt: {missing}, and DRIVETRAIN_ISOLATION=required runs a stage with every layer or not at all"
    )
}

/// Whether `true` starts and exits 0 isolated as an attempt is ([`spawn`]) with `layers`.
fn probe(layers: Layers) -> bool {
    probe_with(layers, false)
}

/// [`probe`], in a network namespace of its own too where `net`.
fn probe_with(layers: Layers, net: bool) -> bool {
    let started = (|| {
        let null = Path::new("/dev/null");
        let mut plan = MountPlan::new(&[], layers, &[], null)?;
        plan.net = net;
        let null = std::fs::File::create(null)?;
        let path = std::env::var("PATH").unwrap_or_default();
        let env = BTreeMap::from([("PATH".to_string(), path)]);
        spawn("true", &[], &env, Path::new("/"), &null, 0, Arc::new(plan))
    })();
    match started {
        Ok(pid) => matches!(
            nix::sys::wait::waitpid(Pid::from_raw(pid), None),
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0))
        ),
        Err(_) => false,
    }
}

/// The layers attempts get here: found once, by starting `true` with each set, most
/// first. A root engine's user namespace is the stage namespace (its stages are host
/// `nobody`); another user's is its own uid mapped to itself.
pub fn available() -> Layers {
    static LAYERS: std::sync::OnceLock<Layers> = std::sync::OnceLock::new();
    *LAYERS.get_or_init(|| {
        let root = nix::unistd::geteuid().is_root();
        let user = !root || userns::stage_userns().is_some();
        let tries = [
            (true, user, true),
            (true, user, false),
            // Root can make the mount namespace without a user namespace.
            (root, false, root),
            (root, false, false),
        ];
        let mut found = tries
            .into_iter()
            .map(|(mount, user, pid)| Layers { mount, user, pid, seccomp: false })
            .find(|l| l.mount && probe(*l))
            .unwrap_or(Layers { mount: false, user: false, pid: false, seccomp: false });
        found.seccomp = found.mount
            && seccomp::filter().is_ok()
            && probe(Layers { seccomp: true, ..found });
        if !found.mount {
            tracing::warn!(
                "no mount namespace for stages here (not root, and no unprivileged user namespaces): \
                 inputs are checked after each attempt instead of protected"
            );
        }
        found
    })
}

/// Whether an attempt can get a network namespace of its own here (`network: none`):
/// found once, by starting `true` in one.
pub fn network_namespaces_work() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let layers = available();
        layers.mount && probe_with(layers, true)
    })
}

/// Whether this process can give its children mount namespaces.
pub fn namespaces_work() -> bool {
    available().mount
}

/// Whether an attempt gets a user namespace of its own here (what `required` needs).
pub fn user_namespaces_work() -> bool {
    available().user
}

/// Each layer of a local attempt's containment and whether this machine gives it, in
/// the order they are set up: what `doctor` lists. Layers not built yet say so.
pub fn layers() -> Vec<(&'static str, bool, String)> {
    let l = available();
    let user = if nix::unistd::geteuid().is_root() {
        "the stage is root in its own namespaces and host nobody (uid 65534) outside them: no host-root file, sysctl or socket, no other home, not the engine's binary"
    } else {
        "the stage's uids are its own namespace's, mapped to the engine's user"
    };
    let cgroups = match super::Cgroups::host() {
        super::Cgroups::None(why) => format!("not here ({why}): `resources` are not enforced"),
        host => format!(
            "cgroup {}: `resources.memory` and `cpu` limit the attempt, a pids limit stops fork storms; an OOM kill is reported as such{}",
            if matches!(host, super::Cgroups::V2 { .. }) { "v2" } else { "v1" },
            match host.lacking() {
                lacking if lacking.is_empty() => String::new(),
                lacking => format!(
                    " (but not the {} controller here: {})",
                    lacking.join(", "),
                    super::cgroups::unenforced(&lacking)
                ),
            }
        ),
    };
    let fixed = [
        ("user namespace", l.user, user),
        (
            "mount namespace",
            l.mount,
            "the engine's home, the store and the inputs read-only; the attempt's directory and outputs writable; other attempts' directories and the state database hidden; /sys, /proc/sys and /proc/sysrq-trigger read-only, /proc/kcore and the like masked",
        ),
        (
            "pid namespace",
            l.pid,
            "the stage sees and signals only its own processes (a /proc of its own), and everything it started ends with it",
        ),
        (
            "capabilities",
            l.mount,
            "every capability but Docker's default set less MKNOD dropped; no_new_privs",
        ),
        (
            "artifact sha256",
            true,
            "inputs on file:// are hashed and checked against their manifest before the stage starts",
        ),
    ];
    let mut all: Vec<_> = fixed
        .into_iter()
        .map(|(n, a, w)| (n, a, w.to_owned()))
        .collect();
    all.push(("cgroup limits", super::Cgroups::host().active(), cgroups));
    all.push((
        "seccomp filter",
        l.seccomp,
        match seccomp::filter() {
            Ok(_) => "Docker's default deny list (modules, kexec, reboot, the clock, keyrings, bpf, perf, mounts and namespaces, io_uring, other processes' memory) fails with EPERM".into(),
            Err(why) => why,
        },
    ));
    all.push((
        "network namespace",
        network_namespaces_work(),
        "`network: none`: a stage's own network namespace with loopback only; `host` (the default) shares the machine's".into(),
    ));
    let nvml = crate::gpus::nvml().is_some();
    all.push((
        "gpu usage",
        nvml,
        match nvml {
            true => "NVML: each attempt's GPU utilization and its processes' GPU memory, sampled while it runs".into(),
            false => "no NVML here (no NVIDIA driver): attempts record no GPU usage".into(),
        },
    ));
    all
}

/// Where the child failed, with the `errno`, for the engine's error.
#[derive(Default)]
struct Failure {
    step: AtomicI32,
    errno: AtomicI32,
}

const STEP_SETUP: i32 = 1;
const STEP_ISOLATE: i32 = 2;
const STEP_EXEC: i32 = 3;

/// Everything the child needs, made before the clone: C strings and the pointer arrays
/// `execve` takes (pointing into them), the descriptors it installs as 0, 1 and 2.
struct Launch {
    /// Paths to try `execve` on, in order: the program itself when it names a path, or it
    /// in each `PATH` entry of the attempt's environment (what `execvp` does).
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    _env: Vec<CString>,
    env: Vec<*const libc::c_char>,
    /// `/bin/sh`, then the candidate (set by the child), then the arguments: what
    /// `execvp` runs a file without a `#!` line with.
    sh: CString,
    sh_argv: Vec<AtomicPtr<libc::c_char>>,
    cwd: CString,
    stdin: libc::c_int,
    out: libc::c_int,
    pgid: libc::pid_t,
    plan: Arc<MountPlan>,
    failure: Failure,
}

fn c_string(s: &[u8], what: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{what} has a NUL byte"),
        )
    })
}

fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// `/dev/null`, opened once for every child's stdin.
fn dev_null() -> std::io::Result<libc::c_int> {
    static NULL: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    if let Some(f) = NULL.get() {
        return Ok(f.as_raw_fd());
    }
    let f = std::fs::File::open("/dev/null")?;
    Ok(NULL.get_or_init(|| f).as_raw_fd())
}

/// Starts `program` with `args` and exactly `env`, in `cwd`, stdout and stderr to `out`,
/// stdin from `/dev/null`, in process group `pgid` (0: a new one led by the child),
/// isolated by `plan` (its cgroups too). Returns the child's pid once it has exec'ed; an error (the child
/// reaped) when it could not: `NotFound`/`PermissionDenied` as `execvp` would say them.
pub(super) fn spawn(
    program: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
    out: &std::fs::File,
    pgid: i32,
    plan: Arc<MountPlan>,
) -> std::io::Result<i32> {
    let candidates = if program.contains('/') {
        vec![c_string(program.as_bytes(), "the program")?]
    } else {
        let path = env
            .get("PATH")
            .map(String::as_str)
            .unwrap_or("/usr/local/bin:/usr/bin:/bin");
        path.split(':')
            .map(|dir| {
                let dir = if dir.is_empty() { "." } else { dir };
                c_string(format!("{dir}/{program}").as_bytes(), "the program")
            })
            .collect::<std::io::Result<_>>()?
    };
    let argv_strings = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(|a| c_string(a.as_bytes(), "an argument"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let env_strings = env
        .iter()
        .map(|(k, v)| c_string(format!("{k}={v}").as_bytes(), "an environment value"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let sh = CString::from(c"/bin/sh");
    let sh_argv = [sh.as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(pointers(&argv_strings).into_iter().skip(1))
        .map(|p| AtomicPtr::new(p.cast_mut()))
        .collect();
    let flags = plan.clone_flags();
    // A process in a PID namespace of its own cannot join a group outside it.
    let pgid = if plan.pid { 0 } else { pgid };
    let launch = Launch {
        candidates,
        sh,
        sh_argv,
        argv: pointers(&argv_strings),
        _argv: argv_strings,
        env: pointers(&env_strings),
        _env: env_strings,
        cwd: c_string(cwd.as_os_str().as_bytes(), "the working directory")?,
        stdin: dev_null()?,
        out: out.as_raw_fd(),
        pgid,
        plan,
        failure: Failure::default(),
    };
    let mut stack = vec![0u8; 128 * 1024];
    // No signal handler of the engine's may run in the child before it resets them.
    // SAFETY: sigset_t is plain data the libc calls initialise.
    let (all, mut old) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        (all, std::mem::zeroed::<libc::sigset_t>())
    };
    // SAFETY: both sets are valid for the call.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) };
    let cloned = {
        let launch = &launch;
        // SAFETY: CLONE_VFORK suspends this thread until the child execs or exits, so
        // `launch` and `stack` outlive its use of them; the child only makes system calls
        // on them ([`child`]) and never returns into this frame.
        unsafe {
            nix::sched::clone(
                Box::new(move || child(launch)),
                &mut stack,
                nix::sched::CloneFlags::CLONE_VM | nix::sched::CloneFlags::CLONE_VFORK | flags,
                Some(libc::SIGCHLD),
            )
        }
    };
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    let pid = match cloned {
        Ok(pid) => pid,
        Err(e) if flags.contains(nix::sched::CloneFlags::CLONE_NEWUSER) => {
            return Err(std::io::Error::other(format!(
                "cannot isolate the attempt: the kernel refused it a user namespace ({e})"
            )))
        }
        Err(e) => {
            return Err(std::io::Error::other(format!(
                "cannot isolate the attempt: the kernel refused its namespaces ({e})"
            )))
        }
    };
    let errno = launch.failure.errno.load(Ordering::SeqCst);
    if errno == 0 {
        return Ok(pid.as_raw());
    }
    let _ = nix::sys::wait::waitpid(pid, None);
    let os = std::io::Error::from_raw_os_error(errno);
    Err(match launch.failure.step.load(Ordering::SeqCst) {
        STEP_EXEC => os,
        STEP_ISOLATE => std::io::Error::other(format!("cannot isolate the attempt: {os}")),
        _ => std::io::Error::other(format!("cannot set up the process: {os}")),
    })
}

/// Makes a process the standard library starts join the cgroups whose `cgroup.procs`
/// are open as `cgroups` before it execs.
pub(super) fn join_before_exec(command: &mut tokio::process::Command, cgroups: Vec<RawFd>) {
    if cgroups.is_empty() {
        return;
    }
    // SAFETY: the hook runs in the forked child before exec and only makes `write`
    // system calls on descriptors open in it.
    unsafe {
        command.pre_exec(move || {
            for fd in &cgroups {
                if libc::write(*fd, c"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The child, on the engine's memory and its own stack: system calls only, no
/// allocation, no lock, no panic. Never returns.
fn child(l: &Launch) -> isize {
    let (step, errno) = prepare_and_exec(l);
    l.failure.step.store(step, Ordering::SeqCst);
    l.failure.errno.store(errno, Ordering::SeqCst);
    // SAFETY: ends the child without running anything of the engine's.
    unsafe { libc::_exit(127) }
}

fn prepare_and_exec(l: &Launch) -> (i32, i32) {
    let last = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: plain system calls on memory prepared before the clone.
    unsafe {
        // Handlers of the engine's become the default (as exec would make them); an
        // ignored SIGPIPE too (Rust ignores it in the engine); then nothing is blocked.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            if handled || sig == libc::SIGPIPE {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if libc::setpgid(0, l.pgid) != 0
            || libc::dup2(l.stdin, 0) < 0
            || libc::dup2(l.out, 1) < 0
            || libc::dup2(l.out, 2) < 0
            || libc::chdir(l.cwd.as_ptr()) != 0
        {
            return (STEP_SETUP, last());
        }
        for fd in &l.plan.cgroups {
            if libc::write(*fd, c"0".as_ptr().cast(), 1) != 1 {
                return (STEP_SETUP, last());
            }
        }
    }
    if let Err(e) = l.plan.apply() {
        return (STEP_ISOLATE, e.raw_os_error().unwrap_or(libc::EIO));
    }
    let mut denied = false;
    let mut errno = libc::ENOENT;
    for path in &l.candidates {
        // SAFETY: NUL-terminated arrays of pointers into the strings `l` holds.
        unsafe { libc::execve(path.as_ptr(), l.argv.as_ptr(), l.env.as_ptr()) };
        errno = last();
        match errno {
            libc::ENOEXEC => {
                l.sh_argv[1].store(path.as_ptr().cast_mut(), Ordering::SeqCst);
                // SAFETY: as above; `AtomicPtr` has the layout of a pointer.
                unsafe {
                    libc::execve(
                        l.sh.as_ptr(),
                        l.sh_argv.as_ptr().cast::<*const libc::c_char>(),
                        l.env.as_ptr(),
                    )
                };
                return (STEP_EXEC, last());
            }
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG | libc::ESTALE => {}
            _ => return (STEP_EXEC, errno),
        }
    }
    (STEP_EXEC, if denied { libc::EACCES } else { errno })
}

/// A child [`spawn`] started, waited for without blocking the runtime: through a pidfd
/// (readable once the child has exited), or by polling where the kernel has none.
pub(super) struct RawChild {
    pid: i32,
    exited: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl RawChild {
    /// Wraps a child of this process that nothing else waits for.
    pub(super) fn new(pid: i32) -> Self {
        // SAFETY: pidfd_open with integer arguments; the child is not reaped yet, so the
        // pid is still its.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let exited = (fd >= 0)
            // SAFETY: a new descriptor this call owns.
            .then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
            // SAFETY: the `OwnedFd` moves into the `AsyncFd`, open and the same until dropped.
            .and_then(|fd| {
                unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
            });
        RawChild {
            pid,
            exited,
            status: None,
        }
    }

    pub(super) fn id(&self) -> u32 {
        self.pid as u32
    }

    /// `SIGKILL` to the child unless it has been reaped (its pid may be another's by
    /// then), through its pidfd where there is one. The first process of a PID namespace
    /// takes every other one in it along.
    pub(super) fn kill(&mut self) {
        if !matches!(self.try_reap(), Ok(None)) {
            return;
        }
        match &self.exited {
            // SAFETY: pidfd_send_signal on the descriptor this child owns, no siginfo.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            None => {
                let _ = nix::sys::signal::kill(
                    Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    fn try_reap(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            let mut raw = 0;
            // SAFETY: waitpid on our own child, writing one int.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if r == self.pid {
                self.status = Some(ExitStatus::from_raw(raw));
            }
        }
        Ok(self.status)
    }

    /// The child's exit status, once it has ended (again and again after that).
    pub(super) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_reap()? {
                return Ok(status);
            }
            match &self.exited {
                Some(fd) => fd.readable().await?.clear_ready(),
                None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }
}

impl Drop for RawChild {
    fn drop(&mut self) {
        // Not waited for (the engine is going away): reap it when it ends, not leaving a
        // zombie behind.
        if matches!(self.try_reap(), Ok(None)) {
            let pid = Pid::from_raw(self.pid);
            std::thread::spawn(move || nix::sys::wait::waitpid(pid, None));
        }
    }
}
