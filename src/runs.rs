//! `run`, `resume` and `cancel`: running pipelines on this machine. Reading what runs
//! recorded is in [`crate::inspect`], reruns and retries in [`crate::rerun`].
//!
//! Everything lives under the engine's home, `.drivetrain/` (found in the current
//! directory or a parent, like `.git/`; `--home` or `DRIVETRAIN_HOME` override it):
//! `state.db` (SQLite), `artifacts/` (the default `file://` store) and `work/` (attempt
//! directories).

use crate::output::Format;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::engine::recover::{alive, stale_before};
use drivetrain_engine::engine::{Engine, EngineBuilder, Home, RunRequest};
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::runner::{self, RunEvent};
use drivetrain_engine::state::{Origin, Phase, RunId, StateStore};
use serde_json::{json, Value};

/// Exit code of a cancelled run (128 + SIGINT, as shells report Ctrl-C).
pub const EXIT_CANCELLED: u8 = 130;
/// A run that stopped to wait for people (an approval stage): not a failure, not done.
pub const EXIT_WAITING: u8 = 3;

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

/// The state store of `home` ([`Home::open_state`]: `DRIVETRAIN_STATE`'s PostgreSQL, or
/// SQLite in the home).
pub fn open_state(home: &Path) -> anyhow::Result<Arc<dyn StateStore>> {
    Ok(Home::at(home)?.open_state()?)
}

/// The run `run` names in `home`: an id, a prefix only one run's id starts with (as git
/// takes a commit's), `@latest` (or nothing) for the newest run. A name that fits no run
/// or several says so, with the home it looked in.
pub fn resolve_run(
    home: &Path,
    state: &dyn drivetrain_engine::state::RunStore,
    run: Option<&str>,
) -> anyhow::Result<RunId> {
    let latest = || {
        state
            .list_runs(1)?
            .into_iter()
            .next()
            .map(|r| r.id)
            .ok_or_else(|| anyhow::anyhow!("no runs yet in the home {}", home.display()))
    };
    let text = match run {
        None | Some("@latest") => return latest(),
        Some(t) => t,
    };
    let id = RunId(text.to_owned());
    if state.run(&id).is_ok() || text.is_empty() {
        return Ok(id);
    }
    let fitting: Vec<RunId> = state
        .list_runs(usize::MAX >> 1)?
        .into_iter()
        .map(|r| r.id)
        .filter(|r| r.0.starts_with(text))
        .collect();
    match fitting.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(anyhow::Error::new(
            drivetrain_engine::state::StateError::UnknownRun(text.to_owned()),
        )
        .context(format!(
            "looked in the home {} (`drivetrain list` shows its runs; `--home DIR` looks in another)",
            home.display()
        ))),
        many => Err(anyhow::anyhow!(
            "`{text}` starts the ids of {} runs ({}{}): give more of it",
            many.len(),
            many.iter().take(5).map(|r| r.0.as_str()).collect::<Vec<_>>().join(", "),
            if many.len() > 5 { ", …" } else { "" }
        )),
    }
}

/// The artifact store's URL ([`Home::store_url`]).
pub fn store_url(pipeline_store: Option<&str>, home: &Path) -> anyhow::Result<String> {
    Ok(Home::at(home)?.store_url(pipeline_store)?)
}

/// The store of a run of `project` ([`drivetrain_engine::artifacts::project_url`] of
/// [`store_url`]).
pub fn run_store_url(
    pipeline_store: Option<&str>,
    project: &str,
    home: &Path,
) -> anyhow::Result<String> {
    let base = store_url(pipeline_store, home)?;
    Ok(drivetrain_engine::artifacts::project_url(&base, project))
}

pub use drivetrain_engine::engine::home::live_log;

