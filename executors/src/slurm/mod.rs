//! The slurm executor: one batch job per stage attempt, through Slurm's own command-line
//! tools, on a file system the engine and the compute nodes share.
//!
//! - [`submit`] turns an [`AttemptSpec`] into `sbatch` options, a fixed batch script and
//!   the job's environment: argv are the script's arguments and values the environment
//!   (`--export=ALL` of a cleared one), never a shell string or a command line.
//! - The attempt's directory, inputs and outputs are where the run loop prepared them, as
//!   for the local executor: the job writes its log there (`--output`, appended), reads
//!   its inputs there and leaves its outputs there; the engine publishes them to the store
//!   once the job has succeeded. The home (`DRIVETRAIN_HOME`) must be on the shared file
//!   system, as any Slurm user's working directory is.
//! - The job's name is deterministic from (run, stage, attempt, item) and its comment
//!   says the same: a restarted engine finds a job still known to Slurm by its handle
//!   and watches it again instead of submitting another ([`Executor::reattach`]).
//! - One poll per cluster ([`poll`]): `squeue` for every waiting job at once, `sacct` for
//!   those the controller has forgotten. A pending job's reason (`Resources`, a GPU it
//!   waits for) goes into the attempt's log as it changes, so `status` shows it.
//! - `cancel` is `scancel`. The engine owns retries (`--no-requeue`): `NODE_FAIL` ends
//!   the attempt as lost (`retries.on: [lost]`), `TIMEOUT` as a timeout, `OUT_OF_MEMORY`
//!   (or Slurm's own memory enforcement killing it) as `oom`, and `PREEMPTED` (a job of
//!   a higher QoS took its place; Slurm cancels a job it may not requeue) as preempted:
//!   the engine submits the stage again, not as a retry, and it resumes from its
//!   checkpoints.
//! - `scheduling:` places the job: a `queue` is its partition (or its QoS, with
//!   `queue_option: qos`), a priority class its QoS, a preemptible stage naming none the
//!   settings' `preemptible_qos`, a negative priority `--nice`.
//!
//! Settings come from the YAML file named by `DRIVETRAIN_SLURM` ([`Settings`]).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use drivetrain_engine::executor::{
    AttemptOutcome, AttemptSpec, Executor, ExecutorError, RunningAttempt,
};
use serde::Deserialize;
use tokio::sync::{oneshot, watch};

pub mod cli;
pub mod poll;
pub mod submit;

use cli::Cli;
use poll::{JobStatus, Poller};

/// Where jobs go and how the cluster is reached.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The partition of every job; default: the cluster's default partition.
    pub partition: Option<String>,
    /// The partition of jobs that ask for GPUs; default: `partition`.
    pub gpu_partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// `SLURM_CONF` for every command; default: the engine's own `SLURM_CONF`.
    pub conf: Option<PathBuf>,
    /// Where `sbatch`, `squeue`, `sacct`, `scancel` and `sinfo` are; default: `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// More `sbatch` options for every job (`--constraint=a100`, `--exclusive`).
    pub sbatch_args: Vec<String>,
    /// How often the cluster is polled: `500ms` (default).
    pub poll_interval: Option<String>,
    /// The rendezvous port of distributed ranks (`MASTER_PORT`); default: one derived
    /// from the job id, so two jobs on a node do not meet.
    pub master_port: Option<u16>,
    /// The most tasks of one job array (the cluster's `MaxArraySize` less one; default
    /// 1000): a larger map is several arrays.
    pub max_array_size: Option<usize>,
    /// What a stage's `scheduling.queue` names: `partition` (default) or `qos`.
    pub queue_option: Option<String>,
    /// The QoS of a `preemptible` stage that names no priority class (default
    /// `preemptible`): one a higher QoS may preempt (`Preempt=`, `PreemptMode=requeue`).
    pub preemptible_qos: Option<String>,
}

impl Settings {
    /// The settings in the file `DRIVETRAIN_SLURM` names, else the defaults.
    pub fn from_env() -> Result<Settings, String> {
        let mut s = match std::env::var_os("DRIVETRAIN_SLURM") {
            Some(path) => Settings::from_file(Path::new(&path))?,
            None => Settings::default(),
        };
        if s.conf.is_none() {
            s.conf = std::env::var_os("SLURM_CONF").map(PathBuf::from);
        }
        Ok(s)
    }

