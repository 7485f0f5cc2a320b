//! Commands of searches: `trials`, `search preview`, `report`, `compare`.

use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::step::Catalog;

use super::outcome;
use crate::cli::{ExperimentGroup, SearchCommand};
use crate::experiments;

/// Runs one of this group's commands.
pub(super) fn dispatch(catalog: &Catalog, home: &Path, command: ExperimentGroup) -> ExitCode {
    match command {
        ExperimentGroup::Trials { run, stage, output } => {
            outcome(experiments::trials(catalog, home, &run, &stage, output))
        }
        ExperimentGroup::Search(SearchCommand::Preview {
            file,
            stage,
            output,
        }) => match super::load(catalog, &file) {
            Ok(p) => outcome(experiments::preview(&p, &stage, output)),
            Err(code) => code,
        },
        ExperimentGroup::Report { step, values } => outcome(experiments::report(step, &values)),
        ExperimentGroup::Compare { runs, all, output } => {
            outcome(experiments::compare(home, &runs, all, output))
        }
    }
}
