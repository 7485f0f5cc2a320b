//! `explain`, `lineage`, `forget` and `gc`: questions about what runs left behind.

use crate::output::Format;
use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::fault::{Blame, Fault};
use drivetrain_engine::history::{self, Direction, LineageError};
use serde_json::{json, Value};

use crate::cli::GraphOutput;
use crate::runs::{open_state, resolve_run, store_url};

/// `drivetrain explain RUN STAGE`: why a stage was a cache hit or a miss, naming the
/// component of its key that changed since the closest other entry of that stage.
pub fn explain(home: &Path, run: &str, stage: &str, out: Format) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let run = resolve_run(home, state.as_ref(), Some(run))?;
    let e = match drivetrain_server::query::explanation(&*state, &run.0, stage)? {
        Ok(e) => e,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(crate::exit::usage());
        }
    };
    if out.json() {
        crate::output::print_json(&e)?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let changes: Vec<String> = e["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    println!("{run}/{stage}: {}", text(&e["verdict"]));
    match (e["compared_with_run"].as_str(), changes.is_empty()) {
        (Some(r), false) => {
            println!("compared with the closest other cache entry of `{stage}` (run {r}):");
            for c in &changes {
                println!("  {c}");
            }
            let defined: Vec<String> = e["definition_changes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect();
            if !defined.is_empty() {
                println!("in the rendered definition:");
                for c in &defined {
                    println!("  {c}");
                }
            }
        }
        (Some(r), true) => {
            println!("the closest other cache entry of `{stage}` (run {r}) has the same components")
        }
        (None, _) if e["origin"] == "ran" => {
            println!("no other cache entry of `{stage}` to compare with")
        }
        _ => {}
    }
    println!("key {} from:", text(&e["cache_key"]));
    for (k, v) in e["components"].as_object().into_iter().flatten() {
        println!("  {k:<24} {}", text(v));
    }
    for w in e["warnings"].as_array().into_iter().flatten() {
        println!("warning: {}", text(w));
    }
    Ok(ExitCode::SUCCESS)
}

fn print_graph(
    g: &history::Lineage,
    direction: Direction,
    output: GraphOutput,
) -> anyhow::Result<()> {
    match output {
        GraphOutput::Text => print!("{}", g.to_text(direction)),
        GraphOutput::Json => crate::output::print_json(g)?,
        GraphOutput::Dot => print!("{}", g.to_dot()),
        GraphOutput::Mermaid => print!("{}", g.to_mermaid()),
    }
    Ok(())
}

/// A target that names nothing is the request's fault (exit 2); a store that failed is
/// an error.
fn lineage_error(e: LineageError) -> anyhow::Result<ExitCode> {
    match e.fault() {
        Fault::Request => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(Fault::Request.exit_code()))
        }
        _ => Err(e.into()),
    }
}

/// `target` with its run named in full: `@latest/…` and a run-id prefix (`RUN/STAGE`,
/// `RUN/STAGE/OUTPUT`) as `status` takes them; anything else as it is.
fn run_named(
    home: &Path,
    state: &dyn drivetrain_engine::state::StateStore,
    target: &str,
) -> String {
    let Some((head, rest)) = target.split_once('/') else {
        return target.to_owned();
    };
    if head.is_empty() || target.contains("://") || head.starts_with("sha256:") {
        return target.to_owned();
    }
    match resolve_run(home, state, Some(head)) {
        Ok(id) => format!("{id}/{rest}"),
        Err(_) => target.to_owned(),
    }
}

