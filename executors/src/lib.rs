//! Executors, registered by the binary in one explicit list.
//!
//! The spec names an executor with `defaults.executor`; [`EXECUTORS`] is what validation
//! accepts and [`executor`] what can run today.

use std::sync::Arc;

use drivetrain_engine::executor::Executor;

pub mod gpus;
pub mod kubernetes;
pub mod local;
pub mod slurm;
pub mod wrapper;

/// An executor's settings from the YAML file at `path`; an error names the file, line and
/// column.
pub fn settings_file<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_yaml_ng::from_str(&text).map_err(|e| match e.location() {
        Some(at) => format!("{}:{}:{}: {e}", path.display(), at.line(), at.column()),
        None => format!("{}: {e}", path.display()),
    })
}

/// The executor kinds a pipeline may name, default first.
pub const EXECUTORS: &[&str] = &["local", "kubernetes", "slurm"];

/// The executor registered under `name`, or why there is none.
pub fn executor(name: &str) -> Result<Arc<dyn Executor>, String> {
    match name {
        "local" => Ok(Arc::new(local::LocalExecutor::from_env()?)),
        "kubernetes" => Ok(Arc::new(kubernetes::KubernetesExecutor::new(
            kubernetes::Settings::from_env()?,
        ))),
        "slurm" => Ok(Arc::new(slurm::SlurmExecutor::new(
            slurm::Settings::from_env()?,
        ))),
        other => Err(format!("unknown executor `{other}`")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_is_the_default() {
        assert_eq!(super::EXECUTORS[0], "local");
        assert!(super::executor("local").is_ok());
    }
}
