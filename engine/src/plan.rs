//! The planned pipeline: validated, resolved and ready to run.
//!
//! [`Pipeline`] is what [`crate::validate`] produces from a spec: defaults applied,
//! durations and quantities parsed, templates and conditions parsed, every reference
//! resolved to a [`StageId`], and the DAG built with petgraph (edges from `needs`, and
//! implied by `inputs`, `map.from` and `stages.X.values` references). Nothing later reads
//! the spec types. Subgraph selection (`--only`, `--from`, `--to`) lives here because
//! `plan`, `run` and `rerun` all use it.

use crate::names::StageName;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::time::Duration;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::{Dfs, Reversed};
use petgraph::Direction;
use serde::Serialize;
use serde_json::Value;

use crate::expr::Expr;
use crate::spec::{
    Catchup, Concurrency, Framework, IoMode, ParamType, PipelineSpec, RetryOn, SecretRef,
    SnapshotSpec, Toleration, VolumeSpec,
};
use crate::template::{Ref, Template};
use crate::units::Quantity;

/// A stage's index in [`Pipeline::stages`] (document order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct StageId(pub u32);

impl StageId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for StageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A validated pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub name: String,
    pub description: Option<String>,
    /// The project its runs belong to (`default` unless `project:` says).
    pub project: String,
    pub params: Vec<Param>,
    pub schedule: Option<Schedule>,
    /// What starts runs besides the CLI, the API and cron, by name.
    pub triggers: BTreeMap<String, crate::events::Trigger>,
    /// Where its runs are told of.
    pub notify: Vec<crate::events::Sink>,
    /// A run still going this long after it started is told of (`notify` event `deadline`).
    pub deadline: Option<Duration>,
    pub store: Option<String>,
    /// `local` unless `defaults.executor` says otherwise.
    pub executor: String,
    pub stages: Vec<Stage>,
    /// Edges point from producer to consumer.
    pub graph: DiGraph<StageId, EdgeKind>,
    /// A topological order; among ready stages, document order first.
    pub order: Vec<StageId>,
    /// The spec as written, for digests and the API.
    pub spec: PipelineSpec,
}

/// A typed parameter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Param {
    pub name: String,
    pub kind: ParamType,
    pub default: Option<Value>,
    pub allowed: Option<Vec<Value>>,
    pub description: Option<String>,
}

/// A validated cron schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub cron: String,
    pub timezone: chrono_tz::Tz,
    pub concurrency: Concurrency,
    pub catchup: Catchup,
    pub max_catchup: u32,
    pub suspend: bool,
}

/// Why an edge exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// `needs:`
    Needs,
    /// `inputs:` (the input's name and the producer's output).
    Input { input: String, output: String },
    /// `map.from`
    MapFrom { output: String },
    /// A `stages.X.values` reference in a template or condition.
    Value,
}

/// What a stage executes.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A built-in step with its (untemplated) config.
    Step {
        name: String,
        version: String,
        config: Value,
        /// The step writes the model registry (see [`crate::step::Step::writes_registry`]).
        registry: bool,
        /// What the step reads from outside its inputs (see [`crate::step::Step::reads`]),
        /// as cache-key templates.
        reads: Vec<Template>,
    },
    /// A command: argv elements, each a template.
    Command {
        image: Option<Template>,
        argv: Vec<Template>,
        workdir: Option<Template>,
    },
    /// A wait for people: nothing runs.
    Approval {
        /// The approval role a decider holds.
        role: String,
        /// Distinct approvals needed.
        min: u32,
        timeout: Option<Duration>,
        on_timeout: crate::spec::OnTimeout,
    },
}

/// An input resolved to its producer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Input {
    pub name: String,
    pub stage: StageId,
    pub output: String,
    pub optional: bool,
    pub mode: IoMode,
}

/// An output declaration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Output {
    pub name: String,
    pub mode: IoMode,
}

/// Where a map stage's items come from.
#[derive(Debug, Clone, PartialEq)]
pub enum MapSource {
    Items(Vec<Value>),
    Param(String),
    From { stage: StageId, output: String },
}

/// Fan-out of one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct MapPlan {
    pub source: MapSource,
    pub max_parallel: Option<u32>,
    pub min_success_ratio: f64,
}

