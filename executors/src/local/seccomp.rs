//! The system calls an isolated attempt may not make: a seccomp filter, built once (a
//! binary search over the denied numbers; rust-vmm's `seccompiler` installs it and, in
//! the tests, compiles the same list for comparison) and installed by the child last, after it has dropped
//! its capabilities and just before `exec`. A denied call fails with `EPERM`, as under
//! Docker's default profile, whose list this follows: loading kernel modules, `kexec`,
//! `reboot`, swap, the clock, kernel keyrings, `bpf` and `perf_event_open`, mounting
//! and namespaces (`mount`, `umount2`, the new mount API, `unshare`, `setns`, `pivot_root`,
//! `clone` with a namespace flag; `clone3`, whose flags are in memory a filter cannot
//! read, answers `ENOSYS`, and the C library falls back to `clone`),
//! file handles that bypass paths (`open_by_handle_at`), `userfaultfd`, `io_uring`, other
//! processes' memory, `acct`, `quotactl`, `syslog`; on x86-64 also `iopl`, `ioperm` and the
//! old ones Docker lists. Everything else is allowed: the filter is a deny list, so that
//! any program a stage runs today still runs.

use nix::libc;
use seccompiler::BpfProgram;

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

/// `seccomp_data.arch` of this machine's native calls (`AUDIT_ARCH_*` in `linux/audit.h`).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00F3);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const AUDIT_ARCH: Option<u32> = None;

