//! Every error a route answers, in one place: [`ApiError`], a status and a message sent as
//! `{"error": …}` ([`super::openapi::ErrorBody`]). The engine's errors say whose fault
//! they are ([`Fault`]); [`ApiError`] maps that to a status once, refined only where a
//! type knows more (a run that does not exist is 404, a refusal of the engine's its own
//! status). Handlers return `Result<_, ApiError>` and use `?`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use drivetrain_engine::access::Decision;
use drivetrain_engine::fault::{Blame, Fault};
use drivetrain_engine::state::StateError;

use super::openapi::ErrorBody;
use crate::access::AuditNote;

/// An error answer: its status, its message for a person, and for a refusal of the
/// caller's the note the audit log keeps.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    note: Option<Box<AuditNote>>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            note: None,
        }
    }

    /// 400: the request does not fit.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: what the request names does not exist (for the caller).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 409: it exists, but is not in a state that allows this.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    /// 503: the server cannot answer now; asking later can work.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: the server's own failure.
    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }

    /// A status the server chose as a number (the server's own refusals,
    /// [`crate::server::refusal_status`]).
    pub fn code(code: u16, message: impl Into<String>) -> ApiError {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError::new(status, message)
    }

    /// `Ok` when `d` allows; else the 403 that says why, its reason (and the project it
    /// was decided in, when one was) kept for the audit log.
    pub fn unless_allowed(d: Decision, project: Option<&str>) -> Result<(), ApiError> {
        match d.allowed {
            true => Ok(()),
            false => Err(ApiError::forbidden(d.reason, project)),
        }
    }

    /// 403 for `reason`, kept for the audit log as a refusal (in `project`, where one).
    pub fn forbidden(reason: String, project: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::FORBIDDEN,
            note: Some(Box::new(AuditNote {
                denied: Some(reason.clone()),
                project: project.map(str::to_owned),
                ..Default::default()
            })),
            message: reason,
        }
    }

    /// An engine error, by whose fault it is ([`status_of`]).
    pub fn blamed(e: &(impl Blame + std::fmt::Display)) -> ApiError {
        ApiError::new(status_of(e.fault()), e.to_string())
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

/// The status of an error by whose fault it is: the request's 400 (a type that knows the
/// request named nothing says 404), the pipeline's 400 (it was posted), a stage's and the
/// infrastructure's 500.
pub fn status_of(fault: Fault) -> StatusCode {
    match fault {
        Fault::Request | Fault::Pipeline => StatusCode::BAD_REQUEST,
        Fault::Stage | Fault::Infrastructure => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        if let Some(note) = self.note {
            response.extensions_mut().insert(*note);
        }
        response
    }
}

/// A run the state store does not know is 404; the rest by fault.
impl From<StateError> for ApiError {
    fn from(e: StateError) -> ApiError {
        match e {
            StateError::UnknownRun(_) => ApiError::not_found(e.to_string()),
            e => ApiError::blamed(&e),
        }
    }
}

/// The engine's refusals, with the statuses the server gives them everywhere.
impl From<drivetrain_engine::engine::Refusal> for ApiError {
    fn from(r: drivetrain_engine::engine::Refusal) -> ApiError {
        ApiError::code(crate::server::refusal_status(&r), r.to_string())
    }
}

/// Lineage of something that does not exist is 404.
impl From<drivetrain_engine::history::LineageError> for ApiError {
    fn from(e: drivetrain_engine::history::LineageError) -> ApiError {
        match e.fault() {
            Fault::Request => ApiError::not_found(e.to_string()),
            _ => ApiError::blamed(&e),
        }
    }
}

/// Work on the blocking pool that panicked.
impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> ApiError {
        ApiError::internal(e)
    }
}

/// The server's own answers: a status and a message.
impl From<(u16, String)> for ApiError {
    fn from((code, message): (u16, String)) -> ApiError {
        ApiError::code(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_fault_and_a_refusal_is_audited() {
        let unknown = StateError::UnknownRun("r1".into());
        assert_eq!(ApiError::from(unknown).status(), StatusCode::NOT_FOUND);
        let busy = drivetrain_engine::engine::Refusal::Busy("still running".into());
        assert_eq!(ApiError::from(busy).status(), StatusCode::CONFLICT);
        assert_eq!(
            status_of(Fault::Infrastructure),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let denied = Decision {
            allowed: false,
            reason: "viewer may not launch".into(),
        };
        let e = ApiError::unless_allowed(denied, Some("alpha")).unwrap_err();
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let note = response.extensions().get::<AuditNote>().expect("noted");
        assert_eq!(note.project.as_deref(), Some("alpha"));
        assert_eq!(note.denied.as_deref(), Some("viewer may not launch"));
    }
}
