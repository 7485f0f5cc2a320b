//! The text of the pipeline each run ran, kept in the state store by its digest when the
//! run starts, so the run keeps its graph (the web view, `lineage`, reruns, retries,
//! resume) after its file is edited, moved or deleted.

use sha2::{Digest as _, Sha256};

use super::{RunRecord, RunStore, StateError};

/// The digest a run records of its pipeline's text (`runs.spec_digest`).
pub fn digest(source: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(source.as_bytes())))
}

/// Keeps the text of pipeline `file` under `digest`, if the file still holds that text
/// (a file changed since it was validated is not kept, and its run is read from its file
/// while that holds it). A digest kept already costs one read of the state, no write and
/// no file read: runs of one pipeline share it.
pub fn keep_file(state: &dyn RunStore, file: &str, digest_of_run: &str) -> Result<(), StateError> {
    if state.source(digest_of_run)?.is_some() {
        return Ok(());
    }
    match std::fs::read_to_string(file) {
        Ok(text) if digest(&text) == digest_of_run => state.keep_source(digest_of_run, &text),
        _ => Ok(()),
    }
}

/// Why the text of a run's pipeline cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Its file changed or is gone, and the state store kept no copy (a run of a
    /// drivetrain older than the copies).
    #[error("{0}")]
    Lost(String),
    #[error(transparent)]
    State(#[from] StateError),
}

/// The text of the pipeline `record` ran: its file while that holds the same text, else
/// the text kept when it started. `Err` says why there is none.
pub fn pipeline_text(state: &dyn RunStore, record: &RunRecord) -> Result<String, SourceError> {
    let on_disk = std::fs::read_to_string(&record.file);
    if let Ok(text) = &on_disk {
        if digest(text) == record.spec_digest {
            return Ok(text.clone());
        }
    }
    match state.source(&record.spec_digest)? {
        Some(text) => Ok(text),
        None => Err(SourceError::Lost(match on_disk {
            Ok(_) => format!(
                "{} changed since run {} started, and the state store has no copy of what it ran (a run of an older drivetrain)",
                record.file, record.id
            ),
            Err(e) => format!(
                "the run's pipeline {} cannot be read ({e}), and the state store has no copy of it (a run of an older drivetrain)",
                record.file
            ),
        })),
    }
}
