//! Finding a trigger's objects by listing its prefix: from a durable cursor (the
//! greatest key listed so far; S3 lists in key order and starts after it), or the whole
//! prefix (a rescan, the safety net for keys that sort before the cursor and for
//! notifications that never came). What is found goes into the inbox, where an object
//! already known by URL and ETag is not new.
//!
//! A local folder's file has its content digest for an ETag (`sha256:…`), as an object
//! store's ETag names content: a file copied again with the same bytes, or touched, is
//! the same object, not a new log. Each file is read once for it, and again only when
//! its size, time or inode changed (the first listing of a server reads every file).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;

use super::{EventError, Trigger};
use crate::state::InboxObject;

/// A trigger's prefix, opened.
#[derive(Debug)]
pub struct Source {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The source URL ending in `/`: an object's URL is this and its key.
    base: String,
    /// A local folder's path, whose files are named by their content.
    root: Option<std::path::PathBuf>,
    /// Each file's digest, with the listing's own ETag it was made for (key →
    /// (ETag, digest)).
    digests: Mutex<HashMap<String, (String, String)>>,
}

/// What one listing found.
#[derive(Debug, Default)]
pub struct Listing {
    /// The objects whose key the trigger's glob matches, in key order.
    pub objects: Vec<InboxObject>,
    /// The greatest key listed (matching or not): the next cursor.
    pub last_key: Option<String>,
    /// How many objects the store listed.
    pub listed: usize,
}

impl Source {
    /// Opens `url` (`s3://…`, `gs://…`, `az://…`, `file:///…`), cloud stores configured
    /// from the environment as the artifact store is ([`crate::cloud`]).
    pub fn open(url: &str) -> Result<Source, EventError> {
        let setting = EventError::Setting;
        let parsed = url::Url::parse(url).map_err(|e| setting(format!("{url}: {e}")))?;
        let base = match url.ends_with('/') {
            true => url.to_owned(),
            false => format!("{url}/"),
        };
        let mut root = None;
        let (store, prefix): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
            "file" => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|_| setting(format!("{url}: a file:// source is an absolute path")))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| setting(format!("{url}: {e}")))?;
                root = Some(dir);
                (Arc::new(fs), Path::default())
            }
            _ => crate::cloud::open(&parsed, &crate::cloud::process_env())
                .map_err(|e| setting(format!("{url}: {e}")))?,
        };
        Ok(Source {
            store,
            prefix,
            base,
            root,
            digests: Mutex::new(HashMap::new()),
        })
    }

    /// Whether listing from the cursor costs as much as listing it all (a local
    /// directory is read whole either way): then every listing is whole, and a file
    /// whose name sorts before the cursor is seen at the next poll, not the next rescan.
    pub fn lists_whole(&self) -> bool {
        self.base.starts_with("file:")
    }

    /// The URL of the object at `key` below the prefix.
    pub fn url_of(&self, key: &str) -> String {
        format!("{}{key}", self.base)
    }

    /// The objects below the prefix whose key sorts after `after` (all with none).
    pub async fn list(&self, t: &Trigger, after: Option<&str>) -> Result<Listing, EventError> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let stream = match after {
            Some(after) => {
                let offset = match prefix {
                    Some(p) => Path::from(format!("{}/{after}", p.as_ref())),
                    None => Path::from(after),
                };
                self.store.list_with_offset(prefix, &offset)
            }
            None => self.store.list(prefix),
        };
        let mut metas: Vec<object_store::ObjectMeta> = stream
            .try_collect()
            .await
            .map_err(|e| EventError::Remote(format!("cannot list {}: {e}", self.base)))?;
        // S3 lists in key order; a local directory does not.
        metas.sort_by(|a, b| a.location.cmp(&b.location));
        let now = crate::state::now();
        let mut out = Listing {
            listed: metas.len(),
            ..Listing::default()
        };
        let strip = match prefix {
            Some(p) => format!("{}/", p.as_ref()),
            None => String::new(),
        };
        for m in metas {
            let Some(key) = m.location.as_ref().strip_prefix(&strip) else {
                continue;
            };
            if after.is_some_and(|a| key <= a) {
                continue;
            }
            out.last_key = Some(key.to_owned());
            if !t.matches(key) {
                continue;
            }
            let listed = etag(m.e_tag.as_deref());
            out.objects.push(InboxObject {
                url: self.url_of(key),
                etag: match &self.root {
                    Some(root) => self.content_etag(root, key, listed).await?,
                    None => listed,
                },
                size: i64::try_from(m.size).ok(),
                modified: Some(
                    m.last_modified
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                ),
                group: t.group(key),
                discovered_at: now.clone(),
                payload: None,
            });
        }
        Ok(out)
    }
}

impl Source {
    /// The digest of the local file `key` under `root`, read again only when the
    /// listing's own ETag (its inode, size and time) changed.
    async fn content_etag(
        &self,
        root: &std::path::Path,
        key: &str,
        listed: String,
    ) -> Result<String, EventError> {
        let known = self.digests.lock().unwrap().get(key).cloned();
        if let Some((_, digest)) = known.filter(|(seen, _)| *seen == listed) {
            return Ok(digest);
        }
        let path = root.join(key);
        let digest = tokio::task::spawn_blocking(move || file_digest(&path))
            .await
            .map_err(|e| EventError::Remote(e.to_string()))?
            .map_err(|e| EventError::Remote(format!("cannot read {key}: {e}")))?;
        let mut digests = self.digests.lock().unwrap();
        digests.insert(key.to_owned(), (listed, digest.clone()));
        Ok(digest)
    }
}

/// `sha256:HEX` of the file at `path`, read in pieces.
fn file_digest(path: &std::path::Path) -> std::io::Result<String> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut f = std::fs::File::open(path)?;
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => hash.update(&buf[..n]),
        }
    }
    Ok(format!("sha256:{}", hex::encode(hash.finalize())))
}

/// An ETag as the inbox keeps it: without the quotes S3's listings put around it (its
/// event notifications do not), so both name the same object alike.
pub fn etag(e: Option<&str>) -> String {
    e.unwrap_or("").trim_matches('"').to_owned()
}
