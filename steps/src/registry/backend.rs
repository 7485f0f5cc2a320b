//! What a registry backend implements ([`ModelRegistry`]), and the names it accepts.

use std::path::Path;

use serde_json::Value;

/// What a model registry keeps: versions of models (their files and records) and aliases
/// that point at versions, every move in an audit log. The object store's
/// (`store.rs`) and MLflow's (`mlflow.rs`); [`super::Registry`] adds what both share
/// (names checked, a version registered once, rollback, `MODEL@VERSION` lookup).
#[async_trait::async_trait]
pub trait ModelRegistry: std::fmt::Debug + Send + Sync {
    /// `store` or `mlflow`.
    fn kind(&self) -> &'static str;
    /// Every model with a version.
    async fn models(&self) -> anyhow::Result<Vec<String>>;
    /// Registers the files under `dir` as the next version of `model`; returns its number.
    async fn register(&self, model: &str, dir: &Path, meta: Value) -> anyhow::Result<u64>;
    /// A version's record, or `None`.
    async fn version(&self, model: &str, n: u64) -> anyhow::Result<Option<Value>>;
    /// Every complete version of `model`, oldest first.
    async fn versions(&self, model: &str) -> anyhow::Result<Vec<Value>>;
    /// Reads a file of a version.
    async fn file(&self, model: &str, n: u64, rel: &str) -> anyhow::Result<Vec<u8>>;
    /// The version `alias` points at now, with its record.
    async fn alias(&self, model: &str, alias: &str) -> anyhow::Result<Option<Value>>;
    /// Moves `alias` to `version` (which exists); returns the audit entry written.
    async fn move_alias(
        &self,
        model: &str,
        alias: &str,
        version: u64,
        note: Value,
    ) -> anyhow::Result<Value>;
    /// Every alias move of `model`, oldest first.
    async fn history(&self, model: &str) -> anyhow::Result<Vec<Value>>;
    /// Every alias of `model` and the version it points at.
    async fn aliases(&self, model: &str) -> anyhow::Result<Vec<(String, Value)>>;
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !s.starts_with('.')
}

pub(crate) fn check(kind: &str, s: &str) -> anyhow::Result<()> {
    if !valid_name(s) {
        anyhow::bail!("{kind} `{s}` must be letters, digits, `-`, `_` or `.`");
    }
    Ok(())
}
