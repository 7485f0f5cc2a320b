//! `drivetrain serve`: runs the pipelines of a directory on their cron schedules, and
//! `drivetrain schedule …` to list, suspend, resume and trigger them.
//!
//! Every loop decides the due ticks of every schedule against the state store
//! ([`drivetrain_engine::schedule::due`]): a tick is claimed (with its run id) before its
//! run starts, so a server killed at any point and started again neither fires a tick
//! twice nor loses one (within the catch-up policy); a tick claimed but never started is
//! started by the next loop. Runs execute in this process, on the local executor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::runner::{self, RunOptions};
use drivetrain_engine::schedule::{self, Decision, Ticker};
use drivetrain_engine::state::{RunId, StateStore, TickRecord};
use drivetrain_engine::Catalog;
use serde_json::json;

use crate::runs::{open_state, store_url};

struct Scheduled {
    pipeline: Arc<Pipeline>,
    ticker: Ticker,
    file: PathBuf,
    digest: String,
}

fn now_text() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Every valid pipeline with a `schedule:` under `dir`, registered in the state store.
fn load(
    catalog: &Catalog,
    dir: &Path,
    state: &dyn StateStore,
) -> anyhow::Result<BTreeMap<String, Scheduled>> {
    let mut out = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    for file in files {
        let source = std::fs::read_to_string(&file)?;
        let validated = drivetrain_engine::validate(&source, catalog);
        let Some(pipeline) = validated.pipeline else {
            eprintln!(
                "skipping {}: it does not validate (see `drivetrain validate`)",
                file.display()
            );
            continue;
        };
        let Some(s) = &pipeline.schedule else {
            continue;
        };
        let ticker = Ticker::new(s).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let abs = std::fs::canonicalize(&file)?;
        state.upsert_schedule(&pipeline.name, &abs.display().to_string(), &now_text())?;
        out.insert(
            pipeline.name.clone(),
            Scheduled {
                digest: crate::runs::digest(&source),
                pipeline: Arc::new(pipeline),
                ticker,
                file: abs,
            },
        );
    }
    Ok(out)
}

