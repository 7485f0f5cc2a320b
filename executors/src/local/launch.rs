//! Starting an attempt's process without `fork`.
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
//! and the working directory, isolates itself ([`MountPlan::apply`]) and execs. Sharing
//! the engine's memory, it only makes system calls on what [`Launch`] prepared before
//! the clone, and reports a failure through [`Launch::failure`].
//!
//! [`spawn_in`] starts one in a prepared sandbox instead ([`super::sandbox`]), and
//! [`start_init`] starts a sandbox's init.
//!
//! A started child is a [`RawChild`]: waited for through a pidfd the runtime polls.
//!
//! Unsafe code lives here, each block with what makes it sound.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::sync::Arc;

use nix::libc;
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;

use super::isolate::MountPlan;

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
    how: How,
    failure: Failure,
}

/// What the child is.
enum How {
    /// An attempt's process in namespaces of its own, made by the clone: the whole plan.
    Fresh,
    /// A sandbox's init: the shared part of the plan, keeping its capabilities.
    Init,
    /// An attempt's process in the sandbox whose init's pidfd is `init`: cloned into its
    /// PID namespace, the child enters its mount namespace and makes the attempt's own
    /// mounts there.
    Enter { init: RawFd },
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

/// What a process is started as: its program, arguments, exact environment, working
/// directory, stdout and stderr (`out`; stdin is `/dev/null`) and process group (`pgid`;
/// 0: a new one led by it).
pub(super) struct Command<'a> {
    pub program: &'a str,
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: &'a Path,
    pub out: &'a std::fs::File,
    pub pgid: i32,
}

impl Launch {
    fn new(c: &Command, stdin: RawFd, plan: Arc<MountPlan>, how: How) -> std::io::Result<Self> {
        let candidates = if c.program.contains('/') {
            vec![c_string(c.program.as_bytes(), "the program")?]
        } else {
            let path = c
                .env
                .get("PATH")
                .map(String::as_str)
                .unwrap_or("/usr/local/bin:/usr/bin:/bin");
            path.split(':')
                .map(|dir| {
                    let dir = if dir.is_empty() { "." } else { dir };
                    c_string(format!("{dir}/{}", c.program).as_bytes(), "the program")
                })
                .collect::<std::io::Result<_>>()?
        };
        let argv_strings = std::iter::once(c.program)
            .chain(c.args.iter().map(String::as_str))
            .map(|a| c_string(a.as_bytes(), "an argument"))
            .collect::<std::io::Result<Vec<_>>>()?;
        let env_strings = c
            .env
            .iter()
            .map(|(k, v)| c_string(format!("{k}={v}").as_bytes(), "an environment value"))
            .collect::<std::io::Result<Vec<_>>>()?;
        let sh = CString::from(c"/bin/sh");
        let sh_argv = [sh.as_ptr(), std::ptr::null()]
            .into_iter()
            .chain(pointers(&argv_strings).into_iter().skip(1))
            .map(|p| AtomicPtr::new(p.cast_mut()))
            .collect();
        Ok(Launch {
            candidates,
            sh,
            sh_argv,
            argv: pointers(&argv_strings),
            _argv: argv_strings,
            env: pointers(&env_strings),
            _env: env_strings,
            cwd: c_string(c.cwd.as_os_str().as_bytes(), "the working directory")?,
            stdin,
            out: c.out.as_raw_fd(),
            // A process in a PID namespace of its own cannot join a group outside it.
            pgid: if plan.pid() { 0 } else { c.pgid },
            plan,
            how,
            failure: Failure::default(),
        })
    }
}

