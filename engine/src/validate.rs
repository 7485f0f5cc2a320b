//! Validation: a pipeline file's text in, a [`Pipeline`] or every problem out.
//!
//! The flow is `parse` (located YAML tree) → `read` (serde spec types, one section and
//! one stage at a time so one bad stage does not hide the others) → a list of small
//! `check_*` functions that accumulate [`Diagnostic`]s → `build` (the planned DAG).
//! Every diagnostic carries the YAML path and a span; references name their targets;
//! typos get "did you mean" hints.

use std::collections::{BTreeMap, HashMap, HashSet};

use indexmap::IndexMap;
use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::Value;

use crate::de::from_node;
use crate::diag::{did_you_mean, one_of, Diagnostic, Span};
use crate::expr::Expr;
use crate::plan::{
    stable_topo_order, Action, CachePolicy, Distributed, EdgeKind, Input, MapPlan, MapSource,
    Output, Param, Pipeline, Resources, RetryPolicy, Schedule, Stage, StageId,
};
use crate::spec::{
    DefaultsSpec, ParamSpec, ParamType, PipelineSpec, QuantityText, RetrySpec, ScheduleSpec,
    StageSpec, TolerationOperator, PIPELINE_FIELDS,
};
use crate::step::Catalog;
use crate::template::{Ref, Template};
use crate::units::{parse_duration, parse_quantity, Quantity};
use crate::yaml::{self, Node, YamlPath};

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

/// Validates a pipeline file's text.
pub fn validate(src: &str, catalog: &Catalog) -> Validated {
    let root = match yaml::parse(src) {
        Ok(root) => root,
        Err(diagnostics) => {
            return Validated {
                pipeline: None,
                diagnostics,
            }
        }
    };
    let mut cx = Cx {
        src,
        tree: None,
        catalog,
        diags: Vec::new(),
        with_nodes: Vec::new(),
    };
    // The tree is the largest structure validation builds: `read` consumes it stage by
    // stage, keeping only the `with` blocks the checks need. Problems found later are
    // located on demand from a fresh parse (`Cx::root`), so a valid file is parsed once.
    let raw = cx.read(root);
    let pipeline = raw.and_then(|raw| cx.check_and_build(raw));
    let unlocated: Vec<usize> = (0..cx.diags.len())
        .filter(|&i| cx.diags[i].span.is_none() && cx.diags[i].path.is_some())
        .collect();
    for i in unlocated {
        let path = YamlPath::parse(cx.diags[i].path.as_deref().unwrap_or_default());
        let loc = cx.root().locate(&path);
        let span = loc.key_span.filter(|_| loc.exact).unwrap_or(loc.node.span);
        cx.diags[i].span = Some(span);
    }
    let mut diagnostics = cx.diags;
    diagnostics.sort_by_key(|d| d.span.map(|s| (s.start, s.end)).unwrap_or_default());
    diagnostics.dedup();
    let pipeline = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        pipeline
    };
    Validated {
        pipeline,
        diagnostics,
    }
}

/// The spec as read, before semantic checks. Stages that failed to deserialize are kept
/// as `None` so references to them are not reported as unknown.
struct Raw {
    version: Option<u32>,
    name: Option<String>,
    description: Option<String>,
    params: IndexMap<String, ParamSpec>,
    schedule: Option<ScheduleSpec>,
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
}

fn p(s: &str) -> YamlPath {
    YamlPath::root().key(s)
}

