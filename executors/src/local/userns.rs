//! The host user a root engine's stages run as, and what that user must reach.
//!
//! An engine running as root gives each isolated attempt a user namespace in which uid
//! and gid 0 are [`STAGE_ID`] on the host (`nobody`): the stage is root in its own
//! namespaces and nobody outside them, so files, sysctls and sockets that check for host
//! root, other homes and the engine's binary are out of its reach. The namespace is made
//! once per engine ([`stage_userns`]): a child cloned into a new user namespace waits
//! while the engine (which holds `CAP_SETUID` over it) writes its maps, and the engine
//! keeps `/proc/CHILD/ns/user` open; each attempt enters it with `setns` once its mounts
//! are made.
//!
//! Such a stage can only write what it owns: the engine gives it its writable paths
//! ([`give`]). And it can only reach what its uid may search: where a directory on the
//! way to its program, its `PATH` or its paths is closed to others (`/root` is `0700`),
//! its view gets that directory as an empty tmpfs with only the entries on the way put
//! back ([`closed_on_the_way`]), as a container's root file system holds only what was
//! put in it.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::libc;

/// The host uid and gid of a root engine's stages: `nobody` and `nogroup`.
pub const STAGE_ID: u32 = 65534;

/// The user namespace a root engine's stages enter, made on first use; `None` where the
/// kernel refuses one (said once, as a warning).
pub(super) fn stage_userns() -> Option<RawFd> {
    static NS: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    NS.get_or_init(|| match make_stage_userns() {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(
                "no user namespace for stages here ({e}): a root engine's stages would run as host root"
            );
            None
        }
    })
    .as_ref()
    .map(|fd| fd.as_raw_fd())
}

fn make_stage_userns() -> std::io::Result<OwnedFd> {
    let mut stack = vec![0u8; 16 * 1024];
    // SAFETY: without CLONE_VM the child runs on a copy of this memory, like a forked
    // process; it only pauses (a system call) until it is killed.
    let pid = unsafe {
        nix::sched::clone(
            Box::new(|| {
                libc::pause();
                0
            }),
            &mut stack,
            nix::sched::CloneFlags::CLONE_NEWUSER,
            Some(libc::SIGCHLD),
        )
    }?;
    let made = (|| {
        let id = STAGE_ID;
        std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {id} 1"))?;
        std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {id} 1"))?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(ns))
    })();
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
    made
}

/// In the child, after its mounts: enters the stage namespace and becomes its uid and
/// gid 0 (the host's [`STAGE_ID`]) with no supplementary group. Raw system calls: glibc's
/// `setresuid` would try to change the ids of every thread of the engine, whose memory the
/// child shares.
pub(super) fn enter(fd: RawFd) -> std::io::Result<()> {
    let check = |r: libc::c_long| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: system calls with integer arguments and a null group list of length 0.
    unsafe {
        check(libc::setns(fd, libc::CLONE_NEWUSER) as libc::c_long)?;
        check(libc::syscall(libc::SYS_setresgid, 0, 0, 0))?;
        check(libc::syscall(
            libc::SYS_setgroups,
            0,
            std::ptr::null::<libc::gid_t>(),
        ))?;
        check(libc::syscall(libc::SYS_setresuid, 0, 0, 0))?;
    }
    Ok(())
}

/// Makes `path` and everything under it `owner`'s (symbolic links themselves, not what
/// they point to), except what is under `keep` (its inputs: hard links of the store's
/// files) and `log` (the engine's, written through the descriptor it gave). The stage
/// user gets its writable paths before the attempt ([`STAGE_ID`]), and the engine takes
/// them back after it, before anything is published: no other process that runs as
/// `nobody` on the host owns an artifact.
pub(super) fn give(
    path: &Path,
    keep: &[&Path],
    log: &Path,
    owner: (u32, u32),
) -> std::io::Result<()> {
    if keep.contains(&path) || path == log {
        return Ok(());
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if (meta.uid(), meta.gid()) != owner {
        std::os::unix::fs::lchown(path, Some(owner.0), Some(owner.1))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            give(&entry?.path(), keep, log, owner)?;
        }
    }
    Ok(())
}

/// For each of `targets`, the directories on its way that the stage user cannot search,
/// each with the entry under it on the way: `(closed, entry)` pairs, shallowest first,
/// none twice. A target that is itself closed is left as it is (what the stage gets is
/// then the kernel's "permission denied", as for any user).
pub(super) fn closed_on_the_way(targets: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
    let mut pairs: Vec<(PathBuf, PathBuf)> = Vec::new();
    for target in targets {
        let ancestors: Vec<&Path> = target.ancestors().collect();
        // From `/` down: each directory with the next one on the way.
        for pair in ancestors.windows(2).rev() {
            let (entry, dir) = (pair[0], pair[1]);
            if !searchable(dir) && !pairs.iter().any(|(d, e)| d == dir && e == entry) {
                pairs.push((dir.to_path_buf(), entry.to_path_buf()));
            }
        }
    }
    pairs.sort_by_key(|(d, e)| (d.components().count(), d.clone(), e.clone()));
    pairs
}

/// Whether the stage user (no supplementary group) may search directory `dir`: looked up
/// once per engine process (the directories above the engine's paths change rarely, and
/// every attempt asks about the same ones).
fn searchable(dir: &Path) -> bool {
    static SEEN: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, bool>>> =
        std::sync::Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let seen = seen.get_or_insert_with(Default::default);
    if let Some(known) = seen.get(dir) {
        return *known;
    }
    let answer = look_up(dir);
    // Each attempt's own directories are new: a bound, not a record of every attempt.
    if seen.len() >= 4096 {
        seen.clear();
    }
    seen.insert(dir.to_path_buf(), answer);
    answer
}

fn look_up(dir: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else {
        return true;
    };
    open_to_stage(&meta, 0o1)
}

/// Whether the stage user (no supplementary group) has the permission bits `need`
/// (written as other's: `0o1` search, `0o4` read, `0o5` list) on `meta`'s file, by its
/// owner's, group's or other's bits as it is owner, group or neither.
pub(super) fn open_to_stage(meta: &std::fs::Metadata, need: u32) -> bool {
    let shift = if meta.uid() == STAGE_ID {
        6
    } else if meta.gid() == STAGE_ID {
        3
    } else {
        0
    };
    (meta.mode() >> shift) & need == need
}

/// What the stage user needs of `meta`'s file to use it: to list a directory, to read a
/// file ([`open_to_stage`]'s `need`).
pub(super) fn to_use(meta: &std::fs::Metadata) -> u32 {
    if meta.is_dir() {
        0o5
    } else {
        0o4
    }
}
