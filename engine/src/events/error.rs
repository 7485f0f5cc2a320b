//! Why a trigger or a notification could not do its work: [`EventError`], which says
//! whose fault it is ([`Blame`]) so that the server and the CLI answer and retry by kind,
//! never by reading a message.

use crate::fault::{Blame, Fault};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// What the pipeline or the engine's environment names does not fit: a source or
    /// queue URL, credentials or a secret that is not set, a sink that cannot be read.
    /// Asking again changes nothing until the setting does.
    #[error("{0}")]
    Setting(String),
    /// The store, queue or receiver failed or refused: trying again later can work.
    #[error("{0}")]
    Remote(String),
    /// A message that is not what it should be (a queue's body that is not an S3 event).
    #[error("{0}")]
    Message(String),
}

impl Blame for EventError {
    fn fault(&self) -> Fault {
        match self {
            EventError::Setting(_) => Fault::Pipeline,
            EventError::Remote(_) => Fault::Infrastructure,
            EventError::Message(_) => Fault::Request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_says_whose_fault_it_is() {
        let bad_url = crate::events::discover::Source::open("no scheme here").err();
        assert!(
            matches!(bad_url, Some(EventError::Setting(_))),
            "{bad_url:?}"
        );
        let body = crate::events::sqs::announced("{\"Records\": 3}").unwrap_err();
        assert!(matches!(body, EventError::Message(_)), "{body:?}");
        assert_eq!(body.fault(), Fault::Request);
        let unset = crate::events::Secret::Env("DT_TEST_NO_SUCH_SECRET_VAR".into()).read();
        assert_eq!(unset.unwrap_err().fault(), Fault::Pipeline);
        assert_eq!(
            EventError::Remote("503".into()).fault(),
            Fault::Infrastructure
        );
    }
}
