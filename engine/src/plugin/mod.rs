//! Plugin steps: a step declared once in a typed step file (`plugins/NAME/step.yaml`, see
//! [`file`]) and used by any pipeline, three ways beside the built-in names:
//! - a path relative to the pipeline's file: `uses: ./plugins/greet`;
//! - `NAME@VERSION`, found in the `plugins/` folder beside the pipeline, then in the
//!   folders of `DRIVETRAIN_PLUGIN_PATH`: `uses: greet@1.0.0`;
//! - git, pinned: `uses: git+https://host/org/repo//plugins/greet@<full commit>`, or a
//!   tag or branch through `drivetrain.lock` ([`lock`]), cached in the home ([`git`]).
//!
//! Validation resolves each such `uses:` to a [`Plugin`] (its folder, its step file
//! checked, and a digest of the folder's files), checks the stage's `with:` against its
//! params ([`params`]) and plans the stage as the step's command; the plugin's identity
//! ([`PluginId`]) goes into the stage's cache key, provenance and lineage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

mod error;
pub mod executor_file;
pub mod file;
pub mod git;
pub mod lock;
pub mod params;
pub mod snapshot;

/// The step file's name in a plugin's folder.
pub const STEP_FILE: &str = "step.yaml";

pub use error::PluginError;

/// The variable naming more folders of plugins, colon-separated.
pub const PATH_VAR: &str = "DRIVETRAIN_PLUGIN_PATH";

/// What a plugin is, wherever a stage used it: in its plan, cache key and records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginId {
    pub name: String,
    pub version: String,
    /// `sha256:` of the files of its folder (see [`digest`]).
    pub digest: String,
    /// The `uses:` that named it.
    pub uses: String,
    /// A git plugin's commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Its folder here (`{{ step.dir }}`).
    pub dir: PathBuf,
}

impl PluginId {
    /// `greet@1.0.0 sha256:…`: how keys and lineage write it.
    pub fn label(&self) -> String {
        format!("{}@{} {}", self.name, self.version, self.digest)
    }
}

/// A plugin found and read.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub id: PluginId,
    /// The step file, as its problems name it.
    pub file: PathBuf,
    pub checked: file::Checked,
}

/// Where a pipeline's plugins are looked for.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The pipeline file's folder (none for YAML posted to a server).
    pub dir: Option<PathBuf>,
    /// The folders of [`PATH_VAR`].
    pub path: Vec<PathBuf>,
    /// The home, where git plugins are cached.
    pub home: Option<PathBuf>,
    /// Whether a git plugin not yet here may be fetched.
    pub fetch: bool,
    /// `--locked`: every plugin has an entry in the lock file, of the same digest, and a
    /// tag or branch still names the locked commit.
    pub locked: bool,
}

impl Origin {
    /// The origin of the pipeline file `file`: its folder, [`PATH_VAR`], and `home`.
    pub fn of_file(file: &Path, home: Option<&Path>) -> Origin {
        let dir = std::fs::canonicalize(file)
            .ok()
            .and_then(|f| f.parent().map(Path::to_path_buf));
        Origin {
            dir,
            home: home.map(Path::to_path_buf),
            ..Origin::posted()
        }
    }

    /// The origin of YAML without a file: only [`PATH_VAR`].
    pub fn posted() -> Origin {
        let path = std::env::var_os(PATH_VAR)
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Origin {
            path,
            ..Origin::default()
        }
    }

    /// The folders `NAME@VERSION` is looked for in, in order.
    pub fn folders(&self) -> Vec<PathBuf> {
        let own = self.dir.as_ref().map(|d| d.join("plugins"));
        own.into_iter().chain(self.path.iter().cloned()).collect()
    }
}

/// Whether `uses` names a plugin rather than a built-in step.
pub fn is_plugin(uses: &str) -> bool {
    uses.starts_with("./")
        || uses.starts_with("../")
        || uses.starts_with('/')
        || uses.starts_with("git+")
        || uses.contains('@')
}

/// Why a `uses:` names no plugin: one message and notes (a step file's own problems,
/// each `FILE:LINE:COLUMN: …`).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub message: String,
    pub notes: Vec<String>,
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Refusal {
            message,
            notes: Vec::new(),
        }
    }
}

mod resolve;
pub use resolve::{locked_entries, Resolver};

/// Reads the plugin in `dir` (its step file checked, its files digested).
pub fn load(dir: &Path, uses: &str, commit: Option<String>) -> Result<Plugin, Refusal> {
    let dir =
        std::fs::canonicalize(dir).map_err(|e| format!("no plugin at {}: {e}", dir.display()))?;
    let file = dir.join(STEP_FILE);
    let text = std::fs::read_to_string(&file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{} has no {STEP_FILE}", dir.display()),
        _ => format!("cannot read {}: {e}", file.display()),
    })?;
    let checked = file::check(&text).map_err(|diags| Refusal {
        message: format!("{} is not a valid step file", file.display()),
        notes: diags
            .iter()
            .filter(|d| d.is_error())
            .map(|d| {
                let (line, col) = d.span.map(|s| (s.line, s.column)).unwrap_or((1, 1));
                format!("{}:{line}:{col}: {}", file.display(), d.message)
            })
            .collect(),
    })?;
    let digest = digest(&dir)?;
    Ok(Plugin {
        id: PluginId {
            name: checked.spec.name.clone(),
            version: checked.spec.version.clone(),
            digest,
            uses: uses.to_owned(),
            commit,
            dir,
        },
        file,
        checked,
    })
}

