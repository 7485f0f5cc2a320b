//! Commands on what runs left: `explain`, `lineage`, `forget`, `gc` and the model
//! `registry` (`crate::history`).

use std::path::Path;
use std::process::ExitCode;

use super::outcome;
use crate::cli::HistoryGroup;
use crate::history;

/// Runs one of this group's commands.
pub(super) fn dispatch(home: &Path, command: HistoryGroup) -> ExitCode {
    match command {
        HistoryGroup::Explain { run, stage, output } => {
            outcome(history::explain(home, &run, &stage, output))
        }
        HistoryGroup::Lineage {
            target,
            downstream,
            output,
        } => outcome(history::lineage(home, &target, downstream, output)),
        HistoryGroup::Forget { input, output } => outcome(history::forget(home, &input, output)),
        HistoryGroup::Gc {
            keep_days,
            apply,
            output,
        } => outcome(history::gc(home, keep_days, apply, output)),
        HistoryGroup::Registry {
            registry,
            project,
            command,
        } => outcome(history::registry(
            home,
            registry.as_deref(),
            &project,
            command,
        )),
    }
}