/// `drivetrain serve --pipelines DIR`.
pub fn serve(
    catalog: &Catalog,
    home: &Path,
    dir: &Path,
    parallelism: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let state: Arc<dyn StateStore> = Arc::new(open_state(home)?);
    let scheduled = load(catalog, dir, state.as_ref())?;
    if scheduled.is_empty() {
        eprintln!(
            "error: no pipeline under {} has a `schedule:`",
            dir.display()
        );
        return Ok(ExitCode::from(2));
    }
    let url = store_url(None, home)?;
    let artifacts = ArtifactStore::open(&url)?;
    let executor = drivetrain_plugins::executor("local").map_err(|e| anyhow::anyhow!(e))?;
    let work_dir = std::fs::canonicalize(home)?.join("work");
    for (name, s) in &scheduled {
        let sched = s
            .pipeline
            .schedule
            .as_ref()
            .expect("loaded with a schedule");
        println!(
            "schedule {name}: `{}` {} ({})",
            sched.cron,
            sched.timezone,
            s.ticker
                .next_after(chrono::Utc::now())
                .map(|t| format!("next {t}"))
                .unwrap_or_else(|| "no next tick".into())
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut cancels: BTreeMap<RunId, tokio::sync::watch::Sender<bool>> = BTreeMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            let now = chrono::Utc::now();
            for (name, s) in &scheduled {
                let sched = s
                    .pipeline
                    .schedule
                    .as_ref()
                    .expect("loaded with a schedule");
                for d in schedule::due(state.as_ref(), name, sched, &s.ticker, now)? {
                    match d {
                        Decision::Skip { at, reason } => {
                            println!("tick {}: skipped ({reason})", schedule::tick_id(name, at))
                        }
                        Decision::Fire { at, run, replace } => {
                            for r in &replace {
                                if let Some(tx) = cancels.get(r) {
                                    println!(
                                        "tick {}: replacing run {r}",
                                        schedule::tick_id(name, at)
                                    );
                                    let _ = tx.send(true);
                                }
                            }
                            println!("tick {}: run {run}", schedule::tick_id(name, at));
                            let params = s
                                .pipeline
                                .resolve_params(&[])
                                .map_err(|e| anyhow::anyhow!(e.join("; ")))?;
                            let opts = RunOptions {
                                parallelism: parallelism.unwrap_or(2),
                                fail_fast: false,
                                work_dir: work_dir.clone(),
                                file: s.file.display().to_string(),
                                spec_digest: s.digest.clone(),
                                trigger: "schedule".into(),
                                gpus: 0,
                                parent: None,
                                selection: None,
                                reuse: BTreeMap::new(),
                                overrides: json!({}),
                                cache: runner::CacheMode::default(),
                                scheduled_time: Some(
                                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                                ),
                                step_command: crate::runs::step_command()?,
                            };
                            let (tx, rx) = tokio::sync::watch::channel(false);
                            cancels.insert(run.clone(), tx);
                            let (events, mut drain) = tokio::sync::mpsc::unbounded_channel();
                            tokio::spawn(async move { while drain.recv().await.is_some() {} });
                            let fut = runner::run(
                                run.clone(),
                                s.pipeline.clone(),
                                params,
                                state.clone(),
                                artifacts.clone(),
                                executor.clone(),
                                opts,
                                None,
                                events,
                                rx,
                            );
                            tasks.spawn(async move { (run, fut.await) });
                        }
                    }
                }
            }
            // Sleep until the next tick, but look again every second for suspends,
            // resumes and triggers made from the command line.
            let next = scheduled
                .values()
                .filter_map(|s| s.ticker.next_after(now))
                .min()
                .map(|t| (t - chrono::Utc::now()).to_std().unwrap_or_default())
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(next) => {}
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Ok((run, result)) = done {
                        cancels.remove(&run);
                        match result {
                            Ok(s) => println!("run {run} {}", s.phase),
                            Err(e) => eprintln!("run {run}: {e}"),
                        }
                    }
                }
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
            }
        }
        // Graceful: no new ticks; the runs in flight finish and are recorded.
        println!("stopping: waiting for {} run(s) in flight", tasks.len());
        while let Some(done) = tasks.join_next().await {
            if let Ok((run, Ok(s))) = done {
                println!("run {run} {}", s.phase);
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `drivetrain schedule list|suspend|resume|trigger`.
pub fn command(
    home: &Path,
    command: crate::ScheduleCommand,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    use crate::ScheduleCommand as C;
    let state = open_state(home)?;
    match command {
        C::List => {
            let mut rows = Vec::new();
            for s in state.schedules()? {
                let ticks = state.ticks(&s.pipeline, 50)?;
                rows.push(json!({
                    "pipeline": s.pipeline, "file": s.file, "suspended": s.suspended,
                    "anchor": s.anchor, "last_tick": ticks.first(), "recent_ticks": ticks,
                }));
            }
            if json_out {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if rows.is_empty() {
                println!("no schedules yet: `drivetrain serve --pipelines DIR` registers them");
            } else {
                for r in &rows {
                    println!(
                        "{}  {}  last tick {}",
                        r["pipeline"].as_str().unwrap_or_default(),
                        if r["suspended"] == true {
                            "suspended"
                        } else {
                            "active"
                        },
                        r["last_tick"]["scheduled_time"].as_str().unwrap_or("-")
                    );
                }
            }
        }
        C::Suspend { pipeline } => {
            state.set_suspended(&pipeline, true, None)?;
            println!("{pipeline}: suspended");
        }
        C::Resume { pipeline, catchup } => {
            let anchor = (!catchup).then(now_text);
            state.set_suspended(&pipeline, false, anchor.as_deref())?;
            println!(
                "{pipeline}: resumed{}",
                if catchup {
                    " (missed ticks follow the catch-up policy)"
                } else {
                    "; ticks missed while suspended do not fire"
                }
            );
        }
        C::Trigger { pipeline } => {
            if state.schedule(&pipeline)?.is_none() {
                eprintln!("error: no schedule `{pipeline}`");
                return Ok(ExitCode::from(2));
            }
            // A claimed tick whose run does not exist yet: the server starts it.
            let at = chrono::Utc::now();
            let run = schedule::tick_run_id(&pipeline, at);
            let tick = TickRecord {
                id: format!("{}+manual", schedule::tick_id(&pipeline, at)),
                pipeline: pipeline.clone(),
                scheduled_time: at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                outcome: "fired".into(),
                run_id: Some(run.0.clone()),
                reason: Some("triggered by hand".into()),
            };
            state.claim_tick(&tick)?;
            println!("{pipeline}: run {run} queued; the server starts it within a second");
        }
    }
    Ok(ExitCode::SUCCESS)
}
