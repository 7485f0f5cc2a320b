//! The executor plugin protocol, version 1: the engine runs the plugin's command once per
//! operation, one JSON object on its stdin, one on its stdout, exit 0 (anything else is
//! the plugin's failure, its stderr the reason). Every operation is idempotent, and
//! nothing lives between two calls but what the plugin keeps: a restarted engine goes
//! on with the handles it recorded (Flyte's connector shape: create → get → delete).
//!
//! | `op` | request | reply |
//! |---|---|---|
//! | `start` | `attempt`: `run`, `stage`, `attempt`, `item`, `argv`, `env` (pairs), `workdir`, `log`, `ranks` (each rank's own env pairs) | `handle`: the same for the same (`run`, `stage`, `attempt`, `item`), started once |
//! | `poll` | `handles` | `attempts`: by handle, `state` (`queued`, `running`, `succeeded`, `failed`, `cancelled`, `lost`, `unknown`), `exit_code`, `reason` |
//! | `logs` | `handle`, `offset` (bytes read so far) | `text` (what follows), `offset` |
//! | `cancel` | `handle` | `running`: whether anything was still running |
//! | `find` | `run`, `stage`, `attempt` | `handle` of that attempt (not a map item's) if it was started, else null: for an engine that died between `start` and recording the handle |

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The protocol's version, sent with every request.
pub const VERSION: u32 = 1;

/// Where an attempt stands, as a plugin says.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct State {
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl State {
    pub fn is_done(&self) -> bool {
        !matches!(self.state.as_str(), "queued" | "running")
    }
}

/// The most a reply may hold: a log chunk, or the states of a batch.
const MAX_REPLY: usize = 16 << 20;

/// The plugin's command (`argv`, run in `dir`).
#[derive(Debug, Clone)]
pub struct Command {
    pub argv: Vec<String>,
    pub dir: PathBuf,
}

impl Command {
    /// Runs one operation: `request` (with `op` and `protocol` set) in, the reply out.
    pub async fn call(&self, op: &str, mut request: Value) -> Result<Value, String> {
        request["op"] = json!(op);
        request["protocol"] = json!(VERSION);
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.call_blocking(&request))
            .await
            .map_err(|e| e.to_string())?
    }

    fn call_blocking(&self, request: &Value) -> Result<Value, String> {
        let (program, args) = self.argv.split_first().ok_or("the plugin has no command")?;
        let mut child = std::process::Command::new(program)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&body);
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let op = request["op"].as_str().unwrap_or_default();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "the executor plugin's `{op}` failed ({}): {}",
                out.status,
                err.trim()
            ));
        }
        if out.stdout.len() > MAX_REPLY {
            return Err(format!(
                "the executor plugin's `{op}` replied with more than 16 MiB"
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "the executor plugin's `{op}` replied with no JSON object ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
                    .chars()
                    .take(200)
                    .collect::<String>()
            )
        })
    }
}

/// The start request of an attempt.
pub fn start_request(
    spec: &drivetrain_engine::executor::AttemptSpec,
    env: &[(String, String)],
    ranks: &[Vec<(String, String)>],
) -> Value {
    json!({"attempt": {
        "run": spec.run_id,
        "stage": spec.stage,
        "attempt": spec.attempt,
        "item": spec.placement.item,
        "argv": spec.argv,
        "env": env,
        "workdir": spec.workdir,
        "log": spec.log,
        "ranks": ranks,
    }})
}
