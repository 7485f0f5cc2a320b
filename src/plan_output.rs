//! `drivetrain plan`'s output: the planned stages as text (argv as a shell would show
//! it, the rendered `with:` block) or as JSON.

use std::collections::BTreeMap;

use drivetrain_engine::plan::{
    framework_name, render_for_plan, Action, MapPlan, MapSource, Pipeline, Stage,
};
use serde_json::{json, Value};

/// Shows argv as a copy-pasteable line (display only: nothing is run through a shell).
fn shell_display(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let safe = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+{}".contains(c));
            if safe && !a.contains("{{") {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn plan_text(
    p: &Pipeline,
    params: &BTreeMap<String, Value>,
    selected: &std::collections::BTreeSet<drivetrain_engine::StageId>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pipeline {}: {} stages, executor {}{}",
        p.name,
        p.stages.len(),
        p.executor,
        if selected.len() == p.stages.len() {
            String::new()
        } else {
            format!(", {} selected", selected.len())
        }
    );
    if !params.is_empty() {
        let shown: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", drivetrain_engine::template::value_text(v)))
            .collect();
        let _ = writeln!(out, "params: {}", shown.join(" "));
    }
    if let Some(s) = &p.schedule {
        let _ = writeln!(
            out,
            "schedule: `{}` in {} (concurrency {:?}, catchup {:?}{})",
            s.cron,
            s.timezone,
            s.concurrency,
            s.catchup,
            if s.suspend { ", suspended" } else { "" }
        );
    }
    for (n, id) in p.order.iter().enumerate() {
        let s = p.stage(*id);
        let upstream: Vec<&str> = p
            .upstream(*id)
            .into_iter()
            .map(|u| p.stage(u).name.as_str())
            .collect();
        let mark = if selected.contains(id) {
            ""
        } else {
            "  (reused, not selected)"
        };
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:>3}. {}{}{}",
            n + 1,
            s.name,
            if upstream.is_empty() {
                String::new()
            } else {
                format!("  ← {}", upstream.join(", "))
            },
            mark
        );
        let mut fields = Vec::new();
        action_fields(&mut fields, s, params);
        io_fields(&mut fields, p, s, params);
        if let Some(m) = &s.map {
            fields.push(("map", map_line(p, m, params)));
        }
        run_fields(&mut fields, s);
        storage_fields(&mut fields, s);
        for (k, v) in fields {
            let _ = writeln!(out, "     {k:<12} {v}");
        }
    }
    out
}

