//! The MLflow model registry as drivetrain's registry (`mlflow+http://host:port`), over
//! MLflow's REST API, so a serving stack that reads MLflow sees what the loop promotes.
//!
//! - A version is an MLflow model version whose `source` is the URL of its files in the
//!   artifact store (`registry/<model>/files/<digest>/`, content-addressed, so a model
//!   registered twice is stored once), with drivetrain's lineage in its tags
//!   (`drivetrain.run`, `drivetrain.pipeline`, `drivetrain.model_digest`, and the whole
//!   record in `drivetrain.version`) and a run link.
//! - Aliases are MLflow aliases. Every move is also recorded as a tag of the registered
//!   model, `drivetrain.alias.<alias>.<generation>`: the audit log `history` reads.
//!   MLflow has no conditional update, so two moves of one alias at the same instant are
//!   last-writer-wins here (the object-store registry serializes them).
//!
//! Aliases are read from the registered model (one request), so MLflow's quirk of
//! answering a missing alias with 400 `INVALID_PARAMETER_VALUE` never comes up; every
//! request is JSON.

use std::path::Path;

use serde_json::{json, Value};

use super::backend::ModelRegistry;

/// A client of one MLflow tracking server, keeping model files in an artifact store.
#[derive(Debug, Clone)]
pub struct MlflowRegistry {
    api: String,
    http: reqwest::Client,
    /// Where model files go: the artifact store's URL.
    store: String,
    /// The store's configuration (the process environment but in tests).
    vars: std::collections::BTreeMap<String, String>,
}

/// An MLflow error answer.
#[derive(Debug)]
struct ApiError {
    status: u16,
    code: String,
    message: String,
}

const AUDIT: &str = "drivetrain.alias.";

