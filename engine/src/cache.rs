//! Cache keys: what a stage attempt's outputs depend on, hashed component by component so
//! `drivetrain explain` can name the one that changed.
//!
//! A key is the sha256 of its components, each itself a digest or a short value: the
//! stage definition after templating (`command`, `workdir`, `env`, `map`, `io`,
//! `distributed`, `secrets` by name only), `image`, the built-in `step`'s name and version
//! and its rendered `config`, every file the command names (`file:PATH`, by content), and
//! the digest of every input artifact (`input:NAME`). Paths of inputs and outputs stay
//! symbolic (`{{ inputs.x }}`), since they differ from attempt to attempt while what they
//! hold does not. Retries, timeouts, resources, `when` and hooks are not part of it: they
//! change whether or where a stage runs, not what it writes.
//!
//! What a stage reads from outside its inputs is part of its key too: a built-in step's
//! reads ([`crate::step::Step::reads`], e.g. `validate`'s production model) and the
//! stage's own `cache.key` entries. An entry `registry:MODEL@ALIAS` is resolved by a
//! [`Resolver`] to the version the alias points at now; any other entry is its rendered
//! text (`key[0]`). A stage that writes the model registry is never a cache hit.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Resolves a reference to the world outside a run (`registry:MODEL@ALIAS`) to a value a
/// cache key can hold: what the reference points at now.
#[async_trait::async_trait]
pub trait Resolver: Send + Sync + std::fmt::Debug {
    /// The current value of `reference` for a run whose artifact store is `store`, or
    /// why it cannot be read (the stage is then not looked up in the cache).
    async fn resolve(&self, reference: &str, store: &str) -> Result<String, ResolveError>;
}

/// Why a reference outside the run could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("`{0}` is not a registry reference")]
    NotARegistryReference(String),
    #[error("`{0}`: write `registry:MODEL@ALIAS`")]
    Malformed(String),
    /// The registry could not be opened or read (its error, with its causes).
    #[error("{0}")]
    Registry(String),
    #[error("alias `{alias}` names no version: {found}")]
    NoVersion { alias: String, found: String },
    #[error("this engine has no resolver for it")]
    NoResolver,
}

/// Whether a rendered key entry names something outside the run, for a [`Resolver`].
pub fn is_external(entry: &str) -> bool {
    entry.starts_with("registry:")
}

/// The components of a cache key and the definition they were computed from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyParts {
    /// Component name → digest or value, sorted.
    pub components: BTreeMap<String, String>,
    /// The rendered stage definition (for lineage and `explain`).
    pub definition: Value,
}

/// `sha256:` and the hex digest of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl KeyParts {
    /// Adds the definition field `name` as a component (its digest) and to the definition.
    pub fn field(&mut self, name: &str, value: Value) {
        if value.is_null() {
            return;
        }
        self.components
            .insert(name.to_owned(), digest(value.to_string().as_bytes()));
        if let Value::Object(m) = &mut self.definition {
            m.insert(name.to_owned(), value);
        } else {
            self.definition = json!({ name: value });
        }
    }

    /// Adds a component whose value is shown as it is (an image, a step version, a digest).
    pub fn plain(&mut self, name: String, value: String) {
        self.components.insert(name, value);
    }

    /// The key: the digest of every component, in order.
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        for (k, v) in &self.components {
            h.update(k.as_bytes());
            h.update([0]);
            h.update(v.as_bytes());
            h.update([0]);
        }
        format!("sha256:{}", hex::encode(h.finalize()))
    }
}

/// How two sets of components differ, for `explain`: one line per changed, added or
/// removed component.
pub fn diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in new {
        match old.get(k) {
            Some(o) if o == v => {}
            Some(o) => out.push(format!("`{k}` changed: {} → {}", short(o), short(v))),
            None => out.push(format!("`{k}` is new: {}", short(v))),
        }
    }
    for (k, o) in old {
        if !new.contains_key(k) {
            out.push(format!("`{k}` was removed (was {})", short(o)));
        }
    }
    out
}

fn short(v: &str) -> String {
    match v.strip_prefix("sha256:") {
        Some(hex) if hex.len() > 12 => format!("sha256:{}…", &hex[..12]),
        _ => v.to_owned(),
    }
}

/// Content digests of the files commands name, remembered by (path, size, mtime) so a
/// run hashes each file once.
#[derive(Debug, Default)]
pub struct FileDigests {
    seen: Mutex<HashMap<PathBuf, (u64, std::time::SystemTime, String)>>,
}

/// Files larger than this are keyed by size and mtime only.
const HASH_LIMIT: u64 = 64 << 20;

impl FileDigests {
    /// The digest of `path` if it is a regular file, else `None`.
    pub fn get(&self, path: &Path) -> Option<String> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None;
        }
        let mtime = meta.modified().ok()?;
        let size = meta.len();
        if let Some((s, m, d)) = self.seen.lock().ok()?.get(path) {
            if *s == size && *m == mtime {
                return Some(d.clone());
            }
        }
        let d = if size > HASH_LIMIT {
            let secs = mtime
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!("size:{size},mtime:{secs}")
        } else {
            digest(&std::fs::read(path).ok()?)
        };
        self.seen
            .lock()
            .ok()?
            .insert(path.to_path_buf(), (size, mtime, d.clone()));
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_their_components() {
        let mut a = KeyParts::default();
        a.field("command", json!(["echo", "{{ outputs.o }}"]));
        a.plain("input:data".into(), "sha256:1".into());
        let mut b = a.clone();
        assert_eq!(a.key(), b.key());
        b.plain("input:data".into(), "sha256:2".into());
        assert_ne!(a.key(), b.key());
        assert_eq!(
            diff(&a.components, &b.components),
            ["`input:data` changed: sha256:1 → sha256:2"]
        );
        b.field("env", json!([["A", "1"]]));
        let d = diff(&a.components, &b.components);
        assert!(d.iter().any(|l| l.starts_with("`env` is new")), "{d:?}");
        assert!(diff(&b.components, &a.components)
            .iter()
            .any(|l| l.starts_with("`env` was removed")));
        assert_eq!(a.definition["command"][0], "echo");
    }

    #[test]
    fn file_digests_follow_content() {
        let dir = std::env::temp_dir().join(format!("dt-cache-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("train.py");
        std::fs::write(&f, "print(1)\n").unwrap();
        let files = FileDigests::default();
        let one = files.get(&f).unwrap();
        assert_eq!(one, digest(b"print(1)\n"));
        std::fs::write(&f, "print(22)\n").unwrap();
        assert_ne!(
            files.get(&f).unwrap(),
            one,
            "a changed file changes its digest"
        );
        assert_eq!(files.get(&dir), None, "directories are not files");
        assert_eq!(files.get(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
