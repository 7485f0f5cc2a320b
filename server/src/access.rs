//! Who is calling, whether they may, and the audit log of what they asked.
//!
//! A bearer token is one of: `serve --token` (an admin of every project, as before tokens
//! were kept), a token of the state store (`drivetrain token create`, found by the SHA-256
//! of its secret), or an OpenID Connect ID token (a JWT, verified against its issuer's
//! keys; see [`crate::oidc`]). Without a bearer token, a server that knows no
//! token answers reads only (`--insecure-no-auth`: everything).
//!
//! The rule of each route is in [`crate::api::openapi::ROUTES`]; the API's layer
//! decides it for the route's resource. Every mutating request, allowed or denied, is
//! appended to the audit log with who, what, the decision, and what it changed.

use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use drivetrain_engine::access::{Decision, Grant, Role, Subject};
use drivetrain_engine::state::{AuditEntry, TokenRecord};
use serde_json::Value;
use sha2::Digest;

use crate::server::Server;

pub use drivetrain_engine::access::DEFAULT_PROJECT;

/// The hex SHA-256 of a token's secret: what the state store keeps.
pub fn token_hash(secret: &str) -> String {
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

/// The subject of a token of the state store.
pub fn token_subject(t: &TokenRecord) -> Subject {
    Subject {
        name: format!("token:{}", t.name),
        grants: vec![Grant {
            project: t.project.clone(),
            role: Role::parse(&t.role).unwrap_or(Role::Viewer),
            approves: t.approves.clone(),
        }],
    }
}

/// An admin of every project, named `name`.
pub fn superuser(name: String) -> Subject {
    Subject {
        name,
        grants: vec![Grant {
            project: "*".into(),
            role: Role::Admin,
            approves: Vec::new(),
        }],
    }
}

/// Whether `given` equals `secret`, compared in full whatever the input so that timing
/// says nothing about the secret.
fn same_secret(given: &str, secret: &str) -> bool {
    given.len() == secret.len()
        && given
            .bytes()
            .zip(secret.bytes())
            .fold(0u8, |a, (x, y)| a | (x ^ y))
            == 0
}

/// Who sent `headers`, or the `401` that refuses them. `mutating`: the request changes
/// something (a server without tokens answers reads only).
pub async fn subject(
    s: &Arc<Server>,
    headers: &HeaderMap,
    mutating: bool,
) -> Result<Subject, (StatusCode, String)> {
    let unauthorized = |m: &str| (StatusCode::UNAUTHORIZED, m.to_owned());
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else {
        if s.auth_required {
            return Err(unauthorized(
                "a valid `Authorization: Bearer TOKEN` is required",
            ));
        }
        if mutating && !s.insecure_no_auth {
            return Err(unauthorized(
                "this server has no token, so it only answers reads: start it with --token \
                 (or DRIVETRAIN_TOKEN), create one with `drivetrain token create`, or start \
                 it with --insecure-no-auth to let anyone on this machine start runs",
            ));
        }
        // Reads of a server without tokens, or anything with --insecure-no-auth.
        return Ok(match s.insecure_no_auth {
            true => superuser("anonymous".into()),
            false => Subject {
                name: "anonymous".into(),
                grants: vec![Grant {
                    project: "*".into(),
                    role: Role::Viewer,
                    approves: Vec::new(),
                }],
            },
        });
    };
    if let Some(token) = &s.token {
        if same_secret(given, token) {
            return Ok(superuser("token:server".into()));
        }
    }
    if let Some(oidc) = &s.oidc {
        if crate::oidc::looks_like_jwt(given) {
            return oidc
                .subject(given)
                .await
                .map_err(|e| (StatusCode::UNAUTHORIZED, format!("the ID token: {e}")));
        }
    }
    let hash = token_hash(given);
    let state = s.engine.state().clone();
    let found = tokio::task::spawn_blocking(move || state.token_by_hash(&hash))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match found {
        Some(t) => Ok(token_subject(&t)),
        None => Err(unauthorized(
            "a valid `Authorization: Bearer TOKEN` is required",
        )),
    }
}

/// What a handler tells the audit log about its change (a response extension).
#[derive(Debug, Clone, Default)]
pub struct AuditNote {
    pub project: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
    /// A handler's own refusal (a rule finer than the route's): the reason.
    pub denied: Option<String>,
}

/// `response` with what it changed, for the audit log: the state before and after.
pub fn noted(
    mut response: axum::response::Response,
    before: Value,
    after: Value,
) -> axum::response::Response {
    response.extensions_mut().insert(AuditNote {
        before: Some(before),
        after: Some(after),
        ..Default::default()
    });
    response
}

/// The audit entry of a request.
#[derive(Debug)]
pub struct Asked<'a> {
    pub subject: &'a str,
    pub project: &'a str,
    pub action: String,
    pub resource: String,
}

impl Asked<'_> {
    /// Appends the entry of this request with `decision` (failures are printed: the
    /// request has been answered by then).
    pub async fn record(self, s: &Arc<Server>, d: &Decision, note: Option<&AuditNote>) {
        let entry = AuditEntry {
            seq: 0,
            at: drivetrain_engine::state::now(),
            subject: self.subject.to_owned(),
            project: note
                .and_then(|n| n.project.clone())
                .unwrap_or_else(|| self.project.to_owned()),
            action: self.action,
            resource: self.resource,
            decision: if d.allowed { "allowed" } else { "denied" }.into(),
            reason: Some(d.reason.clone()),
            before: note.and_then(|n| n.before.clone()),
            after: note.and_then(|n| n.after.clone()),
        };
        let state = s.engine.state().clone();
        let done = tokio::task::spawn_blocking(move || state.append_audit(&entry)).await;
        if !matches!(done, Ok(Ok(_))) {
            eprintln!("error: cannot append to the audit log: {done:?}");
        }
    }
}

/// The audit action of a route: its path after `/api/v1/`, parameters left out, joined
/// with dots (`runs.cancel`, `registry.aliases.rollback`); a `POST` to a collection is
/// `.create` of it.
pub fn action(method: &str, path: &str) -> String {
    let parts: Vec<&str> = path
        .trim_start_matches("/api/v1/")
        .split('/')
        .filter(|p| !p.starts_with('{'))
        .collect();
    let mut name = parts.join(".");
    if method == "post" && !path.ends_with('}') && parts.len() == 1 {
        name.push_str(".create");
    }
    name
}