    pub fn from_file(path: &Path) -> Result<Settings, String> {
        let s: Settings = crate::settings_file(path)?;
        s.interval()
            .map_err(|e| format!("{}: poll_interval: {e}", path.display()))?;
        if let Some(q) = s
            .queue_option
            .as_deref()
            .filter(|q| !["partition", "qos"].contains(q))
        {
            return Err(format!(
                "{}: queue_option: `{q}`: a stage's queue names a `partition` or a `qos`",
                path.display()
            ));
        }
        Ok(s)
    }

    fn interval(&self) -> Result<Duration, String> {
        match &self.poll_interval {
            Some(t) => drivetrain_engine::units::parse_duration(t).map_err(|e| e.to_string()),
            None => Ok(Duration::from_millis(500)),
        }
    }

    fn cli(&self) -> Cli {
        Cli {
            bin_dir: self.bin_dir.clone(),
            conf: self.conf.clone(),
        }
    }
}

/// Items of a map waiting to be submitted together, by (run, stage, attempt).
/// Each item gets its task's `JOB_TASK` id and the task's own output file (`%a.out`,
/// where Slurm says why it killed the task).
type Submitted = Result<(String, PathBuf), String>;
type Batches = HashMap<String, Vec<(AttemptSpec, oneshot::Sender<Submitted>)>>;

/// How long a map's items are gathered after the last one arrived before their job array
/// is submitted.
const GATHER: Duration = Duration::from_millis(100);

/// Runs attempts as Slurm batch jobs.
pub struct SlurmExecutor {
    settings: Arc<Settings>,
    cli: Arc<Cli>,
    poller: Poller,
    batches: Arc<Mutex<Batches>>,
    /// Jobs a restarted engine found still known to Slurm, by job name: the attempt that
    /// starts under that name again watches the job instead of submitting one.
    adopted: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for SlurmExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmExecutor")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl SlurmExecutor {
    pub fn new(settings: Settings) -> SlurmExecutor {
        let cli = Arc::new(settings.cli());
        let every = settings.interval().unwrap_or(Duration::from_millis(500));
        SlurmExecutor {
            poller: Poller::new(cli.clone(), every),
            cli,
            settings: Arc::new(settings),
            adopted: Mutex::default(),
            batches: Arc::default(),
        }
    }