/// On x86-64 the x32 ABI reaches the same calls with bit 30 set in their numbers, under
/// the same audit architecture: every number with that bit is denied, so no call on the
/// list is reachable through it.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (`linux/bpf_common.h`): BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K,
// BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K.
const LOAD_WORD: u16 = 0x20;
const JUMP_EQ: u16 = 0x15;
const JUMP_GE: u16 = 0x35;
/// BPF_JMP|BPF_JSET|BPF_K: taken when the accumulator has any bit of `k`.
const JUMP_SET: u16 = 0x45;
const RETURN: u16 = 0x06;
/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The low 32 bits of the first argument (`args[0]`), where `clone` takes its flags.
#[cfg(target_endian = "little")]
const ARG0_LOW: u32 = 16;
#[cfg(target_endian = "big")]
const ARG0_LOW: u32 = 20;
const DENY: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
/// What `clone3` gets: "not implemented", so that the C library falls back to `clone`,
/// whose flags the filter can read (`clone3` passes them in memory it cannot).
const NO_CLONE3: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
/// The `clone` flags that make a namespace (user, mount, PID, network, IPC, UTS, cgroup):
/// refused, as Docker's profile refuses them to a container without `CAP_SYS_ADMIN`.
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u32;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// The filter for this machine's architecture, built once; `Err` says why there is none
/// (an architecture without a known audit value).
///
/// Another architecture's calls (i386's `int 0x80` on x86-64) kill the process, as under
/// seccompiler; then the number is looked up in the denied list by binary search, not
/// one comparison after another as seccompiler compiles it. That matters at every
/// install: the kernel runs the filter once per system call number to cache the ones it
/// always allows, with interrupts off, and that pass took most of the time `seccomp`
/// costs a stage (bench/README.md, "Containment"). The test compares the verdicts with
/// seccompiler's compilation of the same list, for every number.
pub(super) fn filter() -> Result<&'static BpfProgram, String> {
    static FILTER: std::sync::OnceLock<Result<BpfProgram, String>> = std::sync::OnceLock::new();
    FILTER
        .get_or_init(|| {
            let arch = AUDIT_ARCH
                .ok_or_else(|| format!("no seccomp filter for {}", std::env::consts::ARCH))?;
            let mut denied: Vec<u32> = DENIED
                .iter()
                .chain(DENIED_HERE)
                .map(|nr| *nr as u32)
                .collect();
            denied.sort_unstable();
            denied.dedup();
            let mut program = vec![
                op(LOAD_WORD, 0, 0, ARCH),
                op(JUMP_EQ, 1, 0, arch),
                op(RETURN, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
                op(LOAD_WORD, 0, 0, NR),
            ];
            if cfg!(target_arch = "x86_64") {
                program.extend([op(JUMP_GE, 0, 1, X32_SYSCALL_BIT), op(RETURN, 0, 0, DENY)]);
            }
            program.extend([
                op(JUMP_EQ, 0, 1, libc::SYS_clone3 as u32),
                op(RETURN, 0, 0, NO_CLONE3),
                // `clone` with a namespace flag: denied; without: allowed (it is on no
                // list).
                op(JUMP_EQ, 0, 4, libc::SYS_clone as u32),
                op(LOAD_WORD, 0, 0, ARG0_LOW),
                op(JUMP_SET, 0, 1, NAMESPACE_FLAGS),
                op(RETURN, 0, 0, DENY),
                op(RETURN, 0, 0, ALLOW),
            ]);
            search(&denied, &mut program)?;
            Ok(program)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Appends the instructions that return [`DENY`] when the accumulator is one of `denied`
/// (sorted) and [`ALLOW`] otherwise: a comparison per level down to groups of four.
fn search(denied: &[u32], program: &mut BpfProgram) -> Result<(), String> {
    const LEAF: usize = 4;
    if denied.len() <= LEAF {
        let n = denied.len();
        for (i, nr) in denied.iter().enumerate() {
            // On a match, past the remaining comparisons and the ALLOW, to the DENY.
            program.push(op(JUMP_EQ, (n - i) as u8, 0, *nr));
        }
        program.extend([op(RETURN, 0, 0, ALLOW), op(RETURN, 0, 0, DENY)]);
        return Ok(());
    }
    let (low, high) = denied.split_at(denied.len() / 2);
    let mut lower = Vec::new();
    search(low, &mut lower)?;
    let skip = u8::try_from(lower.len())
        .map_err(|_| "the seccomp filter's jump is too long".to_string())?;
    // At or above the upper half's first number: skip the lower half's instructions.
    program.push(op(JUMP_GE, skip, 0, high[0]));
    program.extend(lower);
    search(high, program)
}

/// In the child, last before `exec`: installs `program` (no allocation on the way; an
/// error is the kernel's errno).
pub(super) fn install(program: &BpfProgram) -> std::io::Result<()> {
    seccompiler::apply_filter(program).map_err(|e| match e {
        seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
        _ => std::io::Error::from_raw_os_error(libc::EINVAL),
    })
}

#[cfg(test)]
#[allow(unsafe_code)] // fork, install, then raw system calls in the child
mod tests {
    use super::*;

    /// What the kernel's classic BPF does with the four kinds of instruction both
    /// compilations use, for one call.
    fn verdict(program: &BpfProgram, arch: u32, nr: u32) -> u32 {
        verdict_of(program, arch, nr, 0)
    }

    /// [`verdict`] of a call whose first argument's low 32 bits are `arg0`.
    fn verdict_of(program: &BpfProgram, arch: u32, nr: u32, arg0: u32) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            pc += 1;
            match i.code {
                LOAD_WORD => {
                    acc = match i.k {
                        ARCH => arch,
                        ARG0_LOW => arg0,
                        _ => nr,
                    }
                }
                JUMP_EQ | JUMP_GE | JUMP_SET => {
                    let taken = match i.code {
                        JUMP_EQ => acc == i.k,
                        JUMP_GE => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                // BPF_JMP|BPF_JA, which seccompiler uses between rules.
                0x05 => pc += i.k as usize,
                RETURN => return i.k,
                other => panic!("instruction {other:#x} not emulated"),
            }
        }
    }

    /// seccompiler's compilation of the same list: the reference the search is held to.
    fn reference() -> BpfProgram {
        use seccompiler::{SeccompAction, SeccompFilter};
        let rules = DENIED
            .iter()
            .chain(DENIED_HERE)
            .map(|nr| (*nr, Vec::new()))
            .collect();
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            std::env::consts::ARCH.try_into().unwrap(),
        )
        .unwrap();
        BpfProgram::try_from(filter).unwrap()
    }

    #[test]
    fn every_number_gets_seccompilers_verdict() {
        let ours = filter().unwrap();
        let theirs = reference();
        let arch = AUDIT_ARCH.unwrap();
        let mut denied = 0;
        for nr in 0..2048 {
            if nr == libc::SYS_clone3 as u32 {
                continue;
            }
            let v = verdict(ours, arch, nr);
            assert_eq!(v, verdict(&theirs, arch, nr), "system call {nr}");
            denied += usize::from(v == DENY);
            if cfg!(target_arch = "x86_64") {
                assert_eq!(
                    verdict(ours, arch, nr | X32_SYSCALL_BIT),
                    DENY,
                    "x32 call {nr}"
                );
            }
        }
        assert_eq!(denied, DENIED.len() + DENIED_HERE.len());
        // `clone3` is "not implemented"; `clone` makes no namespace, whatever else it does.
        assert_eq!(verdict(ours, arch, libc::SYS_clone3 as u32), NO_CLONE3);
        let clone = libc::SYS_clone as u32;
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            let flags = (flag | libc::SIGCHLD) as u32;
            assert_eq!(verdict_of(ours, arch, clone, flags), DENY, "{flags:#x}");
        }
        // What fork and pthread_create pass.
        for flags in [
            libc::SIGCHLD | libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID,
            libc::CLONE_VM
                | libc::CLONE_FS
                | libc::CLONE_FILES
                | libc::CLONE_SIGHAND
                | libc::CLONE_THREAD
                | libc::CLONE_SYSVSEM
                | libc::CLONE_SETTLS
                | libc::CLONE_PARENT_SETTID
                | libc::CLONE_CHILD_CLEARTID,
        ] {
            assert_eq!(
                verdict_of(ours, arch, clone, flags as u32),
                ALLOW,
                "{flags:#x}"
            );
        }
        // i386's calls on x86-64 (AUDIT_ARCH_I386): killed, as seccompiler does.
        assert_eq!(
            verdict(ours, 0x4000_0003, 1),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        assert_eq!(
            verdict(&theirs, 0x4000_0003, 1),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        assert!(
            ours.len() < theirs.len() / 2,
            "{} vs {}",
            ours.len(),
            theirs.len()
        );
    }

    /// The kernel takes the filter, and a process under it gets `EPERM` for a denied call
    /// and its x32 twin, and an answer for any other.
    #[test]
    fn the_kernel_refuses_what_the_filter_denies() {
        let program = filter().unwrap();
        // SAFETY: the forked child makes system calls only, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            unsafe {
                let code = if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || install(program).is_err()
                {
                    10
                } else if libc::syscall(libc::SYS_unshare, 0) != -1
                    || *libc::__errno_location() != libc::EPERM
                {
                    11
                } else if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) != -1
                    || *libc::__errno_location() != libc::EPERM
                {
                    12
                } else if cfg!(target_arch = "x86_64")
                    && (libc::syscall(libc::SYS_unshare | X32_SYSCALL_BIT as libc::c_long, 0) != -1
                        || *libc::__errno_location() != libc::EPERM)
                {
                    13
                } else if libc::syscall(libc::SYS_getppid) <= 0 {
                    14
                } else if libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) != -1
                    || *libc::__errno_location() != libc::ENOSYS
                {
                    15
                } else {
                    // A child that a namespace flag let through ends at once.
                    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long;
                    match libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) {
                        0 => libc::_exit(0),
                        -1 if *libc::__errno_location() == libc::EPERM => {
                            // And a plain one (what `fork` does) still starts.
                            match libc::syscall(
                                libc::SYS_clone,
                                libc::SIGCHLD as libc::c_long,
                                0,
                                0,
                                0,
                                0,
                            ) {
                                0 => libc::_exit(0),
                                child if child > 0 => {
                                    let mut st = 0;
                                    libc::waitpid(child as libc::pid_t, &mut st, 0);
                                    0
                                }
                                _ => 17,
                            }
                        }
                        _ => 16,
                    }
                };
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "which check failed (see the codes)"
        );
    }
}
