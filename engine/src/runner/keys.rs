//! Cache keys of stage attempts: what a stage's outputs depend on (its definition after
//! templating, its inputs' digests, and what it reads from outside the run, resolved
//! now), whether it may be cached at all, and whether an earlier entry answers for it.
//! The key's components are described in [`crate::cache`].

use std::collections::BTreeMap;

use serde_json::Value;

use crate::artifacts::ArtifactRef;
use crate::cache::ResolveError;
use crate::plan::{Action, MapSource, Stage, StageId};
use crate::template::{value_text, Ref, Template};

use super::{humanize, lookup_value, Ctx, RunError, StageResult};

/// Why a stage's outputs may not come from the cache (and are not stored in it).
#[derive(Debug, thiserror::Error)]
pub(super) enum NotCacheable {
    #[error("hooks always run")]
    Hook,
    #[error("step `{0}` writes the model registry: it runs every time")]
    WritesRegistry(String),
    #[error("it declares no outputs")]
    NoOutputs,
    #[error("`cache: {{enabled: false}}`")]
    Disabled,
    #[error("the run has --no-cache")]
    NoCache,
    /// References outside the run its key holds that could not be read.
    #[error("{}", unread_text(.0))]
    Unread(Vec<(String, ResolveError)>),
}

fn unread_text(unread: &[(String, ResolveError)]) -> String {
    let each: Vec<String> = unread
        .iter()
        .map(|(reference, why)| format!("`{reference}` could not be read: {why}"))
        .collect();
    each.join("; ")
}

/// Whether a stage's outputs may come from the cache, or why not.
pub(super) fn cacheable(ctx: &Ctx, stage: &Stage) -> Result<(), NotCacheable> {
    if stage.hook.is_some() {
        return Err(NotCacheable::Hook);
    }
    if let Action::Step {
        registry: true,
        name,
        ..
    } = &stage.action
    {
        return Err(NotCacheable::WritesRegistry(name.clone()));
    }
    if stage.outputs.is_empty() {
        return Err(NotCacheable::NoOutputs);
    }
    if !stage.cache.enabled {
        return Err(NotCacheable::Disabled);
    }
    if !ctx.opts.request.cache.read && !ctx.opts.request.cache.write {
        return Err(NotCacheable::NoCache);
    }
    Ok(())
}

