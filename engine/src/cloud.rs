//! Cloud object stores: S3 and S3-compatible servers, Google Cloud Storage and Azure Blob
//! Storage, configured the way their own tools are.
//!
//! - S3 (`s3://bucket/prefix`): the standard AWS variables (`AWS_ENDPOINT_URL`,
//!   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//!   `AWS_ALLOW_HTTP`, …), then the shared profile files (`AWS_PROFILE`, default
//!   `default`; `~/.aws/credentials` and `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE`
//!   and `AWS_CONFIG_FILE`), then web identity, ECS and instance metadata credentials.
//!   Conditional writes use `If-None-Match` / `If-Match`; objects and parts carry their
//!   SHA-256 (`AWS_CHECKSUM_ALGORITHM` overrides).
//! - GCS (`gs://bucket/prefix`): `GOOGLE_*` variables and application default credentials.
//! - Azure (`az://container/prefix`, `abfs://…`): `AZURE_*` variables.
//!
//! `DRIVETRAIN_STORE_RETRY_TIMEOUT` (e.g. `30s`) bounds how long a request is retried
//! before the operation fails (default 3 minutes).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreScheme, RetryConfig};

/// Why a cloud store could not be opened: its URL, its settings, or the profile file.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// The URL is not a store object_store knows (its message: object_store does not
    /// export the error's type).
    #[error("{0}")]
    Url(String),
    /// The store's builder refused its settings.
    #[error("{0}")]
    Store(#[from] object_store::Error),
    #[error("unsupported store kind {0}")]
    Unsupported(String),
    #[error("DRIVETRAIN_STORE_RETRY_TIMEOUT `{text}`: {source}")]
    RetryTimeout {
        text: String,
        source: humantime::DurationError,
    },
    #[error("cannot read {}: {source}", path.display())]
    Profile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Installs rustls' ring provider as the process default (reqwest is built without one,
/// so the same crypto serves kube and object_store).
pub fn install_crypto() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The process environment, as the configuration of a store.
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars().collect()
}

/// The prefix of a project's own settings in the environment:
/// `DRIVETRAIN_PROJECT_<NAME>_` (upper case, `-` as `_`).
pub fn project_prefix(project: &str) -> String {
    format!(
        "DRIVETRAIN_PROJECT_{}_",
        project.to_ascii_uppercase().replace('-', "_")
    )
}

/// The configuration a project's store is opened with: the process environment, and
/// every `DRIVETRAIN_PROJECT_<NAME>_<VAR>` as `<VAR>` over it (its own `AWS_ACCESS_KEY_ID`,
/// `AWS_ENDPOINT_URL`, …, where S3 reads them; GCS and Azure read the process's own).
pub fn project_env(project: &str) -> BTreeMap<String, String> {
    let prefix = project_prefix(project);
    let mut vars = process_env();
    let own: Vec<(String, String)> = vars
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v.clone())))
        .collect();
    vars.extend(own);
    vars
}

/// Opens the cloud store a URL names with the configuration in `vars` (normally
/// [`process_env`]; GCS and Azure read the process environment themselves): the store and
/// the key prefix within it.
pub fn open(
    url: &url::Url,
    vars: &BTreeMap<String, String>,
) -> Result<(Arc<dyn ObjectStore>, Path), CloudError> {
    install_crypto();
    let (scheme, prefix) =
        ObjectStoreScheme::parse(url).map_err(|e| CloudError::Url(e.to_string()))?;
    let retry = retry_config(vars)?;
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            Arc::new(s3_builder(url.as_str(), vars)?.with_retry(retry).build()?)
        }
        ObjectStoreScheme::GoogleCloudStorage => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry)
                .build()?,
        ),
        ObjectStoreScheme::MicrosoftAzure => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry)
                .build()?,
        ),
        other => return Err(CloudError::Unsupported(format!("{other:?}"))),
    };
    Ok((store, prefix))
}

fn retry_config(vars: &BTreeMap<String, String>) -> Result<RetryConfig, CloudError> {
    let mut retry = RetryConfig::default();
    if let Some(v) = vars.get("DRIVETRAIN_STORE_RETRY_TIMEOUT") {
        retry.retry_timeout =
            humantime::parse_duration(v).map_err(|source| CloudError::RetryTimeout {
                text: v.clone(),
                source,
            })?;
        retry.backoff.max_backoff = retry
            .backoff
            .max_backoff
            .min(retry.retry_timeout.max(Duration::from_millis(100)));
    }
    Ok(retry)
}

