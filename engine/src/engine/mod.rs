//! The engine: the services every run uses, built once, and the runs submitted to it.
//!
//! An [`Engine`] owns the state store, the artifact store, the executor (and how to find
//! the others by name), the resolver of what cache keys read from outside a run (the
//! model registry), how built-in steps run and how the machine's GPUs are found;
//! [`EngineBuilder`] puts it together (the way DataFusion's `RuntimeEnvBuilder` does).
//!
//! The engine owns every run's life, from request to last transition. A run is a
//! [`RunRequest`]: `run`, `rerun` and `retry` ([`Engine::rerun_request`]), `resume`
//! ([`Engine::resume_request`]), a cron tick, a trigger, an approval and `serve`'s API
//! differ only in the request they submit to [`Engine::run`], in the process that asks.
//! The run's deadline, the end of a run whose engine failed
//! ([`Engine::end_after_failure`]) and of one whose engine is gone
//! ([`Engine::end_orphan`]) are the engine's too.

pub mod home;
pub mod recover;
pub mod rerun;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

pub use home::Home;
pub use rerun::{RerunPlan, RerunSource, RerunSpec};

use crate::artifacts::ArtifactStore;
use crate::cache::Resolver;
use crate::executor::Executor;
use crate::fault::{Blame, Fault};
use crate::plan::Pipeline;
pub use crate::runner::RunRequest;
use crate::runner::{self, RunError, RunEvent, RunSummary};
use crate::state::{Phase, RunId, RunRecord, StateError, StateStore};

/// Finds an executor by the name pipelines use (`local`, `kubernetes`, `slurm`).
pub type FindExecutor = dyn Fn(&str) -> Result<Arc<dyn Executor>, String> + Send + Sync;

/// Why the engine will not carry out what was asked, said to whoever asked.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// What was asked does not fit (a stage name, a param, a changed pipeline file).
    #[error("{0}")]
    Usage(String),
    /// No such run.
    #[error("{0}")]
    NotFound(String),
    /// The run still runs.
    #[error("{0}")]
    Busy(String),
    /// There is nothing to do (a retry of a run whose stages all succeeded).
    #[error("{0}")]
    Nothing(String),
    /// What it needs failed (a pipeline file that cannot be read, a store).
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    State(#[from] StateError),
}

impl From<crate::state::sources::SourceError> for Refusal {
    fn from(e: crate::state::sources::SourceError) -> Self {
        match e {
            crate::state::sources::SourceError::Lost(m) => Refusal::Failed(m),
            crate::state::sources::SourceError::State(e) => Refusal::State(e),
        }
    }
}

impl Blame for Refusal {
    fn fault(&self) -> Fault {
        match self {
            Refusal::Usage(_) | Refusal::NotFound(_) | Refusal::Busy(_) | Refusal::Nothing(_) => {
                Fault::Request
            }
            Refusal::Failed(_) => Fault::Pipeline,
            Refusal::State(e) => e.fault(),
        }
    }
}

/// Finds the GPUs stages of a pipeline may claim (`CUDA_VISIBLE_DEVICES` names), given
/// how many the request allows (`None`: all the machine has).
pub type FindGpus = dyn Fn(&Pipeline, Option<usize>) -> Vec<String> + Send + Sync;

/// The services of every run.
#[derive(Clone)]
pub struct Engine {
    state: Arc<dyn StateStore>,
    artifacts: ArtifactStore,
    executor: Arc<dyn Executor>,
    work_dir: PathBuf,
    parallelism: usize,
    step_command: Vec<String>,
    resolver: Option<Arc<dyn Resolver>>,
    gpus: Arc<FindGpus>,
    executors: Option<Arc<FindExecutor>>,
    home: Option<Home>,
}

/// Builds an [`Engine`]: the state store, artifact store, executor and work directory are
/// required; the rest has defaults (no built-in steps, no resolver, no GPUs, one attempt at
/// a time per core).
#[derive(Debug)]
pub struct EngineBuilder {
    engine: Engine,
}

