//! The engine: the services every run uses, built once, and the runs submitted to it.
//!
//! An [`Engine`] owns the state store, the artifact store, the executor, the resolver of
//! what cache keys read from outside a run (the model registry), how built-in steps run
//! and how the machine's GPUs are found; [`EngineBuilder`] puts it together (the way
//! DataFusion's `RuntimeEnvBuilder` does). A run is a [`RunRequest`]: `run`, `rerun`,
//! `retry`, `resume`, a cron tick and `serve`'s API differ only in the request they submit
//! to [`Engine::run`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::artifacts::ArtifactStore;
use crate::cache::Resolver;
use crate::executor::Executor;
use crate::plan::Pipeline;
pub use crate::runner::RunRequest;
use crate::runner::{self, RunError, RunEvent, RunSummary};
use crate::state::StateStore;

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

    /// Carries out `request` to its end, reporting `events` as it goes; `cancel` set to
    /// true stops it (its hooks still run).
    pub async fn run(
        &self,
        request: RunRequest,
        events: mpsc::UnboundedSender<RunEvent>,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunSummary, RunError> {
        let mut request = request;
        let artifacts = request
            .store
            .take()
            .unwrap_or_else(|| self.artifacts.clone());
        let opts = runner::RunOptions {
            parallelism: request.parallelism.unwrap_or(self.parallelism).max(1),
            work_dir: self.work_dir.clone(),
            // A cluster that hands out GPUs itself needs none of this machine's.
            gpus: match self.executor.schedules_gpus() {
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
            executor: self.executor.clone(),
            opts,
        };
        runner::run(job, events, cancel).await
    }
}
