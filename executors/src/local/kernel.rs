//! The kernel's own files in an attempt's mount namespace: what runc does for a
//! container. `/sys` and the parts of `/proc` that change the whole machine
//! (`/proc/sys` with `kernel.core_pattern`, `/proc/sysrq-trigger`, …) are read-only; the
//! ones that show the kernel's memory, keys or timers are masked (an empty read-only
//! tmpfs over a directory, `/dev/null` over a file). Made in the child, after its mounts
//! and before it drops its capabilities: system calls on static strings only.
#![allow(unsafe_code)]

use std::ffi::CStr;

use nix::libc;
use nix::mount::{mount, MsFlags};

const READ_ONLY: &[&CStr] = &[
    c"/proc/bus",
    c"/proc/fs",
    c"/proc/irq",
    c"/proc/sys",
    c"/proc/sysrq-trigger",
];

const MASKED: &[&CStr] = &[
    c"/proc/acpi",
    c"/proc/asound",
    c"/proc/kcore",
    c"/proc/keys",
    c"/proc/latency_stats",
    c"/proc/timer_list",
    c"/proc/timer_stats",
    c"/proc/sched_debug",
    c"/proc/scsi",
    c"/sys/firmware",
    c"/sys/devices/virtual/powercap",
];

/// `struct mount_attr` of `mount_setattr(2)`, which the libc crate does not define.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// In the child: `/sys` and [`READ_ONLY`] read-only, [`MASKED`] masked. A path this
/// kernel does not have is skipped.
pub(super) fn protect() -> std::io::Result<()> {
    let none: Option<&CStr> = None;
    let sealed = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let missing = |e: nix::errno::Errno| e == nix::errno::Errno::ENOENT;
    // `/sys` and every mount under it, in one call on this namespace's own copies of them
    // (no bind needed: adding `MS_RDONLY` is allowed even on mounts locked from a more
    // privileged namespace).
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr with a NUL-terminated path and a struct on this stack.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c"/sys".as_ptr(),
            libc::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    for p in READ_ONLY {
        match mount(Some(*p), *p, none, MsFlags::MS_BIND | MsFlags::MS_REC, none) {
            Err(e) if missing(e) => continue,
            r => r?,
        }
        mount(
            none,
            *p,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | sealed,
            none,
        )?;
    }
    for p in MASKED {
        // SAFETY: stat into a zeroed struct on this stack.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::stat(p.as_ptr(), &mut st) } != 0 {
            continue;
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            mount(
                Some(c"tmpfs"),
                *p,
                Some(c"tmpfs"),
                MsFlags::MS_RDONLY | sealed,
                Some(c"size=0"),
            )?;
        } else {
            mount(Some(c"/dev/null"), *p, none, MsFlags::MS_BIND, none)?;
        }
    }
    Ok(())
}

/// In the child, in its new network namespace: brings `lo` up (`SIOCSIFFLAGS`), the only
/// interface there is.
pub(super) fn loopback_up() -> std::io::Result<()> {
    let last = std::io::Error::last_os_error;
    // SAFETY: socket/ioctl/close on a descriptor this child opens and an `ifreq` on its
    // stack, named `lo`.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(last());
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        ifr.ifr_name[0] = b'l' as libc::c_char;
        ifr.ifr_name[1] = b'o' as libc::c_char;
        let up = if libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            Err(last())
        } else {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr) < 0 {
                Err(last())
            } else {
                Ok(())
            }
        };
        libc::close(sock);
        up
    }
}

/// The devices every isolated attempt gets in its private `/dev`, bound from the host's.
const DEVICES: &[&CStr] = &[
    c"/dev/null",
    c"/dev/zero",
    c"/dev/full",
    c"/dev/random",
    c"/dev/urandom",
    c"/dev/tty",
];

/// The most devices a `/dev` takes (those above, the GPUs given, their control nodes).
const MAX_DEVICES: usize = 64;

