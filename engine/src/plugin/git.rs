//! Plugins from git: a mirror of each repository and one exported tree per commit, both
//! in the home (`plugins/git/`), through the `git` command. Only `drivetrain plugins
//! fetch`, `plugins lock` and `run` reach a network; validation reads what is here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::PluginError;

/// The schemes a plugin's repository may have (never `ext::` or a helper's).
const SCHEMES: &[&str] = &["https://", "http://", "ssh://", "file://"];

/// A `git+URL//PATH@REV` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRef {
    pub url: String,
    /// The step's folder in the repository (empty: its root).
    pub sub: String,
    pub rev: String,
}

impl GitRef {
    /// Parses what follows `git+`.
    pub fn parse(rest: &str) -> Result<GitRef, PluginError> {
        let bad = PluginError::Plugin;
        let form = "write `git+https://host/org/repo//path/to/step@COMMIT`";
        let Some((loc, rev)) = rest.rsplit_once('@') else {
            return Err(bad(format!(
                "a git plugin names its commit, tag or branch after `@`: {form}"
            )));
        };
        let Some(scheme) = SCHEMES.iter().find(|s| loc.starts_with(**s)) else {
            return Err(bad(format!(
                "a git plugin's repository is reached over {}: {form}",
                SCHEMES.join(", ")
            )));
        };
        let after = scheme.len();
        let (url, sub) = match loc[after..].find("//") {
            Some(i) => (&loc[..after + i], &loc[after + i + 2..]),
            None => (loc, ""),
        };
        let bad_rev = rev.is_empty()
            || rev.starts_with('-')
            || rev
                .chars()
                .any(|c| c.is_whitespace() || c == ':' || c == '^' || c == '~');
        if bad_rev {
            return Err(bad(format!(
                "`{rev}` is not a commit, tag or branch: {form}"
            )));
        }
        if super::file::leaves(sub) || sub.starts_with('/') {
            return Err(bad(format!(
                "the step's folder `{sub}` leaves the repository"
            )));
        }
        Ok(GitRef {
            url: url.to_owned(),
            sub: sub.trim_end_matches('/').to_owned(),
            rev: rev.to_owned(),
        })
    }

    /// Whether the reference is a full commit (pinned without a lock file).
    pub fn is_commit(&self) -> bool {
        is_commit(&self.rev)
    }
}

/// Whether `rev` is a full SHA-1 or SHA-256 commit id.
pub fn is_commit(rev: &str) -> bool {
    (rev.len() == 40 || rev.len() == 64) && rev.chars().all(|c| c.is_ascii_hexdigit())
}

/// The folder of one repository's mirror and exported commits.
fn repo_dir(home: &Path, url: &str) -> PathBuf {
    let digest = crate::cache::digest(url.as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    home.join("plugins").join("git").join(&hex[..16])
}

fn git(args: &[&str], dir: Option<&Path>) -> Result<String, PluginError> {
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    let out = cmd
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| PluginError::Host(format!("cannot run git: {e}")))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(PluginError::Host(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )),
    }
}

/// The mirror of `url`, cloned if absent and fetched again when `update`.
fn mirror(home: &Path, url: &str, update: bool) -> Result<PathBuf, PluginError> {
    // A home is closed to others (see `engine::home`); one made here is made so too.
    if !home.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(home)
            .map_err(|e| PluginError::io(home, e))?;
    }
    let dir = repo_dir(home, url).join("repo.git");
    if !dir.exists() {
        let parent = dir.parent().expect("under the home");
        std::fs::create_dir_all(parent).map_err(|e| PluginError::io(parent, e))?;
        let tmp = parent.join(format!(".repo.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let tmp_s = tmp.display().to_string();
        git(&["clone", "--mirror", "--quiet", "--", url, &tmp_s], None)
            .map_err(|e| PluginError::Host(format!("cannot clone {url}: {e}")))?;
        std::fs::rename(&tmp, &dir).map_err(|e| PluginError::io(&dir, e))?;
    } else if update {
        git(&["fetch", "--quiet", "--prune", "origin"], Some(&dir))
            .map_err(|e| PluginError::Host(format!("cannot fetch {url}: {e}")))?;
    }
    Ok(dir)
}

/// The commit `rev` names in the mirror.
fn rev_parse(mirror: &Path, rev: &str) -> Option<String> {
    git(
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &format!("{rev}^{{commit}}"),
        ],
        Some(mirror),
    )
    .ok()
    .filter(|c| is_commit(c))
}

/// The commit a tag or branch names now, after fetching the repository.
pub fn resolve_rev(home: &Path, r: &GitRef) -> Result<String, PluginError> {
    let m = mirror(home, &r.url, true)?;
    rev_parse(&m, &r.rev).ok_or_else(|| {
        PluginError::Plugin(format!(
            "{} has no commit, tag or branch `{}`",
            r.url, r.rev
        ))
    })
}

/// The folder of `commit`'s tree, exported from the mirror (fetched first where `fetch`
/// allows and the commit is missing); [`PluginError::NotFetched`] when it is not here and
/// may not be fetched.
pub fn checkout(home: &Path, url: &str, commit: &str, fetch: bool) -> Result<PathBuf, PluginError> {
    let dest = repo_dir(home, url).join(commit);
    if dest.is_dir() {
        return Ok(dest);
    }
    if !fetch {
        return Err(PluginError::NotFetched);
    }
    let mut m = mirror(home, url, false)?;
    if rev_parse(&m, commit).is_none() {
        m = mirror(home, url, true)?;
    }
    if rev_parse(&m, commit).as_deref() != Some(commit) {
        return Err(PluginError::Plugin(format!("{url} has no commit {commit}")));
    }
    let parent = dest.parent().expect("under the home");
    let tmp = parent.join(format!(".{commit}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| PluginError::io(&tmp, e))?;
    let tar = parent.join(format!(".{commit}.{}.tar", std::process::id()));
    let tar_s = tar.display().to_string();
    git(&["archive", "--format=tar", "-o", &tar_s, commit], Some(&m))?;
    let out = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&tmp)
        .arg("--no-same-owner")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| PluginError::Host(format!("cannot run tar: {e}")))?;
    let _ = std::fs::remove_file(&tar);
    if !out.status.success() {
        return Err(PluginError::Host(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    match std::fs::rename(&tmp, &dest) {
        Ok(()) => Ok(dest),
        // Another engine exported it meanwhile: the same commit, the same tree.
        Err(_) if dest.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dest)
        }
        Err(e) => Err(PluginError::io(&dest, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_refuse() {
        let r = GitRef::parse("https://example.com/org/repo//plugins/greet@v1.2").unwrap();
        assert_eq!(r.url, "https://example.com/org/repo");
        assert_eq!(r.sub, "plugins/greet");
        assert_eq!(r.rev, "v1.2");
        assert!(!r.is_commit());
        let r = GitRef::parse(&format!("file:///tmp/repo@{}", "a".repeat(40))).unwrap();
        assert_eq!((r.url.as_str(), r.sub.as_str()), ("file:///tmp/repo", ""));
        assert!(r.is_commit());
        let r = GitRef::parse("ssh://git@host/org/repo//s@main").unwrap();
        assert_eq!(r.url, "ssh://git@host/org/repo");
        assert!(GitRef::parse("ext::sh -c touch% /tmp/x@main").is_err());
        assert!(GitRef::parse("https://h/r//../x@main").is_err());
        assert!(GitRef::parse("https://h/r//x").is_err());
        assert!(GitRef::parse("https://h/r//x@--upload-pack=x").is_err());
    }
}
