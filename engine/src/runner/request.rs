//! What a run is asked: [`RunRequest`], the one thing `run`, `rerun`, `retry`, `resume`
//! and `serve` differ in (the [`crate::engine::Engine`] carries every request out alike).

use crate::names::StageName;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use std::time::Duration;

use crate::executor::Executor;
use crate::plan::Pipeline;
use crate::state::{Phase, RunId, RunRecord};

use super::{CacheMode, Resume, Reused};

/// One run to carry out: the pipeline and its parameters, where it came from, and how it
/// differs from a plain `drivetrain run` (a rerun's selection and reused stages, a
/// retry's cache, a cron tick's time, a resumed run's record).
#[derive(Clone)]
pub struct RunRequest {
    pub id: RunId,
    pub pipeline: Arc<Pipeline>,
    pub params: BTreeMap<String, Value>,
    /// The pipeline file, as given.
    pub file: String,
    /// sha256 of the pipeline file.
    pub spec_digest: String,
    /// What started it: `cli`, `api`, `schedule`, `rerun`, `retry`.
    pub trigger: String,
    /// The engine's parallelism unless set.
    pub parallelism: Option<usize>,
    /// Stop everything at the first failure.
    pub fail_fast: bool,
    /// How many of the machine's GPUs stages may claim (`None`: all).
    pub gpus: Option<usize>,
    /// The run this one reruns or retries.
    pub parent: Option<RunId>,
    /// The stages to execute; the others end at once, reused when in `reuse`. `None`: all.
    pub selection: Option<BTreeSet<StageName>>,
    /// Stages whose outputs come from an earlier run, not executed.
    pub reuse: BTreeMap<StageName, Reused>,
    /// What a rerun overrode (recorded with the run).
    pub overrides: Value,
    pub cache: CacheMode,
    /// The cron tick this run is for (`{{ schedule.time }}`).
    pub scheduled_time: Option<String>,
    /// A run recorded before, continued: what already succeeded is not executed again.
    pub resume: Option<Resume>,
    /// Its artifact store where not the engine's (a project's runs keep theirs apart).
    pub store: Option<crate::artifacts::ArtifactStore>,
    /// Its executor where not the engine's (a rerun of a pipeline on another executor, a
    /// resumed run on the one it started on).
    pub executor: Option<Arc<dyn Executor>>,
    /// Past this much time from its start, everything is stopped and the run fails.
    pub deadline: Option<Duration>,
}

impl std::fmt::Debug for RunRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRequest")
            .field("id", &self.id)
            .field("pipeline", &self.pipeline.name)
            .field("trigger", &self.trigger)
            .field("parent", &self.parent)
            .field("selection", &self.selection)
            .field("executor", &self.executor.as_ref().map(|e| e.name()))
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl RunRequest {
    /// Run `id` of `pipeline` from `file`, whose text has digest `spec_digest`: every stage,
    /// the cache read and written, started from the command line.
    pub fn new(id: RunId, pipeline: Arc<Pipeline>, file: String, spec_digest: String) -> Self {
        RunRequest {
            id,
            pipeline,
            params: BTreeMap::new(),
            file,
            spec_digest,
            trigger: "cli".into(),
            parallelism: None,
            fail_fast: false,
            gpus: None,
            parent: None,
            selection: None,
            reuse: BTreeMap::new(),
            overrides: Value::Object(Default::default()),
            cache: CacheMode::default(),
            scheduled_time: None,
            resume: None,
            store: None,
            executor: None,
            deadline: None,
        }
    }

    /// The record of this run starting now on `executor`, this process its engine.
    pub fn record(&self, executor: &str) -> RunRecord {
        RunRecord {
            id: self.id.clone(),
            pipeline: self.pipeline.name.clone(),
            project: self.pipeline.project.clone(),
            file: self.file.clone(),
            spec_digest: self.spec_digest.clone(),
            params: serde_json::to_value(&self.params).unwrap_or_default(),
            trigger: self.trigger.clone(),
            parent: self.parent.clone(),
            phase: Phase::Running,
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            finished_at: None,
            reason: None,
            engine_pid: Some(i64::from(std::process::id())),
            overrides: self.overrides.clone(),
            selection: self.selection.as_ref().map(|s| s.iter().cloned().collect()),
            scheduled_time: self.scheduled_time.clone(),
            executor: Some(executor.to_owned()),
        }
    }
}
