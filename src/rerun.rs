//! `rerun` and `retry`: a new run linked to an ended one, reusing what it does not execute.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::engine::RunRequest;
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::runner;
use drivetrain_engine::state::{Origin, Phase, RunId, RunRecord, StageRecord, StateStore};
use drivetrain_engine::StageId;
use serde_json::json;

use crate::runs::*;

/// What `rerun` and `retry` are asked.
pub struct RerunArgs<'a> {
    pub parent: RunId,
    pub retry: bool,
    /// `--stage` (and with `--downstream`, what depends on them).
    pub stages: Vec<String>,
    pub downstream: bool,
    pub from: Vec<String>,
    pub only: Vec<String>,
    pub params: Vec<(String, String)>,
    pub images: Vec<(String, String)>,
    pub file: &'a Path,
    pub source: &'a str,
    pub pipeline: Pipeline,
    pub parallelism: Option<usize>,
    pub fail_fast: bool,
    pub no_cache: bool,
    pub home: PathBuf,
    pub json: bool,
    /// The new run's id, if the caller chose it.
    pub run_id: Option<RunId>,
}

/// The pipeline file a run was started from.
pub fn run_file(home: &Path, run: &str) -> anyhow::Result<PathBuf> {
    let state = open_state(home)?;
    Ok(PathBuf::from(state.run(&RunId(run.to_owned()))?.file))
}

/// What stops a rerun before it starts: a usage error (exit 2) or nothing to do.
enum Stop {
    Usage(String),
    Done(ExitCode),
}

impl Stop {
    fn exit(self) -> ExitCode {
        match self {
            Stop::Usage(m) => {
                eprintln!("error: {m}");
                ExitCode::from(2)
            }
            Stop::Done(code) => code,
        }
    }
}

type Selection = BTreeSet<StageId>;

/// `drivetrain rerun` / `drivetrain retry`: a new run, linked to its parent, that takes
/// every stage it does not execute from the parent exactly as the parent had it (even when
/// the pipeline changed since) and executes the selection: the stages named (rerun), or
/// every stage that did not succeed and what depends on it (retry).
pub fn rerun(args: RerunArgs<'_>) -> anyhow::Result<ExitCode> {
    let state: Arc<dyn StateStore> = open_state(&args.home)?;
    if let Err(stop) = end_parent(&*state, &args)? {
        return Ok(stop.exit());
    }
    let parent = state.run(&args.parent)?;
    let before = state.stages(&parent.id)?;
    let plan = match plan_rerun(&args, &parent, &before) {
        Ok(plan) => plan,
        Err(stop) => return Ok(stop.exit()),
    };
    let RerunPlan {
        pipeline,
        selection,
        reuse,
        params,
        overrides,
    } = plan;
    let executor = match drivetrain_executors::executor(&pipeline.executor) {
        Ok(e) => e,
        Err(why) => return Ok(Stop::Usage(why).exit()),
    };
    let url = crate::runs::run_store_url(pipeline.store.as_deref(), &pipeline.project, &args.home)?;
    let id = args
        .run_id
        .clone()
        .unwrap_or_else(|| RunId::generate(chrono::Utc::now()));
    let trigger = if args.retry { "retry" } else { "rerun" };
    if !args.json {
        let names = |v: Vec<&String>| match v.is_empty() {
            true => "nothing".to_owned(),
            false => v.into_iter().cloned().collect::<Vec<_>>().join(", "),
        };
        println!("run {id}");
        println!(
            "{trigger} of run {}: executes {}; reuses {}",
            parent.id,
            selection.iter().cloned().collect::<Vec<_>>().join(", "),
            names(reuse.keys().collect())
        );
    }
    // A person's rerun; one `serve` starts for a request (with its id) is audited there.
    if args.run_id.is_none() {
        crate::people::audit_local(
            state.as_ref(),
            &pipeline.project,
            &format!("runs.{trigger}"),
            format!("/api/v1/runs/{}/{trigger}", parent.id),
            serde_json::json!({"run": id, "stages": selection}),
        )?;
    }
    let artifacts = ArtifactStore::open_project(&url, &pipeline.project)?;
    let engine = engine(state, artifacts, executor, &args.home)?.build();
    let mut request = RunRequest::new(
        id,
        Arc::new(pipeline),
        args.file.display().to_string(),
        digest(args.source),
    );
    request.params = params;
    request.trigger = trigger.into();
    request.parallelism = args.parallelism;
    request.fail_fast = args.fail_fast;
    request.parent = Some(parent.id.clone());
    request.selection = Some(selection);
    request.reuse = reuse;
    request.overrides = overrides;
    // A rerun executes what it selected, whatever the cache holds; a retry may hit.
    request.cache = runner::CacheMode {
        read: args.retry && !args.no_cache,
        write: !args.no_cache,
    };
    drive(Drive {
        engine,
        request,
        deadline: None,
        json: args.json,
    })
}

