//! A stage's secrets on this machine: where the engine reads their values, the stage's
//! environment values (`{name, key, env}`) and its files (`{name, mount_path}`, mounted
//! by the executor), and the mask that keeps every value out of what the engine shows.
//!
//! A key's value is the engine's environment variable `DRIVETRAIN_SECRET_<NAME>_<KEY>`,
//! else the file `HOME/secrets/NAME/KEY` (exact bytes, as a Kubernetes Secret's). A whole
//! secret (`mount_path`) is the directory `HOME/secrets/NAME/`: a file per key. The
//! directory is the engine's, hidden from every stage.

use std::path::{Path, PathBuf};

use crate::executor::SecretFiles;
use crate::plan::Stage;
use crate::spec::ErrorClass;

use super::end::AttemptEnd;

/// The most keys one mounted secret may have, and the most bytes all together
/// (Kubernetes' limit for a Secret).
const MAX_KEYS: usize = 256;
const MAX_BYTES: u64 = 1 << 20;

/// Where this engine keeps the secrets it reads from files: `HOME/secrets`.
pub(super) fn dir(home: &Path) -> PathBuf {
    home.join("secrets")
}

/// The value of key `key` of secret `name`, or why there is none.
fn value(home: &Path, name: &str, key: &str) -> Result<String, String> {
    let var = format!(
        "DRIVETRAIN_SECRET_{}_{}",
        crate::step::env_suffix(name),
        crate::step::env_suffix(key)
    );
    if let Ok(v) = std::env::var(&var) {
        return Ok(v);
    }
    let file = dir(home).join(name).join(key);
    match std::fs::read(&file) {
        Ok(bytes) => String::from_utf8(bytes).map_err(|_| {
            format!("secret `{name}` key `{key}` in {} is not UTF-8 text, which an environment value must be", file.display())
        }),
        Err(_) => Err(format!(
            "secret `{name}` key `{key}` is not set: this engine reads it from `{var}` or the file {}",
            file.display()
        )),
    }
}

/// The stage's secrets exposed as environment values (`env:`), appended to `env`.
pub(super) fn env_values(
    home: &Path,
    stage: &Stage,
    env: &mut Vec<(String, String)>,
) -> Result<(), AttemptEnd> {
    for s in &stage.secrets {
        let (Some(var), Some(key)) = (&s.env, &s.key) else {
            continue;
        };
        env.push((var.clone(), value(home, &s.name, key).map_err(failed)?));
    }
    Ok(())
}

/// The stage's secrets mounted as files (`mount_path`), each key's value read from
/// `HOME/secrets/NAME/`.
pub(super) fn files(home: &Path, stage: &Stage) -> Result<Vec<SecretFiles>, AttemptEnd> {
    stage
        .secrets
        .iter()
        .filter_map(|s| s.mount_path.as_ref().map(|m| (s, m)))
        .map(|(s, mount_path)| {
            Ok(SecretFiles {
                name: s.name.clone(),
                mount_path: PathBuf::from(mount_path),
                files: read_dir(&dir(home).join(&s.name), &s.name).map_err(failed)?,
            })
        })
        .collect()
}

/// Every key of a secret's directory (regular files named as Kubernetes names keys),
/// sorted, within [`MAX_KEYS`] and [`MAX_BYTES`].
fn read_dir(dir: &Path, name: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "secret `{name}` cannot be mounted: this engine reads its keys from the directory {} ({e}); put one file per key there",
            dir.display()
        )
    })?;
    let mut files = Vec::new();
    let mut bytes = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| format!("secret `{name}`: {}: {e}", dir.display()))?;
        let key = entry.file_name().to_string_lossy().into_owned();
        let meta =
            std::fs::metadata(entry.path()).map_err(|e| format!("secret `{name}`: {key}: {e}"))?;
        if !meta.is_file() || !valid_key(&key) {
            continue;
        }
        bytes += meta.len();
        if files.len() == MAX_KEYS || bytes > MAX_BYTES {
            return Err(format!(
                "secret `{name}` in {} is over {MAX_KEYS} keys or {MAX_BYTES} bytes",
                dir.display()
            ));
        }
        let value =
            std::fs::read(entry.path()).map_err(|e| format!("secret `{name}`: {key}: {e}"))?;
        files.push((key, value));
    }
    if files.is_empty() {
        return Err(format!(
            "secret `{name}` has no keys: {} holds no file named like a key",
            dir.display()
        ));
    }
    files.sort();
    Ok(files)
}

/// A key as Kubernetes allows it (`[-._a-zA-Z0-9]+`), and not `.` or `..`.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// What the mask hides: each environment value of a secret, and each file's text, also
/// without its trailing line end (what `echo` put there a stage may print without).
pub(super) fn masked<'a>(
    stage: &'a Stage,
    env: &'a [(String, String)],
    files: &'a [SecretFiles],
) -> impl Iterator<Item = String> + 'a {
    let from_env = env
        .iter()
        .filter(|(k, _)| stage.secrets.iter().any(|s| s.env.as_deref() == Some(k)))
        .map(|(_, v)| v.clone());
    let from_files = files
        .iter()
        .flat_map(|s| s.files.iter())
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .flat_map(|v| {
            let trimmed = v.trim_end_matches(['\n', '\r']).to_owned();
            [v, trimmed]
        });
    from_env.chain(from_files)
}

fn failed(reason: String) -> AttemptEnd {
    AttemptEnd::Failed {
        exit_code: None,
        reason,
        class: ErrorClass::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dt-secrets-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_secrets_directory_gives_its_keys_sorted_and_skips_what_is_not_a_key() {
        let home = home("dir");
        let d = dir(&home).join("creds");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("token"), b"t0k3n\n").unwrap();
        std::fs::write(d.join("ca.pem"), b"PEM").unwrap();
        std::fs::write(d.join("bad name"), b"x").unwrap();
        let files = read_dir(&d, "creds").unwrap();
        assert_eq!(
            files,
            vec![
                ("ca.pem".to_string(), b"PEM".to_vec()),
                ("token".to_string(), b"t0k3n\n".to_vec())
            ]
        );
        let missing = read_dir(&dir(&home).join("none"), "none").unwrap_err();
        assert!(missing.contains("put one file per key there"), "{missing}");
    }

    #[test]
    fn a_key_comes_from_the_environment_first_then_its_file() {
        let home = home("value");
        let d = dir(&home).join("s3-creds-test-only");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("key"), "from-file").unwrap();
        assert_eq!(
            value(&home, "s3-creds-test-only", "key").unwrap(),
            "from-file"
        );
        let err = value(&home, "s3-creds-test-only", "other").unwrap_err();
        assert!(
            err.contains("DRIVETRAIN_SECRET_S3_CREDS_TEST_ONLY_OTHER"),
            "{err}"
        );
    }
}
