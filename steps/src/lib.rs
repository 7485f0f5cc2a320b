//! Built-in steps of the driving-data loop: their names, versions, inputs, outputs,
//! configuration types, and what they do.
//!
//! Each step's `with:` block is a serde type here, checked at `drivetrain validate` time
//! through the engine's located deserializer (and more deeply by `check_semantics`: SQL
//! rules against the frame schema, gate conditions against the metrics), and published as
//! JSON Schema. [`all`] is the one explicit list the binary registers. A step runs as
//! `drivetrain step NAME` with the attempt's environment: a child of the engine locally,
//! the container's command on a cluster.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use drivetrain_engine::step::{check_typed_config, Step, StepContext, StepResult};
use drivetrain_engine::yaml::{Node, YamlPath};
use drivetrain_engine::Diagnostic;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

pub mod gate;
pub mod ingest;
pub mod label;
pub mod logsource;
pub mod mcapio;
pub mod mine;
pub mod mlflow;
pub mod model;
pub mod registry;
pub mod rng;
pub mod sim;
pub mod steps;
pub mod table;
pub mod train;

type RunFn<C> = for<'a> fn(
    C,
    &'a StepContext,
) -> Pin<Box<dyn Future<Output = anyhow::Result<Value>> + Send + 'a>>;
type CheckFn<C> = fn(&C) -> Vec<(String, String)>;
/// What a step reads from outside its inputs (see [`Step::reads`]).
type ReadsFn = fn(&Value, &[&str]) -> Vec<String>;

/// A step described by static metadata, a config type `C` and what it does.
struct Builtin<C> {
    name: &'static str,
    version: &'static str,
    summary: &'static str,
    inputs: &'static [(&'static str, bool)],
    outputs: &'static [&'static str],
    run: RunFn<C>,
    check: Option<CheckFn<C>>,
    registry: bool,
    reads: Option<ReadsFn>,
    config: PhantomData<fn() -> C>,
}

#[async_trait::async_trait]
impl<C: DeserializeOwned + JsonSchema + Send + 'static> Step for Builtin<C> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn version(&self) -> &'static str {
        self.version
    }

    fn summary(&self) -> &'static str {
        self.summary
    }

    fn outputs(&self) -> &'static [&'static str] {
        self.outputs
    }

    fn inputs(&self) -> &'static [(&'static str, bool)] {
        self.inputs
    }

    fn check_config(&self, with: Option<&Node<'_>>, path: &YamlPath) -> Vec<Diagnostic> {
        check_typed_config::<C>(with, path)
    }

    fn config_schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(C)).unwrap_or_default()
    }

    fn check_semantics(&self, config: &Value) -> Vec<(String, String)> {
        match (self.check, serde_json::from_value::<C>(config.clone())) {
            (Some(check), Ok(c)) => check(&c),
            _ => Vec::new(),
        }
    }

    fn writes_registry(&self) -> bool {
        self.registry
    }

    fn reads(&self, config: &Value, inputs: &[&str]) -> Vec<String> {
        self.reads.map(|f| f(config, inputs)).unwrap_or_default()
    }

    async fn run(&self, cx: &StepContext) -> StepResult {
        let config: C = serde_json::from_value(cx.config.clone())
            .map_err(|e| format!("step `{}`: the config does not fit: {e}", self.name))?;
        let values = (self.run)(config, cx).await.map_err(|e| format!("{e:#}"))?;
        cx.write_values(&values)?;
        Ok(())
    }
}

fn builtin<C: DeserializeOwned + JsonSchema + Send + 'static>(
    name: &'static str,
    summary: &'static str,
    inputs: &'static [(&'static str, bool)],
    outputs: &'static [&'static str],
    run: RunFn<C>,
) -> Builtin<C> {
    Builtin::<C> {
        name,
        version: env!("CARGO_PKG_VERSION"),
        summary,
        inputs,
        outputs,
        run,
        check: None,
        registry: false,
        reads: None,
        config: PhantomData,
    }
}

impl<C: DeserializeOwned + JsonSchema + Send + 'static> Builtin<C> {
    fn checked(mut self, check: CheckFn<C>) -> Self {
        self.check = Some(check);
        self
    }
    fn writing_registry(mut self) -> Self {
        self.registry = true;
        self
    }
    fn reading(mut self, reads: ReadsFn) -> Self {
        self.reads = Some(reads);
        self
    }
    fn boxed(self) -> Box<dyn Step> {
        Box::new(self)
    }
}

