//! Executors, registered by the binary in one explicit list.
//!
//! The spec names an executor with `defaults.executor`; [`EXECUTORS`] is what validation
//! accepts and [`executor`] what can run today.

use std::sync::Arc;

use drivetrain_engine::executor::Executor;

pub mod gpus;
pub mod kubernetes;
pub mod local;
pub mod plugin;
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

/// The last `max` bytes of the file at `path` (empty if it cannot be read): where a log
/// ends, without reading all of it.
pub fn file_tail(path: &std::path::Path, max: u64) -> String {
    use std::io::{Read as _, Seek as _};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(max)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Appends `text` to an attempt's log at `path` (nothing when it cannot be opened: the
/// attempt's outcome says what happened).
pub fn append_log(path: &std::path::Path, text: &str) {
    use std::io::Write as _;
    if text.is_empty() {
        return;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut f) = log {
        let _ = f.write_all(text.as_bytes());
    }
}

/// The executor kinds a pipeline may name, default first.
pub const EXECUTORS: &[&str] = &["local", "kubernetes", "slurm"];

/// The executor registered under `name`, or an executor plugin of that name in the
/// folders of `DRIVETRAIN_PLUGIN_PATH`, or why there is none.
pub fn executor(name: &str) -> Result<Arc<dyn Executor>, String> {
    executor_in(name, &drivetrain_engine::plugin::Origin::posted().folders())
}

/// The executor registered under `name`, or an executor plugin of that name in `folders`
/// (`Origin::folders` of the pipeline: its `plugins/`, then `DRIVETRAIN_PLUGIN_PATH`).
pub fn executor_in(
    name: &str,
    folders: &[std::path::PathBuf],
) -> Result<Arc<dyn Executor>, String> {
    match name {
        "local" => Ok(Arc::new(local::LocalExecutor::from_env()?)),
        "kubernetes" => Ok(Arc::new(kubernetes::KubernetesExecutor::new(
            kubernetes::Settings::from_env()?,
        ))),
        "slurm" => Ok(Arc::new(slurm::SlurmExecutor::new(
            slurm::Settings::from_env()?,
        ))),
        other => match plugin::find(other, folders) {
            Some(Ok((spec, dir))) => Ok(Arc::new(plugin::PluginExecutor::new(&spec, &dir))),
            Some(Err(e)) => Err(e),
            None => Err(format!("unknown executor `{other}`")),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_is_the_default() {
        assert_eq!(super::EXECUTORS[0], "local");
        assert!(super::executor("local").is_ok());
    }

    /// Which volumes each executor mounts, and what it says of the others.
    #[test]
    fn each_executor_refuses_the_volumes_it_cannot_mount() {
        use drivetrain_engine::spec::VolumeSpec;
        let volume = |f: fn(&mut VolumeSpec)| {
            let mut v = VolumeSpec {
                name: "v".into(),
                mount_path: "/data".into(),
                ..Default::default()
            };
            f(&mut v);
            v
        };
        let claim = volume(|v| v.claim = Some("ds".into()));
        let scratch = volume(|v| v.empty_dir = Some(serde_yaml_ng::from_str("1Gi").unwrap()));
        let host = volume(|v| v.host_path = Some("/srv/data".into()));
        let same = volume(|v| v.host_path = Some("/data".into()));
        let says = |name: &str, v: &VolumeSpec| {
            let e = super::executor(name).unwrap();
            e.refuses_volume(v)
        };
        let local: Vec<bool> = [&claim, &scratch, &host]
            .map(|v| says("local", v).is_none())
            .into();
        assert_eq!(local, [false, true, true]);
        assert!(says("local", &claim)
            .unwrap()
            .contains("give `host_path: DIR`"));
        let kube: Vec<bool> = [&claim, &scratch, &host]
            .map(|v| says("kubernetes", v).is_none())
            .into();
        assert_eq!(kube, [true, true, false]);
        assert!(says("kubernetes", &host).unwrap().contains("give `claim`"));
        let slurm: Vec<bool> = [&claim, &scratch, &host, &same]
            .map(|v| says("slurm", v).is_none())
            .into();
        assert_eq!(slurm, [false, false, false, true]);
    }
}
