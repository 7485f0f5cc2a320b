//! Prepared sandboxes: what every isolated attempt of a home shares, made once and
//! reused, so that an attempt does not build its namespaces from nothing.
//!
//! Building an attempt's namespaces took some 40 mounts, 8 new file systems (`/proc`,
//! `/dev`, `/dev/pts`, the hiding tmpfs, the masks) and their teardown at its end: most of
//! what isolation cost per stage (bench/README.md, "Session 17: prepared sandboxes"). A sandbox is a
//! small init process (this binary, [`serve_if_asked`]) in a PID and a mount namespace of
//! its own, holding the part of an attempt's [`MountPlan`] that is the same for every
//! attempt of the home ([`MountPlan::apply_shared`]): the home and store read-only, the
//! state database and the work directories hidden, a `/proc` of its PID namespace in
//! which a stage sees only the processes it may trace (not the init), `/dev`, and the
//! kernel's files protected. An attempt enters it ([`super::launch::spawn_in`]), mounts
//! only its own paths, and execs confined as before (stage user namespace, capabilities,
//! seccomp).
//!
//! One attempt at a time: when it has ended, the engine asks the init to clean
//! ([`Sandbox::clean`]), and the init kills every process left in its PID namespace
//! (what a stage's first process ending did when each attempt had one of its own: nothing
//! outlives its attempt), waits until they are gone, empties `/dev/shm` and detaches the
//! attempt's mounts.
//! Only then does the sandbox serve another attempt. A sandbox whose cleaning fails is
//! dropped: its init is killed, and the kernel ends what is left in its namespace. An
//! engine that dies closes the control socket, and the init exits.
//!
//! Sandboxes are kept a short while ([`MAX_AGE`]): a long-lived one would hold a view of
//! the host's mounts from when it was made.
//!
//! Only the engine binary can be an init (its `main` calls [`serve_if_asked`] first);
//! elsewhere (the engine's own tests, in-process) every attempt builds its own namespaces.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::libc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::isolate::MountPlan;
use super::launch::{self, RawChild};

/// The argument that makes the engine binary a sandbox's init.
const INIT_ARG: &str = "__drivetrain-sandbox-init";

/// How long a sandbox serves attempts after it was made.
const MAX_AGE: Duration = Duration::from_secs(60);

/// How long cleaning may take.
const CLEAN_TIMEOUT: Duration = Duration::from_secs(10);

/// How many idle sandboxes are kept.
const MAX_IDLE: usize = 32;

/// Set by [`serve_if_asked`]: this binary can be a sandbox's init.
static CAN_INIT: AtomicBool = AtomicBool::new(false);

/// The idle sandboxes, most recently used last.
static IDLE: Mutex<Vec<Sandbox>> = Mutex::new(Vec::new());

/// The engine binary's `main` calls this first: in a sandbox's init it serves the engine
/// until the engine closes its control socket (and returns the exit code); anywhere else
/// it notes that this binary can be one and returns `None`.
pub fn serve_if_asked() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == INIT_ARG) && args.next().is_none() {
        return Some(init::serve());
    }
    CAN_INIT.store(true, Ordering::Relaxed);
    None
}

/// Whether this engine's attempts can run in prepared sandboxes: its binary can be their
/// init, and it is root (another user's attempts each have a user namespace of their own).
pub(super) fn can_serve() -> bool {
    CAN_INIT.load(Ordering::Relaxed) && nix::unistd::geteuid().is_root()
}

/// A prepared sandbox: its init, and the socket the engine asks it to clean through.
pub(super) struct Sandbox {
    key: String,
    init: RawChild,
    control: tokio::net::UnixStream,
    made: Instant,
    /// Where the attempt it serves mounted, for [`Sandbox::clean`].
    mounted: Vec<CString>,
}

impl Sandbox {
    /// A sandbox for an attempt with `plan`: an idle one holding the same, or a new one;
    /// `None` where the attempt needs namespaces of its own, or no sandbox can be made
    /// here (said once).
    pub(super) async fn take(plan: &Arc<MountPlan>) -> Option<Sandbox> {
        if !CAN_INIT.load(Ordering::Relaxed) {
            return None;
        }
        let key = plan.sandbox_key()?;
        let idle = {
            let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
            // An init that has ended (killed by someone) took its namespace along.
            idle.retain_mut(|s| s.made.elapsed() < MAX_AGE && !s.init.has_ended());
            idle.iter()
                .rposition(|s| s.key == key)
                .map(|i| idle.remove(i))
        };
        let mut sandbox = match idle {
            Some(s) => s,
            None => match Sandbox::start(key, plan).await {
                Ok(s) => s,
                Err(e) => {
                    // Not tried again: attempts build their own namespaces, as safely.
                    if CAN_INIT.swap(false, Ordering::Relaxed) {
                        tracing::warn!("cannot prepare a sandbox for attempts ({e}): each builds its own namespaces");
                    }
                    return None;
                }
            },
        };
        sandbox.mounted = plan.own_mount_points();
        Some(sandbox)
    }