/// Every built-in step, in the order of the driving loop.
pub fn all() -> Vec<Box<dyn Step>> {
    vec![
        builtin::<FleetSimConfig>(
            "fleet-sim",
            "write synthetic fleet drive logs (MCAP) with rare events injected",
            &[],
            &["logs"],
            |c, cx| Box::pin(steps::fleet_sim(c, cx)),
        )
        .boxed(),
        builtin::<IngestConfig>(
            "ingest",
            "drive logs (MCAP, JSON lines, TuSimple labels) to Parquet frame tables",
            &[("logs", false)],
            &["frames", "index", "lanes"],
            |c, cx| Box::pin(steps::ingest(c, cx)),
        )
        .boxed(),
        builtin::<MineConfig>(
            "mine-corner-cases",
            "named SQL rules over the frames to tagged corner-case frames",
            &[("frames", true)],
            &["corner_cases"],
            |c, cx| Box::pin(steps::mine(c, cx)),
        )
        .checked(|c| mine::check_rules(&c.rules))
        .boxed(),
        builtin::<LabelExportConfig>(
            "label-export",
            "budgeted, de-duplicated frames to Label Studio and COCO tasks",
            &[("corner_cases", true), ("frames", false)],
            &["tasks"],
            |c, cx| Box::pin(steps::label_export(c, cx)),
        )
        .boxed(),
        builtin::<LabelImportConfig>(
            "label-import",
            "completed labels to a split training dataset (Parquet)",
            &[("tasks", true), ("labels", false)],
            &["dataset"],
            |c, cx| Box::pin(steps::label_import(c, cx)),
        )
        .boxed(),
        builtin::<TrainConfig>(
            "train",
            "the reference risk model, trained data-parallel across ranks",
            &[("dataset", true)],
            &["model", "metrics"],
            |c, cx| Box::pin(steps::train(c, cx)),
        )
        .boxed(),
        builtin::<ValidateConfig>(
            "validate",
            "the candidate against production on every slice, against a gate",
            &[
                ("model", true),
                ("dataset", true),
                ("corner_cases", false),
                ("baseline", false),
            ],
            &["report"],
            |c, cx| Box::pin(steps::validate(c, cx)),
        )
        .checked(|c| match gate::parse(&c.gate) {
            Ok(_) => Vec::new(),
            Err(e) => vec![("gate".to_owned(), format!("gate: {e}"))],
        })
        .reading(validate_reads)
        .boxed(),
        builtin::<PromoteConfig>(
            "promote",
            "register the model version with its lineage and move an alias",
            &[("model", true), ("report", false)],
            &["registration"],
            |c, cx| Box::pin(steps::promote(c, cx)),
        )
        .writing_registry()
        .boxed(),
    ]
}

/// `validate` compares with the model an alias points at, unless a `baseline` input
/// gives it: that alias is part of its cache key.
fn validate_reads(config: &Value, inputs: &[&str]) -> Vec<String> {
    let model = config.get("model").and_then(Value::as_str);
    let Some(model) = model.filter(|_| !inputs.contains(&"baseline")) else {
        return Vec::new();
    };
    let alias = config
        .get("baseline")
        .and_then(Value::as_str)
        .unwrap_or("production");
    let registry = config.get("registry").and_then(Value::as_str);
    vec![registry::reference(model, alias, registry)]
}

/// `fleet-sim`: synthetic drives.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetSimConfig {
    /// Number of drives. Default 4.
    #[serde(default)]
    pub drives: Option<u32>,
    /// Length of each drive, as a duration (`10m`). Default `2m`.
    #[serde(default)]
    pub duration: Option<String>,
    /// Signal rate in Hz (10 to 20). Default 10.
    #[serde(default)]
    pub rate_hz: Option<f64>,
    /// Seed; the same seed writes the same bytes.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Rare events per minute of driving, by kind.
    #[serde(default)]
    pub events: Option<EventRates>,
}

/// Injected event rates, per minute.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRates {
    #[serde(default)]
    pub hard_brake: Option<f64>,
    #[serde(default)]
    pub cut_in: Option<f64>,
    #[serde(default)]
    pub pedestrian_close_call: Option<f64>,
    #[serde(default)]
    pub low_lane_confidence: Option<f64>,
}

/// `ingest`: logs to frame tables.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// A store URL or directory of drive logs; default: the `logs` input.
    #[serde(default)]
    pub source: Option<String>,
    /// The log format. Default `auto` (by extension: `.mcap`, `.jsonl`,
    /// `label_data_*.json`).
    #[serde(default)]
    pub format: Option<LogFormat>,
    /// A log that cannot be read: `fail` the stage (default) or `skip` it, counted in
    /// `values.json`.
    #[serde(default)]
    pub on_error: Option<OnError>,
    /// The most logs that may end unfinished (cut short, or never closed by their
    /// writer) before the stage fails; they are read up to where they end and listed
    /// under `unfinished` either way. Default: no bound.
    #[serde(default)]
    pub max_unfinished: Option<u64>,
}

/// What `ingest` does with a log it cannot read.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    Fail,
    Skip,
}

/// Drive log formats `ingest` reads.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Auto,
    Mcap,
    Jsonl,
    Tusimple,
}

/// `mine-corner-cases`: named SQL rules.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MineConfig {
    /// Rule name → SQL boolean expression over the frame columns (window functions allowed).
    pub rules: IndexMap<String, String>,
}

