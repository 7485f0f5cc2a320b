//! Commands that run stages: `run`, `rerun`, `retry` and `resume` drive an engine
//! (`crate::runs`, `crate::rerun`); `step` and `exec` run inside a stage.

use std::path::PathBuf;
use std::process::ExitCode;

use drivetrain_engine::Catalog;

use super::{load, outcome, read, usage_errors, EXIT_INVALID, EXIT_USAGE};
use crate::cli::{FromRun, RunGroup};
use crate::{client, rerun, runs};
use drivetrain_executors::wrapper;

/// Runs one of this group's commands.
pub(super) fn dispatch(catalog: &Catalog, home: PathBuf, command: RunGroup) -> ExitCode {
    match command {
        RunGroup::Run {
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
            locked,
            output,
        } => {
            if let Some(url) = server {
                return outcome(client::run(&url, &file, &params, detach, output));
            }
            let src = match read(&file) {
                Ok(s) => s,
                Err(code) => return code,
            };
            // A run may fetch the git plugins it names (validation alone never does).
            let origin = drivetrain_engine::plugin::Origin {
                fetch: true,
                locked,
                ..drivetrain_engine::plugin::Origin::of_file(&file, catalog.home())
            };
            let pipeline = match super::files::load_in(catalog, &file, origin) {
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
                out: output,
                cache: drivetrain_engine::runner::CacheMode {
                    read: !no_cache && !overwrite_cache,
                    write: !no_cache,
                },
            }))
        }
        RunGroup::Rerun {
            run,
            stage,
            downstream,
            from,
            only,
            params,
            images,
            common,
        } => rerun(
            catalog,
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
        RunGroup::Retry { run, common } => rerun(
            catalog,
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
        RunGroup::Resume { run, output } => outcome(runs::resume(catalog, &home, &run, output)),
        RunGroup::Step { name } => step(catalog, &name),
        RunGroup::Exec {
            install,
            task,
            command,
        } => outcome(match (install, task) {
            (Some(dir), _) => wrapper::install(&dir, wrapper::REMOTE_BINARY),
            (None, Some(file)) => wrapper::task(&file),
            (None, None) => wrapper::exec(&command),
        }),
    }
}

/// `drivetrain step NAME`: runs a built-in step in this process with the attempt's
/// environment; its error is the stage's reason.
fn step(catalog: &Catalog, name: &str) -> ExitCode {
    let Some(step) = catalog.step(name) else {
        tell!(
            "error: unknown step `{name}`; built-in steps: {}",
            catalog.step_names().join(", ")
        );
        return ExitCode::from(EXIT_USAGE);
    };
    let cx = match drivetrain_engine::step::StepContext::from_env(step) {
        Ok(cx) => cx,
        Err(e) => {
            tell!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match crate::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tell!("error: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    match rt.block_on(step.run(&cx)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tell!("error: step `{name}`: {e}");
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

/// `rerun` and `retry`: the pipeline the earlier run ran (or `--file`'s), validated as
/// `run` validates it.
fn rerun(catalog: &Catalog, home: PathBuf, a: RerunCli) -> ExitCode {
    let parent = match crate::runs::open_state(&home)
        .and_then(|state| crate::runs::resolve_run(&home, state.as_ref(), Some(&a.run)))
    {
        Ok(id) => id,
        Err(e) => {
            tell!("error: {e:#}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let (file, src, pipeline) = match a.common.file {
        Some(file) => {
            let src = match read(&file) {
                Ok(s) => s,
                Err(code) => return code,
            };
            match load(catalog, &file) {
                Ok(p) => (file, src, p),
                Err(code) => return code,
            }
        }
        None => match rerun::run_source(&home, &parent) {
            Ok((file, src)) => {
                match drivetrain_engine::validate_file(&file, &src, catalog).pipeline {
                    Some(p) => (file, src, p),
                    None => {
                        tell!("error: the pipeline run {parent} ran no longer validates with this drivetrain's steps; `--file` names one that does");
                        return ExitCode::from(EXIT_INVALID);
                    }
                }
            }
            Err(e) => {
                tell!("error: {e:#}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    rerun::rerun(rerun::RerunArgs {
        spec: drivetrain_engine::engine::RerunSpec {
            parent,
            retry: a.retry,
            stages: a.stages.into_iter().map(Into::into).collect(),
            downstream: a.downstream,
            from: a.from.into_iter().map(Into::into).collect(),
            only: a.only.into_iter().map(Into::into).collect(),
            params: a.params,
            images: a.images,
            no_cache: a.common.no_cache,
        },
        file: &file,
        source: &src,
        pipeline,
        parallelism: a.common.parallelism,
        fail_fast: a.common.fail_fast,
        home,
        out: a.common.output,
        run_id: a.common.run_id.map(drivetrain_engine::state::RunId),
    })
    .unwrap_or_else(|e| {
        tell!("error: {e:#}");
        ExitCode::from(EXIT_INVALID)
    })
}
