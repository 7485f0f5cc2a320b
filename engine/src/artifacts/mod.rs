//! The artifact store: immutable per-attempt prefixes in object storage, with manifests.
//!
//! Every output of a stage attempt lives under `runs/<run>/<stage>/<attempt>/<output>/`,
//! its log at `runs/<run>/logs/<stage>.<attempt>.txt`.
//! An output becomes an artifact only when the engine writes its manifest
//! (`runs/<run>/<stage>/<attempt>/manifests/<output>.json`: every object's path, size,
//! ETag and, for files published from this machine, the sha256 of its bytes) after the
//! stage succeeded; the artifact's digest is the sha256 of the manifest's bytes. An input
//! materialized on a `file://` store is checked against that sha256 first: a rewrite that
//! kept the size and modification time (and so the ETag) is an error, not an input. Objects of a failed attempt are never referenced by a manifest, so they are never
//! visible as an artifact. Keys are validated: no `..`, no absolute paths, no symlinks, so
//! nothing a stage writes escapes its prefix.
//!
//! On a `file://` store publishing and materializing are hard links (no copy) and
//! published files are made read-only; other stores copy through object_store.

use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;

/// A stored log's bytes, piece by piece ([`ArtifactStore::log_from`]).
pub type LogStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, ArtifactError>> + Send>>;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An artifact store failure: the infrastructure's fault, except `InvalidKey` and
/// `Symlink`, which are the stage's.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The store URL could not be understood or opened.
    #[error("cannot open artifact store `{url}`: {why}")]
    Open { url: String, why: String },
    /// A stage output holds a path that cannot be a key under its prefix.
    #[error("output `{output}` holds `{path}`, which cannot be stored: {why}")]
    InvalidKey {
        output: String,
        path: String,
        why: &'static str,
    },
    /// Symlinks could point into other artifacts; outputs hold regular files only.
    #[error("output `{output}` holds a symlink `{path}`; outputs hold regular files and directories only")]
    Symlink { output: String, path: String },
    /// Reading or writing the store failed.
    #[error("artifact store: {what}")]
    Store {
        what: String,
        #[source]
        source: object_store::Error,
    },
    /// An object no longer matches the manifest written when it was published: something
    /// wrote to an immutable artifact.
    #[error("artifact object `{key}` was modified after it was published (manifest: {expected}, now: {found})")]
    Modified {
        key: String,
        expected: String,
        found: String,
    },
    /// Reading or writing local files failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ArtifactError {
    let what = what.into();
    move |source| ArtifactError::Io { what, source }
}

fn store_err(what: impl Into<String>) -> impl FnOnce(object_store::Error) -> ArtifactError {
    let what = what.into();
    move |source| ArtifactError::Store { what, source }
}

/// Files larger than this are uploaded in parts of this size (S3 allows 10,000 parts, so
/// objects up to 80 GiB at the default; `DRIVETRAIN_STORE_PART_MIB`) and downloaded in
/// ranges of twice this size.
const PART_SIZE: usize = 8 << 20;
/// Parts of one object in flight at once (`DRIVETRAIN_STORE_CONCURRENCY`).
const PARALLEL_PARTS: usize = 8;

/// How large objects move: part size and parts in flight.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    part: usize,
    parallel: usize,
}

impl Transfer {
    fn from_vars(vars: &std::collections::BTreeMap<String, String>) -> Result<Transfer, String> {
        let num = |k: &str, default: usize| -> Result<usize, String> {
            match vars.get(k) {
                Some(v) => v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{k} `{v}`: expected a positive number")),
                None => Ok(default),
            }
        };
        let part = num("DRIVETRAIN_STORE_PART_MIB", PART_SIZE >> 20)? << 20;
        if part < 5 << 20 {
            return Err("DRIVETRAIN_STORE_PART_MIB: S3 parts are at least 5 MiB".into());
        }
        Ok(Transfer {
            part,
            parallel: num("DRIVETRAIN_STORE_CONCURRENCY", PARALLEL_PARTS)?,
        })
    }
}
/// Objects of one artifact in flight at once.
const PARALLEL_FILES: usize = 8;

/// What storing one file answered.
struct Uploaded {
    size: u64,
    /// `None` on a `file://` store, whose ETag is read back.
    etag: Option<String>,
}

struct UploadedFile {
    rel: String,
    key: Path,
    size: u64,
    etag: Option<String>,
}

/// One object of an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Where the object goes when the artifact is materialized, `/`-separated; also its
    /// key under the manifest's prefix unless `key` says otherwise.
    pub path: String,
    /// The object's full key, for artifacts that collect objects of other artifacts (the
    /// fan-in of a map stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub size: u64,
    pub etag: Option<String>,
    /// The sha256 of the object's bytes (hex), taken when it was published from a local
    /// file: what materializing it on this machine checks, so a rewrite that keeps the
    /// size and restores the modification time (the `file://` ETag) is still seen.
    /// Absent for objects a pod uploaded and for manifests written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// What an artifact is: its objects, listed once when the stage succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub output: String,
    /// The key prefix of the objects.
    pub prefix: String,
    pub files: Vec<ManifestEntry>,
    pub size: u64,
}