/// Options of `drivetrain run`.
pub struct RunArgs<'a> {
    /// The run's deadline: past it, everything is stopped and the run fails.
    pub deadline: Option<Duration>,
    /// How many GPUs stages may claim; default: those found (`drivetrain doctor`).
    pub gpus: Option<usize>,
    /// A given id (from `--detach`); a new one otherwise.
    pub run_id: Option<String>,
    pub file: &'a Path,
    pub source: &'a str,
    pub pipeline: Pipeline,
    pub params: BTreeMap<String, Value>,
    pub parallelism: Option<usize>,
    pub fail_fast: bool,
    pub executor: Option<&'a str>,
    pub home: PathBuf,
    pub out: Format,
    pub cache: runner::CacheMode,
}

/// Runs a pipeline to its end, printing the run id first and then one line per transition.
pub fn run(args: RunArgs<'_>) -> anyhow::Result<ExitCode> {
    let executor_name = args.executor.unwrap_or(&args.pipeline.executor).to_owned();
    let folders = drivetrain_engine::plugin::Origin::of_file(args.file, None).folders();
    let executor = match drivetrain_executors::executor_in(&executor_name, &folders) {
        Ok(e) => e,
        Err(why) => {
            tell!("error: {why}");
            return Ok(crate::exit::usage());
        }
    };
    let state: Arc<dyn StateStore> = open_state(&args.home)?;
    let url = run_store_url(
        args.pipeline.store.as_deref(),
        &args.pipeline.project,
        &args.home,
    )?;
    let artifacts = ArtifactStore::open_project(&url, &args.pipeline.project)?;
    let by_person = args.run_id.is_none();
    let id = args
        .run_id
        .map(RunId)
        .unwrap_or_else(|| RunId::generate(chrono::Utc::now()));
    if by_person {
        crate::audit::audit_local(
            state.as_ref(),
            &args.pipeline.project,
            "runs.create",
            "/api/v1/runs".into(),
            serde_json::json!({"run": id, "pipeline": args.pipeline.name}),
        )?;
    }
    let engine = engine(state, artifacts, executor, &args.home)?.build();
    let mut request = RunRequest::new(
        id.clone(),
        Arc::new(args.pipeline),
        args.file.display().to_string(),
        digest(args.source),
    );
    request.params = args.params;
    request.parallelism = args.parallelism;
    request.fail_fast = args.fail_fast;
    request.gpus = args.gpus;
    request.cache = args.cache;
    request.deadline = args.deadline;
    if !args.out.json() {
        say!("run {id}");
        say!(
            "pipeline {} ({} stages), store {url}",
            request.pipeline.name,
            request.pipeline.stages.len()
        );
    }
    drive(Drive {
        engine,
        request,
        out: args.out,
    })
}