/// `label-export`: selection for labeling.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelExportConfig {
    /// The most frames to send to labeling.
    pub budget: u32,
    /// Diversity: at most this many frames per drive per rule.
    #[serde(default)]
    pub max_per_drive_per_rule: Option<u32>,
    /// Frames of one drive closer than this (a duration) count as duplicates.
    #[serde(default)]
    pub dedup_window: Option<String>,
    /// Export formats. Default both.
    #[serde(default)]
    pub formats: Vec<LabelFormat>,
    /// The share of the budget drawn from all frames (negatives for training) when the
    /// `frames` input is connected. Default 0.25.
    #[serde(default)]
    pub background: Option<f64>,
}

/// Labeling task formats.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LabelFormat {
    LabelStudio,
    Coco,
}

/// `label-import`: labels back into a dataset.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelImportConfig {
    /// A store URL of completed labels; default: the `labels` input, else the demo
    /// ground truth of `tasks`.
    #[serde(default)]
    pub source: Option<String>,
    /// Fractions for train / val / test. Default 0.8 / 0.1 / 0.1.
    #[serde(default)]
    pub split: Option<Split>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// The labeling control whose choices are the label (`from_name` in Label Studio's
    /// results). Default: the `choices` result that chose `risky` or `normal`.
    #[serde(default)]
    pub from_name: Option<String>,
    /// Which annotation of a task counts when it has several (cancelled ones never do):
    /// `newest` (default) or `majority` (ties go to the newest).
    #[serde(default)]
    pub policy: Option<LabelPolicy>,
    /// The fewest exported tasks that must come back labeled: a share of them below 1
    /// (`0.9`, the default) or a count from 1 up (`250`); fewer fails the stage.
    #[serde(default)]
    pub min_labeled: Option<f64>,
    /// The label control's choice values and what each means: `risky`, `normal`, or
    /// `skip` (no label). Default `{risky: risky, normal: normal}`. A value not named
    /// here fails the stage with the values and their counts.
    #[serde(default)]
    pub choices: Option<std::collections::BTreeMap<String, ChoiceClass>>,
    /// The most labeled items that may not be tasks of this export (another export's,
    /// or naming another frame) before the stage fails. Default 0.
    #[serde(default)]
    pub max_foreign: Option<u64>,
}

/// What a labeling choice means to `label-import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChoiceClass {
    Risky,
    Normal,
    Skip,
}

/// Which annotation of a task `label-import` takes.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LabelPolicy {
    Newest,
    Majority,
}

/// Dataset split fractions.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Split {
    pub train: f64,
    pub val: f64,
    #[serde(default)]
    pub test: Option<f64>,
}

/// `train`: the reference trainer.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    #[serde(default)]
    pub epochs: Option<u32>,
    /// Global batch size, split across ranks.
    #[serde(default)]
    pub batch_size: Option<u32>,
    #[serde(default)]
    pub learning_rate: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
}

/// `validate`: the promotion gate.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateConfig {
    /// A condition over the metrics of the candidate and of production, e.g.
    /// `candidate.recall.hard_brake >= production.recall.hard_brake and candidate.f1 >= production.f1 - 0.01`.
    pub gate: String,
    /// The registered model whose alias is production, e.g. `risk-model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The alias to compare with. Default `production`.
    #[serde(default)]
    pub baseline: Option<String>,
    /// Where the production model is registered (as `promote`'s `registry`).
    #[serde(default)]
    pub registry: Option<String>,
}

/// `promote`: registry update.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteConfig {
    /// The registered model's name.
    pub model: String,
    /// The alias to move: `candidate` or `production`.
    pub alias: String,
    /// The registry: an artifact store URL (its object-store registry) or
    /// `mlflow+http://host:port`; default `DRIVETRAIN_REGISTRY`, else the artifact store's.
    #[serde(default)]
    pub registry: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_outputs_declared() {
        let steps = all();
        let mut names: Vec<_> = steps.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), steps.len());
        assert!(steps.iter().all(|s| !s.outputs().is_empty()));
    }

    #[test]
    fn configs_are_checked_with_locations() {
        let node = drivetrain_engine::yaml::parse("budget: lots\nformats: [coco, yolo]\n").unwrap();
        let step = all()
            .into_iter()
            .find(|s| s.name() == "label-export")
            .unwrap();
        let diags = step.check_config(Some(&node), &YamlPath::root().key("with"));
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].path.as_deref(), Some("with.budget"));
        let schema = step.config_schema();
        assert!(schema["properties"]["budget"].is_object());
    }

    #[test]
    fn a_missing_with_block_reports_required_fields() {
        let step = all()
            .into_iter()
            .find(|s| s.name() == "mine-corner-cases")
            .unwrap();
        let diags = step.check_config(None, &YamlPath::root().key("with"));
        assert_eq!(diags[0].code, "missing-field");
        assert!(diags[0].message.contains("rules"));
    }
}
