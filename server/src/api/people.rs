//! The API of people: approvals and their decisions, the audit log, and who the caller is.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use drivetrain_engine::access::{decide, Subject, Verb};

use drivetrain_engine::state::{Refusal, RunId, Vote};

use super::openapi::{ApprovalList, AuditList, WhoAmI};
use super::{ApiError, Params, Shared};
use crate::access::AuditNote;

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    waiting: bool,
    limit: Option<usize>,
}

/// A `limit` of 1 to 1000 (`default` without one), or the 400 that refuses it.
fn limit(given: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match given.unwrap_or(default) {
        n @ 1..=1000 => Ok(n),
        n => Err(ApiError::bad_request(format!("limit={n}: give 1 to 1000"))),
    }
}

/// `GET /api/v1/approvals`.
pub async fn approvals(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Params(q): Params<ListQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
    let limit = limit(q.limit, 100)?;
    let state = s.engine.state().clone();
    let mut approvals =
        tokio::task::spawn_blocking(move || state.approvals(q.waiting, limit)).await??;
    let readable = who.projects_for(Verb::Read);
    approvals.retain(|a| Subject::may(&readable, &a.request.project));
    Ok(Json(ApprovalList { approvals }))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    comment: Option<String>,
}

/// `POST /api/v1/runs/{id}/stages/{stage}/approve`.
pub async fn approve(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Path((run, stage)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    vote(s, who, run, stage, "approve", body).await
}

/// `POST /api/v1/runs/{id}/stages/{stage}/reject`.
pub async fn reject(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Path((run, stage)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    vote(s, who, run, stage, "reject", body).await
}

/// Counts `who`'s decision; once decided, the server's loop resumes the run.
async fn vote(
    s: Shared,
    who: Subject,
    run: String,
    stage: String,
    decision: &str,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: DecisionBody = match body.is_empty() {
        true => DecisionBody::default(),
        false => serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body: {e}")))?,
    };
    let vote = Vote {
        subject: who.name.clone(),
        decision: decision.into(),
        comment: body.comment,
        at: drivetrain_engine::state::now(),
    };
    let state = s.engine.state().clone();
    let (id, at) = (RunId(run), stage.clone());
    let counted = tokio::task::spawn_blocking(move || state.vote(&id, &at, &vote)).await??;
    let record = match counted {
        Ok(a) => a,
        Err(Refusal::Unknown) => return Err(ApiError::not_found(Refusal::Unknown.to_string())),
        Err(refusal) => return Err(ApiError::conflict(refusal.to_string())),
    };
    // Decided: the run goes on now, from here (`serve` and `ui` alike); one process takes
    // it. A run with another approval still waiting waits on.
    if record.outcome.is_some() {
        let (state, id) = (s.engine.state().clone(), record.request.run.clone());
        let ready = tokio::task::spawn_blocking(move || -> anyhow::Result<Option<RunId>> {
            Ok(state.take_decided(&id)?.then_some(id))
        })
        .await;
        match ready {
            Ok(Ok(Some(run))) => {
                println!("run {run}: its approvals are decided; resuming it");
                if let Err(e) = s.resume(std::slice::from_ref(&run)).await {
                    eprintln!("run {run}: cannot resume it: {e:#}");
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => eprintln!("approvals: {e:#}"),
            Err(e) => eprintln!("approvals: {e}"),
        }
    }
    let note = AuditNote {
        project: Some(record.request.project.clone()),
        before: None,
        after: Some(serde_json::json!({
            "vote": decision,
            "outcome": record.outcome,
            "approvals": record.approvers().len(),
        })),
        denied: None,
    };
    let mut response = Json(record).into_response();
    response.extensions_mut().insert(note);
    Ok(response)
}

#[derive(Deserialize)]
pub struct AuditQuery {
    since: Option<String>,
    after: Option<u64>,
    limit: Option<usize>,
}

/// `GET /api/v1/audit`.
pub async fn audit(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Params(q): Params<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let limit = limit(q.limit, 100)?;
    let since = q.since.unwrap_or_default();
    let Ok(after) = i64::try_from(q.after.unwrap_or(0)) else {
        return Err(ApiError::bad_request("after: at most 2^63 - 1"));
    };
    let state = s.engine.state().clone();
    let mut entries =
        tokio::task::spawn_blocking(move || state.audit(&since, after, limit)).await??;
    // An admin of a project reads its entries; of `*`, every entry.
    let readable = who.projects_for(Verb::ReadAudit);
    entries.retain(|e| Subject::may(&readable, &e.project));
    Ok(Json(AuditList { entries }))
}

/// `GET /api/v1/whoami`.
pub async fn whoami(Extension(who): Extension<Subject>) -> Json<WhoAmI> {
    let may = who
        .grants
        .iter()
        .map(|g| {
            let verbs = Verb::ALL
                .into_iter()
                .filter(|v| *v != Verb::Approve && decide(&who, *v, &g.project, None).allowed)
                .collect();
            (g.project.clone(), verbs)
        })
        .collect();
    Json(WhoAmI {
        subject: who.name.clone(),
        grants: who.grants.clone(),
        may,
    })
}