    /// Hands a map item's attempt to the job array of its (run, stage, attempt): the first
    /// item starts gathering, and once no more arrive for [`GATHER`] they are submitted as
    /// one array. Returns the item's `JOB_TASK` id.
    async fn enqueue(&self, spec: &AttemptSpec) -> Result<(String, PathBuf), ExecutorError> {
        let key = submit::array_name(spec);
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut batches = self.batches.lock().unwrap_or_else(|e| e.into_inner());
            let batch = batches.entry(key.clone()).or_default();
            batch.push((spec.clone(), tx));
            batch.len() == 1
        };
        if first {
            let (batches, settings, cli) = (
                self.batches.clone(),
                self.settings.clone(),
                self.cli.clone(),
            );
            tokio::spawn(async move {
                let mut seen = 0;
                let batch = loop {
                    tokio::time::sleep(GATHER).await;
                    let mut b = batches.lock().unwrap_or_else(|e| e.into_inner());
                    let n = b.get(&key).map_or(0, Vec::len);
                    if n == seen {
                        break b.remove(&key).unwrap_or_default();
                    }
                    seen = n;
                };
                let max = settings.max_array_size.unwrap_or(1000).max(1);
                // Task N of an array is its Nth item in the map's order.
                let mut batch = batch;
                batch.sort_by_key(|(s, _)| s.placement.item);
                while !batch.is_empty() {
                    let rest = batch.split_off(batch.len().min(max));
                    let (specs, txs): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                    match submit_array(&settings, &cli, &specs).await {
                        Ok(ids) => {
                            for (tx, id) in txs.into_iter().zip(ids) {
                                let _ = tx.send(Ok(id));
                            }
                        }
                        Err(e) => {
                            for tx in txs {
                                let _ = tx.send(Err(e.clone()));
                            }
                        }
                    }
                    batch = rest;
                }
            });
        }
        rx.await
            .map_err(|_| ExecutorError("the job array was never submitted".into()))?
            .map_err(ExecutorError)
    }

    /// `sinfo`'s view of the cluster, for `doctor`: its partitions and node states, or
    /// why it cannot be reached.
    pub async fn check(&self) -> Result<String, String> {
        let out = self
            .cli
            .run("sinfo", &["-h", "-o", "%P %a %D %T %G"])
            .await?;
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            return Err("`sinfo` lists no partition".into());
        }
        Ok(lines.join("; "))
    }

    /// Whether a job sees `dir` as this machine does: a probe job (`sbatch --wait`) writes
    /// a file of this process's making there, which must then be here.
    pub async fn probe(&self, dir: &Path) -> Result<String, String> {
        let token = format!(
            "probe-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
        );
        let file = dir.join(".drivetrain-slurm-probe");
        let _ = std::fs::remove_file(&file);
        let mut args = vec![
            "--wait".to_owned(),
            "--parsable".to_owned(),
            "--job-name=dt.doctor".to_owned(),
            format!("--chdir={}", dir.display()),
            "--output=/dev/null".to_owned(),
            "--time=1".to_owned(),
        ];
        args.extend(
            self.settings
                .partition
                .iter()
                .map(|p| format!("--partition={p}")),
        );
        args.extend(
            self.settings
                .account
                .iter()
                .map(|a| format!("--account={a}")),
        );
        args.extend(self.settings.qos.iter().map(|q| format!("--qos={q}")));
        args.push(format!("--wrap=echo {token} > .drivetrain-slurm-probe"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        self.cli.run("sbatch", &args).await?;
        let seen = std::fs::read_to_string(&file).unwrap_or_default();
        let _ = std::fs::remove_file(&file);
        if seen.trim() == token {
            Ok(format!(
                "a job wrote into {} ({:.1} s)",
                dir.display(),
                started.elapsed().as_secs_f64()
            ))
        } else {
            Err(format!(
                "a job ran but its file is not in {}: put the home on a file system the compute nodes share",
                dir.display()
            ))
        }
    }

    /// Job `id`'s name and state, if the controller knows it (or accounting does).
    async fn job(&self, id: &str) -> Option<(String, JobStatus)> {
        let out = self
            .cli
            .run(
                "squeue",
                &[
                    "-h",
                    "-r",
                    "-t",
                    "all",
                    "-j",
                    id,
                    "-O",
                    "Name:0|,JobArrayID:0|,State:0|,exit_code:0|,Reason:0",
                ],
            )
            .await
            .unwrap_or_default();
        if let Some((name, rest)) = out.lines().next().and_then(|l| l.split_once('|')) {
            let status = poll::parse_squeue(rest).remove(id)?;
            return Some((name.trim().to_owned(), status));
        }
        // Ended and forgotten by the controller: accounting, where the cluster keeps it.
        let format = format!("JobName,{}", poll::SACCT_FORMAT);
        let out = self
            .cli
            .run("sacct", &["-n", "-P", "-X", "-j", id, "-o", &format])
            .await
            .ok()?;
        let (name, rest) = out.lines().next()?.split_once('|')?;
        let status = poll::parse_sacct(rest).remove(id)?;
        Some((name.trim().to_owned(), status))
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<String, ExecutorError> {
        let sub = submit::submission(&self.settings, spec);
        let script = spec.log.with_file_name("slurm.sh");
        std::fs::write(&script, submit::SCRIPT)
            .map_err(|e| ExecutorError(format!("cannot write {}: {e}", script.display())))?;
        let mut args: Vec<&str> = sub.options.iter().map(String::as_str).collect();
        let script_arg = script.display().to_string();
        args.push(&script_arg);
        args.extend(spec.argv.iter().map(String::as_str));
        let mut command = self.cli.command("sbatch", &args);
        command.env_clear().envs(sub.env.iter().cloned());
        let out = cli::output(command, "sbatch")
            .await
            .map_err(|e| ExecutorError(format!("cannot submit stage `{}`: {e}", spec.stage)))?;
        // `--parsable`: `ID` or `ID;CLUSTER`.
        let id = out.trim().split(';').next().unwrap_or("").to_owned();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return Err(ExecutorError(format!(
                "sbatch printed no job id for stage `{}`: {out:?}",
                spec.stage
            )));
        }
        Ok(id)
    }
}

fn job_of(handle: &str) -> Option<&str> {
    handle
        .strip_prefix("slurm:")
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit() || c == '_'))
}