/// A resolved retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub limit: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Empty: retry every failure.
    pub on: Vec<RetryOn>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            limit: 0,
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(600),
            on: Vec::new(),
        }
    }
}

/// A resolved cache policy.
#[derive(Debug, Clone, PartialEq)]
pub struct CachePolicy {
    pub enabled: bool,
    pub max_age: Option<Duration>,
    /// `cache.key`: more key components, each a template (see [`crate::spec::CacheSpec`]).
    pub key: Vec<Template>,
}

/// Parsed resources.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub gpu: Option<u32>,
    pub shm: Option<Quantity>,
    pub ephemeral_storage: Option<Quantity>,
}

/// Distributed execution.
#[derive(Debug, Clone, PartialEq)]
pub struct Distributed {
    pub framework: Framework,
    pub workers: u32,
    pub slots_per_worker: u32,
}

/// A stage's resolved `scheduling`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduling {
    /// The queue it named (`default` locally when none; the executor's settings' on a
    /// cluster).
    pub queue: Option<String>,
    pub priority: Priority,
    pub preemptible: bool,
    pub grace: Duration,
    pub topology: Option<Topology>,
}

impl Scheduling {
    /// The queue's name locally.
    pub fn queue(&self) -> &str {
        self.queue.as_deref().unwrap_or("default")
    }
}

impl Default for Scheduling {
    fn default() -> Self {
        Scheduling {
            queue: None,
            priority: Priority::Value(0),
            preemptible: false,
            grace: Duration::from_secs(30),
            topology: None,
        }
    }
}

/// A priority: a number, or a class's name (resolved where it is used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Priority {
    Value(i64),
    Class(String),
}

/// A topology level a stage's pods must (`required`) or should share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub level: String,
    pub required: bool,
}

/// A resolved stage.
#[derive(Debug, Clone)]
pub struct Stage {
    pub id: StageId,
    pub name: StageName,
    pub description: Option<String>,
    pub action: Action,
    /// Defaults, then the stage's `env`, then `run.env`; later wins.
    pub env: Vec<(String, Template)>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<Output>,
    /// The condition and its source text.
    pub when: Option<(Expr, String)>,
    pub map: Option<MapPlan>,
    /// A search: the stage runs as trials, its result the best one's.
    pub search: Option<crate::search::SearchPlan>,
    /// Set for hook stages, which run after the rest of the run.
    pub hook: Option<crate::spec::Hook>,
    pub retries: RetryPolicy,
    pub timeout: Option<Duration>,
    /// The stage still running this long after it started is told of (not stopped).
    pub deadline: Option<Duration>,
    pub cache: CachePolicy,
    pub resources: Resources,
    pub distributed: Option<Distributed>,
    pub volumes: Vec<VolumeSpec>,
    pub snapshot: Option<SnapshotSpec>,
    pub secrets: Vec<SecretRef>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub network: crate::spec::Network,
    /// Where the stage's job goes on a Slurm cluster.
    pub slurm: Option<crate::spec::SlurmSpec>,
    pub scheduling: Scheduling,
    /// The container image on Kubernetes (`run.image` or `defaults.image`).
    pub image: Option<Template>,
    /// The plugin step the stage uses (its command is the step's), for keys and records.
    pub plugin: Option<crate::plugin::PluginId>,
}

impl Stage {
    /// Where the stage reads the pipeline file's folder (a relative `run.workdir`,
    /// `{{ pipeline.dir }}`), as YAML paths: a pipeline posted to a server has no folder.
    pub fn folder_uses(&self) -> Vec<String> {
        use crate::template::{Part, Ref};
        let names_dir = |t: &Template| t.refs().any(|(r, _)| *r == Ref::PipelineDir);
        let mut uses = Vec::new();
        let at = |field: &str| format!("stages.{}.{field}", self.name);
        if let Action::Command { argv, workdir, .. } = &self.action {
            if let Some(w) = workdir {
                let relative = matches!(w.parts.first(), Some(Part::Lit(l)) if !l.starts_with('/'));
                if relative || names_dir(w) {
                    uses.push(at("run.workdir"));
                }
            }
            if argv.iter().any(names_dir) {
                uses.push(at("run.command"));
            }
        }
        for (name, t) in &self.env {
            if names_dir(t) {
                uses.push(at(&format!("env.{name}")));
            }
        }
        uses
    }

