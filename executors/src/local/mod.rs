//! The local executor: each attempt is a child process in its own process group.
//!
//! argv goes to `execve` as it is (no shell). The child gets the engine's `PATH`, `HOME`,
//! `LANG` and `TZ` and the attempt's environment, nothing else; stdout and stderr both go
//! to the attempt's log file. Cancelling (a timeout, a user's cancel) kills the whole
//! group, and so does a normal exit, so nothing a stage started outlives it.
//! `distributed: {workers: N}` starts N ranks in one group with the rendezvous environment
//! torchrun and Horovod read ([`Rank::env`]); when one rank fails, the others are killed
//! (gang semantics). A stage without `distributed:` is a world of one with the same
//! variables, so `init_process_group(init_method="env://")` works there too.
//!
//! An isolated attempt (`DRIVETRAIN_ISOLATION=auto` where the kernel allows it, or
//! `required`) is contained the way runc and bubblewrap contain a container, in the
//! engine's own spawn path (no `fork`: `launch.rs`; the plan: `isolate.rs`). Each layer,
//! in the order the child sets it up; `doctor` lists which are active here ([`layers`]):
//! - **cgroups** (`cgroups.rs`, `attempt_cgroup.rs`): `resources.memory` and `cpu` are
//!   limits, every attempt has a pids limit; an OOM kill is `out of memory (limit …)`,
//!   retryable by `retries.on: [oom]`. An ended attempt's cgroups serve the next one.
//! - **user namespace** (`userns.rs`): a root engine's stage is root in its namespaces
//!   and host `nobody` outside them, so nothing that checks for host root (files outside
//!   its paths, sysctls, other homes, the engine's binary, root's sockets) is open to it;
//!   it owns its writable paths while it runs, and the engine takes them back before
//!   anything is published. Another user's engine maps its own uid.
//! - **mount namespace**: the paths of [`AttemptSpec::access`] bound read-only or
//!   writable (the store, the home and the inputs read-only, even through the hard links
//!   inputs are; the attempt's directory and outputs writable; other attempts and the
//!   state database hidden), directories closed to `nobody` on the way to what the stage
//!   needs given a view with only that in them, and the kernel's own files (`kernel.rs`):
//!   `/sys` and `/proc/sys` read-only, `/proc/kcore` and the like masked.
//! - **PID namespace** with its own `/proc`: the stage sees and signals only its own
//!   processes, and when it ends every other one ends too, a `setsid` grandchild as well,
//!   so nothing of an attempt outlives it.
//! - **prepared sandboxes** (`sandbox.rs`): a root engine's attempts do not build the
//!   mount and PID namespaces from nothing each time; they enter one made for the home,
//!   mount only their own paths there, and when an attempt ends the sandbox's init kills
//!   every process left in it and undoes its mounts before the next attempt enters. An
//!   engine that dies takes its sandboxes, and the attempts in them, along.
//! - **network namespace** for `network: none`: loopback only.
//! - **capabilities**: all but Docker's default set less `CAP_MKNOD` dropped from the
//!   bounding, inheritable and ambient sets ([`KEPT_CAPS`]); `no_new_privs`.
//! - **seccomp** (`seccomp.rs`): Docker's deny list of system calls fails with `EPERM`.
//!
//! An attempt given GPUs has their utilization and its processes' GPU memory sampled from
//! NVML while it runs (`gpu_usage.rs`), recorded with its cgroups' peak memory and CPU
//! time.
//!
//! A stage with declared secrets writes to a pipe, which the engine copies into its log
//! masked as it comes: no value is on disk while it runs either. The ranks of a
//! distributed stage write to pipes of their own, copied in whole lines led by
//! `[rank N] ` (`output.rs`).
//!
//! Where no namespace can be had, attempts run without one ([`Isolation::Auto`]) and the
//! run loop's check of every input against its manifest still catches a write.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::fd::RawFd;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use drivetrain_engine::executor::{
    AttemptOutcome, AttemptSpec, Executor, ExecutorError, PathAccess, Rank, ResourceUsage,
    RunningAttempt,
};
use drivetrain_engine::spec::Network;
use futures::FutureExt as _;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

