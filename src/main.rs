//! The `drivetrain` command line: argument parsing, terminal output and wiring.
//!
//! Exit codes mean one thing each: 0 success, 1 the pipeline is invalid (or, later, the
//! run failed), 2 usage (bad arguments, unreadable files), 130 cancelled.

mod api;
mod cli;
mod client;
mod doctor;
mod exec;
mod history;
mod inspect;
mod listener;
mod manifests;
mod plan_output;
mod report;
mod rerun;
mod runs;
mod schedules;
mod serve;
mod ui;

/// Validation builds a located tree of every YAML value: an allocator made for many small
/// short-lived objects makes the 10,000-stage benchmark markedly faster than glibc malloc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::{validate, Catalog, Validated};
use serde_json::{json, Value};

use cli::*;
use plan_output::{plan_json, plan_text};

/// The one explicit list of steps and executors this binary knows.
fn catalog() -> Catalog {
    Catalog::new(
        drivetrain_steps::all(),
        drivetrain_executors::EXECUTORS.to_vec(),
    )
}

/// `drivetrain step NAME`: runs a built-in step in this process with the attempt's
/// environment; its error is the stage's reason.
fn step(catalog: &Catalog, name: &str) -> ExitCode {
    let Some(step) = catalog.step(name) else {
        eprintln!(
            "error: unknown step `{name}`; built-in steps: {}",
            catalog.step_names().join(", ")
        );
        return ExitCode::from(EXIT_USAGE);
    };
    let cx = match drivetrain_engine::step::StepContext::from_env(step) {
        Ok(cx) => cx,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    match rt.block_on(step.run(&cx)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: step `{name}`: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// `rerun` and `retry` as parsed.
struct RerunCli {
    run: String,
    retry: bool,
    stages: Vec<String>,
    downstream: bool,
    from: Vec<String>,
    only: Vec<String>,
    params: Vec<(String, String)>,
    images: Vec<(String, String)>,
    common: FromRun,
}

/// `rerun` and `retry`: the earlier run's pipeline file (or `--file`), validated as `run`
/// validates it.
fn rerun(catalog: &Catalog, home: PathBuf, a: RerunCli) -> ExitCode {
    let file = match a.common.file {
        Some(f) => f,
        None => match runs::run_file(&home, &a.run) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    let src = match read(&file) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let pipeline = match load(catalog, &file) {
        Ok(p) => p,
        Err(code) => return code,
    };
    runs::rerun(runs::RerunArgs {
        parent: drivetrain_engine::state::RunId(a.run),
        retry: a.retry,
        stages: a.stages,
        downstream: a.downstream,
        from: a.from,
        only: a.only,
        params: a.params,
        images: a.images,
        file: &file,
        source: &src,
        pipeline,
        parallelism: a.common.parallelism,
        fail_fast: a.common.fail_fast,
        no_cache: a.common.no_cache,
        home,
        json: a.common.output == Format::Json,
        run_id: a.common.run_id.map(drivetrain_engine::state::RunId),
    })
    .unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(EXIT_INVALID)
    })
}

const EXIT_INVALID: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// Commands that only print (and `logs --follow`) die quietly of a closed pipe, as other
/// command-line tools do (`drivetrain list | head -1`). Rust ignores SIGPIPE, so a write
/// to a closed pipe is an error, which `println!` turns into a panic. Commands that run an
/// engine keep ignoring it: a closed pipe must not kill a run half-way.
fn die_quietly_on_closed_pipes(command: &Command) {
    if matches!(
        command,
        Command::Run { .. }
            | Command::Rerun { .. }
            | Command::Retry { .. }
            | Command::Resume { .. }
            | Command::Serve { .. }
            | Command::Ui { .. }
            | Command::Exec { .. }
    ) {
        return;
    }
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: restoring the default disposition installs no handler; still one thread.
    #[allow(unsafe_code)]
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    die_quietly_on_closed_pipes(&cli.command);
    // As the environment would: child engines (`serve`'s resumes, `--detach`) and built-in
    // steps see the same stores. Still one thread here.
    if let Some(url) = &cli.store {
        std::env::set_var("DRIVETRAIN_STORE", url);
    }
    if let Some(url) = &cli.state {
        std::env::set_var("DRIVETRAIN_STATE", url);
    }
    // Warnings (and more with `DRIVETRAIN_LOG=info|debug|trace`) go to stderr.
    let level = std::env::var("DRIVETRAIN_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::WARN);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
    let catalog = catalog();
    let home = runs::home(cli.home.as_deref());
    let outcome = |r: anyhow::Result<ExitCode>| {
        r.unwrap_or_else(|e| {
            eprintln!("error: {e:#}");
            // Naming a run that does not exist is a usage error, as an unknown stage is.
            let unknown = e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<drivetrain_engine::state::StateError>(),
                    Some(drivetrain_engine::state::StateError::UnknownRun(_))
                )
            });
            ExitCode::from(if unknown { EXIT_USAGE } else { EXIT_INVALID })
        })
    };
    match cli.command {
        Command::Run {
            file,
            params,
            parallelism,
            fail_fast,
            timeout,
            executor,
            gpus,
            detach,
            server,
            run_id,
            no_cache,
            overwrite_cache,
            output,
        } => {
            if let Some(url) = server {
                return outcome(client::run(
                    &url,
                    &file,
                    &params,
                    detach,
                    output == Format::Json,
                ));
            }
            let src = match read(&file) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let pipeline = match load(&catalog, &file) {
                Ok(p) => p,
                Err(code) => return code,
            };
            let params = match pipeline.resolve_params(&params) {
                Ok(v) => v,
                Err(errors) => return usage_errors(&errors),
            };
            if detach {
                return outcome(runs::detach(&home));
            }
            outcome(runs::run(runs::RunArgs {
                deadline: timeout,
                gpus,
                run_id,
                file: &file,
                source: &src,
                pipeline,
                params,
                parallelism,
                fail_fast,
                executor: executor.as_deref(),
                home,
                json: output == Format::Json,
                cache: drivetrain_engine::runner::CacheMode {
                    read: !no_cache && !overwrite_cache,
                    write: !no_cache,
                },
            }))
        }
        Command::Rerun {
            run,
            stage,
            downstream,
            from,
            only,
            params,
            images,
            common,
        } => rerun(
            &catalog,
            home,
            RerunCli {
                run,
                retry: false,
                stages: stage,
                downstream,
                from,
                only,
                params,
                images,
                common,
            },
        ),
        Command::Retry { run, common } => rerun(
            &catalog,
            home,
            RerunCli {
                run,
                retry: true,
                stages: Vec::new(),
                downstream: false,
                from: Vec::new(),
                only: Vec::new(),
                params: Vec::new(),
                images: Vec::new(),
                common,
            },
        ),
        Command::Explain { run, stage, output } => outcome(history::explain(
            &home,
            &run,
            &stage,
            output == Format::Json,
        )),
        Command::Lineage {
            target,
            downstream,
            output,
        } => outcome(history::lineage(&home, &target, downstream, output)),
        Command::Forget { input, output } => outcome(history::forget(&home, &input, output)),
        Command::Gc {
            keep_days,
            apply,
            output,
        } => outcome(history::gc(&home, keep_days, apply, output == Format::Json)),
        Command::Status {
            run,
            output,
            server: Some(url),
            ..
        } => outcome(client::status(&url, run.as_deref(), output == Format::Json)),
        Command::Status {
            run,
            output,
            watch: true,
            ..
        } => outcome(inspect::watch(
            &home,
            run.as_deref(),
            output == Format::Json,
        )),
        Command::Status { run, output, .. } => {
            outcome(runs::status(&home, run.as_deref(), output == Format::Json))
        }
        Command::Logs {
            run: Some(run),
            stage: Some(stage),
            follow,
            server: Some(url),
        } => outcome(client::logs(&url, &run, &stage, follow)),
        Command::Logs {
            run, stage, follow, ..
        } => match (follow, stage.as_deref()) {
            (true, Some(s)) => outcome(runs::follow(&home, run.as_deref(), s)),
            (true, None) => outcome(runs::follow_run(&home, run.as_deref())),
            _ => outcome(runs::logs(&home, run.as_deref(), stage.as_deref())),
        },
        Command::Resume { run, output } => {
            outcome(runs::resume(&catalog, &home, &run, output == Format::Json))
        }
        Command::Cancel { run, server } => outcome(match server {
            Some(url) => client::cancel(&url, &run),
            None => runs::cancel(&home, &run),
        }),
        Command::List {
            limit,
            pipeline,
            phase,
            trigger,
            since,
            output,
        } => outcome(runs::list(
            &home,
            &inspect::ListFilter {
                limit,
                pipeline,
                phase,
                trigger,
                since,
            },
            output == Format::Json,
        )),
        Command::Validate { files, output } => cmd_validate(&catalog, &files, output),
        Command::Graph { file, format } => match load(&catalog, &file) {
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
        Command::Plan {
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
            let p = match load(&catalog, &file) {
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
                    return ExitCode::from(2);
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
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&plan_json(&p, &values, &selected))
                        .expect("JSON values serialize")
                ),
            }
            ExitCode::SUCCESS
        }
        Command::Step { name } => step(&catalog, &name),
        Command::Exec { install, command } => outcome(match install {
            Some(dir) => exec::install(&dir),
            None => exec::exec(&command),
        }),
        Command::Serve {
            pipelines,
            bind,
            token,
            token_file,
            insecure_no_auth,
            parallelism,
        } => outcome(serve::serve(
            catalog,
            &home,
            serve::ServeArgs {
                pipelines: Some(pipelines),
                schedules: true,
                bind,
                token,
                token_file,
                insecure_no_auth,
                parallelism,
            },
        )),
        Command::Ui {
            pipelines,
            bind,
            token,
            token_file,
            insecure_no_auth,
        } => outcome(serve::serve(
            catalog,
            &home,
            serve::ServeArgs {
                pipelines,
                schedules: false,
                bind,
                token,
                token_file,
                insecure_no_auth,
                parallelism: None,
            },
        )),
        Command::Schedule { command, output } => {
            outcome(schedules::command(&home, command, output == Format::Json))
        }
        Command::Registry { registry, command } => {
            outcome(history::registry(&home, registry.as_deref(), command))
        }
        Command::Schema { api } => {
            let doc = match api {
                true => api::openapi::document(),
                false => drivetrain_engine::spec::json_schema(),
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&doc).expect("schema serializes")
            );
            ExitCode::SUCCESS
        }
        Command::Doctor { gpus, output } => outcome(doctor::doctor(gpus, output == Format::Json)),
        Command::Steps { output } => {
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
                    println!("executors: {}", catalog.executors().join(", "));
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
                    println!(
                        "{}",
                        serde_json::to_string_pretty(
                            &json!({"steps": steps, "executors": catalog.executors()})
                        )
                        .expect("JSON values serialize")
                    );
                }
            }
            ExitCode::SUCCESS
        }
    }
}

