//! Validation: a pipeline file's text in, a [`Pipeline`] or every problem out.
//!
//! The flow is `parse` (located YAML tree) → `read` (serde spec types, one section and
//! one stage at a time so one bad stage does not hide the others) → a list of small
//! `check_*` functions that accumulate [`Diagnostic`]s → `build` (the planned DAG).
//! Every diagnostic carries the YAML path and a span; references name their targets;
//! typos get "did you mean" hints.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use indexmap::IndexMap;
use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::Value;

use crate::de::from_node;
use crate::diag::{did_you_mean, one_of, Diagnostic, Span};
use crate::plan::{
    stable_topo_order, EdgeKind, Param, Pipeline, Resources, RetryPolicy, Schedule, Stage, StageId,
};
use crate::spec::{
    DefaultsSpec, NotifySpec, ParamSpec, ParamType, PipelineSpec, QuantityText, RetrySpec,
    ScheduleSpec, StageSpec, TriggerSpec, PIPELINE_FIELDS,
};
use crate::step::Catalog;
use crate::template::{Ref, Template};
use crate::units::{parse_duration, parse_quantity, Quantity};
use crate::yaml::{self, Node, YamlPath};

mod events;
pub(crate) use crate::names::is_ident;
pub use crate::names::{dns1123_label, LabelError};
pub use events::notify_file;
pub use scheduling::MAX_PRIORITY;
mod links;
mod plugin;
mod scheduling;
mod search;
mod stage;

/// The spec versions this engine reads.
pub const SUPPORTED_VERSIONS: &[u32] = &[1];

/// The result of validating one file: the pipeline when there is no error, and every
/// diagnostic (errors and warnings) in source order.
#[derive(Debug)]
pub struct Validated {
    pub pipeline: Option<Pipeline>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Validated {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Validates a pipeline's text without a file: plugins only by `NAME@VERSION` through
/// `DRIVETRAIN_PLUGIN_PATH`.
pub fn validate(src: &str, catalog: &Catalog) -> Validated {
    validate_in(src, catalog, crate::plugin::Origin::posted())
}

/// Validates the text of the pipeline file `file`: plugins by path are read from its
/// folder, git plugins from the catalog's home.
pub fn validate_file(file: &std::path::Path, src: &str, catalog: &Catalog) -> Validated {
    validate_in(
        src,
        catalog,
        crate::plugin::Origin::of_file(file, catalog.home()),
    )
}

/// Validates a pipeline file's text, its plugins looked for from `origin`.
pub fn validate_in(src: &str, catalog: &Catalog, origin: crate::plugin::Origin) -> Validated {
    let root = match yaml::parse(src) {
        Ok(root) => root,
        Err(diagnostics) => {
            return Validated {
                pipeline: None,
                diagnostics: crate::diag::bound(diagnostics),
            }
        }
    };
    let mut cx = Cx {
        src,
        tree: None,
        catalog,
        diags: Vec::new(),
        with_nodes: Vec::new(),
        in_string: HashMap::new(),
        plugins: crate::plugin::Resolver::new(origin),
    };
    // The tree is the largest structure validation builds: `read` consumes it stage by
    // stage, keeping only the `with` blocks the checks need. Problems found later are
    // located on demand from a fresh parse (`Cx::root`), so a valid file is parsed once.
    let raw = cx.read(root);
    let pipeline = raw.and_then(|raw| cx.check_and_build(raw));
    let diagnostics = cx.located();
    let pipeline = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        pipeline
    };
    Validated {
        pipeline,
        diagnostics: crate::diag::bound(diagnostics),
    }
}

/// The spec as read, before semantic checks. Stages that failed to deserialize are kept
/// as `None` so references to them are not reported as unknown.
struct Raw {
    version: Option<u32>,
    name: Option<String>,
    description: Option<String>,
    project: Option<String>,
    params: IndexMap<String, ParamSpec>,
    schedule: Option<ScheduleSpec>,
    triggers: IndexMap<String, Option<TriggerSpec>>,
    notify: Vec<NotifySpec>,
    deadline: Option<String>,
    defaults: DefaultsSpec,
    store: Option<String>,
    stages: IndexMap<String, Option<StageSpec>>,
    /// Whether `stages:` is a mapping (possibly empty).
    stages_is_map: bool,
}

struct Cx<'a> {
    src: &'a str,
    /// The located tree, when something needs a location (see [`Cx::root`]).
    tree: Option<Node<'a>>,
    catalog: &'a Catalog,
    diags: Vec<Diagnostic>,
    /// Each stage's `with` block, by stage position.
    with_nodes: Vec<Option<Node<'a>>>,
    /// Problems found so far inside each string (by YAML path): past a few, the rest
    /// are located at the string, not in it, which would cost its length each.
    in_string: HashMap<String, usize>,
    /// The plugin steps of `uses:`, each resolved once.
    plugins: crate::plugin::Resolver,
}

fn p(s: &str) -> YamlPath {
    YamlPath::root().key(s)
}