/// `drivetrain run --detach`: the same command without `--detach` in a new session in the
/// background, its output in `.drivetrain/engine/<run>.log`; prints the run id.
pub fn detach(home: &Path) -> anyhow::Result<ExitCode> {
    let id = RunId::generate(chrono::Utc::now());
    let dir = home.join("engine");
    std::fs::create_dir_all(&dir)?;
    // The state must exist before `status` is asked about the run.
    let state = open_state(home)?;
    let log_path = dir.join(format!("{id}.log"));
    let log = std::fs::File::create(&log_path)?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let exe = std::env::current_exe()?;
    let mut engine = std::process::Command::new(exe)
        .args(&args)
        .args(["--run-id", &id.0])
        .env("DRIVETRAIN_HOME", std::fs::canonicalize(home)?)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    // Answered once the run is recorded, so `status ID` right after finds it; an engine
    // that ends first (an invalid param, say) says why in its log.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while state.run(&id).is_err() {
        if let Some(status) = engine.try_wait()? {
            anyhow::bail!(
                "the engine ended ({status}) before recording run {id}: see {}",
                log_path.display()
            );
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "run {id} was not recorded within 30 s: see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    say!("run {id}");
    say!("detached; engine output in {}", log_path.display());
    say!("follow with: drivetrain status {id} / drivetrain logs {id} --stage STAGE --follow");
    Ok(ExitCode::SUCCESS)
}

/// The GPUs stages of `pipeline` may claim (`drivetrain_executors::gpus::detect`, `count`
/// overriding how many), looked for only when a stage asks for one.
pub fn machine_gpus(pipeline: &Pipeline, count: Option<usize>) -> Vec<String> {
    if count.is_none() && pipeline.stages.iter().all(|s| s.gpus() == 0) {
        return Vec::new();
    }
    drivetrain_executors::gpus::detect(count).ids()
}

pub(crate) fn default_parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

/// What resolves the references outside a run that cache keys hold: the model registry.
pub fn resolver() -> Arc<dyn drivetrain_engine::cache::Resolver> {
    Arc::new(drivetrain_steps::registry::AliasResolver)
}

/// How built-in steps run: this very binary, `drivetrain step NAME`.
pub fn step_command() -> anyhow::Result<Vec<String>> {
    let exe = std::env::current_exe()?;
    Ok(vec![exe.display().to_string(), "step".into()])
}

pub fn digest(source: &str) -> String {
    drivetrain_engine::engine::home::digest(source)
}

/// The engine (to build) for runs on `home`, recording them in `state`, with their artifacts in
/// `artifacts` and their attempts on `executor`.
pub(crate) fn engine(
    state: Arc<dyn StateStore>,
    artifacts: ArtifactStore,
    executor: Arc<dyn drivetrain_engine::executor::Executor>,
    home: &Path,
) -> anyhow::Result<EngineBuilder> {
    Ok(EngineBuilder::new(
        state,
        artifacts,
        executor,
        std::fs::canonicalize(home)?.join("work"),
    )
    .parallelism(default_parallelism())
    .step_command(step_command()?)
    .resolver(resolver())
    .gpus(machine_gpus)
    .executors(drivetrain_executors::executor)
    .home(Home::at(home)?))
}

/// This binary's engine on `home`, on `executor`, with the home's
/// state and default store (a request's own store is the engine's to choose:
/// [`Engine::run_store`]).
pub(crate) fn home_engine(
    home: &Path,
    executor: Arc<dyn drivetrain_engine::executor::Executor>,
) -> anyhow::Result<Engine> {
    let artifacts = ArtifactStore::open(&store_url(None, home)?)?;
    Ok(engine(open_state(home)?, artifacts, executor, home)?.build())
}

/// The executor a run was recorded on (`local` for a record without one).
fn executor_of(
    record: &drivetrain_engine::state::RunRecord,
) -> anyhow::Result<Arc<dyn drivetrain_engine::executor::Executor>> {
    let folders =
        drivetrain_engine::plugin::Origin::of_file(Path::new(&record.file), None).folders();
    drivetrain_executors::executor_in(record.executor.as_deref().unwrap_or("local"), &folders)
        .map_err(anyhow::Error::msg)
}

/// A run to carry out: what `run`, `resume`, `rerun` and `retry` hand to [`drive`].
pub(crate) struct Drive {
    pub(crate) engine: Engine,
    pub(crate) request: RunRequest,
    pub(crate) out: Format,
}

/// Runs (or resumes) a run to its end, printing progress; Ctrl-C and SIGTERM cancel it.
pub(crate) fn drive(d: Drive) -> anyhow::Result<ExitCode> {
    let Drive {
        engine,
        request,
        out,
    } = d;
    let state = engine.state().clone();
    // The last stage in plan order, and where its attempts' logs are: the run ends by
    // quoting the last stage that succeeded (what the pipeline concluded).
    let pipeline = &request.pipeline;
    let order: Vec<String> = pipeline
        .order
        .iter()
        .map(|id| pipeline.stage(*id).name.to_string())
        .collect();
    let work_dir = engine.work_dir().to_path_buf();
    engine.home().keep_reserve();
    let id = request.id.clone();
    let deadline = request.deadline;
    let rt = crate::runtime()?;
    let summary = rt.block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
        let runner = engine.clone();
        let run = tokio::spawn(async move { runner.run(request, tx, cancel_rx).await });
        let printer = tokio::spawn(async move {
            let mut progress = Progress::new();
            while let Some(ev) = rx.recv().await {
                if !out.json() {
                    progress.event(&ev);
                }
            }
        });
        let signals = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            let why = tokio::select! {
                _ = tokio::signal::ctrl_c() => "Ctrl-C",
                _ = term.recv() => "SIGTERM",
            };
            tell!("cancelling run {id} ({why})…");
            let _ = cancel_tx.send(true);
            std::future::pending::<()>().await
        };
        let summary = tokio::select! {
            s = run => s,
            _ = signals => unreachable!("the signal future never completes"),
        };
        let _ = printer.await;
        // A run task that panicked ends its run as `Error` too (the engine ends the run
        // of an error of its own).
        if let Err(e) = &summary {
            engine.end_after_failure(&id, &e.to_string()).await;
        }
        summary
    });
    let summary = summary??;
    // The engine ended the run at its deadline: say so, as its record does.
    if let (Phase::Failed, Some(d), false) = (summary.phase, deadline, out.json()) {
        let passed = drivetrain_engine::engine::deadline_reason(d);
        let reason = state.run(&summary.id).ok().and_then(|r| r.reason);
        if reason.as_deref() == Some(passed.as_str()) {
            say!("{passed}");
        }
    }
    if out.json() {
        crate::output::print_json(&json!({
            "run": summary.id,
            "phase": summary.phase,
            "stages": summary.stages,
        }))?;
    } else {
        if let Some(line) = conclusion(state.as_ref(), &summary.id, &order, &work_dir) {
            say!("{line}");
        }
        say!("run {} {}", summary.id, summary.phase);
        for line in crate::next::after_run(state.as_ref(), &summary.id, summary.phase) {
            say!("{line}");
        }
    }
    Ok(match summary.phase {
        Phase::Succeeded => ExitCode::SUCCESS,
        Phase::Cancelled => ExitCode::from(EXIT_CANCELLED),
        Phase::Waiting => ExitCode::from(EXIT_WAITING),
        _ => crate::exit::failed(),
    })
}

