//! Commands that look at runs and stop them: `status`, `logs`, `cancel`, `list`, on this
//! home or through a server (`--server`).

use std::path::Path;
use std::process::ExitCode;

use super::outcome;
use crate::cli::InspectGroup;
use crate::{client, inspect, runs};

/// Runs one of this group's commands.
pub(super) fn dispatch(home: &Path, command: InspectGroup) -> ExitCode {
    match command {
        InspectGroup::Status {
            run,
            output,
            server: Some(url),
            ..
        } => outcome(client::status(&url, run.as_deref(), output)),
        InspectGroup::Status {
            run,
            output,
            watch: true,
            ..
        } => outcome(inspect::watch(home, run.as_deref(), output)),
        InspectGroup::Status { run, output, .. } => {
            outcome(inspect::status(home, run.as_deref(), output))
        }
        InspectGroup::Logs {
            run: Some(run),
            stage: Some(stage),
            follow,
            server: Some(url),
        } => outcome(client::logs(&url, &run, &stage, follow)),
        InspectGroup::Logs {
            run, stage, follow, ..
        } => match (follow, stage.as_deref()) {
            (true, Some(s)) => outcome(inspect::follow(home, run.as_deref(), s)),
            (true, None) => outcome(inspect::follow_run(home, run.as_deref())),
            _ => outcome(inspect::logs(home, run.as_deref(), stage.as_deref())),
        },
        InspectGroup::Cancel { run, server } => outcome(match server {
            Some(url) => client::cancel(&url, &run),
            None => runs::cancel(home, &run),
        }),
        InspectGroup::List {
            limit,
            pipeline,
            phase,
            trigger,
            since,
            output,
        } => outcome(inspect::list(
            home,
            &drivetrain_server::query::ListFilter {
                limit,
                pipeline,
                phase,
                trigger,
                since,
                projects: None,
            },
            output,
        )),
    }
}
