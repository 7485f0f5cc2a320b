//! What both registries share: the time and author of an alias move, its audit entry,
//! and a model's files (their digest, their upload).

use std::path::Path;
use std::sync::Arc;

use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::{json, Value};

pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The audit entry of one alias move (both backends write the same).
pub(crate) fn audit_entry(
    model: &str,
    alias: &str,
    generation: u64,
    version: u64,
    current: Option<&Value>,
    note: Value,
) -> Value {
    json!({
        "model": model,
        "alias": alias,
        "generation": generation,
        "version": version,
        "from": current.map(|c| c["version"].clone()),
        "at": now(),
        "who": who(),
        "note": note,
    })
}

/// Who moves an alias: `DRIVETRAIN_USER`, else `USER`.
fn who() -> String {
    drivetrain_engine::step::who()
}

/// Puts the files `files` (relative to `dir`) under `prefix` of `store`.
pub(crate) async fn put_files(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    dir: &Path,
    files: &[String],
) -> anyhow::Result<()> {
    for rel in files {
        let bytes = std::fs::read(dir.join(rel))?;
        let key = if prefix.is_empty() {
            rel.clone()
        } else {
            format!("{prefix}/{rel}")
        };
        store.put(&Key::from(key), PutPayload::from(bytes)).await?;
    }
    Ok(())
}

/// The files under `dir` and a digest of their names and contents.
pub(crate) fn digest_dir(dir: &Path) -> anyhow::Result<(String, Vec<String>)> {
    use sha2::{Digest, Sha256};
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    let mut h = Sha256::new();
    for rel in &files {
        let bytes = std::fs::read(dir.join(rel))?;
        h.update(rel.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok((format!("sha256:{}", hex::encode(h.finalize())), files))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            collect(root, &p, out)?;
        } else {
            out.push(p.strip_prefix(root)?.to_string_lossy().replace('\\', "/"));
        }
    }
    out.sort();
    Ok(())
}
