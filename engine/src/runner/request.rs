//! What a run is asked: [`RunRequest`], the one thing `run`, `rerun`, `retry`, `resume`
//! and `serve` differ in (the [`crate::engine::Engine`] carries every request out alike).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::plan::Pipeline;
use crate::state::RunId;

use super::{CacheMode, Resume, Reused};

/// One run to carry out: the pipeline and its parameters, where it came from, and how it
/// differs from a plain `drivetrain run` (a rerun's selection and reused stages, a
/// retry's cache, a cron tick's time, a resumed run's record).
#[derive(Debug, Clone)]
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
    pub selection: Option<BTreeSet<String>>,
    /// Stages whose outputs come from an earlier run, not executed.
    pub reuse: BTreeMap<String, Reused>,
    /// What a rerun overrode (recorded with the run).
    pub overrides: Value,
    pub cache: CacheMode,
    /// The cron tick this run is for (`{{ schedule.time }}`).
    pub scheduled_time: Option<String>,
    /// A run recorded before, continued: what already succeeded is not executed again.
    pub resume: Option<Resume>,
    /// Its artifact store where not the engine's (a project's runs keep theirs apart).
    pub store: Option<crate::artifacts::ArtifactStore>,
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
        }
    }
}