mod attempt_cgroup;
mod cgroups;
mod gpu_usage;
mod isolate;
mod kernel;
mod launch;
mod output;
mod probe;
mod sandbox;
mod seccomp;
mod secret_mount;
mod unseen;
mod userns;
mod volume_mount;

use attempt_cgroup::{AttemptCgroup, CgroupPool};
pub use cgroups::{Cgroups, PIDS_MAX};
use gpu_usage::GpuWatch;
use isolate::MountPlan;
pub use isolate::{Layers, KEPT_CAPS};
pub use probe::{
    available, layers, namespaces_work, network_namespaces_work, user_namespaces_work,
};
pub use sandbox::serve_if_asked;
use sandbox::Sandbox;
pub use userns::STAGE_ID;

/// Runs attempts as local processes.
#[derive(Debug, Default, Clone)]
pub struct LocalExecutor {
    pub isolation: Isolation,
    /// Attempts' cgroups, kept for the next attempts once theirs have ended.
    cgroups: Arc<CgroupPool>,
}

/// Whether attempts get a private mount namespace enforcing [`AttemptSpec::access`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Where the kernel allows one; otherwise without, and a warning once.
    #[default]
    Auto,
    /// Always: an attempt fails to start when no namespace can be had.
    Required,
    /// Never.
    Off,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "" => Ok(Isolation::Auto),
            "required" => Ok(Isolation::Required),
            "off" => Ok(Isolation::Off),
            other => Err(format!(
                "isolation `{other}` is not one of auto, required, off"
            )),
        }
    }
}

impl LocalExecutor {
    /// The executor configured from `DRIVETRAIN_ISOLATION` (`auto`, `required`, `off`).
    pub fn from_env() -> Result<Self, String> {
        Ok(LocalExecutor {
            isolation: std::env::var("DRIVETRAIN_ISOLATION")
                .unwrap_or_default()
                .parse()?,
            ..LocalExecutor::default()
        })
    }
}

/// Environment variables the engine passes through to every stage.
const PASS_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];

/// One rank's process: spawned by the standard library (`posix_spawn`) when the attempt
/// is not isolated, or cloned into its namespaces or its sandbox by [`launch::spawn`] and
/// [`launch::spawn_in`].
enum Proc {
    Spawned(Child),
    Cloned(launch::RawChild),
}

impl Proc {
    fn id(&self) -> Option<u32> {
        match self {
            Proc::Spawned(c) => c.id(),
            Proc::Cloned(c) => Some(c.id()),
        }
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Proc::Spawned(c) => c.wait().await,
            Proc::Cloned(c) => c.wait().await,
        }
    }

    /// Ends a rank in a PID namespace of its own (with all it started); one that is not
    /// ends with its process group.
    fn kill(&mut self) {
        if let Proc::Cloned(c) = self {
            c.kill();
        }
    }

    /// Asks a rank to end (`SIGTERM`): one in a PID namespace of its own directly, one
    /// that is not through its process group.
    fn terminate(&mut self) {
        if let Proc::Cloned(c) = self {
            c.signal(Signal::SIGTERM as i32);
        }
    }
}

struct Started {
    pgid: i32,
    children: Vec<(usize, Proc)>,
    /// Set when the command could not be started (does not exist, not executable).
    failed_to_start: Option<String>,
    cancelled: bool,
    /// The attempt's cgroups (removed when it is dropped), and its memory limit as written.
    cgroup: Option<AttemptCgroup>,
    memory_limit: Option<String>,
    plan: Option<Arc<MountPlan>>,
    /// The prepared sandbox it runs in, if any: cleaned when it ends (every process left
    /// in it killed) before its output is drained, taken back and published.
    sandbox: Option<Sandbox>,
    /// Copy each rank's output from its pipe to the log, where it has one (masked, with
    /// secrets; labelled by rank, with several ranks).
    drains: Vec<tokio::task::JoinHandle<()>>,
    /// Its GPUs' utilization and memory, sampled from NVML while it runs.
    gpu: Option<GpuWatch>,
    /// What it used, read from its cgroups (and the GPU watch) when it ended.
    usage: Option<ResourceUsage>,
}

