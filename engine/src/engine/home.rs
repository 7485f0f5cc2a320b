//! An engine's home, `.drivetrain/`: the state store (`state.db`, or `DRIVETRAIN_STATE`'s
//! PostgreSQL), the default artifact store (`artifacts/`), attempts' working directories
//! (`work/`) and the reserve that lets a run's end be recorded on a full disk. [`Home`]
//! opens them in one place for every face (the CLI, `serve`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::artifacts::ArtifactStore;
use crate::state::{SqliteState, StateError, StateStore};

/// An engine's home directory and what lives in it.
#[derive(Debug, Clone)]
pub struct Home {
    dir: PathBuf,
}

/// What stops a home from opening.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{0}")]
    Store(String),
}

impl Home {
    /// The home at `dir`, made if missing, closed to other users: mode 0700 (no other
    /// user, nor a stage of another home, host `nobody` under a root engine, can enter
    /// it; this home's own stages see what they need of it through the mounts the engine
    /// makes as root) with `work/` 0711 inside, and the state database 0600. An existing
    /// home that others may enter is said once, with the fix.
    pub fn at(dir: &Path) -> Result<Home, HomeError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let private = |d: &Path, mode: u32| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(d)
                .map_err(|e| HomeError::Io(format!("cannot make {}: {e}", d.display())))
        };
        private(dir, 0o700)?;
        // Searchable inside the closed home, so the way to an attempt's directory is the
        // same for every attempt (a prepared sandbox serves them all).
        private(&dir.join("work"), 0o711)?;
        let dir = std::fs::canonicalize(dir)
            .map_err(|e| HomeError::Io(format!("{}: {e}", dir.display())))?;
        let home = Home { dir };
        if let Some(mode) = home.open_to_others() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "{} is open to other users (mode {mode:o}): a stage of another home on this machine can list it and read its runs; `chmod 700 {}` closes it",
                    home.dir.display(),
                    home.dir.display()
                )
            });
        }
        Ok(home)
    }

    /// The home's mode where other users may enter it (`None`: closed).
    pub fn open_to_others(&self) -> Option<u32> {
        open_to_others(&self.dir)
    }

    /// The home whose work directory is `work_dir` (as it is, not made).
    pub fn around(work_dir: &Path) -> Home {
        Home {
            dir: work_dir.parent().unwrap_or(work_dir).to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where attempts get their working directories.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// The state store: `DRIVETRAIN_STATE` (`postgres://user@host:port/db`, shared by
    /// replicas) if set, else `state.db` (SQLite) in the home.
    pub fn open_state(&self) -> Result<Arc<dyn StateStore>, HomeError> {
        match std::env::var("DRIVETRAIN_STATE") {
            Ok(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                postgres(&url)
            }
            Ok(url) if !url.is_empty() => Err(HomeError::Store(format!(
                "DRIVETRAIN_STATE `{url}`: expected a postgres:// URL (unset it for SQLite in the home)"
            ))),
            _ => {
                let path = self.dir.join("state.db");
                let state = SqliteState::open(&path)?;
                private_files(&path);
                Ok(Arc::new(state))
            }
        }
    }

    /// The artifact store's URL: `DRIVETRAIN_STORE`, else the pipeline's `store:`, else
    /// `artifacts/` in the home.
    pub fn store_url(&self, pipeline_store: Option<&str>) -> Result<String, HomeError> {
        if let Some(s) = std::env::var("DRIVETRAIN_STORE")
            .ok()
            .or(pipeline_store.map(str::to_owned))
        {
            return Ok(s);
        }
        let dir = self.dir.join("artifacts");
        std::fs::create_dir_all(&dir)
            .map_err(|e| HomeError::Io(format!("cannot make {}: {e}", dir.display())))?;
        Ok(format!("file://{}", dir.display()))
    }

    /// The artifact store of a run of `project` whose pipeline says `pipeline_store`.
    pub fn run_store(
        &self,
        pipeline_store: Option<&str>,
        project: &str,
    ) -> Result<ArtifactStore, HomeError> {
        let url = crate::artifacts::project_url(&self.store_url(pipeline_store)?, project);
        ArtifactStore::open_project(&url, project).map_err(|e| HomeError::Store(e.to_string()))
    }

    /// Makes the reserve if it is missing.
    pub fn keep_reserve(&self) {
        keep_reserve(&self.work_dir());
    }
}

#[cfg(feature = "postgres")]
fn postgres(url: &str) -> Result<Arc<dyn StateStore>, HomeError> {
    Ok(Arc::new(crate::state::PostgresState::open(url)?))
}

#[cfg(not(feature = "postgres"))]
fn postgres(url: &str) -> Result<Arc<dyn StateStore>, HomeError> {
    Err(HomeError::Store(format!(
        "DRIVETRAIN_STATE `{url}`: this build has no PostgreSQL state store"
    )))
}

/// The mode of the home at `dir` where other users may enter, list or write in it
/// (`None`: closed, or not there).
pub fn open_to_others(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// The state database and its journal files readable by their owner alone (SQLite makes
/// them with the umask's mode).
fn private_files(db: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = PathBuf::from(name);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.permissions().mode() & 0o077 != 0 {
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        }
    }
}

/// The digest a run records of its pipeline file's text.
pub fn digest(source: &str) -> String {
    crate::state::sources::digest(source)
}

/// Space kept free beside the home's state for an engine to record the end of its run
/// when the disk fills: a file this size, given up when the engine fails.
const RESERVE: u64 = 4 << 20;

fn reserve_path(work_dir: &Path) -> PathBuf {
    work_dir.with_file_name("reserve")
}

/// Makes the reserve beside `work_dir` if it is missing (allocated, not sparse); where
/// there is no room for it, there is none.
pub fn keep_reserve(work_dir: &Path) {
    let path = reserve_path(work_dir);
    if path.exists() {
        return;
    }
    let made = std::fs::File::create(&path).and_then(|f| {
        nix::fcntl::posix_fallocate(&f, 0, RESERVE as i64).map_err(std::io::Error::from)
    });
    if made.is_err() {
        let _ = std::fs::remove_file(&path);
    }
}

/// Frees the reserve, so that the end of a run can still be written.
pub(super) fn give_up_reserve(work_dir: &Path) {
    let _ = std::fs::remove_file(reserve_path(work_dir));
}

/// The log an attempt writes while it runs, under the engine's work directory (the run
/// loop publishes it to the store when the attempt ends).
pub fn live_log(work: &Path, run: &str, stage: &str, attempt: u32) -> std::path::PathBuf {
    crate::artifacts::AttemptKey::from_stage_key(run, stage, attempt)
        .work_dir(work)
        .join("log.txt")
}
