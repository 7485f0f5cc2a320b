//! The phase of a run, a stage, an attempt or a map item: the one word every layer shares
//! (the state store records it, the run loop decides it, notifications and conditions
//! name it), in a leaf file of its own.

use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Error,
    /// Not run: its `when` was false, or a required input's producer was skipped.
    Skipped,
    /// Not run: something it depends on failed.
    Omitted,
    Cancelled,
    /// Waiting for people: an approval stage asked, and no process runs for it.
    Waiting,
    /// An attempt stopped to give its GPUs to one of higher priority (`scheduling`): not
    /// the stage's failure; the stage waits again and resumes from its checkpoints.
    Preempted,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Phase; 10] = [
        Phase::Pending,
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Error,
        Phase::Skipped,
        Phase::Omitted,
        Phase::Cancelled,
        Phase::Waiting,
        Phase::Preempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Error => "Error",
            Phase::Skipped => "Skipped",
            Phase::Omitted => "Omitted",
            Phase::Cancelled => "Cancelled",
            Phase::Waiting => "Waiting",
            Phase::Preempted => "Preempted",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "Pending" => Phase::Pending,
            "Running" => Phase::Running,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            "Error" => Phase::Error,
            "Skipped" => Phase::Skipped,
            "Omitted" => Phase::Omitted,
            "Cancelled" => Phase::Cancelled,
            "Waiting" => Phase::Waiting,
            "Preempted" => Phase::Preempted,
            _ => return None,
        })
    }

    /// Whether it has ended: a waiting run has not (people will resume it), though no
    /// engine runs it.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Phase::Pending | Phase::Running | Phase::Waiting)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