/// The last line the last succeeded stage (in plan order) printed, if it executed in this
/// run: for the driving loop, what was promoted and why, or why the gate failed.
fn conclusion(
    state: &dyn StateStore,
    run: &RunId,
    order: &[String],
    work: &Path,
) -> Option<String> {
    let stages = state.stages(run).ok()?;
    let last = order.iter().rev().find_map(|name| {
        stages.iter().find(|s| {
            &s.stage == name
                && s.phase == Phase::Succeeded
                && s.how.origin == Origin::Ran
                && s.attempts > 0
        })
    })?;
    let log = live_log(work, &run.0, &last.stage, last.attempts);
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(format!("{}: {line}", last.stage))
}

/// `drivetrain resume RUN`: finishes a run whose engine stopped (killed, crashed, a
/// reboot), in this process ([`Engine::resume_request`]).
pub fn resume(
    catalog: &drivetrain_engine::Catalog,
    home: &Path,
    run: &str,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(home, state.as_ref(), Some(run))?;
    let record = state.run(&id)?;
    let engine = home_engine(home, executor_of(&record)?)?;
    let rt = crate::runtime()?;
    let (request, reaped) = match rt.block_on(engine.resume_request(catalog, &id)) {
        Ok(r) => r,
        Err(refusal) => return Ok(refused(refusal)),
    };
    if !out.json() {
        let p = &request.pipeline;
        let succeeded = request.resume.as_ref().map_or(0, |r| r.succeeded.len());
        say!("run {id}");
        say!(
            "resuming: {succeeded} of {} stages succeeded before, {} attempt(s) lost, {} re-attached",
            p.stages.len(),
            reaped.lost,
            reaped.reattach.len()
        );
    }
    drive(Drive {
        engine,
        request,
        out,
    })
}