impl EngineBuilder {
    /// An engine recording runs in `state`, keeping artifacts in `artifacts`, running
    /// attempts on `executor` with their working directories under `work_dir`.
    pub fn new(
        state: Arc<dyn StateStore>,
        artifacts: ArtifactStore,
        executor: Arc<dyn Executor>,
        work_dir: PathBuf,
    ) -> Self {
        EngineBuilder {
            engine: Engine {
                state,
                artifacts,
                executor,
                work_dir,
                parallelism: std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2),
                step_command: Vec::new(),
                resolver: None,
                gpus: Arc::new(|_, _| Vec::new()),
                executors: None,
                home: None,
            },
        }
    }

    /// The most attempts running at once, unless a request says otherwise.
    pub fn parallelism(mut self, n: usize) -> Self {
        self.engine.parallelism = n.max(1);
        self
    }

    /// How a built-in step runs: this argv plus the step's name.
    pub fn step_command(mut self, argv: Vec<String>) -> Self {
        self.engine.step_command = argv;
        self
    }

    /// What resolves references outside a run (`registry:MODEL@ALIAS`) for cache keys.
    pub fn resolver(mut self, resolver: Arc<dyn Resolver>) -> Self {
        self.engine.resolver = Some(resolver);
        self
    }

    /// How the machine's GPUs are found (only for pipelines with a stage that asks).
    pub fn gpus(
        mut self,
        find: impl Fn(&Pipeline, Option<usize>) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.engine.gpus = Arc::new(find);
        self
    }

    /// How executors other than the engine's are found by name (a rerun of a pipeline on
    /// another one, an orphan to end); without it only the engine's own is known.
    pub fn executors(
        mut self,
        find: impl Fn(&str) -> Result<Arc<dyn Executor>, String> + Send + Sync + 'static,
    ) -> Self {
        self.engine.executors = Some(Arc::new(find));
        self
    }

    /// The home whose stores the runs of other projects and pipelines use.
    pub fn home(mut self, home: Home) -> Self {
        self.engine.home = Some(home);
        self
    }

    pub fn build(self) -> Engine {
        self.engine
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("executor", &self.executor.name())
            .field("work_dir", &self.work_dir)
            .field("parallelism", &self.parallelism)
            .finish_non_exhaustive()
    }
}

impl Engine {
    pub fn state(&self) -> &Arc<dyn StateStore> {
        &self.state
    }

    pub fn artifacts(&self) -> &ArtifactStore {
        &self.artifacts
    }

    pub fn executor(&self) -> &Arc<dyn Executor> {
        &self.executor
    }

    /// Where attempts get their working directories (`.drivetrain/work`).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// The executor named (`None`: the engine's own).
    pub fn executor_named(&self, name: Option<&str>) -> Result<Arc<dyn Executor>, Refusal> {
        match (name, &self.executors) {
            (None, _) => Ok(self.executor.clone()),
            (Some(n), _) if n == self.executor.name() => Ok(self.executor.clone()),
            (Some(n), Some(find)) => find(n).map_err(Refusal::Usage),
            (Some(n), None) => Err(Refusal::Usage(format!(
                "this engine runs on `{}`, not `{n}`",
                self.executor.name()
            ))),
        }
    }

    /// The home of its runs; without one (tests), a home around the work directory.
    pub fn home(&self) -> Home {
        self.home
            .clone()
            .unwrap_or_else(|| Home::around(&self.work_dir))
    }

    /// The artifact store of a run of `pipeline`: its `store:` (or the home's), its
    /// project's part of it.
    pub fn run_store(&self, pipeline: &Pipeline) -> Result<ArtifactStore, Refusal> {
        self.home()
            .run_store(pipeline.store.as_deref(), &pipeline.project)
            .map_err(|e| Refusal::Failed(e.to_string()))
    }

    /// Records `request`'s run now, `Pending` or `Running`, so that whoever asked can
    /// read it at once; the run carries on from this record when it runs.
    pub fn admit(&self, request: &mut RunRequest, pending: bool) -> Result<RunRecord, StateError> {
        let executor = request.executor.as_ref().unwrap_or(&self.executor).name();
        let mut record = request.record(executor);
        if pending {
            record.phase = Phase::Pending;
        }
        self.state.create_run(&record)?;
        request.resume = Some(runner::Resume::recorded(record.clone()));
        Ok(record)
    }

