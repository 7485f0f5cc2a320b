//! The model registry in the object store, under `registry/` of the artifact store.
//!
//! ```text
//! registry/<model>/versions/<n>/reserved       created first: claims number n
//! registry/<model>/versions/<n>/model/…        the model's files
//! registry/<model>/versions/<n>/version.json   written last: the version exists
//! registry/<model>/aliases/<alias>/<g>.json    generation g of the alias: version, from,
//!                                              who, when, the run and its gate result
//! ```
//!
//! Every write that decides something is a conditional create (`PutMode::Create`, `If-None-Match: *`
//! on S3): two promoters claiming the same version number or the same next alias generation
//! cannot both win; the loser re-reads and tries the next. An alias is its newest
//! generation, and the generations are the append-only audit log of its moves.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde_json::{json, Value};

use crate::mlflow::MlflowRegistry;

/// The cache-key reference to `model@alias` (in `registry`, else the default registry):
/// `registry:MODEL@ALIAS[ in REGISTRY]`, as [`AliasResolver`] reads it.
pub fn reference(model: &str, alias: &str, registry: Option<&str>) -> String {
    match registry {
        Some(r) => format!("registry:{model}@{alias} in {r}"),
        None => format!("registry:{model}@{alias}"),
    }
}

/// Resolves `registry:MODEL@ALIAS[ in REGISTRY]` to the version the alias points at
/// (`unset` before its first move), for cache keys of stages that compare with it.
#[derive(Debug, Default)]
pub struct AliasResolver;

#[async_trait::async_trait]
impl drivetrain_engine::cache::Resolver for AliasResolver {
    async fn resolve(&self, reference: &str, store: &str) -> Result<String, String> {
        let spec = reference
            .strip_prefix("registry:")
            .ok_or_else(|| format!("`{reference}` is not a registry reference"))?;
        let (spec, registry) = match spec.split_once(" in ") {
            Some((s, r)) => (s, Some(r)),
            None => (spec, None),
        };
        let (model, alias) = spec
            .rsplit_once('@')
            .filter(|(m, a)| !m.is_empty() && !a.is_empty())
            .ok_or_else(|| format!("`{reference}`: write `registry:MODEL@ALIAS`"))?;
        let reg = Registry::open_for(registry, store).map_err(|e| format!("{e:#}"))?;
        match reg
            .alias(model, alias)
            .await
            .map_err(|e| format!("{e:#}"))?
        {
            None => Ok("unset".into()),
            Some(a) => a["version"]
                .as_u64()
                .map(|v| v.to_string())
                .ok_or_else(|| format!("alias `{model}@{alias}` names no version: {a}")),
        }
    }
}

/// A model registry: the object-store registry (the default, beside the artifacts) or
/// MLflow's (`mlflow+http://host:port`, see [`crate::mlflow`]). `drivetrain registry`,
/// `validate` and `promote` work the same against either.
#[derive(Debug, Clone)]
pub enum Registry {
    Store(StoreRegistry),
    Mlflow(MlflowRegistry),
}

/// Calls the same method of whichever backend.
macro_rules! backend {
    ($self:ident . $m:ident ( $($a:expr),* )) => {
        match $self {
            Registry::Store(r) => r.$m($($a),*).await,
            Registry::Mlflow(r) => r.$m($($a),*).await,
        }
    };
}

impl Registry {
    /// The registry named by `registry`, else `DRIVETRAIN_REGISTRY`, else the one in the
    /// artifact store at `store` (which also keeps an MLflow registry's model files).
    pub fn open_for(registry: Option<&str>, store: &str) -> anyhow::Result<Registry> {
        Self::open_with(registry, store, drivetrain_engine::cloud::process_env())
    }

    /// As [`Registry::open_for`], configured from `vars` instead of the environment.
    pub fn open_with(
        registry: Option<&str>,
        store: &str,
        vars: BTreeMap<String, String>,
    ) -> anyhow::Result<Registry> {
        let env = vars
            .get("DRIVETRAIN_REGISTRY")
            .filter(|v| !v.is_empty())
            .cloned();
        match registry.map(str::to_owned).or(env) {
            Some(u) if u.starts_with("mlflow+") => {
                Ok(Registry::Mlflow(MlflowRegistry::new(&u, store, vars)?))
            }
            Some(u) => Ok(Registry::Store(StoreRegistry::open(&u, &vars)?)),
            None => Ok(Registry::Store(StoreRegistry::open(store, &vars)?)),
        }
    }

