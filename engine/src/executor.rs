//! The `Executor` trait: how a stage attempt runs, wherever it runs.
//!
//! The run loop hands an executor a fully resolved [`AttemptSpec`] (argv and environment
//! already rendered, input and output directories prepared) and gets back a
//! [`RunningAttempt`] to wait for or cancel. Timeouts are the run loop's: it cancels an
//! attempt that outlives its deadline. Executors write the attempt's combined stdout and
//! stderr to `spec.log`, which the run loop publishes and `drivetrain logs` reads.

use std::path::PathBuf;

use async_trait::async_trait;

use crate::plan::Distributed;

/// Everything an executor needs to run one attempt.
#[derive(Debug, Clone)]
pub struct AttemptSpec {
    pub run_id: String,
    pub stage: String,
    pub attempt: u32,
    /// argv; each element one argument, never parsed by a shell.
    pub argv: Vec<String>,
    /// The environment, in order; the process gets nothing else from the engine's own
    /// environment but `PATH`, `HOME`, `LANG` and `TZ`.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub workdir: PathBuf,
    /// Where stdout and stderr go.
    pub log: PathBuf,
    /// Ranks to start together, if distributed.
    pub distributed: Option<Distributed>,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Exit code 0 (every rank, if distributed).
    Succeeded,
    /// The stage's own failure: a non-zero exit, a signal, or a command that does not
    /// exist.
    Failed {
        exit_code: Option<i32>,
        reason: String,
    },
    /// Stopped by `cancel` (a timeout or a user's cancel).
    Cancelled,
}

/// The executor could not run the attempt at all: the infrastructure's fault.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExecutorError(pub String);

/// A started attempt.
#[async_trait]
pub trait RunningAttempt: Send {
    /// What identifies the attempt to its executor (a process group id locally, a Job
    /// name on Kubernetes); recorded so a restarted engine can find it.
    fn handle(&self) -> String;
    /// Waits for the attempt to end. Cancel-safe: dropping the future leaves it running.
    async fn wait(&mut self) -> AttemptOutcome;
    /// Stops the attempt and everything it started; `wait` then returns `Cancelled`.
    async fn cancel(&mut self);
}

/// Runs stage attempts.
#[async_trait]
pub trait Executor: Send + Sync {
    /// The name pipelines use (`local`, `kubernetes`).
    fn name(&self) -> &'static str;
    /// Starts an attempt. A command that cannot be started because it does not exist is
    /// not an error here: it is a started attempt that `wait`s to `Failed`.
    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError>;
    /// Stops an attempt an engine that is gone left behind, found by the handle it
    /// recorded. Returns whether anything was still running.
    async fn reap(&self, handle: &str) -> bool;
}
