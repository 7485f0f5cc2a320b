//! Commands on a pipeline file and the catalog: `validate`, `graph`, `plan` (and its
//! Kubernetes manifests), `steps`, `schema`.

use std::path::PathBuf;
use std::process::ExitCode;

use drivetrain_engine::Catalog;
use serde_json::{json, Value};

use super::files::{read_text, Unread};
use super::{load, outcome, usage_errors, EXIT_INVALID, EXIT_USAGE};
use crate::cli::{Format, GraphFormat, PipelineGroup, PluginsCommand};
use crate::plan_output::{plan_json, plan_text};
use crate::{manifests, report};
use drivetrain_server::api;

/// Runs one of this group's commands.
pub(super) fn dispatch(catalog: &Catalog, command: PipelineGroup) -> ExitCode {
    match command {
        PipelineGroup::Validate { files, output } => validate(catalog, &files, output),
        PipelineGroup::Graph { file, format } => match load(catalog, &file) {
            Ok(p) => {
                print!(
                    "{}",
                    match format {
                        GraphFormat::Mermaid => p.to_mermaid(),
                        GraphFormat::Dot => p.to_dot(),
                    }
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        PipelineGroup::Plan {
            file,
            params,
            only,
            from,
            to,
            output,
            executor,
            manifests,
            run_id,
        } => {
            let p = match load(catalog, &file) {
                Ok(p) => p,
                Err(code) => return code,
            };
            let values = match p.resolve_params(&params) {
                Ok(v) => v,
                Err(errors) => return usage_errors(&errors),
            };
            let selected = match p.select(&only, &from, &to) {
                Ok(s) => s,
                Err(errors) => return usage_errors(&errors),
            };
            if manifests {
                let executor = executor.as_deref().unwrap_or(&p.executor);
                if executor != "kubernetes" {
                    eprintln!("error: --manifests renders Kubernetes objects: add `--executor kubernetes` (this pipeline's executor is `{executor}`)");
                    return crate::exit::usage();
                }
                return outcome(
                    drivetrain_executors::kubernetes::Settings::from_env()
                        .map_err(anyhow::Error::msg)
                        .and_then(|settings| {
                            manifests::manifests(&p, &values, &selected, &settings, &run_id)
                        })
                        .map(|text| manifests::store_header(&p) + &text)
                        .map(|text| {
                            print!("{text}");
                            ExitCode::SUCCESS
                        }),
                );
            }
            match output {
                Format::Text => print!("{}", plan_text(&p, &values, &selected)),
                Format::Json => crate::output::print_json(&plan_json(&p, &values, &selected))
                    .expect("JSON values serialize"),
            }
            ExitCode::SUCCESS
        }
        PipelineGroup::Schema { api, step } => {
            let doc = match (api, step) {
                (true, _) => api::openapi::document(),
                (_, true) => drivetrain_engine::plugin::file::json_schema(),
                _ => drivetrain_engine::spec::json_schema_with(&plugin_schemas()),
            };
            crate::output::print_json(&doc).expect("schema serializes");
            ExitCode::SUCCESS
        }
        PipelineGroup::Steps {
            name: Some(name),
            output,
        } => step(catalog, &name, output),
        PipelineGroup::Steps { name: None, output } => steps(catalog, output),
        PipelineGroup::Plugins(c) => plugins(catalog, c),
    }
}

/// `drivetrain plugins fetch|lock FILE`.
fn plugins(catalog: &Catalog, command: PluginsCommand) -> ExitCode {
    use drivetrain_engine::plugin::{self, lock, Origin, Resolver};
    let (PluginsCommand::Fetch { file } | PluginsCommand::Lock { file }) = &command;
    let src = match read_text(file) {
        Ok(s) => s,
        Err(_) => {
            eprintln!("error: cannot read {}", file.display());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let origin = Origin {
        fetch: true,
        ..Origin::of_file(file, catalog.home())
    };
    let uses = plugin::uses_in(&src);
    let refused = |u: &str, r: plugin::Refusal| {
        eprintln!("error: `{u}`: {}", r.message);
        for n in r.notes {
            eprintln!("  = {n}");
        }
        ExitCode::from(EXIT_INVALID)
    };
    match command {
        PluginsCommand::Fetch { .. } => {
            let mut resolver = Resolver::new(origin);
            for u in &uses {
                match resolver.resolve(u) {
                    Ok(p) => println!("{u}: {} {}", p.id.label(), p.id.dir.display()),
                    Err(r) => return refused(u, r),
                }
            }
        }
        PluginsCommand::Lock { .. } => {
            let Some(dir) = origin.dir.clone() else {
                eprintln!("error: {} has no folder", file.display());
                return ExitCode::from(EXIT_USAGE);
            };
            let locked = match plugin::locked_entries(&uses, &origin) {
                Ok(l) => l,
                Err(r) => return refused(file.to_string_lossy().as_ref(), r),
            };
            match lock::write(&dir, &locked) {
                Ok(path) => println!(
                    "wrote {} ({} plugin{})",
                    path.display(),
                    uses.len(),
                    if uses.len() == 1 { "" } else { "s" }
                ),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            }
            for (u, e) in &locked.plugins {
                let commit = e
                    .commit
                    .as_deref()
                    .map(|c| format!(" {c}"))
                    .unwrap_or_default();
                println!("  {u}: {}@{} {}{commit}", e.name, e.version, e.digest);
            }
        }
    }
    ExitCode::SUCCESS
}

fn validate(catalog: &Catalog, files: &[PathBuf], output: Format) -> ExitCode {
    let mut invalid = false;
    let mut unreadable = false;
    let mut results = Vec::new();
    for file in files {
        let name = file.display().to_string();
        let src = match read_text(file) {
            Ok(src) => src,
            Err(Unread::NotText) => {
                invalid = true;
                results.push(json!({"file": name, "valid": false, "error": "not UTF-8"}));
                continue;
            }
            Err(Unread::Io) => {
                unreadable = true;
                results.push(json!({"file": name, "valid": false, "error": "unreadable"}));
                continue;
            }
        };
        let (diagnostics, what) = validate_one(catalog, file, &src);
        let failed = diagnostics.iter().any(|d| d.is_error());
        invalid |= failed;
        match output {
            Format::Text => {
                report::emit(&name, &src, &diagnostics);
                match (&what, failed) {
                    (Some((what, _)), false) => println!(
                        "ok {name}: {what}{}",
                        if diagnostics.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", report::counts(&diagnostics))
                        }
                    ),
                    _ => eprintln!("{name}: invalid ({})", report::counts(&diagnostics)),
                }
            }
            Format::Json => {
                let mut r = json!({
                    "file": name,
                    "valid": !failed,
                    "diagnostics": diagnostics.iter().map(|d| report::to_json(&name, d)).collect::<Vec<_>>(),
                });
                if let Some((_, fields)) = what.filter(|_| !failed) {
                    r.as_object_mut().expect("an object").extend(fields);
                }
                results.push(r);
            }
        }
    }
    if output.json() {
        crate::output::print_json(&results).expect("JSON values serialize");
    }
    if unreadable {
        ExitCode::from(EXIT_USAGE)
    } else if invalid {
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    }
}

/// The problems of one file (a pipeline, or a plugin's step file) and, when it is valid,
/// what it is in words and as JSON fields.
type Checked = (
    Vec<drivetrain_engine::Diagnostic>,
    Option<(String, serde_json::Map<String, serde_json::Value>)>,
);

fn validate_one(catalog: &Catalog, file: &std::path::Path, src: &str) -> Checked {
    if drivetrain_engine::plugin::file::is_step_file(src) {
        return match drivetrain_engine::plugin::file::check(src) {
            Ok(c) => {
                let s = &c.spec;
                let what = format!(
                    "step `{}` {}, {} param{}",
                    s.name,
                    s.version,
                    s.params.len(),
                    if s.params.len() == 1 { "" } else { "s" }
                );
                let fields = json!({"step": s.name, "version": s.version});
                (
                    Vec::new(),
                    Some((what, fields.as_object().cloned().unwrap_or_default())),
                )
            }
            Err(diags) => (diags, None),
        };
    }
    let v = drivetrain_engine::validate_file(file, src, catalog);
    let what = v.pipeline.as_ref().map(|p| {
        let n = p.stages.len();
        let what = format!(
            "pipeline `{}`, {n} stage{}",
            p.name,
            if n == 1 { "" } else { "s" }
        );
        let fields = json!({"pipeline": p.name, "stages": n});
        (what, fields.as_object().cloned().unwrap_or_default())
    });
    (v.diagnostics, what)
}

/// The plugin steps of this folder's `plugins/` and of `DRIVETRAIN_PLUGIN_PATH`, each
/// with its folder.
fn plugins_here() -> Vec<(PathBuf, drivetrain_engine::plugin::file::Checked)> {
    let origin = drivetrain_engine::plugin::Origin {
        dir: std::env::current_dir().ok(),
        ..drivetrain_engine::plugin::Origin::posted()
    };
    drivetrain_engine::plugin::discover(&origin.folders())
}

/// The executor plugins of this folder's `plugins/` and of `DRIVETRAIN_PLUGIN_PATH`.
type ExecutorPlugin = (
    PathBuf,
    Result<(drivetrain_executors::plugin::ExecutorFile, PathBuf), String>,
);

fn executor_plugins() -> Vec<ExecutorPlugin> {
    let origin = drivetrain_engine::plugin::Origin {
        dir: std::env::current_dir().ok(),
        ..drivetrain_engine::plugin::Origin::posted()
    };
    drivetrain_executors::plugin::discover(&origin.folders())
}

/// For the pipeline schema: each plugin step's `with:`, under the `uses:` that name it
/// (`NAME@VERSION`, and `./plugins/DIR` for this folder's own).
fn plugin_schemas() -> Vec<(Vec<String>, Value)> {
    let cwd = std::env::current_dir().unwrap_or_default();
    plugins_here()
        .into_iter()
        .map(|(dir, c)| {
            let mut uses = vec![format!("{}@{}", c.spec.name, c.spec.version)];
            if let Ok(rel) = dir.strip_prefix(&cwd) {
                uses.push(format!("./{}", rel.display()));
            }
            (uses, drivetrain_engine::plugin::with_schema(&c.spec))
        })
        .collect()
}

/// `drivetrain steps`: the built-in steps and the executors, for people or as JSON.
/// `drivetrain steps NAME`: one step, with the fields of its `with:` from its schema.
fn step(catalog: &Catalog, name: &str, output: Format) -> ExitCode {
    let Some(s) = catalog.step(name) else {
        let names = catalog.step_names();
        let hint = drivetrain_engine::diag::did_you_mean(name, names.iter().copied())
            .map(|h| format!("; {h}"))
            .unwrap_or_default();
        eprintln!(
            "error: no built-in step `{name}`{hint} (built-in: {})",
            names.join(", ")
        );
        return ExitCode::from(EXIT_USAGE);
    };
    let schema = s.config_schema();
    if output.json() {
        let v = json!({"name": s.name(), "version": s.version(), "summary": s.summary(), "values": s.values(), "config_schema": schema});
        crate::output::print_json(&v).expect("JSON values serialize");
        return ExitCode::SUCCESS;
    }
    println!("{}@{}: {}", s.name(), s.version(), s.summary());
    let inputs: Vec<String> = s
        .inputs()
        .iter()
        .map(|(n, req)| {
            if *req {
                n.to_string()
            } else {
                format!("{n} (optional)")
            }
        })
        .collect();
    println!(
        "inputs: {}",
        if inputs.is_empty() {
            "-".into()
        } else {
            inputs.join(", ")
        }
    );
    println!("outputs: {}", s.outputs().join(", "));
    println!("values: {}", s.values().join(", "));
    println!("with:");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (field, f) in schema["properties"].as_object().into_iter().flatten() {
        let kind = match &f["type"] {
            Value::Array(t) => t
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect::<Vec<_>>()
                .join(" | "),
            Value::String(t) => t.clone(),
            _ => "see the JSON schema (-o json)".into(),
        };
        let need = if required.contains(&field.as_str()) {
            ", required"
        } else {
            ""
        };
        let about = f["description"]
            .as_str()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("");
        println!("  {field:<22} {kind}{need}  {about}");
    }
    ExitCode::SUCCESS
}

fn steps(catalog: &Catalog, output: Format) -> ExitCode {
    match output {
        Format::Text => {
            println!("built-in steps:");
            for s in catalog.steps() {
                let inputs: Vec<String> = s
                    .inputs()
                    .iter()
                    .map(|(n, req)| if *req { n.to_string() } else { format!("{n}?") })
                    .collect();
                println!(
                    "  {:<18} {}\n  {:<18} inputs: {}  outputs: {}",
                    s.name(),
                    s.summary(),
                    "",
                    if inputs.is_empty() {
                        "-".into()
                    } else {
                        inputs.join(", ")
                    },
                    s.outputs().join(", ")
                );
            }
            let plugins = plugins_here();
            if !plugins.is_empty() {
                println!(
                    "plugin steps (plugins/ here and {}):",
                    drivetrain_engine::plugin::PATH_VAR
                );
            }
            for (dir, c) in &plugins {
                let s = &c.spec;
                let inputs: Vec<String> = s
                    .inputs
                    .iter()
                    .map(|(n, d)| {
                        if d.required {
                            n.clone()
                        } else {
                            format!("{n}?")
                        }
                    })
                    .collect();
                let params: Vec<String> = s
                    .params
                    .iter()
                    .map(|(n, d)| {
                        format!(
                            "{n}: {}{}",
                            d.kind.as_str(),
                            if d.default.is_some() { "?" } else { "" }
                        )
                    })
                    .collect();
                println!(
                    "  {:<18} {}\n  {:<18} params: {}  inputs: {}  outputs: {}\n  {:<18} {}",
                    format!("{}@{}", s.name, s.version),
                    s.summary.as_deref().unwrap_or_default(),
                    "",
                    if params.is_empty() {
                        "-".into()
                    } else {
                        params.join(", ")
                    },
                    if inputs.is_empty() {
                        "-".into()
                    } else {
                        inputs.join(", ")
                    },
                    s.outputs.join(", "),
                    "",
                    dir.display()
                );
            }
            println!("executors: {}", catalog.executors().join(", "));
            for (dir, e) in executor_plugins() {
                match e {
                    Ok((spec, _)) => println!(
                        "  {:<18} {} (executor plugin, {})",
                        format!("{}@{}", spec.name, spec.version),
                        spec.summary.unwrap_or_default(),
                        dir.display()
                    ),
                    Err(why) => println!(
                        "  {} (executor plugin that does not load: {why})",
                        dir.display()
                    ),
                }
            }
        }
        Format::Json => {
            let steps: Vec<Value> = catalog
                .steps()
                .map(|s| {
                    json!({
                        "name": s.name(),
                        "version": s.version(),
                        "summary": s.summary(),
                        "inputs": s.inputs().iter().map(|(n, r)| json!({"name": n, "required": r})).collect::<Vec<_>>(),
                        "outputs": s.outputs(),
                        "config_schema": s.config_schema(),
                    })
                })
                .collect();
            let plugins: Vec<Value> = plugins_here()
                .into_iter()
                .map(|(dir, c)| {
                    let s = &c.spec;
                    json!({
                        "name": s.name,
                        "version": s.version,
                        "summary": s.summary,
                        "folder": dir,
                        "inputs": s.inputs.iter().map(|(n, d)| json!({"name": n, "required": d.required})).collect::<Vec<_>>(),
                        "outputs": s.outputs,
                        "config_schema": drivetrain_engine::plugin::with_schema(s),
                    })
                })
                .collect();
            crate::output::print_json(
                &json!({"steps": steps, "plugins": plugins, "executors": catalog.executors()}),
            )
            .expect("JSON values serialize");
        }
    }
    ExitCode::SUCCESS
}