impl MlflowRegistry {
    /// `url` is `mlflow+http://host:port` (or `https`); files go to the store at `store`,
    /// configured from `vars`. MLflow takes a version's source only from remote storage,
    /// so the store must be `s3://`, `gs://` or `az://`.
    pub fn new(
        url: &str,
        store: &str,
        vars: std::collections::BTreeMap<String, String>,
    ) -> anyhow::Result<MlflowRegistry> {
        if store.starts_with("file:") || store.starts_with("memory:") {
            anyhow::bail!(
                "the MLflow registry `{url}` needs the artifact store on s3://, gs:// or az:// (MLflow refuses a local `{store}` as a model version's source); set DRIVETRAIN_STORE"
            );
        }
        let base = url
            .strip_prefix("mlflow+")
            .filter(|b| b.starts_with("http://") || b.starts_with("https://"))
            .ok_or_else(|| anyhow::anyhow!("registry `{url}`: expected mlflow+http://HOST:PORT"))?;
        drivetrain_engine::cloud::install_crypto();
        Ok(MlflowRegistry {
            api: format!("{}/api/2.0/mlflow", base.trim_end_matches('/')),
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()?,
            store: store.to_owned(),
            vars,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> anyhow::Result<Result<Value, ApiError>> {
        let mut req = self
            .http
            .request(method, format!("{}/{path}", self.api))
            .query(query);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("MLflow at {}: {e}", self.api))?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(Ok(v));
        }
        Ok(Err(ApiError {
            status,
            code: v["error_code"].as_str().unwrap_or_default().to_owned(),
            message: v["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| text.chars().take(300).collect()),
        }))
    }

    /// A call that must succeed.
    async fn ok(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        self.call(method, path, query, body)
            .await?
            .map_err(|e| anyhow::anyhow!("MLflow {path}: {} {} ({})", e.status, e.message, e.code))
    }

    /// A GET whose "not found" is `None`.
    async fn optional(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Option<Value>> {
        match self.call(reqwest::Method::GET, path, query, None).await? {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == "RESOURCE_DOES_NOT_EXIST" => Ok(None),
            Err(e) => anyhow::bail!("MLflow {path}: {} {} ({})", e.status, e.message, e.code),
        }
    }

    async fn registered(&self, model: &str) -> anyhow::Result<Option<Value>> {
        Ok(self
            .optional("registered-models/get", &[("name", model)])
            .await?
            .map(|v| v["registered_model"].clone()))
    }

    /// drivetrain's record of an MLflow model version.
    fn record(mv: &Value) -> Value {
        let tag = |k: &str| {
            mv["tags"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["key"] == k)
                .and_then(|t| t["value"].as_str())
                .map(str::to_owned)
        };
        let mut r = tag("drivetrain.version")
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_else(|| json!({"model": mv["name"]}));
        r["version"] = json!(mv["version"].as_str().and_then(|v| v.parse::<u64>().ok()));
        r["mlflow"] =
            json!({"source": mv["source"], "status": mv["status"], "run_link": mv["run_link"]});
        r
    }

    /// The audit entries of `alias` (every alias when `None`), oldest generation first.
    fn audit(registered: &Value, alias: Option<&str>) -> Vec<Value> {
        let mut out: Vec<(String, Value)> = registered["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| {
                let key = t["key"].as_str()?.strip_prefix(AUDIT)?;
                let (a, _) = key.rsplit_once('.')?;
                if alias.is_some_and(|want| want != a) {
                    return None;
                }
                Some((
                    key.to_owned(),
                    serde_json::from_str(t["value"].as_str()?).ok()?,
                ))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// The alias's record: the newest audit entry if it still describes the alias
    /// (someone may have moved it with MLflow's own tools since), with its version.
    fn alias_entry(registered: &Value, model: &str, alias: &str, version: Option<u64>) -> Value {
        let mut entry = Self::audit(registered, Some(alias))
            .pop()
            .filter(|e| e["version"].as_u64() == version)
            .unwrap_or_else(
                || json!({"model": model, "alias": alias, "note": {"moved": "outside drivetrain"}}),
            );
        entry["version"] = json!(version);
        entry
    }

    /// The version each alias of a registered model points at.
    fn alias_versions(registered: &Value) -> Vec<(String, Option<u64>)> {
        registered["aliases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| {
                let version = a["version"].as_str().and_then(|v| v.parse().ok());
                Some((a["alias"].as_str()?.to_owned(), version))
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl ModelRegistry for MlflowRegistry {
    fn kind(&self) -> &'static str {
        "mlflow"
    }

    async fn models(&self) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        let mut token = String::new();
        loop {
            let mut q = vec![("max_results", "1000")];
            if !token.is_empty() {
                q.push(("page_token", token.as_str()));
            }
            let page = self
                .ok(reqwest::Method::GET, "registered-models/search", &q, None)
                .await?;
            for m in page["registered_models"].as_array().into_iter().flatten() {
                if let Some(n) = m["name"].as_str() {
                    names.push(n.to_owned());
                }
            }
            match page["next_page_token"].as_str() {
                Some(t) if !t.is_empty() => token = t.to_owned(),
                _ => break,
            }
        }
        names.sort();
        Ok(names)
    }

    /// Registers the files under `dir` (stored in the artifact store, content-addressed)
    /// as a new model version; returns its number.
    async fn register(&self, model: &str, dir: &Path, meta: Value) -> anyhow::Result<u64> {
        match self
            .call(
                reqwest::Method::POST,
                "registered-models/create",
                &[],
                Some(json!({"name": model, "description": "registered by drivetrain"})),
            )
            .await?
        {
            Ok(_) => {}
            Err(e) if e.code == "RESOURCE_ALREADY_EXISTS" => {}
            Err(e) => anyhow::bail!("MLflow: cannot create model `{model}`: {}", e.message),
        }
        let (digest, files) = super::files::digest_dir(dir)?;
        let files_url = format!(
            "{}/registry/{model}/files/{}",
            self.store.trim_end_matches('/'),
            digest.trim_start_matches("sha256:")
        );
        let store = drivetrain_engine::artifacts::ArtifactStore::open_with(&files_url, &self.vars)?;
        super::files::put_files(&store.object_store(), "", dir, &files).await?;
        let mut record = meta;
        record["model"] = json!(model);
        record["files"] = json!(files);
        record["files_digest"] = json!(digest);
        record["registered_at"] = json!(super::files::now());
        let text = |p: &str| {
            record
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let mut tags = vec![
            json!({"key": "drivetrain.run", "value": text("/source/run")}),
            json!({"key": "drivetrain.pipeline", "value": text("/source/pipeline")}),
            json!({"key": "drivetrain.stage", "value": text("/source/stage")}),
            json!({"key": "drivetrain.model_digest", "value": text("/source/model_digest")}),
        ];
        tags.retain(|t| t["value"] != "");
        tags.push(json!({"key": "drivetrain.version", "value": record.to_string()}));
        let created = self
            .ok(
                reqwest::Method::POST,
                "model-versions/create",
                &[],
                Some(json!({
                    "name": model,
                    "source": files_url,
                    "tags": tags,
                    "run_link": format!("drivetrain://runs/{}", text("/source/run")),
                    "description": format!("drivetrain run {}", text("/source/run")),
                })),
            )
            .await?;
        created["model_version"]["version"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("MLflow answered no version number: {created}"))
    }

    async fn version(&self, model: &str, n: u64) -> anyhow::Result<Option<Value>> {
        let n = n.to_string();
        Ok(self
            .optional("model-versions/get", &[("name", model), ("version", &n)])
            .await?
            .map(|v| Self::record(&v["model_version"])))
    }

    async fn versions(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        let filter = format!("name='{}'", model.replace('\'', "\\'"));
        let found = self
            .ok(
                reqwest::Method::GET,
                "model-versions/search",
                &[("filter", &filter), ("max_results", "10000")],
                None,
            )
            .await?;
        let mut out: Vec<Value> = found["model_versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Self::record)
            .collect();
        out.sort_by_key(|v| v["version"].as_u64());
        Ok(out)
    }

    /// Reads a file of a version from where its `source` points.
    async fn file(&self, model: &str, n: u64, rel: &str) -> anyhow::Result<Vec<u8>> {
        let v = self
            .version(model, n)
            .await?
            .ok_or_else(|| anyhow::anyhow!("`{model}` has no version {n}"))?;
        let source = v["mlflow"]["source"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("version {n} of `{model}` has no source"))?;
        let store = drivetrain_engine::artifacts::ArtifactStore::open_with(source, &self.vars)?;
        use object_store::ObjectStoreExt;
        Ok(store
            .object_store()
            .get(&object_store::path::Path::from(rel))
            .await?
            .bytes()
            .await?
            .to_vec())
    }

    async fn alias(&self, model: &str, alias: &str) -> anyhow::Result<Option<Value>> {
        let registered = self.registered(model).await?.unwrap_or(Value::Null);
        Ok(Self::alias_versions(&registered)
            .into_iter()
            .find(|(a, _)| a == alias)
            .map(|(_, v)| Self::alias_entry(&registered, model, alias, v)))
    }

    /// Moves `alias` (last writer wins: MLflow has no conditional update). The version
    /// was checked by [`crate::registry::Registry::move_alias`].
    async fn move_alias(
        &self,
        model: &str,
        alias: &str,
        version: u64,
        note: Value,
    ) -> anyhow::Result<Value> {
        let registered = self.registered(model).await?.unwrap_or(Value::Null);
        let current = Self::alias_versions(&registered)
            .into_iter()
            .find(|(a, _)| a == alias)
            .map(|(_, v)| Self::alias_entry(&registered, model, alias, v));
        let generation = Self::audit(&registered, Some(alias))
            .iter()
            .filter_map(|e| e["generation"].as_u64())
            .max()
            .unwrap_or(0)
            + 1;
        let entry =
            super::files::audit_entry(model, alias, generation, version, current.as_ref(), note);
        self.ok(
            reqwest::Method::POST,
            "registered-models/set-tag",
            &[],
            Some(json!({"name": model, "key": format!("{AUDIT}{alias}.{generation:010}"), "value": entry.to_string()})),
        )
        .await?;
        self.ok(
            reqwest::Method::POST,
            "registered-models/alias",
            &[],
            Some(json!({"name": model, "alias": alias, "version": version.to_string()})),
        )
        .await?;
        Ok(entry)
    }

    async fn history(&self, model: &str) -> anyhow::Result<Vec<Value>> {
        let registered = self.registered(model).await?.unwrap_or(Value::Null);
        let mut out = Self::audit(&registered, None);
        out.sort_by(|a, b| a["at"].as_str().cmp(&b["at"].as_str()));
        Ok(out)
    }

    async fn aliases(&self, model: &str) -> anyhow::Result<Vec<(String, Value)>> {
        let registered = self.registered(model).await?.unwrap_or(Value::Null);
        let mut out: Vec<(String, Value)> = Self::alias_versions(&registered)
            .into_iter()
            .map(|(a, v)| {
                let entry = Self::alias_entry(&registered, model, &a, v);
                (a, entry)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}