    pub async fn models(&self) -> anyhow::Result<Vec<String>> {
        backend!(self.models())
    }

    /// Registers the files under `dir` as the next version of `model`; returns its number.
    pub async fn register(&self, model: &str, dir: &Path, meta: Value) -> anyhow::Result<u64> {
        check("model", model)?;
        backend!(self.register(model, dir, meta))
    }

    /// The version of `model` that holds exactly the files under `dir` (the same
    /// `files_digest`), registering them as the next version only when none does;
    /// returns its number and whether it is new. A model promoted again moves the alias
    /// to the version it already is, never to a copy.
    pub async fn register_once(
        &self,
        model: &str,
        dir: &Path,
        meta: Value,
    ) -> anyhow::Result<(u64, bool)> {
        check("model", model)?;
        let (digest, _) = digest_dir(dir)?;
        let held = self
            .versions(model)
            .await?
            .into_iter()
            .find(|v| v["files_digest"].as_str() == Some(digest.as_str()))
            .and_then(|v| v["version"].as_u64());
        match held {
            Some(n) => Ok((n, false)),
            None => Ok((self.register(model, dir, meta).await?, true)),
        }
    }

    /// A version's record, or `None`.
    pub async fn version(&self, model: &str, n: u64) -> anyhow::Result<Option<Value>> {
        backend!(self.version(model, n))
    }

    /// Every complete version of `model`, oldest first.
    pub async fn versions(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        backend!(self.versions(model))
    }

    /// Reads a file of a version.
    pub async fn file(&self, model: &str, n: u64, rel: &str) -> anyhow::Result<Vec<u8>> {
        backend!(self.file(model, n, rel))
    }

    /// The version `alias` points at now, with its record.
    pub async fn alias(&self, model: &str, alias: &str) -> anyhow::Result<Option<Value>> {
        backend!(self.alias(model, alias))
    }

    /// Moves `alias` to `version`, which must exist; `note` (the gate result, a reason)
    /// goes into the audit entry. Returns the entry written.
    pub async fn move_alias(
        &self,
        model: &str,
        alias: &str,
        version: u64,
        note: Value,
    ) -> anyhow::Result<Value> {
        check("model", model)?;
        check("alias", alias)?;
        if self.version(model, version).await?.is_none() {
            anyhow::bail!("`{model}` has no version {version}");
        }
        backend!(self.move_alias(model, alias, version, note))
    }

    /// Every alias move of `model`, oldest first.
    pub async fn history(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        backend!(self.history(model))
    }

    /// Every alias of `model` and the version it points at.
    pub async fn aliases(&self, model: &str) -> anyhow::Result<Vec<(String, Value)>> {
        backend!(self.aliases(model))
    }

    /// Moves `alias` back to the version it pointed at before its current one.
    pub async fn rollback(&self, model: &str, alias: &str) -> anyhow::Result<Value> {
        let current = self
            .alias(model, alias)
            .await?
            .ok_or_else(|| anyhow::anyhow!("`{model}` has no alias `{alias}`"))?;
        let previous = current["from"].as_u64().ok_or_else(|| {
            anyhow::anyhow!("alias `{alias}` of `{model}` has no earlier version to go back to")
        })?;
        self.move_alias(
            model,
            alias,
            previous,
            json!({"rollback_of": current["version"]}),
        )
        .await
    }

    /// `MODEL@VERSION` or `MODEL@ALIAS` → the version's record.
    pub async fn resolve(&self, spec: &str) -> anyhow::Result<Value> {
        let (model, which) = spec.split_once('@').ok_or_else(|| {
            anyhow::anyhow!("expected MODEL@VERSION or MODEL@ALIAS, got `{spec}`")
        })?;
        let n = match which.parse::<u64>() {
            Ok(n) => n,
            Err(_) => self
                .alias(model, which)
                .await?
                .and_then(|a| a["version"].as_u64())
                .ok_or_else(|| anyhow::anyhow!("`{model}` has no alias `{which}`"))?,
        };
        self.version(model, n)
            .await?
            .ok_or_else(|| anyhow::anyhow!("`{model}` has no version {n}"))
    }
}

/// The registry in an object store.
#[derive(Debug, Clone)]
pub struct StoreRegistry {
    store: Arc<dyn ObjectStore>,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !s.starts_with('.')
}

