//! `--server URL`: `run`, `status`, `logs` and `cancel` against a `drivetrain serve` over
//! its HTTP API instead of this machine's engine. The token is `DRIVETRAIN_TOKEN`.

use crate::output::Format;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{json, Value};

/// A server's API.
pub struct Remote {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Remote {
    pub fn new(url: &str) -> Remote {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        Remote {
            base: url.trim_end_matches('/').to_owned(),
            token: std::env::var("DRIVETRAIN_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
            agent,
        }
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    fn answer(
        &self,
        what: &str,
        resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Value> {
        let mut resp = resp.with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !(200..300).contains(&status) {
            let why = body["error"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| body.to_string());
            anyhow::bail!("{what}: the server answered {status}: {why}");
        }
        Ok(body)
    }

    pub(crate) fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        self.answer(
            &format!("GET {path}"),
            self.auth(self.agent.get(&url)).call(),
        )
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = self
            .auth(self.agent.post(&url))
            .header("Content-Type", "application/json");
        self.answer(&format!("POST {path}"), req.send(body.to_string()))
    }

    /// POSTs a request that starts something under an `Idempotency-Key` of its own, and
    /// sends it again with the same key while the answer is lost (no connection, a
    /// connection closed before the answer) or the server says to come back (`503`,
    /// `409` for the key in progress): at most [`ATTEMPTS`] times, so it starts once.
    pub(crate) fn post_once(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let key = format!(
            "cli-{}",
            drivetrain_engine::state::RunId::generate(chrono::Utc::now())
        );
        let url = format!("{}{path}", self.base);
        let what = format!("POST {path}");
        for attempt in 1..=ATTEMPTS {
            let sent = self
                .auth(self.agent.post(&url))
                .header("Content-Type", "application/json")
                .header("Idempotency-Key", &key)
                .send(body.to_string());
            let wait = match &sent {
                Err(_) => Some(Duration::from_secs(1)),
                // 409 with `Retry-After`: the key's first copy is still being carried out.
                Ok(r)
                    if r.status() == 503
                        || (r.status() == 409 && r.headers().contains_key("retry-after")) =>
                {
                    Some(
                        r.headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .map_or(Duration::from_secs(1), Duration::from_secs),
                    )
                }
                Ok(_) => None,
            };
            match wait {
                Some(wait) if attempt < ATTEMPTS => {
                    std::thread::sleep(wait.min(Duration::from_secs(10)))
                }
                _ => return self.answer(&what, sent),
            }
        }
        unreachable!("the last attempt answers")
    }
}

/// How many times [`Remote::post_once`] sends its request.
const ATTEMPTS: u32 = 6;

/// Submits the pipeline file and, unless detached, follows the run to its end. Exit codes
/// as `run`: 0 succeeded, 1 failed, 130 cancelled.
pub fn run(
    server: &str,
    file: &Path,
    params: &[(String, String)],
    detach: bool,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let r = Remote::new(server);
    let yaml =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let params: serde_json::Map<String, Value> = params
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let v = r.post_once("/api/v1/runs", &json!({"yaml": yaml, "params": params}))?;
    let id = v["run"]
        .as_str()
        .context("the server named no run")?
        .to_owned();
    if !out.json() {
        say!("run {id}");
        say!("submitted to {server}");
    }
    if detach {
        if out.json() {
            say!("{}", json!({"run": id}));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let v = r.get(&format!("/api/v1/runs/{id}"))?;
        for s in v["stages"].as_array().into_iter().flatten() {
            let (name, phase) = (
                s["stage"].as_str().unwrap_or(""),
                s["phase"].as_str().unwrap_or(""),
            );
            if seen.get(name).map(String::as_str) != Some(phase) && !out.json() {
                match phase {
                    "Running" => say!("  ▶ {name}"),
                    "Pending" => {}
                    other => {
                        let reason = s["reason"]
                            .as_str()
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default();
                        say!(
                            "  {} {name} {other}{reason}",
                            if other == "Succeeded" { "✓" } else { "○" }
                        );
                    }
                }
            }
            seen.insert(name.to_owned(), phase.to_owned());
        }
        let phase = v["run"]["phase"].as_str().unwrap_or("");
        if matches!(phase, "Succeeded" | "Failed" | "Cancelled" | "Error") {
            out.print(&v, |_| {
                say!("run {id} {phase}");
            })?;
            return Ok(ExitCode::from(match phase {
                "Succeeded" => 0,
                "Cancelled" => 130,
                _ => 1,
            }));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A run with its stages, or the recent runs.
pub fn status(server: &str, run: Option<&str>, out: Format) -> anyhow::Result<ExitCode> {
    let r = Remote::new(server);
    let v = match run {
        Some(id) => r.get(&format!("/api/v1/runs/{id}"))?,
        None => r.get("/api/v1/runs?limit=20")?,
    };
    if out.json() {
        crate::output::print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    match run {
        Some(_) => {
            let run = &v["run"];
            say!(
                "run {} {} ({}, pipeline {})",
                run["id"].as_str().unwrap_or(""),
                run["phase"].as_str().unwrap_or(""),
                run["trigger"].as_str().unwrap_or(""),
                run["pipeline"].as_str().unwrap_or("")
            );
            for s in v["stages"].as_array().into_iter().flatten() {
                say!(
                    "  {:<24} {:<10} attempts {}{}",
                    s["stage"].as_str().unwrap_or(""),
                    s["phase"].as_str().unwrap_or(""),
                    s["attempts"],
                    s["reason"]
                        .as_str()
                        .map(|r| format!("  {r}"))
                        .unwrap_or_default()
                );
            }
        }
        None => {
            for run in v["runs"].as_array().into_iter().flatten() {
                say!(
                    "{}  {:<10} {:<9} {}",
                    run["id"].as_str().unwrap_or(""),
                    run["phase"].as_str().unwrap_or(""),
                    run["trigger"].as_str().unwrap_or(""),
                    run["pipeline"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A stage's log, streamed as it grows with `follow`.
pub fn logs(server: &str, run: &str, stage: &str, follow: bool) -> anyhow::Result<ExitCode> {
    let r = Remote::new(server);
    let url = format!(
        "{}/api/v1/runs/{run}/logs?stage={stage}{}",
        r.base,
        if follow { "&follow=true" } else { "" }
    );
    let mut resp = r
        .auth(r.agent.get(&url))
        .config()
        .timeout_global(None)
        .build()
        .call()
        .with_context(|| format!("cannot reach {}", r.base))?;
    if resp.status().as_u16() != 200 {
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        anyhow::bail!("the server answered {}: {text}", resp.status());
    }
    let mut out = std::io::stdout().lock();
    let mut reader = resp.body_mut().as_reader();
    std::io::copy(&mut reader, &mut out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn cancel(server: &str, run: &str) -> anyhow::Result<ExitCode> {
    Remote::new(server).post(&format!("/api/v1/runs/{run}/cancel"), &json!({}))?;
    say!("run {run} cancelling");
    Ok(ExitCode::SUCCESS)
}
