//! Commands on a pipeline file and the catalog: `validate`, `graph`, `plan` (and its
//! Kubernetes manifests), `steps`, `schema`.

use std::path::PathBuf;
use std::process::ExitCode;

use drivetrain_engine::Catalog;
use serde_json::{json, Value};

use super::files::{read_text, Unread};
use super::{load, outcome, usage_errors, EXIT_INVALID, EXIT_USAGE};
use crate::cli::{Format, GraphFormat, PipelineGroup};
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
                _ => drivetrain_engine::spec::json_schema_with(&super::plugins::plugin_schemas()),
            };
            crate::output::print_json(&doc).expect("schema serializes");
            ExitCode::SUCCESS
        }
        PipelineGroup::Steps {
            name: Some(name),
            output,
        } => step(catalog, &name, output),
        PipelineGroup::Steps { name: None, output } => steps(catalog, output),
        PipelineGroup::Plugins(c) => super::plugins::plugins(catalog, c),
    }
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

/// `drivetrain steps`: the built-in steps and the executors, for people or as JSON.
/// `drivetrain steps NAME`: one step, with the fields of its `with:` from its schema.
fn step(catalog: &Catalog, name: &str, output: Format) -> ExitCode {
    if let Some(code) = super::plugins::describe(name, output) {
        return code;
    }
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
                    crate::output::listed(&inputs),
                    s.outputs().join(", ")
                );
            }
            super::plugins::print_plugins();
            println!("executors: {}", catalog.executors().join(", "));
            super::plugins::print_executor_plugins();
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
            crate::output::print_json(&json!({
                "steps": steps,
                "plugins": super::plugins::plugins_json(),
                "executors": catalog.executors(),
                "executor_plugins": super::plugins::executor_plugins_json(),
            }))
            .expect("JSON values serialize");
        }
    }
    ExitCode::SUCCESS
}
