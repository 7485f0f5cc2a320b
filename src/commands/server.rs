//! Commands of the long-running engine: `serve` (API, web view, cron), `ui` (the web
//! view alone), `schedule`, `trigger`, `notifications`, and `doctor` (what this machine gives stages).

use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::Catalog;

use super::outcome;
use crate::cli::ServerGroup;
use crate::{doctor, schedules, triggers};
use drivetrain_server as serve;

/// Runs one of this group's commands.
pub(super) fn dispatch(catalog: Catalog, home: &Path, command: ServerGroup) -> ExitCode {
    match command {
        ServerGroup::Serve {
            pipelines,
            bind,
            token,
            token_file,
            insecure_no_auth,
            parallelism,
            notify,
            oidc,
            public_url,
        } => serve_on(catalog, home, |runtime| serve::ServeArgs {
            engine: engine_on(home),
            runtime,
            pipelines: Some(pipelines),
            schedules: true,
            bind,
            token,
            token_file,
            insecure_no_auth,
            parallelism,
            notify,
            oidc,
            public_url,
        }),
        ServerGroup::Ui {
            pipelines,
            bind,
            token,
            token_file,
            insecure_no_auth,
        } => serve_on(catalog, home, |runtime| serve::ServeArgs {
            engine: engine_on(home),
            runtime,
            pipelines,
            schedules: false,
            bind,
            token,
            token_file,
            insecure_no_auth,
            parallelism: None,
            notify: None,
            oidc: None,
            public_url: None,
        }),
        ServerGroup::Schedule { command, output } => {
            outcome(schedules::command(home, command, output))
        }
        ServerGroup::Trigger { command, output } => {
            outcome(triggers::command(&catalog, home, command, output))
        }
        ServerGroup::Notifications {
            status,
            limit,
            output,
        } => outcome(triggers::notifications(
            home,
            status.as_deref(),
            limit,
            output,
        )),
        ServerGroup::Queue { command, output } => outcome(match command {
            None => crate::queue::queue(home, output),
            Some(crate::cli::QueueCommand::Class {
                name,
                value,
                delete: _,
            }) => crate::queue::class(home, &name, value),
        }),
        ServerGroup::Doctor {
            gpus,
            slurm,
            output,
        } => outcome(doctor::doctor(gpus, home, slurm, output)),
    }
}

/// How `serve` and `ui` build their engine: this binary's, on the local executor.
fn engine_on(home: &std::path::Path) -> serve::MakeEngine {
    let home = home.to_path_buf();
    Box::new(move |state, artifacts| {
        let local = drivetrain_executors::executor("local").map_err(anyhow::Error::msg)?;
        crate::runs::engine(state, artifacts, local, &home)
    })
}

/// `serve` or `ui` with `args`, on the binary's one runtime.
fn serve_on(
    catalog: Catalog,
    home: &Path,
    args: impl FnOnce(tokio::runtime::Handle) -> serve::ServeArgs,
) -> ExitCode {
    let runtime = crate::runtime().map(|rt| rt.handle().clone());
    outcome(runtime.and_then(|rt| serve::serve(catalog, home, args(rt))))
}
