//! What runs left behind: lineage (where an artifact came from, what was made from it)
//! and retention (which artifacts nothing refers to any more).
//!
//! Lineage is a graph of two kinds of node: artifacts (by digest) and stage executions
//! (`RUN/STAGE`). A stage that ran points to the artifacts it read (recorded when it
//! started) and from the artifacts it published; cached and reused stages point to the
//! run that made their outputs. Walking up from an artifact reaches the source stages and
//! the params and definitions they ran with; walking down finds everything derived.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;
use serde_json::Value;

use crate::artifacts::{ArtifactRef, ArtifactStore};
use crate::state::{Origin, Phase, RunId, StateError, StateStore};

/// A node of the lineage graph.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Node {
    Artifact {
        digest: String,
        manifest: String,
        /// Where its objects are.
        url: String,
        run: String,
        stage: String,
        output: String,
    },
    Stage {
        run: String,
        stage: String,
        pipeline: String,
        /// How it came by its outputs (`origin`, `origin_run`).
        #[serde(flatten)]
        origin: Origin,
        params: Value,
        /// The rendered definition (command, image, env, …).
        definition: Value,
        /// A search's stage: the trial whose outputs are the stage's (`trial`,
        /// `params`, `metric`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trial: Option<Value>,
        /// A plugin step's stage: the plugin (`name`, `version`, `digest`, `uses`, and a
        /// git plugin's `commit`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plugin: Option<Box<Value>>,
    },
}

impl Node {
    /// The run it belongs to.
    pub fn run(&self) -> &str {
        match self {
            Node::Artifact { run, .. } | Node::Stage { run, .. } => run,
        }
    }
}

/// The project of a lineage root (`RUN/STAGE`, or an artifact's digest): its run's.
pub fn root_project(state: &dyn StateStore, root: &str) -> Option<String> {
    let run = match root.starts_with("sha256:") {
        true => state.artifact(root).ok()??.run_id,
        false => root.split('/').next()?.to_owned(),
    };
    state.run(&RunId(run)).ok().map(|r| r.project)
}

/// A lineage graph rooted at what was asked about.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct Lineage {
    pub roots: Vec<String>,
    /// Node id (`RUN/STAGE` or a digest) → node.
    pub nodes: BTreeMap<String, Node>,
    /// (from, to): data flows from → to.
    pub edges: BTreeSet<(String, String)>,
}

/// Which way to walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// To the sources.
    Upstream,
    /// To everything derived.
    Downstream,
}

/// A lineage target that does not name anything recorded.
#[derive(Debug, thiserror::Error)]
pub enum LineageError {
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    State(#[from] StateError),
}

fn stage_id(run: &str, stage: &str) -> String {
    format!("{run}/{stage}")
}

/// The target an artifact's store URL names (`…/runs/RUN/STAGE/ATTEMPT/OUTPUT`, as
/// `lineage` prints it, or a `file://` store's path): `RUN/STAGE/OUTPUT`.
fn stored_target(url: &str) -> Option<String> {
    let (_, tail) = url.rsplit_once("/runs/")?;
    match tail.trim_end_matches('/').split('/').collect::<Vec<_>>()[..] {
        [run, stage, attempt, output] if attempt.bytes().all(|b| b.is_ascii_digit()) => {
            Some(format!("{run}/{stage}/{output}"))
        }
        _ => None,
    }
}

/// `target` if it is a short digest as `lineage` prints one: `sha256:` and 8 to 63 hex
/// digits.
fn short_digest(target: &str) -> Option<&str> {
    let hex = target.strip_prefix("sha256:")?;
    let ok = (8..64).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then_some(target)
}

/// The one artifact whose digest starts with `short`, or why there is none.
fn whole_digest(state: &dyn StateStore, short: &str) -> Result<String, LineageError> {
    let found = state.artifacts_starting(&short.to_ascii_lowercase(), 3)?;
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(LineageError::NotFound(format!(
            "no artifact's digest starts with {short} in the state store"
        ))),
        many => Err(LineageError::NotFound(format!(
            "{short} is the start of more than one digest ({}, …): give more of it",
            many[..2].join(", ")
        ))),
    }
}

