//! The executor file (`plugins/NAME/executor.yaml`): an executor outside the binary, the
//! command that serves it and how often it is polled. Validation reads it to know the
//! name; the executors crate (`drivetrain_executors::plugin`) serves it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::yaml::YamlPath;

/// The file that declares an executor plugin in its folder.
pub const EXECUTOR_FILE: &str = "executor.yaml";

/// An executor file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorFile {
    /// Always `executor`.
    pub kind: String,
    /// The name pipelines use (a DNS-1123 label; a built-in executor's name wins).
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub summary: Option<String>,
    /// The command serving the protocol; a relative path naming a file of the plugin's
    /// folder is that file.
    pub command: Vec<String>,
    /// How often waiting attempts are polled (default `500ms`).
    #[serde(default)]
    pub poll_interval: Option<String>,
}

/// An executor file read and checked, with its plugin's folder, or why not (`FILE:LINE:
/// COLUMN: …`).
pub type Loaded = Result<(ExecutorFile, PathBuf), String>;

/// The executor plugin in `dir`, checked.
pub fn load(dir: &Path) -> Loaded {
    let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = dir.join(EXECUTOR_FILE);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let located = |d: &crate::diag::Diagnostic| {
        let (line, col) = d.span.map(|s| (s.line, s.column)).unwrap_or((1, 1));
        format!("{}:{line}:{col}: {}", file.display(), d.message)
    };
    let root = crate::yaml::parse(&text).map_err(|d| d.first().map(located).unwrap_or_default())?;
    let mut diags = Vec::new();
    let spec: Option<ExecutorFile> = crate::de::from_node(&root, &YamlPath::root(), &mut diags);
    let at = |field: &str, what: String| {
        let loc = root.locate(&YamlPath::root().key(field));
        let d = crate::diag::Diagnostic::new("invalid-executor", what).at(loc.node.span);
        located(&d)
    };
    let Some(spec) = spec.filter(|_| !diags.iter().any(|d| d.is_error())) else {
        return Err(diags.first().map(located).unwrap_or_default());
    };
    if spec.kind != "executor" {
        let why = format!(
            "`kind: {}` is not an executor file; write `kind: executor`",
            spec.kind
        );
        return Err(at("kind", why));
    }
    if crate::names::dns1123_label(&spec.name).is_err() {
        return Err(at(
            "name",
            format!("`name: {}` must be a DNS-1123 label", spec.name),
        ));
    }
    if spec.command.is_empty() {
        return Err(at("command", "`command` is empty".into()));
    }
    if let Some(p) = &spec.poll_interval {
        crate::units::parse_duration(p)
            .map_err(|e| at("poll_interval", format!("`poll_interval`: {e}")))?;
    }
    Ok((spec, dir))
}

/// The executor plugins in `folders` (each a folder of plugin folders), in order, each
/// loaded or why it cannot be, with its folder.
pub fn discover(folders: &[PathBuf]) -> Vec<(PathBuf, Loaded)> {
    super::folders_holding(folders, EXECUTOR_FILE)
        .into_iter()
        .map(|d| {
            let loaded = load(&d);
            (d, loaded)
        })
        .collect()
}

/// The executor plugin named `name` in `folders`: the first that loads with that name,
/// or why the folder of that name does not load.
pub fn find(name: &str, folders: &[PathBuf]) -> Option<Loaded> {
    discover(folders)
        .into_iter()
        .find_map(|(dir, loaded)| match loaded {
            Ok((spec, d)) if spec.name == name => Some(Ok((spec, d))),
            Err(e) if dir.file_name().is_some_and(|f| f == name) => Some(Err(e)),
            _ => None,
        })
}