/// Starts `c`, isolated by `plan` (its cgroups too) in namespaces of its own. Returns the
/// child's pid once it has exec'ed; an error (the child reaped) when it could not:
/// `NotFound`/`PermissionDenied` as `execvp` would say them.
pub(super) fn spawn(c: &Command, plan: Arc<MountPlan>) -> std::io::Result<i32> {
    let flags = plan.clone_flags();
    let launch = Launch::new(c, dev_null()?, plan, How::Fresh)?;
    let pid = clone_child(&launch, flags).map_err(|e| {
        std::io::Error::other(if flags.contains(nix::sched::CloneFlags::CLONE_NEWUSER) {
            format!("cannot isolate the attempt: the kernel refused it a user namespace ({e})")
        } else {
            format!("cannot isolate the attempt: the kernel refused its namespaces ({e})")
        })
    })?;
    launched(&launch, pid)
}

/// Starts `c` in the sandbox whose init's pidfd is `init`, isolated by the attempt's own
/// part of `plan` there; as [`spawn`] otherwise. The process is a child of this one.
pub(super) fn spawn_in(c: &Command, plan: Arc<MountPlan>, init: RawFd) -> std::io::Result<i32> {
    let launch = Launch::new(c, dev_null()?, plan, How::Enter { init })?;
    let pid = clone_child(&launch, nix::sched::CloneFlags::empty())
        .map_err(|e| std::io::Error::other(format!("cannot start the attempt: {e}")))?;
    launched(&launch, pid)
}

/// The PID namespace of this process, which a thread's children go back to.
fn own_pid_namespace() -> std::io::Result<RawFd> {
    static OWN: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = OWN.get() {
        return Ok(fd.as_raw_fd());
    }
    let fd = OwnedFd::from(std::fs::File::open("/proc/self/ns/pid")?);
    Ok(OWN.get_or_init(|| fd).as_raw_fd())
}

/// Starts a sandbox's init: `program` `args` (the engine's own binary, read through
/// `/proc/self/exe`, which a mount cannot hide), in namespaces of its own with the shared
/// part of `plan` ([`MountPlan::apply_shared`]), `control` as its stdin.
pub(super) fn start_init(
    args: &[String],
    plan: Arc<MountPlan>,
    control: RawFd,
) -> std::io::Result<i32> {
    let env = BTreeMap::new();
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    let c = Command {
        program: "/proc/self/exe",
        args,
        env: &env,
        cwd: Path::new("/"),
        out: &null,
        pgid: 0,
    };
    let flags = plan.clone_flags();
    let launch = Launch::new(&c, control, plan, How::Init)?;
    let pid = clone_child(&launch, flags)?;
    launched(&launch, pid)
}