#[async_trait]
impl Executor for SlurmExecutor {
    fn name(&self) -> &'static str {
        "slurm"
    }

    /// A job sees its node's file system as it is and mounts nothing: a host path at its
    /// own path only.
    fn refuses_volume(&self, volume: &drivetrain_engine::spec::VolumeSpec) -> Option<String> {
        match &volume.host_path {
            Some(h) if *h == volume.mount_path => None,
            Some(_) => Some(
                "a Slurm job sees its node's files where they are and mounts nothing: give \
                 `mount_path` the same path as `host_path` (a path every node has)"
                    .into(),
            ),
            None => Some(
                "a Slurm job mounts nothing (claims, scratch space and snapshots are \
                 Kubernetes volumes): give `host_path` of a shared file system, at its own path"
                    .into(),
            ),
        }
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        if spec.argv.is_empty() {
            return Err(ExecutorError("empty argv".into()));
        }
        if spec.placement.network == drivetrain_engine::spec::Network::None {
            return Err(ExecutorError(format!(
                "stage `{}` has `network: none`, which the slurm executor cannot give it",
                spec.stage
            )));
        }
        let name = submit::job_name(&spec);
        let adopted = self
            .adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
        let in_array = spec.placement.item.is_some() && spec.distributed.is_none();
        let (id, slurm_out) = match adopted {
            Some(id) => {
                note(&spec.log, &format!("re-attached to Slurm job {id}"));
                (id, None)
            }
            None if in_array => {
                let (id, out) = self.enqueue(&spec).await?;
                (id, Some(out))
            }
            None => (self.submit(&spec).await?, None),
        };
        let status = self.poller.watch(&id);
        Ok(Box::new(SlurmAttempt {
            cli: self.cli.clone(),
            argv0: spec.argv[0].clone(),
            log: spec.log,
            slurm_out,
            id,
            status,
            pending: None,
            cancelled: false,
        }))
    }

    async fn reap(&self, handle: &str) -> bool {
        let Some(id) = job_of(handle) else {
            return false;
        };
        let running = self.job(id).await.is_some_and(|(_, s)| !s.ended());
        let _ = self.cli.run("scancel", &[id]).await;
        running
    }

    async fn reattach(&self, handle: &str) -> bool {
        let Some(id) = job_of(handle) else {
            return false;
        };
        match self.job(id).await {
            Some((name, _)) => {
                self.adopted
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name, id.to_owned());
                true
            }
            None => false,
        }
    }

    async fn find(&self, run: &str, stage: &str, attempt: u32) -> Option<String> {
        let name = submit::attempt_name(run, stage, attempt);
        let out = self
            .cli
            .run("squeue", &["-h", "-t", "all", "-n", &name, "-O", "JobID:0"])
            .await
            .ok()?;
        let id = out.lines().next()?.trim().to_owned();
        (!id.is_empty()).then(|| format!("slurm:{id}"))
    }

    fn schedules_gpus(&self) -> bool {
        true
    }

    fn runs_items_together(&self) -> bool {
        true
    }
}