fn kill_group(pgid: i32) {
    if pgid > 0 {
        // ESRCH (the group is gone) is the expected case after a clean exit.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

impl Started {
    /// Ends every rank still running and all they started.
    fn kill_all(&mut self) {
        kill_group(self.pgid);
        for (_, child) in &mut self.children {
            child.kill();
        }
    }

    /// Ends what is left of the attempt in its sandbox; a sandbox that cannot be cleaned
    /// is dropped, which ends its PID namespace.
    async fn leave_sandbox(&mut self) {
        if let Some(sandbox) = self.sandbox.take() {
            if let Err(e) = sandbox.clean().await {
                tracing::warn!("a sandbox could not be cleaned ({e}): dropped");
            }
        }
    }

    /// Waits until the copies of the ranks' output are all in the log: at the end of
    /// the pipe (every process of the attempt gone), or after a few seconds, when one that
    /// is not in its PID namespace still holds it (what it writes later is lost, never
    /// stored unmasked).
    async fn drained(&mut self) {
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        for mut drain in std::mem::take(&mut self.drains) {
            if tokio::time::timeout_at(until, &mut drain).await.is_err() {
                drain.abort();
            }
        }
    }
}

#[async_trait]
impl RunningAttempt for Started {
    fn handle(&self) -> String {
        format!("pgid:{}", self.pgid)
    }

    async fn wait(&mut self) -> AttemptOutcome {
        if let Some(reason) = self.failed_to_start.take() {
            self.leave_sandbox().await;
            return AttemptOutcome::Failed {
                exit_code: None,
                reason,
            };
        }
        let world = self.children.len();
        let mut failure: Option<AttemptOutcome> = None;
        while !self.children.is_empty() {
            // Wait for whichever rank ends first.
            let (idx, status) = {
                let mut waits = Vec::with_capacity(self.children.len());
                for (i, (_, child)) in self.children.iter_mut().enumerate() {
                    waits.push(async move { (i, child.wait().await) }.boxed());
                }
                futures::future::select_all(waits).await.0
            };
            let (rank, _) = self.children.remove(idx);
            let status = match status {
                Ok(s) => s,
                Err(e) => {
                    failure.get_or_insert(AttemptOutcome::Failed {
                        exit_code: None,
                        reason: format!("cannot wait for the process: {e}"),
                    });
                    self.kill_all();
                    continue;
                }
            };
            if self.cancelled {
                continue;
            }
            if !status.success() && failure.is_none() {
                use std::os::unix::process::ExitStatusExt;
                let who = if world > 1 {
                    format!("rank {rank} ")
                } else {
                    String::new()
                };
                let reason = match (status.code(), status.signal()) {
                    (Some(c), _) => format!("{who}exited with code {c}"),
                    (None, Some(sig)) => format!("{who}was killed by signal {sig}"),
                    _ => format!("{who}ended abnormally"),
                };
                failure = Some(AttemptOutcome::Failed {
                    exit_code: status.code(),
                    reason: if world > 1 {
                        format!("{reason}; the other ranks were stopped")
                    } else {
                        reason
                    },
                });
                // Gang semantics: one rank down stops them all.
                self.kill_all();
            }
        }
        // Whatever the stage left running in its group goes with it.
        self.kill_all();
        self.leave_sandbox().await;
        self.drained().await;
        if self.cancelled {
            return AttemptOutcome::Cancelled;
        }
        if let Some(Err(e)) = self.plan.as_ref().map(|p| p.take_back()) {
            return AttemptOutcome::Failed {
                exit_code: None,
                reason: format!("cannot take the attempt's outputs back from the stage user: {e}"),
            };
        }
        let usage = self.cgroup.as_mut().map(AttemptCgroup::usage);
        let gpu = self.gpu.take().map(GpuWatch::finish);
        self.usage = (usage.is_some() || gpu.is_some()).then(|| ResourceUsage {
            peak_memory_bytes: usage.and_then(|u| u.peak_memory_bytes),
            cpu_seconds: usage.and_then(|u| u.cpu_seconds),
            gpu_utilization_percent: gpu.and_then(|g| g.utilization_percent()),
            gpu_memory_bytes: gpu.and_then(|g| g.peak_memory_bytes),
        });
        match (failure, usage) {
            // The kernel killed a process of the attempt for its memory limit.
            (Some(AttemptOutcome::Failed { reason, .. }), Some(u)) if u.oom_kills > 0 => {
                AttemptOutcome::OutOfMemory {
                    reason: format!(
                        "out of memory (limit {}): {reason}",
                        self.memory_limit.as_deref().unwrap_or("none")
                    ),
                }
            }
            // A fork refused at the pids limit is why a failed stage failed, most likely.
            (Some(AttemptOutcome::Failed { exit_code, reason }), Some(u))
                if u.forks_refused > 0 =>
            {
                let limit = self.cgroup.as_ref().and_then(AttemptCgroup::pids_max);
                AttemptOutcome::Failed {
                    exit_code,
                    reason: format!(
                        "{reason}; {} fork(s) refused at the limit of {} processes",
                        u.forks_refused,
                        limit.as_deref().unwrap_or("?")
                    ),
                }
            }
            (failure, _) => failure.unwrap_or(AttemptOutcome::Succeeded),
        }
    }

    fn usage(&self) -> Option<ResourceUsage> {
        self.usage
    }

    /// `SIGTERM` to every rank and its group, `grace` to end, then [`Started::cancel`].
    async fn stop(&mut self, grace: std::time::Duration) {
        if self.pgid > 0 {
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGTERM);
        }
        for (_, child) in &mut self.children {
            child.terminate();
        }
        let ended = tokio::time::timeout(grace, async {
            for (_, child) in &mut self.children {
                let _ = child.wait().await;
            }
        })
        .await;
        if ended.is_err() {
            tracing::info!("an attempt did not end within its grace of {grace:?}: killed");
        }
        self.cancel().await;
    }

    async fn cancel(&mut self) {
        self.cancelled = true;
        self.kill_all();
        for (_, child) in &mut self.children {
            let _ = child.wait().await;
        }
        self.children.clear();
        self.leave_sandbox().await;
        self.drained().await;
        if let Some(gpu) = self.gpu.take() {
            gpu.finish();
        }
    }
}

impl LocalExecutor {
    /// The attempt's cgroups with its `resources`' limits, where the host has cgroups.
    /// Where it has none, a stage that asked for limits is told so in its log (and
    /// `required` isolation fails it): they are never ignored silently.
    fn cgroup(
        &self,
        spec: &AttemptSpec,
        mut log: &std::fs::File,
    ) -> Result<Option<AttemptCgroup>, ExecutorError> {
        use std::io::Write as _;
        let resources = &spec.placement.resources;
        let asked = resources.memory.is_some() || resources.cpu.is_some();
        let host = Cgroups::host();
        let why = match host {
            Cgroups::None(why) => why.clone(),
            _ if self.isolation == Isolation::Off => return Ok(None),
            _ => {
                // What this attempt needs that the host's cgroups lack is said, never
                // passed over: every attempt has a process limit, some ask for more.
                let lacking: Vec<&str> = host
                    .lacking()
                    .into_iter()
                    .filter(|c| match *c {
                        "memory" => resources.memory.is_some(),
                        "cpu" => resources.cpu.is_some(),
                        _ => true,
                    })
                    .collect();
                let name = format!("{}.{}.{}", spec.run_id, spec.stage, spec.attempt);
                match self.cgroups.take(host, &name, resources) {
                    Ok(made) if lacking.is_empty() => return Ok(made),
                    Ok(made) => {
                        let why = format!(
                            "the host's cgroups have no {} controller: {}",
                            lacking.join(", "),
                            cgroups::unenforced(&lacking)
                        );
                        if self.isolation == Isolation::Required {
                            return Err(ExecutorError(isolate::refused(&why)));
                        }
                        let _ = writeln!(log, "drivetrain: {why}");
                        return Ok(made);
                    }
                    Err(e) => format!("cannot make the attempt's cgroup: {e}"),
                }
            }
        };
        if self.isolation == Isolation::Required {
            return Err(ExecutorError(isolate::refused(&why)));
        }
        if asked {
            let _ = writeln!(log, "drivetrain: `resources` are not enforced here: {why}");
        }
        Ok(None)
    }
}

/// The value the attempt's own environment gives `name` (the last one set wins).
fn attempt_env<'a>(spec: &'a AttemptSpec, name: &str) -> Option<&'a str> {
    spec.env
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// How an isolated attempt is set up: `layers`, its paths, what its user must get to (its
/// program, `PATH`, working directory, the pipeline's folder, the absolute paths its
/// command names), its network, its `/dev` (with the GPUs it was
/// given) and its cgroups.
fn plan(
    spec: &AttemptSpec,
    program: &str,
    layers: Layers,
    workers: usize,
    no_network: bool,
    cgroups: Vec<std::os::fd::RawFd>,
) -> std::io::Result<MountPlan> {
    let env = |name: &str| attempt_env(spec, name).map(str::to_owned);
    let path = env("PATH")
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    let reach: Vec<std::path::PathBuf> = program
        .contains('/')
        .then(|| spec.workdir.join(program))
        .into_iter()
        .chain(
            path.split(':')
                .filter(|d| d.starts_with('/'))
                .map(Into::into),
        )
        .chain([spec.workdir.clone()])
        // The pipeline's folder (its scripts, relative `source:`s) and what the command
        // names by absolute path (a script beside the pipeline, an interpreter).
        .chain(env("DRIVETRAIN_PIPELINE_DIR").map(Into::into))
        .chain(
            spec.argv
                .iter()
                .skip(1)
                .filter(|a| a.starts_with('/') && !a.contains('\n'))
                .map(Into::into),
        )
        // Where its volumes are mounted (what is bound there is bound with the engine's
        // rights).
        .chain(
            spec.placement
                .volumes
                .iter()
                .map(|v| v.mount_path.clone().into()),
        )
        .collect();
    let mut plan = MountPlan::new(&spec.access, layers, &reach, &spec.log)?;
    plan.mount_secrets(&spec.secret_files)
        .map_err(std::io::Error::other)?;
    let attempt_dir = spec.log.parent().unwrap_or(&spec.workdir);
    plan.mount_volumes(&spec.placement.volumes, attempt_dir, &spec.access)
        .map_err(std::io::Error::other)?;
    plan.net = no_network;
    plan.dev = kernel::Dev::new(
        &crate::gpus::device_nodes(&env("CUDA_VISIBLE_DEVICES").unwrap_or_default()),
        spec.placement
            .resources
            .shm
            .as_ref()
            .map(|q| q.value as u64),
        workers > 1,
    );
    plan.cgroups = cgroups;
    Ok(plan)
}

