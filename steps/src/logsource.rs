//! Where `ingest` finds drive logs: a local directory (or one file), or a prefix of any
//! store the artifact store understands (`s3://`, `gs://`, `az://`, `file://`).
//!
//! Logs are listed first, sorted by their path under the source, then fetched one at a
//! time: a remote log is streamed to a temporary file beside the attempt (memory stays
//! bounded by one buffer, disk by the largest log) and removed once it has been read.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use drivetrain_engine::artifacts::ArtifactStore;
use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::ObjectStoreExt;

/// The logs of one source.
#[derive(Debug)]
pub enum LogSource {
    /// A directory walked recursively, or a single file.
    Local(PathBuf),
    /// A prefix of an object store, fetched into `scratch`.
    Store {
        url: String,
        store: ArtifactStore,
        scratch: PathBuf,
    },
}

/// A log ready to read: its path here, removed on drop when it was fetched.
#[derive(Debug)]
pub struct Fetched {
    pub path: PathBuf,
    temporary: bool,
}

impl Drop for Fetched {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl LogSource {
    /// The source `source` names: a store URL (`s3://bucket/prefix/`) or a local path
    /// (`file://` or plain). A relative path is resolved against `base`, the pipeline
    /// file's folder (as a user reads the file), and must exist. Remote logs are fetched
    /// into `scratch`.
    pub fn open(source: &str, scratch: &Path, base: Option<&Path>) -> anyhow::Result<LogSource> {
        match source.split_once("://") {
            None if Path::new(source).is_relative() => {
                let Some(base) = base else {
                    anyhow::bail!(
                        "source `{source}` is a relative path, and this stage does not know the pipeline file's folder to resolve it against: give an absolute path or a store URL"
                    );
                };
                let path = base.join(source);
                if !path.exists() {
                    anyhow::bail!(
                        "source `{source}`: {} does not exist (a relative source is resolved against the pipeline file's folder, {})",
                        path.display(),
                        base.display()
                    );
                }
                Ok(LogSource::Local(path))
            }
            None => Ok(LogSource::Local(PathBuf::from(source))),
            Some(("file", path)) => Ok(LogSource::Local(PathBuf::from(path))),
            Some(_) => {
                let store = ArtifactStore::open(source)
                    .map_err(|e| anyhow::anyhow!("cannot open the source {source}: {e}"))?;
                Ok(LogSource::Store {
                    url: source.to_owned(),
                    store,
                    scratch: scratch.to_path_buf(),
                })
            }
        }
    }

    /// Where the logs are, for messages.
    pub fn describe(&self) -> String {
        match self {
            LogSource::Local(p) => p.display().to_string(),
            LogSource::Store { url, .. } => url.clone(),
        }
    }

    /// Where the log at `rel` is, exactly: its store URL, or its absolute path here. What
    /// `ingest` records of every log it read, and what `forget` matches.
    pub fn location(&self, rel: &str) -> String {
        match self {
            LogSource::Local(root) => {
                let path = if root.is_file() {
                    root.clone()
                } else {
                    root.join(rel)
                };
                std::fs::canonicalize(&path)
                    .unwrap_or(path)
                    .display()
                    .to_string()
            }
            LogSource::Store { url, .. } => format!("{}/{rel}", url.trim_end_matches('/')),
        }
    }

    /// Every log's path under the source, sorted.
    pub fn list(&self) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        match self {
            LogSource::Local(root) if root.is_file() => out.push(
                root.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            LogSource::Local(root) => collect(root, root, &mut out)?,
            LogSource::Store { url, store, .. } => {
                out = block_on(store.list(""))
                    .map_err(|e| anyhow::anyhow!("cannot list {url}: {e}"))?;
            }
        }
        out.sort();
        Ok(out)
    }

    /// The log at `rel` as a local file.
    pub fn fetch(&self, rel: &str) -> anyhow::Result<Fetched> {
        match self {
            LogSource::Local(root) if root.is_file() => Ok(Fetched {
                path: root.clone(),
                temporary: false,
            }),
            LogSource::Local(root) => Ok(Fetched {
                path: root.join(rel),
                temporary: false,
            }),
            LogSource::Store {
                url,
                store,
                scratch,
            } => {
                std::fs::create_dir_all(scratch)?;
                // Unique per fetch: logs of one name in two folders may be held at once.
                static N: AtomicU64 = AtomicU64::new(0);
                let name = rel.rsplit('/').next().unwrap_or(rel);
                let n = N.fetch_add(1, Ordering::Relaxed);
                let path = scratch.join(format!("fetch-{}-{n}-{name}", std::process::id()));
                let fetched = Fetched {
                    path: path.clone(),
                    temporary: true,
                };
                let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
                let fail =
                    |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot read {url}{rel}: {e}");
                block_on(async {
                    // `rel` is a key as the listing gave it: taken as it is (`Key::from`
                    // would percent-encode `%`, `#` and non-ASCII a second time).
                    let key = Key::parse(rel).map_err(|e| fail(&e))?;
                    let got = store.object_store().get(&key).await.map_err(|e| fail(&e))?;
                    let mut stream = got.into_stream();
                    while let Some(bytes) = stream.next().await {
                        file.write_all(&bytes.map_err(|e| fail(&e))?)?;
                    }
                    anyhow::Ok(())
                })?;
                file.flush()?;
                Ok(fetched)
            }
        }
    }
}

/// Runs a store call from the blocking code `ingest` is (inside `block_in_place`).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Handle::current().block_on(f)
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.display()))?;
    for e in entries {
        let p = e?.path();
        if p.is_dir() {
            collect(root, &p, out)?;
        } else {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}