/// Submits one job array for `specs` (items of one map stage, one attempt number): each
/// task's file (argv, environment, directory, log; mode 0600) in a directory of the array
/// beside the items' own, the script, then `sbatch --array`. Returns each item's id.
async fn submit_array(
    settings: &Settings,
    cli: &Cli,
    specs: &[AttemptSpec],
) -> Result<Vec<(String, PathBuf)>, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let first = specs.first().ok_or("no items")?;
    let items = first
        .log
        .parent()
        .and_then(Path::parent)
        .ok_or("an item's log has no directory")?;
    // Named by the array's job id once known; a name of its own until then.
    let staging = items.join(format!(
        ".slurm-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
    ));
    std::fs::create_dir_all(&staging)
        .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
    for (i, spec) in specs.iter().enumerate() {
        let mut env = spec.env.clone();
        env.extend(submit::alone(settings, Default::default()));
        let task = submit::Task {
            argv: spec.argv.clone(),
            env,
            workdir: spec.workdir.clone(),
            log: spec.log.clone(),
        };
        let path = staging.join(format!("{i}.json"));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        f.write_all(&serde_json::to_vec(&task).unwrap_or_default())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let script = staging.join("array.sh");
    std::fs::write(&script, submit::ARRAY_SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let sub = submit::array_submission(settings, first, &staging, specs.len(), &exe);
    let mut args: Vec<&str> = sub.options.iter().map(String::as_str).collect();
    let script_arg = script.display().to_string();
    args.push(&script_arg);
    let mut command = cli.command("sbatch", &args);
    command.env_clear().envs(sub.env.iter().cloned());
    let out = cli::output(command, "sbatch")
        .await
        .map_err(|e| format!("cannot submit the items of stage `{}`: {e}", first.stage))?;
    let id = out.trim().split(';').next().unwrap_or("").to_owned();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("sbatch printed no job id: {out:?}"));
    }
    Ok((0..specs.len())
        .map(|i| (format!("{id}_{i}"), staging.join(format!("{i}.out"))))
        .collect())
}

/// Appends a line of the executor's own to the attempt's log.
fn note(log: &Path, line: &str) {
    crate::append_log(log, &format!("drivetrain: {line}\n"));
}

/// A submitted job (or one task of a job array).
struct SlurmAttempt {
    cli: Arc<Cli>,
    argv0: String,
    log: PathBuf,
    /// An array task's own output file, where Slurm writes about it.
    slurm_out: Option<PathBuf>,
    /// `cancel` was called: a task Slurm dropped before it started is cancelled too.
    cancelled: bool,
    id: String,
    status: watch::Receiver<Option<JobStatus>>,
    /// The pending reason last noted in the log.
    pending: Option<String>,
}

#[async_trait]
impl RunningAttempt for SlurmAttempt {
    fn handle(&self) -> String {
        format!("slurm:{}", self.id)
    }

    async fn wait(&mut self) -> AttemptOutcome {
        loop {
            let seen = self.status.borrow_and_update().clone();
            if let Some(s) = seen {
                if let Some(why) = s.never_runs() {
                    let _ = self.cli.run("scancel", &[&self.id]).await;
                    return AttemptOutcome::Failed {
                        exit_code: None,
                        reason: format!(
                            "Slurm will never start job {} ({}): {why}",
                            self.id, s.reason
                        ),
                    };
                }
                if s.ended() {
                    if self.cancelled {
                        return AttemptOutcome::Cancelled;
                    }
                    let mut tail = crate::file_tail(&self.log, 4096);
                    if let Some(out) = &self.slurm_out {
                        tail.push_str(&crate::file_tail(out, 4096));
                    }
                    return s.outcome(&self.id, &self.argv0, &tail);
                }
                // `None`: just submitted, not yet considered; a reason is worth a line.
                let waits = s.state == "PENDING" && !matches!(s.reason.as_str(), "" | "None");
                if waits && self.pending.as_deref() != Some(s.reason.as_str()) {
                    note(
                        &self.log,
                        &format!("Slurm job {} is pending: {}", self.id, s.reason),
                    );
                    self.pending = Some(s.reason.clone());
                }
                // What `status` shows next once it waited: that it no longer does.
                if s.state == "RUNNING" && self.pending.take().is_some() {
                    note(&self.log, &format!("Slurm job {} is running", self.id));
                }
            }
            if self.status.changed().await.is_err() {
                return AttemptOutcome::Lost {
                    reason: format!("lost: the poll of Slurm job {} stopped", self.id),
                };
            }
        }
    }

    async fn cancel(&mut self) {
        self.cancelled = true;
        if let Err(e) = self.cli.run("scancel", &[&self.id]).await {
            tracing::warn!("cannot cancel Slurm job {}: {e}", self.id);
        }
    }
}
