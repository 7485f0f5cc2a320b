//! An executor that runs no process: what an attempt does is said by its command, so the
//! run loop's skip, omit, fail-fast, hooks, retries, timeouts, resume and maps are tested
//! in-process, in paused time.
//!
//! The command's first word is what the attempt does, the rest its arguments:
//! - `ok`: succeeds;
//! - `fail CODE`: fails with exit code CODE;
//! - `flaky N`: fails with exit code 1 until attempt N, which succeeds;
//! - `oom`: is killed for its memory limit;
//! - `sleep SECONDS`: succeeds after that long (of tokio's clock, so paused time skips
//!   it), unless cancelled first.
//!
//! Any other command fails to start. Each attempt writes its command to its log.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::executor::{AttemptOutcome, AttemptSpec, Executor, ExecutorError, RunningAttempt};

/// Runs attempts as their commands say (see the module), recording which it started.
#[derive(Debug, Default, Clone)]
pub struct FakeExecutor {
    started: Arc<Mutex<Vec<(String, u32)>>>,
}

impl FakeExecutor {
    /// The attempts started so far, in order: (stage, attempt number).
    pub fn started(&self) -> Vec<(String, u32)> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

enum Act {
    Exit(AttemptOutcome),
    Sleep(Duration),
}

/// A started attempt: what it does, until it is cancelled.
struct Attempt {
    act: Option<Act>,
}

#[async_trait]
impl Executor for FakeExecutor {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        let word = |i: usize| spec.argv.get(i).map(String::as_str).unwrap_or("");
        let number = |i: usize| word(i).parse::<i64>().unwrap_or(1);
        let failed = |code: i64| {
            Act::Exit(AttemptOutcome::Failed {
                exit_code: Some(code as i32),
                reason: format!("exited with code {code}"),
            })
        };
        let act = match word(0) {
            "ok" => Act::Exit(AttemptOutcome::Succeeded),
            "fail" => failed(number(1)),
            "flaky" if i64::from(spec.attempt) < number(1) => failed(1),
            "flaky" => Act::Exit(AttemptOutcome::Succeeded),
            "oom" => Act::Exit(AttemptOutcome::OutOfMemory {
                reason: "out of memory (limit 64Mi)".into(),
            }),
            "sleep" => Act::Sleep(Duration::from_secs_f64(
                word(1).parse::<f64>().unwrap_or(1.0),
            )),
            other => return Err(ExecutorError(format!("fake: no such act `{other}`"))),
        };
        if let Some(dir) = spec.log.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(&spec.log, format!("{}\n", spec.argv.join(" ")))
            .map_err(|e| ExecutorError(format!("fake: cannot write the log: {e}")))?;
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((spec.stage.clone(), spec.attempt));
        Ok(Box::new(Attempt { act: Some(act) }))
    }

    async fn reap(&self, _handle: &str) -> bool {
        false
    }
}

#[async_trait]
impl RunningAttempt for Attempt {
    fn handle(&self) -> String {
        "fake".into()
    }

    async fn wait(&mut self) -> AttemptOutcome {
        match &self.act {
            Some(Act::Exit(outcome)) => outcome.clone(),
            Some(Act::Sleep(d)) => {
                tokio::time::sleep(*d).await;
                AttemptOutcome::Succeeded
            }
            None => AttemptOutcome::Cancelled,
        }
    }

    async fn cancel(&mut self) {
        self.act = None;
    }
}