impl<'a> Cx<'a> {
    /// Its diagnostics, each located (those reported by path only are located now), in
    /// the order of the file.
    fn located(mut self) -> Vec<Diagnostic> {
        let unlocated: Vec<usize> = (0..self.diags.len())
            .filter(|&i| self.diags[i].span.is_none() && self.diags[i].path.is_some())
            .collect();
        for i in unlocated {
            let path = YamlPath::parse(self.diags[i].path.as_deref().unwrap_or_default());
            let loc = self.root().locate(&path);
            let span = loc.key_span.filter(|_| loc.exact).unwrap_or(loc.node.span);
            self.diags[i].span = Some(span);
        }
        let mut diagnostics = self.diags;
        diagnostics.sort_by_key(|d| d.span.map(|s| (s.start, s.end)).unwrap_or_default());
        diagnostics.dedup();
        diagnostics
    }

    /// The located tree, parsed again if it was dropped. Only the paths that report a
    /// problem call this, so a valid file is parsed once.
    fn root(&mut self) -> &Node<'a> {
        let src = self.src;
        self.tree.get_or_insert_with(|| {
            yaml::parse(src).unwrap_or_else(|_| Node {
                value: yaml::Value::Map(Vec::new()),
                span: Span::default(),
            })
        })
    }

    fn err(
        &mut self,
        code: &'static str,
        path: &YamlPath,
        msg: impl Into<String>,
    ) -> &mut Diagnostic {
        let loc = self.root().locate(path);
        let span = loc.node.span;
        self.diags
            .push(Diagnostic::new(code, msg).path(path).at(span));
        self.diags.last_mut().expect("just pushed")
    }

    /// An error pointing at the key of `path` rather than its value.
    fn err_key(
        &mut self,
        code: &'static str,
        path: &YamlPath,
        msg: impl Into<String>,
    ) -> &mut Diagnostic {
        let loc = self.root().locate(path);
        let span = loc.key_span.unwrap_or(loc.node.span);
        self.diags
            .push(Diagnostic::new(code, msg).path(path).at(span));
        self.diags.last_mut().expect("just pushed")
    }

    /// An error about `range` (bytes of the decoded string) inside the string at `path`.
    fn err_in_string(
        &mut self,
        code: &'static str,
        path: &YamlPath,
        range: std::ops::Range<usize>,
        msg: impl Into<String>,
    ) -> &mut Diagnostic {
        let src = self.src;
        let seen = self.in_string.entry(path.to_string()).or_default();
        *seen += 1;
        let precise = *seen <= crate::diag::MAX_PER_LINE;
        let loc = self.root().locate(path);
        let span = match precise {
            true => sub_span(src, loc.node, range),
            false => loc.node.span,
        };
        self.diags
            .push(Diagnostic::new(code, msg).path(path).at(span));
        self.diags.last_mut().expect("just pushed")
    }

    /// The entries of a mapping field (`params:`, `triggers:`), each read as a `T`
    /// (`None` where it does not deserialize, which is reported); a null field has none,
    /// another kind is an error saying it maps `what`.
    fn read_map<T: serde::de::DeserializeOwned>(
        &mut self,
        node: &Node<'_>,
        path: &YamlPath,
        what: &str,
    ) -> Vec<(String, Option<T>)> {
        match node.as_map() {
            Some(entries) => entries
                .iter()
                .map(|e| {
                    let spec = from_node::<T>(&e.value, &path.key(&*e.key), &mut self.diags);
                    (e.key.to_string(), spec)
                })
                .collect(),
            None if node.scalar() == Some(yaml::Resolved::Null) => Vec::new(),
            None => {
                let (kind, field) = (node.kind(), path.to_string());
                self.err(
                    "invalid-type",
                    path,
                    format!("`{field}` is a mapping of {what}; found {kind}"),
                );
                Vec::new()
            }
        }
    }

    fn read(&mut self, root: Node<'a>) -> Option<Raw> {
        let kind = root.kind();
        let yaml::Value::Map(entries) = root.value else {
            self.err(
                "invalid-type",
                &YamlPath::root(),
                format!(
                "a pipeline file is a mapping with `version`, `name` and `stages`; found {kind}"
            ),
            );
            return None;
        };
        let mut raw = Raw {
            version: None,
            name: None,
            description: None,
            project: None,
            params: IndexMap::new(),
            schedule: None,
            triggers: IndexMap::new(),
            notify: Vec::new(),
            deadline: None,
            defaults: DefaultsSpec::default(),
            store: None,
            stages: IndexMap::new(),
            stages_is_map: false,
        };
        let before = self.diags.len();
        let mut seen: HashSet<&str> = HashSet::new();
        for e in entries {
            for f in PIPELINE_FIELDS {
                if *f == e.key {
                    seen.insert(f);
                }
            }
            let path = p(&e.key);
            let d = &mut self.diags;
            match &*e.key {
                "version" => raw.version = from_node(&e.value, &path, d),
                "name" => raw.name = from_node(&e.value, &path, d),
                "description" => raw.description = from_node(&e.value, &path, d),
                "project" => raw.project = from_node(&e.value, &path, d),
                "schedule" => raw.schedule = from_node(&e.value, &path, d),
                "notify" => raw.notify = from_node(&e.value, &path, d).unwrap_or_default(),
                "deadline" => raw.deadline = from_node(&e.value, &path, d),
                "triggers" => {
                    raw.triggers = self
                        .read_map::<TriggerSpec>(&e.value, &path, "trigger name to trigger")
                        .into_iter()
                        .collect()
                }
                "defaults" => raw.defaults = from_node(&e.value, &path, d).unwrap_or_default(),
                "store" => raw.store = from_node(&e.value, &path, d),
                "params" => {
                    raw.params = self
                        .read_map::<ParamSpec>(&e.value, &path, "name to `{type, default}`")
                        .into_iter()
                        .filter_map(|(k, v)| Some((k, v?)))
                        .collect()
                }
                "stages" => match e.value.value {
                    yaml::Value::Map(stages) => {
                        raw.stages_is_map = true;
                        self.with_nodes.reserve_exact(stages.len());
                        raw.stages.reserve_exact(stages.len());
                        for mut se in stages {
                            let sp = path.key(&*se.key);
                            let spec = from_node::<StageSpec>(&se.value, &sp, d);
                            raw.stages.insert(se.key.into_owned(), spec);
                            let with = match &mut se.value.value {
                                yaml::Value::Map(fields) => fields
                                    .iter()
                                    .position(|f| f.key == "with")
                                    .map(|i| fields.swap_remove(i).value),
                                _ => None,
                            };
                            self.with_nodes.push(with);
                        }
                    }
                    _ => {
                        let kind = e.value.kind();
                        self.err(
                            "invalid-type",
                            &path,
                            format!("`stages` is a mapping of stage name to stage; found {kind}"),
                        )
                        .hint("write `stages:` followed by indented `name:` entries");
                    }
                },
                other => {
                    let hint = did_you_mean(other, PIPELINE_FIELDS.iter().copied());
                    let msg = format!("unknown field `{other}`");
                    self.err_key("unknown-field", &path, msg)
                        .note(format!("expected {}", one_of(PIPELINE_FIELDS)))
                        .maybe_hint(hint);
                }
            }
        }
        self.after_read(&seen, before);
        Some(raw)
    }

    /// The fields a pipeline needs that `seen` lacks, and a hint on a secret given as a
    /// value among the problems found since `before`.
    fn after_read(&mut self, seen: &HashSet<&str>, before: usize) {
        for required in ["version", "name", "stages"] {
            if !seen.contains(required) {
                self.diags.push(
                    Diagnostic::new(
                        "missing-field",
                        format!("missing required field `{required}`"),
                    )
                    .path(p(required))
                    .at(first_line(self.src)),
                );
            }
        }
        for d in &mut self.diags[before..] {
            let is_secret_value = d.code == "unknown-field"
                && d.path
                    .as_deref()
                    .is_some_and(|p| p.contains(".secrets[") && p.ends_with(".value"));
            if is_secret_value {
                d.hint = Some(
                    "secrets are references, never values: store the value in a Kubernetes Secret \
                     (locally: the engine's environment) and name it with `name` and `key`"
                        .into(),
                );
            }
        }
    }

    /// The pipeline's name and project are DNS labels (they name Kubernetes objects).
    fn check_names(&mut self, raw: &Raw) {
        if let Some(name) = &raw.name {
            if let Err(why) = dns1123_label(name) {
                self.err(
                    "invalid-name",
                    &p("name"),
                    format!("pipeline name `{name}` {why}"),
                )
                .maybe_hint(dns_hint(name));
            }
        }
        if let Some(project) = &raw.project {
            if let Err(why) = dns1123_label(project) {
                self.err(
                    "invalid-project",
                    &p("project"),
                    format!("project name `{project}` {why}"),
                )
                .maybe_hint(dns_hint(project));
            }
        }
    }

    fn check_and_build(&mut self, raw: Raw) -> Option<Pipeline> {
        self.check_version(&raw);
        self.check_names(&raw);
        let params = self.check_params(&raw);
        let schedule = raw.schedule.as_ref().and_then(|s| self.check_schedule(s));
        let triggers = self.check_triggers(&raw, &params);
        let notify = self.check_notify(&raw.notify);
        let deadline = match &raw.deadline {
            Some(t) => self.duration(&p("deadline"), t),
            None => None,
        };
        self.check_store(&raw);
        let executor = self.check_defaults(&raw.defaults);
        if raw.stages.is_empty() && raw.stages_is_map {
            self.err("no-stages", &p("stages"), "the pipeline has no stages");
        }

        let names: Vec<&str> = raw.stages.keys().map(String::as_str).collect();
        let index: HashMap<&str, StageId> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, StageId(i as u32)))
            .collect();
        let mut used_params: HashSet<String> = HashSet::new();
        let mut graph: DiGraph<StageId, EdgeKind> =
            DiGraph::with_capacity(names.len(), names.len() * 3);
        for i in 0..names.len() {
            graph.add_node(StageId(i as u32));
        }
        // Where each edge was declared, for cycle reports.
        // Where `stages.X.values` references were written; other edges' origins are
        // derived from the spec when a cycle needs them.
        let mut value_origin: HashMap<(StageId, StageId), YamlPath> = HashMap::new();
        let mut stages = Vec::with_capacity(names.len());
        for (i, name) in raw.stages.keys().enumerate() {
            let known = (&raw, &index, params.as_slice());
            let (stage, edges) = self.check_one_stage(i, name, known, &mut used_params, &executor);
            add_edges(&mut graph, &mut value_origin, StageId(i as u32), edges);
            if let Some(stage) = stage {
                stages.push(stage);
            }
        }
        self.check_templates_in_defaults(&raw, &params, &mut used_params);
        self.check_unused_params(&raw, &params, &used_params);
        self.check_hook_edges(&raw, &graph, &names);
        let order = stable_topo_order(&graph);
        if order.is_none() {
            self.report_cycles(&graph, &names, &raw, &value_origin);
        }
        if self.diags.iter().any(Diagnostic::is_error) || stages.len() != names.len() {
            return None;
        }
        // Every stage deserialized (else an error was reported above): move, not clone.
        let stages_spec = raw
            .stages
            .into_iter()
            .map(|(k, v)| v.map(|v| (k, v)))
            .collect::<Option<IndexMap<_, _>>>()?;
        let spec = PipelineSpec {
            version: raw.version?,
            name: raw.name?,
            description: raw.description,
            project: raw.project,
            params: raw.params,
            schedule: raw.schedule,
            triggers: raw
                .triggers
                .into_iter()
                .filter_map(|(k, v)| Some((k, v?)))
                .collect(),
            notify: raw.notify,
            deadline: raw.deadline,
            defaults: Some(raw.defaults),
            store: raw.store,
            stages: stages_spec,
        };
        Some(Pipeline {
            name: spec.name.clone(),
            description: spec.description.clone(),
            project: spec
                .project
                .clone()
                .unwrap_or_else(|| crate::access::DEFAULT_PROJECT.to_owned()),
            params,
            schedule,
            triggers: triggers?,
            notify: notify?,
            deadline,
            store: spec.store.clone(),
            executor,
            stages,
            graph,
            order: order?,
            spec,
        })
    }

    /// Warns of a param no template, condition or `map` uses.
    /// Stage `i` (`name`) checked, with the edges found while checking it.
    fn check_one_stage(
        &mut self,
        i: usize,
        name: &str,
        (raw, index, params): (&Raw, &HashMap<&str, StageId>, &[Param]),
        used_params: &mut HashSet<String>,
        executor: &str,
    ) -> (Option<Stage>, Edges) {
        let id = StageId(i as u32);
        let sp = p("stages").key(name);
        if let Err(why) = dns1123_label(name) {
            self.err_key(
                "invalid-stage-name",
                &sp,
                format!("stage name `{name}` {why}"),
            )
            .maybe_hint(dns_hint(name))
            .note("stage names become Kubernetes object names and labels");
        }
        let Some(Some(spec)) = raw.stages.get(name) else {
            return (None, Vec::new());
        };
        let with_node = self.with_nodes.get_mut(i).and_then(Option::take);
        let plugin = plugin::uses_plugin(spec).map(|u| self.stage_plugin(&sp, u));
        let merged = match &plugin {
            Some(Some(p)) => Some(plugin::with_step_defaults(spec, p)),
            _ => None,
        };
        let mut sc = StageCx {
            id,
            name,
            path: sp,
            spec: merged.as_ref().unwrap_or(spec),
            with_node: with_node.as_ref(),
            plugin,
            plugin_env: Vec::new(),
            raw,
            index,
            params,
            edges: Vec::new(),
            used_params,
        };
        let stage = self.check_stage(&mut sc, executor);
        (stage, sc.edges)
    }

    fn check_unused_params(&mut self, raw: &Raw, params: &[Param], used_params: &HashSet<String>) {
        for param in params {
            let used_by_map = raw.stages.values().flatten().any(|s| {
                s.map.as_ref().and_then(|m| m.param.as_deref()) == Some(param.name.as_str())
            });
            if !used_params.contains(&param.name) && !used_by_map {
                let pp = p("params").key(&param.name);
                self.diags.push(
                    Diagnostic::warning(
                        "unused-param",
                        format!("param `{}` is never used", param.name),
                    )
                    .path(&pp),
                );
            }
        }
    }

    /// Hooks run after everything else: nothing ordinary may wait for one.
    fn check_hook_edges(&mut self, raw: &Raw, graph: &DiGraph<StageId, EdgeKind>, names: &[&str]) {
        for e in graph.edge_indices() {
            let (a, b) = graph.edge_endpoints(e).expect("edge exists");
            let (from, to) = (names[a.index()], names[b.index()]);
            let is_hook = |n: &str| {
                raw.stages
                    .get(n)
                    .and_then(|s| s.as_ref())
                    .is_some_and(|s| s.hook.is_some())
            };
            if is_hook(from) && !is_hook(to) {
                self.err_key(
                "depends-on-hook",
                &p("stages").key(to),
                format!("stage `{to}` depends on hook `{from}`, which runs only after every other stage"),
            )
            .hint("make the dependant a hook too, or drop the dependency");
            }
        }
    }

    fn check_version(&mut self, raw: &Raw) {
        if let Some(v) = raw.version {
            if !SUPPORTED_VERSIONS.contains(&v) {
                self.err(
                    "unsupported-version",
                    &p("version"),
                    format!("spec version {v} is not supported; this drivetrain reads version 1"),
                );
            }
        }
    }

    fn check_params(&mut self, raw: &Raw) -> Vec<Param> {
        let mut out = Vec::new();
        for (name, spec) in &raw.params {
            let pp = p("params").key(name);
            if !is_ident(name) {
                self.err_key("invalid-param-name", &pp, format!(
                    "param name `{name}` must start with a letter or `_` and hold only letters, digits, `_` and `-`"
                ));
                continue;
            }
            let kind = match (spec.kind, &spec.default) {
                (Some(k), _) => k,
                (None, Some(d)) => match infer_type(d) {
                    Some(k) => k,
                    None => {
                        self.err(
                            "param-type",
                            &pp.key("default"),
                            format!(
                            "cannot infer the type of param `{name}` from its default; add `type:`"
                        ),
                        );
                        continue;
                    }
                },
                (None, None) => {
                    self.err("param-type", &pp, format!(
                        "param `{name}` needs a `type` or a `default`"
                    ))
                    .hint("e.g. `{type: string}` for a required param, `{default: 4.0}` for an optional one");
                    continue;
                }
            };
            let mut default = spec.default.clone();
            if let Some(d) = &default {
                if !crate::plan::value_has_type(kind, d) {
                    self.err(
                        "param-type",
                        &pp.key("default"),
                        format!(
                            "the default of param `{name}` is {}, but its type is `{}`",
                            json_kind(d),
                            kind.as_str()
                        ),
                    );
                    default = None;
                }
            }
            if let Some(allowed) = &spec.allowed {
                for (i, v) in allowed.iter().enumerate() {
                    if !crate::plan::value_has_type(kind, v) {
                        self.err(
                            "param-type",
                            &pp.key("enum").index(i),
                            format!(
                                "enum value {v} of param `{name}` is not of type `{}`",
                                kind.as_str()
                            ),
                        );
                    }
                }
                if let Some(d) = &default {
                    if !allowed.contains(d) {
                        self.err(
                            "param-type",
                            &pp.key("default"),
                            format!(
                                "the default of param `{name}` is not one of its `enum` values"
                            ),
                        );
                    }
                }
            }
            out.push(Param {
                name: name.clone(),
                kind,
                default,
                allowed: spec.allowed.clone(),
                description: spec.description.clone(),
            });
        }
        out
    }

    fn check_schedule(&mut self, s: &ScheduleSpec) -> Option<Schedule> {
        let sp = p("schedule");
        let mut ok = true;
        match crate::schedule::parse_schedule_cron(&s.cron, s.seconds) {
            Ok(_) => {}
            Err(e @ crate::schedule::CronError::Invalid(_)) => {
                self.err("invalid-cron", &sp.key("cron"), format!("`{}` {e}", s.cron))
                    .hint("fields: minute hour day-of-month month day-of-week, e.g. `0 3 * * *` (seconds first with `seconds: true`)");
                ok = false;
            }
            Err(e) => {
                self.err("invalid-cron", &sp.key("cron"), format!("`{}` {e}", s.cron));
                ok = false;
            }
        }
        let tz_name = s.timezone.as_deref().unwrap_or("UTC");
        let timezone = match tz_name.parse::<chrono_tz::Tz>() {
            Ok(tz) => Some(tz),
            Err(_) => {
                let hint = did_you_mean(tz_name, chrono_tz::TZ_VARIANTS.iter().map(|t| t.name()));
                self.err(
                    "invalid-timezone",
                    &sp.key("timezone"),
                    format!("`{tz_name}` is not an IANA timezone"),
                )
                .maybe_hint(hint.or_else(|| {
                    Some("use a name like `Europe/Berlin` or `America/Los_Angeles`".into())
                }));
                None
            }
        };
        if s.max_catchup.is_some() && s.catchup != crate::spec::Catchup::All {
            self.diags.push(
                Diagnostic::warning(
                    "unused-field",
                    "`max_catchup` only applies with `catchup: all`",
                )
                .path(sp.key("max_catchup")),
            );
        }
        Some(Schedule {
            cron: s.cron.clone(),
            timezone: timezone?,
            concurrency: s.concurrency,
            catchup: s.catchup,
            max_catchup: s.max_catchup.unwrap_or(10),
            suspend: s.suspend,
        })
        .filter(|_| ok)
    }

    fn check_store(&mut self, raw: &Raw) {
        let Some(store) = &raw.store else { return };
        const SCHEMES: &[&str] = &[
            "file", "memory", "s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https",
        ];
        match url::Url::parse(store) {
            Ok(u) if SCHEMES.contains(&u.scheme()) => {}
            Ok(u) => {
                let scheme = u.scheme().to_owned();
                self.err("invalid-store", &p("store"), format!(
                    "unsupported artifact store scheme `{scheme}`; use file://, memory://, s3://, gs:// or az://"
                ))
                .maybe_hint(did_you_mean(&scheme, SCHEMES.iter().copied()));
            }
            Err(e) => {
                self.err(
                    "invalid-store",
                    &p("store"),
                    format!("`{store}` is not a URL: {e}"),
                )
                .hint("e.g. `s3://bucket/prefix` or `file:///var/lib/drivetrain`");
            }
        }
    }

    fn check_defaults(&mut self, d: &DefaultsSpec) -> String {
        let dp = p("defaults");
        if let Some(t) = &d.timeout {
            self.duration(&dp.key("timeout"), t);
        }
        if let Some(r) = &d.retries {
            self.retries(&dp.key("retries"), r);
        }
        if let Some(r) = &d.resources {
            self.resources(&dp.key("resources"), r);
        }
        if let Some(s) = &d.scheduling {
            self.defaults_scheduling(s);
        }
        if let Some(c) = d.cache.as_ref().and_then(|c| c.max_age.as_ref()) {
            self.duration(&dp.key("cache").key("max_age"), c);
        }
        for (i, t) in d.cache.iter().flat_map(|c| c.key.iter()).enumerate() {
            self.template(&dp.key("cache").key("key").index(i), t);
        }
        for k in d.env.keys() {
            self.env_name(&dp.key("env").key(k), k);
        }
        let executor = d.executor.clone().unwrap_or_else(|| "local".to_owned());
        let folders = self.plugins.origin().folders();
        let plugin =
            || crate::plugin::executor_file::find(&executor, &folders).is_some_and(|l| l.is_ok());
        if !self.catalog.executors().contains(&executor.as_str()) && !plugin() {
            let known = self.catalog.executors().to_vec();
            self.err(
                "unknown-executor",
                &dp.key("executor"),
                format!(
                    "unknown executor `{executor}`; available: {}",
                    one_of(&known)
                ),
            )
            .maybe_hint(did_you_mean(&executor, known.iter().copied()));
        }
        executor
    }

    fn check_templates_in_defaults(
        &mut self,
        raw: &Raw,
        params: &[Param],
        used: &mut HashSet<String>,
    ) {
        let dp = p("defaults");
        for (k, v) in &raw.defaults.env {
            let path = dp.key("env").key(k);
            if let Some(t) = self.template(&path, v) {
                for (r, range) in t.refs() {
                    match r {
                        Ref::Param(name) => {
                            used.insert(name.clone());
                            if !params.iter().any(|p| &p.name == name) {
                                self.unknown_param(&path, range.clone(), name, params);
                            }
                        }
                        Ref::RunId
                        | Ref::RunDate
                        | Ref::RunStatus
                        | Ref::PipelineName
                        | Ref::PipelineDir
                        | Ref::ScheduleTime => {}
                        other => {
                            self.err_in_string(
                                "invalid-reference",
                                &path,
                                range.clone(),
                                format!(
                                    "`{other}` depends on a stage and cannot be used in `defaults`"
                                ),
                            );
                        }
                    }
                }
            }
        }
        if let Some(img) = &raw.defaults.image {
            let _ = self.template(&dp.key("image"), img);
        }
    }

    fn unknown_param(
        &mut self,
        path: &YamlPath,
        range: std::ops::Range<usize>,
        name: &str,
        params: &[Param],
    ) {
        let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
        let hint = did_you_mean(name, names.iter().copied());
        let declared = if names.is_empty() {
            "the pipeline declares no params".to_owned()
        } else {
            format!("declared: {}", one_of(&names))
        };
        self.err_in_string(
            "unknown-param",
            path,
            range,
            format!("unknown param `{name}`"),
        )
        .note(declared)
        .maybe_hint(hint);
    }

    fn duration(&mut self, path: &YamlPath, text: &str) -> Option<std::time::Duration> {
        match parse_duration(text) {
            Ok(d) => Some(d),
            Err(e) => {
                self.err("invalid-duration", path, e.to_string());
                None
            }
        }
    }

    fn quantity(&mut self, path: &YamlPath, q: &QuantityText) -> Option<Quantity> {
        match parse_quantity(&q.0) {
            Ok(q) => Some(q),
            Err(e) => {
                self.err("invalid-quantity", path, e.to_string());
                None
            }
        }
    }

    /// Runs `f` and drops the diagnostics it reports: defaults are checked once, at
    /// `defaults.*`, and each stage inherits them without reporting them again.
    fn quietly<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let n = self.diags.len();
        let value = f(self);
        self.diags.truncate(n);
        value
    }

    fn resources(&mut self, path: &YamlPath, r: &crate::spec::ResourcesSpec) -> Resources {
        let q = |cx: &mut Self, key: &str, v: &Option<QuantityText>| {
            v.as_ref().and_then(|v| cx.quantity(&path.key(key), v))
        };
        let gpu = q(self, "gpu", &r.gpu).and_then(|g| {
            if g.value.fract() != 0.0 {
                self.err("fractional-gpu", &path.key("gpu"), format!(
                    "`gpu: {}` asks for a fraction of a GPU; GPUs are whole devices",
                    g.text
                ))
                .hint("use a whole number; share GPUs with MIG or time-slicing on the cluster instead");
                None
            } else {
                Some(g.value as u32)
            }
        });
        Resources {
            cpu: q(self, "cpu", &r.cpu),
            memory: q(self, "memory", &r.memory),
            gpu,
            shm: q(self, "shm", &r.shm),
            ephemeral_storage: q(self, "ephemeral_storage", &r.ephemeral_storage),
        }
    }

    fn retries(&mut self, path: &YamlPath, r: &RetrySpec) -> RetryPolicy {
        let mut policy = RetryPolicy {
            limit: r.limit,
            ..RetryPolicy::default()
        };
        if let Some(b) = &r.backoff {
            policy.backoff = self
                .duration(&path.key("backoff"), b)
                .unwrap_or(policy.backoff);
        }
        if let Some(b) = &r.max_backoff {
            policy.max_backoff = self
                .duration(&path.key("max_backoff"), b)
                .unwrap_or(policy.max_backoff);
        }
        if policy.max_backoff < policy.backoff {
            self.err(
                "invalid-duration",
                &path.key("max_backoff"),
                "`max_backoff` is shorter than `backoff`",
            );
        }
        policy.on = r.on.clone();
        policy
    }

    fn env_name(&mut self, path: &YamlPath, name: &str) {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            self.err_key("invalid-env-name", path, format!(
                "`{name}` is not an environment variable name (letters, digits and `_`, not starting with a digit)"
            ));
        } else if name.starts_with("DRIVETRAIN_") {
            self.err_key(
                "reserved-env-name",
                path,
                format!(
                "`{name}` is reserved: the engine sets `DRIVETRAIN_*` variables for every stage"
            ),
            );
        }
    }

    fn template(&mut self, path: &YamlPath, text: &str) -> Option<Template> {
        match Template::parse(text) {
            Ok(t) => Some(t),
            Err(errors) => {
                for e in errors {
                    self.err_in_string("invalid-template", path, e.range, e.message);
                }
                None
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefSite {
    Template,
    Condition,
}

/// Upstream stages found while checking a stage, with why and where.
type Edges = Vec<(StageId, EdgeKind, Option<YamlPath>)>;

struct StageCx<'s> {
    id: StageId,
    name: &'s str,
    path: YamlPath,
    spec: &'s StageSpec,
    /// The stage's `with:` block.
    with_node: Option<&'s Node<'s>>,
    raw: &'s Raw,
    index: &'s HashMap<&'s str, StageId>,
    params: &'s [Param],
    /// Upstream stages found while checking, with why and where.
    edges: Edges,
    used_params: &'s mut HashSet<String>,
    /// The plugin step `uses:` names: `None` for a built-in, `Some(None)` when it names
    /// none (reported).
    plugin: Option<Option<Arc<crate::plugin::Plugin>>>,
    /// The plugin step's environment, under the stage's own.
    plugin_env: Vec<(String, Template)>,
}

/// A copy of `node` where each string that is exactly one `{{ params.x }}` is replaced by
/// the param's default (or a placeholder of its type), one `{{ item… }}` by what it
/// reads of `item` (a `map` stage's first item, where its items are known), and one
/// `{{ trial… }}` by what it reads of a sample trial (`trial`), keeping spans.
fn typed_params<'a>(
    node: &Node<'a>,
    params: &[Param],
    item: Option<&Value>,
    trial: Option<&Value>,
) -> Node<'a> {
    let value = match &node.value {
        yaml::Value::Scalar { .. } => {
            let template = node.as_str().and_then(|s| Template::parse(s).ok());
            let one = template.as_ref().and_then(|t| match t.parts.as_slice() {
                [crate::template::Part::Ref(r, _)] => Some(r),
                _ => None,
            });
            if let (Some(Ref::Item(keys)), Some(item)) = (one, item) {
                let read = keys.iter().try_fold(item, |v, k| v.get(k));
                if let Some(v) = read {
                    return json_to_node(v, node.span);
                }
            }
            if let (Some(Ref::Trial(t)), Some(trial)) = (one, trial) {
                let read = match t {
                    crate::template::TrialRef::Id => trial.get("id"),
                    crate::template::TrialRef::Budget => trial.get("budget"),
                    crate::template::TrialRef::Param(n) => {
                        trial.get("params").and_then(|p| p.get(n))
                    }
                };
                if let Some(v) = read {
                    return json_to_node(v, node.span);
                }
            }
            let param = match one {
                Some(Ref::Param(name)) => params.iter().find(|p| &p.name == name),
                _ => None,
            };
            match param {
                Some(p) => {
                    let v = p.default.clone().unwrap_or(match p.kind {
                        ParamType::String => Value::String(String::new()),
                        ParamType::Number => Value::from(0.0),
                        ParamType::Integer => Value::from(0),
                        ParamType::Boolean => Value::Bool(false),
                        ParamType::List => Value::Array(Vec::new()),
                    });
                    return json_to_node(&v, node.span);
                }
                None => node.value.clone(),
            }
        }
        yaml::Value::Seq(items) => yaml::Value::Seq(
            items
                .iter()
                .map(|n| typed_params(n, params, item, trial))
                .collect(),
        ),
        yaml::Value::Map(entries) => yaml::Value::Map(
            entries
                .iter()
                .map(|e| yaml::Entry {
                    key: e.key.clone(),
                    key_span: e.key_span,
                    value: typed_params(&e.value, params, item, trial),
                })
                .collect(),
        ),
    };
    Node {
        value,
        span: node.span,
    }
}

