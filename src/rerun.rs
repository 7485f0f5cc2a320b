//! `rerun` and `retry`: a new run linked to an ended one, reusing what it does not execute.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use drivetrain_engine::engine::{Refusal, RerunSource, RerunSpec};
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::state::{RunId, StageName};

use crate::runs::*;

/// What `rerun` and `retry` are asked.
pub struct RerunArgs<'a> {
    /// The parent, and what to execute of it.
    pub spec: RerunSpec,
    pub file: &'a Path,
    pub source: &'a str,
    pub pipeline: Pipeline,
    pub parallelism: Option<usize>,
    pub fail_fast: bool,
    pub home: PathBuf,
    pub out: crate::output::Format,
    /// The new run's id, if the caller chose it.
    pub run_id: Option<RunId>,
}

/// The pipeline file a run was started from, and the text it ran: the file's while it
/// holds the same, else the text kept when it started (said, with how to run the file
/// as it is now).
pub fn run_source(home: &Path, run: &RunId) -> anyhow::Result<(PathBuf, String)> {
    let state = open_state(home)?;
    let record = state.run(run)?;
    let text = drivetrain_engine::state::sources::pipeline_text(state.as_ref(), &record)?;
    if std::fs::read_to_string(&record.file).ok().as_deref() != Some(text.as_str()) {
        tell!(
            "{} changed since run {run} (or is gone): this runs the pipeline as run {run} ran it; `--file {}` runs the file as it is now",
            record.file,
            record.file
        );
    }
    Ok((PathBuf::from(record.file), text))
}

/// `drivetrain rerun` / `drivetrain retry`: a new run, linked to its parent, planned by the
/// engine ([`drivetrain_engine::engine::Engine::rerun_request`]) and run in this process.
pub fn rerun(args: RerunArgs<'_>) -> anyhow::Result<ExitCode> {
    let folders = drivetrain_engine::plugin::Origin::of_file(args.file, None).folders();
    let executor = match drivetrain_executors::executor_in(&args.pipeline.executor, &folders) {
        Ok(e) => e,
        Err(why) => return Ok(refused(Refusal::Usage(why))),
    };
    let engine = home_engine(&args.home, executor)?;
    let state = engine.state().clone();
    let id = args
        .run_id
        .clone()
        .unwrap_or_else(|| RunId::generate(chrono::Utc::now()));
    let spec = args.spec;
    let source = RerunSource {
        pipeline: args.pipeline,
        file: args.file.display().to_string(),
        spec_digest: digest(args.source),
    };
    let planned = crate::runtime()?.block_on(engine.rerun_request(&spec, source, id.clone()));
    let (mut request, plan) = match planned {
        Ok(p) => p,
        Err(refusal) => return Ok(refused(refusal)),
    };
    let trigger = request.trigger.clone();
    if !args.out.json() {
        let names = |v: &[StageName]| match v.is_empty() {
            true => "nothing".to_owned(),
            false => v
                .iter()
                .map(StageName::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        };
        say!("run {id}");
        say!(
            "{trigger} of run {}: executes {}; reuses {}",
            spec.parent,
            names(&plan.executes),
            names(&plan.reuses)
        );
    }
    // A person's rerun; one `serve` starts for a request (with its id) is audited there.
    if args.run_id.is_none() {
        crate::audit::audit_local(
            state.as_ref(),
            &request.pipeline.project,
            &format!("runs.{trigger}"),
            format!("/api/v1/runs/{}/{trigger}", spec.parent),
            serde_json::json!({"run": id, "stages": plan.executes}),
        )?;
    }
    request.parallelism = args.parallelism;
    request.fail_fast = args.fail_fast;
    drive(Drive {
        engine,
        request,
        out: args.out,
    })
}
