//! The API of triggers and notifications: what `drivetrain trigger` and `drivetrain
//! notifications` read and change, for the web view and other clients.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::openapi::{NotificationList, TriggerList, TriggerPause, TriggerStatus};
use super::{error, internal, Params, Shared};

/// `GET /api/v1/triggers`.
pub async fn triggers(State(s): State<Shared>) -> Response {
    match s.engine.state().triggers() {
        Ok(all) => Json(TriggerList {
            triggers: all
                .into_iter()
                .map(|t| TriggerStatus {
                    lag_seconds: t.lag_seconds(),
                    trigger: t,
                })
                .collect(),
        })
        .into_response(),
        Err(e) => internal(e),
    }
}

/// The trigger a path names, or the 404 to answer.
fn known(
    s: &Shared,
    pipeline: &str,
    trigger: &str,
) -> Result<drivetrain_engine::state::TriggerRecord, Box<Response>> {
    match crate::triggers::find(s.engine.state().as_ref(), &format!("{pipeline}/{trigger}")) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(why)) => Err(Box::new(error(StatusCode::NOT_FOUND, why))),
        Err(e) => Err(Box::new(internal(e))),
    }
}

/// `POST /api/v1/triggers/{pipeline}/{trigger}/pause`.
pub async fn pause(
    State(s): State<Shared>,
    Path((pipeline, trigger)): Path<(String, String)>,
) -> Response {
    let t = match known(&s, &pipeline, &trigger) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    match s
        .engine
        .state()
        .set_trigger_paused(&t.pipeline, &t.trigger, true, false)
    {
        Ok(_) => Json(TriggerPause {
            pipeline,
            trigger,
            paused: true,
            skipped: 0,
        })
        .into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
pub struct ResumeQuery {
    /// `replay` or `skip`: what becomes of the objects queued while paused.
    queued: Option<String>,
}

/// `POST /api/v1/triggers/{pipeline}/{trigger}/resume?queued=replay|skip`.
pub async fn resume(
    State(s): State<Shared>,
    Path((pipeline, trigger)): Path<(String, String)>,
    Params(q): Params<ResumeQuery>,
) -> Response {
    let t = match known(&s, &pipeline, &trigger) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let skip = match q.queued.as_deref() {
        Some("skip") => true,
        Some("replay") => false,
        None if t.waiting == 0 => false,
        None => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "{} object(s) queued while paused: say `queued=replay` (they go to runs) or `queued=skip`",
                    t.waiting
                ),
            )
        }
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("queued=`{other}`: give replay or skip"),
            )
        }
    };
    match s
        .engine
        .state()
        .set_trigger_paused(&t.pipeline, &t.trigger, false, skip)
    {
        Ok(skipped) => Json(TriggerPause {
            pipeline,
            trigger,
            paused: false,
            skipped,
        })
        .into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
pub struct NotificationsQuery {
    state: Option<String>,
    limit: Option<usize>,
}

/// `GET /api/v1/notifications?state=dead&limit=50`.
pub async fn notifications(
    State(s): State<Shared>,
    Params(q): Params<NotificationsQuery>,
) -> Response {
    if let Some(st) = q
        .state
        .as_deref()
        .filter(|st| !["pending", "delivered", "dead"].contains(st))
    {
        return error(
            StatusCode::BAD_REQUEST,
            format!("state=`{st}`: give pending, delivered or dead"),
        );
    }
    let limit = q.limit.unwrap_or(50).min(1000);
    let state = s.engine.state();
    let (notifications, counts) = match (
        state.notifications(q.state.as_deref(), limit),
        state.notification_counts(),
    ) {
        (Ok(n), Ok(c)) => (n, c),
        (Err(e), _) | (_, Err(e)) => return internal(e),
    };
    Json(NotificationList {
        counts,
        notifications,
    })
    .into_response()
}
