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
    // `/sys` and every mount under it, in one call.
    mount(
        Some(c"/sys"),
        c"/sys",
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )?;
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