    /// The GPUs an attempt of the stage claims: `resources.gpu` for each rank.
    /// The CPU (thousandths of a core) and memory (bytes) an attempt of the stage
    /// declares: `resources.cpu` and `resources.memory` for each rank.
    pub fn cpu_and_memory(&self) -> (u64, u64) {
        let ranks = self.distributed.as_ref().map(|d| d.workers).unwrap_or(1) as f64;
        let of = |q: &Option<crate::units::Quantity>, unit: f64| {
            q.as_ref()
                .map_or(0, |q| (q.value.max(0.0) * unit * ranks).ceil() as u64)
        };
        (
            of(&self.resources.cpu, 1000.0),
            of(&self.resources.memory, 1.0),
        )
    }

    pub fn gpus(&self) -> usize {
        let per = self.resources.gpu.unwrap_or(0) as usize;
        per * self
            .distributed
            .as_ref()
            .map(|d| d.workers as usize)
            .unwrap_or(1)
    }
}

impl Pipeline {
    /// Every objects trigger watching a folder's path watches it under `folder` (the
    /// pipeline file's).
    pub fn sources_in_folder(&mut self, folder: &std::path::Path) {
        for t in self.triggers.values_mut() {
            if let crate::events::Watch::Objects(o) = &mut t.watch {
                o.in_folder(folder);
            }
        }
    }
}

impl Pipeline {
    pub fn stage(&self, id: StageId) -> &Stage {
        &self.stages[id.index()]
    }