    /// Carries out `request` to its end, reporting `events` as it goes; `cancel` set to
    /// true stops it (its hooks still run). Past the request's deadline the run is
    /// stopped the same way and ends `Failed`; an engine that fails (a state store that
    /// cannot be written, a full disk) ends the run as `Error` with that reason.
    pub async fn run(
        &self,
        mut request: RunRequest,
        events: mpsc::UnboundedSender<RunEvent>,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunSummary, RunError> {
        let id = request.id.clone();
        let deadline = request.deadline;
        let hit = Arc::new(AtomicBool::new(false));
        // Cancelled before it starts (a cancel that found the run claimed but not yet
        // running): stopped from its first decision, not from whenever the watcher runs.
        // A cancel recorded in the state store (asked of whichever engine drives the run)
        // counts as one given here.
        let asked_already = self.state.cancel_asked(&id).unwrap_or(false);
        let (stop_tx, stop) = watch::channel(*cancel.borrow() || asked_already);
        let asked = asked(self.state.clone(), id.clone());
        let watcher = tokio::spawn(stop_on(cancel, asked, deadline, hit.clone(), stop_tx));
        let artifacts = request
            .store
            .take()
            .unwrap_or_else(|| self.artifacts.clone());
        let executor = request
            .executor
            .take()
            .unwrap_or_else(|| self.executor.clone());
        let opts = runner::RunOptions {
            parallelism: request.parallelism.unwrap_or(self.parallelism).max(1),
            work_dir: self.work_dir.clone(),
            // A cluster that hands out GPUs itself needs none of this machine's.
            gpus: match executor.schedules_gpus() {
                true => Vec::new(),
                false => (self.gpus)(&request.pipeline, request.gpus),
            },
            step_command: self.step_command.clone(),
            resolver: self.resolver.clone(),
            request,
        };
        let job = runner::Job {
            state: self.state.clone(),
            artifacts,
            executor,
            opts,
        };
        let ended = runner::run(job, events, stop).await;
        watcher.abort();
        let mut summary = match ended {
            Ok(s) => s,
            Err(e) => {
                self.end_after_failure(&id, &e.to_string()).await;
                return Err(e);
            }
        };
        if let Some(d) = deadline.filter(|_| hit.load(Ordering::SeqCst)) {
            let reason = deadline_reason(d);
            self.state.finish_run(&id, Phase::Failed, Some(&reason))?;
            summary.phase = Phase::Failed;
        }
        Ok(summary)
    }
}

/// Why a run ended past its deadline `d`, as the engine records it.
pub fn deadline_reason(d: Duration) -> String {
    format!("run deadline of {} exceeded", humantime::format_duration(d))
}

/// Resolves once a cancel of `run` is recorded in the state store: asked through another
/// server of the home, or of a run this engine took over.
async fn asked(state: Arc<dyn StateStore>, run: RunId) {
    let every = runner::heartbeat_interval().min(Duration::from_secs(2));
    loop {
        tokio::time::sleep(every).await;
        let (s, r) = (state.clone(), run.clone());
        let asked = tokio::task::spawn_blocking(move || s.cancel_asked(&r)).await;
        if matches!(asked, Ok(Ok(true))) {
            return;
        }
    }
}

/// Sets `stop` when `cancel` is set, `asked` resolves or `deadline` passes (then `hit`
/// too).
async fn stop_on(
    mut cancel: watch::Receiver<bool>,
    asked: impl std::future::Future<Output = ()>,
    deadline: Option<Duration>,
    hit: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
) {
    let cancelled = async {
        // A sender gone without cancelling never cancels.
        if cancel.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = cancelled => {}
        _ = asked => {}
        _ = tokio::time::sleep(deadline.unwrap_or(Duration::MAX)) => {
            hit.store(true, Ordering::SeqCst);
        }
    }
    let _ = stop.send(true);
}

#[cfg(test)]
mod tests;
