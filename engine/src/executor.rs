//! The `Executor` trait: how a stage attempt runs, wherever it runs.
//!
//! The run loop hands an executor a fully resolved [`AttemptSpec`] (argv and environment
//! already rendered, input and output directories prepared) and gets back a
//! [`RunningAttempt`] to wait for or cancel. Timeouts are the run loop's: it cancels an
//! attempt that outlives its deadline. Executors write the attempt's combined stdout and
//! stderr to `spec.log`, which the run loop publishes and `drivetrain logs` reads.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::plan::{Distributed, Resources};
use crate::spec::{SecretRef, SnapshotSpec, Toleration, VolumeSpec};

/// Where one process of an attempt stands among the attempt's processes. A stage without
/// `distributed:` is a world of one (rank 0 of 1, node 0 of 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    pub rank: u32,
    pub world: u32,
    /// The process's place among those on its node.
    pub local_rank: u32,
    pub local_world: u32,
    /// The node's place among the attempt's nodes.
    pub node: u32,
    pub nodes: u32,
}

impl Rank {
    /// The only process of a stage that is not distributed.
    pub const ALONE: Rank = Rank {
        rank: 0,
        world: 1,
        local_rank: 0,
        local_world: 1,
        node: 0,
        nodes: 1,
    };

    /// The environment of this process: torchrun's contract (`RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `GROUP_WORLD_SIZE`, `ROLE_RANK`,
    /// `ROLE_WORLD_SIZE`, `NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT`), so that
    /// `init_process_group(init_method="env://")` works in every stage, and with
    /// `framework: mpi` the same facts under Open MPI's (`OMPI_COMM_WORLD_*`, `PMI_*`) and
    /// Horovod's (`HOROVOD_*`) names.
    pub fn env(
        &self,
        master_addr: &str,
        master_port: u16,
        framework: crate::spec::Framework,
    ) -> Vec<(&'static str, String)> {
        let s = |n: u32| n.to_string();
        let mut env = vec![
            ("RANK", s(self.rank)),
            ("WORLD_SIZE", s(self.world)),
            ("LOCAL_RANK", s(self.local_rank)),
            ("LOCAL_WORLD_SIZE", s(self.local_world)),
            ("GROUP_RANK", s(self.node)),
            ("GROUP_WORLD_SIZE", s(self.nodes)),
            ("ROLE_RANK", s(self.rank)),
            ("ROLE_WORLD_SIZE", s(self.world)),
            ("NODE_RANK", s(self.node)),
            ("MASTER_ADDR", master_addr.to_owned()),
            ("MASTER_PORT", master_port.to_string()),
        ];
        if framework == crate::spec::Framework::Mpi {
            env.extend([
                ("OMPI_COMM_WORLD_RANK", s(self.rank)),
                ("OMPI_COMM_WORLD_SIZE", s(self.world)),
                ("OMPI_COMM_WORLD_LOCAL_RANK", s(self.local_rank)),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", s(self.local_world)),
                ("OMPI_COMM_WORLD_NODE_RANK", s(self.node)),
                ("PMI_RANK", s(self.rank)),
                ("PMI_SIZE", s(self.world)),
                ("HOROVOD_RANK", s(self.rank)),
                ("HOROVOD_SIZE", s(self.world)),
                ("HOROVOD_LOCAL_RANK", s(self.local_rank)),
                ("HOROVOD_LOCAL_SIZE", s(self.local_world)),
                ("HOROVOD_CROSS_RANK", s(self.node)),
                ("HOROVOD_CROSS_SIZE", s(self.nodes)),
            ]);
        }
        env
    }
}

