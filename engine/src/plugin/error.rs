//! What can go wrong with a plugin's files and repositories, typed where it leaves a
//! function of this module: whose fault it is comes from the variant, never from reading
//! the message (the resolver used to compare a message with "not fetched").

use crate::fault::{Blame, Fault};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// What the pipeline, the step's folder or the lock file holds does not fit: a
    /// reference that does not parse or names no commit, a link out of the folder, too
    /// many files, a lock file of another version, a folder changed since validation.
    /// The pipeline's author fixes it; asking again changes nothing.
    #[error("{0}")]
    Plugin(String),
    /// A git commit that is not in the home, and this command may not fetch it.
    #[error("not fetched")]
    NotFetched,
    /// `git`, `tar` or the file system failed: the network, the repository's host, the
    /// home's disk. Trying again can work.
    #[error("{0}")]
    Host(String),
}

impl PluginError {
    /// A failure of the file system at `path`.
    pub(crate) fn io(path: &std::path::Path, e: std::io::Error) -> PluginError {
        PluginError::Host(format!("{}: {e}", path.display()))
    }
}

impl Blame for PluginError {
    fn fault(&self) -> Fault {
        match self {
            PluginError::Plugin(_) => Fault::Pipeline,
            PluginError::NotFetched => Fault::Request,
            PluginError::Host(_) => Fault::Infrastructure,
        }
    }
}

impl From<PluginError> for super::Refusal {
    fn from(e: PluginError) -> Self {
        super::Refusal::from(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::{digest, git, lock};

    #[test]
    fn each_failure_says_whose_fault_it_is() {
        let dir = std::env::temp_dir().join(format!("dt-plugin-error-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("step")).unwrap();
        // What the pipeline or the step's folder holds: the author's to fix.
        let bad = git::GitRef::parse("https://h/r//x").unwrap_err();
        assert_eq!(bad.fault(), Fault::Pipeline, "{bad}");
        std::os::unix::fs::symlink("/etc/hostname", dir.join("step/out")).unwrap();
        let out = digest(&dir.join("step")).unwrap_err();
        assert!(matches!(out, PluginError::Plugin(_)), "{out:?}");
        std::fs::write(dir.join(lock::FILE), "{\"version\": 2, \"plugins\": {}}").unwrap();
        let lock = lock::read(&dir).unwrap_err();
        assert!(lock.to_string().contains("version 2"), "{lock}");
        assert_eq!(lock.fault(), Fault::Pipeline);
        // A commit not here, and no fetching: said as such, not as a message to match.
        let home = dir.join("home");
        let commit = "a".repeat(40);
        let missing = git::checkout(&home, "file:///nowhere", &commit, false).unwrap_err();
        assert_eq!(missing, PluginError::NotFetched);
        // The host's: a folder that cannot be read, a repository that cannot be reached.
        let gone = digest(&dir.join("no-such-step")).unwrap_err();
        assert_eq!(gone.fault(), Fault::Infrastructure, "{gone}");
        let unreachable = git::checkout(&home, "file:///nowhere", &commit, true).unwrap_err();
        assert_eq!(unreachable.fault(), Fault::Infrastructure, "{unreachable}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
