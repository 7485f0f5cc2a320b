//! The `Step` trait and the catalog of what a pipeline may name.
//!
//! A built-in step (`uses: ingest`) is described by its name, version, the outputs it
//! writes, the inputs it reads and a config type; validation checks a stage's `with:`
//! block against that type with located errors. Executors are named here too, so
//! `validate` can reject `executor: kubernets`. The engine never names a concrete step or
//! executor: the binary builds one [`Catalog`] from the `steps` and `plugins` crates.

use std::fmt;

use serde::de::DeserializeOwned;

use crate::de::from_node;
use crate::diag::Diagnostic;
use crate::yaml::{Node, YamlPath};

/// A built-in step, as validation and planning see it.
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
        Catalog { steps, executors }
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