/// The layers `DRIVETRAIN_ISOLATION=required` runs a stage with: all of them, or an error
/// naming the one the kernel refuses.
impl LocalExecutor {
    /// `network: none` needs one process and a network namespace.
    fn check_network(
        &self,
        spec: &AttemptSpec,
        workers: usize,
        no_network: bool,
    ) -> Result<(), ExecutorError> {
        if !no_network {
            return Ok(());
        }
        if workers > 1 {
            return Err(ExecutorError(format!(
                "stage `{}`: `network: none` runs one process; its {workers} ranks would have no network to meet on",
                spec.stage
            )));
        }
        if self.isolation == Isolation::Off || !network_namespaces_work() {
            return Err(ExecutorError(format!(
                "stage `{}` has `network: none`, and this engine cannot give it a network namespace ({})",
                spec.stage,
                if self.isolation == Isolation::Off { "DRIVETRAIN_ISOLATION=off" } else { "the kernel refused one" }
            )));
        }
        Ok(())
    }

    /// The namespaces, mounts and filter the attempt's processes start in, if any.
    fn isolation_plan(
        &self,
        spec: &AttemptSpec,
        program: &str,
        workers: usize,
        no_network: bool,
        cgroup_procs: &[RawFd],
    ) -> Result<Option<Arc<MountPlan>>, ExecutorError> {
        let layers = match self.isolation {
            Isolation::Off => None,
            _ if spec.access.is_empty()
                && !no_network
                && spec.secret_files.is_empty()
                && spec.placement.volumes.is_empty() =>
            {
                None
            }
            Isolation::Auto => Some(available()).filter(|l| l.mount),
            Isolation::Required => Some(required_layers()?),
        };
        let Some(layers) = layers else {
            // A host path at its own path needs no mount (nor can be made read-only).
            let mounted = |v: &&drivetrain_engine::spec::VolumeSpec| {
                v.read_only || v.host_path.as_deref() != Some(v.mount_path.as_str())
            };
            if let Some(v) = spec.placement.volumes.iter().find(mounted) {
                return Err(ExecutorError(format!(
                    "stage `{}`: volume `{}` is mounted in the attempt's own mount namespace, and this engine gives it none ({}); give `host_path` and `mount_path` the same path, not read-only, to use the path as it is",
                    spec.stage,
                    v.name,
                    if self.isolation == Isolation::Off { "DRIVETRAIN_ISOLATION=off" } else { "the kernel refused one" }
                )));
            }
            if let Some(s) = spec.secret_files.first() {
                return Err(ExecutorError(format!(
                    "stage `{}`: secret `{}` is mounted as files, which needs the attempt's own mount namespace, and this engine gives it none ({}); expose its keys with `env:` instead",
                    spec.stage,
                    s.name,
                    if self.isolation == Isolation::Off { "DRIVETRAIN_ISOLATION=off" } else { "the kernel refused one" }
                )));
            }
            return Ok(None);
        };
        // Its own `/dev` and `/proc` would cover them: the stage would not find its paths.
        if let Some(a) = spec.access.iter().find(|a| {
            ["/dev", "/proc", "/sys"]
                .iter()
                .any(|k| a.path.starts_with(k))
        }) {
            return Err(ExecutorError(format!(
                "stage `{}`: {} is under /dev, /proc or /sys, which an isolated stage gets its own of: put the engine's home and store elsewhere, or set DRIVETRAIN_ISOLATION=off",
                spec.stage,
                a.path.display()
            )));
        }
        plan(
            spec,
            program,
            layers,
            workers,
            no_network,
            cgroup_procs.to_vec(),
        )
        .map(|p| Some(Arc::new(p)))
        .map_err(|e| ExecutorError(e.to_string()))
    }
}

