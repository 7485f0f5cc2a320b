//! What this machine gives a local attempt's containment, found once by starting `true`
//! with each set of layers (user, mount and PID namespaces, seccomp, a network
//! namespace), and the list `doctor` prints: the host probes, apart from how an attempt
//! is isolated ([`super::isolate`]) and launched ([`super::launch`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use nix::unistd::Pid;

use super::isolate::{Layers, MountPlan};
use super::{launch, seccomp, userns};

/// Whether `true` starts and exits 0 isolated as an attempt is ([`launch::spawn`]) with `layers`.
fn probe(layers: Layers) -> bool {
    probe_with(layers, false)
}

/// [`probe`], in a network namespace of its own too where `net`.
fn probe_with(layers: Layers, net: bool) -> bool {
    let started = (|| {
        let null = Path::new("/dev/null");
        let mut plan = MountPlan::new(&[], layers, &[], null)?;
        plan.net = net;
        let null = std::fs::File::create(null)?;
        let path = std::env::var("PATH").unwrap_or_default();
        let env = BTreeMap::from([("PATH".to_string(), path)]);
        let c = launch::Command {
            program: "true",
            args: &[],
            env: &env,
            cwd: Path::new("/"),
            out: &null,
            pgid: 0,
        };
        launch::spawn(&c, Arc::new(plan))
    })();
    match started {
        Ok(pid) => matches!(
            nix::sys::wait::waitpid(Pid::from_raw(pid), None),
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0))
        ),
        Err(_) => false,
    }
}

/// The layers attempts get here: found once, by starting `true` with each set, most
/// first. A root engine's user namespace is the stage namespace (its stages are host
/// `nobody`); another user's is its own uid mapped to itself.
pub fn available() -> Layers {
    static LAYERS: std::sync::OnceLock<Layers> = std::sync::OnceLock::new();
    *LAYERS.get_or_init(|| {
        let root = nix::unistd::geteuid().is_root();
        let user = !root || userns::stage_userns().is_some();
        let tries = [
            (true, user, true),
            (true, user, false),
            // Root can make the mount namespace without a user namespace.
            (root, false, root),
            (root, false, false),
        ];
        let mut found = tries
            .into_iter()
            .map(|(mount, user, pid)| Layers { mount, user, pid, seccomp: false })
            .find(|l| l.mount && probe(*l))
            .unwrap_or(Layers { mount: false, user: false, pid: false, seccomp: false });
        found.seccomp = found.mount
            && seccomp::filter().is_ok()
            && probe(Layers { seccomp: true, ..found });
        if !found.mount {
            tracing::warn!(
                "no mount namespace for stages here (not root, and no unprivileged user namespaces): \
                 inputs are checked after each attempt instead of protected"
            );
        }
        found
    })
}

/// Whether an attempt can get a network namespace of its own here (`network: none`):
/// found once, by starting `true` in one.
pub fn network_namespaces_work() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let layers = available();
        layers.mount && probe_with(layers, true)
    })
}

/// Whether this process can give its children mount namespaces.
pub fn namespaces_work() -> bool {
    available().mount
}

/// Whether an attempt gets a user namespace of its own here (what `required` needs).
pub fn user_namespaces_work() -> bool {
    available().user
}

/// Each layer of a local attempt's containment and whether this machine gives it, in
/// the order they are set up: what `doctor` lists. Layers not built yet say so.
pub fn layers() -> Vec<(&'static str, bool, String)> {
    let l = available();
    let user = if nix::unistd::geteuid().is_root() {
        "the stage is root in its own namespaces and host nobody (uid 65534) outside them: no host-root file, sysctl or socket, not the engine's binary, no other home closed to others (as drivetrain makes them; `home` below says this one's)"
    } else {
        "the stage's uids are its own namespace's, mapped to the engine's user"
    };
    let cgroups = match super::Cgroups::host() {
        super::Cgroups::None(why) => format!("not here ({why}): `resources` are not enforced"),
        host => format!(
            "cgroup {}: `resources.memory` and `cpu` limit the attempt, a pids limit stops fork storms; an OOM kill is reported as such{}",
            if matches!(host, super::Cgroups::V2 { .. }) { "v2" } else { "v1" },
            match host.lacking() {
                lacking if lacking.is_empty() => String::new(),
                lacking => format!(
                    " (but not the {} controller here: {})",
                    lacking.join(", "),
                    super::cgroups::unenforced(&lacking)
                ),
            }
        ),
    };
    let fixed = [
        ("user namespace", l.user, user),
        (
            "mount namespace",
            l.mount,
            "the engine's home, the store and the inputs read-only; the attempt's directory and outputs writable; other attempts' directories and the state database hidden; /sys, /proc/sys and /proc/sysrq-trigger read-only, /proc/kcore and the like masked",
        ),
        (
            "pid namespace",
            l.pid,
            "the stage sees and signals only its own processes (a /proc of its own), and everything it started ends with it",
        ),
        (
            "prepared sandboxes",
            l.pid && l.user && super::sandbox::can_serve(),
            "attempts enter a PID and mount namespace made once for the home and mount only their own paths; between two attempts its init kills whatever the first left and undoes its mounts",
        ),
        (
            "capabilities",
            l.mount,
            "every capability but Docker's default set less MKNOD dropped; no_new_privs",
        ),
        (
            "artifact sha256",
            true,
            "inputs on file:// are hashed and checked against their manifest before the stage starts",
        ),
    ];
    let mut all: Vec<_> = fixed
        .into_iter()
        .map(|(n, a, w)| (n, a, w.to_owned()))
        .collect();
    all.push(("cgroup limits", super::Cgroups::host().active(), cgroups));
    all.push((
        "seccomp filter",
        l.seccomp,
        match seccomp::filter() {
            Ok(_) => "Docker's default deny list (modules, kexec, reboot, the clock, keyrings, bpf, perf, mounts and namespaces (through clone too), io_uring, other processes' memory) fails with EPERM".into(),
            Err(why) => why,
        },
    ));
    all.push((
        "network namespace",
        network_namespaces_work(),
        "`network: none`: a stage's own network namespace with loopback only; `host` (the default) shares the machine's".into(),
    ));
    let nvml = crate::gpus::nvml().is_some();
    all.push((
        "gpu usage",
        nvml,
        match nvml {
            true => "NVML: each attempt's GPU utilization and its processes' GPU memory, sampled while it runs".into(),
            false => "no NVML here (no NVIDIA driver): attempts record no GPU usage".into(),
        },
    ));
    all
}