    pub fn stage_by_name(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name == name)
    }

    fn node(&self, id: StageId) -> NodeIndex {
        NodeIndex::new(id.index())
    }

    /// Direct upstream stages, each once, in document order.
    pub fn upstream(&self, id: StageId) -> Vec<StageId> {
        self.neighbors(id, Direction::Incoming)
    }

    /// Direct downstream stages, each once, in document order.
    pub fn downstream(&self, id: StageId) -> Vec<StageId> {
        self.neighbors(id, Direction::Outgoing)
    }

    fn neighbors(&self, id: StageId, dir: Direction) -> Vec<StageId> {
        let set: BTreeSet<StageId> = self
            .graph
            .neighbors_directed(self.node(id), dir)
            .map(|n| self.graph[n])
            .collect();
        set.into_iter().collect()
    }

    /// `id` and everything that depends on it, transitively.
    pub fn descendants(&self, id: StageId) -> BTreeSet<StageId> {
        let mut out = BTreeSet::new();
        let mut dfs = Dfs::new(&self.graph, self.node(id));
        while let Some(n) = dfs.next(&self.graph) {
            out.insert(self.graph[n]);
        }
        out
    }

    /// `id` and everything it depends on, transitively.
    pub fn ancestors(&self, id: StageId) -> BTreeSet<StageId> {
        let rev = Reversed(&self.graph);
        let mut out = BTreeSet::new();
        let mut dfs = Dfs::new(rev, self.node(id));
        while let Some(n) = dfs.next(rev) {
            out.insert(self.graph[n]);
        }
        out
    }

    /// Resolves `--param name=value` overrides against the declared params: unknown
    /// names, ill-typed values, values outside `enum` and missing required params are
    /// errors (all of them, one message each).
    pub fn resolve_params(
        &self,
        overrides: &[(String, String)],
    ) -> Result<BTreeMap<String, Value>, Vec<String>> {
        let mut errors = Vec::new();
        let mut values = BTreeMap::new();
        for (name, raw) in overrides {
            let Some(p) = self.params.iter().find(|p| &p.name == name) else {
                let mut m = format!("unknown param `{name}`");
                let names: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
                match crate::diag::did_you_mean(name, names.iter().copied()) {
                    Some(h) => m.push_str(&format!("; {h}")),
                    None if names.is_empty() => m.push_str("; the pipeline declares no params"),
                    None => m.push_str(&format!("; declared: {}", crate::diag::one_of(&names))),
                }
                errors.push(m);
                continue;
            };
            match parse_param_value(p.kind, raw) {
                Ok(v) => {
                    if let Some(allowed) = &p.allowed {
                        if !allowed.contains(&v) {
                            let shown: Vec<String> =
                                allowed.iter().map(crate::template::value_text).collect();
                            errors.push(format!(
                                "param `{name}` must be one of {}, got `{raw}`",
                                crate::diag::one_of(&shown)
                            ));
                            continue;
                        }
                    }
                    values.insert(name.clone(), v);
                }
                Err(e) => errors.push(format!("param `{name}`: {e}")),
            }
        }
        for p in &self.params {
            if values.contains_key(&p.name) {
                continue;
            }
            match &p.default {
                Some(d) => {
                    values.insert(p.name.clone(), d.clone());
                }
                None => errors.push(format!(
                    "param `{}` is required (it has no default); pass --param {}=…",
                    p.name, p.name
                )),
            }
        }
        if errors.is_empty() {
            Ok(values)
        } else {
            Err(errors)
        }
    }

    /// The stages a run executes given `--only`, `--from` and `--to` (names). `--from S`
    /// is S and everything after it, `--to S` is S and everything before it, `--only`
    /// exactly the named stages; combined, the selection is their intersection. With no
    /// option, every stage.
    pub fn select(
        &self,
        only: &[String],
        from: &[String],
        to: &[String],
    ) -> Result<BTreeSet<StageId>, Vec<String>> {
        let mut errors = Vec::new();
        let mut ids = |names: &[String]| -> Vec<StageId> {
            names
                .iter()
                .filter_map(|n| match self.stage_by_name(n) {
                    Some(s) => Some(s.id),
                    None => {
                        let all: Vec<&str> = self.stages.iter().map(|s| s.name.as_str()).collect();
                        let mut m = format!("no stage named `{n}`");
                        if let Some(h) = crate::diag::did_you_mean(n, all) {
                            m.push_str(&format!("; {h}"));
                        }
                        errors.push(m);
                        None
                    }
                })
                .collect()
        };
        let (only, from, to) = (ids(only), ids(from), ids(to));
        if !errors.is_empty() {
            return Err(errors);
        }
        let mut selected: BTreeSet<StageId> = self.stages.iter().map(|s| s.id).collect();
        if !only.is_empty() {
            let set: BTreeSet<StageId> = only.into_iter().collect();
            selected = &selected & &set;
        }
        if !from.is_empty() {
            let set: BTreeSet<StageId> = from.iter().flat_map(|&s| self.descendants(s)).collect();
            selected = &selected & &set;
        }
        if !to.is_empty() {
            let set: BTreeSet<StageId> = to.iter().flat_map(|&s| self.ancestors(s)).collect();
            selected = &selected & &set;
        }
        Ok(selected)
    }

    /// Renders the DAG as a Mermaid flowchart.
    pub fn to_mermaid(&self) -> String {
        let mut out = String::from("flowchart LR\n");
        for s in &self.stages {
            let what = match &s.action {
                Action::Step { name, .. } => format!("uses: {name}"),
                Action::Command { argv, .. } => {
                    let prog = argv.first().map(|t| t.render(|_| None)).unwrap_or_default();
                    format!("run: {}", prog)
                }
                Action::Approval { role, min, .. } => format!("approval: {min} of {role}"),
            };
            let mut label = format!("<b>{}</b><br/>{}", s.name, what);
            if let Some(d) = &s.distributed {
                label.push_str(&format!(
                    "<br/>{} × {}",
                    framework_name(d.framework),
                    d.workers
                ));
            }
            if s.map.is_some() {
                label.push_str("<br/>map");
            }
            let label = mermaid_escape(&label);
            let (open, close) = if s.map.is_some() {
                ("[[", "]]")
            } else if s.when.is_some() {
                ("{{", "}}")
            } else {
                ("[", "]")
            };
            out.push_str(&format!("  s{}{}\"{}\"{}\n", s.id.0, open, label, close));
        }
        for e in self.graph.edge_indices() {
            let (a, b) = self.graph.edge_endpoints(e).expect("edge exists");
            let (a, b) = (self.graph[a], self.graph[b]);
            match &self.graph[e] {
                EdgeKind::Input { output, .. } | EdgeKind::MapFrom { output } => out.push_str(
                    &format!("  s{} -->|{}| s{}\n", a.0, mermaid_escape(output), b.0),
                ),
                EdgeKind::Needs => out.push_str(&format!("  s{} --> s{}\n", a.0, b.0)),
                EdgeKind::Value => out.push_str(&format!("  s{} -.->|values| s{}\n", a.0, b.0)),
            }
        }
        out
    }

    /// Renders the DAG in Graphviz DOT.
    pub fn to_dot(&self) -> String {
        let mut out = format!(
            "digraph {} {{\n  rankdir=LR;\n  node [shape=box, style=rounded];\n",
            dot_quote(&self.name)
        );
        for s in &self.stages {
            let what = match &s.action {
                Action::Step { name, .. } => format!("uses: {name}"),
                Action::Command { .. } => "run".to_owned(),
                Action::Approval { role, min, .. } => format!("approval: {min} of {role}"),
            };
            let shape = if s.map.is_some() { ", shape=box3d" } else { "" };
            out.push_str(&format!(
                "  {} [label={}{}];\n",
                dot_quote(&s.name),
                dot_quote(&format!("{}\\n{}", s.name, what)),
                shape
            ));
        }
        for e in self.graph.edge_indices() {
            let (a, b) = self.graph.edge_endpoints(e).expect("edge exists");
            let (a, b) = (
                &self.stage(self.graph[a]).name,
                &self.stage(self.graph[b]).name,
            );
            let attrs = match &self.graph[e] {
                EdgeKind::Input { output, .. } | EdgeKind::MapFrom { output } => {
                    format!(" [label={}]", dot_quote(output))
                }
                EdgeKind::Needs => String::new(),
                EdgeKind::Value => " [style=dashed, label=\"values\"]".to_owned(),
            };
            out.push_str(&format!(
                "  {} -> {}{};\n",
                dot_quote(a),
                dot_quote(b),
                attrs
            ));
        }
        out.push_str("}\n");
        out
    }
}