/// Everything an executor needs to run one attempt.
#[derive(Debug, Clone)]
pub struct AttemptSpec {
    pub run_id: String,
    pub stage: String,
    pub attempt: u32,
    /// argv; each element one argument, never parsed by a shell.
    pub argv: Vec<String>,
    /// The environment, in order; the process gets nothing else from the engine's own
    /// environment but `PATH`, `HOME`, `LANG` and `TZ`.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub workdir: PathBuf,
    /// Where stdout and stderr go.
    pub log: PathBuf,
    /// Ranks to start together, if distributed.
    pub distributed: Option<Distributed>,
    /// What the attempt may write, applied in order: each entry makes its path (and
    /// everything under it) read-only or writable for the attempt's processes, so a
    /// stage cannot write into the store or another stage's artifact even through a hard
    /// link. An executor that cannot enforce this runs the attempt anyway; the run loop
    /// still verifies every input against its manifest afterwards.
    pub access: Vec<PathAccess>,
    /// The values of the stage's declared secrets: an executor that can masks them in the
    /// log as it is written (the engine masks the whole log again when the attempt ends).
    pub mask: crate::mask::Mask,
    /// Where and with what the attempt runs on a cluster; the local executor reads only
    /// what it can honour (none of it today but GPUs, which the run loop assigns).
    pub placement: Placement,
    /// The stage's secrets mounted as files, with the values the engine read, for an
    /// executor that mounts them itself (the local executor: a read-only tmpfs). Empty
    /// where the executor mounts its own (Kubernetes: a Secret volume).
    pub secret_files: Vec<SecretFiles>,
}

/// One secret mounted as files (`secrets[].mount_path`): a file per key. Its `Debug`
/// never shows a value.
#[derive(Clone, Default, PartialEq)]
pub struct SecretFiles {
    pub name: String,
    pub mount_path: PathBuf,
    /// Each key (a file name) and its value.
    pub files: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for SecretFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.files.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("SecretFiles")
            .field("name", &self.name)
            .field("mount_path", &self.mount_path)
            .field("keys", &keys)
            .finish()
    }
}

impl Placement {
    /// A stage's placement, with its image already rendered.
    pub fn of(
        pipeline: &crate::plan::Pipeline,
        stage: &crate::plan::Stage,
        image: Option<String>,
        item: Option<usize>,
    ) -> Placement {
        Placement {
            pipeline: pipeline.name.clone(),
            project: pipeline.project.clone(),
            item,
            parallel: stage.map.as_ref().and_then(|m| m.max_parallel),
            image,
            resources: stage.resources.clone(),
            volumes: stage.volumes.clone(),
            secrets: stage.secrets.clone(),
            node_selector: stage.node_selector.clone(),
            tolerations: stage.tolerations.clone(),
            network: stage.network,
            snapshot: stage.snapshot.clone(),
            timeout: stage.timeout,
            slurm: stage.slurm.clone().unwrap_or_default(),
            scheduling: stage.scheduling.clone(),
        }
    }
}

/// The parts of a stage that say where it runs on a cluster, rendered for one attempt.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub pipeline: String,
    /// The run's project (`""` counts as `default`): its Kueue queue where workloads go
    /// to one queue per project.
    pub project: String,
    /// The map item this attempt runs, if any.
    pub item: Option<usize>,
    /// How many of the map's items may run at once (`map.max_parallel`), for an executor
    /// that throttles them itself.
    pub parallel: Option<u32>,
    /// The container image (`run.image`, else `defaults.image`).
    pub image: Option<String>,
    pub resources: Resources,
    pub volumes: Vec<VolumeSpec>,
    /// Secret references; on a cluster `env` entries become `secretKeyRef`s.
    pub secrets: Vec<SecretRef>,
    pub node_selector: std::collections::BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// `none`: loopback only.
    pub network: crate::spec::Network,
    pub snapshot: Option<SnapshotSpec>,
    /// The stage's timeout (the run loop enforces it too).
    pub timeout: Option<std::time::Duration>,
    /// The stage's partition, account, QoS and constraint on a Slurm cluster.
    pub slurm: crate::spec::SlurmSpec,
    /// Its queue, priority, preemption and topology (`scheduling`).
    pub scheduling: crate::plan::Scheduling,
}

/// Where a pod's copy of the whole drivetrain binary is, under the executor's
/// [`Executor::container_root`]: a built-in step runs `ROOT/bin/drivetrain step NAME`, and
/// only a pod whose command is this binary gets it.
pub const REMOTE_BINARY: &str = "bin/drivetrain";

/// Where a pod's copy of the wrapper is, under the container root: `drivetrain-exec`, a
/// small binary of its own (`drivetrain exec` where the pod has the whole binary).
pub const REMOTE_WRAPPER: &str = "bin/drivetrain-exec";

