//! `drivetrain.lock` beside a pipeline: for each plugin a pipeline uses, the commit a tag
//! or branch resolved to and the step's digest, written by `drivetrain plugins lock`.
//! A tag or branch is used only through it; `run --locked` refuses an entry missing,
//! moved or of another digest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PluginError;

/// The lock file's name, beside the pipeline.
pub const FILE: &str = "drivetrain.lock";

/// The lock file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u32,
    /// By `uses:` as written.
    pub plugins: BTreeMap<String, Entry>,
}

/// One plugin as it was locked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub version: String,
    pub digest: String,
    /// The commit of a git plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// The lock file of a pipeline in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// The lock file in `dir`, if there is one.
pub fn read(dir: &Path) -> Result<Option<Lock>, PluginError> {
    let file = path(dir);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PluginError::io(&file, e)),
    };
    let lock: Lock = serde_json::from_str(&text)
        .map_err(|e| PluginError::Plugin(format!("{} is not a lock file: {e}", file.display())))?;
    if lock.version != 1 {
        return Err(PluginError::Plugin(format!(
            "{} is of version {}; this drivetrain reads version 1",
            file.display(),
            lock.version
        )));
    }
    Ok(Some(lock))
}

/// Writes the lock file in `dir` (through a temporary file, so a reader never sees half).
pub fn write(dir: &Path, lock: &Lock) -> Result<PathBuf, PluginError> {
    let file = path(dir);
    let tmp = dir.join(format!(".{FILE}.{}", std::process::id()));
    let mut text = serde_json::to_string_pretty(lock).expect("a lock is JSON");
    text.push('\n');
    std::fs::write(&tmp, text).map_err(|e| PluginError::io(&tmp, e))?;
    std::fs::rename(&tmp, &file).map_err(|e| PluginError::io(&file, e))?;
    Ok(file)
}
