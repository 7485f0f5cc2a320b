//! The exit statuses of every command, in one place: a usage error is the request's
//! fault ([`Fault::Request`]), a failure the rest ([`Fault::exit_code`]); a run's end
//! has its own (cancelled, waiting for people).

use std::process::ExitCode;

use drivetrain_engine::fault::Fault;

/// A wrong flag or argument, or a run, stage or file that does not exist: 2.
pub(crate) fn usage() -> ExitCode {
    ExitCode::from(Fault::Request.exit_code())
}

/// A failure: a run that failed, a file that does not validate, a store that failed: 1.
pub(crate) fn failed() -> ExitCode {
    ExitCode::from(Fault::Pipeline.exit_code())
}
