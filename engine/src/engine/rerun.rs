//! `rerun` and `retry`: a new run linked to an ended one that takes every stage it does
//! not execute from the parent exactly as the parent had it (even when the pipeline
//! changed since) and executes the selection: the stages named (rerun), or every stage
//! that did not succeed and what depends on it (retry). [`Engine::rerun_request`] turns
//! what was asked into the [`RunRequest`] every face submits alike.

use crate::names::StageName;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::json;

use super::recover::{alive, stale_before};
use super::{Engine, Refusal};
use crate::plan::{Action, Pipeline};
use crate::runner::{CacheMode, Reused, RunRequest};
use crate::state::{Origin, Phase, Provenance, RunId, RunRecord, StageRecord};
use crate::StageId;

/// What a rerun or retry is asked.
#[derive(Debug, Clone)]
pub struct RerunSpec {
    pub parent: RunId,
    /// A retry: every stage that did not succeed and what depends on it.
    pub retry: bool,
    /// Stages to execute (and with `downstream`, what depends on them).
    pub stages: Vec<StageName>,
    pub downstream: bool,
    /// Stages to execute with everything downstream of them.
    pub from: Vec<StageName>,
    /// Exactly these stages.
    pub only: Vec<StageName>,
    /// Params over the parent's.
    pub params: Vec<(String, String)>,
    /// `STAGE=IMAGE`: the stage runs that image.
    pub images: Vec<(String, String)>,
    /// Neither read nor write the cache.
    pub no_cache: bool,
}

impl RerunSpec {
    /// A rerun of `parent` executing `stages` (none yet: say them with `from`, `only`).
    pub fn rerun(parent: RunId, stages: Vec<StageName>) -> RerunSpec {
        RerunSpec {
            parent,
            retry: false,
            stages,
            downstream: false,
            from: Vec::new(),
            only: Vec::new(),
            params: Vec::new(),
            images: Vec::new(),
            no_cache: false,
        }
    }

    /// A retry of `parent`: what did not succeed, and what depends on it.
    pub fn retry(parent: RunId) -> RerunSpec {
        RerunSpec {
            retry: true,
            ..RerunSpec::rerun(parent, Vec::new())
        }
    }
}

/// The pipeline a rerun runs, as given (the parent's file, or another one).
#[derive(Debug, Clone)]
pub struct RerunSource {
    pub pipeline: Pipeline,
    pub file: String,
    pub spec_digest: String,
}

/// What a rerun executes and what it takes from its parent, by name (for the faces to
/// say).
#[derive(Debug, Clone)]
pub struct RerunPlan {
    pub executes: Vec<StageName>,
    pub reuses: Vec<StageName>,
}

type Selection = BTreeSet<StageId>;

impl Engine {
    /// The request of the rerun or retry `spec` asks for, as run `id` of `source`.
    /// A parent that still runs is refused; an orphan (its engine stopped: dead here, or
    /// silent past its heartbeat) is ended first, so no run stays `Running` forever
    /// behind the new one.
    pub async fn rerun_request(
        &self,
        spec: &RerunSpec,
        source: RerunSource,
        id: RunId,
    ) -> Result<(RunRequest, RerunPlan), Refusal> {
        let state = self.state().clone();
        let parent = state
            .run(&spec.parent)
            .map_err(|_| Refusal::NotFound(format!("no run `{}`", spec.parent)))?;
        self.end_parent(spec, &parent).await?;
        let parent = state.run(&spec.parent)?;
        let before = state.stages(&parent.id)?;
        let planned = plan_rerun(spec, &source, &parent, &before)?;
        let executor = self.executor_named(Some(&planned.pipeline.executor))?;
        let store = self.run_store(&planned.pipeline)?;
        let plan = RerunPlan {
            executes: planned.selection.iter().cloned().collect(),
            reuses: planned.reuse.keys().cloned().collect(),
        };
        let mut request = RunRequest::new(
            id,
            Arc::new(planned.pipeline),
            source.file,
            source.spec_digest,
        );
        request.params = planned.params;
        request.trigger = if spec.retry { "retry" } else { "rerun" }.into();
        request.parent = Some(parent.id.clone());
        request.selection = Some(planned.selection);
        request.reuse = planned.reuse;
        request.overrides = planned.overrides;
        // A rerun executes what it selected, whatever the cache holds; a retry may hit.
        request.cache = CacheMode {
            read: spec.retry && !spec.no_cache,
            write: !spec.no_cache,
        };
        request.executor = Some(executor);
        request.store = Some(store);
        Ok((request, plan))
    }

    async fn end_parent(&self, spec: &RerunSpec, parent: &RunRecord) -> Result<(), Refusal> {
        if parent.phase.is_terminal() {
            return Ok(());
        }
        let silent = self
            .state()
            .stale_runs(&stale_before())?
            .contains(&parent.id);
        let ours = parent.engine_pid == Some(i64::from(std::process::id()));
        if (ours || parent.engine_pid.is_some_and(alive)) && !silent {
            return Err(Refusal::Busy(format!(
                "run `{}` is still running; wait for it or cancel it first",
                parent.id
            )));
        }
        let verb = if spec.retry { "retry" } else { "rerun" };
        let reason = format!(
            "its engine stopped; ended by `drivetrain {verb}`, which started a new run from it"
        );
        self.end_orphan(parent, Phase::Error, &reason).await?;
        eprintln!(
            "run {} was orphaned (its engine stopped): ended as Error; the {verb} goes on from it",
            parent.id
        );
        Ok(())
    }
}

