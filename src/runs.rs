//! `run`, `status`, `logs` and `list`: running pipelines on this machine and reading what
//! runs recorded.
//!
//! Everything lives under the engine's home, `.drivetrain/` (found in the current
//! directory or a parent, like `.git/`; `--home` or `DRIVETRAIN_HOME` override it):
//! `state.db` (SQLite), `artifacts/` (the default `file://` store) and `work/` (attempt
//! directories).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use drivetrain_engine::artifacts::{ArtifactStore, AttemptKey};
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::runner::{self, RunEvent, RunOptions};
use drivetrain_engine::state::{Phase, RunId, SqliteState, StateStore};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Exit code of a cancelled run (128 + SIGINT, as shells report Ctrl-C).
pub const EXIT_CANCELLED: u8 = 130;

/// The engine's home directory.
pub fn home(explicit: Option<&Path>) -> PathBuf {
    if let Some(h) = explicit {
        return h.to_path_buf();
    }
    if let Some(h) = std::env::var_os("DRIVETRAIN_HOME") {
        return PathBuf::from(h);
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    for dir in cwd.ancestors() {
        let candidate = dir.join(".drivetrain");
        if candidate.is_dir() {
            return candidate;
        }
    }
    cwd.join(".drivetrain")
}

fn open_state(home: &Path) -> anyhow::Result<SqliteState> {
    std::fs::create_dir_all(home)?;
    Ok(SqliteState::open(&home.join("state.db"))?)
}

fn store_url(pipeline_store: Option<&str>, home: &Path) -> anyhow::Result<String> {
    if let Some(s) = std::env::var("DRIVETRAIN_STORE")
        .ok()
        .or(pipeline_store.map(str::to_owned))
    {
        return Ok(s);
    }
    let dir = home.join("artifacts");
    std::fs::create_dir_all(&dir)?;
    let abs = std::fs::canonicalize(&dir)?;
    Ok(format!("file://{}", abs.display()))
}

/// Options of `drivetrain run`.
pub struct RunArgs<'a> {
    pub file: &'a Path,
    pub source: &'a str,
    pub pipeline: Pipeline,
    pub params: BTreeMap<String, Value>,
    pub parallelism: Option<usize>,
    pub fail_fast: bool,
    pub executor: Option<&'a str>,
    pub home: PathBuf,
    pub json: bool,
}

/// Runs a pipeline to its end, printing the run id first and then one line per transition.
pub fn run(args: RunArgs<'_>) -> anyhow::Result<ExitCode> {
    let executor_name = args.executor.unwrap_or(&args.pipeline.executor).to_owned();
    let executor = match drivetrain_plugins::executor(&executor_name) {
        Ok(e) => e,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(ExitCode::from(2));
        }
    };
    let state: Arc<dyn StateStore> = Arc::new(open_state(&args.home)?);
    let url = store_url(args.pipeline.store.as_deref(), &args.home)?;
    let artifacts = ArtifactStore::open(&url)?;
    let id = RunId::generate(chrono::Utc::now());
    let work_dir = std::fs::canonicalize(&args.home)?.join("work");
    let opts = RunOptions {
        parallelism: args.parallelism.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        }),
        fail_fast: args.fail_fast,
        work_dir,
        file: args.file.display().to_string(),
        spec_digest: format!(
            "sha256:{}",
            hex::encode(Sha256::digest(args.source.as_bytes()))
        ),
        trigger: "cli".into(),
    };
    if args.json {
        // Scripts get one JSON document at the end.
    } else {
        println!("run {id}");
        println!(
            "pipeline {} ({} stages), store {url}",
            args.pipeline.name,
            args.pipeline.stages.len()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let pipeline = Arc::new(args.pipeline);
    let json = args.json;
    let summary = rt.block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(runner::run(
            id.clone(),
            pipeline,
            args.params,
            state,
            artifacts,
            executor,
            opts,
            tx,
            cancel_rx,
        ));
        let printer = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                if !json {
                    print_event(&ev);
                }
            }
        });
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("cancelling run {id} (Ctrl-C)…");
            let _ = cancel_tx.send(true);
            std::future::pending::<()>().await
        };
        let summary = tokio::select! {
            s = run => s,
            _ = ctrl_c => unreachable!("ctrl_c never completes"),
        };
        let _ = printer.await;
        summary
    })??;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "run": summary.id,
                "phase": summary.phase,
                "stages": summary.stages,
            }))?
        );
    } else {
        println!("run {} {}", summary.id, summary.phase);
    }
    Ok(match summary.phase {
        Phase::Succeeded => ExitCode::SUCCESS,
        Phase::Cancelled => ExitCode::from(EXIT_CANCELLED),
        _ => ExitCode::from(1),
    })
}

