//! What each command does. [`dispatch`] hands a parsed command to its group's file:
//! `run.rs` (run, rerun, retry, resume, and what runs inside a stage: `step`, `exec`),
//! `pipeline.rs` (validate, graph, plan, steps, schema), `history.rs` (explain, lineage,
//! forget, gc, registry), `inspect.rs` (status, logs, cancel, list), `server.rs` (serve,
//! ui, schedule, doctor). The helpers they share (exit codes, reading a pipeline file)
//! are in `files.rs`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::Command;

mod files;
mod history;
mod inspect;
mod pipeline;
mod run;
mod server;

pub(crate) use files::{load, read, usage_errors};

/// An invalid pipeline, or a command that failed.
pub(crate) const EXIT_INVALID: u8 = 1;
/// Bad arguments, unreadable files.
pub(crate) const EXIT_USAGE: u8 = 2;

/// A command's result as its exit code; an error is printed first.
pub(crate) fn outcome(r: anyhow::Result<ExitCode>) -> ExitCode {
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
}

/// Runs `command` with the engine's home `home`.
pub(crate) fn dispatch(command: Command, home: PathBuf) -> ExitCode {
    let catalog = crate::catalog::catalog();
    match command {
        c @ (Command::Run { .. }
        | Command::Rerun { .. }
        | Command::Retry { .. }
        | Command::Resume { .. }
        | Command::Step { .. }
        | Command::Exec { .. }) => run::dispatch(&catalog, home, c),
        c @ (Command::Validate { .. }
        | Command::Graph { .. }
        | Command::Plan { .. }
        | Command::Steps { .. }
        | Command::Schema { .. }) => pipeline::dispatch(&catalog, c),
        c @ (Command::Explain { .. }
        | Command::Lineage { .. }
        | Command::Forget { .. }
        | Command::Gc { .. }
        | Command::Registry { .. }) => history::dispatch(&home, c),
        c @ (Command::Status { .. }
        | Command::Logs { .. }
        | Command::Cancel { .. }
        | Command::List { .. }) => inspect::dispatch(&home, c),
        c @ (Command::Serve { .. }
        | Command::Ui { .. }
        | Command::Schedule { .. }
        | Command::Doctor { .. }) => server::dispatch(catalog, &home, c),
    }
}
