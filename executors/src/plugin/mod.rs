//! Executor plugins: an executor outside the binary, declared in
//! `plugins/NAME/executor.yaml` with the command that serves it, spoken to through a small
//! protocol ([`protocol`]): start an attempt, poll a batch of handles, read logs, cancel.
//! Every operation is idempotent and keyed by the attempt, so an engine restarted after a
//! `kill -9` re-attaches to what the plugin still runs by the handles it recorded.
//!
//! ```yaml
//! kind: executor
//! name: queue
//! version: 1.0.0
//! summary: Attempts as jobs in a queue folder that workers take
//! command: [python3, executor.py]   # relative files are the plugin folder's
//! poll_interval: 200ms
//! ```
//!
//! A pipeline names it as any executor (`defaults.executor: queue`, `--executor queue`);
//! it is found in `plugins/` beside the pipeline and in `DRIVETRAIN_PLUGIN_PATH`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use drivetrain_engine::executor::{
    AttemptOutcome, AttemptSpec, Executor, ExecutorError, Rank, RunningAttempt,
};
use serde_json::json;
use tokio::sync::watch;

mod poller;
pub mod protocol;

use poller::Poller;
use protocol::{Command, State};

pub use drivetrain_engine::plugin::executor_file::{discover, ExecutorFile, Loaded, EXECUTOR_FILE};

/// The executor plugin named `name` in `folders` (see
/// [`drivetrain_engine::plugin::executor_file::find`]); a built-in executor's name is
/// never a plugin's.
pub fn find(name: &str, folders: &[PathBuf]) -> Option<Loaded> {
    if crate::EXECUTORS.contains(&name) {
        return None;
    }
    drivetrain_engine::plugin::executor_file::find(name, folders)
}

/// The executor plugin in `dir`, checked.
pub fn load(dir: &Path) -> Loaded {
    drivetrain_engine::plugin::executor_file::load(dir)
}

/// An executor served by a plugin.
#[derive(Debug)]
pub struct PluginExecutor {
    name: &'static str,
    command: Command,
    poller: Arc<Poller>,
    interval: Duration,
}

impl PluginExecutor {
    pub fn new(spec: &ExecutorFile, dir: &Path) -> PluginExecutor {
        // What a step's command does with its folder: a relative path naming a file
        // of it is that file.
        let mut argv = spec.command.clone();
        drivetrain_engine::runner::folder::resolve_args(&mut argv, dir);
        let command = Command {
            argv,
            dir: dir.to_path_buf(),
        };
        let interval = spec
            .poll_interval
            .as_deref()
            .and_then(|p| drivetrain_engine::units::parse_duration(p).ok())
            .unwrap_or(Duration::from_millis(500));
        PluginExecutor {
            // One per plugin an engine loads: a name for as long as the process runs.
            name: Box::leak(spec.name.clone().into_boxed_str()),
            poller: Poller::new(command.clone(), interval),
            command,
            interval,
        }
    }

    /// The environment of every rank: the attempt's, with what the engine's processes
    /// pass on (`PATH`, `HOME`, `LANG`, `TZ`) where it sets none.
    fn env(spec: &AttemptSpec) -> Vec<(String, String)> {
        let mut env = spec.env.clone();
        for k in ["PATH", "HOME", "LANG", "TZ"] {
            if let (false, Ok(v)) = (env.iter().any(|(n, _)| n == k), std::env::var(k)) {
                env.push((k.to_owned(), v));
            }
        }
        env
    }

    /// Each rank's own environment: torchrun's contract (a world of one too).
    fn ranks(spec: &AttemptSpec) -> Result<Vec<Vec<(String, String)>>, ExecutorError> {
        let workers = spec.distributed.as_ref().map(|d| d.workers).unwrap_or(1);
        let framework = spec
            .distributed
            .as_ref()
            .map(|d| d.framework)
            .unwrap_or_default();
        let port = crate::local::free_port()
            .map_err(|e| ExecutorError(format!("no free port for MASTER_PORT: {e}")))?;
        Ok((0..workers)
            .map(|r| {
                let rank = Rank {
                    rank: r,
                    world: workers,
                    local_rank: r,
                    local_world: workers,
                    node: 0,
                    nodes: 1,
                };
                rank.env("127.0.0.1", port, framework)
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect()
            })
            .collect())
    }
}

