//! The adapter every built-in step goes through: static metadata, a `with:` type `C`
//! (checked with locations, published as JSON Schema) and what the step does, as a
//! [`Step`] the engine's catalog holds.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use drivetrain_engine::step::{check_typed_config, Step, StepContext, StepResult};
use drivetrain_engine::yaml::{Node, YamlPath};
use drivetrain_engine::Diagnostic;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

type RunFn<C> = for<'a> fn(
    C,
    &'a StepContext,
) -> Pin<Box<dyn Future<Output = anyhow::Result<Value>> + Send + 'a>>;
type CheckFn<C> = fn(&C) -> Vec<(String, String)>;
/// What a step reads from outside its inputs (see [`Step::reads`]).
type ReadsFn = fn(&Value, &[&str]) -> Vec<String>;

/// A step described by static metadata, a config type `C` and what it does.
pub(crate) struct Builtin<C> {
    name: &'static str,
    version: &'static str,
    summary: &'static str,
    inputs: &'static [(&'static str, bool)],
    outputs: &'static [&'static str],
    run: RunFn<C>,
    check: Option<CheckFn<C>>,
    registry: bool,
    reads: Option<ReadsFn>,
    values: &'static [&'static str],
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

    fn values(&self) -> &'static [&'static str] {
        self.values
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

pub(crate) fn builtin<C: DeserializeOwned + JsonSchema + Send + 'static>(
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
        values: &[],
        config: PhantomData,
    }
}

impl<C: DeserializeOwned + JsonSchema + Send + 'static> Builtin<C> {
    pub(crate) fn checked(mut self, check: CheckFn<C>) -> Self {
        self.check = Some(check);
        self
    }
    pub(crate) fn writing_registry(mut self) -> Self {
        self.registry = true;
        self
    }
    pub(crate) fn reading(mut self, reads: ReadsFn) -> Self {
        self.reads = Some(reads);
        self
    }
    /// The keys of the values it reports.
    pub(crate) fn reporting(mut self, values: &'static [&'static str]) -> Self {
        self.values = values;
        self
    }
    pub(crate) fn boxed(self) -> Box<dyn Step> {
        Box::new(self)
    }
}