/// What `drivetrain exec` does around a stage's command in a pod (the
/// `DRIVETRAIN_EXEC_PLAN` environment variable, JSON): fetch the inputs from the store,
/// run the command, and if it succeeded upload the outputs and `values.json` to the
/// attempt's prefix. The engine publishes the outputs' listings after the pod succeeded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecPlan {
    /// The artifact store's URL.
    pub store: String,
    pub run: String,
    /// The attempt's stage key (`stage`, or `stage/items/<i>` for a map item).
    pub stage: String,
    pub attempt: u32,
    pub inputs: Vec<ExecInput>,
    pub outputs: Vec<ExecOutput>,
    /// Where the command writes its values.
    pub values: PathBuf,
    /// Where a search's trial appends its metrics (uploaded with the values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<PathBuf>,
}

/// An input `drivetrain exec` fetches.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecInput {
    pub name: String,
    pub artifact: crate::artifacts::ArtifactRef,
    pub dest: PathBuf,
}

/// An output directory `drivetrain exec` uploads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecOutput {
    pub name: String,
    pub dir: PathBuf,
}

/// One entry of [`AttemptSpec::access`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathAccess {
    pub path: PathBuf,
    pub writable: bool,
    /// Nothing of it is visible to the attempt (an empty directory over a directory,
    /// an empty file over a file), except later entries under it, which stay as given:
    /// other attempts' work directories and the state database.
    pub hidden: bool,
    /// Writable for other attempts at the same time too (the local model registry): an
    /// executor that gives an attempt its writable paths does not take this one back.
    pub shared: bool,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Exit code 0 (every rank, if distributed).
    Succeeded,
    /// The stage's own failure: a non-zero exit, a signal, or a command that does not
    /// exist.
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
    /// Stopped by `cancel` (a timeout or a user's cancel).
    Cancelled,
    /// Killed by the kernel for exceeding its memory limit (`retries.on: [oom]`).
    OutOfMemory { reason: String },
    /// Stopped by the cluster's own time limit (`retries.on: [timeout]`).
    TimedOut { reason: String },
    /// Ended by the infrastructure, not the stage: a node that failed, a job the cluster
    /// no longer knows (`retries.on: [lost]`).
    Lost { reason: String },
    /// Stopped by the cluster's scheduler for work of a higher priority (Slurm's
    /// `PREEMPTED`): not the stage's failure and not a retry; the stage is submitted
    /// again and resumes from its checkpoints.
    Preempted { reason: String },
}

/// The executor could not run the attempt at all: the infrastructure's fault.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExecutorError(pub String);

/// A started attempt.
#[async_trait]
pub trait RunningAttempt: Send {
    /// What identifies the attempt to its executor (a process group id locally, a Job
    /// name on Kubernetes); recorded so a restarted engine can find it.
    fn handle(&self) -> String;
    /// Waits for the attempt to end. Cancel-safe: dropping the future leaves it running.
    async fn wait(&mut self) -> AttemptOutcome;
    /// Stops the attempt and everything it started; `wait` then returns `Cancelled`.
    async fn cancel(&mut self);
    /// Asks the attempt to end (SIGTERM, where the executor can send one), waits up to
    /// `grace` for it, then stops it as [`RunningAttempt::cancel`] does. Executors whose
    /// cancel already gives the stage its grace (a pod's, Slurm's `KillWait`) keep this.
    async fn stop(&mut self, grace: std::time::Duration) {
        let _ = grace;
        self.cancel().await;
    }
    /// What the executor made beyond the command's own outputs, once `wait` returned: a
    /// JSON object the run loop adds to the attempt's values (the kubernetes executor's
    /// `{"snapshot": {"name": …}}` for a stage with `snapshot:`), so later stages, and
    /// reruns that reuse this stage, can name it.
    fn made(&self) -> Option<serde_json::Value> {
        None
    }
    /// What the attempt used, once `wait` returned, where the executor measures it (the
    /// local executor, from the attempt's cgroups).
    fn usage(&self) -> Option<ResourceUsage> {
        None
    }
}

