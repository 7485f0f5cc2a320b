//! What each command does. [`dispatch`] hands a parsed command to its group's file:
//! `run.rs` (run, rerun, retry, resume, and what runs inside a stage: `step`, `exec`),
//! `pipeline.rs` (validate, graph, plan, steps, schema), `history.rs` (explain, lineage,
//! forget, gc, registry), `inspect.rs` (status, logs, cancel, list), `server.rs` (serve,
//! ui, schedule, doctor). The helpers they share (exit codes, reading a pipeline file)
//! are in `files.rs`.

use std::path::PathBuf;
use std::process::ExitCode;

use drivetrain_engine::fault::{Blame, Fault};

use crate::cli::Command;

mod experiments;
mod files;
mod history;
mod inspect;
mod people;
mod pipeline;
mod plugins;
mod run;
mod server;

pub(crate) use files::{load, read, usage_errors};

/// An invalid pipeline, or a command that failed.
pub(crate) const EXIT_INVALID: u8 = 1;
/// Bad arguments, unreadable files.
pub(crate) const EXIT_USAGE: u8 = 2;

/// A command's result as its exit code; an error is printed first. The code is whose
/// fault the error is (the first of its chain that says): naming a run that does not
/// exist is a usage error, as an unknown stage is; a store that fails is not.
pub(crate) fn outcome(r: anyhow::Result<ExitCode>) -> ExitCode {
    r.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        let code = e
            .chain()
            .find_map(fault_of)
            .map_or(EXIT_INVALID, Fault::exit_code);
        ExitCode::from(code)
    })
}

/// Whose fault `e` is, when it is one of the engine's errors.
fn fault_of(e: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    use drivetrain_engine::{artifacts, cloud, history, runner, state, template};
    fn blamed<T: Blame + std::error::Error + 'static>(
        e: &(dyn std::error::Error + 'static),
    ) -> Option<Fault> {
        e.downcast_ref::<T>().map(Blame::fault)
    }
    blamed::<state::StateError>(e)
        .or_else(|| blamed::<history::LineageError>(e))
        .or_else(|| blamed::<history::GcError>(e))
        .or_else(|| blamed::<artifacts::ArtifactError>(e))
        .or_else(|| blamed::<cloud::CloudError>(e))
        .or_else(|| blamed::<template::RefError>(e))
        .or_else(|| blamed::<runner::RunError>(e))
}

/// Runs `command` with the engine's home `home`.
pub(crate) fn dispatch(command: Command, home: PathBuf) -> ExitCode {
    let catalog = crate::catalog::catalog().with_home(&home);
    match command {
        Command::Run(c) => run::dispatch(&catalog, home, c),
        Command::Pipeline(c) => pipeline::dispatch(&catalog, c),
        Command::History(c) => history::dispatch(&home, c),
        Command::Inspect(c) => inspect::dispatch(&home, c),
        Command::People(c) => people::dispatch(&catalog, &home, c),
        Command::Server(c) => server::dispatch(catalog, &home, c),
        Command::Experiments(c) => experiments::dispatch(&catalog, &home, c),
    }
}