fn json_to_node(v: &Value, span: Span) -> Node<'static> {
    let value = match v {
        Value::String(s) => yaml::Value::Scalar {
            text: s.clone().into(),
            plain: false,
        },
        Value::Array(items) => {
            yaml::Value::Seq(items.iter().map(|x| json_to_node(x, span)).collect())
        }
        Value::Object(o) => yaml::Value::Map(
            o.iter()
                .map(|(k, x)| yaml::Entry {
                    key: k.clone().into(),
                    key_span: span,
                    value: json_to_node(x, span),
                })
                .collect(),
        ),
        other => yaml::Value::Scalar {
            text: other.to_string().into(),
            plain: true,
        },
    };
    Node { value, span }
}

fn collect_strings(node: &Node<'_>, path: &YamlPath, out: &mut Vec<(YamlPath, String)>) {
    match &node.value {
        yaml::Value::Scalar { .. } => {
            if let Some(s) = node.as_str() {
                if s.contains("{{") {
                    out.push((path.clone(), s.to_owned()));
                }
            }
        }
        yaml::Value::Seq(items) => {
            for (i, n) in items.iter().enumerate() {
                collect_strings(n, &path.index(i), out);
            }
        }
        yaml::Value::Map(entries) => {
            for e in entries {
                collect_strings(&e.value, &path.key(&*e.key), out);
            }
        }
    }
}

