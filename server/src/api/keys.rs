//! `Idempotency-Key` on the routes that start runs (`POST /api/v1/runs`, a rerun, a
//! retry): a client that did not hear the answer sends the same request with the same key
//! again, and gets the first answer while nothing more starts.
//!
//! The key is claimed in the state store before the request is carried out, with the id
//! of the run it will start ([`Preset`]), so every server of a home agrees: a repeated
//! key gets the stored answer (`Idempotent-Replayed: true`); a key still being carried out
//! is answered `409` with `Retry-After`, or with its run once that run exists (the server
//! carrying it out died after starting it); the same key with another request is `409`
//! without `Retry-After` (not worth sending again).
//! Answers worth retrying (`5xx`, `409`, `429`) give the key up again. Keys are the
//! caller's own (scoped by subject) and kept for [`KEPT`].

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::Extension;
use drivetrain_engine::access::Subject;
use drivetrain_engine::state::{KeyClaim, KeyRecord, RunId, StateStore};
use sha2::{Digest as _, Sha256};

use super::{ApiError, Shared};

/// The run a keyed request starts, chosen when its key was claimed (a request
/// extension the starting routes read).
#[derive(Debug, Clone)]
pub struct Preset(pub RunId);

/// How long a key is remembered.
pub const KEPT: Duration = Duration::from_secs(24 * 3600);
/// A claim unanswered this long whose run does not exist is given up: its server died
/// before starting anything.
const STALE: Duration = Duration::from_secs(60);
/// The most of a keyed request's body that is read (the JSON extractor's own bound).
const MOST: usize = 2 << 20;

/// Whether `key` may name a request: 1 to 200 of `A-Z a-z 0-9 . _ : -`.
pub fn valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 200
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
}

/// The route layer: carries a keyed request out once.
pub async fn once(
    State(s): State<Shared>,
    who: Option<Extension<Subject>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Only a POST that names its caller and a key (another method is the router's 405).
    let key = req.headers().get("idempotency-key");
    let (Some(Extension(who)), Some(key), true) = (who, key, req.method() == Method::POST) else {
        return Ok(next.run(req).await);
    };
    let key = key.to_str().ok().filter(|k| valid(k)).ok_or_else(|| {
        ApiError::bad_request("an `Idempotency-Key` is 1 to 200 of A-Z a-z 0-9 . _ : -")
    })?;
    let key = key.to_owned();
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MOST)
        .await
        .map_err(|e| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the body: {e}")))?;
    let mut digest = Sha256::new();
    digest.update(format!("{} {}\n", parts.method, parts.uri.path()));
    digest.update(&body);
    let claim = KeyClaim {
        scope: who.name.clone(),
        key,
        fingerprint: hex::encode(digest.finalize()),
        run: RunId::generate(chrono::Utc::now()),
        claimed_at: drivetrain_engine::state::now(),
    };
    // Carried out to its end, its answer kept, even when the client hangs up (which
    // drops this future): a claim is never left half-done by a client.
    tokio::spawn(carry(s, claim, parts, body, next))
        .await
        .map_err(|e| ApiError::internal(format!("the request: {e}")))?
}

/// Claims the key and carries the request out, or answers from the claim that holds it.
async fn carry(
    s: Shared,
    claim: KeyClaim,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    next: Next,
) -> Result<Response, ApiError> {
    let state = s.engine.state().clone();
    // A stale claim given up is claimed again, once.
    for _ in 0..2 {
        let held = blocking(&state, {
            let claim = claim.clone();
            move |st| st.claim_key(&claim)
        })
        .await?;
        let Some(held) = held else {
            let mut req = Request::from_parts(parts, Body::from(body));
            req.extensions_mut().insert(Preset(claim.run.clone()));
            return keep(&state, &claim, next.run(req).await).await;
        };
        if held.fingerprint != claim.fingerprint {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "`Idempotency-Key: {}` was sent with another request; a new request needs a new key",
                    claim.key
                ),
            ));
        }
        match settle(&state, &claim, &held, parts.uri.path()).await? {
            Some(answer) => return Ok(answer),
            None => continue,
        }
    }
    Ok(busy_key(&claim.key))
}

/// The answer to a key held by an earlier request `held`: its stored answer, its run's
/// if the run exists, `409` while it is carried out; `None` once a stale claim is given
/// up (to be claimed again).
async fn settle(
    state: &std::sync::Arc<dyn StateStore>,
    claim: &KeyClaim,
    held: &KeyRecord,
    path: &str,
) -> Result<Option<Response>, ApiError> {
    if let Some((status, body)) = &held.answer {
        return Ok(Some(replay(*status, body.clone())));
    }
    let run = held.run.clone();
    let record = blocking(state, move |st| Ok(st.run(&run).ok())).await?;
    if let Some(r) = record {
        // Started by a request whose answer was never stored: the answer the route gives.
        let body = match path.ends_with("/rerun") || path.ends_with("/retry") {
            true => serde_json::json!({"run": r.id, "parent": r.parent, "trigger": r.trigger}),
            false => serde_json::json!({"run": r.id}),
        };
        return Ok(Some(replay(201, body.to_string())));
    }
    let age = chrono::DateTime::parse_from_rfc3339(&held.claimed_at)
        .map(|t| chrono::Utc::now().signed_duration_since(t))
        .ok()
        .and_then(|d| d.to_std().ok());
    if age.is_some_and(|a| a > STALE) {
        let (scope, key, at) = (
            claim.scope.clone(),
            claim.key.clone(),
            held.claimed_at.clone(),
        );
        blocking(state, move |st| st.release_key(&scope, &key, &at)).await?;
        return Ok(None);
    }
    Ok(Some(busy_key(&claim.key)))
}

/// `409` with `Retry-After`: the key's first request is being carried out.
fn busy_key(key: &str) -> Response {
    let mut r = ApiError::conflict(format!(
        "a request with `Idempotency-Key: {key}` is being carried out; retry in a moment"
    ))
    .into_response();
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(crate::listener::RETRY_AFTER),
    );
    r
}

/// A stored answer, said to be one.
fn replay(status: u16, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    r
}

/// Stores `answer` as the key's, or gives the key up when the answer is worth retrying.
async fn keep(
    state: &std::sync::Arc<dyn StateStore>,
    claim: &KeyClaim,
    answer: Response,
) -> Result<Response, ApiError> {
    let status = answer.status();
    let (scope, key) = (claim.scope.clone(), claim.key.clone());
    let retry = status.is_server_error()
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS;
    if retry {
        let at = claim.claimed_at.clone();
        blocking(state, move |st| st.release_key(&scope, &key, &at)).await?;
        return Ok(answer);
    }
    let (parts, body) = answer.into_parts();
    let body = axum::body::to_bytes(body, MOST)
        .await
        .map_err(|e| ApiError::internal(format!("the answer: {e}")))?;
    let text = String::from_utf8_lossy(&body).into_owned();
    blocking(state, move |st| {
        st.answer_key(&scope, &key, status.as_u16(), &text)
    })
    .await?;
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// Runs `f` on the state store off the async threads.
async fn blocking<T: Send + 'static>(
    state: &std::sync::Arc<dyn StateStore>,
    f: impl FnOnce(&dyn StateStore) -> Result<T, drivetrain_engine::state::StateError> + Send + 'static,
) -> Result<T, ApiError> {
    let state = state.clone();
    Ok(tokio::task::spawn_blocking(move || f(state.as_ref()))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??)
}
