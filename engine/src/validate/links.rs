//! What connects stages: built-in steps named by `uses:` and their inputs, `map:`
//! sources, artifact references (`STAGE.OUTPUT`), references in templates and
//! conditions, and cycles, reported with the cycle spelled out.

use std::collections::{HashMap, HashSet};

use petgraph::graph::{DiGraph, NodeIndex};
use serde_json::Value;

use crate::diag::{did_you_mean, one_of, Diagnostic};
use crate::plan::{Action, EdgeKind, MapPlan, MapSource, Output, StageId};
use crate::spec::ParamType;
use crate::template::{Ref, Template};
use crate::yaml::{Node, YamlPath};

use super::{collect_strings, p, typed_params, Annotate, Cx, Raw, RefSite, StageCx};

impl<'a> Cx<'a> {
    pub(super) fn check_uses(
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
        let typed = typed_with(sc);
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
        self.check_step_io(sc, (step.outputs(), step.inputs()), step_name, outputs);
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

    /// The outputs a `uses:` stage names are its step's; the inputs the step needs are
    /// connected, and every input connected is one it reads.
    pub(super) fn check_step_io(
        &mut self,
        sc: &StageCx<'_>,
        (step_outputs, step_inputs): (&[&str], &[(&str, bool)]),
        step_name: &str,
        outputs: &[Output],
    ) {
        let path = sc.path.clone();
        for (i, o) in outputs.iter().enumerate() {
            if !step_outputs.contains(&o.name.as_str()) {
                let hint = did_you_mean(&o.name, step_outputs.iter().copied());
                self.err(
                    "unknown-output",
                    &path.key("outputs").index(i),
                    format!(
                        "step `{step_name}` writes no output `{}`; it writes {}",
                        o.name,
                        one_of(step_outputs)
                    ),
                )
                .maybe_hint(hint);
            }
        }
        for (input, required) in step_inputs {
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
            if !step_inputs.iter().any(|(n, _)| n == name) {
                let names: Vec<&str> = step_inputs.iter().map(|(n, _)| *n).collect();
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
    }

    pub(super) fn check_map(
        &mut self,
        sc: &mut StageCx<'_>,
        m: &crate::spec::MapSpec,
    ) -> Option<MapPlan> {
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
    pub(super) fn artifact_ref(
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
    pub(super) fn stage_template(
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

    pub(super) fn check_ref(
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
            Ref::RunId
            | Ref::RunDate
            | Ref::RunStatus
            | Ref::PipelineName
            | Ref::PipelineDir
            | Ref::ScheduleTime => {}
            Ref::With(_) | Ref::StepDir => {
                self.step_only_ref(path, r, range);
                return false;
            }
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
            Ref::StageValue { stage, key } => {
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
                    Some(&id) => {
                        sc.edges.push((id, EdgeKind::Value, Some(path.clone())));
                        return self.reported_value(sc, path, range, (stage, &key[0]), r);
                    }
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
            Ref::Trial(t) => return self.trial_ref(sc, path, range, t, r),
        }
        true
    }

    /// Whether a `trial.*` reference reads what the stage's search has: a search at all,
    /// a budget for `trial.budget`, a hyperparameter of its space for `trial.params.X`.
    fn trial_ref(
        &mut self,
        sc: &StageCx<'_>,
        path: &YamlPath,
        range: std::ops::Range<usize>,
        t: &crate::template::TrialRef,
        r: &Ref,
    ) -> bool {
        use crate::template::TrialRef;
        let Some(search) = &sc.spec.search else {
            self.err_in_string(
                "trial-outside-search",
                path,
                range,
                format!("`{r}` is only defined in a stage with `search`"),
            );
            return false;
        };
        match t {
            TrialRef::Id => true,
            TrialRef::Budget if search.budget.is_none() => {
                self.err_in_string(
                    "trial-outside-search",
                    path,
                    range,
                    format!(
                        "`{r}` reads the search's budget, and it has none: give `search.budget`"
                    ),
                );
                false
            }
            TrialRef::Budget => true,
            TrialRef::Param(name) if search.space.contains_key(name) => true,
            TrialRef::Param(name) => {
                let hint = did_you_mean(name, search.space.keys().map(String::as_str));
                let names: Vec<&str> = search.space.keys().map(String::as_str).collect();
                self.err_in_string(
                    "unknown-hyperparameter",
                    path,
                    range,
                    format!(
                        "`{r}`: the search's space has no `{name}` (it has {})",
                        names.join(", ")
                    ),
                )
                .maybe_hint(hint);
                false
            }
        }
    }

    /// Whether the value `key` of `stage` (a `uses:` step that says what it reports) is
    /// one it reports; an error naming those it does if not. A `run:` stage's values are
    /// known only when it has run (a `when` reading one it did not report fails it).
    fn reported_value(
        &mut self,
        sc: &StageCx<'_>,
        path: &YamlPath,
        range: std::ops::Range<usize>,
        (stage, key): (&str, &str),
        r: &Ref,
    ) -> bool {
        let uses = sc
            .raw
            .stages
            .get(stage)
            .and_then(|s| s.as_ref()?.uses.as_deref());
        let Some(step) = uses.and_then(|u| self.catalog.step(u)) else {
            return true;
        };
        let reported = step.values();
        if reported.is_empty() || reported.contains(&key) {
            return true;
        }
        let hint = did_you_mean(key, reported.iter().copied());
        self.err_in_string(
            "unknown-value",
            path,
            range,
            format!(
                "`{r}`: step `{}` of stage `{stage}` reports no value `{key}`",
                step.name()
            ),
        )
        .note(format!("its values: {}", reported.join(", ")))
        .maybe_hint(hint);
        false
    }

    pub(super) fn report_cycles(
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

/// A trial as validation pictures it: the first value of each hyperparameter (a range's
/// low end), the full budget.
/// A stage's `with:` with the values whose type a template fixes typed: exactly one
/// `{{ params.x }}` takes the param's type, so `epochs: "{{ params.epochs }}"` type-checks
/// as the integer it will be; one `{{ item }}` the type of the map's first item, where the
/// items are written; one `{{ trial.* }}` a sample trial's.
pub(super) fn typed_with<'n>(sc: &StageCx<'n>) -> Option<Node<'n>> {
    let item = sc.spec.map.as_ref().and_then(|m| {
        let listed = m.items.as_ref().and_then(|i| i.first());
        let param = m.param.as_ref().and_then(|name| {
            let p = sc.params.iter().find(|p| &p.name == name)?;
            p.default.as_ref()?.as_array()?.first()
        });
        listed.or(param)
    });
    let trial = sc.spec.search.as_ref().map(sample_trial);
    sc.with_node
        .map(|n| typed_params(n, sc.params, item, trial.as_ref()))
}

fn sample_trial(s: &crate::spec::SearchSpec) -> Value {
    let params: serde_json::Map<String, Value> = s
        .space
        .iter()
        .map(|(name, d)| {
            let v = match (&d.choice, d.int, d.uniform.or(d.log_uniform)) {
                (Some(c), _, _) => c.first().cloned().unwrap_or(Value::Null),
                (_, Some([lo, _]), _) => Value::from(lo),
                (_, _, Some([lo, _])) => Value::from(lo),
                _ => Value::Null,
            };
            (name.clone(), v)
        })
        .collect();
    serde_json::json!({
        "id": crate::search::SearchPlan::trial_id(0),
        "budget": s.budget.as_ref().map(|b| b.max),
        "params": params,
    })
}
