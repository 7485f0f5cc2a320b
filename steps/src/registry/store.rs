//! The registry in the object store, under `registry/` of the artifact store (the layout
//! and its conditional creates: see the parent module).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde_json::{json, Value};

use super::backend::{check, ModelRegistry};
use super::files::{audit_entry, digest_dir, now, put_files};

/// The registry in an object store.
#[derive(Debug, Clone)]
pub struct StoreRegistry {
    store: Arc<dyn ObjectStore>,
}

impl StoreRegistry {
    /// The registry of the artifact store at `url`.
    pub fn open(url: &str, vars: &BTreeMap<String, String>) -> anyhow::Result<StoreRegistry> {
        let store = drivetrain_engine::artifacts::ArtifactStore::open_with(url, vars)?;
        Ok(StoreRegistry {
            store: Arc::new(object_store::prefix::PrefixStore::new(
                store.object_store(),
                "registry",
            )),
        })
    }

    async fn create(&self, key: &str, bytes: Vec<u8>) -> anyhow::Result<bool> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&Key::from(key), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn get_json(&self, key: &str) -> anyhow::Result<Option<Value>> {
        match self.store.get(&Key::from(key)).await {
            Ok(r) => Ok(Some(serde_json::from_slice(&r.bytes().await?)?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Names directly under `prefix/`.
    async fn children(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let p = if prefix.is_empty() {
            None
        } else {
            Some(Key::from(prefix))
        };
        let listed = self.store.list_with_delimiter(p.as_ref()).await?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .chain(listed.objects.iter().map(|o| &o.location))
            .filter_map(|k| k.filename().map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Every generation of `alias`, oldest first.
    async fn generations(&self, model: &str, alias: &str) -> anyhow::Result<Vec<Value>> {
        let prefix = Key::from(format!("{model}/aliases/{alias}"));
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let mut keys: Vec<String> = metas.into_iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        let mut out = Vec::new();
        for k in keys {
            if let Some(v) = self.get_json(&k).await? {
                out.push(v);
            }
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl ModelRegistry for StoreRegistry {
    fn kind(&self) -> &'static str {
        "store"
    }

    async fn models(&self) -> anyhow::Result<Vec<String>> {
        self.children("").await
    }

    /// Registers the files under `dir` as the next version of `model`; returns its number.
    async fn register(&self, model: &str, dir: &Path, meta: Value) -> anyhow::Result<u64> {
        check("model", model)?;
        let existing = self.children(&format!("{model}/versions")).await?;
        let mut n = existing
            .iter()
            .filter_map(|v| v.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        while !self
            .create(&format!("{model}/versions/{n}/reserved"), Vec::new())
            .await?
        {
            n += 1;
        }
        let (digest, files) = digest_dir(dir)?;
        put_files(
            &self.store,
            &format!("{model}/versions/{n}/model"),
            dir,
            &files,
        )
        .await?;
        let mut v = meta;
        v["model"] = json!(model);
        v["version"] = json!(n);
        v["files"] = json!(files);
        v["files_digest"] = json!(digest);
        v["registered_at"] = json!(now());
        if !self
            .create(
                &format!("{model}/versions/{n}/version.json"),
                serde_json::to_vec_pretty(&v)?,
            )
            .await?
        {
            anyhow::bail!("version {n} of `{model}` was written by someone else");
        }
        Ok(n)
    }

    /// A version's record, or `None`.
    async fn version(&self, model: &str, n: u64) -> anyhow::Result<Option<Value>> {
        self.get_json(&format!("{model}/versions/{n}/version.json"))
            .await
    }

    /// Every complete version of `model`, oldest first.
    async fn versions(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        let mut ns: Vec<u64> = self
            .children(&format!("{model}/versions"))
            .await?
            .iter()
            .filter_map(|v| v.parse().ok())
            .collect();
        ns.sort();
        let mut out = Vec::new();
        for n in ns {
            if let Some(v) = self.version(model, n).await? {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Reads a file of a version.
    async fn file(&self, model: &str, n: u64, rel: &str) -> anyhow::Result<Vec<u8>> {
        Ok(self
            .store
            .get(&Key::from(format!("{model}/versions/{n}/model/{rel}")))
            .await?
            .bytes()
            .await?
            .to_vec())
    }

    /// The version `alias` points at now, with its record.
    async fn alias(&self, model: &str, alias: &str) -> anyhow::Result<Option<Value>> {
        Ok(self.generations(model, alias).await?.pop())
    }

    /// Moves `alias` to `version`; `note` (the gate result, a reason) goes into the audit
    /// entry. Concurrent moves are serialized by the conditional create of the next
    /// generation: none is lost. Returns the entry written. [`Registry::move_alias`] has
    /// checked that the version exists.
    async fn move_alias(
        &self,
        model: &str,
        alias: &str,
        version: u64,
        note: Value,
    ) -> anyhow::Result<Value> {
        loop {
            let current = self.alias(model, alias).await?;
            let generation = current
                .as_ref()
                .and_then(|c| c["generation"].as_u64())
                .unwrap_or(0)
                + 1;
            let entry = audit_entry(
                model,
                alias,
                generation,
                version,
                current.as_ref(),
                note.clone(),
            );
            let key = format!("{model}/aliases/{alias}/{generation:010}.json");
            if self
                .create(&key, serde_json::to_vec_pretty(&entry)?)
                .await?
            {
                return Ok(entry);
            }
            // Someone else moved it first: read again and go after them.
        }
    }

    /// Every alias move of `model`, oldest first.
    async fn history(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        let mut out = Vec::new();
        for alias in self.children(&format!("{model}/aliases")).await? {
            out.extend(self.generations(model, &alias).await?);
        }
        out.sort_by(|a, b| a["at"].as_str().cmp(&b["at"].as_str()));
        Ok(out)
    }

    /// Every alias of `model` and the version it points at.
    async fn aliases(&self, model: &str) -> anyhow::Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        for alias in self.children(&format!("{model}/aliases")).await? {
            if let Some(v) = self.alias(model, &alias).await? {
                out.push((alias, v));
            }
        }
        Ok(out)
    }
}