#[async_trait]
impl Executor for PluginExecutor {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        if spec.argv.is_empty() {
            return Err(ExecutorError("empty argv".into()));
        }
        let request = protocol::start_request(&spec, &Self::env(&spec), &Self::ranks(&spec)?);
        let reply = self
            .command
            .call("start", request)
            .await
            .map_err(ExecutorError)?;
        let handle = reply["handle"]
            .as_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| {
                ExecutorError(format!(
                    "the executor plugin's `start` named no handle: {reply}"
                ))
            })?
            .to_owned();
        // A re-attached attempt's log holds what was copied before the engine died.
        let offset = std::fs::metadata(&spec.log).map(|m| m.len()).unwrap_or(0);
        Ok(Box::new(PluginAttempt {
            state: self.poller.watch(&handle),
            handle,
            command: self.command.clone(),
            log: spec.log,
            offset,
            cancelled: false,
            interval: self.interval,
        }))
    }

    async fn reap(&self, handle: &str) -> bool {
        let reply = self.command.call("cancel", json!({"handle": handle})).await;
        reply.is_ok_and(|r| r["running"] == json!(true))
    }

    /// The handle of an attempt the plugin started for an engine that died before it
    /// recorded the handle (`find`; a plugin may answer none).
    async fn find(&self, run: &str, stage: &str, attempt: u32) -> Option<String> {
        let request = json!({"run": run, "stage": stage, "attempt": attempt});
        let reply = self.command.call("find", request).await.ok()?;
        reply["handle"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
    }

    async fn reattach(&self, handle: &str) -> bool {
        let reply = self
            .command
            .call("poll", json!({"handles": [handle]}))
            .await;
        let state = reply
            .ok()
            .and_then(|r| serde_json::from_value::<State>(r["attempts"][handle].clone()).ok());
        state.is_some_and(|s| s.state != "unknown" && s.state != "lost")
    }
}

/// An attempt a plugin runs.
struct PluginAttempt {
    handle: String,
    command: Command,
    state: watch::Receiver<poller::Heard>,
    log: PathBuf,
    /// Bytes of the plugin's log copied into the attempt's so far.
    offset: u64,
    cancelled: bool,
    interval: Duration,
}

/// How many polls in a row may fail before the attempt counts as lost.
const POLL_FAILURES: u32 = 60;

impl PluginAttempt {
    /// Copies what the plugin's log holds past `offset` into the attempt's log.
    async fn copy_logs(&mut self) {
        for _ in 0..64 {
            let reply = self
                .command
                .call(
                    "logs",
                    json!({"handle": self.handle, "offset": self.offset}),
                )
                .await;
            let Ok(r) = reply else { return };
            let text = r["text"].as_str().unwrap_or_default();
            crate::append_log(&self.log, text);
            match r["offset"].as_u64() {
                Some(o) if o > self.offset && !text.is_empty() => self.offset = o,
                _ => return,
            }
        }
    }

    fn outcome(&self, s: &State) -> AttemptOutcome {
        let reason = s.reason.clone().unwrap_or_default();
        match s.state.as_str() {
            "succeeded" => AttemptOutcome::Succeeded,
            "cancelled" => AttemptOutcome::Cancelled,
            "failed" => AttemptOutcome::Failed {
                exit_code: s.exit_code,
                reason: match reason.is_empty() {
                    true => format!("exited with code {}", s.exit_code.unwrap_or(-1)),
                    false => reason,
                },
            },
            "unknown" if self.cancelled => AttemptOutcome::Cancelled,
            other => AttemptOutcome::Lost {
                reason: match reason.is_empty() {
                    true => format!("the executor plugin says the attempt is {other}"),
                    false => reason,
                },
            },
        }
    }
}

#[async_trait]
impl RunningAttempt for PluginAttempt {
    fn handle(&self) -> String {
        self.handle.clone()
    }

    async fn wait(&mut self) -> AttemptOutcome {
        let mut failures = 0;
        loop {
            if self.state.changed().await.is_err() {
                return AttemptOutcome::Lost {
                    reason: "the executor plugin's poller stopped".into(),
                };
            }
            let state = self.state.borrow_and_update().clone();
            self.copy_logs().await;
            // Copied after the state was read: an ended attempt's log is whole.
            match state {
                Some(Ok(s)) if s.is_done() => return self.outcome(&s),
                Some(Ok(_)) | None => failures = 0,
                Some(Err(e)) => {
                    failures += 1;
                    if failures >= POLL_FAILURES {
                        return AttemptOutcome::Lost {
                            reason: format!(
                                "{POLL_FAILURES} polls of the executor plugin failed: {e}"
                            ),
                        };
                    }
                    tokio::time::sleep(self.interval).await;
                }
            }
        }
    }

    async fn cancel(&mut self) {
        self.cancelled = true;
        let _ = self
            .command
            .call("cancel", json!({"handle": self.handle}))
            .await;
    }
}
