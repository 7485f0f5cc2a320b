//! The system calls an isolated attempt may not make: a seccomp filter, compiled once
//! with `seccompiler` (rust-vmm's) and installed by the child last, after it has dropped
//! its capabilities and just before `exec`. A denied call fails with `EPERM`, as under
//! Docker's default profile, whose list this follows: loading kernel modules, `kexec`,
//! `reboot`, swap, the clock, kernel keyrings, `bpf` and `perf_event_open`, mounting
//! and namespaces (`mount`, `umount2`, the new mount API, `unshare`, `setns`, `pivot_root`),
//! file handles that bypass paths (`open_by_handle_at`), `userfaultfd`, `io_uring`, other
//! processes' memory, `acct`, `quotactl`, `syslog`; on x86-64 also `iopl`, `ioperm` and the
//! old ones Docker lists. Everything else is allowed: the filter is a deny list, so that
//! any program a stage runs today still runs.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};

/// The denied system calls on every architecture.
const DENIED: &[libc::c_long] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fsopen,
    libc::SYS_fspick,
    libc::SYS_init_module,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_io_uring_setup,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_open_tree,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapoff,
    libc::SYS_swapon,
    libc::SYS_syslog,
    libc::SYS_umount2,
    libc::SYS_unshare,
    libc::SYS_userfaultfd,
    libc::SYS_vhangup,
];

/// Denied where the architecture has them.
#[cfg(target_arch = "x86_64")]
const DENIED_HERE: &[libc::c_long] = &[
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_lookup_dcookie,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    libc::SYS_uselib,
    libc::SYS_ustat,
];
#[cfg(not(target_arch = "x86_64"))]
const DENIED_HERE: &[libc::c_long] = &[];

/// The filter for this machine's architecture, compiled once; `Err` says why there is
/// none (an architecture seccompiler does not know).
pub(super) fn filter() -> Result<&'static BpfProgram, String> {
    static FILTER: std::sync::OnceLock<Result<BpfProgram, String>> = std::sync::OnceLock::new();
    FILTER
        .get_or_init(|| {
            let arch = std::env::consts::ARCH
                .try_into()
                .map_err(|e| format!("no seccomp filter for {}: {e}", std::env::consts::ARCH))?;
            let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = DENIED
                .iter()
                .chain(DENIED_HERE)
                .map(|nr| (*nr, Vec::new()))
                .collect();
            SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(libc::EPERM as u32),
                arch,
            )
            .and_then(BpfProgram::try_from)
            .map(deny_x32)
            .map_err(|e| format!("cannot compile the seccomp filter: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// On x86-64 the x32 ABI reaches the same calls with bit 30 set in their numbers, under
/// the same audit architecture: past the architecture check seccompiler puts first, every
/// number with that bit is denied, so no call on the list is reachable through it.
fn deny_x32(mut program: BpfProgram) -> BpfProgram {
    use seccompiler::sock_filter;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JGE | BPF_K, BPF_RET | BPF_K.
    const LOAD_WORD: u16 = 0x20;
    const JUMP_GE: u16 = 0x35;
    const RETURN: u16 = 0x06;
    let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
    let arch_check = 3.min(program.len());
    program.splice(
        arch_check..arch_check,
        [
            // The syscall number (offset 0 of `seccomp_data`).
            op(LOAD_WORD, 0, 0, 0),
            // >= the x32 bit: the next instruction (deny), else skip it.
            op(JUMP_GE, 0, 1, X32_SYSCALL_BIT),
            op(RETURN, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ],
    );
    program
}

/// In the child, last before `exec`: installs `program` (no allocation on the way; an
/// error is the kernel's errno).
pub(super) fn install(program: &BpfProgram) -> std::io::Result<()> {
    seccompiler::apply_filter(program).map_err(|e| match e {
        seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
        _ => std::io::Error::from_raw_os_error(libc::EINVAL),
    })
}