/// The most files, and bytes, a plugin's folder may hold.
const MAX_FILES: usize = 10_000;
const MAX_BYTES: u64 = 1 << 30;

/// `sha256:` over every file of the folder `dir` (names relative to it, sorted, and
/// contents): the step file and everything its command can name. What is not the step's
/// own is left out ([`NOT_THE_STEPS`]: `.git`, a home, Python's bytecode caches, which a
/// run of the step writes). A link leading out of the folder is refused: a step's files
/// are its own.
pub fn digest(dir: &Path) -> Result<String, PluginError> {
    use sha2::{Digest, Sha256};
    let mut files = Vec::new();
    walk(dir, dir, &mut files, 0)?;
    files.sort();
    let mut h = Sha256::new();
    let mut total = 0u64;
    for rel in &files {
        let path = dir.join(rel);
        let bytes = std::fs::read(&path).map_err(|e| PluginError::io(&path, e))?;
        total += bytes.len() as u64;
        if total > MAX_BYTES {
            return Err(PluginError::Plugin(format!(
                "{} holds more than 1 GiB: too much for a step",
                dir.display()
            )));
        }
        h.update(rel.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// Names in a plugin's folder its digest leaves out.
pub const NOT_THE_STEPS: &[&str] = &[".git", ".drivetrain", "__pycache__", ".pytest_cache"];

pub(crate) fn walk(
    root: &Path,
    dir: &Path,
    out: &mut Vec<String>,
    depth: usize,
) -> Result<(), PluginError> {
    if depth > 32 {
        return Err(PluginError::Plugin(format!(
            "{} is nested too deeply for a step",
            dir.display()
        )));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| PluginError::io(dir, e))?;
    for e in entries {
        let e = e.map_err(|e| PluginError::io(dir, e))?;
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if NOT_THE_STEPS.contains(&name.as_ref()) || name.ends_with(".pyc") {
            continue;
        }
        let real = std::fs::canonicalize(&path).map_err(|e| PluginError::io(&path, e))?;
        if !real.starts_with(root) {
            return Err(PluginError::Plugin(format!(
                "{} leads out of the step's folder ({}): a step's files are its own",
                path.display(),
                real.display()
            )));
        }
        if real.is_dir() {
            walk(root, &path, out, depth + 1)?;
        } else if real.is_file() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.display().to_string());
            if out.len() > MAX_FILES {
                return Err(PluginError::Plugin(format!(
                    "{} holds more than {MAX_FILES} files: too many for a step",
                    root.display()
                )));
            }
        }
    }
    Ok(())
}

/// Plugins resolved once per validation, by `uses:`.
pub(crate) type Resolved = HashMap<String, Result<Arc<Plugin>, Refusal>>;

/// The step files in `folders` (each a folder of plugin folders), in order, sorted
/// within each: each plugin's folder and its step file checked; unreadable or invalid
/// ones are left out (`validate` on a step file says why).
pub fn discover(folders: &[PathBuf]) -> Vec<(PathBuf, file::Checked)> {
    folders_holding(folders, STEP_FILE)
        .into_iter()
        .filter_map(|dir| {
            let text = std::fs::read_to_string(dir.join(STEP_FILE)).ok()?;
            Some((dir, file::check(&text).ok()?))
        })
        .collect()
}

/// The plugin folders in `folders` (each a folder of plugin folders) that hold a file
/// named `file`: in the order of `folders`, sorted within each, at most 10,000 a folder.
pub fn folders_holding(folders: &[PathBuf], file: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for folder in folders {
        let Ok(entries) = std::fs::read_dir(folder) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join(file).is_file())
            .take(10_000)
            .collect();
        dirs.sort();
        found.extend(dirs);
    }
    found
}

/// The plugins a pipeline's text names in `uses:`, in order, each once.
pub fn uses_in(src: &str) -> Vec<String> {
    let Ok(root) = crate::yaml::parse(src) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for e in root
        .get("stages")
        .and_then(|s| s.as_map())
        .unwrap_or_default()
    {
        let uses = e.value.get("uses").and_then(|u| u.as_str());
        if let Some(u) = uses.filter(|u| is_plugin(u)) {
            if !out.iter().any(|o| o == u) {
                out.push(u.to_owned());
            }
        }
    }
    out
}

/// The JSON Schema of a stage's `with:` for `step`: each param typed (or a template,
/// whose value is known when the stage runs), the required ones required.
pub fn with_schema(step: &file::StepFileSpec) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, d) in &step.params {
        let mut typed = Map::new();
        typed.insert("type".into(), json!(d.kind.as_str()));
        if let Some(a) = &d.allowed {
            typed.insert("enum".into(), json!(a));
        }
        if let Some(m) = d.minimum {
            typed.insert("minimum".into(), json!(m));
        }
        if let Some(m) = d.maximum {
            typed.insert("maximum".into(), json!(m));
        }
        if let Some(p) = &d.pattern {
            typed.insert("pattern".into(), json!(format!("^(?:{p})$")));
        }
        let mut prop =
            json!({"anyOf": [Value::Object(typed), {"type": "string", "pattern": "\\{\\{"}]});
        if let Some(desc) = &d.description {
            prop["description"] = json!(desc);
        }
        if let Some(def) = &d.default {
            prop["default"] = def.clone();
        } else {
            required.push(name.clone());
        }
        properties.insert(name.clone(), prop);
    }
    json!({
        "type": "object",
        "description": step.summary,
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}