fn check(kind: &str, s: &str) -> anyhow::Result<()> {
    if !valid_name(s) {
        anyhow::bail!("{kind} `{s}` must be letters, digits, `-`, `_` or `.`");
    }
    Ok(())
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

    pub async fn models(&self) -> anyhow::Result<Vec<String>> {
        self.children("").await
    }

    /// Registers the files under `dir` as the next version of `model`; returns its number.
    pub async fn register(&self, model: &str, dir: &Path, meta: Value) -> anyhow::Result<u64> {
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
    pub async fn version(&self, model: &str, n: u64) -> anyhow::Result<Option<Value>> {
        self.get_json(&format!("{model}/versions/{n}/version.json"))
            .await
    }

    /// Every complete version of `model`, oldest first.
    pub async fn versions(&self, model: &str) -> anyhow::Result<Vec<Value>> {
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
    pub async fn file(&self, model: &str, n: u64, rel: &str) -> anyhow::Result<Vec<u8>> {
        Ok(self
            .store
            .get(&Key::from(format!("{model}/versions/{n}/model/{rel}")))
            .await?
            .bytes()
            .await?
            .to_vec())
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

    /// The version `alias` points at now, with its record.
    pub async fn alias(&self, model: &str, alias: &str) -> anyhow::Result<Option<Value>> {
        Ok(self.generations(model, alias).await?.pop())
    }

    /// Moves `alias` to `version`; `note` (the gate result, a reason) goes into the audit
    /// entry. Concurrent moves are serialized by the conditional create of the next
    /// generation: none is lost. Returns the entry written. [`Registry::move_alias`] has
    /// checked that the version exists.
    pub async fn move_alias(
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
    pub async fn history(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        let mut out = Vec::new();
        for alias in self.children(&format!("{model}/aliases")).await? {
            out.extend(self.generations(model, &alias).await?);
        }
        out.sort_by(|a, b| a["at"].as_str().cmp(&b["at"].as_str()));
        Ok(out)
    }

    /// Every alias of `model` and the version it points at.
    pub async fn aliases(&self, model: &str) -> anyhow::Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        for alias in self.children(&format!("{model}/aliases")).await? {
            if let Some(v) = self.alias(model, &alias).await? {
                out.push((alias, v));
            }
        }
        Ok(out)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 promoters move one alias at once: every move lands, as its own generation, and
    /// the chain of `from`s is unbroken.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_alias_moves_lose_nothing() {
        let dir = std::env::temp_dir().join(format!("dt-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let files = dir.join("model");
        std::fs::create_dir_all(&files).unwrap();
        std::fs::write(files.join("model.json"), "{}").unwrap();
        let store = format!("file://{}", dir.join("store").display());
        let reg = Registry::open_for(Some(&store), &store).unwrap();
        let mut versions = Vec::new();
        for _ in 0..4 {
            versions.push(reg.register("m", &files, json!({})).await.unwrap());
        }
        assert_eq!(versions, [1, 2, 3, 4]);
        let mut tasks = Vec::new();
        for i in 0..16u64 {
            let reg = reg.clone();
            tasks.push(tokio::spawn(async move {
                reg.move_alias("m", "production", 1 + i % 4, json!({"i": i}))
                    .await
                    .unwrap()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let history = reg.history("m").await.unwrap();
        assert_eq!(history.len(), 16);
        let mut gens: Vec<u64> = history
            .iter()
            .map(|h| h["generation"].as_u64().unwrap())
            .collect();
        gens.sort();
        assert_eq!(gens, (1..=16).collect::<Vec<_>>());
        let by_gen: std::collections::BTreeMap<u64, &Value> = history
            .iter()
            .map(|h| (h["generation"].as_u64().unwrap(), h))
            .collect();
        for g in 2..=16 {
            assert_eq!(
                by_gen[&g]["from"],
                by_gen[&(g - 1)]["version"],
                "generation {g}"
            );
        }
        let now = reg.alias("m", "production").await.unwrap().unwrap();
        assert_eq!(now["generation"], 16);
        let back = reg.rollback("m", "production").await.unwrap();
        assert_eq!(back["version"], by_gen[&15]["version"]);
        assert!(reg.resolve("m@production").await.is_ok());
        assert!(reg.resolve("m@9").await.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