/// A topological order of `graph` in which, among ready nodes, the lowest id comes first.
/// `None` when the graph has a cycle.
pub fn stable_topo_order(graph: &DiGraph<StageId, EdgeKind>) -> Option<Vec<StageId>> {
    let n = graph.node_count();
    let mut indegree = vec![0usize; n];
    for e in graph.edge_indices() {
        let (_, b) = graph.edge_endpoints(e).expect("edge exists");
        indegree[b.index()] += 1;
    }
    let mut ready: BinaryHeap<std::cmp::Reverse<usize>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| std::cmp::Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(graph[NodeIndex::new(i)]);
        for m in graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            indegree[m.index()] -= 1;
            if indegree[m.index()] == 0 {
                ready.push(std::cmp::Reverse(m.index()));
            }
        }
    }
    (order.len() == n).then_some(order)
}

/// A `--param` value that is not of its parameter's declared type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}, got `{raw}`")]
pub struct ParamValueError {
    /// What the type takes: `an integer`, `a number`, `` `true` or `false` ``, `a JSON list`.
    pub expected: &'static str,
    pub raw: String,
}

/// Parses a `--param` value for a declared type.
pub fn parse_param_value(kind: ParamType, raw: &str) -> Result<Value, ParamValueError> {
    let bad = |expected| ParamValueError {
        expected,
        raw: raw.to_owned(),
    };
    match kind {
        ParamType::String => Ok(Value::String(raw.to_owned())),
        ParamType::Integer => raw
            .trim()
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| bad("an integer")),
        ParamType::Number => raw
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| bad("a number")),
        ParamType::Boolean => match raw.trim() {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(bad("`true` or `false`")),
        },
        ParamType::List => {
            let t = raw.trim();
            if t.starts_with('[') {
                match serde_json::from_str::<Value>(t) {
                    Ok(v @ Value::Array(_)) => Ok(v),
                    _ => Err(bad("a JSON list")),
                }
            } else if t.is_empty() {
                Ok(Value::Array(Vec::new()))
            } else {
                Ok(Value::Array(
                    t.split(',')
                        .map(|s| Value::String(s.trim().to_owned()))
                        .collect(),
                ))
            }
        }
    }
}