/// The artifacts a stage reads, by input name.
pub(super) fn input_artifacts(
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> BTreeMap<String, ArtifactRef> {
    stage
        .inputs
        .iter()
        .filter_map(|i| {
            let art = upstream.get(&i.stage)?.outputs.get(&i.output)?;
            Some((i.name.clone(), art.clone()))
        })
        .collect()
}

/// Adds the current value of each reference outside the run to `parts` (component
/// named by the reference: `registry:risk-model@production` → `2`); `Err` says why the
/// stage cannot be looked up in the cache when one cannot be read.
pub(super) async fn resolve_external(
    ctx: &Ctx,
    external: &[String],
    parts: &mut crate::cache::KeyParts,
) -> Result<(), NotCacheable> {
    let mut unread = Vec::new();
    for reference in external {
        let value = match &ctx.opts.resolver {
            Some(r) => r.resolve(reference, ctx.artifacts.url()).await,
            None => Err(ResolveError::NoResolver),
        };
        match value {
            Ok(v) => parts.plain(reference.clone(), v),
            Err(why) => {
                parts.plain(reference.clone(), "unreadable".into());
                unread.push((reference.clone(), why));
            }
        }
    }
    match unread.is_empty() {
        true => Ok(()),
        false => Err(NotCacheable::Unread(unread)),
    }
}

/// The components of a stage's cache key (see [`crate::cache`]), and the references
/// outside the run it reads, rendered, for [`resolve_external`].
pub(super) fn key_parts(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> (crate::cache::KeyParts, Vec<String>) {
    use serde_json::json;
    let lookup = |r: &Ref| match r {
        // Paths differ per attempt (and the pipeline's folder per clone); what they
        // hold is keyed by digest below.
        Ref::Input(_) | Ref::Output(_) | Ref::Item(_) | Ref::PipelineDir | Ref::StepDir => None,
        other => lookup_value(&ctx.pipeline, ctx, upstream, other),
    };
    let render = |t: &Template| t.render(|r| lookup(r).map(|v| value_text(&v)));
    let mut parts = crate::cache::KeyParts {
        definition: json!({}),
        ..Default::default()
    };
    // A cache is a project's own: another project's identical stage has another key.
    if ctx.run.project != crate::access::DEFAULT_PROJECT {
        parts.plain("project".into(), ctx.run.project.clone());
    }
    let mut external = Vec::new();
    for (i, t) in stage.cache.key.iter().enumerate() {
        let entry = render(t);
        match crate::cache::is_external(&entry) {
            true => external.push(entry),
            false => parts.plain(format!("key[{i}]"), entry),
        }
    }
    match &stage.action {
        Action::Command {
            image,
            argv,
            workdir,
        } => {
            let argv: Vec<String> = argv.iter().map(render).collect();
            let workdir = workdir.as_ref().map(render);
            // Scripts a command names are part of what it does.
            let named =
                super::folder::named_files(&argv, workdir.as_deref(), ctx.folder.as_deref());
            for (name, path) in named {
                if let Some(d) = ctx.files.get(&path) {
                    parts.plain(format!("file:{name}"), d);
                }
            }
            parts.field("command", json!(argv));
            parts.field("workdir", json!(workdir));
            // A plugin step's files are keyed by their digest, its folder by `step.dir`.
            if let Some(p) = &stage.plugin {
                parts.plain("step".into(), p.label());
            }
            if let Some(i) = image {
                parts.plain("image".into(), render(i));
            }
        }
        Action::Step {
            name,
            version,
            config,
            reads,
            ..
        } => {
            external.extend(reads.iter().map(render));
            parts.plain("step".into(), format!("{name}@{version}"));
            let lookup = |r: &Ref| lookup(r);
            parts.field("config", crate::template::render_value(config, &lookup));
            if let Some(i) = &stage.image {
                parts.plain("image".into(), render(i));
            }
        }
        Action::Approval { role, min, .. } => {
            parts.field("approval", json!({"role": role, "min": min}));
        }
    }
    let env: Vec<(String, String)> = stage
        .env
        .iter()
        .map(|(k, t)| (k.clone(), render(t)))
        .collect();
    if !env.is_empty() {
        parts.field("env", json!(env));
    }
    if !stage.secrets.is_empty() {
        let names: Vec<String> = stage
            .secrets
            .iter()
            .map(|s| format!("{}/{}", s.name, s.key.as_deref().unwrap_or("*")))
            .collect();
        parts.field("secrets", json!(names));
    }
    let io = json!({
        "inputs": stage.inputs.iter().map(|i| json!([i.name, i.output, i.mode, i.optional])).collect::<Vec<_>>(),
        "outputs": stage.outputs.iter().map(|o| json!([o.name, o.mode])).collect::<Vec<_>>(),
    });
    parts.field("io", io);
    if let Some(m) = &stage.map {
        map_parts(ctx, m, upstream, &mut parts);
    }
    // A search's result is its best trial: what it searched, how, and from which seed.
    if let Some(s) = &stage.search {
        parts.field("search", serde_json::to_value(s).unwrap_or_default());
    }
    if let Some(d) = &stage.distributed {
        parts.field(
            "distributed",
            json!([format!("{:?}", d.framework), d.workers, d.slots_per_worker]),
        );
    }
    for (name, art) in input_artifacts(stage, upstream) {
        parts.plain(format!("input:{name}"), art.digest);
    }
    external.sort();
    external.dedup();
    (parts, external)
}

/// What a map's key holds: where its items come from and, from an upstream output, that
/// output's digest.
fn map_parts(
    ctx: &Ctx,
    m: &crate::plan::MapPlan,
    upstream: &BTreeMap<StageId, StageResult>,
    parts: &mut crate::cache::KeyParts,
) {
    use serde_json::json;
    let source = match &m.source {
        MapSource::Items(items) => json!({"items": items}),
        MapSource::Param(p) => json!({"items": ctx.params.get(p)}),
        MapSource::From { stage, output } => {
            json!({"from": format!("{}.{output}", ctx.pipeline.stage(*stage).name)})
        }
    };
    parts.field("map", source);
    if let MapSource::From { stage: s, output } = &m.source {
        if let Some(art) = upstream.get(s).and_then(|r| r.outputs.get(output)) {
            parts.plain("map-items".into(), art.digest.clone());
        }
    }
}

/// A usable cache entry.
pub(super) struct Hit {
    pub(super) run_id: String,
    pub(super) outputs: BTreeMap<String, ArtifactRef>,
    pub(super) values: Value,
}

/// Why the cache held nothing usable for a stage's key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Miss {
    #[error("no entry has this key")]
    NoEntry,
    #[error("the entry from run {run} ({created}) is older than `max_age` {max_age}")]
    TooOld {
        run: String,
        created: String,
        max_age: String,
    },
    #[error("the entry's outputs do not parse")]
    Unparsable,
    #[error("the entry has no output `{0}`")]
    NoOutput(String),
    #[error("output `{output}` of the entry from run {run} is gone from the store")]
    Gone { output: String, run: String },
    #[error(
        "the entry is of run {run} of project `{project}`: caches are not shared across projects"
    )]
    OtherProject { run: String, project: String },
}