/// A published artifact: where its manifest is and its digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub manifest: String,
    pub digest: String,
}

/// Where one attempt's outputs go: an attempt of a stage, or of one item of a map stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptKey {
    pub run: String,
    pub stage: String,
    /// The map item, for an item's attempt.
    pub item: Option<usize>,
    pub attempt: u32,
}

impl AttemptKey {
    /// The attempt of `stage` (not of an item).
    pub fn of_stage(run: impl Into<String>, stage: impl Into<String>, attempt: u32) -> Self {
        AttemptKey {
            run: run.into(),
            stage: stage.into(),
            item: None,
            attempt,
        }
    }

    /// The key of a stage key as it is written where the engine meets the outside (paths,
    /// a pod's transfer plan, `DRIVETRAIN_STAGE`, the API): `stage` or
    /// `stage/items/<i>` ([`AttemptKey::stage_key`]).
    pub fn from_stage_key(run: impl Into<String>, stage_key: &str, attempt: u32) -> Self {
        let (stage, item) = match stage_key.split_once("/items/") {
            Some((stage, i)) => match i.parse() {
                Ok(i) => (stage, Some(i)),
                Err(_) => (stage_key, None),
            },
            None => (stage_key, None),
        };
        AttemptKey {
            run: run.into(),
            stage: stage.to_owned(),
            item,
            attempt,
        }
    }

    /// `stage`, or `stage/items/<i>` for an item's attempt.
    pub fn stage_key(&self) -> String {
        match self.item {
            Some(i) => format!("{}/items/{i}", self.stage),
            None => self.stage.clone(),
        }
    }

    /// Where the attempt's outputs, manifests and `values.json` go in the store.
    fn prefix(&self) -> String {
        format!("runs/{}/{}/{}", self.run, self.stage_key(), self.attempt)
    }

    /// Where the attempt's log goes in the store: `runs/RUN/logs/STAGE.ATTEMPT.txt`, in one
    /// folder per run, so that storing a log on a `file://` store makes no directory for
    /// a stage or an attempt that has no outputs.
    fn log_key(&self) -> String {
        format!(
            "runs/{}/logs/{}.{}.txt",
            self.run,
            self.stage_key(),
            self.attempt
        )
    }

    /// The attempt's own directory on the engine's machine under `work` (the home's
    /// `work/`): `RUN/STAGE.ATTEMPT`, the one directory an attempt makes there (its live
    /// `log.txt`, `values.json`, and `inputs/` and `outputs/` where it has them).
    pub fn work_dir(&self, work: &FsPath) -> PathBuf {
        work.join(&self.run)
            .join(format!("{}.{}", self.stage_key(), self.attempt))
    }

    /// The directory kept across the attempts of the stage (or map item) in the run, for
    /// checkpoints: `RUN/STAGE.checkpoints` under `work`.
    pub fn checkpoints_dir(&self, work: &FsPath) -> PathBuf {
        work.join(&self.run)
            .join(format!("{}.checkpoints", self.stage_key()))
    }
}

/// Where a project's runs keep their artifacts in the store at `url`: under
/// `projects/PROJECT/` (so no key of one project's is under another's prefix, and a store
/// policy can be written per prefix); `url` itself for the default project.
pub fn project_url(url: &str, project: &str) -> String {
    match project {
        crate::access::DEFAULT_PROJECT | "" => url.to_owned(),
        p => match std::env::var(format!("{}STORE", crate::cloud::project_prefix(p))) {
            // A store of its own (`DRIVETRAIN_PROJECT_<NAME>_STORE`).
            Ok(own) if !own.is_empty() => own,
            _ => format!("{}/projects/{p}", url.trim_end_matches('/')),
        },
    }
}

/// The artifact store of a deployment.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    url: String,
    store: Arc<dyn ObjectStore>,
    /// The root directory of a `file://` store, for hard links.
    local_root: Option<PathBuf>,
    transfer: Transfer,
}

impl ArtifactStore {
    /// Opens a store: `file:///abs/dir`, `memory://`, `s3://`, `gs://` or `az://`, cloud
    /// stores configured from the process environment (see [`crate::cloud`]).
    pub fn open(url: &str) -> Result<Self, ArtifactError> {
        Self::open_with(url, &crate::cloud::process_env())
    }

    /// Opens `project`'s store at `url` with the project's own settings
    /// ([`crate::cloud::project_env`]).
    pub fn open_project(url: &str, project: &str) -> Result<Self, ArtifactError> {
        Self::open_with(url, &crate::cloud::project_env(project))
    }