/// What an attempt used: recorded with it, shown by `status`, the API and `/metrics`, so
/// a team sees which stage wastes its memory or GPUs.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct ResourceUsage {
    /// The most memory the attempt's processes held at once (their cgroup's peak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// CPU time, user and system, of all its processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Mean utilization (0–100) of its GPUs while it ran, where NVML says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization_percent: Option<f64>,
    /// The most GPU memory its processes held, where NVML says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_bytes: Option<u64>,
}

/// Runs stage attempts.
#[async_trait]
pub trait Executor: Send + Sync {
    /// The name pipelines use (`local`, `kubernetes`, `slurm`).
    fn name(&self) -> &'static str;
    /// Starts an attempt. A command that cannot be started because it does not exist is
    /// not an error here: it is a started attempt that `wait`s to `Failed`.
    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError>;
    /// Stops an attempt an engine that is gone left behind, found by the handle it
    /// recorded. Returns whether anything was still running.
    async fn reap(&self, handle: &str) -> bool;
    /// Whether the attempt `handle` names still exists so that a restarted engine can
    /// watch it again by starting the same attempt once more. Only executors whose
    /// `start` is idempotent per attempt (Kubernetes: a deterministic Job name that
    /// answers `AlreadyExists`) say yes; the default is no, and the run loop then stops
    /// what is left with [`Executor::reap`] and retries the attempt as lost.
    async fn reattach(&self, _handle: &str) -> bool {
        false
    }
    /// The handle of attempt `attempt` of `stage` in `run` where the executor can find it
    /// by name alone: for an attempt an engine started but died before recording its
    /// handle. The default finds none.
    async fn find(&self, _run: &str, _stage: &str, _attempt: u32) -> Option<String> {
        None
    }
    /// Where stages see their files when they run away from the engine's file system (in
    /// a pod): `Some(root)` makes the run loop hand the attempt paths under `root` and a
    /// transfer plan (`DRIVETRAIN_EXEC_PLAN`) that the wrapper, `drivetrain exec`, carries
    /// out: inputs are fetched from the store, outputs and `values.json` uploaded to it.
    fn container_root(&self) -> Option<PathBuf> {
        None
    }
    /// Whether the cluster hands out GPUs (Slurm's GRES): the run loop then neither
    /// counts this machine's GPUs nor sets `CUDA_VISIBLE_DEVICES` itself.
    fn schedules_gpus(&self) -> bool {
        false
    }
    /// Whether the executor takes a map's items all at once and throttles them itself
    /// ([`Placement::parallel`]; Slurm: one job array, `%N`): the run loop then starts
    /// every item's attempt together and holds none of the run's slots for them.
    fn runs_items_together(&self) -> bool {
        false
    }
    /// Whether the executor can mount a stage's secrets as files (`secrets[].mount_path`;
    /// Kubernetes: a Secret volume; local: [`AttemptSpec::secret_files`] on a tmpfs in
    /// the attempt's mount namespace). The run loop refuses such a stage on one that
    /// cannot, naming it.
    fn mounts_secret_files(&self) -> bool {
        false
    }
    /// Why a stage this executor ran may not see `path`, which exists on the engine's
    /// machine, if containment is why: the part of a "no such file" or "permission
    /// denied" the stage's code cannot know, with what to declare. `access` is the
    /// attempt's. By default none.
    fn unseen(&self, path: &Path, access: &[PathAccess]) -> Option<String> {
        let _ = (path, access);
        None
    }
    /// Why this executor cannot mount `volume` (an entry of a stage's `volumes:`), if it
    /// cannot: the run loop refuses such a stage, naming the volume and this reason
    /// rather than running it without. By default an executor mounts none.
    fn refuses_volume(&self, volume: &crate::spec::VolumeSpec) -> Option<String> {
        let _ = volume;
        Some(format!("the `{}` executor mounts no volumes", self.name()))
    }
}