/// An attempt's private `/dev`: a tmpfs with only [`DEVICES`] and the GPUs it was given
/// (bound from the host's nodes, so no `mknod` is needed), `/dev/shm`, `/dev/pts`, and
/// the usual links. Made before the clone; set up by the child ([`Dev::mount`]).
#[derive(Debug)]
pub(super) struct Dev {
    devices: Vec<std::ffi::CString>,
    /// Each device's number, where the child makes its nodes with `mknod` (an engine
    /// running as root: cheaper than a bind mount each); empty: bound from the host's.
    numbers: Vec<libc::dev_t>,
    /// The options of `/dev/shm`'s tmpfs; `None`: the host's `/dev/shm` is bound instead
    /// (the ranks of a distributed attempt share it, as NCCL's shared-memory transport
    /// needs).
    shm: Option<std::ffi::CString>,
    /// Whether it has device nodes beyond [`DEVICES`] (the attempt's GPUs).
    gpus: bool,
}

/// The number of the character device at `path`; `None` where there is none.
fn char_device(path: &[u8]) -> Option<libc::dev_t> {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let meta = std::fs::metadata(std::ffi::OsStr::from_bytes(path)).ok()?;
    meta.file_type()
        .is_char_device()
        .then_some(meta.rdev() as libc::dev_t)
}

impl Dev {
    /// `gpus`: device nodes of the GPUs the attempt was given; `shm`: the size of its
    /// `/dev/shm` in bytes (`resources.shm`; `None`: the tmpfs default, half the memory),
    /// or `shared` for the host's.
    pub(super) fn new(gpus: &[std::path::PathBuf], shm: Option<u64>, shared: bool) -> Dev {
        use std::os::unix::ffi::OsStrExt as _;
        // The usual nodes are looked up once: every attempt has them.
        static USUAL: std::sync::OnceLock<Vec<(std::ffi::CString, libc::dev_t)>> =
            std::sync::OnceLock::new();
        let usual = USUAL.get_or_init(|| {
            DEVICES
                .iter()
                .filter_map(|d| char_device(d.to_bytes()).map(|n| ((*d).to_owned(), n)))
                .collect()
        });
        let (devices, numbers): (Vec<std::ffi::CString>, Vec<libc::dev_t>) = usual
            .iter()
            .cloned()
            .chain(gpus.iter().filter_map(|p| {
                let d = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
                char_device(d.as_bytes()).map(|n| (d, n))
            }))
            .take(MAX_DEVICES)
            .unzip();
        let options = match shm {
            Some(bytes) => format!("mode=1777,size={bytes}"),
            None => "mode=1777".to_owned(),
        };
        Dev {
            numbers: if root_of_the_machine() {
                numbers
            } else {
                Vec::new()
            },
            gpus: devices.len() > usual.len(),
            devices,
            shm: (!shared).then(|| std::ffi::CString::new(options).expect("no NUL")),
        }
    }

    /// Whether this `/dev` is the one every attempt gets (no GPU, a `/dev/shm` of its
    /// own), which a prepared sandbox can hold ([`super::sandbox`]).
    pub(super) fn is_usual(&self) -> bool {
        !self.gpus && self.shm.is_some()
    }

