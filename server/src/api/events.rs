//! The API of triggers and notifications: what `drivetrain trigger` and `drivetrain
//! notifications` read and change, for the web view and other clients.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::collections::BTreeMap;

use drivetrain_engine::access::{Subject, Verb};
use drivetrain_engine::state::RunId;
use serde::Deserialize;

use super::openapi::{HookAccepted, NotificationList, TriggerList, TriggerPause, TriggerStatus};
use super::{ApiError, Params, Shared};

/// `GET /api/v1/triggers`.
pub async fn triggers(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
) -> Result<Json<TriggerList>, ApiError> {
    let all = s.engine.state().triggers()?;
    Ok(Json(TriggerList {
        triggers: all
            .into_iter()
            .filter(|t| s.readable(&who, &t.pipeline))
            .map(|t| TriggerStatus {
                lag_seconds: t.lag_seconds(),
                trigger: t,
            })
            .collect(),
    }))
}

/// The trigger a path names, or the 404 to answer.
fn known(
    s: &Shared,
    pipeline: &str,
    trigger: &str,
) -> Result<drivetrain_engine::state::TriggerRecord, ApiError> {
    crate::query::find_trigger(s.engine.state().as_ref(), &format!("{pipeline}/{trigger}"))
        .map_err(ApiError::internal)?
        .map_err(ApiError::not_found)
}

/// `POST /api/v1/triggers/{pipeline}/{trigger}/pause`.
pub async fn pause(
    State(s): State<Shared>,
    Path((pipeline, trigger)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let t = known(&s, &pipeline, &trigger)?;
    s.engine
        .state()
        .set_trigger_paused(&t.pipeline, &t.trigger, true, false)?;
    Ok(crate::access::noted(
        Json(TriggerPause {
            pipeline,
            trigger,
            paused: true,
            skipped: 0,
        })
        .into_response(),
        serde_json::json!({"paused": t.paused}),
        serde_json::json!({"paused": true}),
    ))
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
) -> Result<Response, ApiError> {
    let t = known(&s, &pipeline, &trigger)?;
    let skip = match q.queued.as_deref() {
        Some("skip") => true,
        Some("replay") => false,
        None if t.waiting == 0 => false,
        None => {
            return Err(ApiError::bad_request(format!(
                "{} object(s) queued while paused: say `queued=replay` (they go to runs) or `queued=skip`",
                t.waiting
            )))
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "queued=`{other}`: give replay or skip"
            )))
        }
    };
    let skipped = s
        .engine
        .state()
        .set_trigger_paused(&t.pipeline, &t.trigger, false, skip)?;
    Ok(crate::access::noted(
        Json(TriggerPause {
            pipeline,
            trigger,
            paused: false,
            skipped,
        })
        .into_response(),
        serde_json::json!({"paused": t.paused, "waiting": t.waiting}),
        serde_json::json!({"paused": false, "skipped": skipped}),
    ))
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
) -> Result<Json<NotificationList>, ApiError> {
    if let Some(st) = q
        .state
        .as_deref()
        .filter(|st| !["pending", "delivered", "dead"].contains(st))
    {
        return Err(ApiError::bad_request(format!(
            "state=`{st}`: give pending, delivered or dead"
        )));
    }
    let limit = q.limit.unwrap_or(50);
    if limit > 1000 {
        return Err(ApiError::bad_request(format!(
            "limit={limit}: at most 1000"
        )));
    }
    let state = s.engine.state();
    let mut notifications = state.notifications(q.state.as_deref(), limit)?;
    let counts = state.notification_counts()?;
    // Only the notifications of runs the caller may read, by each run's own project (a
    // pipeline's name says nothing of it); the counts are the server's, without names.
    if let Some(readable) = who.projects_for(Verb::Read) {
        let mut project_of: BTreeMap<String, Option<String>> = BTreeMap::new();
        notifications.retain(|n| {
            let project = project_of.entry(n.run_id.clone()).or_insert_with(|| {
                let run = state.run(&RunId(n.run_id.clone()));
                run.ok().map(|r| r.project)
            });
            project.as_deref().is_some_and(|p| readable.contains(p))
        });
    }
    Ok(Json(NotificationList {
        counts,
        notifications,
    }))
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
) -> Result<(StatusCode, Json<HookAccepted>), ApiError> {
    let hook = s.hook(&pipeline, &trigger).map_err(ApiError::not_found)?;
    let secret = hook
        .secret
        .read()
        .map_err(|why| ApiError::internal(format!("the trigger's secret: {why}")))?;
    let signed = headers
        .get("x-drivetrain-signature")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|sig| drivetrain_engine::events::notify::verify(&secret, &body, sig));
    if !signed {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "no valid `X-Drivetrain-Signature: sha256=HMAC-SHA256(secret, body)`",
        ));
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| super::keys::valid(k));
    let Some(key) = key.map(str::to_owned) else {
        return Err(ApiError::bad_request(
            "an `Idempotency-Key` header (1 to 200 of A-Z a-z 0-9 . _ : -) names the call: a retry with the same key starts nothing more",
        ));
    };
    let Ok(payload) = std::str::from_utf8(&body).map(str::to_owned) else {
        return Err(ApiError::bad_request("the body is not UTF-8"));
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
    let new =
        tokio::task::spawn_blocking(move || state.add_objects(&p, &t, &[object], None, false))
            .await??;
    s.hook_wake(&pipeline, &trigger);
    Ok((
        StatusCode::ACCEPTED,
        Json(HookAccepted {
            object: url,
            new: new > 0,
        }),
    ))
}
