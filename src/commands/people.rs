//! Commands of people: `approve`, `reject`, `approvals`, `token`, `audit`, `auth can`.

use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::Catalog;

use super::outcome;
use crate::cli::{AuthCommand, Command, Format};
use crate::people;

/// Runs one of this group's commands.
pub(super) fn dispatch(catalog: &Catalog, home: &Path, command: Command) -> ExitCode {
    match command {
        Command::Approve { decision } => {
            outcome(people::decide(catalog, home, &decision, "approve"))
        }
        Command::Reject { decision } => outcome(people::decide(catalog, home, &decision, "reject")),
        Command::Approvals {
            waiting,
            limit,
            output,
        } => outcome(people::approvals(
            home,
            waiting,
            limit,
            output == Format::Json,
        )),
        Command::Token { command, output } => {
            outcome(people::token(home, command, output == Format::Json))
        }
        Command::Project { command, output } => {
            outcome(people::project(home, command, output == Format::Json))
        }
        Command::Audit {
            since,
            limit,
            output,
        } => outcome(people::audit(
            home,
            since.as_deref(),
            limit,
            output == Format::Json,
        )),
        Command::Auth {
            command:
                AuthCommand::Can {
                    subject,
                    verb,
                    resource,
                },
        } => outcome(people::can(home, &subject, &verb, &resource)),
        _ => unreachable!("not a command of people"),
    }
}
