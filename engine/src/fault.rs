//! Whose fault an error is: what the one who meets it can do about it, and so what a
//! command exits with and what status the API answers with.
//!
//! Each error type of the engine says it through [`Blame`]; a variant that wraps another
//! error asks that one. A command that stops on an error exits with
//! [`Fault::exit_code`]; the API answers with the status the server's one `ApiError`
//! maps it to (`server/src/api/error.rs`).

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request: a run, stage or artifact that does not exist, a setting or argument
    /// that does not fit. Asking again the same way gets the same answer.
    Request,
    /// The pipeline as written: a reference that names nothing.
    Pipeline,
    /// A stage's own work: outputs it cannot publish (a symlink, a name that would leave
    /// its prefix).
    Stage,
    /// What the engine depends on: the state store, the artifact store, the machine.
    /// Trying again later can succeed.
    Infrastructure,
}

impl Fault {
    /// The exit status of a command that stops on it: 2 (usage) for the request's fault,
    /// 1 for every other, as the README's exit statuses say.
    pub fn exit_code(self) -> u8 {
        match self {
            Fault::Request => 2,
            Fault::Pipeline | Fault::Stage | Fault::Infrastructure => 1,
        }
    }
}

/// An error that says whose fault it is.
pub trait Blame {
    fn fault(&self) -> Fault;
}

impl Blame for crate::state::StateError {
    fn fault(&self) -> Fault {
        use crate::state::StateError::*;
        match self {
            UnknownRun(_) | AttemptEnded { .. } => Fault::Request,
            Sqlite { .. } | Database { .. } => Fault::Infrastructure,
        }
    }
}

impl Blame for crate::state::sources::SourceError {
    fn fault(&self) -> Fault {
        use crate::state::sources::SourceError::*;
        match self {
            Lost(_) => Fault::Pipeline,
            State(e) => e.fault(),
        }
    }
}

impl Blame for crate::history::LineageError {
    fn fault(&self) -> Fault {
        use crate::history::LineageError::*;
        match self {
            NotFound(_) => Fault::Request,
            State(e) => e.fault(),
        }
    }
}

impl Blame for crate::history::GcError {
    fn fault(&self) -> Fault {
        use crate::history::GcError::*;
        match self {
            State(e) => e.fault(),
            Store(e) => e.fault(),
        }
    }
}

impl Blame for crate::artifacts::ArtifactError {
    fn fault(&self) -> Fault {
        use crate::artifacts::ArtifactError::*;
        match self {
            Open { .. } => Fault::Request,
            InvalidKey { .. } | Symlink { .. } => Fault::Stage,
            Store { .. } | Modified { .. } | Io { .. } => Fault::Infrastructure,
        }
    }
}

impl Blame for crate::cloud::CloudError {
    fn fault(&self) -> Fault {
        use crate::cloud::CloudError::*;
        match self {
            // `Store`: the builder refused the settings it was given.
            Url(_) | Unsupported(_) | RetryTimeout { .. } | Profile { .. } | Store(_) => {
                Fault::Request
            }
        }
    }
}

impl Blame for crate::template::RefError {
    fn fault(&self) -> Fault {
        Fault::Pipeline
    }
}

impl Blame for crate::runner::RunError {
    fn fault(&self) -> Fault {
        match self {
            crate::runner::RunError::State(e) => e.fault(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::LineageError;
    use crate::state::StateError;

    #[test]
    fn a_missing_name_is_the_request_s_fault_and_a_broken_store_is_not() {
        let missing = StateError::UnknownRun("r1".into());
        assert_eq!(missing.fault(), Fault::Request);
        assert_eq!(LineageError::State(missing).fault(), Fault::Request);
        assert_eq!(LineageError::NotFound("x".into()).fault().exit_code(), 2);
        let broken = StateError::Sqlite {
            what: "read runs".into(),
            source: rusqlite::Error::InvalidQuery,
        };
        assert_eq!(broken.fault(), Fault::Infrastructure);
        assert_eq!(LineageError::State(broken).fault().exit_code(), 1);
        let symlink = crate::artifacts::ArtifactError::Symlink {
            output: "o".into(),
            path: "p".into(),
        };
        assert_eq!(symlink.fault(), Fault::Stage);
    }
}
