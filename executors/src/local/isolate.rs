//! Isolating an attempt: its namespaces and mounts (see the executor's docs for every
//! layer), as a [`MountPlan`] the attempt's process applies to itself before it execs
//! ([`super::launch`]): it mounts, enters the stage user namespace (a root engine's),
//! drops capabilities and installs its seccomp filter ([`MountPlan::apply`]). Where a
//! prepared sandbox holds the part every attempt of the home shares, the plan is applied
//! in two parts ([`MountPlan::apply_shared`], [`MountPlan::apply_own`]).
//!
//! Unsafe code lives here, each block with what makes it sound.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use drivetrain_engine::executor::{PathAccess, SecretFiles};
use nix::libc;

use super::secret_mount::SecretMount;
use super::volume_mount::VolumeMount;
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
    /// Where the attempt's own mounts begin in `mounts` (its writable paths and what is
    /// put back under a hidden directory), all before being the same for every attempt of
    /// the home (its read-only views, what is hidden): the part a prepared sandbox holds
    /// ([`super::sandbox`]). `None` where the two are not apart.
    own_from: Option<usize>,
    /// The hidden directories the attempt's own mounts are under.
    own_hides: Vec<CString>,
    /// Its volumes, mounted after its view of the home: its own.
    volumes: Vec<VolumeMount>,
    /// Its secrets as files, mounted after everything else: its own.
    secrets: Vec<SecretMount>,
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
        /// The hidden directory it is under.
        hide: CString,
        /// The mount point's way in the tmpfs, made first: directories, the last a file
        /// where what is put back is one (`file`).
        dirs: Vec<CString>,
        file: bool,
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
        let user = user_namespace(layers)?;
        let read_only: Vec<PathBuf> = access
            .iter()
            .filter(|a| !a.writable)
            .map(|a| a.path.clone())
            .collect();
        let (mut mounts, given) = match user {
            Userns::Stage(_) => give_to_stage(access, reach, log, &read_only)?,
            _ => (Vec::with_capacity(access.len()), Vec::new()),
        };
        // What a tmpfs over a closed directory already hides needs no mount of its own
        // (nor could have one: it is not there).
        let unseen: Vec<bool> = access
            .iter()
            .map(|a| a.hidden && hidden_by_the_way(&mounts, &a.path))
            .collect();
        // Which hidden paths are directories (and mounted), asked once each.
        let hidden_dir: Vec<bool> = (access.iter().zip(&unseen))
            .map(|(a, unseen)| a.hidden && !unseen && a.path.is_dir())
            .collect();
        let hidden_dirs = || {
            (0..access.len())
                .filter(|&j| hidden_dir[j])
                .map(|j| &access[j].path)
        };
        // Nothing on the way to what is hidden may be the attempt's own (a closed
        // directory's entry that is itself hidden, as `work/` in a closed home, is the
        // same for every attempt).
        let mut own_from = (!mounts.iter().any(|m| {
            let path = Path::new(std::ffi::OsStr::from_bytes(m.path.as_bytes()));
            hidden_dirs().any(|h| path.starts_with(h) && path != h)
        }))
        .then_some(mounts.len());
        for (i, a) in access.iter().enumerate() {
            if unseen[i] {
                continue;
            }
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
                    hide: c_path(h)?,
                    file: !a.path.is_dir(),
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
            let own = a.writable || matches!(kind, Kind::Reattach { .. });
            own_from = match own_from {
                Some(from) if !own && from == mounts.len() => Some(from + 1),
                Some(_) if !own => None,
                from => from,
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
            own_hides: own_from
                .map(|from| own_hides(&mounts[from..]))
                .unwrap_or_default(),
            mounts,
            own_from,
            volumes: Vec::new(),
            secrets: Vec::new(),
            given,
            read_only,
            log: log.to_path_buf(),
        })
    }

    /// Mounts `secrets` as files in the attempt ([`SecretMount`]), owned by its user; an
    /// error naming the secret that cannot be.
    pub(super) fn mount_secrets(&mut self, secrets: &[SecretFiles]) -> Result<(), String> {
        let owner = matches!(self.user, Userns::Stage(_)).then_some(userns::STAGE_ID);
        self.secrets = SecretMount::plan(secrets, owner)?;
        Ok(())
    }

    /// Mounts `volumes` in the attempt ([`VolumeMount`]), a scratch one made in
    /// `attempt_dir` (and given to the stage user), none meeting what `access` keeps the
    /// engine's; an error naming the volume that cannot be.
    pub(super) fn mount_volumes(
        &mut self,
        volumes: &[drivetrain_engine::spec::VolumeSpec],
        attempt_dir: &Path,
        access: &[PathAccess],
    ) -> Result<(), String> {
        let stage_user = matches!(self.user, Userns::Stage(_)).then_some(userns::STAGE_ID);
        for v in volumes {
            let (mount, made) = VolumeMount::new(v, attempt_dir, stage_user, access)?;
            if let (Some(dir), Some(id)) = (made, stage_user) {
                userns::give(&dir, &[], &self.log, (id, id))
                    .map_err(|e| format!("volume `{}`: {e}", v.name))?;
                self.given.push(dir);
            }
            self.volumes.push(mount);
        }
        Ok(())
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

    /// Whether the attempt has a PID namespace of its own.
    pub(super) fn pid(&self) -> bool {
        self.pid
    }

    /// The namespaces the child is cloned into.
    pub(super) fn clone_flags(&self) -> nix::sched::CloneFlags {
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
    pub(super) fn apply(&self) -> std::io::Result<()> {
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
        private_root()?;
        let all = 0..self.mounts.len();
        self.capture(all.clone())?;
        self.mount_range(all)?;
        if self.pid {
            mount_proc(None)?;
        }
        self.dev.mount()?;
        for v in &self.volumes {
            v.mount()?;
        }
        for s in &self.secrets {
            s.mount()?;
        }
        kernel::protect()?;
        if self.net {
            kernel::loopback_up()?;
        }
        self.confine()
    }

    /// What a prepared sandbox holds for every attempt of the home
    /// ([`super::sandbox`]): its view of the home and what is hidden, `/proc` (whose
    /// processes a stage sees only where it may trace them: not the sandbox's init),
    /// `/dev` (the sandbox's init empties `/dev/shm` after each attempt), the kernel's
    /// files protected. In the sandbox init's child, before it execs; it keeps its
    /// capabilities.
    pub(super) fn apply_shared(&self) -> std::io::Result<()> {
        let shared = 0..self.own_from.unwrap_or(self.mounts.len());
        private_root()?;
        self.capture(shared.clone())?;
        self.mount_range(shared)?;
        mount_proc(Some(c"hidepid=invisible"))?;
        self.dev.mount()?;
        kernel::protect()
    }

    /// In the attempt's process, still in the engine's mount namespace: captures
    /// the trees of its own paths under hidden directories ([`MountPlan::apply_own`]).
    pub(super) fn capture_own(&self) -> std::io::Result<()> {
        self.capture(self.own_from.unwrap_or(self.mounts.len())..self.mounts.len())
    }

    /// In the sandbox's mount namespace: the attempt's own paths, each hidden directory
    /// they are under an empty tmpfs of the attempt's over the sandbox's (so nothing of
    /// an earlier attempt stays). Undone by the sandbox's init when the attempt has ended
    /// ([`MountPlan::own_mount_points`]).
    pub(super) fn apply_own(&self) -> std::io::Result<()> {
        for h in &self.own_hides {
            hide_dir(h)?;
        }
        self.mount_range(self.own_from.unwrap_or(self.mounts.len())..self.mounts.len())?;
        for h in &self.own_hides {
            seal(h)?;
        }
        for v in &self.volumes {
            v.mount()?;
        }
        for s in &self.secrets {
            s.mount()?;
        }
        Ok(())
    }

    /// Where [`MountPlan::apply_own`] mounts, last first: what the sandbox's init
    /// detaches after the attempt.
    pub(super) fn own_mount_points(&self) -> Vec<CString> {
        let from = self.own_from.unwrap_or(self.mounts.len());
        let secrets = self.secrets.iter().rev().map(|s| s.path().to_owned());
        let volumes = self.volumes.iter().rev().map(|v| v.path().to_owned());
        let binds = self.mounts[from..]
            .iter()
            .rev()
            .filter(|m| matches!(m.kind, Kind::Bind))
            .map(|m| m.path.clone());
        secrets
            .chain(volumes)
            .chain(binds)
            .chain(self.own_hides.iter().cloned())
            .collect()
    }

    /// The prepared sandbox an attempt with this plan can run in ([`super::sandbox`]),
    /// named by what it holds (the same for every attempt of the home); `None` where the
    /// attempt needs namespaces of its own: an engine that is not root, no PID
    /// namespace, `network: none`, GPUs, a distributed attempt's shared `/dev/shm`.
    pub(super) fn sandbox_key(&self) -> Option<String> {
        let from = self.own_from?;
        if !self.pid || self.net || !self.dev.is_usual() || !matches!(self.user, Userns::Stage(_)) {
            return None;
        }
        let mut key = format!("shm {:?}\n", self.dev.shm_options());
        for m in &self.mounts[..from] {
            let (tag, extra) = match &m.kind {
                Kind::Bind => ("bind", None),
                Kind::HideDir => ("hide", None),
                Kind::HideFile { empty } => ("hide-file", empty.as_ref()),
                Kind::Reattach { hide, .. } => ("reattach", Some(hide)),
            };
            key.push_str(&format!(
                "{tag} {} {:?} {:?}\n",
                if m.writable { "rw" } else { "ro" },
                m.path,
                extra
            ));
        }
        Some(key)
    }

    /// Enters the stage user namespace (a root engine's), drops capabilities and installs
    /// the seccomp filter: the last steps before `exec`.
    pub(super) fn confine(&self) -> std::io::Result<()> {
        if let Userns::Stage(fd) = self.user {
            userns::enter(fd)?;
        }
        drop_capabilities()?;
        if let Some(program) = self.seccomp {
            seccomp::install(program)?;
        }
        Ok(())
    }

    /// Captures the trees that stay visible under a hidden directory, among `range`,
    /// before anything is hidden.
    fn capture(&self, range: std::ops::Range<usize>) -> std::io::Result<()> {
        for m in &self.mounts[range] {
            if let Kind::Reattach { fd, .. } = &m.kind {
                let tree = kernel::open_tree(&m.path, libc::AT_RECURSIVE as libc::c_uint)?;
                fd.store(tree, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// Makes the mounts in `range` ([`MountPlan::capture`] first), then seals the hiding
    /// tmpfs among them read-only.
    fn mount_range(&self, range: std::ops::Range<usize>) -> std::io::Result<()> {
        use nix::mount::{mount, MsFlags};
        let none: Option<&CStr> = None;
        for m in &self.mounts[range.clone()] {
            let p = m.path.as_c_str();
            match &m.kind {
                Kind::HideDir => {
                    hide_dir(p)?;
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
                Kind::Reattach { dirs, fd, file, .. } => {
                    for (i, d) in dirs.iter().enumerate() {
                        let mode = nix::sys::stat::Mode::from_bits_truncate(0o755);
                        // A file is put back onto an empty file, a directory onto one.
                        let made = match *file && i + 1 == dirs.len() {
                            true => nix::fcntl::open(
                                d.as_c_str(),
                                nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
                                mode,
                            )
                            .map(drop),
                            false => nix::unistd::mkdir(d.as_c_str(), mode),
                        };
                        match made {
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
        for m in &self.mounts[range] {
            if let Kind::HideDir = m.kind {
                seal(&m.path)?;
            }
        }
        Ok(())
    }
}

/// The attempt's user namespace with `layers`: none, its own (a user's engine: its uid
/// mapped to itself) or the stage namespace (a root engine's: host `nobody`).
fn user_namespace(layers: Layers) -> std::io::Result<Userns> {
    let c = |s: String| CString::new(s).expect("no NUL");
    Ok(match (layers.user, nix::unistd::geteuid().is_root()) {
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
    })
}

/// A path as the kernel takes it.
fn c_path(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("path {} has a NUL byte", p.display())))
}

/// For the stage user (a root engine's attempt): gives it what it may write and opens
/// the way to what it needs (`reach` and `access`) through directories closed to it.
/// The mounts that make that way, and the paths given (to take back after).
fn give_to_stage(
    access: &[PathAccess],
    reach: &[PathBuf],
    log: &Path,
    read_only: &[PathBuf],
) -> std::io::Result<(Vec<Mount>, Vec<PathBuf>)> {
    let mut mounts = Vec::with_capacity(access.len());
    let mut given = Vec::new();
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
        let hide = c_path(&dir)?;
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
                hide,
                dirs: vec![c_path(&entry)?],
                file: !entry.is_dir(),
                fd: AtomicI32::new(-1),
            },
        });
    }
    Ok((mounts, given))
}

/// Whether `path` is under a closed directory that [`give_to_stage`] hides and no entry
/// of it put back leads to `path`.
fn hidden_by_the_way(mounts: &[Mount], path: &Path) -> bool {
    let as_path = |c: &CString| PathBuf::from(std::ffi::OsStr::from_bytes(c.as_bytes()));
    mounts.iter().any(|m| {
        let dir = as_path(&m.path);
        matches!(m.kind, Kind::HideDir)
            && path.starts_with(&dir)
            && path != dir
            && !mounts.iter().any(|e| match &e.kind {
                Kind::Reattach { hide, .. } => {
                    as_path(hide) == dir && path.starts_with(as_path(&e.path))
                }
                _ => false,
            })
    })
}

/// The hidden directories that the attempt's own mounts (`mounts`) are re-attached under.
fn own_hides(mounts: &[Mount]) -> Vec<CString> {
    let mut hides: Vec<CString> = Vec::new();
    for m in mounts {
        if let Kind::Reattach { hide, .. } = &m.kind {
            if !hides.contains(hide) {
                hides.push(hide.clone());
            }
        }
    }
    hides
}

/// Nothing mounted in the child's namespace propagates back to the engine's.
fn private_root() -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    let none: Option<&CStr> = None;
    Ok(mount(
        none,
        c"/",
        none,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        none,
    )?)
}

/// An empty tmpfs over `path`, writable until [`seal`]ed.
fn hide_dir(path: &CStr) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    Ok(mount(
        Some(c"tmpfs"),
        path,
        Some(c"tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(c"mode=0755,size=64k"),
    )?)
}

/// The hiding tmpfs at `path` read-only.
fn seal(path: &CStr) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    let none: Option<&CStr> = None;
    Ok(mount(
        none,
        path,
        none,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        none,
    )?)
}

/// A `/proc` of the child's PID namespace, with `options`.
fn mount_proc(options: Option<&CStr>) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    Ok(mount(
        Some(c"proc"),
        c"/proc",
        Some(c"proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        options,
    )?)
}

/// Why an attempt that must have every layer cannot start: `missing` says which.
pub(super) fn refused(missing: &str) -> String {
    format!(
        "cannot isolate the attempt: {missing}, and DRIVETRAIN_ISOLATION=required runs a stage with every layer or not at all"
    )
}