/// A stage's `KEY  value` lines in `plan`'s text, in order.
type Fields = Vec<(&'static str, String)>;

fn push(f: &mut Fields, k: &'static str, v: String) {
    f.push((k, v));
}

/// What the stage runs: its step and config, or its command and working directory.
fn action_fields(f: &mut Fields, s: &Stage, params: &BTreeMap<String, Value>) {
    match &s.action {
        Action::Step {
            name,
            version,
            config,
            ..
        } => {
            push(f, "uses", format!("{name}@{version}"));
            if config.as_object().is_some_and(|o| !o.is_empty()) {
                let rendered = render_json_templates(config, params);
                push(f, "with", rendered.to_string());
            }
        }
        Action::Command { argv, workdir, .. } => {
            if let Some(p) = &s.plugin {
                push(f, "plugin", format!("{} ({})", p.label(), p.uses));
            }
            let argv: Vec<String> = argv.iter().map(|t| render_for_plan(t, params)).collect();
            push(f, "command", shell_display(&argv));
            if let Some(w) = workdir {
                push(f, "workdir", render_for_plan(w, params));
            }
        }
        Action::Approval {
            role,
            min,
            timeout,
            on_timeout,
        } => {
            let until = match timeout {
                Some(t) => format!(
                    ", {} then {}",
                    humantime::format_duration(*t),
                    on_timeout.as_str()
                ),
                None => String::new(),
            };
            push(f, "approval", format!("{min} of role `{role}`{until}"));
        }
    }
}

/// Its image, inputs, outputs, environment and condition.
fn io_fields(f: &mut Fields, p: &Pipeline, s: &Stage, params: &BTreeMap<String, Value>) {
    if let Some(img) = &s.image {
        push(f, "image", render_for_plan(img, params));
    }
    for i in &s.inputs {
        push(
            f,
            "input",
            format!(
                "{} ← {}.{}{}",
                i.name,
                p.stage(i.stage).name,
                i.output,
                if i.optional { " (optional)" } else { "" }
            ),
        );
    }
    if !s.outputs.is_empty() {
        let names: Vec<&str> = s.outputs.iter().map(|o| o.name.as_str()).collect();
        push(f, "outputs", names.join(", "));
    }
    for (k, v) in &s.env {
        push(f, "env", format!("{k}={}", render_for_plan(v, params)));
    }
    if let Some((_, text)) = &s.when {
        push(f, "when", text.clone());
    }
}

/// What a map stage runs over, and how many at once.
fn map_line(p: &Pipeline, m: &MapPlan, params: &BTreeMap<String, Value>) -> String {
    let over = match &m.source {
        MapSource::Items(items) => format!("{} items", items.len()),
        MapSource::Param(name) => match params.get(name) {
            Some(Value::Array(a)) => format!("param {name} ({} items)", a.len()),
            _ => format!("param {name}"),
        },
        MapSource::From { stage, output } => {
            format!("items of {}.{}", p.stage(*stage).name, output)
        }
    };
    let mut line = format!("over {over}");
    if let Some(mp) = m.max_parallel {
        line.push_str(&format!(", at most {mp} at once"));
    }
    if m.min_success_ratio < 1.0 {
        line.push_str(&format!(
            ", succeeds at ≥{}% of items",
            m.min_success_ratio * 100.0
        ));
    }
    line
}

/// How it runs: distribution, resources, retries, timeout, cache.
fn run_fields(f: &mut Fields, s: &Stage) {
    if let Some(d) = &s.distributed {
        push(
            f,
            "distributed",
            format!(
                "{} × {} workers{}",
                framework_name(d.framework),
                d.workers,
                if d.slots_per_worker > 1 {
                    format!(", {} slots each", d.slots_per_worker)
                } else {
                    String::new()
                }
            ),
        );
    }
    let r = &s.resources;
    let mut res = Vec::new();
    if let Some(c) = &r.cpu {
        res.push(format!("cpu={c}"));
    }
    if let Some(m) = &r.memory {
        res.push(format!("memory={m}"));
    }
    if let Some(g) = r.gpu {
        res.push(format!("gpu={g}"));
    }
    if let Some(s) = &r.shm {
        res.push(format!("shm={s}"));
    }
    if let Some(e) = &r.ephemeral_storage {
        res.push(format!("ephemeral-storage={e}"));
    }
    if !res.is_empty() {
        push(f, "resources", res.join(" "));
    }
    if s.retries.limit > 0 {
        push(
            f,
            "retries",
            format!(
                "{} (backoff {}, max {})",
                s.retries.limit,
                humantime::format_duration(s.retries.backoff),
                humantime::format_duration(s.retries.max_backoff)
            ),
        );
    }
    if let Some(t) = s.timeout {
        push(f, "timeout", humantime::format_duration(t).to_string());
    }
    if !s.cache.enabled {
        push(f, "cache", "disabled".into());
    }
}

/// Its volumes, snapshot and secrets.
fn storage_fields(f: &mut Fields, s: &Stage) {
    for v in &s.volumes {
        let src = v
            .claim
            .as_ref()
            .map(|c| format!("claim {c}"))
            .or_else(|| {
                v.from_snapshot
                    .as_ref()
                    .map(|s| format!("from snapshot {s}"))
            })
            .or_else(|| v.empty_dir.as_ref().map(|q| format!("empty dir {}", q.0)))
            .unwrap_or_default();
        push(
            f,
            "volume",
            format!("{} at {} ({src})", v.name, v.mount_path),
        );
    }
    if let Some(snap) = &s.snapshot {
        push(
            f,
            "snapshot",
            format!("volume {} on {:?}", snap.volume, snap.when).to_lowercase(),
        );
    }
    for sec in &s.secrets {
        let to = match (&sec.env, &sec.mount_path) {
            (Some(e), _) => format!("env {e}"),
            (None, Some(m)) => format!("files at {m}"),
            _ => String::new(),
        };
        push(
            f,
            "secret",
            format!(
                "{}{} → {to}",
                sec.name,
                sec.key
                    .as_ref()
                    .map(|k| format!("/{k}"))
                    .unwrap_or_default()
            ),
        );
    }
}

/// Substitutes params into a step config, for display; run-time references stay visible.
fn render_json_templates(v: &Value, params: &BTreeMap<String, Value>) -> Value {
    drivetrain_engine::template::render_value(v, &|r| match r {
        drivetrain_engine::template::Ref::Param(p) => params.get(p).cloned(),
        _ => None,
    })
}

pub(crate) fn plan_json(
    p: &Pipeline,
    params: &BTreeMap<String, Value>,
    selected: &std::collections::BTreeSet<drivetrain_engine::StageId>,
) -> Value {
    let stages: Vec<Value> = p
        .order
        .iter()
        .map(|id| {
            let s = p.stage(*id);
            let action = match &s.action {
                Action::Step { name, version, config, .. } => json!({
                    "uses": name, "version": version, "with": render_json_templates(config, params)
                }),
                Action::Command { argv, workdir, .. } => {
                    let mut a = json!({
                        "argv": argv.iter().map(|t| render_for_plan(t, params)).collect::<Vec<_>>(),
                        "workdir": workdir.as_ref().map(|w| render_for_plan(w, params)),
                    });
                    if let Some(p) = &s.plugin {
                        a["plugin"] = json!(p);
                    }
                    a
                }
                Action::Approval { role, min, timeout, on_timeout } => json!({
                    "approval": {"role": role, "min": min, "timeout_seconds": timeout.map(|t| t.as_secs()), "on_timeout": on_timeout.as_str()}
                }),
            };
            json!({
                "name": s.name,
                "selected": selected.contains(id),
                "needs": p.upstream(*id).into_iter().map(|u| p.stage(u).name.clone()).collect::<Vec<_>>(),
                "action": action,
                "image": s.image.as_ref().map(|i| render_for_plan(i, params)),
                "inputs": s.inputs.iter().map(|i| json!({
                    "name": i.name, "stage": p.stage(i.stage).name, "output": i.output,
                    "optional": i.optional, "mode": i.mode,
                })).collect::<Vec<_>>(),
                "outputs": s.outputs,
                "env": s.env.iter().map(|(k, v)| (k.clone(), Value::String(render_for_plan(v, params)))).collect::<serde_json::Map<_, _>>(),
                "when": s.when.as_ref().map(|(_, t)| t.clone()),
                "map": s.map.is_some(),
                "distributed": s.distributed.as_ref().map(|d| json!({
                    "framework": framework_name(d.framework), "workers": d.workers, "slots_per_worker": d.slots_per_worker,
                })),
                "retries": s.retries.limit,
                "timeout_seconds": s.timeout.map(|t| t.as_secs()),
                "cache": s.cache.enabled,
            })
        })
        .collect();
    json!({
        "pipeline": p.name,
        "executor": p.executor,
        "params": params,
        "stages": stages,
    })
}
