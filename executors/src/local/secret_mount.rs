//! A stage's secrets mounted as files in its isolated attempt (`secrets[].mount_path`), as
//! Docker's `--secret` does: a small tmpfs over an existing directory of the attempt's
//! view, a read-only file per key (mode 0400, the stage user's), the mount read-only,
//! `nosuid`, `nodev`, `noexec`. Nothing is written to a disk; the mount lives in the
//! attempt's mount namespace only and ends with it (a prepared sandbox's init detaches
//! it after the attempt, [`super::isolate::MountPlan::own_mount_points`]).

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use drivetrain_engine::executor::SecretFiles;

/// One secret's mount, allocated before the clone: the child makes system calls only.
pub(super) struct SecretMount {
    path: CString,
    /// The tmpfs's options: its mode, size and (a root engine's stage) owner.
    options: CString,
    /// Each file's path and value.
    files: Vec<(CString, Vec<u8>)>,
    /// The host uid and gid the files are given (a root engine's stage user).
    owner: Option<u32>,
}

impl SecretMount {
    /// The mounts for `secrets`, their files owned by `owner` where set; an error naming
    /// the secret where its `mount_path` is no directory this machine has, or is one the
    /// attempt gets its own of.
    pub(super) fn plan(
        secrets: &[SecretFiles],
        owner: Option<u32>,
    ) -> Result<Vec<SecretMount>, String> {
        secrets.iter().map(|s| SecretMount::new(s, owner)).collect()
    }

    fn new(secret: &SecretFiles, owner: Option<u32>) -> Result<SecretMount, String> {
        let path = &secret.mount_path;
        let named = |why: &str| {
            format!(
                "secret `{}` cannot be mounted at {}: {why}",
                secret.name,
                path.display()
            )
        };
        if ["/dev", "/proc", "/sys"]
            .iter()
            .any(|k| path.starts_with(k))
        {
            return Err(named(
                "an isolated stage gets its own /dev, /proc and /sys; choose a directory elsewhere",
            ));
        }
        if !path.is_absolute() || !path.is_dir() {
            return Err(named("the local executor mounts a secret over a directory that exists on this machine (whatever it holds is hidden from the stage); create it, or choose another `mount_path`"));
        }
        let c =
            |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| named("NUL in the path"));
        let bytes: usize = secret.files.iter().map(|(_, v)| v.len()).sum();
        // A page per file and the directory, and room for the values.
        let size_kib = bytes / 1024 + 4 * (secret.files.len() + 2) + 4;
        let owner_opts = owner
            .map(|id| format!(",uid={id},gid={id}"))
            .unwrap_or_default();
        Ok(SecretMount {
            path: c(path)?,
            options: CString::new(format!("mode=0500,size={size_kib}k{owner_opts}"))
                .expect("no NUL"),
            files: secret
                .files
                .iter()
                .map(|(key, value)| Ok((c(&path.join(key))?, value.clone())))
                .collect::<Result<_, String>>()?,
            owner,
        })
    }

    /// Where it mounts.
    pub(super) fn path(&self) -> &CStr {
        &self.path
    }

    /// In the attempt's mount namespace, before it is confined: the tmpfs, its files, and
    /// the mount read-only. System calls only, no allocation.
    pub(super) fn mount(&self) -> std::io::Result<()> {
        use nix::fcntl::OFlag;
        use nix::mount::{mount, MsFlags};
        mount(
            Some(c"tmpfs"),
            self.path.as_c_str(),
            Some(c"tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some(self.options.as_c_str()),
        )?;
        for (file, value) in &self.files {
            let fd = nix::fcntl::open(
                file.as_c_str(),
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::from_bits_truncate(0o400),
            )?;
            let mut rest = value.as_slice();
            while !rest.is_empty() {
                let n = nix::unistd::write(&fd, rest)?;
                rest = &rest[n..];
            }
            if let Some(id) = self.owner {
                let id = Some(nix::unistd::Uid::from_raw(id));
                let gid = id.map(|u| nix::unistd::Gid::from_raw(u.as_raw()));
                nix::unistd::fchown(&fd, id, gid)?;
            }
        }
        // Read-only now, as the hiding tmpfs is sealed.
        let none: Option<&CStr> = None;
        let flags = MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC;
        Ok(mount(none, self.path.as_c_str(), none, flags, none)?)
    }
}