/// Refuses a parent that still runs; ends an orphan (its engine stopped) first, so no
/// run stays `Running` forever behind the new one. What it finished is taken from it as
/// from any ended run.
fn end_parent(state: &dyn StateStore, args: &RerunArgs<'_>) -> anyhow::Result<Result<(), Stop>> {
    let parent = state.run(&args.parent)?;
    if !parent.phase.is_terminal() && parent.engine_pid.is_some_and(alive) {
        return Ok(Err(Stop::Usage(format!(
            "run {} is still running; wait for it or cancel it first",
            parent.id
        ))));
    }
    if !parent.phase.is_terminal() {
        let verb = if args.retry { "retry" } else { "rerun" };
        crate::runs::end_orphan(
            state,
            &parent,
            Phase::Error,
            &format!(
                "its engine stopped; ended by `drivetrain {verb}`, which started a new run from it"
            ),
        )?;
        eprintln!(
            "run {} was orphaned (its engine stopped): ended as Error; the {verb} goes on from it",
            parent.id
        );
    }
    Ok(Ok(()))
}

/// What a rerun runs: the pipeline (with `--image` applied), the stages it executes,
/// what it takes from the parent, its params and what it overrode.
struct RerunPlan {
    pipeline: Pipeline,
    selection: BTreeSet<String>,
    reuse: BTreeMap<String, runner::Reused>,
    params: BTreeMap<String, serde_json::Value>,
    overrides: serde_json::Value,
}

fn plan_rerun(
    args: &RerunArgs<'_>,
    parent: &RunRecord,
    before: &[StageRecord],
) -> Result<RerunPlan, Stop> {
    let mut pipeline = args.pipeline.clone();
    // What it takes from the parent are the parent's project's artifacts.
    if pipeline.project != parent.project {
        return Err(Stop::Usage(format!(
            "run {} is of project `{}`, the pipeline now of `{}`: a rerun does not take \
             artifacts across projects (start a new run instead)",
            parent.id, parent.project, pipeline.project
        )));
    }
    let selected = select(args, &pipeline, parent, before)?;
    let reuse = reused(&pipeline, parent, before, &selected);
    let missing = missing_upstream(&pipeline, parent, before, &selected, &reuse);
    if !missing.is_empty() {
        return Err(Stop::Usage(missing.join("\n")));
    }
    // Params: the parent's, then the overrides.
    let mut raw: Vec<(String, String)> = parent
        .params
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| pipeline.params.iter().any(|p| &p.name == *k))
        .map(|(k, v)| (k.clone(), drivetrain_engine::template::value_text(v)))
        .collect();
    raw.extend(args.params.iter().cloned());
    let params = pipeline
        .resolve_params(&raw)
        .map_err(|errors| Stop::Usage(errors.join("\n")))?;
    let selection = selected
        .iter()
        .map(|id| pipeline.stage(*id).name.clone())
        .collect();
    let images = apply_images(&mut pipeline, &args.images).map_err(Stop::Usage)?;
    let overrides = json!({
        "params": args.params.iter().map(|(k, _)| (k.clone(), params.get(k).cloned().unwrap_or_default())).collect::<serde_json::Map<_, _>>(),
        "images": images,
    });
    Ok(RerunPlan {
        pipeline,
        selection,
        reuse,
        params,
        overrides,
    })
}

/// The stages a rerun executes (never hooks: they run anyway): for a retry every stage
/// that did not succeed and what depends on it; else those named.
fn select(
    args: &RerunArgs<'_>,
    pipeline: &Pipeline,
    parent: &RunRecord,
    before: &[StageRecord],
) -> Result<Selection, Stop> {
    let mut selected = Selection::new();
    if args.retry {
        for s in &pipeline.stages {
            let ok = before
                .iter()
                .any(|b| b.stage == s.name && b.phase == Phase::Succeeded);
            if !ok && s.hook.is_none() {
                selected.extend(pipeline.descendants(s.id));
            }
        }
        if selected.is_empty() {
            println!(
                "every stage of run {} succeeded; nothing to retry",
                parent.id
            );
            return Err(Stop::Done(ExitCode::SUCCESS));
        }
    } else {
        let ids = |names: &[String]| stage_ids(pipeline, args.file, names);
        let (stages, from, only) = match (ids(&args.stages), ids(&args.from), ids(&args.only)) {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            (a, b, c) => {
                let errors: Vec<String> =
                    [a.err(), b.err(), c.err()].into_iter().flatten().collect();
                return Err(Stop::Usage(errors.join("\n")));
            }
        };
        if stages.is_empty() && from.is_empty() && only.is_empty() {
            return Err(Stop::Usage(
                "say what to rerun: --stage S [--downstream], --from S or --only S1,S2".into(),
            ));
        }
        for id in stages {
            selected.insert(id);
            if args.downstream {
                selected.extend(pipeline.descendants(id));
            }
        }
        for id in from {
            selected.extend(pipeline.descendants(id));
        }
        selected.extend(only);
    }
    selected.retain(|id| pipeline.stage(*id).hook.is_none());
    Ok(selected)
}