/// `drivetrain lineage TARGET [--downstream]`.
pub fn lineage(
    home: &Path,
    target: &str,
    downstream: bool,
    output: GraphOutput,
) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let direction = if downstream {
        Direction::Downstream
    } else {
        Direction::Upstream
    };
    let target = &run_named(home, state.as_ref(), target);
    // A registered model: the artifact it was registered from.
    let target =
        match drivetrain_server::query::model_target(home, target, crate::runtime()?.handle())? {
            Some(digest) => digest,
            None => target.to_owned(),
        };
    let roots = match history::resolve_target(&*state, &target) {
        Ok(r) => r,
        Err(e) => return lineage_error(e),
    };
    // Artifacts' locations are in the store of the target's project.
    let project = roots
        .first()
        .and_then(|root| history::root_project(&*state, root))
        .unwrap_or_default();
    let url = crate::runs::run_store_url(None, &project, home)?;
    let store = ArtifactStore::open_project(&url, &project)?;
    match history::lineage(&*state, &store, roots, direction) {
        Ok(g) => print_graph(&g, direction, output)?,
        Err(e) => return lineage_error(e),
    }
    Ok(ExitCode::SUCCESS)
}

/// `drivetrain forget INPUT`: everything derived from a source.
pub fn forget(home: &Path, input: &str, output: GraphOutput) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let store = ArtifactStore::open(&store_url(None, home)?)?;
    // A local file is recorded by its absolute path (`file://` URLs too).
    let local = input.strip_prefix("file://").unwrap_or(input);
    let input = match std::fs::canonicalize(local) {
        Ok(p) if !input.contains("://") || input.starts_with("file://") => p.display().to_string(),
        _ => input.to_owned(),
    };
    let input = run_named(home, state.as_ref(), &input);
    let input = input.as_str();
    let g = match history::forget(&*state, &store, input) {
        Ok(g) => g,
        Err(e) => return lineage_error(e),
    };
    if output != GraphOutput::Text {
        print_graph(&g, Direction::Downstream, output)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut runs = std::collections::BTreeSet::new();
    let (mut stages, mut artifacts) = (Vec::new(), Vec::new());
    for (id, n) in &g.nodes {
        match n {
            history::Node::Stage { run, .. } => {
                runs.insert(run.clone());
                stages.push(id.clone());
            }
            history::Node::Artifact { url, digest, .. } => {
                artifacts.push(format!("{digest}  {url}"))
            }
        }
    }
    println!("derived from {input}:");
    println!("runs ({}):", runs.len());
    for r in &runs {
        println!("  {r}");
    }
    println!("stages ({}):", stages.len());
    for s in &stages {
        println!("  {s}");
    }
    println!("artifacts ({}):", artifacts.len());
    for a in &artifacts {
        println!("  {a}");
    }
    let versions = derived_versions(home, &g)?;
    println!("model versions ({}):", versions.len());
    for v in &versions {
        println!("  {v}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The model versions registered from an artifact of `g` (this home's registry), each
/// `MODEL@VERSION` with the aliases on it.
fn derived_versions(home: &Path, g: &history::Lineage) -> anyhow::Result<Vec<String>> {
    let digests: std::collections::BTreeSet<&str> = g
        .nodes
        .values()
        .filter_map(|n| match n {
            history::Node::Artifact { digest, .. } => Some(digest.as_str()),
            _ => None,
        })
        .collect();
    let project = drivetrain_engine::access::DEFAULT_PROJECT;
    let store = crate::runs::run_store_url(None, project, home)?;
    let vars = drivetrain_engine::cloud::project_env(project);
    let reg = drivetrain_steps::registry::Registry::open_with(None, &store, vars)?;
    crate::runtime()?.block_on(async {
        let mut out = Vec::new();
        for model in reg.models().await? {
            let aliases = reg.aliases(&model).await?;
            for v in reg.versions(&model).await? {
                let from = v["source"]["model_digest"].as_str().unwrap_or_default();
                if !digests.contains(from) {
                    continue;
                }
                let n = &v["version"];
                let on: Vec<&str> = aliases
                    .iter()
                    .filter(|(_, a)| &a["version"] == n)
                    .map(|(name, _)| name.as_str())
                    .collect();
                let named = match on.is_empty() {
                    true => String::new(),
                    false => format!(" ({})", on.join(", ")),
                };
                out.push(format!("{model}@{n}{named}"));
            }
        }
        Ok(out)
    })
}

/// `drivetrain gc [--keep-days N] [--apply]`.
pub fn gc(home: &Path, keep_days: u32, apply: bool, out: Format) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let cutoff = (chrono::Utc::now() - chrono::Duration::days(i64::from(keep_days)))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let rt = crate::runtime()?;
    // Every project's store: the default one and each project's of the runs recorded.
    let mut projects: std::collections::BTreeSet<String> = state
        .list_runs(usize::MAX >> 1)?
        .into_iter()
        .map(|r| r.project)
        .collect();
    projects.insert(drivetrain_engine::access::DEFAULT_PROJECT.to_owned());
    let mut report = history::GcReport::default();
    for project in &projects {
        let url = crate::runs::run_store_url(None, project, home)?;
        let store = ArtifactStore::open_project(&url, project)?;
        let of = rt.block_on(history::gc(&*state, &store, &cutoff, apply))?;
        if apply {
            // Attempt directories of runs whose objects went.
            let work = home.join("work");
            for key in of.unreferenced.keys() {
                if let Some(run) = key.split('/').nth(1) {
                    let _ = std::fs::remove_dir_all(work.join(run));
                }
            }
        }
        // The counts over runs are the same from every store; the objects are its own.
        report.kept_runs = of.kept_runs;
        report.referenced = of.referenced;
        report.expired_cache_entries = of.expired_cache_entries;
        report.deleted = of.deleted;
        report.unknown_run_objects += of.unknown_run_objects;
        let shown = |key: String| match project == drivetrain_engine::access::DEFAULT_PROJECT {
            true => key,
            false => format!("projects/{project}/{key}"),
        };
        report
            .unreferenced
            .extend(of.unreferenced.into_iter().map(|(k, v)| (shown(k), v)));
    }
    if out.json() {
        crate::output::print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    for (key, size) in &report.unreferenced {
        println!(
            "{}  {key} ({size} bytes)",
            if apply { "deleted" } else { "would delete" }
        );
    }
    println!(
        "{} object(s), {} bytes {}; kept: {} run(s) newer than {keep_days} day(s) or running, {} older artifact(s) still referenced{}",
        report.unreferenced.len(),
        report.bytes(),
        if apply { "deleted" } else { "unreferenced (dry run: --apply deletes them)" },
        report.kept_runs,
        report.referenced,
        if report.unknown_run_objects > 0 {
            format!(", {} object(s) of runs this home does not know", report.unknown_run_objects)
        } else {
            String::new()
        }
    );
    if report.expired_cache_entries > 0 {
        println!(
            "{} cache entr{} older than the cut-off {}",
            report.expired_cache_entries,
            if report.expired_cache_entries == 1 {
                "y"
            } else {
                "ies"
            },
            if apply { "removed" } else { "would be removed" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `drivetrain registry …` against the registry of this home's artifact store.
pub fn registry(
    home: &Path,
    registry: Option<&str>,
    project: &str,
    command: crate::cli::RegistryCommand,
) -> anyhow::Result<ExitCode> {
    use crate::cli::RegistryCommand as C;
    if let Err(why) = drivetrain_engine::validate::dns1123_label(project) {
        eprintln!("error: --project `{project}` {why}");
        return Ok(crate::exit::usage());
    }
    let store = crate::runs::run_store_url(None, project, home)?;
    let vars = drivetrain_engine::cloud::project_env(project);
    let reg = drivetrain_steps::registry::Registry::open_with(registry, &store, vars)?;
    let rt = crate::runtime()?;
    rt.block_on(async {
        match command {
            C::List { output } => {
                let mut all = Vec::new();
                for m in reg.models().await? {
                    let versions = reg.versions(&m).await?;
                    let aliases: serde_json::Map<String, Value> = reg
                        .aliases(&m)
                        .await?
                        .into_iter()
                        .map(|(a, v)| (a, v["version"].clone()))
                        .collect();
                    all.push(json!({"model": m, "versions": versions.len(), "aliases": aliases}));
                }
                if output == crate::cli::Format::Json {
                    crate::output::print_json(&all)?;
                } else if all.is_empty() {
                    println!("no models registered yet");
                } else {
                    for m in &all {
                        let aliases: Vec<String> = m["aliases"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(a, v)| format!("{a} → {v}"))
                            .collect();
                        println!(
                            "{}  {} version(s)  {}",
                            m["model"].as_str().unwrap_or_default(),
                            m["versions"],
                            aliases.join(", ")
                        );
                    }
                }
            }
            C::Show { spec, output } => {
                let v = reg.resolve(&spec).await?;
                match output {
                    crate::cli::Format::Json => crate::output::print_json(&v)?,
                    crate::cli::Format::Text => print!("{}", version_text(&v)),
                }
            }
            C::History { model, output } => {
                let h = reg.history(&model).await?;
                if output == crate::cli::Format::Json {
                    crate::output::print_json(&h)?;
                } else {
                    for e in &h {
                        println!(
                            "{}  {}  {} → {}  by {}  {}",
                            e["at"].as_str().unwrap_or_default(),
                            e["alias"].as_str().unwrap_or_default(),
                            e["from"]
                                .as_u64()
                                .map(|v| v.to_string())
                                .unwrap_or_else(|| "-".into()),
                            e["version"],
                            e["who"].as_str().unwrap_or_default(),
                            e["note"]
                        );
                    }
                }
            }
            C::Alias {
                model,
                alias,
                version,
                reason,
            } => {
                let e = reg
                    .move_alias(
                        &model,
                        &alias,
                        version,
                        json!({"manual": true, "reason": reason}),
                    )
                    .await?;
                audit_move(home, project, "registry.aliases.move", &model, &alias, &e)?;
                println!("{model}@{alias} → version {version} (was {})", e["from"]);
            }
            C::Rollback { model, alias } => {
                let e = reg.rollback(&model, &alias).await?;
                audit_move(
                    home,
                    project,
                    "registry.aliases.rollback",
                    &model,
                    &alias,
                    &e,
                )?;
                println!(
                    "{model}@{alias} rolled back to version {} (was {})",
                    e["version"], e["from"]
                );
            }
            C::Protect { alias, role, off } => {
                return crate::people::protect(home, &alias, role.filter(|_| !off).as_deref());
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The audit entry of an alias moved here: the registry's record of the move as its after.
fn audit_move(
    home: &Path,
    project: &str,
    action: &str,
    model: &str,
    alias: &str,
    moved: &Value,
) -> anyhow::Result<()> {
    crate::audit::audit_local(
        crate::runs::open_state(home)?.as_ref(),
        project,
        action,
        format!("/api/v1/registry/{model}/aliases/{alias}?project={project}"),
        moved.clone(),
    )
}

/// A registered version for people: what it is, where it came from, its metrics, its
/// files.
fn version_text(v: &Value) -> String {
    let s = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_owned()
    };
    let mut out = format!(
        "{} version {}, registered {}\n",
        s("/model"),
        v["version"],
        s("/registered_at")
    );
    if v["source"].is_object() {
        out.push_str(&format!(
            "  made by run {} (pipeline {}, stage {}); model {}\n",
            s("/source/run"),
            s("/source/pipeline"),
            s("/source/stage"),
            s("/source/model_digest")
        ));
    }
    // Numbers, and one level of nested ones (`recall.all`), in name order.
    let mut metrics = Vec::new();
    for (k, m) in v["metrics"].as_object().into_iter().flatten() {
        match m {
            Value::Number(n) => metrics.push(format!("{k} {n}")),
            Value::Object(inner) => metrics.extend(
                inner
                    .iter()
                    .filter(|(_, n)| n.is_number())
                    .map(|(k2, n)| format!("{k}.{k2} {n}")),
            ),
            _ => {}
        }
    }
    metrics.sort();
    if !metrics.is_empty() {
        out.push_str(&format!("  metrics: {}\n", metrics.join(", ")));
    }
    let files: Vec<&str> = v["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    out.push_str(&format!("  files: {}\n", files.join(", ")));
    out
}
