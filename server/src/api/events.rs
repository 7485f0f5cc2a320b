//! The API of triggers and notifications: what `drivetrain trigger` and `drivetrain
//! notifications` read and change, for the web view and other clients.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use drivetrain_engine::access::Subject;
use serde::Deserialize;

use super::openapi::{HookAccepted, NotificationList, TriggerList, TriggerPause, TriggerStatus};
use super::{error, internal, Params, Shared};

/// `GET /api/v1/triggers`.
pub async fn triggers(State(s): State<Shared>, Extension(who): Extension<Subject>) -> Response {
    match s.engine.state().triggers() {
        Ok(all) => Json(TriggerList {
            triggers: all
                .into_iter()
                .filter(|t| s.readable(&who, &t.pipeline))
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
    match crate::query::find_trigger(s.engine.state().as_ref(), &format!("{pipeline}/{trigger}")) {
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
        Ok(_) => crate::access::noted(
            Json(TriggerPause {
                pipeline,
                trigger,
                paused: true,
                skipped: 0,
            })
            .into_response(),
            serde_json::json!({"paused": t.paused}),
            serde_json::json!({"paused": true}),
        ),
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
        Ok(skipped) => crate::access::noted(
            Json(TriggerPause {
                pipeline,
                trigger,
                paused: false,
                skipped,
            })
            .into_response(),
            serde_json::json!({"paused": t.paused, "waiting": t.waiting}),
            serde_json::json!({"paused": false, "skipped": skipped}),
        ),
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
    Extension(who): Extension<Subject>,
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
    let limit = q.limit.unwrap_or(50);
    if limit > 1000 {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit={limit}: at most 1000"),
        );
    }
    let state = s.engine.state();
    let (mut notifications, counts) = match (
        state.notifications(q.state.as_deref(), limit),
        state.notification_counts(),
    ) {
        (Ok(n), Ok(c)) => (n, c),
        (Err(e), _) | (_, Err(e)) => return internal(e),
    };
    // Only the notifications of what the caller may read (the counts are the server's).
    notifications.retain(|n| s.readable(&who, &n.pipeline));
    Json(NotificationList {
        counts,
        notifications,
    })
    .into_response()
}

/// `POST /api/v1/pipelines/{name}/triggers/{trigger}`: a signed call to a webhook
/// trigger (`X-Drivetrain-Signature: sha256=HMAC(secret, body)`, `Idempotency-Key`).
/// Recorded in the inbox before it is answered; a key seen before is answered as such and
/// starts nothing.
pub async fn hook(
    State(s): State<Shared>,
    Path((pipeline, trigger)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let hook = match s.hook(&pipeline, &trigger) {
        Ok(h) => h,
        Err(why) => return error(StatusCode::NOT_FOUND, why),
    };
    let secret = match hook.secret.read() {
        Ok(v) => v,
        Err(why) => return internal(format!("the trigger's secret: {why}")),
    };
    let signed = headers
        .get("x-drivetrain-signature")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|sig| drivetrain_engine::events::notify::verify(&secret, &body, sig));
    if !signed {
        return error(
            StatusCode::UNAUTHORIZED,
            "no valid `X-Drivetrain-Signature: sha256=HMAC-SHA256(secret, body)`",
        );
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| {
            !k.is_empty()
                && k.len() <= 200
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
        });
    let Some(key) = key.map(str::to_owned) else {
        return error(
            StatusCode::BAD_REQUEST,
            "an `Idempotency-Key` header (1 to 200 of A-Z a-z 0-9 . _ : -) names the call: a retry with the same key starts nothing more",
        );
    };
    let Ok(payload) = std::str::from_utf8(&body).map(str::to_owned) else {
        return error(StatusCode::BAD_REQUEST, "the body is not UTF-8");
    };
    let url = drivetrain_engine::events::Hook::url(&pipeline, &trigger, &key);
    let object = drivetrain_engine::state::InboxObject {
        url: url.clone(),
        etag: String::new(),
        size: i64::try_from(body.len()).ok(),
        modified: None,
        group: String::new(),
        discovered_at: drivetrain_engine::state::now(),
        payload: Some(payload),
    };
    let state = s.engine.state().clone();
    let (p, t) = (pipeline.clone(), trigger.clone());
    let added =
        tokio::task::spawn_blocking(move || state.add_objects(&p, &t, &[object], None, false))
            .await;
    match added {
        Ok(Ok(new)) => {
            s.hook_wake(&pipeline, &trigger);
            (
                StatusCode::ACCEPTED,
                Json(HookAccepted {
                    object: url,
                    new: new > 0,
                }),
            )
                .into_response()
        }
        Ok(Err(e)) => internal(e),
        Err(e) => internal(e),
    }
}
