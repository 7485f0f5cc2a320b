//! Plugins from the command line: `drivetrain plugins fetch|lock FILE`, and the plugin
//! steps and executors `drivetrain steps` and `drivetrain schema` list (those of
//! `plugins/` in the current folder and of `DRIVETRAIN_PLUGIN_PATH`).

use std::path::PathBuf;
use std::process::ExitCode;

use drivetrain_engine::plugin::{self, lock, Origin, Resolver};
use drivetrain_engine::Catalog;
use serde_json::{json, Value};

use super::files::read_text;
use super::{EXIT_INVALID, EXIT_USAGE};
use crate::cli::PluginsCommand;
use crate::output::listed;

/// Plugins are looked for from the current folder: its `plugins/`, then the plugin path.
fn here() -> Origin {
    Origin {
        dir: std::env::current_dir().ok(),
        ..Origin::posted()
    }
}

/// The plugin steps here, each with its folder.
fn plugins_here() -> Vec<(PathBuf, plugin::file::Checked)> {
    plugin::discover(&here().folders())
}

/// An executor plugin's folder, and it loaded or why not.
type ExecutorPlugin = (PathBuf, drivetrain_executors::plugin::Loaded);

fn executor_plugins() -> Vec<ExecutorPlugin> {
    drivetrain_executors::plugin::discover(&here().folders())
}

/// For the pipeline schema: each plugin step's `with:`, under the `uses:` that name it
/// (`NAME@VERSION`, and `./plugins/DIR` for this folder's own).
pub(super) fn plugin_schemas() -> Vec<(Vec<String>, Value)> {
    let cwd = std::env::current_dir().unwrap_or_default();
    plugins_here()
        .into_iter()
        .map(|(dir, c)| {
            let mut uses = vec![format!("{}@{}", c.spec.name, c.spec.version)];
            if let Ok(rel) = dir.strip_prefix(&cwd) {
                uses.push(format!("./{}", rel.display()));
            }
            (uses, plugin::with_schema(&c.spec))
        })
        .collect()
}

/// `drivetrain steps`' lines of the plugin steps.
pub(super) fn print_plugins() {
    let plugins = plugins_here();
    if !plugins.is_empty() {
        println!("plugin steps (plugins/ here and {}):", plugin::PATH_VAR);
    }
    for (dir, c) in &plugins {
        let s = &c.spec;
        let inputs: Vec<String> = s
            .inputs
            .iter()
            .map(|(n, d)| match d.required {
                true => n.clone(),
                false => format!("{n}?"),
            })
            .collect();
        let params: Vec<String> = s
            .params
            .iter()
            .map(|(n, d)| {
                let optional = if d.default.is_some() { "?" } else { "" };
                format!("{n}: {}{optional}", d.kind.as_str())
            })
            .collect();
        println!(
            "  {:<18} {}\n  {:<18} params: {}  inputs: {}  outputs: {}\n  {:<18} {}",
            format!("{}@{}", s.name, s.version),
            s.summary.as_deref().unwrap_or_default(),
            "",
            listed(&params),
            listed(&inputs),
            s.outputs.join(", "),
            "",
            dir.display()
        );
    }
}

/// `drivetrain steps`' lines of the executor plugins.
pub(super) fn print_executor_plugins() {
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

/// `drivetrain steps NAME` of a plugin step here (`NAME` or `NAME@VERSION`): its params,
/// inputs and outputs; `None` when no plugin step here has that name.
pub(super) fn describe(name: &str, output: crate::cli::Format) -> Option<ExitCode> {
    let (dir, c) = plugins_here().into_iter().find(|(_, c)| {
        let s = &c.spec;
        s.name == name || format!("{}@{}", s.name, s.version) == name
    })?;
    let s = &c.spec;
    if output.json() {
        let v = json!({"name": s.name, "version": s.version, "summary": s.summary, "folder": dir,
            "params": s.params, "inputs": s.inputs, "outputs": s.outputs,
            "config_schema": plugin::with_schema(s)});
        crate::output::print_json(&v).expect("JSON values serialize");
        return Some(ExitCode::SUCCESS);
    }
    println!("{}@{} (plugin step, {})", s.name, s.version, dir.display());
    println!("  {}", s.summary.as_deref().unwrap_or_default());
    let inputs: Vec<String> = s.inputs.keys().cloned().collect();
    println!(
        "  inputs: {}  outputs: {}",
        listed(&inputs),
        s.outputs.join(", ")
    );
    println!("  with:");
    for (n, d) in &s.params {
        let mut facts = vec![d.kind.as_str().to_owned()];
        match &d.default {
            Some(v) => facts.push(format!("default {v}")),
            None => facts.push("required".into()),
        }
        if let Some(a) = &d.allowed {
            facts.push(format!(
                "one of {}",
                serde_json::to_string(a).unwrap_or_default()
            ));
        }
        if let Some(m) = d.minimum {
            facts.push(format!("≥ {m}"));
        }
        if let Some(m) = d.maximum {
            facts.push(format!("≤ {m}"));
        }
        if let Some(p) = &d.pattern {
            facts.push(format!("matches {p}"));
        }
        let line = c.lines.get(n).copied().unwrap_or(1);
        let about = d.description.as_deref().unwrap_or_default();
        println!("  {n:<22} {}  {about} (step.yaml:{line})", facts.join(", "));
    }
    Some(ExitCode::SUCCESS)
}

/// `drivetrain steps -o json`'s plugin steps.
pub(super) fn plugins_json() -> Vec<Value> {
    plugins_here()
        .into_iter()
        .map(|(dir, c)| {
            let s = &c.spec;
            json!({
                "name": s.name,
                "version": s.version,
                "summary": s.summary,
                "folder": dir,
                "params": s.params,
                "inputs": s.inputs.iter().map(|(n, d)| json!({"name": n, "required": d.required})).collect::<Vec<_>>(),
                "outputs": s.outputs,
                "config_schema": plugin::with_schema(s),
            })
        })
        .collect()
}

/// `drivetrain steps -o json`'s executor plugins.
pub(super) fn executor_plugins_json() -> Vec<Value> {
    executor_plugins()
        .into_iter()
        .map(|(dir, e)| match e {
            Ok((spec, _)) => json!({"name": spec.name, "version": spec.version, "summary": spec.summary, "folder": dir}),
            Err(why) => json!({"folder": dir, "error": why}),
        })
        .collect()
}

/// `drivetrain plugins fetch|lock FILE`.
pub(super) fn plugins(catalog: &Catalog, command: PluginsCommand) -> ExitCode {
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
                    use drivetrain_engine::fault::Blame as _;
                    eprintln!("error: {e}");
                    return ExitCode::from(e.fault().exit_code());
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