    async fn start(key: String, plan: &Arc<MountPlan>) -> std::io::Result<Sandbox> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let pid = launch::start_init(&[INIT_ARG.to_owned()], plan.clone(), theirs.as_raw_fd())?;
        drop(theirs);
        let init = RawChild::new(pid);
        ours.set_nonblocking(true)?;
        let mut control = tokio::net::UnixStream::from_std(ours)?;
        // It says it is ready once it has exec'ed and set itself up.
        let mut ready = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), control.read_exact(&mut ready))
            .await
            .map_err(|_| std::io::Error::other("its init did not start in 10 s"))??;
        Ok(Sandbox {
            key,
            init,
            control,
            made: Instant::now(),
            mounted: Vec::new(),
        })
    }

    /// The init's pidfd, which an attempt enters the sandbox through.
    pub(super) fn init(&self) -> Option<RawFd> {
        self.init.pidfd()
    }

    /// Once the attempt's process has ended: every process left in the sandbox killed
    /// and gone, the attempt's mounts detached; then the sandbox is idle again. An error
    /// drops it (its init exits, and the kernel ends what is left).
    pub(super) async fn clean(mut self) -> std::io::Result<()> {
        let mut message = Vec::new();
        for path in &self.mounted {
            message.extend_from_slice(path.as_bytes_with_nul());
        }
        let mut framed = (message.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&message);
        let mut reply = [0u8; 4];
        // A process that does not die (stuck in the kernel) keeps the init waiting.
        tokio::time::timeout(CLEAN_TIMEOUT, async {
            self.control.write_all(&framed).await?;
            self.control.read_exact(&mut reply).await
        })
        .await
        .map_err(|_| std::io::Error::other("its processes did not end in 10 s"))??;
        match i32::from_le_bytes(reply) {
            0 => {}
            errno => {
                return Err(std::io::Error::other(format!(
                    "cannot detach the attempt's mounts: {}",
                    std::io::Error::from_raw_os_error(errno)
                )))
            }
        }
        let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(self);
        Ok(())
    }
}

impl Drop for Sandbox {
    /// Ends its PID namespace: the init, and with it every process left in it.
    fn drop(&mut self) {
        self.init.kill();
    }
}

/// The init's side: pid 1 of the sandbox's PID namespace, root with its capabilities
/// (no stage can signal or trace it), its control socket as stdin.
mod init {
    use super::*;

    pub(super) fn serve() -> std::process::ExitCode {
        // The orphans it inherits are reaped by the kernel: no zombie stays between
        // cleanings, and `waitpid` below waits for all of them.
        // SAFETY: setting a signal's disposition to ignored installs no handler.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
        // SAFETY: the engine made fd 0 this process's end of the control socket.
        let mut control = unsafe { std::os::unix::net::UnixStream::from_raw_fd(0) };
        if control.write_all(b"R").is_err() {
            return std::process::ExitCode::FAILURE;
        }
        loop {
            let mut len = [0u8; 4];
            if control.read_exact(&mut len).is_err() {
                // The engine is gone or dropped this sandbox: so is everything in it.
                return std::process::ExitCode::SUCCESS;
            }
            let mut message = vec![0u8; u32::from_le_bytes(len) as usize];
            if control.read_exact(&mut message).is_err() {
                return std::process::ExitCode::SUCCESS;
            }
            let errno = clean(&message);
            if control.write_all(&errno.to_le_bytes()).is_err() {
                return std::process::ExitCode::SUCCESS;
            }
        }
    }

    /// Kills every other process in the namespace, waits until none is left, empties
    /// `/dev/shm` and detaches each NUL-terminated path in `message`: 0, or the first
    /// error's errno.
    fn clean(message: &[u8]) -> i32 {
        // SAFETY: kill and waitpid with integer arguments.
        unsafe {
            // Every process of the namespace but this one, atomically against forks.
            libc::kill(-1, libc::SIGKILL);
            loop {
                if libc::waitpid(-1, std::ptr::null_mut(), 0) < 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
                {
                    break;
                }
            }
        }
        let mut first = empty("/dev/shm")
            .err()
            .map_or(0, |e| e.raw_os_error().unwrap_or(libc::EIO));
        for path in message.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            let Ok(path) = CString::new(path) else {
                continue;
            };
            if let Err(e) = nix::mount::umount2(path.as_c_str(), nix::mount::MntFlags::MNT_DETACH) {
                if first == 0 {
                    first = e as i32;
                }
            }
        }
        first
    }

    /// Removes everything in `dir` (what the attempt left in its `/dev/shm`).
    fn empty(dir: &str) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }
}