/// Whether `v` has type `kind`.
pub fn value_has_type(kind: ParamType, v: &Value) -> bool {
    match kind {
        ParamType::String => v.is_string(),
        ParamType::Number => v.is_number(),
        ParamType::Integer => v.is_i64() || v.is_u64(),
        ParamType::Boolean => v.is_boolean(),
        ParamType::List => v.is_array(),
    }
}

pub fn framework_name(f: Framework) -> &'static str {
    match f {
        Framework::None => "ranks",
        Framework::Indexed => "indexed",
        Framework::Mpi => "mpi",
        Framework::Pytorch => "pytorch",
    }
}

fn mermaid_escape(s: &str) -> String {
    s.replace('"', "#quot;")
}

fn dot_quote(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace("\\\\n", "\\n")
    )
}

/// Renders a template for display in `plan`, with params substituted and everything
/// run-time shown as `{{ ref }}`.
pub fn render_for_plan(t: &Template, params: &BTreeMap<String, Value>) -> String {
    t.render(|r| match r {
        Ref::Param(p) => params.get(p).map(crate::template::value_text),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Catalog;

    fn plan(src: &str) -> Pipeline {
        let v = crate::validate(src, &Catalog::new(Vec::new(), vec!["local", "kubernetes"]));
        assert!(!v.has_errors(), "{:#?}", v.diagnostics);
        v.pipeline.expect("valid")
    }

    fn names(p: &Pipeline, ids: impl IntoIterator<Item = StageId>) -> Vec<String> {
        ids.into_iter()
            .map(|id| p.stage(id).name.to_string())
            .collect()
    }

    //     a ──▶ b ──▶ d ──▶ e
    //     └───▶ c ──┘
    //     f (independent)
    const DIAMOND: &str = r#"
version: 1
name: diamond
params:
  n: {type: integer, default: 2}
  tags: {type: list, default: [x]}
stages:
  e:
    needs: [d]
    run: {command: [echo, e]}
  d:
    inputs: {from_b: b.out}
    when: "stages.c.values.ok == true"
    run: {command: [echo, "{{ inputs.from_b }}"]}
  b:
    needs: [a]
    run: {command: [echo, "--n={{ params.n }}", "{{ params.tags }}"]}
    outputs: [out]
  c:
    needs: [a]
    run: {command: [echo, c]}
  a:
    run: {command: [echo, a]}
  f:
    run: {command: [echo, f]}
"#;

    #[test]
    fn topological_order_prefers_document_order() {
        let p = plan(DIAMOND);
        // Ready stages come out in file order: roots a and f, then a's dependants.
        assert_eq!(names(&p, p.order.clone()), ["a", "b", "c", "d", "e", "f"]);
        let pos: BTreeMap<StageId, usize> =
            p.order.iter().enumerate().map(|(i, s)| (*s, i)).collect();
        for e in p.graph.edge_indices() {
            let (a, b) = p.graph.edge_endpoints(e).unwrap();
            assert!(pos[&p.graph[a]] < pos[&p.graph[b]], "edge goes backwards");
        }
    }

    #[test]
    fn edges_are_implied_by_inputs_and_value_references() {
        let p = plan(DIAMOND);
        let d = p.stage_by_name("d").unwrap().id;
        assert_eq!(names(&p, p.upstream(d)), ["b", "c"]);
        let kinds: Vec<EdgeKind> = p
            .graph
            .edges_directed(NodeIndex::new(d.index()), Direction::Incoming)
            .map(|e| e.weight().clone())
            .collect();
        assert!(kinds.contains(&EdgeKind::Value));
        assert!(kinds.contains(&EdgeKind::Input {
            input: "from_b".into(),
            output: "out".into()
        }));
    }

    #[test]
    fn selection_by_only_from_and_to() {
        let p = plan(DIAMOND);
        let sel = |only: &[&str], from: &[&str], to: &[&str]| {
            let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            names(&p, p.select(&v(only), &v(from), &v(to)).unwrap())
        };
        // Results are in file order: e d b c a f.
        assert_eq!(sel(&[], &[], &[]), ["e", "d", "b", "c", "a", "f"]);
        assert_eq!(sel(&[], &["b"], &[]), ["e", "d", "b"]);
        assert_eq!(sel(&[], &[], &["d"]), ["d", "b", "c", "a"]);
        assert_eq!(sel(&[], &["a"], &["d"]), ["d", "b", "c", "a"]);
        assert_eq!(sel(&["c", "d", "f"], &[], &["d"]), ["d", "c"]);
        let err = p.select(&["dd".into()], &[], &[]).unwrap_err();
        assert_eq!(err, ["no stage named `dd`; did you mean `d`?"]);
    }

    #[test]
    fn params_resolve_with_types_defaults_and_errors() {
        let p = plan(DIAMOND);
        let v = p
            .resolve_params(&[("n".into(), "5".into()), ("tags".into(), "a, b".into())])
            .unwrap();
        assert_eq!(v["n"], serde_json::json!(5));
        assert_eq!(v["tags"], serde_json::json!(["a", "b"]));
        let v = p
            .resolve_params(&[("tags".into(), r#"["x", 1]"#.into())])
            .unwrap();
        assert_eq!(v["n"], serde_json::json!(2));
        assert_eq!(v["tags"], serde_json::json!(["x", 1]));
        let err = p
            .resolve_params(&[("n".into(), "2.5".into()), ("m".into(), "1".into())])
            .unwrap_err();
        assert_eq!(err.len(), 2);
        assert!(err[0].contains("expected an integer"), "{err:?}");
        assert!(
            err[1].contains("unknown param `m`; did you mean `n`?"),
            "{err:?}"
        );
    }

    #[test]
    fn required_params_must_be_given() {
        let p = plan("version: 1\nname: req\nparams:\n  day: {type: string}\nstages:\n  a:\n    run: {command: [echo, '{{ params.day }}']}\n");
        let err = p.resolve_params(&[]).unwrap_err();
        assert!(err[0].contains("param `day` is required"), "{err:?}");
        assert!(p
            .resolve_params(&[("day".into(), "2026-11-20".into())])
            .is_ok());
    }

    #[test]
    fn defaults_are_inherited_and_overridden() {
        let p = plan(
            r#"
version: 1
name: defaults
defaults:
  retries: {limit: 2, backoff: 5s}
  timeout: 1h
  resources: {cpu: 2, memory: 4Gi}
  env: {A: "1", B: "2"}
stages:
  plain:
    run: {command: [echo]}
  own:
    run: {command: [echo], env: {B: "run"}}
    env: {B: stage, C: "3"}
    retries: {limit: 0}
    timeout: 90s
    resources: {gpu: 1, memory: 8Gi}
"#,
        );
        let plain = p.stage_by_name("plain").unwrap();
        assert_eq!(plain.retries.limit, 2);
        assert_eq!(plain.retries.backoff, Duration::from_secs(5));
        assert_eq!(plain.timeout, Some(Duration::from_secs(3600)));
        assert_eq!(plain.resources.cpu.as_ref().unwrap().value, 2.0);
        let own = p.stage_by_name("own").unwrap();
        assert_eq!(own.retries.limit, 0);
        assert_eq!(own.timeout, Some(Duration::from_secs(90)));
        assert_eq!(own.resources.gpu, Some(1));
        assert_eq!(own.resources.cpu.as_ref().unwrap().text, "2");
        assert_eq!(own.resources.memory.as_ref().unwrap().text, "8Gi");
        let env: Vec<(String, String)> = own
            .env
            .iter()
            .map(|(k, t)| (k.clone(), t.render(|_| None)))
            .collect();
        assert_eq!(
            env,
            [("A", "1"), ("B", "run"), ("C", "3")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }

    #[test]
    fn graphs_render_every_edge() {
        let p = plan(DIAMOND);
        let mermaid = p.to_mermaid();
        assert_eq!(
            mermaid.matches("-->").count() + mermaid.matches("-.->").count(),
            p.graph.edge_count()
        );
        assert!(mermaid.contains("s2 -->|out| s1"), "{mermaid}");
        let dot = p.to_dot();
        assert_eq!(dot.matches(" -> ").count(), p.graph.edge_count());
        assert!(dot.contains("\"c\" -> \"d\" [style=dashed"), "{dot}");
    }
}