/// What a face says of a refusal, and the exit status it ends with: nothing to do is a
/// success; the rest by whose fault it is.
pub(crate) fn refused(refusal: drivetrain_engine::engine::Refusal) -> ExitCode {
    use drivetrain_engine::engine::Refusal;
    use drivetrain_engine::fault::Blame;
    match refusal {
        Refusal::Nothing(m) => {
            say!("{m}");
            ExitCode::SUCCESS
        }
        other => {
            tell!("error: {other}");
            ExitCode::from(other.fault().exit_code())
        }
    }
}

/// `drivetrain cancel RUN`: asks the engine running it to stop (as Ctrl-C would); when
/// that engine is gone, stops what it left running and records the run as cancelled.
pub fn cancel(home: &Path, run: &str) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(home, state.as_ref(), Some(run))?;
    let record = state.run(&id)?;
    if record.phase.is_terminal() {
        say!("run {id} already ended: {}", record.phase);
        return Ok(ExitCode::SUCCESS);
    }
    crate::audit::audit_local(
        state.as_ref(),
        &record.project,
        "runs.cancel",
        format!("/api/v1/runs/{id}/cancel"),
        serde_json::json!({"phase": record.phase}),
    )?;
    if cancel_waiting(&*state, &id)? {
        say!("run {id} Cancelled (it was waiting for approval)");
        return Ok(ExitCode::SUCCESS);
    }
    let record = state.run(&id)?;
    // A pid is only this machine's, and a run sharing a PostgreSQL home may be driven on
    // another: the engine is gone when its pid is not alive here and its heartbeat has
    // stopped. No signal is sent (a pid of another machine may be anything here); the
    // cancel is recorded, and whichever engine drives the run reads it within 2 s.
    let gone = |state: &dyn drivetrain_engine::state::StateStore| -> anyhow::Result<bool> {
        let here = record.engine_pid.is_some_and(alive);
        Ok(!here && state.stale_runs(&stale_before())?.contains(&id))
    };
    if record.engine_pid.is_some() && !gone(state.as_ref())? {
        state.ask_cancel(&id)?;
        // The engine records the end itself; wait for it.
        for _ in 0..600 {
            let r = state.run(&id)?;
            if r.phase.is_terminal() {
                say!("run {id} {}", r.phase);
                return Ok(ExitCode::SUCCESS);
            }
            if gone(state.as_ref())? {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !gone(state.as_ref())? {
            tell!("error: the engine of run {id} did not stop it within 60 s");
            return Ok(crate::exit::failed());
        }
    }
    end_orphan(
        home,
        &record,
        Phase::Cancelled,
        "cancelled after its engine stopped",
    )?;
    say!("run {id} Cancelled");
    Ok(ExitCode::SUCCESS)
}

pub use drivetrain_engine::engine::recover::cancel_waiting;

/// Ends `record`, a run whose engine stopped ([`Engine::end_orphan`]).
pub fn end_orphan(
    home: &Path,
    record: &drivetrain_engine::state::RunRecord,
    phase: Phase,
    reason: &str,
) -> anyhow::Result<()> {
    let engine = home_engine(home, executor_of(record)?)?;
    crate::runtime()?.block_on(engine.end_orphan(record, phase, reason))?;
    Ok(())
}

/// Progress output: plain lines (a pipe, a log file), or on a terminal a live line per
/// running stage with its elapsed time and a bar for map items.
enum Progress {
    Plain,
    Live {
        bars: indicatif::MultiProgress,
        running: BTreeMap<String, indicatif::ProgressBar>,
    },
}

impl Progress {
    fn new() -> Progress {
        use std::io::IsTerminal;
        if std::io::stdout().is_terminal() {
            Progress::Live {
                bars: indicatif::MultiProgress::new(),
                running: BTreeMap::new(),
            }
        } else {
            Progress::Plain
        }
    }

    fn event(&mut self, ev: &RunEvent) {
        let (bars, running) = match self {
            Progress::Plain => return print_event(ev),
            Progress::Live { bars, running } => (bars, running),
        };
        let spinner =
            indicatif::ProgressStyle::with_template("  {spinner} {prefix} {elapsed} {msg}")
                .expect("a valid template");
        match ev {
            RunEvent::Started { stage, attempt } => {
                let bar = running.entry(stage.to_string()).or_insert_with(|| {
                    let b = bars.add(indicatif::ProgressBar::new_spinner());
                    b.set_style(spinner.clone());
                    b.set_prefix(stage.to_string());
                    b.enable_steady_tick(Duration::from_millis(120));
                    b
                });
                if *attempt > 1 {
                    bar.set_message(format!("attempt {attempt}"));
                }
            }
            RunEvent::Items { stage, total } => {
                if let Some(bar) = running.get(stage.as_str()) {
                    bar.set_length(*total as u64);
                    bar.set_style(
                        indicatif::ProgressStyle::with_template(
                            "  {spinner} {prefix} {elapsed} [{bar:30}] {pos}/{len} items {msg}",
                        )
                        .expect("a valid template"),
                    );
                }
            }
            RunEvent::ItemDone { stage, succeeded } => {
                if let Some(bar) = running.get(stage.as_str()) {
                    bar.inc(1);
                    if !succeeded {
                        bar.set_message("(some items failed)");
                    }
                }
            }
            RunEvent::Retrying {
                stage,
                attempt,
                reason,
                ..
            } => {
                if let Some(bar) = running.get(stage.as_str()) {
                    bar.set_message(format!("↻ {reason}; attempt {attempt} next"));
                }
            }
            RunEvent::Finished { stage, .. } => {
                if let Some(bar) = running.remove(stage.as_str()) {
                    bar.finish_and_clear();
                    bars.remove(&bar);
                }
                let line = event_line(ev);
                let _ = bars.println(line.trim_end());
            }
            RunEvent::Used { .. } => {}
        }
    }
}

fn print_event(ev: &RunEvent) {
    let line = event_line(ev);
    if !line.is_empty() {
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), "{line}");
    }
}

