//! Commands of people: `approve`, `reject`, `approvals`, `token`, `audit`, `auth can`.

use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::Catalog;

use super::outcome;
use crate::cli::{AuthCommand, PeopleGroup};
use crate::people;

/// Runs one of this group's commands.
pub(super) fn dispatch(catalog: &Catalog, home: &Path, command: PeopleGroup) -> ExitCode {
    match command {
        PeopleGroup::Approve { decision } => {
            outcome(people::decide(catalog, home, &decision, "approve"))
        }
        PeopleGroup::Reject { decision } => {
            outcome(people::decide(catalog, home, &decision, "reject"))
        }
        PeopleGroup::Approvals {
            waiting,
            limit,
            output,
        } => outcome(people::approvals(home, waiting, limit, output)),
        PeopleGroup::Token { command, output } => outcome(people::token(home, command, output)),
        PeopleGroup::Project { command, output } => outcome(people::project(home, command, output)),
        PeopleGroup::Audit {
            since,
            limit,
            output,
        } => outcome(people::audit(home, since.as_deref(), limit, output)),
        PeopleGroup::Auth {
            command:
                AuthCommand::Can {
                    subject,
                    verb,
                    resource,
                },
        } => outcome(people::can(home, &subject, &verb, &resource)),
    }
}