/// The starting nodes of a target: `RUN`, `RUN/STAGE`, `RUN/STAGE/OUTPUT` or a digest
/// (`sha256:…`, a unique prefix of at least 8 hex digits will do).
pub fn resolve_target(state: &dyn StateStore, target: &str) -> Result<Vec<String>, LineageError> {
    if let Some(short) = short_digest(target) {
        return whole_digest(state, short).map(|d| vec![d]);
    }
    if target.starts_with("sha256:") {
        return match state.artifact(target)? {
            Some(a) => Ok(vec![a.digest]),
            None => Err(LineageError::NotFound(format!(
                "no artifact with digest {target} in the state store"
            ))),
        };
    }
    let mut parts = target.splitn(3, '/');
    let run = RunId(parts.next().unwrap_or_default().to_owned());
    let record = state
        .run(&run)
        .map_err(|_| LineageError::NotFound(format!("no run `{}`", run.0)))?;
    let stages = state.stages(&record.id)?;
    let pick = |name: &str| {
        stages.iter().find(|s| s.stage == name).ok_or_else(|| {
            let names: Vec<&str> = stages.iter().map(|s| s.stage.as_str()).collect();
            LineageError::NotFound(format!(
                "run {} has no stage `{name}`; it has {}",
                run.0,
                crate::diag::one_of(&names)
            ))
        })
    };
    match (parts.next(), parts.next()) {
        (None, _) => Ok(stages
            .iter()
            .filter(|s| s.phase == Phase::Succeeded)
            .map(|s| stage_id(&run.0, &s.stage))
            .collect()),
        (Some(stage), None) => Ok(vec![stage_id(&run.0, &pick(stage)?.stage)]),
        (Some(stage), Some(output)) => {
            let s = pick(stage)?;
            let digest = s
                .outputs
                .get(output)
                .and_then(|o| o.get("digest"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    let names: Vec<&str> = s
                        .outputs
                        .as_object()
                        .map(|m| m.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    LineageError::NotFound(format!(
                        "stage `{stage}` of run {} has no output `{output}`; it has {}",
                        run.0,
                        crate::diag::one_of(&names)
                    ))
                })?;
            Ok(vec![digest.to_owned()])
        }
    }
}

fn outputs_of(v: &Value) -> Vec<(String, ArtifactRef)> {
    serde_json::from_value::<BTreeMap<String, ArtifactRef>>(v.clone())
        .map(|m| m.into_iter().collect())
        .unwrap_or_default()
}

/// Walks the lineage graph from `roots` in `direction`.
pub fn lineage(
    state: &dyn StateStore,
    store: &ArtifactStore,
    roots: Vec<String>,
    direction: Direction,
) -> Result<Lineage, LineageError> {
    let mut g = Lineage {
        roots: roots.clone(),
        ..Default::default()
    };
    let mut queue: VecDeque<String> = roots.into_iter().collect();
    let mut params_of: BTreeMap<String, (String, Value)> = BTreeMap::new();
    while let Some(id) = queue.pop_front() {
        if g.nodes.contains_key(&id) {
            continue;
        }
        if id.starts_with("sha256:") {
            let Some(a) = state.artifact(&id)? else {
                continue;
            };
            let producer = stage_id(&a.run_id, &a.stage);
            let prefix = a
                .manifest
                .rsplit_once("/manifests/")
                .map(|(p, _)| format!("{p}/{}", a.output))
                .unwrap_or_default();
            g.nodes.insert(
                id.clone(),
                Node::Artifact {
                    digest: a.digest.clone(),
                    manifest: a.manifest.clone(),
                    url: store.artifact_url(&prefix),
                    run: a.run_id.clone(),
                    stage: a.stage.clone(),
                    output: a.output.clone(),
                },
            );
            match direction {
                Direction::Upstream => {
                    g.edges.insert((producer.clone(), id.clone()));
                    queue.push_back(producer);
                }
                Direction::Downstream => {
                    for u in state.artifact_uses(&id)? {
                        let consumer = stage_id(&u.run_id, &u.stage);
                        g.edges.insert((id.clone(), consumer.clone()));
                        queue.push_back(consumer);
                    }
                }
            }
            continue;
        }
        let Some((run, stage)) = id.split_once('/') else {
            continue;
        };
        let run = RunId(run.to_owned());
        let Some(rec) = state.stage(&run, stage)? else {
            continue;
        };
        if !params_of.contains_key(&run.0) {
            let r = state.run(&run)?;
            params_of.insert(run.0.clone(), (r.pipeline, r.params));
        }
        let (pipeline, params) = params_of[&run.0].clone();
        g.nodes.insert(
            id.clone(),
            Node::Stage {
                run: run.0.clone(),
                stage: stage.to_owned(),
                pipeline,
                origin: rec.how.origin.clone(),
                params,
                definition: rec
                    .how
                    .provenance
                    .get("definition")
                    .cloned()
                    .unwrap_or_default(),
                trial: rec
                    .how
                    .provenance
                    .pointer("/definition/search")
                    .and_then(|_| rec.values.get("best"))
                    .cloned(),
                plugin: rec
                    .how
                    .provenance
                    .get("plugin")
                    .filter(|p| !p.is_null())
                    .map(|p| Box::new(p.clone())),
            },
        );
        match direction {
            Direction::Upstream => {
                // A cached or reused stage's outputs were made by another run's stage.
                if rec.how.origin != Origin::Ran {
                    if let Some(origin) = rec.how.origin.run() {
                        let made_by = stage_id(origin, stage);
                        g.edges.insert((made_by.clone(), id.clone()));
                        queue.push_back(made_by);
                    }
                    continue;
                }
                for (_, art) in outputs_of(&rec.how.inputs) {
                    g.edges.insert((art.digest.clone(), id.clone()));
                    queue.push_back(art.digest);
                }
            }
            Direction::Downstream => {
                for (_, art) in outputs_of(&rec.outputs) {
                    g.edges.insert((id.clone(), art.digest.clone()));
                    queue.push_back(art.digest);
                }
            }
        }
    }
    Ok(g)
}

/// Everything derived from `input`: an artifact target (see [`resolve_target`]), or a
/// source exactly as it was recorded (a drive log's store URL or absolute path, as
/// `ingest` lists it under `sources`, or a value a stage's definition holds whole),
/// which finds the stages that read it and walks down from them. Exact: a log of the
/// same name in another folder or bucket is another log.
pub fn forget(
    state: &dyn StateStore,
    store: &ArtifactStore,
    input: &str,
) -> Result<Lineage, LineageError> {
    let roots = match resolve_target(state, &stored_target(input).unwrap_or(input.to_owned())) {
        Ok(r) => r,
        // A digest names an artifact or nothing.
        Err(e @ LineageError::NotFound(_)) if input.starts_with("sha256:") => return Err(e),
        Err(LineageError::NotFound(_)) => {
            // As a JSON string: the whole value, not a part of a longer one.
            let quoted = serde_json::to_string(input).unwrap_or_default();
            let mut found = state.stages_mentioning(&quoted)?;
            // Every stage of a run a trigger started with the object (a local file's
            // object is recorded by its `file://` URL).
            let mut urls = vec![input.to_owned()];
            if input.starts_with('/') {
                urls.push(format!("file://{input}"));
            }
            for url in urls {
                for (run, _) in state.object_runs(&url)? {
                    for st in state.stages(&run)? {
                        found.push((run.clone(), st.stage.to_string()));
                    }
                }
            }
            found.sort();
            found.dedup();
            if found.is_empty() {
                return Err(LineageError::NotFound(format!(
                    "nothing recorded read `{input}`: give a run, stage or artifact digest, or a source exactly as ingest recorded it (its store URL, or a local file's absolute path)"
                )));
            }
            found
                .into_iter()
                .map(|(run, stage)| stage_id(&run.0, &stage))
                .collect()
        }
        Err(e) => return Err(e),
    };
    lineage(state, store, roots, Direction::Downstream)
}

impl Lineage {
    fn label(&self, id: &str) -> String {
        match self.nodes.get(id) {
            Some(Node::Artifact {
                run,
                stage,
                output,
                digest,
                ..
            }) => format!("{run}/{stage}/{output} ({})", short(digest)),
            Some(Node::Stage { origin, .. }) if *origin != Origin::Ran => {
                format!("{id} [{}]", origin.name())
            }
            _ => id.to_owned(),
        }
    }

    /// Graphviz DOT.
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph lineage {\n  rankdir=LR;\n");
        for (id, n) in &self.nodes {
            let shape = match n {
                Node::Artifact { .. } => "note",
                Node::Stage { .. } => "box",
            };
            out.push_str(&format!(
                "  {:?} [label={:?}, shape={shape}];\n",
                id,
                self.label(id)
            ));
        }
        for (a, b) in &self.edges {
            if self.nodes.contains_key(a) && self.nodes.contains_key(b) {
                out.push_str(&format!("  {a:?} -> {b:?};\n"));
            }
        }
        out.push_str("}\n");
        out
    }

    /// A Mermaid flowchart.
    pub fn to_mermaid(&self) -> String {
        let ids: BTreeMap<&String, String> = self
            .nodes
            .keys()
            .enumerate()
            .map(|(i, k)| (k, format!("n{i}")))
            .collect();
        let mut out = String::from("flowchart LR\n");
        for (id, n) in &self.nodes {
            let label = self.label(id).replace('"', "'");
            match n {
                Node::Artifact { .. } => out.push_str(&format!("  {}[/\"{label}\"/]\n", ids[id])),
                Node::Stage { .. } => out.push_str(&format!("  {}[\"{label}\"]\n", ids[id])),
            }
        }
        for (a, b) in &self.edges {
            if let (Some(x), Some(y)) = (ids.get(a), ids.get(b)) {
                out.push_str(&format!("  {x} --> {y}\n"));
            }
        }
        out
    }

    /// An indented tree from each root, following edges in `direction`; a node reached
    /// twice is printed once and then referred to.
    pub fn to_text(&self, direction: Direction) -> String {
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in &self.edges {
            let (from, to) = match direction {
                Direction::Upstream => (b.as_str(), a.as_str()),
                Direction::Downstream => (a.as_str(), b.as_str()),
            };
            next.entry(from).or_default().push(to);
        }
        let mut out = String::new();
        let mut seen = BTreeSet::new();
        // Depth-first with an explicit stack: lineage can be thousands of stages deep.
        let mut stack: Vec<(&str, usize)> =
            self.roots.iter().rev().map(|r| (r.as_str(), 0)).collect();
        while let Some((id, depth)) = stack.pop() {
            let indent = "  ".repeat(depth);
            if !seen.insert(id) {
                out.push_str(&format!("{indent}{} (above)\n", self.label(id)));
                continue;
            }
            out.push_str(&format!("{indent}{}", self.label(id)));
            if let Some(Node::Stage {
                params,
                definition,
                trial,
                plugin,
                ..
            }) = self.nodes.get(id)
            {
                if let Some(p) = plugin {
                    let text = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
                    out.push_str(&format!(
                        "  plugin={}@{} {}",
                        text("name"),
                        text("version"),
                        text("digest")
                    ));
                    if let Some(c) = p["commit"].as_str() {
                        out.push_str(&format!(" commit={c}"));
                    }
                }
                if let Some(t) = trial {
                    out.push_str(&format!(
                        "  trial={} trial_params={}",
                        t["trial"], t["params"]
                    ));
                }
                if let Some(cmd) = definition.get("command") {
                    out.push_str(&format!("  command={cmd}"));
                }
                if let Some(image) = definition.get("image") {
                    out.push_str(&format!("  image={image}"));
                }
                if params.as_object().is_some_and(|p| !p.is_empty()) {
                    out.push_str(&format!("  params={params}"));
                }
            }
            if let Some(Node::Artifact { url, .. }) = self.nodes.get(id) {
                out.push_str(&format!("  {url}"));
            }
            out.push('\n');
            for n in next.get(id).into_iter().flatten().rev() {
                stack.push((n, depth + 1));
            }
        }
        out
    }
}

fn short(digest: &str) -> String {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() > 12 => format!("sha256:{}", &h[..12]),
        _ => digest.to_owned(),
    }
}

