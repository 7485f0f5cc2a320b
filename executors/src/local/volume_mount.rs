//! A stage's `volumes:` in its isolated attempt, as Docker's `-v` does: `host_path` bound
//! at `mount_path`, and `empty_dir` a fresh directory of the attempt's bound there;
//! read-only where the volume says so, never with set-user-ID files or devices. The
//! mounts live in the attempt's mount namespace only and end with it (a prepared
//! sandbox's init detaches them after the attempt,
//! [`super::isolate::MountPlan::own_mount_points`]).
//!
//! The bind is made with the engine's rights, before the attempt is confined: a host
//! path under directories closed to the stage user is still bound. What the stage then
//! reads of it is as its permissions let the stage user: a root engine's stage is host
//! `nobody`, so a host path closed to others is refused here, saying what to change,
//! rather than failing later with "permission denied".

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use drivetrain_engine::executor::PathAccess;
use drivetrain_engine::spec::VolumeSpec;
use nix::mount::MsFlags;

/// One volume's bind mount, allocated before the clone: the child makes system calls only.
pub(super) struct VolumeMount {
    source: CString,
    target: CString,
    /// The remount's flags: read-only where asked, and what the source's mount already
    /// had (a mount a user namespace may not loosen).
    flags: MsFlags,
}

impl VolumeMount {
    /// The mount of `volume` in the attempt whose directory is `attempt_dir`; `stage_user`:
    /// the uid the stage runs as where it is not the engine's (a root engine's `nobody`).
    /// Also the scratch directory made for it, if any. An error names the volume and
    /// what to change.
    pub(super) fn new(
        volume: &VolumeSpec,
        attempt_dir: &Path,
        stage_user: Option<u32>,
        engine: &[PathAccess],
    ) -> Result<(VolumeMount, Option<PathBuf>), String> {
        let named = |why: String| format!("volume `{}`: {why}", volume.name);
        let target = Path::new(&volume.mount_path);
        if ["/dev", "/proc", "/sys"]
            .iter()
            .any(|k| target.starts_with(k))
        {
            return Err(named(format!(
                "mount_path {} is under /dev, /proc or /sys, which an isolated stage gets its own of: choose a path elsewhere",
                target.display()
            )));
        }
        let (source, made) = match (&volume.host_path, &volume.empty_dir) {
            (Some(h), _) => {
                let host = PathBuf::from(h);
                let meta = std::fs::metadata(&host)
                    .map_err(|e| named(format!("host_path {}: {e}", host.display())))?;
                if let Some(why) = overlap(&host, volume.read_only, engine) {
                    return Err(named(why));
                }
                let need = super::userns::to_use(&meta);
                if let Some(uid) = stage_user.filter(|_| !super::userns::open_to_stage(&meta, need))
                {
                    return Err(named(closed(&host, &meta, uid)));
                }
                (host, None)
            }
            (None, Some(_)) => {
                let dir = attempt_dir.join("volumes").join(&volume.name);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| named(format!("cannot make its directory: {e}")))?;
                (dir.clone(), Some(dir))
            }
            _ => {
                return Err(named(
                    "only `host_path` and `empty_dir` volumes are mounted on this machine".into(),
                ))
            }
        };
        match std::fs::metadata(target) {
            Ok(m) if m.is_dir() == source.is_dir() => {}
            Ok(m) => {
                let kind = |dir: bool| if dir { "directory" } else { "file" };
                return Err(named(format!(
                    "mount_path {} is a {} and what is mounted there a {}",
                    target.display(),
                    kind(m.is_dir()),
                    kind(source.is_dir())
                )));
            }
            Err(_) => {
                return Err(named(format!(
                    "mount_path {} does not exist on this machine: the local executor mounts over a path that exists (whatever it holds is hidden from the stage); create it, or give `mount_path` the host path itself",
                    target.display()
                )))
            }
        }
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| named("NUL in a path".into()))
        };
        let mut flags = kept_flags(&source);
        if volume.read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        let mount = VolumeMount {
            source: c(&source)?,
            target: c(target)?,
            flags,
        };
        Ok((mount, made))
    }

    /// Where it mounts.
    pub(super) fn path(&self) -> &CStr {
        &self.target
    }

    /// In the attempt's mount namespace, before it is confined: the bind, then its flags.
    /// System calls only, no allocation.
    pub(super) fn mount(&self) -> std::io::Result<()> {
        use nix::mount::mount;
        let none: Option<&CStr> = None;
        let (source, target) = (self.source.as_c_str(), self.target.as_c_str());
        mount(
            Some(source),
            target,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )?;
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | self.flags;
        Ok(mount(none, target, none, flags, none)?)
    }
}

/// Why a host path may not be mounted where it meets the engine's own paths (`engine`,
/// the attempt's view of the home): it holds or is under one hidden from stages, or it
/// is writable and holds or is under one the stage may only read.
fn overlap(host: &Path, read_only: bool, engine: &[PathAccess]) -> Option<String> {
    let meets = |p: &Path| host.starts_with(p) || p.starts_with(host);
    if let Some(a) = engine.iter().find(|a| a.hidden && meets(&a.path)) {
        return Some(format!(
            "host_path {} meets {}, which is the engine's and hidden from every stage",
            host.display(),
            a.path.display()
        ));
    }
    let read = engine.iter().find(|a| !a.writable && meets(&a.path));
    match (read, read_only) {
        (Some(a), false) => Some(format!(
            "host_path {} meets {}, which stages may only read: mount it `read_only: true`",
            host.display(),
            a.path.display()
        )),
        _ => None,
    }
}

/// Why a host path is refused: closed to the stage user, and what to do.
fn closed(host: &Path, meta: &std::fs::Metadata, uid: u32) -> String {
    format!(
        "host_path {} (mode {:o}, owner uid {}) is closed to the stage's user: a root engine's stages run as host `nobody` (uid {uid}), which may not {} it. Open it to others (`chmod o+{} {}`), or run the engine as a user who owns it",
        host.display(),
        meta.mode() & 0o7777,
        meta.uid(),
        if meta.is_dir() { "list" } else { "read" },
        if meta.is_dir() { "rx" } else { "r" },
        host.display()
    )
}

/// The flags of the mount `path` is on that a bind of it must keep (a user namespace
/// may not loosen them), with `nosuid` and `nodev` always.
fn kept_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if let Ok(s) = statvfs(path) {
        let f = s.flags();
        for (has, keep) in [
            (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if f.contains(has) {
                flags |= keep;
            }
        }
    }
    flags
}
