//! How an attempt ended, as the run loop reads it: the word the attempt's preparation
//! and its run share (a leaf of the runner).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::artifacts::ArtifactRef;
use crate::spec::ErrorClass;

/// How one attempt ended: its outputs and values, or why it did not succeed.
pub(super) enum AttemptEnd {
    Succeeded {
        outputs: BTreeMap<String, ArtifactRef>,
        values: Value,
    },
    Failed {
        exit_code: Option<i32>,
        reason: String,
        class: ErrorClass,
    },
    Cancelled,
    /// Stopped to give its GPUs to an attempt of higher priority: why.
    Preempted {
        reason: String,
    },
}