/// An S3 builder for `url` from the `AWS_*` variables in `vars` (as
/// `AmazonS3Builder::from_env` reads them) and, for what they leave unset, the shared AWS
/// profile files.
pub fn s3_builder(
    url: &str,
    vars: &BTreeMap<String, String>,
) -> Result<AmazonS3Builder, CloudError> {
    install_crypto();
    let mut b = AmazonS3Builder::new();
    for (k, v) in vars {
        if k.starts_with("AWS_") {
            if let Ok(key) = k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                b = b.with_config(key, v);
            }
        }
    }
    let env = |k: &str| vars.get(k).is_some_and(|v| !v.is_empty());
    let profile = Profile::load(vars)?;
    if !env("AWS_ACCESS_KEY_ID") {
        if let (Some(id), Some(secret)) = (
            profile.get("aws_access_key_id"),
            profile.get("aws_secret_access_key"),
        ) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(token) = profile.get("aws_session_token") {
                b = b.with_token(token);
            }
        }
    }
    // Every object and part carries its SHA-256 (the digest signing computes anyway), so
    // the server verifies what it stored; S3 keeps a composite checksum of multipart
    // objects instead of recomputing one over the whole object.
    if !env("AWS_CHECKSUM_ALGORITHM") {
        b = b.with_checksum_algorithm(object_store::aws::Checksum::SHA256);
    }
    if !env("AWS_REGION") && !env("AWS_DEFAULT_REGION") {
        if let Some(region) = profile.get("region") {
            b = b.with_region(region);
        }
    }
    if !env("AWS_ENDPOINT_URL") && !env("AWS_ENDPOINT") && !env("AWS_ENDPOINT_URL_S3") {
        if let Some(endpoint) = profile.get("endpoint_url") {
            if endpoint.starts_with("http://") {
                b = b.with_allow_http(true);
            }
            b = b.with_config(AmazonS3ConfigKey::Endpoint, endpoint);
        }
    }
    Ok(b.with_url(url))
}

/// The settings of one profile of the shared AWS files: the credentials file's section
/// over the config file's.
#[derive(Debug, Default)]
struct Profile(BTreeMap<String, String>);

impl Profile {
    fn load(vars: &BTreeMap<String, String>) -> Result<Profile, CloudError> {
        let name = vars
            .get("AWS_PROFILE")
            .or(vars.get("AWS_DEFAULT_PROFILE"))
            .cloned()
            .unwrap_or_else(|| "default".into());
        let home = vars.get("HOME").map(PathBuf::from);
        let file = |var: &str, rel: &str| {
            vars.get(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(rel)))
        };
        let mut out = BTreeMap::new();
        // In the config file a profile's section is `[profile NAME]`, except `[default]`.
        if let Some(path) = file("AWS_CONFIG_FILE", ".aws/config") {
            let section = if name == "default" {
                "default".to_owned()
            } else {
                format!("profile {name}")
            };
            out.extend(read_section(&path, &section)?);
        }
        if let Some(path) = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials") {
            out.extend(read_section(&path, &name)?);
        }
        Ok(Profile(out))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// The `key = value` pairs of one `[section]` of an INI file; a missing file has none.
fn read_section(
    path: &std::path::Path,
    section: &str,
) -> Result<BTreeMap<String, String>, CloudError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(CloudError::Profile {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_sections_are_read() {
        let dir = std::env::temp_dir().join(format!("dt-aws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("credentials");
        std::fs::write(
            &path,
            "# comment\n[default]\naws_access_key_id = A\n\n[profile fleet]\nregion=eu-west-1\nendpoint_url = http://127.0.0.1:9\n[other]\nregion = x\n",
        )
        .unwrap();
        let d = read_section(&path, "default").unwrap();
        assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("A"));
        let f = read_section(&path, "profile fleet").unwrap();
        assert_eq!(f.get("region").map(String::as_str), Some("eu-west-1"));
        assert_eq!(
            f.get("endpoint_url").map(String::as_str),
            Some("http://127.0.0.1:9")
        );
        assert!(read_section(&dir.join("missing"), "default")
            .unwrap()
            .is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