/// The ids of the stages named, or what is wrong with a name.
fn stage_ids(pipeline: &Pipeline, file: &Path, names: &[String]) -> Result<Vec<StageId>, String> {
    names
        .iter()
        .map(|n| {
            pipeline.stage_by_name(n).map(|s| s.id).ok_or_else(|| {
                let all: Vec<&str> = pipeline.stages.iter().map(|s| s.name.as_str()).collect();
                let mut m = format!("no stage named `{n}` in {}", file.display());
                if let Some(h) = drivetrain_engine::diag::did_you_mean(n, all) {
                    m.push_str(&format!("; {h}"));
                }
                m
            })
        })
        .collect()
}

/// What a rerun takes from the parent: every succeeded stage the selection needs, and
/// every other one that is not downstream of the selection (whose outputs would be
/// stale: those are not run at all).
fn reused(
    pipeline: &Pipeline,
    parent: &RunRecord,
    before: &[StageRecord],
    selected: &Selection,
) -> BTreeMap<String, runner::Reused> {
    let needed: BTreeSet<_> = selected
        .iter()
        .flat_map(|id| pipeline.ancestors(*id))
        .collect();
    let stale: BTreeSet<_> = selected
        .iter()
        .flat_map(|id| pipeline.descendants(*id))
        .filter(|id| !needed.contains(id))
        .collect();
    let mut reuse = BTreeMap::new();
    for b in before {
        let Some(s) = pipeline.stage_by_name(&b.stage) else {
            continue;
        };
        if b.phase != Phase::Succeeded
            || selected.contains(&s.id)
            || stale.contains(&s.id)
            || s.hook.is_some()
        {
            continue;
        }
        let outputs = serde_json::from_value(b.outputs.clone()).unwrap_or_default();
        // Where the outputs were made: the parent, or the run it took them from.
        let run = b.how.origin.run().unwrap_or(&parent.id.0).to_owned();
        reuse.insert(
            b.stage.clone(),
            runner::Reused {
                outputs,
                values: b.values.clone(),
                provenance: drivetrain_engine::state::Provenance {
                    origin: Origin::Reused { run },
                    ..b.how.clone()
                },
            },
        );
    }
    reuse
}

/// Everything the selection needs must come from the parent: what did not, sorted.
fn missing_upstream(
    pipeline: &Pipeline,
    parent: &RunRecord,
    before: &[StageRecord],
    selected: &Selection,
    reuse: &BTreeMap<String, runner::Reused>,
) -> Vec<String> {
    let name_of = |id: StageId| pipeline.stage(id).name.clone();
    let mut missing = Vec::new();
    for id in selected {
        for up in pipeline.ancestors(*id) {
            let name = name_of(up);
            if !selected.contains(&up) && !reuse.contains_key(&name) {
                let phase = before
                    .iter()
                    .find(|b| b.stage == name)
                    .map(|b| b.phase.as_str())
                    .unwrap_or("not run");
                missing.push(format!(
                    "`{name}` (upstream of `{}`) did not succeed in run {} ({phase}); rerun with --from {name}, or `drivetrain retry {}`",
                    name_of(*id),
                    parent.id,
                    parent.id
                ));
            }
        }
    }
    missing.sort();
    missing.dedup();
    missing
}

/// `--image STAGE=IMAGE`: the stage runs that image; the overrides recorded.
fn apply_images(
    pipeline: &mut Pipeline,
    images: &[(String, String)],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut applied = serde_json::Map::new();
    for (stage, image) in images {
        let Some(id) = pipeline.stage_by_name(stage).map(|s| s.id) else {
            return Err(format!("--image {stage}=…: no stage named `{stage}`"));
        };
        let template = drivetrain_engine::template::Template::parse(image)
            .map_err(|_| format!("--image {stage}={image}: not a valid image"))?;
        let s = &mut pipeline.stages[id.index()];
        if let drivetrain_engine::plan::Action::Command { image: i, .. } = &mut s.action {
            *i = Some(template.clone());
        }
        s.image = Some(template);
        applied.insert(stage.clone(), json!(image));
    }
    Ok(applied)
}
