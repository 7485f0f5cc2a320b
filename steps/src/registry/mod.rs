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

use drivetrain_engine::cache::{ResolveError, Resolver};
use serde_json::{json, Value};

mod backend;
mod files;
pub mod mlflow;
pub mod store;

use backend::check;
pub use backend::ModelRegistry;
pub(crate) use files::digest_dir;
pub use mlflow::MlflowRegistry;
pub use store::StoreRegistry;

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
impl Resolver for AliasResolver {
    async fn resolve(&self, reference: &str, store: &str) -> Result<String, ResolveError> {
        let spec = reference
            .strip_prefix("registry:")
            .ok_or_else(|| ResolveError::NotARegistryReference(reference.to_owned()))?;
        let (spec, registry) = match spec.split_once(" in ") {
            Some((s, r)) => (s, Some(r)),
            None => (spec, None),
        };
        let (model, alias) = spec
            .rsplit_once('@')
            .filter(|(m, a)| !m.is_empty() && !a.is_empty())
            .ok_or_else(|| ResolveError::Malformed(reference.to_owned()))?;
        let unreadable = |e: anyhow::Error| ResolveError::Registry(format!("{e:#}"));
        let reg = Registry::open_for(registry, store).map_err(unreadable)?;
        match reg.alias(model, alias).await.map_err(unreadable)? {
            None => Ok("unset".into()),
            Some(a) => a["version"].as_u64().map(|v| v.to_string()).ok_or_else(|| {
                ResolveError::NoVersion {
                    alias: format!("{model}@{alias}"),
                    found: a.to_string(),
                }
            }),
        }
    }
}

/// A model registry: the object-store registry (the default, beside the artifacts) or
/// MLflow's (`mlflow+http://host:port`, see [`mlflow`]), as a [`ModelRegistry`].
/// `drivetrain registry`, `validate` and `promote` work the same against either.
#[derive(Debug, Clone)]
pub struct Registry(Arc<dyn ModelRegistry>);

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
                Ok(Registry(Arc::new(MlflowRegistry::new(&u, store, vars)?)))
            }
            Some(u) => Ok(Registry(Arc::new(StoreRegistry::open(&u, &vars)?))),
            None => Ok(Registry(Arc::new(StoreRegistry::open(store, &vars)?))),
        }
    }

    /// `store` or `mlflow`.
    pub fn kind(&self) -> &'static str {
        self.0.kind()
    }

    pub async fn models(&self) -> anyhow::Result<Vec<String>> {
        self.0.models().await
    }

    /// Registers the files under `dir` as the next version of `model`; returns its number.
    pub async fn register(&self, model: &str, dir: &Path, meta: Value) -> anyhow::Result<u64> {
        check("model", model)?;
        self.0.register(model, dir, meta).await
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
        self.0.version(model, n).await
    }

    /// Every complete version of `model`, oldest first.
    pub async fn versions(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        self.0.versions(model).await
    }

    /// Reads a file of a version.
    pub async fn file(&self, model: &str, n: u64, rel: &str) -> anyhow::Result<Vec<u8>> {
        self.0.file(model, n, rel).await
    }

    /// The version `alias` points at now, with its record.
    pub async fn alias(&self, model: &str, alias: &str) -> anyhow::Result<Option<Value>> {
        self.0.alias(model, alias).await
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
        self.0.move_alias(model, alias, version, note).await
    }

    /// Every alias move of `model`, oldest first.
    pub async fn history(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        self.0.history(model).await
    }

    /// Every alias of `model` and the version it points at.
    pub async fn aliases(&self, model: &str) -> anyhow::Result<Vec<(String, Value)>> {
        self.0.aliases(model).await
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