/// The span of `range` (bytes of the decoded string) inside `node`'s source, when the
/// source text maps one to one (plain or simply quoted); else the whole node.
fn sub_span(src: &str, node: &Node<'_>, range: std::ops::Range<usize>) -> Span {
    let span = node.span;
    let Some(text) = node.scalar_text() else {
        return span;
    };
    let raw = src.get(span.start..span.end).unwrap_or("");
    let offset = if raw == text {
        Some(0)
    } else if raw.len() == text.len() + 2 && &raw[1..raw.len() - 1] == text {
        Some(1)
    } else {
        None
    };
    match offset {
        Some(o) if range.end <= text.len() => {
            let start = span.start + o + range.start;
            let column = span.column + src[span.start..start].chars().count() as u32;
            Span {
                start,
                end: span.start + o + range.end,
                line: span.line,
                column,
            }
        }
        _ => span,
    }
}

fn first_line(src: &str) -> Span {
    Span {
        start: 0,
        end: src.find('\n').unwrap_or(src.len()),
        line: 1,
        column: 1,
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn infer_type(v: &Value) -> Option<ParamType> {
    match v {
        Value::Bool(_) => Some(ParamType::Boolean),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(ParamType::Integer),
        Value::Number(_) => Some(ParamType::Number),
        Value::String(_) => Some(ParamType::String),
        Value::Array(_) => Some(ParamType::List),
        Value::Null | Value::Object(_) => None,
    }
}

fn dns_hint(name: &str) -> Option<String> {
    let fixed: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let fixed = fixed.trim_matches('-').to_owned();
    (fixed != name && dns1123_label(&fixed).is_ok()).then(|| format!("did you mean `{fixed}`?"))
}

/// Params as a map for templates (`resolve_params` output), keyed by name.
pub type ParamValues = BTreeMap<String, Value>;

/// Builder methods on a diagnostic already pushed (the `err*` helpers return it).
trait Annotate {
    fn note(self, note: impl Into<String>) -> Self;
    fn hint(self, hint: impl Into<String>) -> Self;
    fn maybe_hint(self, hint: Option<String>) -> Self;
}

impl Annotate for &mut Diagnostic {
    fn note(self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    fn hint(self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    fn maybe_hint(self, hint: Option<String>) -> Self {
        if hint.is_some() {
            self.hint = hint;
        }
        self
    }
}

/// Adds the edges a stage's check found into `id` (a plain one once), keeping where a
/// `values` reference was written for cycle reports.
fn add_edges(
    graph: &mut DiGraph<StageId, EdgeKind>,
    value_origin: &mut HashMap<(StageId, StageId), YamlPath>,
    id: StageId,
    edges: Vec<(StageId, EdgeKind, Option<YamlPath>)>,
) {
    for (from, kind, origin) in edges {
        if from == id {
            continue;
        }
        if let Some(origin) = origin {
            value_origin.entry((from, id)).or_insert(origin);
        }
        let (a, b) = (NodeIndex::new(from.index()), NodeIndex::new(id.index()));
        let plain = kind == EdgeKind::Value || kind == EdgeKind::Needs;
        if plain && graph.find_edge(a, b).is_some() {
            continue;
        }
        graph.add_edge(a, b, kind);
    }
}