/// Clones the child of `launch` with `flags` onto a stack of its own, this thread
/// waiting until it has exec'ed or ended.
fn clone_child(
    launch: &Launch,
    flags: nix::sched::CloneFlags,
) -> std::io::Result<nix::unistd::Pid> {
    let mut stack = vec![0u8; 128 * 1024];
    // A child entering a sandbox is born in its PID namespace: `setns` of a PID namespace
    // changes only where this thread's next children go, and this thread goes back to its
    // own at once.
    let sandbox = match launch.how {
        How::Enter { init } => Some((init, own_pid_namespace()?)),
        _ => None,
    };
    // No signal handler of the engine's may run in the child before it resets them.
    // SAFETY: sigset_t is plain data the libc calls initialise.
    let (all, mut old) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        (all, std::mem::zeroed::<libc::sigset_t>())
    };
    // SAFETY: both sets are valid for the call.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) };
    let cloned = (|| {
        if let Some((init, _)) = sandbox {
            // SAFETY: setns on the init's pidfd, integer flags.
            if unsafe { libc::setns(init, libc::CLONE_NEWPID) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: CLONE_VFORK suspends this thread until the child execs or exits, so
        // `launch` and `stack` outlive its use of them; the child only makes system calls
        // on them ([`child`]) and never returns into this frame.
        let cloned = unsafe {
            nix::sched::clone(
                Box::new(move || child(launch)),
                &mut stack,
                nix::sched::CloneFlags::CLONE_VM | nix::sched::CloneFlags::CLONE_VFORK | flags,
                Some(libc::SIGCHLD),
            )
        };
        if let Some((_, own)) = sandbox {
            // SAFETY: setns on a descriptor of this process's own PID namespace.
            if unsafe { libc::setns(own, libc::CLONE_NEWPID) } != 0 {
                // Its next thread would fail to start: nothing it does is right now.
                std::process::abort();
            }
        }
        Ok(cloned?)
    })();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    cloned
}

/// The failure the child recorded, if any, as the engine's error.
fn failed(launch: &Launch) -> Option<std::io::Error> {
    let errno = launch.failure.errno.load(Ordering::SeqCst);
    if errno == 0 {
        return None;
    }
    let os = std::io::Error::from_raw_os_error(errno);
    Some(match launch.failure.step.load(Ordering::SeqCst) {
        STEP_EXEC => os,
        STEP_ISOLATE => std::io::Error::other(format!("cannot isolate the attempt: {os}")),
        _ => std::io::Error::other(format!("cannot set up the process: {os}")),
    })
}

/// `pid`, or the child's failure (the child reaped).
fn launched(launch: &Launch, pid: Pid) -> std::io::Result<i32> {
    match failed(launch) {
        None => Ok(pid.as_raw()),
        Some(e) => {
            let _ = nix::sys::wait::waitpid(pid, None);
            Err(e)
        }
    }
}

/// Makes a process the standard library starts join the cgroups whose `cgroup.procs`
/// are open as `cgroups` before it execs, and keep no descriptor but its stdio
/// ([`close_inherited_at_exec`]).
pub(super) fn join_before_exec(command: &mut tokio::process::Command, cgroups: Vec<RawFd>) {
    // SAFETY: the hook runs in the forked child before exec and only makes system calls
    // on descriptors open in it.
    unsafe {
        command.pre_exec(move || {
            for fd in &cgroups {
                if libc::write(*fd, c"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            close_inherited_at_exec()
        });
    }
}

/// The child, on the engine's memory and its own stack: system calls only, no
/// allocation, no lock, no panic. Never returns.
fn child(l: &Launch) -> isize {
    let (step, errno) = match &l.how {
        How::Enter { init } => enter(l, *init),
        How::Fresh | How::Init => prepare_and_exec(l),
    };
    if errno != 0 {
        l.failure.step.store(step, Ordering::SeqCst);
        l.failure.errno.store(errno, Ordering::SeqCst);
    }
    // SAFETY: ends the child without running anything of the engine's.
    unsafe { libc::_exit(127) }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Handlers of the engine's become the default (as exec would make them); an ignored
/// SIGPIPE too (Rust ignores it in the engine); then nothing is blocked.
fn reset_signals() {
    // SAFETY: sigaction and sigprocmask on structs on this stack.
    unsafe {
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
    }
}

/// Its process group, stdio, working directory and (an attempt's) cgroups.
fn set_up(l: &Launch) -> Result<(), i32> {
    // SAFETY: plain system calls on memory prepared before the clone.
    unsafe {
        if libc::setpgid(0, l.pgid) != 0
            || libc::dup2(l.stdin, 0) < 0
            || libc::dup2(l.out, 1) < 0
            || libc::dup2(l.out, 2) < 0
            || libc::chdir(l.cwd.as_ptr()) != 0
        {
            return Err(last_errno());
        }
        if !matches!(l.how, How::Init) {
            for fd in &l.plan.cgroups {
                if libc::write(*fd, c"0".as_ptr().cast(), 1) != 1 {
                    return Err(last_errno());
                }
            }
        }
    }
    Ok(())
}

fn prepare_and_exec(l: &Launch) -> (i32, i32) {
    reset_signals();
    if let Err(errno) = set_up(l) {
        return (STEP_SETUP, errno);
    }
    let isolated = match l.how {
        How::Init => l.plan.apply_shared(),
        _ => l.plan.apply(),
    };
    if let Err(e) = isolated {
        return (STEP_ISOLATE, e.raw_os_error().unwrap_or(libc::EIO));
    }
    exec(l)
}

/// An attempt's process in a sandbox (in its PID namespace since the clone): captures
/// its own trees, enters the sandbox's mount namespace, mounts them there, sets itself
/// up, is confined, and execs.
fn enter(l: &Launch, init: RawFd) -> (i32, i32) {
    reset_signals();
    if let Err(e) = l.plan.capture_own() {
        return (STEP_ISOLATE, e.raw_os_error().unwrap_or(libc::EIO));
    }
    // SAFETY: setns on the init's pidfd, integer flags.
    if unsafe { libc::setns(init, libc::CLONE_NEWNS) } != 0 {
        return (STEP_ISOLATE, last_errno());
    }
    if let Err(e) = l.plan.apply_own() {
        return (STEP_ISOLATE, e.raw_os_error().unwrap_or(libc::EIO));
    }
    if let Err(errno) = set_up(l) {
        return (STEP_SETUP, errno);
    }
    if let Err(e) = l.plan.confine() {
        return (STEP_ISOLATE, e.raw_os_error().unwrap_or(libc::EIO));
    }
    exec(l)
}

/// Every descriptor above stdio closes at `exec`: the stage gets its stdin, stdout and
/// stderr and nothing else the engine holds, nor what the engine's own caller left open
/// to it (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, Linux 5.11; before, each open one
/// flagged in turn). In a child between fork or clone and exec: system calls only.
pub(super) fn close_inherited_at_exec() -> std::io::Result<()> {
    // SAFETY: integer arguments; affects this process's descriptor table only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    // An older kernel: flag each descriptor up to the limit.
    let mut limit: libc::rlimit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct on this stack; fcntl takes integers.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let top = limit.rlim_cur.min(1 << 20) as libc::c_int;
        for fd in 3..top {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// `execve` of each candidate in turn, as `execvp` does; returns only on failure.
fn exec(l: &Launch) -> (i32, i32) {
    if let Err(e) = close_inherited_at_exec() {
        return (STEP_SETUP, e.raw_os_error().unwrap_or(libc::EIO));
    }
    let mut denied = false;
    let mut errno = libc::ENOENT;
    for path in &l.candidates {
        // SAFETY: NUL-terminated arrays of pointers into the strings `l` holds.
        unsafe { libc::execve(path.as_ptr(), l.argv.as_ptr(), l.env.as_ptr()) };
        errno = last_errno();
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
                return (STEP_EXEC, last_errno());
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

    /// Whether it has ended (it is reaped if so).
    pub(super) fn has_ended(&mut self) -> bool {
        !matches!(self.try_reap(), Ok(None))
    }

    /// Its pidfd, where the kernel gave one.
    pub(super) fn pidfd(&self) -> Option<RawFd> {
        self.exited.as_ref().map(|fd| fd.get_ref().as_raw_fd())
    }

    /// `SIGKILL` to the child unless it has been reaped (its pid may be another's by
    /// then), through its pidfd where there is one. The first process of a PID namespace
    /// takes every other one in it along.
    pub(super) fn kill(&mut self) {
        self.signal(libc::SIGKILL);
    }

    /// `signal` to the child unless it has been reaped, as [`RawChild::kill`] sends
    /// `SIGKILL`. (The first process of a PID namespace gets a signal other than
    /// `SIGKILL` from outside only where it handles it.)
    pub(super) fn signal(&mut self, signal: i32) {
        if !matches!(self.try_reap(), Ok(None)) {
            return;
        }
        match &self.exited {
            // SAFETY: pidfd_send_signal on the descriptor this child owns, no siginfo.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            None => {
                // SAFETY: kill with integer arguments, on our own unreaped child.
                unsafe { libc::kill(self.pid, signal) };
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