/// Starts one rank, in the attempt's namespaces where it has a plan; the first rank
/// (`pgid` 0) leads a new process group, the others join it.
fn spawn_rank(
    spec: &AttemptSpec,
    env: &BTreeMap<String, String>,
    out: &std::fs::File,
    pgid: i32,
    plan: &Option<Arc<MountPlan>>,
    sandbox: Option<&Sandbox>,
    cgroup_procs: &[RawFd],
) -> std::io::Result<Proc> {
    let program = &spec.argv[0];
    let command = launch::Command {
        program,
        args: &spec.argv[1..],
        env,
        cwd: &spec.workdir,
        out,
        pgid,
    };
    match plan {
        Some(plan) => match sandbox.and_then(Sandbox::init) {
            Some(init) => launch::spawn_in(&command, plan.clone(), init).or_else(|e| {
                match e.kind() {
                    // The command's own: the same without a sandbox.
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => Err(e),
                    // The sandbox's (its init ended under it): namespaces of its own.
                    _ => {
                        tracing::warn!("cannot start stage `{}` in its sandbox ({e}): it gets namespaces of its own", spec.stage);
                        launch::spawn(&command, plan.clone())
                    }
                }
            }),
            None => launch::spawn(&command, plan.clone()),
        }
        .map(|pid| Proc::Cloned(launch::RawChild::new(pid))),
        None => {
            let out = out.try_clone()?;
            let err = out.try_clone()?;
            let mut command = Command::new(program);
            launch::join_before_exec(&mut command, cgroup_procs.to_vec());
            command
                .args(&spec.argv[1..])
                .current_dir(&spec.workdir)
                .env_clear()
                .envs(env)
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .process_group(pgid)
                .spawn()
                .map(Proc::Spawned)
        }
    }
}

