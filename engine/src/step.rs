//! The `Step` trait and the catalog of what a pipeline may name.
//!
//! A built-in step (`uses: ingest`) is described by its name, version, the outputs it
//! writes, the inputs it reads and a config type; validation checks a stage's `with:`
//! block against that type with located errors. Executors are named here too, so
//! `validate` can reject `executor: kubernets`. The engine never names a concrete step or
//! executor: the binary builds one [`Catalog`] from the `steps` and `executors` crates.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::de::from_node;
use crate::diag::Diagnostic;
use crate::yaml::{Node, YamlPath};

/// How a step run ends when it fails: its message is the stage's reason.
pub type StepResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A built-in step: what validation and planning see, and what runs.
#[async_trait::async_trait]
pub trait Step: Send + Sync + 'static {
    /// The name pipelines use in `uses:`.
    fn name(&self) -> &'static str;
    /// The step's own version; part of every cache key of a stage that uses it.
    fn version(&self) -> &'static str;
    /// One line for `--help` and `drivetrain steps`.
    fn summary(&self) -> &'static str;
    /// The outputs the step writes. A stage using it may declare any subset.
    fn outputs(&self) -> &'static [&'static str];
    /// The inputs it reads, each with whether it is required.
    fn inputs(&self) -> &'static [(&'static str, bool)];
    /// Checks the `with:` block (`None` when absent). Each problem is located.
    fn check_config(&self, with: Option<&Node<'_>>, path: &YamlPath) -> Vec<Diagnostic>;
    /// The JSON Schema of the `with:` block.
    fn config_schema(&self) -> serde_json::Value;
    /// Runs the step over its inputs, writing its outputs and values.
    async fn run(&self, cx: &StepContext) -> StepResult;
    /// Checks the config more deeply than its type can (SQL that parses, columns that
    /// exist, a gate naming known metrics): the rendered `with:` block as JSON, with the
    /// path of the block for locating what is wrong. Default: nothing more to check.
    fn check_semantics(&self, _config: &Value) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The keys of the values it reports (`stages.S.values.KEY`), so a `when:` or a
    /// template naming one it never reports is an error at validation; empty: not said.
    fn values(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether the step writes the model registry (`registry/` of the artifact store),
    /// which is read-only for every other stage.
    fn writes_registry(&self) -> bool {
        false
    }
    /// What the step reads from outside its declared inputs, given its (untemplated)
    /// config and the inputs the stage connects: cache-key references such as
    /// `registry:MODEL@ALIAS`, templated like the config. The engine resolves each when
    /// the stage is about to run and keys the stage on the result (see
    /// [`crate::cache::Resolver`]), so a cache hit never answers for a world that moved.
    fn reads(&self, _config: &Value, _inputs: &[&str]) -> Vec<String> {
        Vec::new()
    }
}

/// Everything a step gets when it runs, read from the attempt's environment (the same
/// contract in a local child process and in a container: `drivetrain step NAME`).
#[derive(Debug, Clone, Default)]
pub struct StepContext {
    /// The rendered `with:` block (`DRIVETRAIN_STEP_CONFIG`).
    pub config: Value,
    /// Inputs that are present, by name: directories (or store URLs in `mode: url`).
    pub inputs: BTreeMap<String, PathBuf>,
    /// The artifact digest of each present input (`DRIVETRAIN_INPUT_<NAME>_DIGEST`).
    pub input_digests: BTreeMap<String, String>,
    /// A directory kept across the attempts of this stage in this run, for checkpoints
    /// (`DRIVETRAIN_CHECKPOINTS`).
    pub checkpoints: Option<PathBuf>,
    /// Outputs by name: empty directories to write into.
    pub outputs: BTreeMap<String, PathBuf>,
    /// Where `values.json` goes.
    pub values: PathBuf,
    pub params: Value,
    pub run_id: String,
    pub pipeline: String,
    /// The pipeline file's folder (`DRIVETRAIN_PIPELINE_DIR`), where relative paths in
    /// `with:` are resolved.
    pub pipeline_dir: Option<PathBuf>,
    pub stage: String,
    pub attempt: u32,
    /// The artifact store's URL.
    pub store: String,
    /// Distributed rank and world size (0 and 1 when not distributed).
    pub rank: u32,
    pub world: u32,
    /// `MASTER_ADDR:MASTER_PORT` of a distributed attempt.
    pub master: Option<String>,
}

/// The environment-variable suffix of an input or output name (`frames` → `FRAMES`).
/// Who is acting, for records such as the registry's alias moves: `DRIVETRAIN_USER` when
/// set, else `USER@HOST` of this process (`USER` or `LOGNAME`, else `uid N`; the kernel's
/// host name). The engine hands its own to built-in steps, so a promotion records the
/// person or service that ran the pipeline, not the step's bare environment.
pub fn who() -> String {
    if let Some(u) = std::env::var("DRIVETRAIN_USER")
        .ok()
        .filter(|u| !u.is_empty())
    {
        return u;
    }
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|u| !u.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|l| l.split_whitespace().next().map(|u| format!("uid {u}")))
                })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(host) if !host.trim().is_empty() => format!("{user}@{}", host.trim()),
        _ => user,
    }
}