/// What a rerun runs: the pipeline (with images applied), the stages it executes, what it
/// takes from the parent, its params and what it overrode.
struct Planned {
    pipeline: Pipeline,
    selection: BTreeSet<StageName>,
    reuse: BTreeMap<StageName, Reused>,
    params: BTreeMap<String, serde_json::Value>,
    overrides: serde_json::Value,
}

fn plan_rerun(
    spec: &RerunSpec,
    source: &RerunSource,
    parent: &RunRecord,
    before: &[StageRecord],
) -> Result<Planned, Refusal> {
    let mut pipeline = source.pipeline.clone();
    // What it takes from the parent are the parent's project's artifacts.
    if pipeline.project != parent.project {
        return Err(Refusal::Usage(format!(
            "run {} is of project `{}`, the pipeline now of `{}`: a rerun does not take \
             artifacts across projects (start a new run instead)",
            parent.id, parent.project, pipeline.project
        )));
    }
    let selected = select(spec, &pipeline, &source.file, parent, before)?;
    let reuse = reused(&pipeline, parent, before, &selected);
    let missing = missing_upstream(&pipeline, parent, before, &selected, &reuse);
    if !missing.is_empty() {
        return Err(Refusal::Usage(missing.join("\n")));
    }
    // Params: the parent's, then the overrides.
    let mut raw: Vec<(String, String)> = parent
        .params
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| pipeline.params.iter().any(|p| &p.name == *k))
        .map(|(k, v)| (k.clone(), crate::template::value_text(v)))
        .collect();
    raw.extend(spec.params.iter().cloned());
    let params = pipeline
        .resolve_params(&raw)
        .map_err(|errors| Refusal::Usage(errors.join("\n")))?;
    let selection = selected
        .iter()
        .map(|id| pipeline.stage(*id).name.clone())
        .collect();
    let images = apply_images(&mut pipeline, &spec.images).map_err(Refusal::Usage)?;
    let overridden: serde_json::Map<_, _> = spec
        .params
        .iter()
        .map(|(k, _)| (k.clone(), params.get(k).cloned().unwrap_or_default()))
        .collect();
    Ok(Planned {
        pipeline,
        selection,
        reuse,
        params,
        overrides: json!({ "params": overridden, "images": images }),
    })
}

/// The stages a rerun executes (never hooks: they run anyway): for a retry every stage
/// that did not succeed and what depends on it; else those named.
fn select(
    spec: &RerunSpec,
    pipeline: &Pipeline,
    file: &str,
    parent: &RunRecord,
    before: &[StageRecord],
) -> Result<Selection, Refusal> {
    let mut selected = Selection::new();
    if spec.retry {
        for s in &pipeline.stages {
            let ok = before
                .iter()
                .any(|b| b.stage == s.name && b.phase == Phase::Succeeded);
            if !ok && s.hook.is_none() {
                selected.extend(pipeline.descendants(s.id));
            }
        }
        if selected.is_empty() {
            return Err(Refusal::Nothing(format!(
                "every stage of run {} succeeded; nothing to retry",
                parent.id
            )));
        }
    } else {
        let ids = |names: &[StageName]| stage_ids(pipeline, file, names);
        let (stages, from, only) = match (ids(&spec.stages), ids(&spec.from), ids(&spec.only)) {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            (a, b, c) => {
                let errors: Vec<String> =
                    [a.err(), b.err(), c.err()].into_iter().flatten().collect();
                return Err(Refusal::Usage(errors.join("\n")));
            }
        };
        if stages.is_empty() && from.is_empty() && only.is_empty() {
            return Err(Refusal::Usage(
                "say what to rerun: --stage S [--downstream], --from S or --only S1,S2".into(),
            ));
        }
        for id in stages {
            selected.insert(id);
            if spec.downstream {
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
fn stage_ids(pipeline: &Pipeline, file: &str, names: &[StageName]) -> Result<Vec<StageId>, String> {
    names
        .iter()
        .map(|n| {
            pipeline.stage_by_name(n).map(|s| s.id).ok_or_else(|| {
                let all: Vec<&str> = pipeline.stages.iter().map(|s| s.name.as_str()).collect();
                let mut m = format!("no stage named `{n}` in {file}");
                if let Some(h) = crate::diag::did_you_mean(n, all) {
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
) -> BTreeMap<StageName, Reused> {
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
            Reused {
                outputs,
                values: b.values.clone(),
                provenance: Provenance {
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
    reuse: &BTreeMap<StageName, Reused>,
) -> Vec<String> {
    let name_of = |id: StageId| pipeline.stage(id).name.clone();
    let mut missing = Vec::new();
    for id in selected {
        for up in pipeline.ancestors(*id) {
            let name = name_of(up);
            if selected.contains(&up) || reuse.contains_key(&name) {
                continue;
            }
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
        let template = crate::template::Template::parse(image)
            .map_err(|_| format!("--image {stage}={image}: not a valid image"))?;
        let s = &mut pipeline.stages[id.index()];
        if let Action::Command { image: i, .. } = &mut s.action {
            *i = Some(template.clone());
        }
        s.image = Some(template);
        applied.insert(stage.clone(), json!(image));
    }
    Ok(applied)
}