impl<'a> Cx<'a> {
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
        let loc = self.root().locate(path);
        let span = sub_span(src, loc.node, range);
        self.diags
            .push(Diagnostic::new(code, msg).path(path).at(span));
        self.diags.last_mut().expect("just pushed")
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
            params: IndexMap::new(),
            schedule: None,
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
                "schedule" => raw.schedule = from_node(&e.value, &path, d),
                "defaults" => raw.defaults = from_node(&e.value, &path, d).unwrap_or_default(),
                "store" => raw.store = from_node(&e.value, &path, d),
                "params" => match e.value.as_map() {
                    Some(params) => {
                        for pe in params {
                            let pp = path.key(&*pe.key);
                            if let Some(spec) = from_node::<ParamSpec>(&pe.value, &pp, d) {
                                raw.params.insert(pe.key.to_string(), spec);
                            }
                        }
                    }
                    None if e.value.scalar() == Some(yaml::Resolved::Null) => {}
                    None => {
                        let kind = e.value.kind();
                        self.err(
                            "invalid-type",
                            &path,
                            format!(
                            "`params` is a mapping of name to `{{type, default}}`; found {kind}"
                        ),
                        );
                    }
                },
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
        Some(raw)
    }

    fn check_and_build(&mut self, raw: Raw) -> Option<Pipeline> {
        self.check_version(&raw);
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
        let params = self.check_params(&raw);
        let schedule = raw.schedule.as_ref().and_then(|s| self.check_schedule(s));
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
        for (i, (name, spec)) in raw.stages.iter().enumerate() {
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
            let Some(spec) = spec else { continue };
            let with_node = self.with_nodes.get_mut(i).and_then(Option::take);
            let mut sc = StageCx {
                id,
                name,
                path: sp,
                spec,
                with_node: with_node.as_ref(),
                raw: &raw,
                index: &index,
                params: &params,
                edges: Vec::new(),
                used_params: &mut used_params,
            };
            let stage = self.check_stage(&mut sc, &executor);
            for (from, kind, origin) in sc.edges {
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
            if let Some(stage) = stage {
                stages.push(stage);
            }
        }
        self.check_templates_in_defaults(&raw, &params, &mut used_params);
        for param in &params {
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
        // Hooks run after everything else: nothing ordinary may wait for one.
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
            params: raw.params,
            schedule: raw.schedule,
            defaults: Some(raw.defaults),
            store: raw.store,
            stages: stages_spec,
        };
        Some(Pipeline {
            name: spec.name.clone(),
            description: spec.description.clone(),
            params,
            schedule,
            store: spec.store.clone(),
            executor,
            stages,
            graph,
            order: order?,
            spec,
        })
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
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build();
        let fields = s.cron.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            self.err("invalid-cron", &sp.key("cron"), format!(
                "`{}` has {fields} fields; a cron expression has 5 (minute hour day month weekday) or 6 (seconds first)",
                s.cron
            ));
            ok = false;
        } else if let Err(e) = parser.parse(&s.cron) {
            self.err(
                "invalid-cron",
                &sp.key("cron"),
                format!("`{}` is not a valid cron expression: {e}", s.cron),
            )
            .hint("fields: [second] minute hour day-of-month month day-of-week, e.g. `0 3 * * *`");
            ok = false;
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
        if !self.catalog.executors().contains(&executor.as_str()) {
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
                self.err("invalid-duration", path, e);
                None
            }
        }
    }

    fn quantity(&mut self, path: &YamlPath, q: &QuantityText) -> Option<Quantity> {
        match parse_quantity(&q.0) {
            Ok(q) => Some(q),
            Err(e) => {
                self.err("invalid-quantity", path, e);
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

    fn check_stage(&mut self, sc: &mut StageCx<'_>, executor: &str) -> Option<Stage> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let errors_before = self.diags.iter().filter(|d| d.is_error()).count();

        // Outputs first: templates refer to them.
        let mut outputs = Vec::new();
        let mut seen = HashSet::new();
        for (i, o) in spec.outputs.iter().enumerate() {
            let op = path.key("outputs").index(i);
            if !is_ident(o.name()) {
                self.err("invalid-output-name", &op, format!(
                    "output name `{}` must start with a letter or `_` and hold only letters, digits, `_` and `-`",
                    o.name()
                ));
            } else if !seen.insert(o.name()) {
                self.err(
                    "duplicate-output",
                    &op,
                    format!("output `{}` is declared twice", o.name()),
                );
            }
            outputs.push(Output {
                name: o.name().to_owned(),
                mode: o.mode(),
            });
        }

        // Action.
        let action = match (&spec.uses, &spec.run) {
            (Some(_), Some(_)) => {
                self.err_key(
                    "uses-and-run",
                    &path.key("run"),
                    "a stage has either `uses` (a built-in step) or `run` (a command), not both",
                );
                None
            }
            (None, None) => {
                self.err_key("no-action", &path, format!(
                    "stage `{}` does nothing: give it `uses` (a built-in step) or `run` (a command)",
                    sc.name
                ));
                None
            }
            (Some(step_name), None) => self.check_uses(sc, step_name, &outputs),
            (None, Some(run)) => {
                if spec.with.is_some() {
                    self.err_key(
                        "with-without-uses",
                        &path.key("with"),
                        "`with` configures a built-in step; this stage has `run`",
                    )
                    .hint("pass configuration to a command through `args` or `env`");
                }
                let rp = path.key("run");
                if run.command.is_empty() {
                    self.err(
                        "empty-command",
                        &rp.key("command"),
                        "`command` is empty; it needs at least the program",
                    );
                }
                if let Some(prog) = run.command.first() {
                    let is_shell_line =
                        run.command.len() == 1 && prog.contains(' ') && !prog.contains("{{");
                    if is_shell_line {
                        self.err("shell-string", &rp.key("command").index(0), format!(
                            "`{prog}` is one argv element with spaces; drivetrain runs argv directly, never through a shell"
                        ))
                        .hint(format!("split it: [{}]", prog.split_whitespace().collect::<Vec<_>>().join(", ")));
                    }
                }
                let argv: Vec<Template> = run
                    .command
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (rp.key("command").index(i), a))
                    .chain(
                        run.args
                            .iter()
                            .enumerate()
                            .map(|(i, a)| (rp.key("args").index(i), a)),
                    )
                    .filter_map(|(ap, a)| self.stage_template(sc, &ap, a))
                    .collect();
                let image = run
                    .image
                    .as_ref()
                    .and_then(|i| self.stage_template(sc, &rp.key("image"), i));
                let workdir = run
                    .workdir
                    .as_ref()
                    .and_then(|w| self.stage_template(sc, &rp.key("workdir"), w));
                Some(Action::Command {
                    image,
                    argv,
                    workdir,
                })
            }
        };

        // Environment: defaults, then the stage's, then run.env.
        let mut env: Vec<(String, Template)> = Vec::new();
        let set_env = |env: &mut Vec<(String, Template)>, k: &str, t: Template| match env
            .iter_mut()
            .find(|(n, _)| n == k)
        {
            Some(slot) => slot.1 = t,
            None => env.push((k.to_owned(), t)),
        };
        for (k, v) in &sc.raw.defaults.env {
            if let Ok(t) = Template::parse(v) {
                set_env(&mut env, k, t);
            }
        }
        let run_env = spec.run.as_ref().map(|r| &r.env);
        let stage_env = spec.env.iter().map(|kv| (path.key("env"), kv));
        let run_env_iter = run_env
            .into_iter()
            .flatten()
            .map(|kv| (path.key("run").key("env"), kv));
        for (base, (k, v)) in stage_env.chain(run_env_iter).collect::<Vec<_>>() {
            let ep = base.key(k);
            self.env_name(&ep, k);
            if let Some(t) = self.stage_template(sc, &ep, v) {
                set_env(&mut env, k, t);
            }
        }

        // Inputs.
        let mut inputs = Vec::new();
        for (name, input) in &spec.inputs {
            let ip = path.key("inputs").key(name);
            if !is_ident(name) {
                self.err_key("invalid-input-name", &ip, format!(
                    "input name `{name}` must start with a letter or `_` and hold only letters, digits, `_` and `-`"
                ));
            }
            let target_path = match input {
                crate::spec::InputSpec::Short(_) => ip.clone(),
                crate::spec::InputSpec::Long(_) => ip.key("from"),
            };
            if let Some((stage, output)) =
                self.artifact_ref(sc, &target_path, input.from(), "input")
            {
                sc.edges.push((
                    stage,
                    EdgeKind::Input {
                        input: name.clone(),
                        output: output.clone(),
                    },
                    None,
                ));
                inputs.push(Input {
                    name: name.clone(),
                    stage,
                    output,
                    optional: input.optional(),
                    mode: input.mode(),
                });
            }
        }

        // needs.
        for (i, need) in spec.needs.iter().enumerate() {
            let np = path.key("needs").index(i);
            if need == sc.name {
                self.err("self-need", &np, format!("stage `{need}` needs itself"));
                continue;
            }
            match sc.index.get(need.as_str()) {
                Some(&id) => sc.edges.push((id, EdgeKind::Needs, None)),
                None => {
                    let hint = did_you_mean(need, sc.index.keys().copied());
                    self.err(
                        "unknown-stage",
                        &np,
                        format!("`needs` names unknown stage `{need}`"),
                    )
                    .maybe_hint(hint);
                }
            }
        }

        // when.
        let when = spec.when.as_ref().and_then(|w| {
            let wp = path.key("when");
            match Expr::parse(w) {
                Ok(e) => {
                    for (r, range) in e.refs() {
                        self.check_ref(sc, &wp, r, range.clone(), RefSite::Condition);
                    }
                    Some((e, w.clone()))
                }
                Err(e) => {
                    self.err_in_string(
                        "invalid-condition",
                        &wp,
                        e.range,
                        format!("invalid `when` condition: {}", e.message),
                    );
                    None
                }
            }
        });

        let map = spec.map.as_ref().and_then(|m| self.check_map(sc, m));

        // Scalars with units.
        let retries = match (&spec.retries, &sc.raw.defaults.retries) {
            (Some(r), _) => self.retries(&path.key("retries"), r),
            (None, Some(r)) => self.quietly(|cx| cx.retries(&p("defaults").key("retries"), r)),
            (None, None) => RetryPolicy::default(),
        };
        let timeout = match &spec.timeout {
            Some(t) => self.duration(&path.key("timeout"), t),
            None => sc
                .raw
                .defaults
                .timeout
                .as_deref()
                .and_then(|t| parse_duration(t).ok()),
        };
        let cache_spec = spec.cache.as_ref().or(sc.raw.defaults.cache.as_ref());
        let cache_key = match (&spec.cache, cache_spec) {
            (Some(c), _) => {
                let kp = path.key("cache").key("key");
                c.key
                    .iter()
                    .enumerate()
                    .filter_map(|(i, t)| self.stage_template(sc, &kp.index(i), t))
                    .collect()
            }
            // The defaults' entries, checked where they are written.
            (None, Some(c)) => c
                .key
                .iter()
                .filter_map(|t| Template::parse(t).ok())
                .collect(),
            (None, None) => Vec::new(),
        };
        let cache = CachePolicy {
            key: cache_key,
            enabled: cache_spec.is_none_or(|c| c.enabled),
            max_age: match spec.cache.as_ref().and_then(|c| c.max_age.as_ref()) {
                Some(m) => self.duration(&path.key("cache").key("max_age"), m),
                None => cache_spec
                    .and_then(|c| c.max_age.as_deref())
                    .and_then(|m| parse_duration(m).ok()),
            },
        };
        let resources = match &spec.resources {
            Some(r) => {
                let mut own = self.resources(&path.key("resources"), r);
                if let Some(d) = &sc.raw.defaults.resources {
                    let base = self.quietly(|cx| cx.resources(&p("defaults").key("resources"), d));
                    own.cpu = own.cpu.or(base.cpu);
                    own.memory = own.memory.or(base.memory);
                    own.gpu = own.gpu.or(base.gpu);
                    own.shm = own.shm.or(base.shm);
                    own.ephemeral_storage = own.ephemeral_storage.or(base.ephemeral_storage);
                }
                own
            }
            None => match &sc.raw.defaults.resources {
                Some(d) => self.quietly(|cx| cx.resources(&p("defaults").key("resources"), d)),
                None => Resources::default(),
            },
        };
        let distributed = spec.distributed.as_ref().and_then(|d| {
            let dp = path.key("distributed");
            let mut ok = true;
            if d.workers < 1 {
                self.err(
                    "invalid-workers",
                    &dp.key("workers"),
                    format!(
                        "`workers: {}`; a distributed stage has at least 1 worker",
                        d.workers
                    ),
                );
                ok = false;
            }
            let slots = d.slots_per_worker.unwrap_or(1);
            if slots < 1 {
                self.err(
                    "invalid-workers",
                    &dp.key("slots_per_worker"),
                    format!("`slots_per_worker: {slots}`; each worker has at least 1 slot"),
                );
                ok = false;
            }
            if d.slots_per_worker.is_some() && d.framework != crate::spec::Framework::Mpi {
                self.diags.push(
                    Diagnostic::warning(
                        "unused-field",
                        "`slots_per_worker` only applies to `framework: mpi`",
                    )
                    .path(dp.key("slots_per_worker")),
                );
            }
            if spec.map.is_some() {
                self.err_key(
                    "map-and-distributed",
                    &dp,
                    "a stage cannot both fan out with `map` and run `distributed` ranks",
                )
                .hint("split it into a map stage and a distributed stage");
                ok = false;
            }
            ok.then(|| Distributed {
                framework: d.framework,
                workers: d.workers.clamp(1, u32::MAX as i64) as u32,
                slots_per_worker: slots.clamp(1, u32::MAX as i64) as u32,
            })
        });

        // Volumes, snapshot, secrets, tolerations.
        let mut volume_names = HashSet::new();
        for (i, v) in spec.volumes.iter().enumerate() {
            let vp = path.key("volumes").index(i);
            if let Err(why) = dns1123_label(&v.name) {
                self.err(
                    "invalid-volume",
                    &vp.key("name"),
                    format!("volume name `{}` {why}", v.name),
                );
            }
            if !volume_names.insert(v.name.as_str()) {
                self.err(
                    "invalid-volume",
                    &vp.key("name"),
                    format!("volume `{}` is declared twice", v.name),
                );
            }
            if !v.mount_path.starts_with('/') {
                self.err(
                    "invalid-volume",
                    &vp.key("mount_path"),
                    format!("`mount_path` must be absolute, got `{}`", v.mount_path),
                );
            }
            let sources = [
                v.claim.is_some(),
                v.empty_dir.is_some(),
                v.from_snapshot.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if sources != 1 {
                self.err(
                    "invalid-volume",
                    &vp,
                    format!(
                        "volume `{}` needs exactly one of `claim`, `empty_dir` and `from_snapshot`",
                        v.name
                    ),
                );
            }
            if let Some(q) = &v.empty_dir {
                self.quantity(&vp.key("empty_dir"), q);
            }
            if let Some(name) = &v.from_snapshot {
                // `{{ stages.X.values.snapshot.name }}`: a snapshot an upstream stage took.
                let _ = self.stage_template(sc, &vp.key("from_snapshot"), name);
            }
            match (&v.from_snapshot, &v.size) {
                (Some(_), Some(q)) => {
                    self.quantity(&vp.key("size"), q);
                }
                (Some(_), None) => {
                    self.err(
                        "invalid-volume",
                        &vp,
                        format!(
                            "volume `{}` is restored from a snapshot and needs `size` (at least the snapshot's size)",
                            v.name
                        ),
                    );
                }
                (None, Some(_)) => {
                    self.err(
                        "invalid-volume",
                        &vp.key("size"),
                        format!("`size` is for volumes restored with `from_snapshot`; volume `{}` is not", v.name),
                    );
                }
                (None, None) => {}
            }
        }
        if let Some(s) = &spec.snapshot {
            if !volume_names.contains(s.volume.as_str()) {
                let hint = did_you_mean(&s.volume, volume_names.iter().copied());
                self.err(
                    "unknown-volume",
                    &path.key("snapshot").key("volume"),
                    format!(
                        "`snapshot` names volume `{}`, which this stage does not mount",
                        s.volume
                    ),
                )
                .maybe_hint(hint);
            }
        }
        for (i, s) in spec.secrets.iter().enumerate() {
            let sp = path.key("secrets").index(i);
            match (&s.env, &s.mount_path) {
                (Some(_), Some(_)) | (None, None) => {
                    self.err("invalid-secret", &sp, format!(
                        "secret `{}` needs exactly one of `env` (one key as a variable) and `mount_path` (files)",
                        s.name
                    ));
                }
                (Some(var), None) => {
                    self.env_name(&sp.key("env"), var);
                    if s.key.is_none() {
                        self.err(
                            "invalid-secret",
                            &sp,
                            format!(
                                "secret `{}` exposed as `{var}` needs the `key` to read",
                                s.name
                            ),
                        );
                    }
                }
                (None, Some(m)) if !m.starts_with('/') => {
                    self.err(
                        "invalid-secret",
                        &sp.key("mount_path"),
                        format!("`mount_path` must be absolute, got `{m}`"),
                    );
                }
                _ => {}
            }
        }
        for (i, t) in spec.tolerations.iter().enumerate() {
            if t.operator == TolerationOperator::Exists && t.value.is_some() {
                self.err(
                    "invalid-toleration",
                    &path.key("tolerations").index(i).key("value"),
                    "a toleration with `operator: Exists` takes no `value`",
                );
            }
        }

        // Image for container executors.
        let image = match spec.run.as_ref().and_then(|r| r.image.as_ref()) {
            Some(i) => Template::parse(i).ok(),
            None => sc
                .raw
                .defaults
                .image
                .as_deref()
                .and_then(|i| Template::parse(i).ok()),
        };
        if executor == "kubernetes" && image.is_none() {
            self.err_key(
                "missing-image",
                &path,
                format!(
                "stage `{}` has no image; the kubernetes executor runs every stage in a container",
                sc.name
            ),
            )
            .hint("set `run.image` or `defaults.image`");
        }

        let errors_after = self.diags.iter().filter(|d| d.is_error()).count();
        if errors_after > errors_before {
            return None;
        }
        Some(Stage {
            id: sc.id,
            name: sc.name.to_owned(),
            description: spec.description.clone(),
            action: action?,
            env,
            inputs,
            outputs,
            when,
            map,
            hook: spec.hook,
            retries,
            timeout,
            cache,
            resources,
            distributed,
            volumes: spec.volumes.clone(),
            snapshot: spec.snapshot.clone(),
            secrets: spec.secrets.clone(),
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            image,
        })
    }

    fn check_uses(
        &mut self,
        sc: &mut StageCx<'_>,
        step_name: &str,
        outputs: &[Output],
    ) -> Option<Action> {
        let path = sc.path.clone();
        let Some(step) = self.catalog.step(step_name) else {
            let names = self.catalog.step_names();
            let hint = did_you_mean(step_name, names.iter().copied());
            self.err(
                "unknown-step",
                &path.key("uses"),
                format!("unknown step `{step_name}`"),
            )
            .note(format!("built-in steps: {}", names.join(", ")))
            .maybe_hint(hint);
            return None;
        };
        let with_path = path.key("with");
        let with_node = sc.with_node;
        // A value that is exactly one `{{ params.x }}` takes the param's type, so
        // `epochs: "{{ params.epochs }}"` type-checks as the integer it will be.
        let typed = with_node.map(|n| typed_params(n, sc.params));
        let mut diags = step.check_config(typed.as_ref(), &with_path);
        for d in &mut diags {
            if d.span.is_none() {
                let loc = self.root().locate(&path.key("uses"));
                d.span = Some(loc.node.span);
            }
            if d.code == "unknown-field" || d.code == "missing-field" || d.code == "invalid-type" {
                d.message = format!("step `{step_name}`: {}", d.message);
            }
        }
        let config_ok = diags
            .iter()
            .all(|d| d.severity != crate::diag::Severity::Error);
        self.diags.extend(diags);
        // What the type cannot say (SQL that parses, columns that exist, a gate over known
        // metrics), checked on the config rendered with the params' defaults.
        if config_ok {
            let config = with_node
                .map(Node::to_json)
                .unwrap_or(Value::Object(Default::default()));
            let params = sc.params;
            let lookup = |r: &Ref| match r {
                Ref::Param(n) => params.iter().find(|p| &p.name == n)?.default.clone(),
                _ => None,
            };
            let rendered = crate::template::render_value(&config, &lookup);
            for (sub, message) in step.check_semantics(&rendered) {
                let mut p = with_path.clone();
                for part in sub.split('.').filter(|s| !s.is_empty()) {
                    p = match part.parse::<usize>() {
                        Ok(i) => p.index(i),
                        Err(_) => p.key(part),
                    };
                }
                self.err(
                    "invalid-step-config",
                    &p,
                    format!("step `{step_name}`: {message}"),
                );
            }
        }
        // Templates inside the config's strings.
        if let Some(node) = with_node {
            let mut strings = Vec::new();
            collect_strings(node, &with_path, &mut strings);
            for (sp, text) in strings {
                self.stage_template(sc, &sp, &text);
            }
        }
        for (i, o) in outputs.iter().enumerate() {
            if !step.outputs().contains(&o.name.as_str()) {
                let hint = did_you_mean(&o.name, step.outputs().iter().copied());
                self.err(
                    "unknown-output",
                    &path.key("outputs").index(i),
                    format!(
                        "step `{step_name}` writes no output `{}`; it writes {}",
                        o.name,
                        one_of(step.outputs())
                    ),
                )
                .maybe_hint(hint);
            }
        }
        for (input, required) in step.inputs() {
            if *required && !sc.spec.inputs.contains_key(*input) {
                self.err_key(
                    "missing-input",
                    &path.key("uses"),
                    format!(
                    "step `{step_name}` reads input `{input}`, which the stage does not provide"
                ),
                )
                .hint(format!("add `inputs: {{{input}: STAGE.OUTPUT}}`"));
            }
        }
        for name in sc.spec.inputs.keys() {
            if !step.inputs().iter().any(|(n, _)| n == name) {
                let names: Vec<&str> = step.inputs().iter().map(|(n, _)| *n).collect();
                let hint = did_you_mean(name, names.iter().copied());
                self.err_key(
                    "unknown-input",
                    &path.key("inputs").key(name),
                    format!(
                        "step `{step_name}` reads no input `{name}`; it reads {}",
                        one_of(&names)
                    ),
                )
                .maybe_hint(hint);
            }
        }
        let config = with_node
            .map(Node::to_json)
            .unwrap_or(Value::Object(Default::default()));
        let connected: Vec<&str> = sc.spec.inputs.keys().map(String::as_str).collect();
        // The config's templates were checked above; a read built from one parses.
        let reads = step
            .reads(&config, &connected)
            .iter()
            .filter_map(|r| Template::parse(r).ok())
            .collect();
        Some(Action::Step {
            registry: step.writes_registry(),
            reads,
            name: step.name().to_owned(),
            version: step.version().to_owned(),
            config,
        })
    }

    fn check_map(&mut self, sc: &mut StageCx<'_>, m: &crate::spec::MapSpec) -> Option<MapPlan> {
        let mp = sc.path.key("map");
        let sources = [m.items.is_some(), m.param.is_some(), m.from.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if sources != 1 {
            self.err_key("invalid-map", &mp, "`map` needs exactly one of `items` (a list), `param` (a list param) and `from` (an upstream output)");
            return None;
        }
        if let Some(r) = m.min_success_ratio {
            if !(0.0..=1.0).contains(&r) {
                self.err(
                    "invalid-map",
                    &mp.key("min_success_ratio"),
                    format!("`min_success_ratio: {r}` must be between 0 and 1"),
                );
            }
        }
        if m.max_parallel == Some(0) {
            self.err(
                "invalid-map",
                &mp.key("max_parallel"),
                "`max_parallel: 0` would never run an item",
            );
        }
        let source = if let Some(items) = &m.items {
            if items.is_empty() {
                self.diags.push(
                    Diagnostic::warning(
                        "empty-map",
                        "`map.items` is empty: the stage will run no item",
                    )
                    .path(mp.key("items")),
                );
            }
            MapSource::Items(items.clone())
        } else if let Some(param) = &m.param {
            sc.used_params.insert(param.clone());
            match sc.params.iter().find(|p| &p.name == param) {
                Some(p) if p.kind == ParamType::List => {}
                Some(p) => {
                    self.err(
                        "invalid-map",
                        &mp.key("param"),
                        format!(
                            "`map.param` names param `{param}` of type `{}`; it must be a `list`",
                            p.kind.as_str()
                        ),
                    );
                }
                None => {
                    let range = 0..param.len();
                    self.unknown_param(&mp.key("param"), range, param, sc.params);
                }
            }
            MapSource::Param(param.clone())
        } else {
            let from = m.from.as_deref().unwrap_or_default();
            let (stage, output) = self.artifact_ref(sc, &mp.key("from"), from, "map source")?;
            sc.edges.push((
                stage,
                EdgeKind::MapFrom {
                    output: output.clone(),
                },
                None,
            ));
            MapSource::From { stage, output }
        };
        Some(MapPlan {
            source,
            max_parallel: m.max_parallel,
            min_success_ratio: m.min_success_ratio.unwrap_or(1.0),
        })
    }

    /// Resolves `stage.output`, reporting unknown stages and outputs.
    fn artifact_ref(
        &mut self,
        sc: &StageCx<'_>,
        path: &YamlPath,
        text: &str,
        what: &str,
    ) -> Option<(StageId, String)> {
        let Some((stage, output)) = text.split_once('.') else {
            self.err(
                "invalid-reference",
                path,
                format!("{what} `{text}` must name `stage.output`"),
            );
            return None;
        };
        if stage == sc.name {
            self.err(
                "self-reference",
                path,
                format!("{what} `{text}` names the stage's own output"),
            );
            return None;
        }
        let Some(&id) = sc.index.get(stage) else {
            let hint = did_you_mean(stage, sc.index.keys().copied());
            self.err(
                "unknown-stage",
                path,
                format!("{what} `{text}` names unknown stage `{stage}`"),
            )
            .maybe_hint(hint);
            return None;
        };
        if let Some(Some(producer)) = sc.raw.stages.get(stage) {
            let outputs: Vec<&str> = producer.outputs.iter().map(|o| o.name()).collect();
            if !outputs.contains(&output) {
                let hint = did_you_mean(output, outputs.iter().copied());
                let declared = if outputs.is_empty() {
                    format!("stage `{stage}` declares no outputs")
                } else {
                    format!("stage `{stage}` declares {}", one_of(&outputs))
                };
                self.err(
                    "unknown-output",
                    path,
                    format!("{what} `{text}` names unknown output `{output}`"),
                )
                .note(declared)
                .maybe_hint(hint);
                return None;
            }
        }
        Some((id, output.to_owned()))
    }

    /// Parses a template in a stage field and checks each reference.
    fn stage_template(
        &mut self,
        sc: &mut StageCx<'_>,
        path: &YamlPath,
        text: &str,
    ) -> Option<Template> {
        let t = self.template(path, text)?;
        let mut ok = true;
        for (r, range) in t.refs() {
            ok &= self.check_ref(sc, path, r, range.clone(), RefSite::Template);
        }
        ok.then_some(t)
    }

    fn check_ref(
        &mut self,
        sc: &mut StageCx<'_>,
        path: &YamlPath,
        r: &Ref,
        range: std::ops::Range<usize>,
        site: RefSite,
    ) -> bool {
        match r {
            Ref::Param(name) => {
                sc.used_params.insert(name.clone());
                if !sc.params.iter().any(|p| &p.name == name) && !sc.raw.params.contains_key(name) {
                    self.unknown_param(path, range, name, sc.params);
                    return false;
                }
            }
            Ref::RunId | Ref::RunDate | Ref::RunStatus | Ref::PipelineName | Ref::ScheduleTime => {}
            Ref::Input(name) | Ref::Output(name) if site == RefSite::Condition => {
                let _ = name;
                self.err_in_string("invalid-reference", path, range, format!(
                    "`{r}` is a path known only while the stage runs; `when` is decided before it starts"
                ))
                .hint("read small results through `stages.STAGE.values.KEY`");
                return false;
            }
            Ref::Input(name) => {
                if !sc.spec.inputs.contains_key(name) {
                    let names: Vec<&str> = sc.spec.inputs.keys().map(String::as_str).collect();
                    let hint = did_you_mean(name, names.iter().copied());
                    let note = if names.is_empty() {
                        "the stage declares no inputs".to_owned()
                    } else {
                        format!("declared inputs: {}", one_of(&names))
                    };
                    self.err_in_string(
                        "unknown-input",
                        path,
                        range,
                        format!("unknown input `{name}`"),
                    )
                    .note(note)
                    .maybe_hint(hint);
                    return false;
                }
            }
            Ref::Output(name) => {
                if !sc.spec.outputs.iter().any(|o| o.name() == name) {
                    let names: Vec<&str> = sc.spec.outputs.iter().map(|o| o.name()).collect();
                    let hint = did_you_mean(name, names.iter().copied());
                    let note = if names.is_empty() {
                        "the stage declares no outputs".to_owned()
                    } else {
                        format!("declared outputs: {}", one_of(&names))
                    };
                    self.err_in_string(
                        "unknown-output",
                        path,
                        range,
                        format!("unknown output `{name}`"),
                    )
                    .note(note)
                    .maybe_hint(hint);
                    return false;
                }
            }
            Ref::StageValue { stage, .. } => {
                if stage == sc.name {
                    self.err_in_string(
                        "self-reference",
                        path,
                        range,
                        format!(
                        "`{r}` reads the stage's own values, which exist only after it finishes"
                    ),
                    );
                    return false;
                }
                match sc.index.get(stage.as_str()) {
                    Some(&id) => sc.edges.push((id, EdgeKind::Value, Some(path.clone()))),
                    None => {
                        let hint = did_you_mean(stage, sc.index.keys().copied());
                        self.err_in_string(
                            "unknown-stage",
                            path,
                            range,
                            format!("`{r}` names unknown stage `{stage}`"),
                        )
                        .maybe_hint(hint);
                        return false;
                    }
                }
            }
            Ref::Item(_) => {
                if sc.spec.map.is_none() {
                    self.err_in_string(
                        "item-outside-map",
                        path,
                        range,
                        format!("`{r}` is only defined in a stage with `map`"),
                    );
                    return false;
                }
            }
        }
        true
    }

    fn report_cycles(
        &mut self,
        graph: &DiGraph<StageId, EdgeKind>,
        names: &[&str],
        raw: &Raw,
        value_origin: &HashMap<(StageId, StageId), YamlPath>,
    ) {
        // Where the edge a → b was declared in b's spec.
        let origin = |a: StageId, b: StageId| -> Option<YamlPath> {
            let (from, to) = (names[a.index()], names[b.index()]);
            let sp = p("stages").key(to);
            let edge = graph.find_edge(NodeIndex::new(a.index()), NodeIndex::new(b.index()))?;
            match &graph[edge] {
                EdgeKind::Needs => {
                    let spec = raw.stages.get(to)?.as_ref()?;
                    let i = spec.needs.iter().position(|n| n == from)?;
                    Some(sp.key("needs").index(i))
                }
                EdgeKind::Input { input, .. } => Some(sp.key("inputs").key(input)),
                EdgeKind::MapFrom { .. } => Some(sp.key("map").key("from")),
                EdgeKind::Value => value_origin.get(&(a, b)).cloned(),
            }
        };
        let mut sccs = petgraph::algo::tarjan_scc(graph);
        sccs.iter_mut().for_each(|c| c.sort());
        sccs.sort();
        for scc in sccs.into_iter().filter(|c| c.len() > 1) {
            let members: HashSet<NodeIndex> = scc.iter().copied().collect();
            let start = scc[0];
            // Shortest path from start back to start inside the component (BFS).
            let mut prev: HashMap<NodeIndex, NodeIndex> = HashMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut found = false;
            'bfs: while let Some(n) = queue.pop_front() {
                let mut next: Vec<NodeIndex> =
                    graph.neighbors(n).filter(|m| members.contains(m)).collect();
                next.sort();
                for m in next {
                    if m == start {
                        prev.insert(start, n);
                        found = true;
                        break 'bfs;
                    }
                    if let std::collections::hash_map::Entry::Vacant(e) = prev.entry(m) {
                        e.insert(n);
                        queue.push_back(m);
                    }
                }
            }
            if !found {
                continue;
            }
            let mut cycle = vec![start];
            let mut cur = prev[&start];
            while cur != start {
                cycle.push(cur);
                cur = prev[&cur];
            }
            cycle.push(start);
            cycle.reverse();
            let spelled: Vec<&str> = cycle.iter().map(|n| names[n.index()]).collect();
            let first_edge = (graph[cycle[0]], graph[cycle[1]]);
            let at = origin(first_edge.0, first_edge.1)
                .unwrap_or_else(|| p("stages").key(names[first_edge.1.index()]));
            let mut notes = Vec::new();
            for w in cycle.windows(2) {
                let (a, b) = (graph[w[0]], graph[w[1]]);
                if let Some(o) = origin(a, b) {
                    let loc = self.root().locate(&o).node.span;
                    notes.push(format!(
                        "`{}` depends on `{}` through `{o}` (line {})",
                        names[b.index()],
                        names[a.index()],
                        loc.line
                    ));
                }
            }
            let d = self.err(
                "cycle",
                &at,
                format!("dependency cycle: {}", spelled.join(" → ")),
            );
            for n in notes {
                d.notes.push(n);
            }
            d.hint = Some("a pipeline is a DAG: remove one of these dependencies".into());
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefSite {
    Template,
    Condition,
}

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
    edges: Vec<(StageId, EdgeKind, Option<YamlPath>)>,
    used_params: &'s mut HashSet<String>,
}

/// A copy of `node` where each string that is exactly one `{{ params.x }}` is replaced by
/// the param's default (or a placeholder of its type), keeping spans.
fn typed_params<'a>(node: &Node<'a>, params: &[Param]) -> Node<'a> {
    let value = match &node.value {
        yaml::Value::Scalar { .. } => {
            let param = node
                .as_str()
                .and_then(|s| Template::parse(s).ok())
                .and_then(|t| match t.parts.as_slice() {
                    [crate::template::Part::Ref(Ref::Param(name), _)] => {
                        params.iter().find(|p| &p.name == name)
                    }
                    _ => None,
                });
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
        yaml::Value::Seq(items) => {
            yaml::Value::Seq(items.iter().map(|n| typed_params(n, params)).collect())
        }
        yaml::Value::Map(entries) => yaml::Value::Map(
            entries
                .iter()
                .map(|e| yaml::Entry {
                    key: e.key.clone(),
                    key_span: e.key_span,
                    value: typed_params(&e.value, params),
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

/// Checks a DNS-1123 label: what Kubernetes accepts as a name and label value.
pub fn dns1123_label(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "is {} characters long; at most 63 fit a Kubernetes name",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("may hold only lowercase letters, digits and `-`".into());
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("must start and end with a letter or digit".into());
    }
    Ok(())
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

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
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