    /// In the child: captures the host's nodes, covers `/dev` with a tmpfs, and puts them
    /// back. System calls on memory made before the clone and this stack only.
    pub(super) fn mount(&self) -> std::io::Result<()> {
        let last = std::io::Error::last_os_error;
        let mut trees = [-1i32; MAX_DEVICES + 1];
        let made = !self.numbers.is_empty();
        if !made {
            for (i, d) in self.devices.iter().enumerate() {
                trees[i] = device_tree(d)?;
            }
        }
        let shm_tree = MAX_DEVICES;
        if self.shm.is_none() {
            trees[shm_tree] = device_tree(c"/dev/shm")?;
        }
        // Nodes made here must work: no `nodev` then (the stage cannot make any: no
        // `CAP_MKNOD`, and its user namespace's own nodes never open a device).
        let nodev = if made {
            MsFlags::empty()
        } else {
            MsFlags::MS_NODEV
        };
        mount(
            Some(c"tmpfs"),
            c"/dev",
            Some(c"tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | nodev,
            Some(c"mode=0755,size=1m"),
        )?;
        for (d, number) in self.devices.iter().zip(&self.numbers) {
            // SAFETY: mknod and chmod (past the umask) on a NUL-terminated path.
            unsafe {
                if libc::mknod(d.as_ptr(), libc::S_IFCHR | 0o666, *number) != 0
                    || libc::chmod(d.as_ptr(), 0o666) != 0
                {
                    return Err(last());
                }
            }
        }
        for (i, d) in self.devices.iter().enumerate() {
            if trees[i] < 0 {
                continue;
            }
            // SAFETY: open/close on a NUL-terminated path.
            unsafe {
                let fd = libc::open(
                    d.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o666,
                );
                if fd < 0 {
                    return Err(last());
                }
                libc::close(fd);
            }
            move_tree(trees[i], d)?;
        }
        let dir = |p: &CStr, mode: libc::mode_t| {
            // SAFETY: mkdir on a NUL-terminated path.
            if unsafe { libc::mkdir(p.as_ptr(), mode) } != 0 {
                return Err(last());
            }
            Ok(())
        };
        dir(c"/dev/shm", 0o1777)?;
        match &self.shm {
            Some(options) => mount(
                Some(c"shm"),
                c"/dev/shm",
                Some(c"tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(options.as_c_str()),
            )?,
            None if trees[shm_tree] >= 0 => move_tree(trees[shm_tree], c"/dev/shm")?,
            None => {}
        }
        dir(c"/dev/pts", 0o755)?;
        // A devpts of its own where the kernel gives one (`script`, `ssh -t`, Python's
        // `pty`); without, a stage simply has no terminals.
        if mount(
            Some(c"devpts"),
            c"/dev/pts",
            Some(c"devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=0620"),
        )
        .is_ok()
        {
            symlink(c"pts/ptmx", c"/dev/ptmx")?;
        }
        for (target, link) in [
            (c"/proc/self/fd", c"/dev/fd"),
            (c"/proc/self/fd/0", c"/dev/stdin"),
            (c"/proc/self/fd/1", c"/dev/stdout"),
            (c"/proc/self/fd/2", c"/dev/stderr"),
        ] {
            symlink(target, link)?;
        }
        Ok(())
    }

    /// The options of its `/dev/shm`'s tmpfs; `None`: the host's.
    pub(super) fn shm_options(&self) -> Option<&std::ffi::CStr> {
        self.shm.as_deref()
    }
}

/// Whether this process is root in the machine's own user namespace (the one whose
/// uid map is the whole range), which `mknod` of a device needs; root of a namespace
/// `unshare -U -r` made is not.
fn root_of_the_machine() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| {
        nix::unistd::geteuid().is_root()
            && std::fs::read_to_string("/proc/self/uid_map")
                .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
    })
}

/// A detached copy of the mount at `path` (`open_tree(OPEN_TREE_CLONE)`, with `extra`
/// flags: `AT_RECURSIVE` for a whole tree).
pub(super) fn open_tree(path: &CStr, extra: libc::c_uint) -> std::io::Result<i32> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    // SAFETY: open_tree with a NUL-terminated path and integer flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | extra,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as i32)
}

/// [`open_tree`] of a host device node; -1 where the host has none.
fn device_tree(path: &CStr) -> std::io::Result<i32> {
    match open_tree(path, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(-1),
        r => r,
    }
}

/// Attaches the detached tree `fd` at `path` and closes it.
pub(super) fn move_tree(fd: i32, path: &CStr) -> std::io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    // SAFETY: move_mount of a descriptor this child opened onto a NUL-terminated path;
    // then close it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            path.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: as above.
    unsafe { libc::close(fd) };
    if r < 0 {
        return Err(err);
    }
    Ok(())
}

fn symlink(target: &CStr, link: &CStr) -> std::io::Result<()> {
    // SAFETY: symlink with two NUL-terminated paths.
    if unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