fn print_event(ev: &RunEvent) {
    match ev {
        RunEvent::Started { stage, attempt } if *attempt > 1 => {
            println!("  ▶ {stage} (attempt {attempt})")
        }
        RunEvent::Started { stage, .. } => println!("  ▶ {stage}"),
        RunEvent::Retrying {
            stage,
            attempt,
            delay,
            reason,
        } => println!(
            "  ↻ {stage}: {reason}; attempt {attempt} in {}",
            humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
        ),
        RunEvent::Finished {
            stage,
            phase,
            reason,
            elapsed,
        } => {
            let glyph = match phase {
                Phase::Succeeded => "✓",
                Phase::Skipped | Phase::Omitted => "○",
                Phase::Cancelled => "■",
                _ => "✗",
            };
            let took = if elapsed.is_zero() {
                String::new()
            } else {
                format!(" ({:.1}s)", elapsed.as_secs_f64())
            };
            match reason {
                Some(r) => {
                    let mut lines = r.lines();
                    println!(
                        "  {glyph} {stage} {phase}{took}: {}",
                        lines.next().unwrap_or_default()
                    );
                    for l in lines {
                        println!("      {l}");
                    }
                }
                None => println!("  {glyph} {stage} {phase}{took}"),
            }
        }
    }
}

use std::time::Duration;

fn resolve_run(state: &SqliteState, run: Option<&str>) -> anyhow::Result<RunId> {
    match run {
        Some(r) => Ok(RunId(r.to_owned())),
        None => state
            .list_runs(1)?
            .into_iter()
            .next()
            .map(|r| r.id)
            .ok_or_else(|| anyhow::anyhow!("no runs yet")),
    }
}

/// `drivetrain status [RUN]`.
pub fn status(home: &Path, run: Option<&str>, json_out: bool) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(&state, run)?;
    let record = state.run(&id)?;
    let stages = state.stages(&id)?;
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"run": record, "stages": stages}))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "run {} of {} ({}): {}{}",
        record.id,
        record.pipeline,
        record.file,
        record.phase,
        record
            .reason
            .as_ref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    println!(
        "{:<24} {:<10} {:>8} {:>9} {:>5}  reason",
        "stage", "phase", "attempts", "duration", "exit"
    );
    for s in &stages {
        let duration = match (&s.started_at, &s.finished_at) {
            (Some(a), Some(b)) => elapsed(a, b),
            _ => String::new(),
        };
        println!(
            "{:<24} {:<10} {:>8} {:>9} {:>5}  {}",
            s.stage,
            s.phase.as_str(),
            s.attempts,
            duration,
            s.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            s.reason
                .as_deref()
                .and_then(|r| r.lines().next())
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn elapsed(a: &str, b: &str) -> String {
    match (
        chrono::DateTime::parse_from_rfc3339(a),
        chrono::DateTime::parse_from_rfc3339(b),
    ) {
        (Ok(a), Ok(b)) => format!("{:.1}s", (b - a).num_milliseconds() as f64 / 1000.0),
        _ => String::new(),
    }
}

/// `drivetrain list`.
pub fn list(home: &Path, json_out: bool) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let runs = state.list_runs(50)?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in runs {
        println!(
            "{}  {:<10} {:<24} {}",
            r.id,
            r.phase.as_str(),
            r.pipeline,
            r.created_at
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `drivetrain logs RUN [--stage S]`: each stage's latest attempt's log.
pub fn logs(home: &Path, run: Option<&str>, stage: Option<&str>) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(&state, run)?;
    let record = state.run(&id)?;
    let attempts = state.attempts(&id)?;
    if let Some(s) = stage {
        if !attempts.iter().any(|a| a.stage == s) {
            eprintln!("error: run {id} has no attempts of stage `{s}`");
            return Ok(ExitCode::from(2));
        }
    }
    // The pipeline's own store may differ from the default; the run recorded its file.
    let pipeline_store = std::fs::read_to_string(&record.file).ok().and_then(|src| {
        drivetrain_engine::yaml::parse(&src)
            .ok()
            .and_then(|n| n.get("store").and_then(|s| s.as_str().map(str::to_owned)))
    });
    let artifacts = ArtifactStore::open(&store_url(pipeline_store.as_deref(), home)?)?;
    let mut latest: BTreeMap<&str, u32> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for a in &attempts {
        if !latest.contains_key(a.stage.as_str()) {
            order.push(&a.stage);
        }
        let e = latest.entry(&a.stage).or_default();
        *e = (*e).max(a.attempt);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for s in order {
        if stage.is_some_and(|x| x != s) {
            continue;
        }
        let attempt = latest[s];
        let key = AttemptKey {
            run: id.0.clone(),
            stage: s.to_owned(),
            attempt,
        };
        let text = match rt.block_on(artifacts.log(&key))? {
            Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            None => {
                // Still running: read the attempt's local log.
                let local = home
                    .join("work")
                    .join(&id.0)
                    .join(s)
                    .join(attempt.to_string())
                    .join("log.txt");
                std::fs::read_to_string(local).unwrap_or_default()
            }
        };
        if stage.is_none() {
            println!("── {s} (attempt {attempt}) ──");
        }
        print!("{text}");
        if !text.is_empty() && !text.ends_with('\n') {
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}
