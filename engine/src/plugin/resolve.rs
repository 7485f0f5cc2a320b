//! From a `uses:` to a plugin's folder: a path beside the pipeline, `NAME@VERSION` in
//! the plugin folders, or a git commit (named, or locked for a tag or branch).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::git::{self, GitRef};
use super::lock::{self, Entry, Lock};
use super::{load, Origin, Plugin, PluginError, Refusal, Resolved, STEP_FILE};

/// Resolves the plugins of one pipeline, each `uses:` once.
#[derive(Debug)]
pub struct Resolver {
    origin: Origin,
    lock: Option<Result<Option<Lock>, PluginError>>,
    seen: Resolved,
    /// Writing the lock file: a tag or branch resolves to what it names now.
    relock: bool,
}

impl Resolver {
    pub fn new(origin: Origin) -> Resolver {
        Resolver {
            origin,
            lock: None,
            seen: Resolved::new(),
            relock: false,
        }
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The plugin `uses` names, or why none.
    pub fn resolve(&mut self, uses: &str) -> Result<Arc<Plugin>, Refusal> {
        if let Some(found) = self.seen.get(uses) {
            return found.clone();
        }
        let found = self.find(uses).map(Arc::new);
        self.seen.insert(uses.to_owned(), found.clone());
        found
    }

    fn lock(&mut self) -> Result<Option<&Lock>, PluginError> {
        let dir = self.origin.dir.clone();
        let read = self
            .lock
            .get_or_insert_with(|| dir.as_deref().map(lock::read).unwrap_or(Ok(None)));
        read.as_ref().map(Option::as_ref).map_err(Clone::clone)
    }

    fn entry(&mut self, uses: &str) -> Result<Option<Entry>, PluginError> {
        Ok(self.lock()?.and_then(|l| l.plugins.get(uses).cloned()))
    }

    fn find(&mut self, uses: &str) -> Result<Plugin, Refusal> {
        let plugin = match uses.strip_prefix("git+") {
            Some(rest) => self.by_git(uses, GitRef::parse(rest)?)?,
            None => match uses.split_once('@') {
                Some((name, version)) if !uses.starts_with(['.', '/']) => {
                    self.by_name(uses, name, version)?
                }
                _ => load(&self.by_path(uses)?, uses, None)?,
            },
        };
        self.against_lock(uses, &plugin)?;
        Ok(plugin)
    }

    /// `./plugins/greet`: relative to the pipeline's folder (or absolute).
    fn by_path(&self, uses: &str) -> Result<PathBuf, String> {
        let p = Path::new(uses);
        let dir = match (&self.origin.dir, p.is_absolute()) {
            (_, true) => p.to_path_buf(),
            (Some(d), false) => d.join(p),
            (None, false) => {
                return Err(format!(
                    "`uses: {uses}` is relative to the pipeline file's folder, and a pipeline posted to a server has none: use `NAME@VERSION` through {}",
                    super::PATH_VAR
                ))
            }
        };
        // `uses: ./plugins/greet/step.yaml` names the same plugin.
        Ok(match dir.file_name().is_some_and(|f| f == STEP_FILE) {
            true => dir.parent().map(Path::to_path_buf).unwrap_or(dir),
            false => dir,
        })
    }

    /// `greet@1.0.0`: the first folder of [`Origin::folders`] holding a plugin of that
    /// name and version.
    fn by_name(&self, uses: &str, name: &str, version: &str) -> Result<Plugin, Refusal> {
        let folders = self.origin.folders();
        let mut other_versions = Vec::new();
        for (dir, checked) in super::discover(&folders) {
            let step = &checked.spec;
            if step.name == name && step.version == version {
                return load(&dir, uses, None);
            }
            if step.name == name {
                other_versions.push(format!("{} in {}", step.version, dir.display()));
            }
        }
        let looked: Vec<String> = folders.iter().map(|f| f.display().to_string()).collect();
        let mut notes = vec![match looked.is_empty() {
            true => format!("no plugin folder to look in: put it in `plugins/` beside the pipeline, or name folders in {}", super::PATH_VAR),
            false => format!("looked in {}", looked.join(", ")),
        }];
        if !other_versions.is_empty() {
            notes.push(format!(
                "`{name}` is there as {}",
                other_versions.join("; ")
            ));
        }
        Err(Refusal {
            message: format!("no plugin `{name}` of version {version}"),
            notes,
        })
    }

    /// A git plugin: its commit (named, or the lock's for a tag or branch), exported.
    fn by_git(&mut self, uses: &str, r: GitRef) -> Result<Plugin, Refusal> {
        let Some(home) = self.origin.home.clone() else {
            return Err("git plugins are kept in a home; this command has none"
                .to_owned()
                .into());
        };
        let commit = match (r.is_commit(), self.relock) {
            (true, _) => r.rev.clone(),
            // Locking anew: what the tag or branch names now.
            (false, true) => git::resolve_rev(&home, &r)?,
            (false, false) => self.locked_commit(uses, &r, &home)?,
        };
        let dir = git::checkout(&home, &r.url, &commit, self.origin.fetch).map_err(|e| match e {
            PluginError::NotFetched => format!(
                "`{uses}` is not fetched yet: run `drivetrain plugins fetch` with this pipeline (validation reads no network)"
            ),
            other => other.to_string(),
        })?;
        load(&inside(&dir, &r.sub)?, uses, Some(commit))
    }

    /// The commit the lock file holds for a tag or branch; under `--locked`, refused
    /// when the tag or branch names another commit now.
    fn locked_commit(
        &mut self,
        uses: &str,
        r: &GitRef,
        home: &Path,
    ) -> Result<String, PluginError> {
        let Some(commit) = self.entry(uses)?.and_then(|e| e.commit) else {
            return Err(PluginError::Plugin(format!(
                "`{}` is a tag or branch, which can move: write the full commit, or pin it in {} with `drivetrain plugins lock`",
                r.rev,
                lock::FILE
            )));
        };
        if self.origin.locked {
            let now = git::resolve_rev(home, r)?;
            if now != commit {
                return Err(PluginError::Plugin(format!(
                    "`{}` moved: {} has {commit}, {} now names {now}; review the change and run `drivetrain plugins lock`",
                    r.rev,
                    lock::FILE,
                    r.url
                )));
            }
        }
        Ok(commit)
    }

    /// The lock file's word on a plugin found: under `--locked` it has an entry, and an
    /// entry's digest is the plugin's (always for git: a commit's files never change).
    fn against_lock(&mut self, uses: &str, plugin: &Plugin) -> Result<(), PluginError> {
        let entry = self.entry(uses)?;
        let git = uses.starts_with("git+");
        match entry {
            None if self.origin.locked => Err(PluginError::Plugin(format!(
                "`--locked`, and {} has no entry for `{uses}`: run `drivetrain plugins lock`",
                lock::FILE
            ))),
            Some(e) if e.digest != plugin.id.digest && (git || self.origin.locked) => {
                Err(PluginError::Plugin(format!(
                    "`{uses}` has digest {} here, and {} says {}: the plugin changed since it was locked",
                    plugin.id.digest,
                    lock::FILE,
                    e.digest
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The lock file's entries for `uses` (every plugin a pipeline names), resolved now: a
/// tag or branch to the commit it names after fetching.
pub fn locked_entries(uses: &[String], origin: &Origin) -> Result<Lock, Refusal> {
    let mut resolver = Resolver::new(Origin {
        fetch: true,
        locked: false,
        ..origin.clone()
    });
    // Neither read nor held to: it is what is being written.
    resolver.lock = Some(Ok(None));
    resolver.relock = true;
    let mut lock = Lock {
        version: 1,
        ..Lock::default()
    };
    for u in uses {
        let plugin = resolver.find(u)?;
        lock.plugins.insert(
            u.clone(),
            Entry {
                name: plugin.id.name.clone(),
                version: plugin.id.version.clone(),
                digest: plugin.id.digest.clone(),
                commit: plugin.id.commit.clone(),
            },
        );
    }
    Ok(lock)
}

/// The step's folder `sub` of a repository's tree `checkout`, refused when a link in the
/// repository leads it out of the tree.
fn inside(checkout: &Path, sub: &str) -> Result<PathBuf, PluginError> {
    let dir = checkout.join(sub);
    let (root, real) = (std::fs::canonicalize(checkout), std::fs::canonicalize(&dir));
    match (root, real) {
        (Ok(root), Ok(real)) if real.starts_with(&root) => Ok(dir),
        (Ok(_), Ok(real)) => Err(PluginError::Plugin(format!(
            "`{sub}` leads out of the repository (to {}): a git plugin's folder is the repository's own",
            real.display()
        ))),
        (_, Err(e)) => Err(PluginError::Plugin(format!(
            "the repository has no `{sub}`: {e}"
        ))),
        (Err(e), _) => Err(PluginError::io(checkout, e)),
    }
}