/// Why a rank did not start, in the user's terms.
fn start_failure(spec: &AttemptSpec, e: &std::io::Error) -> String {
    let program = &spec.argv[0];
    match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "stage `{}`: command `{program}` not found (in {} or on PATH)",
            spec.stage,
            spec.workdir.display()
        ),
        std::io::ErrorKind::PermissionDenied => {
            format!(
                "stage `{}`: command `{program}` is not executable",
                spec.stage
            )
        }
        _ => format!("stage `{}`: cannot start `{program}`: {e}", spec.stage),
    }
}

fn required_layers() -> Result<Layers, ExecutorError> {
    let l = available();
    let missing = if !l.mount {
        "this process cannot create mount namespaces"
    } else if !l.user {
        "the kernel refused it a user namespace"
    } else if !l.pid {
        "the kernel refused it a PID namespace"
    } else if !l.seccomp {
        "the kernel refused its seccomp filter"
    } else {
        return Ok(l);
    };
    Err(ExecutorError(isolate::refused(missing)))
}

/// A port for distributed ranks' rendezvous (`MASTER_PORT`), free now and below the
/// kernel's ephemeral range where one is known: the port is released before the ranks
/// bind it, and in between any outgoing connection or `bind(0)` on the machine takes
/// ports from the ephemeral range, never from below it.
pub(crate) fn free_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(0);
    const FROM: u16 = 10_000;
    if low > FROM {
        for _ in 0..64 {
            // std seeds each RandomState from the OS's random source.
            let r = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            let port = FROM + (r % u64::from(low - FROM)) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[async_trait]
impl Executor for LocalExecutor {
    fn name(&self) -> &'static str {
        "local"
    }

    /// In the attempt's own mount namespace, where it has one.
    fn mounts_secret_files(&self) -> bool {
        self.isolation != Isolation::Off && available().mount
    }

    /// The engine's hidden paths, and (a root engine's stage being host `nobody`) folders
    /// closed to other users, where the attempt had its own namespaces.
    fn unseen(&self, path: &std::path::Path, access: &[PathAccess]) -> Option<String> {
        let layers = available();
        if self.isolation == Isolation::Off || !layers.mount {
            return None;
        }
        let nobody = layers.user && nix::unistd::geteuid().is_root();
        unseen::why(path, access, nobody)
    }

    /// A host path and scratch space, bound in the attempt's mount namespace
    /// (`volume_mount.rs`); not a Kubernetes claim.
    fn refuses_volume(&self, volume: &drivetrain_engine::spec::VolumeSpec) -> Option<String> {
        let what = match (&volume.claim, &volume.from_snapshot) {
            (Some(c), _) => format!("PersistentVolumeClaim `{c}`"),
            (_, Some(s)) => format!("a claim restored from snapshot `{s}`"),
            _ => return None,
        };
        Some(format!(
            "{what} is mounted by the kubernetes executor; on this machine give `host_path: DIR` \
             (as Docker's `-v DIR:{}`) or `empty_dir: SIZE`",
            volume.mount_path
        ))
    }

    async fn reap(&self, handle: &str) -> bool {
        let Some(pgid) = handle
            .strip_prefix("pgid:")
            .and_then(|p| p.parse::<i32>().ok())
        else {
            return false;
        };
        if pgid <= 1 {
            return false;
        }
        killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok()
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        let Some(program) = spec.argv.first().cloned() else {
            return Err(ExecutorError("empty argv".into()));
        };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|e| ExecutorError(format!("cannot open log {}: {e}", spec.log.display())))?;
        let workers = spec
            .distributed
            .as_ref()
            .map(|d| d.workers as usize)
            .unwrap_or(1);
        // Every attempt gets a rendezvous port, a world of one too: a single-process
        // `torch.distributed` job initialises from the environment like any other.
        let port =
            free_port().map_err(|e| ExecutorError(format!("no free port for MASTER_PORT: {e}")))?;
        let framework = spec
            .distributed
            .as_ref()
            .map(|d| d.framework)
            .unwrap_or_default();
        let no_network = spec.placement.network == Network::None;
        self.check_network(&spec, workers, no_network)?;
        let cgroup = self.cgroup(&spec, &log)?;
        let cgroup_procs = cgroup.as_ref().map(|c| c.procs()).unwrap_or_default();
        let plan = self.isolation_plan(&spec, &program, workers, no_network, &cgroup_procs)?;
        let gpu = attempt_env(&spec, "CUDA_VISIBLE_DEVICES")
            .and_then(|v| GpuWatch::start(v, cgroup.as_ref().and_then(|c| c.members())));
        let mut started = Started {
            pgid: 0,
            children: Vec::with_capacity(workers),
            failed_to_start: None,
            cancelled: false,
            cgroup,
            memory_limit: spec
                .placement
                .resources
                .memory
                .as_ref()
                .map(|m| m.text.clone()),
            sandbox: match (&plan, workers) {
                (Some(plan), 1) => Sandbox::take(plan).await,
                _ => None,
            },
            plan: plan.clone(),
            drains: Vec::new(),
            gpu,
            usage: None,
        };
        for rank in 0..workers {
            // All ranks on this one machine: one node, local ranks = ranks.
            let place = Rank {
                rank: rank as u32,
                world: workers as u32,
                local_rank: rank as u32,
                local_world: workers as u32,
                node: 0,
                nodes: 1,
            };
            // The engine's pass-through variables, then the attempt's, then the rank's:
            // a later one of the same name wins.
            let mut env: BTreeMap<String, String> = PASS_THROUGH
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
                .collect();
            env.extend(spec.env.iter().cloned());
            env.extend(
                place
                    .env("127.0.0.1", port, framework)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v)),
            );
            let (out, drain) = output::rank_sink(&spec, &log, rank, workers)?;
            started.drains.extend(drain);
            let spawned = spawn_rank(
                &spec,
                &env,
                &out,
                started.pgid,
                &plan,
                started.sandbox.as_ref(),
                &cgroup_procs,
            );
            match spawned {
                Ok(child) => {
                    if started.pgid == 0 {
                        started.pgid = child.id().map(|p| p as i32).unwrap_or(0);
                    }
                    started.children.push((rank, child));
                }
                Err(e) => {
                    kill_group(started.pgid);
                    started.failed_to_start = Some(start_failure(&spec, &e));
                    for (_, mut c) in started.children.drain(..) {
                        let _ = c.wait().await;
                    }
                    break;
                }
            }
        }
        Ok(Box::new(started))
    }
}
