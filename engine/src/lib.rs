//! drivetrain's engine: the pipeline spec and everything between a YAML file and a run.
//!
//! Data flows one way: YAML text → [`yaml`] (a located tree) → [`spec`] (serde types,
//! through [`de`]) → [`validate`] (every problem, located) → [`plan::Pipeline`] (a petgraph
//! DAG with templates and conditions parsed). The engine names no concrete step or
//! executor: both are traits ([`step::Step`]) registered by the binary in a
//! [`step::Catalog`].

pub mod access;
pub mod artifacts;
pub mod cache;
pub mod cloud;
pub mod de;
pub mod diag;
pub mod engine;
pub mod events;
pub mod executor;
pub mod expr;
pub mod fault;
pub mod history;
pub mod mask;
pub mod plan;
pub mod runner;
pub mod schedule;
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
pub use plan::{Pipeline, Stage, StageId};
pub use step::{Catalog, Step};
pub use validate::{validate, Validated};