/// The cache entry for `key` if it exists, is young enough, covers every declared output
/// and its artifacts are still in the store; otherwise why not.
pub(super) async fn cache_hit(
    ctx: &Ctx,
    stage: &Stage,
    key: &str,
) -> Result<Result<Hit, Miss>, RunError> {
    let Some(entry) = ctx.state.cache_entry(key)? else {
        return Ok(Err(Miss::NoEntry));
    };
    // The key names the project already; an entry of another project's run (a store
    // shared by hand, a key written before projects) is not taken either.
    // (An entry whose run is forgotten has only its key to go by.)
    if let Ok(owner) = ctx.state.run(&crate::state::RunId(entry.run_id.clone())) {
        if owner.project != ctx.run.project {
            return Ok(Err(Miss::OtherProject {
                run: entry.run_id,
                project: owner.project,
            }));
        }
    }
    if let Some(max_age) = stage.cache.max_age {
        let created = chrono::DateTime::parse_from_rfc3339(&entry.created_at).ok();
        let age = created.map(|c| chrono::Utc::now().signed_duration_since(c));
        let young = age
            .and_then(|a| a.to_std().ok())
            .is_some_and(|a| a <= max_age);
        if !young {
            return Ok(Err(Miss::TooOld {
                run: entry.run_id,
                created: entry.created_at,
                max_age: humanize(max_age),
            }));
        }
    }
    let Ok(outputs) =
        serde_json::from_value::<BTreeMap<String, ArtifactRef>>(entry.outputs.clone())
    else {
        return Ok(Err(Miss::Unparsable));
    };
    if let Some(o) = stage
        .outputs
        .iter()
        .find(|o| !outputs.contains_key(&o.name))
    {
        return Ok(Err(Miss::NoOutput(o.name.clone())));
    }
    for (name, art) in &outputs {
        if ctx.artifacts.manifest(art).await.is_err() {
            return Ok(Err(Miss::Gone {
                output: name.clone(),
                run: entry.run_id,
            }));
        }
    }
    Ok(Ok(Hit {
        run_id: entry.run_id,
        outputs,
        values: entry.values,
    }))
}