fn usage_errors(errors: &[String]) -> ExitCode {
    for e in errors {
        eprintln!("error: {e}");
    }
    ExitCode::from(EXIT_USAGE)
}

/// Why a pipeline file gives no text.
enum Unread {
    /// Missing, unreadable: a usage error.
    Io,
    /// Read, but not UTF-8: an invalid pipeline, said with where.
    NotText,
}

impl From<Unread> for ExitCode {
    fn from(u: Unread) -> ExitCode {
        ExitCode::from(match u {
            Unread::Io => EXIT_USAGE,
            Unread::NotText => EXIT_INVALID,
        })
    }
}

/// A pipeline file's text; the error is printed: the I/O error, or where the first byte
/// that is not UTF-8 is (line, column and byte offset).
fn read_text(file: &Path) -> Result<String, Unread> {
    let bytes = std::fs::read(file).map_err(|e| {
        eprintln!("error: cannot read {}: {e}", file.display());
        Unread::Io
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line_start = bytes[..at]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        let line = bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
        let column = String::from_utf8_lossy(&bytes[line_start..at]).chars().count() + 1;
        eprintln!(
            "error[not-utf8]: a pipeline is UTF-8 text; byte {:#04x} at offset {at} is not\n  ┌─ {}:{line}:{column}",
            bytes[at],
            file.display()
        );
        Unread::NotText
    })
}

