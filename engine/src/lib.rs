//! drivetrain's engine: the pipeline spec and everything between a YAML file and a run.
//!
//! Data flows one way: YAML text → [`yaml`] (a located tree) → [`spec`] (serde types,
//! through [`de`]) → [`validate`] (every problem, located) → [`plan::Pipeline`] (a petgraph
//! DAG with templates and conditions parsed) → [`engine::Engine`], which owns every run's
//! life: a [`engine::RunRequest`] from any face (a new run, a rerun or retry, a resume, a
//! cron tick, a trigger, an approval decided) is carried out by the run loop
//! ([`runner`]) on an executor, its transitions recorded in [`state`] and its outputs
//! in [`artifacts`]; the run's deadline, the end of a run whose engine failed or died,
//! and resuming it are the engine's too ([`engine::recover`]). The engine names no
//! concrete step or executor: both are traits ([`step::Step`],
//! [`executor::Executor`]) registered by the binary (local, Kubernetes and Slurm
//! executors; the built-in steps) in a [`step::Catalog`]; the server
//! (`drivetrain-server`) and the command line submit requests to the same engine in
//! their own process.

pub mod access;
pub mod artifacts;
pub mod cache;
pub mod cloud;
pub mod cron_fields;
pub mod de;
pub mod diag;
pub mod engine;
pub mod events;
pub mod executor;
pub mod expr;
pub mod fault;
pub mod history;
pub mod mask;
pub mod names;
pub mod phase;
pub mod plan;
pub mod plugin;
pub mod runner;
pub mod schedule;
pub mod search;
pub mod spec;
pub mod state;
pub mod step;
pub mod template;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod units;
pub mod validate;
pub mod yaml;

pub use diag::{Diagnostic, Severity, Span};
pub use names::StageName;
pub use plan::{Pipeline, Stage, StageId};
pub use step::{Catalog, Step};
pub use validate::{validate, validate_file, validate_in, Validated};