/// The plain line(s) of an event, newline-terminated; empty for item ticks.
fn event_line(ev: &RunEvent) -> String {
    match ev {
        RunEvent::Started { stage, attempt } if *attempt > 1 => {
            format!("  ▶ {stage} (attempt {attempt})\n")
        }
        RunEvent::Started { stage, .. } => format!("  ▶ {stage}\n"),
        RunEvent::Items { stage, total } => format!("  … {stage}: {total} items\n"),
        RunEvent::ItemDone { .. } | RunEvent::Used { .. } => String::new(),
        RunEvent::Retrying {
            stage,
            attempt,
            delay,
            reason,
        } => format!(
            "  ↻ {stage}: {reason}; attempt {attempt} in {}\n",
            humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
        ),
        RunEvent::Finished {
            stage,
            phase,
            reason,
            elapsed,
            ..
        } => {
            let glyph = match phase {
                Phase::Succeeded => "✓",
                Phase::Skipped | Phase::Omitted => "○",
                Phase::Cancelled => "■",
                Phase::Waiting => "⏸",
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
                    let mut out = format!(
                        "  {glyph} {stage} {phase}{took}: {}\n",
                        lines.next().unwrap_or_default()
                    );
                    for l in lines {
                        out.push_str(&format!("      {l}\n"));
                    }
                    out
                }
                None => format!("  {glyph} {stage} {phase}{took}\n"),
            }
        }
    }
}

use std::time::Duration;