fn read(file: &Path) -> Result<String, ExitCode> {
    read_text(file).map_err(ExitCode::from)
}

/// Reads and validates one file; on errors, prints them and returns the exit code.
fn load(catalog: &Catalog, file: &Path) -> Result<Pipeline, ExitCode> {
    let src = read(file)?;
    let Validated {
        pipeline,
        diagnostics,
    } = validate(&src, catalog);
    let name = file.display().to_string();
    if !diagnostics.is_empty() {
        report::emit(&name, &src, &diagnostics);
    }
    match pipeline {
        Some(p) => Ok(p),
        None => {
            eprintln!("{name}: invalid ({})", report::counts(&diagnostics));
            Err(ExitCode::from(EXIT_INVALID))
        }
    }
}

fn cmd_validate(catalog: &Catalog, files: &[PathBuf], output: Format) -> ExitCode {
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
        let v = validate(&src, catalog);
        invalid |= v.has_errors();
        match output {
            Format::Text => {
                report::emit(&name, &src, &v.diagnostics);
                match &v.pipeline {
                    Some(p) => println!(
                        "ok {name}: pipeline `{}`, {} stage{}{}",
                        p.name,
                        p.stages.len(),
                        if p.stages.len() == 1 { "" } else { "s" },
                        if v.diagnostics.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", report::counts(&v.diagnostics))
                        }
                    ),
                    None => eprintln!("{name}: invalid ({})", report::counts(&v.diagnostics)),
                }
            }
            Format::Json => results.push(json!({
                "file": name,
                "valid": !v.has_errors(),
                "pipeline": v.pipeline.as_ref().map(|p| p.name.clone()),
                "stages": v.pipeline.as_ref().map(|p| p.stages.len()),
                "diagnostics": v.diagnostics.iter().map(|d| report::to_json(&name, d)).collect::<Vec<_>>(),
            })),
        }
    }
    if output == Format::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&results).expect("JSON values serialize")
        );
    }
    if unreadable {
        ExitCode::from(EXIT_USAGE)
    } else if invalid {
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    }
}