/// What `gc` found (and, with `apply`, deleted).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Runs whose objects are all kept (recent, or still running).
    pub kept_runs: usize,
    /// Artifacts of older runs still kept because something refers to them.
    pub referenced: usize,
    /// Cache entries older than the cut-off (removed with `apply`).
    pub expired_cache_entries: usize,
    /// The objects that nothing refers to: key → size.
    pub unreferenced: BTreeMap<String, u64>,
    /// Objects of runs this state store does not know (another home sharing the store):
    /// never deleted.
    pub unknown_run_objects: usize,
    pub deleted: bool,
}

impl GcReport {
    pub fn bytes(&self) -> u64 {
        self.unreferenced.values().sum()
    }
}

/// Finds (and with `apply` deletes) the objects under `runs/` that belong to runs older
/// than `cutoff` (RFC 3339) and that no kept run, no cache entry younger than `cutoff`
/// and no run still running refers to. Manifests go before the objects they list, so an
/// interrupted gc never leaves a manifest whose objects are gone.
pub async fn gc(
    state: &dyn StateStore,
    store: &ArtifactStore,
    cutoff: &str,
    apply: bool,
) -> Result<GcReport, GcError> {
    let mut report = GcReport::default();
    let runs = state.list_runs(usize::MAX >> 1)?;
    let known: BTreeSet<String> = runs.iter().map(|r| r.id.0.clone()).collect();
    let kept: BTreeSet<String> = runs
        .iter()
        .filter(|r| r.created_at.as_str() >= cutoff || !r.phase.is_terminal())
        .map(|r| r.id.0.clone())
        .collect();
    report.kept_runs = kept.len();
    // Everything a kept run or a live cache entry refers to: outputs, and what stages read.
    let mut refs: BTreeSet<ArtifactRef> = BTreeSet::new();
    for run in &kept {
        for s in state.stages(&RunId(run.clone()))? {
            refs.extend(outputs_of(&s.outputs).into_iter().map(|(_, a)| a));
            refs.extend(outputs_of(&s.how.inputs).into_iter().map(|(_, a)| a));
        }
    }
    for e in state.cache_entries()? {
        if e.created_at.as_str() < cutoff {
            report.expired_cache_entries += 1;
        } else {
            refs.extend(outputs_of(&e.outputs).into_iter().map(|(_, a)| a));
        }
    }
    let mut keep_keys: BTreeSet<String> = BTreeSet::new();
    // Every referenced manifest is read, a kept run's too: the fan-in of a map stage lists
    // the objects of other attempts, possibly of older runs.
    for a in &refs {
        let run = a.manifest.split('/').nth(1).unwrap_or_default();
        if !kept.contains(run) {
            report.referenced += 1;
        }
        // A manifest already gone refers to nothing.
        if let Ok(keys) = store.object_keys(a).await {
            keep_keys.extend(keys);
        }
    }
    for (key, size) in store.list_sizes("runs").await? {
        let run = key.split('/').nth(1).unwrap_or_default();
        if kept.contains(run) || keep_keys.contains(&key) {
            continue;
        }
        if !known.contains(run) {
            report.unknown_run_objects += 1;
            continue;
        }
        report.unreferenced.insert(key, size);
    }
    if apply {
        state.expire_cache_entries(cutoff)?;
        let (manifests, objects): (Vec<String>, Vec<String>) = report
            .unreferenced
            .keys()
            .cloned()
            .partition(|k| k.contains("/manifests/"));
        store.delete(&manifests).await?;
        store.delete(&objects).await?;
        report.deleted = true;
    }
    Ok(report)
}

/// A gc that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Store(#[from] crate::artifacts::ArtifactError),
}