    /// Opens a store configured from `vars` instead of the process environment.
    pub fn open_with(
        url: &str,
        vars: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, ArtifactError> {
        let fail = |why: String| ArtifactError::Open {
            url: url.to_owned(),
            why,
        };
        let parsed = url::Url::parse(url).map_err(|e| fail(e.to_string()))?;
        let transfer = Transfer::from_vars(vars).map_err(fail)?;
        match parsed.scheme() {
            "file" => {
                let root = parsed
                    .to_file_path()
                    .map_err(|_| fail("a file:// URL needs an absolute path".into()))?;
                std::fs::create_dir_all(&root).map_err(|e| fail(e.to_string()))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&root)
                    .map_err(|e| fail(e.to_string()))?;
                Ok(ArtifactStore {
                    url: url.to_owned(),
                    store: Arc::new(fs),
                    local_root: Some(root),
                    transfer,
                })
            }
            "memory" => Ok(ArtifactStore {
                url: url.to_owned(),
                store: Arc::new(object_store::memory::InMemory::new()),
                local_root: None,
                transfer,
            }),
            _ => {
                let (store, prefix) =
                    crate::cloud::open(&parsed, vars).map_err(|e| fail(e.to_string()))?;
                let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
                    store
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
                };
                Ok(ArtifactStore {
                    url: url.to_owned(),
                    store,
                    local_root: None,
                    transfer,
                })
            }
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The object store itself (for the model registry, which lives beside `runs/`).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The directory of a `file://` store.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// Where the objects of output `output` of `attempt` are, in a `file://` store.
    pub fn output_dir(&self, attempt: &AttemptKey, output: &str) -> Option<PathBuf> {
        self.local_path(&Path::from(
            format!("{}/{}", attempt.prefix(), output).as_str(),
        ))
    }

    /// The URL of an artifact's objects (for `mode: url` and for people).
    pub fn artifact_url(&self, prefix: &str) -> String {
        format!("{}/{}", self.url.trim_end_matches('/'), prefix)
    }

    fn local_path(&self, key: &Path) -> Option<PathBuf> {
        let root = self.local_root.as_ref()?;
        Some(
            key.parts()
                .fold(root.clone(), |p, part| p.join(part.as_ref())),
        )
    }

    /// Publishes the files under `dir` as output `output` of `attempt` and writes its
    /// manifest last. Until the manifest exists nothing refers to the objects.
    pub async fn publish_dir(
        &self,
        attempt: &AttemptKey,
        output: &str,
        dir: &FsPath,
    ) -> Result<ArtifactRef, ArtifactError> {
        let prefix = format!("{}/{}", attempt.prefix(), output);
        let files = self.upload(&prefix, output, dir).await?;
        let hashes = sha256_files(dir, files.iter().map(|f| f.rel.clone()).collect()).await?;
        let mut entries = Vec::with_capacity(files.len());
        for (f, sha256) in files.into_iter().zip(hashes) {
            // A `file://` store's ETag covers the inode, so it is read after linking.
            let (size, etag) = match f.etag {
                Some(etag) => (f.size, Some(etag)),
                None => {
                    let meta = self
                        .store
                        .head(&f.key)
                        .await
                        .map_err(store_err(format!("stat {}", f.key)))?;
                    (meta.size, meta.e_tag)
                }
            };
            entries.push(ManifestEntry {
                path: f.rel,
                key: None,
                size,
                etag,
                sha256: Some(sha256),
            });
        }
        let manifest_key = format!("{}/manifests/{output}.json", attempt.prefix());
        self.write_manifest(manifest_key, output, prefix, entries)
            .await
    }

    /// Publishes output `output` of a map stage as the collection of every succeeded
    /// item's artifact: item `i`'s files appear under `i/`. No object is copied.
    pub async fn publish_collection(
        &self,
        attempt: &AttemptKey,
        output: &str,
        items: &[(usize, ArtifactRef)],
    ) -> Result<ArtifactRef, ArtifactError> {
        let mut entries = Vec::new();
        for (i, art) in items {
            let m = self.manifest(art).await?;
            for f in m.files {
                let key = f.key.unwrap_or_else(|| format!("{}/{}", m.prefix, f.path));
                entries.push(ManifestEntry {
                    path: format!("{i}/{}", f.path),
                    key: Some(key),
                    size: f.size,
                    etag: f.etag,
                    sha256: f.sha256,
                });
            }
        }
        let manifest_key = format!("{}/manifests/{output}.json", attempt.prefix());
        // Item attempts live under `runs/<run>/<stage>/items/<i>/<attempt>/`.
        let prefix = format!("runs/{}/{}/items", attempt.run, attempt.stage);
        self.write_manifest(manifest_key, output, prefix, entries)
            .await
    }

    /// Where output `output` of `attempt` lives: the key prefix a `mode: url` stage
    /// writes its objects under, as a URL.
    pub fn output_url(&self, attempt: &AttemptKey, output: &str) -> Result<String, ArtifactError> {
        let prefix = format!("{}/{}", attempt.prefix(), output);
        if let Some(dir) = self.local_path(&Path::from(prefix.as_str())) {
            std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        }
        Ok(self.artifact_url(&prefix))
    }

    /// Publishes output `output` of a `mode: url` stage from what the stage wrote under
    /// [`ArtifactStore::output_url`] itself: the listing becomes the manifest.
    pub async fn publish_listing(
        &self,
        attempt: &AttemptKey,
        output: &str,
    ) -> Result<ArtifactRef, ArtifactError> {
        let prefix = format!("{}/{}", attempt.prefix(), output);
        let metas: Vec<_> = self
            .store
            .list(Some(&Path::from(prefix.as_str())))
            .try_collect()
            .await
            .map_err(store_err(format!("list {prefix}")))?;
        let mut entries = Vec::with_capacity(metas.len());
        for m in metas {
            let full = m.location.to_string();
            let rel = full
                .strip_prefix(&format!("{prefix}/"))
                .unwrap_or(&full)
                .to_owned();
            check_key(&rel).map_err(|why| ArtifactError::InvalidKey {
                output: output.to_owned(),
                path: rel.clone(),
                why,
            })?;
            entries.push(ManifestEntry {
                path: rel,
                key: None,
                size: m.size,
                etag: m.e_tag,
                sha256: None,
            });
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest_key = format!("{}/manifests/{output}.json", attempt.prefix());
        self.write_manifest(manifest_key, output, prefix, entries)
            .await
    }

    /// The URL of an artifact's objects (its manifest's prefix).
    pub async fn url_of(&self, artifact: &ArtifactRef) -> Result<String, ArtifactError> {
        Ok(self.artifact_url(&self.manifest(artifact).await?.prefix))
    }

    async fn write_manifest(
        &self,
        manifest_key: String,
        output: &str,
        prefix: String,
        entries: Vec<ManifestEntry>,
    ) -> Result<ArtifactRef, ArtifactError> {
        let manifest = Manifest {
            output: output.to_owned(),
            prefix,
            size: entries.iter().map(|e| e.size).sum(),
            files: entries,
        };
        let bytes = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        self.store
            .put(&Path::from(manifest_key.as_str()), PutPayload::from(bytes))
            .await
            .map_err(store_err(format!("write manifest {manifest_key}")))?;
        Ok(ArtifactRef {
            manifest: manifest_key,
            digest,
        })
    }

    /// Stores one file: a hard link on a `file://` store (ETag unknown until read back),
    /// one request for a small file, a multipart upload of `PART_SIZE` parts,
    /// `PARALLEL_PARTS` in flight, for a large one. A failed multipart upload is aborted,
    /// so no partial object ever appears under the key.
    async fn put_file(&self, src: &FsPath, key: &Path) -> Result<Uploaded, ArtifactError> {
        if let Some(dst) = self.local_path(key) {
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io(format!("create {}", parent.display())))?;
            }
            // A key written again is replaced, as an object store's put replaces it.
            let linked = std::fs::hard_link(src, &dst).or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    std::fs::remove_file(&dst).and_then(|()| std::fs::hard_link(src, &dst))
                }
                _ => Err(e),
            });
            if linked.is_err() {
                std::fs::copy(src, &dst)
                    .map_err(io(format!("copy {} to the store", src.display())))?;
            }
            let mut perm = std::fs::metadata(&dst)
                .map_err(io(format!("stat {}", dst.display())))?
                .permissions();
            perm.set_readonly(true);
            std::fs::set_permissions(&dst, perm)
                .map_err(io(format!("protect {}", dst.display())))?;
            return Ok(Uploaded {
                size: 0,
                etag: None,
            });
        }
        let mut file = tokio::fs::File::open(src)
            .await
            .map_err(io(format!("open {}", src.display())))?;
        let size = file
            .metadata()
            .await
            .map_err(io(format!("stat {}", src.display())))?
            .len();
        let Transfer { part, parallel } = self.transfer;
        let put = if size <= part as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes)
                .await
                .map_err(io(format!("read {}", src.display())))?;
            self.store
                .put(key, PutPayload::from(bytes))
                .await
                .map_err(store_err(format!("write {key}")))?
        } else {
            let upload = self
                .store
                .put_multipart(key)
                .await
                .map_err(store_err(format!("start the upload of {key}")))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, part);
            let mut left = size;
            while left > 0 {
                let n = left.min(part as u64) as usize;
                let mut part = vec![0u8; n];
                let step = async {
                    file.read_exact(&mut part)
                        .await
                        .map_err(io(format!("read {}", src.display())))?;
                    writer
                        .wait_for_capacity(parallel)
                        .await
                        .map_err(store_err(format!("write {key}")))
                };
                if let Err(e) = step.await {
                    let _ = writer.abort().await;
                    return Err(e);
                }
                writer.put(bytes::Bytes::from(part));
                left -= n as u64;
            }
            writer
                .finish()
                .await
                .map_err(store_err(format!("complete the upload of {key}")))?
        };
        Ok(Uploaded {
            size,
            etag: put.e_tag,
        })
    }

    /// Writes one object of an artifact to `target`: whole for a small object, in ranges
    /// of twice the part size, `PARALLEL_PARTS` at a time and written in order, for a
    /// large one.
    async fn fetch(&self, key: &Path, size: u64, target: &FsPath) -> Result<(), ArtifactError> {
        use futures::StreamExt;
        let mut out = tokio::fs::File::create(target)
            .await
            .map_err(io(format!("create {}", target.display())))?;
        let Transfer { part, parallel } = self.transfer;
        // Fewer, larger reads: each is one request a server answers from its whole object.
        let part = 2 * part as u64;
        let ranges: Vec<std::ops::Range<u64>> = (0..size.div_ceil(part).max(1))
            .map(|i| i * part..((i + 1) * part).min(size))
            .collect();
        if ranges.len() == 1 {
            let mut body = self
                .store
                .get(key)
                .await
                .map_err(store_err(format!("read {key}")))?
                .into_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(store_err(format!("read {key}")))?;
                out.write_all(&chunk)
                    .await
                    .map_err(io(format!("write {}", target.display())))?;
            }
        } else {
            let mut parts = futures::stream::iter(ranges)
                .map(|r| self.store.get_range(key, r))
                .buffered(parallel);
            while let Some(part) = parts.next().await {
                let part = part.map_err(store_err(format!("read {key}")))?;
                out.write_all(&part)
                    .await
                    .map_err(io(format!("write {}", target.display())))?;
            }
        }
        out.flush()
            .await
            .map_err(io(format!("write {}", target.display())))
    }

    /// Reads a manifest.
    pub async fn manifest(&self, artifact: &ArtifactRef) -> Result<Manifest, ArtifactError> {
        let key = Path::from(artifact.manifest.as_str());
        let bytes = self
            .store
            .get(&key)
            .await
            .map_err(store_err(format!("read manifest {key}")))?
            .bytes()
            .await
            .map_err(store_err(format!("read manifest {key}")))?;
        serde_json::from_slice(&bytes).map_err(|e| ArtifactError::Io {
            what: format!("parse manifest {key}"),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }

    /// Puts an artifact's files under `dest` (hard links on a `file://` store; otherwise
    /// `PARALLEL_FILES` objects at a time).
    pub async fn materialize(
        &self,
        artifact: &ArtifactRef,
        dest: &FsPath,
    ) -> Result<(), ArtifactError> {
        use futures::StreamExt;
        let manifest = self.manifest(artifact).await?;
        std::fs::create_dir_all(dest).map_err(io(format!("create {}", dest.display())))?;
        let mut fetches = Vec::new();
        for f in &manifest.files {
            let key = object_key(&manifest, f);
            self.check(&key, f).await?;
            let target = dest.join(&f.path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io(format!("create {}", parent.display())))?;
            }
            if let Some(src) = self.local_path(&key) {
                // Same size and ETag is not the same bytes: a rewrite can keep both.
                if let Some(want) = &f.sha256 {
                    let found = sha256_file(src.clone()).await?;
                    if &found != want {
                        return Err(ArtifactError::Modified {
                            key: key.to_string(),
                            expected: format!("sha256 {want}"),
                            found: format!("sha256 {found}"),
                        });
                    }
                }
                if std::fs::hard_link(&src, &target).is_ok() {
                    continue;
                }
            }
            fetches.push((key, f.size, target));
        }
        let mut done = futures::stream::iter(fetches)
            .map(|(key, size, target)| async move { self.fetch(&key, size, &target).await })
            .buffer_unordered(PARALLEL_FILES);
        while let Some(r) = done.next().await {
            r?;
        }
        Ok(())
    }

    /// Checks that every object of an artifact still matches its manifest (size and
    /// ETag; on `file://` the ETag covers inode, size and modification time).
    pub async fn verify(&self, artifact: &ArtifactRef) -> Result<(), ArtifactError> {
        let manifest = self.manifest(artifact).await?;
        for f in &manifest.files {
            self.check(&object_key(&manifest, f), f).await?;
        }
        Ok(())
    }

    async fn check(&self, key: &Path, f: &ManifestEntry) -> Result<(), ArtifactError> {
        let meta = self
            .store
            .head(key)
            .await
            .map_err(store_err(format!("stat {key}")))?;
        let describe = |size: u64, etag: &Option<String>| {
            format!("{size} bytes, etag {}", etag.as_deref().unwrap_or("-"))
        };
        if meta.size != f.size || (f.etag.is_some() && meta.e_tag != f.etag) {
            return Err(ArtifactError::Modified {
                key: key.to_string(),
                expected: describe(f.size, &f.etag),
                found: describe(meta.size, &meta.e_tag),
            });
        }
        Ok(())
    }

    /// Stores an attempt's log as any output file is stored: on this machine's `file://`
    /// store a read-only hard link to it (nothing read or written again), elsewhere
    /// uploaded; an attempt that left no log file stores an empty one.
    pub async fn put_log(
        &self,
        attempt: &AttemptKey,
        log: &FsPath,
    ) -> Result<String, ArtifactError> {
        let key = attempt.log_key();
        let path = Path::from(key.as_str());
        if log.exists() {
            self.put_file(log, &path).await?;
        } else {
            self.store
                .put(&path, PutPayload::default())
                .await
                .map_err(store_err(format!("write log {key}")))?;
        }
        Ok(key)
    }

    /// Reads an attempt's stored log, if there is one.
    /// Runs stored before the logs had a folder of their own kept them beside the outputs.
    pub async fn log(&self, attempt: &AttemptKey) -> Result<Option<Vec<u8>>, ArtifactError> {
        match self.get_optional(&attempt.log_key()).await? {
            Some(log) => Ok(Some(log)),
            None => {
                self.get_optional(&format!("{}/log.txt", attempt.prefix()))
                    .await
            }
        }
    }

    /// An attempt's stored log from byte `from` on, as a stream of pieces, with the log's
    /// whole size: what the CLI and the API send without holding a log in memory.
    pub async fn log_from(
        &self,
        attempt: &AttemptKey,
        from: u64,
    ) -> Result<Option<(u64, LogStream)>, ArtifactError> {
        for key in [attempt.log_key(), format!("{}/log.txt", attempt.prefix())] {
            let key = Path::from(key.as_str());
            let size = match self.store.head(&key).await {
                Ok(meta) => meta.size,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(store_err(format!("read {key}"))(e)),
            };
            if from >= size {
                return Ok(Some((size, Box::pin(futures::stream::empty()))));
            }
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Offset(from)),
                ..Default::default()
            };
            let got = self
                .store
                .get_opts(&key, options)
                .await
                .map_err(store_err(format!("read {key}")))?;
            let what = format!("read {key}");
            let pieces = got
                .into_stream()
                .map_err(move |source| ArtifactError::Store {
                    what: what.clone(),
                    source,
                });
            return Ok(Some((size, Box::pin(pieces))));
        }
        Ok(None)
    }

    /// Stores the `values.json` an attempt wrote away from the engine (in a pod).
    pub async fn put_values(
        &self,
        attempt: &AttemptKey,
        bytes: Vec<u8>,
    ) -> Result<(), ArtifactError> {
        self.put_attempt_file(attempt, "values.json", bytes).await
    }

    /// Stores a file of the engine's contract an attempt wrote away from the engine (in a
    /// pod): `values.json`, `metrics.jsonl`.
    pub async fn put_attempt_file(
        &self,
        attempt: &AttemptKey,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<(), ArtifactError> {
        let key = format!("{}/{name}", attempt.prefix());
        self.store
            .put(&Path::from(key.as_str()), PutPayload::from(bytes))
            .await
            .map_err(store_err(format!("write {key}")))?;
        Ok(())
    }

    /// The `values.json` stored by [`ArtifactStore::put_values`], if any, unless it is
    /// over `limit` bytes: then `Err(size)`, unread.
    pub async fn values(
        &self,
        attempt: &AttemptKey,
        limit: u64,
    ) -> Result<Result<Option<Vec<u8>>, u64>, ArtifactError> {
        self.attempt_file(attempt, "values.json", limit).await
    }

    /// A file stored by [`ArtifactStore::put_attempt_file`], if any, unless it is over
    /// `limit` bytes: then `Err(size)`, unread.
    pub async fn attempt_file(
        &self,
        attempt: &AttemptKey,
        name: &str,
        limit: u64,
    ) -> Result<Result<Option<Vec<u8>>, u64>, ArtifactError> {
        let key = format!("{}/{name}", attempt.prefix());
        match self.store.head(&Path::from(key.as_str())).await {
            Ok(meta) if meta.size > limit => return Ok(Err(meta.size)),
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(Ok(None)),
            Err(e) => return Err(store_err(format!("read {key}"))(e)),
        }
        Ok(Ok(self.get_optional(&key).await?))
    }

    async fn get_optional(&self, key: &str) -> Result<Option<Vec<u8>>, ArtifactError> {
        let key = Path::from(key);
        match self.store.get(&key).await {
            Ok(r) => Ok(Some(
                r.bytes()
                    .await
                    .map_err(store_err(format!("read {key}")))?
                    .to_vec(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_err(format!("read {key}"))(e)),
        }
    }

    /// Uploads the files under `dir` to where output `output` of `attempt` lives, with
    /// no manifest: what `drivetrain exec` does in a pod. The engine then publishes the
    /// listing ([`ArtifactStore::publish_listing`]), so nothing refers to the objects
    /// until the attempt has succeeded. Returns how many files were uploaded.
    pub async fn upload_dir(
        &self,
        attempt: &AttemptKey,
        output: &str,
        dir: &FsPath,
    ) -> Result<usize, ArtifactError> {
        let prefix = format!("{}/{}", attempt.prefix(), output);
        Ok(self.upload(&prefix, output, dir).await?.len())
    }

    /// Puts every file under `dir` below `prefix`, `PARALLEL_FILES` at a time, and
    /// answers them in path order.
    async fn upload(
        &self,
        prefix: &str,
        output: &str,
        dir: &FsPath,
    ) -> Result<Vec<UploadedFile>, ArtifactError> {
        use futures::StreamExt;
        let mut files = Vec::new();
        collect_files(dir, dir, output, &mut files)?;
        files.sort();
        let mut keyed = Vec::with_capacity(files.len());
        for rel in files {
            let key =
                Path::parse(format!("{prefix}/{rel}")).map_err(|_| ArtifactError::InvalidKey {
                    output: output.to_owned(),
                    path: rel.clone(),
                    why: "not a valid object key",
                })?;
            keyed.push((rel, key));
        }
        futures::stream::iter(keyed)
            .map(|(rel, key)| async move {
                let up = self.put_file(&dir.join(&rel), &key).await?;
                Ok(UploadedFile {
                    rel,
                    key,
                    size: up.size,
                    etag: up.etag,
                })
            })
            .buffered(PARALLEL_FILES)
            .try_collect()
            .await
    }

    /// Every key under `prefix` (for tests and garbage collection).
    /// Every object key an artifact consists of: its manifest and its objects (which, for
    /// the fan-in of a map stage, live under other prefixes).
    pub async fn object_keys(&self, artifact: &ArtifactRef) -> Result<Vec<String>, ArtifactError> {
        let manifest = self.manifest(artifact).await?;
        let mut keys = vec![artifact.manifest.clone()];
        keys.extend(
            manifest
                .files
                .iter()
                .map(|f| object_key(&manifest, f).to_string()),
        );
        Ok(keys)
    }

    /// Deletes objects; one that is already gone is not an error.
    pub async fn delete(&self, keys: &[String]) -> Result<(), ArtifactError> {
        for k in keys {
            match self.store.delete(&Path::from(k.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_err(format!("delete {k}"))(e)),
            }
        }
        Ok(())
    }

    /// Every object key under `prefix` with its size.
    pub async fn list_sizes(&self, prefix: &str) -> Result<Vec<(String, u64)>, ArtifactError> {
        let p = Path::from(prefix);
        let metas: Vec<_> = self
            .store
            .list(Some(&p))
            .try_collect()
            .await
            .map_err(store_err(format!("list {prefix}")))?;
        let mut keys: Vec<(String, u64)> = metas
            .into_iter()
            .map(|m| (m.location.to_string(), m.size))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Every object key under `prefix`, sorted.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, ArtifactError> {
        Ok(self
            .list_sizes(prefix)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
}

/// The sha256 (hex) of a local file, read in 1 MiB blocks on the blocking pool.
async fn sha256_file(path: std::path::PathBuf) -> Result<String, ArtifactError> {
    tokio::task::spawn_blocking(move || hash_file(&path))
        .await
        .map_err(|e| ArtifactError::Io {
            what: "hash a file".into(),
            source: std::io::Error::other(e),
        })?
}

/// The sha256 of each of `rels` under `dir`, in order, on the blocking pool.
async fn sha256_files(dir: &FsPath, rels: Vec<String>) -> Result<Vec<String>, ArtifactError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || rels.iter().map(|r| hash_file(&dir.join(r))).collect())
        .await
        .map_err(|e| ArtifactError::Io {
            what: "hash the outputs".into(),
            source: std::io::Error::other(e),
        })?
}

fn hash_file(path: &FsPath) -> Result<String, ArtifactError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(io(format!("open {}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io(format!("read {}", path.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

fn object_key(manifest: &Manifest, f: &ManifestEntry) -> Path {
    match &f.key {
        Some(k) => Path::from(k.as_str()),
        None => Path::from(format!("{}/{}", manifest.prefix, f.path)),
    }
}

/// Collects the regular files under `dir` as `/`-separated relative paths, refusing
/// symlinks and names that cannot be keys.
fn collect_files(
    root: &FsPath,
    dir: &FsPath,
    output: &str,
    out: &mut Vec<String>,
) -> Result<(), ArtifactError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("list {}", dir.display()))(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(format!("list {}", dir.display())))?;
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let rel_str = rel
            .components()
            .map(|c| match c {
                Component::Normal(s) => s.to_str().map(str::to_owned),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|v| v.join("/"))
            .ok_or_else(|| ArtifactError::InvalidKey {
                output: output.to_owned(),
                path: rel.display().to_string(),
                why: "not UTF-8 or not a plain relative path",
            })?;
        check_key(&rel_str).map_err(|why| ArtifactError::InvalidKey {
            output: output.to_owned(),
            path: rel_str.clone(),
            why,
        })?;
        let ft = entry
            .file_type()
            .map_err(io(format!("stat {}", path.display())))?;
        if ft.is_symlink() {
            return Err(ArtifactError::Symlink {
                output: output.to_owned(),
                path: rel_str,
            });
        } else if ft.is_dir() {
            collect_files(root, &path, output, out)?;
        } else if ft.is_file() {
            out.push(rel_str);
        }
    }
    Ok(())
}

/// Whether a relative key stays under its prefix.
pub fn check_key(rel: &str) -> Result<(), &'static str> {
    if rel.is_empty() {
        return Err("empty path");
    }
    if rel.starts_with('/') {
        return Err("absolute path");
    }
    for part in rel.split('/') {
        match part {
            "" => return Err("empty path segment"),
            "." | ".." => return Err("`.` and `..` would leave the output's prefix"),
            _ if part.contains('\\') || part.chars().any(char::is_control) => {
                return Err("backslashes and control characters are not allowed")
            }
            _ => {}
        }
    }
    Ok(())
}

/// The suite every artifact store passes (`memory://`, `file://`, S3), for the tests of
/// this crate and of the backends'.
#[cfg(any(test, feature = "testing"))]
pub mod conformance;

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt() -> AttemptKey {
        AttemptKey::of_stage("r1", "s", 1)
    }

    #[tokio::test]
    async fn memory_store_publishes_and_materializes() {
        conformance::check(&ArtifactStore::open("memory://").unwrap()).await;
    }

    #[tokio::test]
    async fn file_store_publishes_and_materializes() {
        let root = std::env::temp_dir().join(format!("dt-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let url = format!("file://{}", root.display());
        conformance::check(&ArtifactStore::open(&url).unwrap()).await;
        let stored = root.join("runs/r1/s/1/data/a.txt");
        assert!(std::fs::metadata(&stored).unwrap().permissions().readonly());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A log goes to the run's `logs/` folder, replaced when its attempt runs again; one
    /// stored where logs were before (beside the attempt's outputs) is still found.
    #[tokio::test]
    async fn logs_are_found_where_they_are_and_where_they_were() {
        let root = std::env::temp_dir().join(format!("dt-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let store = ArtifactStore::open(&format!("file://{}/store", root.display())).unwrap();
        let log = root.join("log.txt");
        std::fs::write(&log, b"new layout\n").unwrap();
        let key = store.put_log(&attempt(), &log).await.unwrap();
        assert_eq!(key, "runs/r1/logs/s.1.txt");
        assert_eq!(
            store.log(&attempt()).await.unwrap().as_deref(),
            Some(&b"new layout\n"[..])
        );
        // An attempt number run again (a resume) replaces its log.
        let again = root.join("again.txt");
        std::fs::write(&again, b"run again\n").unwrap();
        store.put_log(&attempt(), &again).await.unwrap();
        assert_eq!(
            store.log(&attempt()).await.unwrap().as_deref(),
            Some(&b"run again\n"[..])
        );
        // Replaced, not written through: the first log's file (the same inode as the first
        // stored log) is as it was.
        assert_eq!(std::fs::read(&log).unwrap(), b"new layout\n");
        let before = AttemptKey {
            attempt: 2,
            ..attempt()
        };
        store
            .object_store()
            .put(
                &Path::from("runs/r1/s/2/log.txt"),
                PutPayload::from_static(b"old layout\n"),
            )
            .await
            .unwrap();
        assert_eq!(
            store.log(&before).await.unwrap().as_deref(),
            Some(&b"old layout\n"[..])
        );
        let missing = AttemptKey {
            attempt: 3,
            ..attempt()
        };
        assert_eq!(store.log(&missing).await.unwrap(), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Undoes the read-only mode a published file gets, as a root stage could.
    fn make_writable(path: &std::path::Path) {
        let mut perm = std::fs::metadata(path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perm.set_readonly(false);
        std::fs::set_permissions(path, perm).unwrap();
    }

    /// A `file://` store under a fresh root with `a.txt` = `hello` published as `data`.
    async fn published_hello(name: &str) -> (std::path::PathBuf, ArtifactStore, ArtifactRef) {
        let root = std::env::temp_dir().join(format!("dt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let out = root.join("out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("a.txt"), b"hello").unwrap();
        let store = ArtifactStore::open(&format!("file://{}/store", root.display())).unwrap();
        let art = store.publish_dir(&attempt(), "data", &out).await.unwrap();
        (root, store, art)
    }

    #[tokio::test]
    async fn modified_objects_are_detected() {
        let (root, store, art) = published_hello("mod").await;
        store.verify(&art).await.unwrap();
        // Write through a hard link, as a careless stage could (the engine runs as root here).
        let stored = root.join("store/runs/r1/s/1/data/a.txt");
        make_writable(&stored);
        std::fs::write(&stored, b"HELLO, tampered").unwrap();
        let err = store.verify(&art).await.unwrap_err();
        assert!(matches!(err, ArtifactError::Modified { .. }), "{err}");
        let err = store.materialize(&art, &root.join("in")).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("was modified after it was published"),
            "{err}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Regression (issue 26): a rewrite that keeps the size and restores the
    /// modification time keeps the `file://` ETag too, so `verify` cannot see it; the
    /// manifest's sha256 does, when the artifact is materialized.
    #[tokio::test]
    async fn a_same_size_rewrite_with_its_old_mtime_is_seen_by_its_sha256() {
        let (root, store, art) = published_hello("sha").await;
        let m = store.manifest(&art).await.unwrap();
        assert_eq!(
            m.files[0].sha256.as_deref(),
            Some("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"),
            "sha256 of `hello`"
        );
        let stored = root.join("store/runs/r1/s/1/data/a.txt");
        let mtime = std::fs::metadata(&stored).unwrap().modified().unwrap();
        make_writable(&stored);
        std::fs::write(&stored, b"HELLO").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&stored)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        // Size, inode and mtime as published: the ETag check passes.
        store.verify(&art).await.unwrap();
        let err = store.materialize(&art, &root.join("in")).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("was modified after it was published"),
            "{text}"
        );
        assert!(text.contains("sha256 2cf24dba"), "{text}");
        assert!(
            !root.join("in/a.txt").exists(),
            "nothing tampered is handed on"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn symlinks_are_refused() {
        let tmp = std::env::temp_dir().join(format!("dt-sym-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tmp.join("pw")).unwrap();
        let store = ArtifactStore::open("memory://").unwrap();
        let err = store
            .publish_dir(&attempt(), "data", &tmp)
            .await
            .unwrap_err();
        assert!(matches!(err, ArtifactError::Symlink { .. }), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn keys_cannot_escape() {
        assert!(check_key("a/b.txt").is_ok());
        assert!(check_key("../x").is_err());
        assert!(check_key("a/../../x").is_err());
        assert!(check_key("/etc/passwd").is_err());
        assert!(check_key("a//b").is_err());
        assert!(check_key("a\\b").is_err());
    }
}