pub fn env_suffix(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// What a step's context lacks: the step was started outside a run, or its stage does not
/// connect what the step reads or writes.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("{0} is not set: run steps through `drivetrain run`")]
    Unset(&'static str),
    #[error("DRIVETRAIN_STEP_CONFIG is not JSON: {0}")]
    Config(serde_json::Error),
    #[error("input `{0}` is not connected (declare `inputs: {{{0}: STAGE.OUTPUT}}`)")]
    Input(String),
    #[error("output `{0}` is not declared (add it to the stage's `outputs`)")]
    Output(String),
}

impl StepContext {
    /// The context of step `step` from this process's environment.
    pub fn from_env(step: &dyn Step) -> Result<StepContext, ContextError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let need = |k: &'static str| var(k).ok_or(ContextError::Unset(k));
        let config = match var("DRIVETRAIN_STEP_CONFIG") {
            Some(c) => serde_json::from_str(&c).map_err(ContextError::Config)?,
            None => Value::Object(Default::default()),
        };
        let mut inputs = BTreeMap::new();
        let mut input_digests = BTreeMap::new();
        for (name, _) in step.inputs() {
            if let Some(p) = var(&format!("DRIVETRAIN_INPUT_{}", env_suffix(name))) {
                inputs.insert((*name).to_owned(), PathBuf::from(p));
            }
            if let Some(d) = var(&format!("DRIVETRAIN_INPUT_{}_DIGEST", env_suffix(name))) {
                input_digests.insert((*name).to_owned(), d);
            }
        }
        let mut outputs = BTreeMap::new();
        for name in step.outputs() {
            if let Some(p) = var(&format!("DRIVETRAIN_OUTPUT_{}", env_suffix(name))) {
                outputs.insert((*name).to_owned(), PathBuf::from(p));
            }
        }
        Ok(StepContext {
            config,
            inputs,
            input_digests,
            checkpoints: var("DRIVETRAIN_CHECKPOINTS").map(PathBuf::from),
            outputs,
            values: PathBuf::from(need("DRIVETRAIN_VALUES")?),
            params: var("DRIVETRAIN_PARAMS")
                .and_then(|p| serde_json::from_str(&p).ok())
                .unwrap_or(Value::Null),
            run_id: var("DRIVETRAIN_RUN_ID").unwrap_or_default(),
            pipeline: var("DRIVETRAIN_PIPELINE").unwrap_or_default(),
            pipeline_dir: var("DRIVETRAIN_PIPELINE_DIR").map(PathBuf::from),
            stage: var("DRIVETRAIN_STAGE").unwrap_or_default(),
            attempt: var("DRIVETRAIN_ATTEMPT")
                .and_then(|a| a.parse().ok())
                .unwrap_or(1),
            store: var("DRIVETRAIN_STORE").unwrap_or_default(),
            rank: var("RANK").and_then(|r| r.parse().ok()).unwrap_or(0),
            world: var("WORLD_SIZE").and_then(|r| r.parse().ok()).unwrap_or(1),
            master: match (var("MASTER_ADDR"), var("MASTER_PORT")) {
                (Some(a), Some(p)) => Some(format!("{a}:{p}")),
                _ => None,
            },
        })
    }

    /// An input's directory, or a clear error naming it.
    pub fn input(&self, name: &str) -> Result<&PathBuf, ContextError> {
        self.inputs
            .get(name)
            .ok_or_else(|| ContextError::Input(name.to_owned()))
    }

    /// An output's directory, or a clear error naming it.
    pub fn output(&self, name: &str) -> Result<&PathBuf, ContextError> {
        self.outputs
            .get(name)
            .ok_or_else(|| ContextError::Output(name.to_owned()))
    }

    /// Writes `values.json` (rank 0 only, when distributed).
    pub fn write_values(&self, values: &Value) -> std::io::Result<()> {
        if self.rank != 0 {
            return Ok(());
        }
        std::fs::write(
            &self.values,
            serde_json::to_vec_pretty(values).unwrap_or_default(),
        )
    }
}

/// Checks `with` against the serde type `C`: the usual body of [`Step::check_config`].
/// An absent block is checked as an empty mapping, so required fields are reported.
pub fn check_typed_config<C: DeserializeOwned>(
    with: Option<&Node<'_>>,
    path: &YamlPath,
) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    match with {
        Some(node) => {
            from_node::<C>(node, path, &mut diags);
        }
        None => {
            let empty = Node {
                value: crate::yaml::Value::Map(Vec::new()),
                span: Default::default(),
            };
            if from_node::<C>(&empty, path, &mut diags).is_none() {
                for d in &mut diags {
                    d.span = None;
                    d.message = format!("{} (the stage has no `with:` block)", d.message);
                }
            }
        }
    }
    diags
}

/// Everything a pipeline can name: built-in steps and executors.
pub struct Catalog {
    steps: Vec<Box<dyn Step>>,
    executors: Vec<&'static str>,
    /// The home git plugins are cached in (see [`crate::plugin`]).
    home: Option<PathBuf>,
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field("steps", &self.step_names())
            .field("executors", &self.executors)
            .finish()
    }
}

impl Catalog {
    pub fn new(steps: Vec<Box<dyn Step>>, executors: Vec<&'static str>) -> Self {
        Catalog {
            steps,
            executors,
            home: None,
        }
    }

    /// The catalog of a home, whose cache holds the git plugins pipelines use.
    pub fn with_home(mut self, home: &std::path::Path) -> Self {
        self.home = Some(home.to_path_buf());
        self
    }

    pub fn home(&self) -> Option<&std::path::Path> {
        self.home.as_deref()
    }

    pub fn step(&self, name: &str) -> Option<&dyn Step> {
        self.steps.iter().find(|s| s.name() == name).map(|b| &**b)
    }

    pub fn steps(&self) -> impl Iterator<Item = &dyn Step> {
        self.steps.iter().map(|b| &**b)
    }

    pub fn step_names(&self) -> Vec<&'static str> {
        self.steps.iter().map(|s| s.name()).collect()
    }

    pub fn executors(&self) -> &[&'static str] {
        &self.executors
    }
}