/// The conformance suite every [`Executor`]'s tests call: the guarantees the run loop
/// relies on, checked with `sh` commands. Panics on the first broken guarantee.
#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    fn spec(dir: &Path, name: &str, argv: &[&str]) -> AttemptSpec {
        AttemptSpec {
            run_id: "conformance".into(),
            stage: name.into(),
            attempt: 1,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("FOO".into(), "bar baz".into())],
            workdir: dir.to_path_buf(),
            log: dir.join(format!("{name}.log")),
            distributed: None,
            access: Vec::new(),
            mask: Default::default(),
            secret_files: Vec::new(),
            placement: Placement::default(),
        }
    }

    /// Runs every check with `executor`, writing logs under `dir` (which must exist).
    pub async fn check(executor: &dyn Executor, dir: &Path) {
        // Success; stdout and stderr both land in the log; env values arrive intact.
        let s = spec(dir, "ok", &["sh", "-c", "echo \"out $FOO\"; echo err >&2"]);
        let log = s.log.clone();
        let mut a = executor.start(s).await.expect("starts");
        assert!(!a.handle().is_empty(), "an attempt has a handle");
        assert_eq!(a.wait().await, AttemptOutcome::Succeeded);
        let text = std::fs::read_to_string(&log).expect("a log");
        assert!(
            text.contains("out bar baz") && text.contains("err"),
            "log: {text:?}"
        );

        // A non-zero exit is the stage's failure, with its code.
        let mut a = executor
            .start(spec(dir, "exit3", &["sh", "-c", "exit 3"]))
            .await
            .expect("starts");
        match a.wait().await {
            AttemptOutcome::Failed { exit_code, .. } => assert_eq!(exit_code, Some(3)),
            other => panic!("exit 3 ended as {other:?}"),
        }

        // A command that does not exist is a failed attempt that names it.
        let mut a = executor
            .start(spec(dir, "missing", &["no-such-command-dt", "x"]))
            .await
            .expect("a missing command still starts an attempt");
        match a.wait().await {
            AttemptOutcome::Failed { reason, .. } => {
                assert!(
                    reason.contains("no-such-command-dt") && reason.contains("not found"),
                    "{reason}"
                )
            }
            other => panic!("a missing command ended as {other:?}"),
        }

        // Cancel stops a running attempt (and what it started).
        let mut a = executor
            .start(spec(dir, "cancel", &["sh", "-c", "sleep 300 & wait"]))
            .await
            .expect("starts");
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.cancel().await;
        let outcome = tokio::time::timeout(Duration::from_secs(10), a.wait())
            .await
            .expect("cancel is prompt");
        assert_eq!(outcome, AttemptOutcome::Cancelled);

        // An attempt left behind (its engine gone) can be stopped by its handle alone.
        let a = executor
            .start(spec(dir, "orphan", &["sleep", "300"]))
            .await
            .expect("starts");
        let handle = a.handle();
        drop(a);
        assert!(executor.reap(&handle).await, "reap finds the orphan");

        // A stage that is not distributed is a world of one with torchrun's whole
        // contract, so `init_process_group(init_method="env://")` works in it.
        let s = spec(
            dir,
            "alone",
            &[
                "sh",
                "-c",
                "echo \"$RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK/$NODE_RANK/$MASTER_ADDR/${MASTER_PORT:+port}\"",
            ],
        );
        let log = s.log.clone();
        let mut a = executor.start(s).await.expect("starts");
        assert_eq!(a.wait().await, AttemptOutcome::Succeeded);
        let text = std::fs::read_to_string(&log).expect("a log");
        assert_eq!(text, "0/1/0/1/0/0/127.0.0.1/port\n");

        // Distributed ranks all start, each knowing its rank.
        let mut s = spec(
            dir,
            "ranks",
            &["sh", "-c", "echo \"rank $RANK of $WORLD_SIZE\""],
        );
        s.distributed = Some(crate::plan::Distributed {
            framework: crate::spec::Framework::None,
            workers: 2,
            slots_per_worker: 1,
        });
        let log = s.log.clone();
        let mut a = executor.start(s).await.expect("starts");
        assert_eq!(a.wait().await, AttemptOutcome::Succeeded);
        let text = std::fs::read_to_string(&log).expect("a log");
        assert!(
            text.contains("rank 0 of 2") && text.contains("rank 1 of 2"),
            "log: {text:?}"
        );
    }
}
