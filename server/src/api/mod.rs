//! The HTTP API of `drivetrain serve` (axum, JSON under `/api/v1`), `/healthz`, `/readyz`
//! and `/metrics` (Prometheus text). [`openapi::ROUTES`] is the list the router is built
//! from and `docs/openapi.json` is generated from; the bodies are the types of
//! [`openapi`].
//!
//! Every error is an [`ApiError`] (`error.rs`): its status comes from one place, and
//! handlers return `Result<_, ApiError>`.
//!
//! Who may call what ([`auth`]):
//! - Who calls is [`access::subject`]: `--token`, a stored token, an OpenID Connect ID
//!   token. A server with any of them needs one on every route but the health checks and
//!   signed webhooks. Without (loopback only), reading is open but every mutating route is
//!   refused, unless the server was started with `--insecure-no-auth`.
//! - What they may do is the route's [`Rule`] in [`openapi::ROUTES`], decided for the
//!   project of the resource it names ([`resource`]); a handler decides finer where the
//!   project is in the body (a posted pipeline) or filters a list to what the caller may
//!   read. Every mutating request, allowed or denied, is appended to the audit log.
//! - On a loopback address the `Host` header must name it (`127.0.0.1:PORT`,
//!   `localhost:PORT`, `[::1]:PORT`): a page whose DNS name was rebound to 127.0.0.1 sends
//!   its own name and is refused.
//!
//! Validation of posted YAML runs on the blocking pool, at most
//! [`crate::server::VALIDATIONS`] at once and each within [`VALIDATION_TIMEOUT`], so one
//! hostile pipeline can neither stall the async workers nor take the memory of many.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::collections::BTreeMap;

use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::Value;

use drivetrain_engine::access::{decide, decide_anywhere, Decision, Rule, Subject, Verb};
use drivetrain_engine::artifacts::AttemptKey;
use drivetrain_engine::engine::RerunSpec;
use drivetrain_engine::state::RunId;

use crate::access;
use crate::server::Server;

mod error;
mod events;
pub mod keys;
pub mod layout;
pub mod openapi;
mod people;
pub mod views;
pub use error::ApiError;
use openapi::{
    Cancelling, Queued, Registered, RunDetail, RunList, RunView, ScheduleList, ScheduleStatus,
    Spawned, Started, Suspension,
};

type Shared = Arc<Server>;

/// A JSON request body; what axum refuses (not JSON, the wrong shape, too large) is
/// answered as every other error is, `{"error": …}` with axum's status.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(r) => Err(ApiError::new(r.status(), r.body_text())),
        }
    }
}

/// A query string, refused as [`JsonBody`] refuses bodies.
struct Params<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for Params<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Params(v)),
            Err(r) => Err(ApiError::new(r.status(), r.body_text())),
        }
    }
}

/// The handler of one route of [`openapi::ROUTES`].
fn handler(method: &str, path: &str) -> axum::routing::MethodRouter<Shared> {
    match (method, path) {
        ("get", "/healthz") => get(|| async { "ok\n" }),
        ("get", "/readyz") => get(ready),
        ("get", "/metrics") => get(metrics),
        ("get", "/api/v1/runs") => get(list_runs),
        ("post", "/api/v1/runs") => post(submit),
        ("get", "/api/v1/runs/{id}") => get(get_run),
        ("post", "/api/v1/runs/{id}/cancel") => post(cancel),
        ("post", "/api/v1/runs/{id}/rerun") => post(rerun),
        ("post", "/api/v1/runs/{id}/retry") => post(retry),
        ("get", "/api/v1/runs/{id}/logs") => get(logs),
        ("get", "/api/v1/runs/{id}/graph") => get(views::graph),
        ("get", "/api/v1/runs/{id}/attempts") => get(views::attempts),
        ("get", "/api/v1/runs/{id}/events") => get(views::run_events),
        ("get", "/api/v1/runs/{id}/stages/{stage}/explain") => get(views::explain),
        ("get", "/api/v1/runs/{id}/stages/{stage}/history") => get(views::stage_history),
        ("get", "/api/v1/runs/{id}/stages/{stage}/items") => get(views::items),
        ("get", "/api/v1/runs/{id}/stages/{stage}/trials") => get(views::trials),
        ("get", "/api/v1/events") => get(views::list_events),
        ("get", "/api/v1/lineage") => get(views::lineage),
        ("get", "/api/v1/registry") => get(views::models),
        ("post", "/api/v1/registry/{model}/aliases/{alias}/rollback") => post(views::rollback),
        ("get", "/api/v1/schedules") => get(schedules),
        ("post", "/api/v1/schedules") => post(register),
        ("post", "/api/v1/schedules/{name}/suspend") => post(suspend),
        ("post", "/api/v1/schedules/{name}/resume") => post(resume),
        ("post", "/api/v1/schedules/{name}/trigger") => post(trigger),
        ("get", "/api/v1/triggers") => get(events::triggers),
        ("post", "/api/v1/triggers/{pipeline}/{trigger}/pause") => post(events::pause),
        ("post", "/api/v1/triggers/{pipeline}/{trigger}/resume") => post(events::resume),
        ("get", "/api/v1/notifications") => get(events::notifications),
        ("post", "/api/v1/pipelines/{pipeline}/triggers/{trigger}") => post(events::hook),
        ("get", "/api/v1/approvals") => get(people::approvals),
        ("post", "/api/v1/runs/{id}/stages/{stage}/approve") => post(people::approve),
        ("post", "/api/v1/runs/{id}/stages/{stage}/reject") => post(people::reject),
        ("get", "/api/v1/audit") => get(people::audit),
        ("get", "/api/v1/whoami") => get(people::whoami),
        _ => unreachable!("no handler for {method} {path}"),
    }
}

/// The router over `server`, built from [`openapi::ROUTES`].
pub fn router(server: Shared) -> Router {
    let (mut open, mut api) = (Router::new(), Router::new());
    for r in openapi::ROUTES {
        let mut h = handler(r.method, r.path);
        if openapi::keyed(r) {
            h = h.layer(axum::middleware::from_fn_with_state(
                server.clone(),
                keys::once,
            ));
        }
        if openapi::guarded(r) {
            api = api.route(r.path, h);
        } else {
            open = open.route(r.path, h);
        }
    }
    let api = api.layer(axum::middleware::from_fn_with_state(server.clone(), auth));
    open.merge(api)
        .merge(crate::ui::router())
        .with_state(server)
}

/// Whether `host` (a `Host` header) names the loopback address the server is bound to.
fn host_is_bound(host: &str, bound: std::net::SocketAddr) -> bool {
    let port = bound.port().to_string();
    let (name, p) = match host.rsplit_once(':') {
        // `[::1]` alone has a colon in it but no port.
        Some((n, p)) if !p.contains(']') => (n, Some(p)),
        _ => (host, None),
    };
    // Without a port, the client used the scheme's default: only right on port 80.
    let port_ok = p.map_or(bound.port() == 80, |p| p == port);
    let name_ok = match name {
        "localhost" => true,
        n => n
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip == bound.ip()),
    };
    port_ok && name_ok
}
/// A request another site's page sent: to a loopback API under a Host that is not its
/// address (DNS rebinding), or a change from a page of another origin. Its refusal.
fn foreign(s: &Server, req: &Request, mutating: bool) -> Result<(), ApiError> {
    if s.bound.ip().is_loopback() {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !host_is_bound(host, s.bound) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Host `{}` is not this server's address ({}); a page of another site \
                     cannot call a loopback API",
                    drivetrain_engine::diag::clip(host.to_owned()),
                    s.bound
                ),
            ));
        }
    }
    // A browser names the page that sends a request: a page of another site may not
    // start, cancel or roll back anything here (a form needs no preflight).
    if mutating {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            let same = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|o| o == host);
            if !same {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "a page of `{}` cannot change this server",
                        drivetrain_engine::diag::clip(origin.to_owned())
                    ),
                ));
            }
        }
    }
    Ok(())
}

async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD);
    if let Err(refused) = foreign(&s, &req, mutating) {
        return refused.into_response();
    }
    let subject = match access::subject(&s, req.headers(), mutating).await {
        Ok(subject) => subject,
        Err((code, message)) => return ApiError::new(code, message).into_response(),
    };
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let method = req.method().as_str().to_ascii_lowercase();
    let Some(route) = openapi::ROUTES
        .iter()
        .find(|r| r.method == method && r.path == matched)
    else {
        return next.run(req).await;
    };
    let Rule::Need(verb) = route.rule else {
        return next.run(req).await;
    };
    let mut params = path_params(route.path, req.uri().path());
    // The registry's routes name their project in the query.
    if let Some((_, p)) = url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "project")
    {
        params.insert("?project".into(), p.into_owned());
    }
    let (project, approval) = match resource(&s, verb, &params).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let decision = match &project {
        Some(project) => decide(&subject, verb, project, approval.as_deref()),
        None => decide_anywhere(&subject, verb),
    };
    let project = project.unwrap_or_else(|| "*".to_owned());
    let asked = mutating.then(|| access::Asked {
        subject: &subject.name,
        project: &project,
        action: access::action(route.method, route.path),
        resource: req.uri().path().to_owned(),
    });
    if !decision.allowed {
        if let Some(asked) = asked {
            asked.record(&s, &decision, None).await;
        }
        return ApiError::new(StatusCode::FORBIDDEN, decision.reason).into_response();
    }
    let asked = asked.map(|a| (a.action, a.resource));
    let mut req = req;
    req.extensions_mut().insert(subject.clone());
    let response = next.run(req).await;
    if let Some((action, resource)) = asked {
        let note = response.extensions().get::<access::AuditNote>();
        let decision = match note.and_then(|n| n.denied.clone()) {
            Some(reason) => Decision {
                allowed: false,
                reason,
            },
            None => Decision {
                allowed: true,
                reason: format!(
                    "{}; answered {}",
                    decision.reason,
                    response.status().as_u16()
                ),
            },
        };
        let asked = access::Asked {
            subject: &subject.name,
            project: &project,
            action,
            resource,
        };
        asked.record(&s, &decision, note).await;
    }
    response
}

/// The values of `pattern`'s `{name}` parameters in `path`.
fn path_params(pattern: &str, path: &str) -> BTreeMap<String, String> {
    pattern
        .split('/')
        .zip(path.split('/'))
        .filter_map(|(p, v)| {
            let name = p.strip_prefix('{')?.strip_suffix('}')?;
            let v = percent_decode(v);
            Some((name.to_owned(), v))
        })
        .collect()
}

/// A path segment percent-decoded (as axum's `Path` decodes it).
fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The project of the resource a request names (`None`: the handler decides item by
/// item, as a list or a posted pipeline), and the approval role it asks for (an
/// approval's; a protected alias's).
async fn resource(
    s: &Shared,
    verb: Verb,
    params: &BTreeMap<String, String>,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let state = s.engine.state().clone();
    if verb == Verb::Approve {
        let (Some(run), Some(stage)) = (params.get("id"), params.get("stage")) else {
            return Ok((None, None));
        };
        let (run, stage) = (RunId(run.clone()), stage.clone());
        let found = tokio::task::spawn_blocking(move || state.approval(&run, &stage)).await??;
        return match found {
            Some(a) => Ok((Some(a.request.project), Some(a.request.role))),
            None => Err(ApiError::not_found("no approval is asked for there")),
        };
    }
    if let Some(run) = params.get("id").cloned() {
        // A run that does not exist is the handler's 404.
        let found = tokio::task::spawn_blocking(move || state.run(&RunId(run))).await?;
        return Ok((found.ok().map(|r| r.project), None));
    }
    if let Some(name) = params.get("name").or_else(|| params.get("pipeline")) {
        let project = s.loaded().get(name).map(|l| l.pipeline.project.clone());
        return Ok((project, None));
    }
    if verb == Verb::MoveAlias {
        if let Some(alias) = params.get("alias").cloned() {
            let protected =
                tokio::task::spawn_blocking(move || state.protected_aliases()).await??;
            let project = params
                .get("?project")
                .cloned()
                .unwrap_or_else(|| access::DEFAULT_PROJECT.to_owned());
            return Ok((Some(project), protected.get(&alias).cloned()));
        }
    }
    Ok((None, None))
}

async fn ready(State(s): State<Shared>) -> Result<&'static str, ApiError> {
    match s.engine.state().list_runs(1) {
        Ok(_) => Ok("ready\n"),
        Err(e) => Err(ApiError::unavailable(e.to_string())),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    pipeline: Option<String>,
    phase: Option<String>,
    trigger: Option<String>,
    since: Option<String>,
}

/// The most runs one list answers (`limit`).
pub const MAX_LIST: usize = 1_000_000;

async fn list_runs(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Params(q): Params<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    if q.limit.is_some_and(|l| l > MAX_LIST) {
        return Err(ApiError::bad_request(format!(
            "limit: at most {MAX_LIST} runs a request"
        )));
    }
    // A phase as the document lists it: its name, or in lower case.
    if let Some(p) = q.phase.as_deref().filter(|p| !p.is_empty()) {
        let named = drivetrain_engine::state::Phase::parse(p).or_else(|| {
            drivetrain_engine::state::Phase::ALL
                .into_iter()
                .find(|x| x.as_str().to_lowercase() == p)
        });
        if named.is_none() {
            return Err(ApiError::bad_request(format!(
                "phase {}: not a phase of a run (Pending, Running, Succeeded, Failed, …, or in lower case)",
                drivetrain_engine::diag::clip(p.to_owned())
            )));
        }
    }
    let filter = crate::query::ListFilter {
        limit: q.limit.unwrap_or(50),
        pipeline: q.pipeline,
        phase: q.phase,
        trigger: q.trigger,
        since: q.since,
        // Only the projects the caller may read.
        projects: who
            .projects_for(Verb::Read)
            .map(|p| p.into_iter().collect()),
    };
    match crate::query::runs_matching(s.engine.state().as_ref(), &filter)
        .map_err(ApiError::internal)?
    {
        Ok(runs) => {
            let runs = RunView::all(s.engine.state().as_ref(), runs)?;
            Ok(Json(RunList { runs }))
        }
        Err(why) => Err(ApiError::bad_request(format!("phase {why}"))),
    }
}

/// The run `id`, or the 404 that names it.
fn known_run(s: &Server, id: &RunId) -> Result<drivetrain_engine::state::RunRecord, ApiError> {
    s.engine
        .state()
        .run(id)
        .map_err(|_| ApiError::not_found(format!("no run `{id}`")))
}

async fn get_run(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<RunDetail>, ApiError> {
    let id = RunId(id);
    let run = known_run(&s, &id)?;
    let stages = s.engine.state().stages(&id)?;
    let run = RunView::one(s.engine.state().as_ref(), run)?;
    Ok(Json(RunDetail { run, stages }))
}

/// `POST /api/v1/runs`: `{"pipeline": NAME}` (a pipeline of the served directory) or
/// `{"yaml": TEXT}`, and `"params": {name: value}`.
#[derive(Deserialize)]
struct Submit {
    pipeline: Option<String>,
    yaml: Option<String>,
    #[serde(default)]
    params: serde_json::Map<String, Value>,
}

/// How long one posted pipeline may take to validate (waiting for its turn included)
/// before the request is answered 503.
pub const VALIDATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Validates posted YAML on the blocking pool: at most [`crate::server::VALIDATIONS`] at
/// once, each answered within [`VALIDATION_TIMEOUT`] ([`bounded`]).
async fn validate_posted(
    s: &Shared,
    yaml: String,
) -> Result<(drivetrain_engine::Pipeline, String), ApiError> {
    let busy = || {
        ApiError::unavailable(format!(
            "the pipeline was not validated within {} s; try again later",
            VALIDATION_TIMEOUT.as_secs()
        ))
    };
    let server = s.clone();
    let work = move || server.validated_posted(&yaml).map(|p| (p, yaml));
    match bounded(&s.validations, VALIDATION_TIMEOUT, work).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(problems)) => Err(ApiError::bad_request(problems)),
        Err(Unanswered::Late) => Err(busy()),
        Err(Unanswered::Failed(e)) => Err(ApiError::internal(format!("validation failed: {e}"))),
    }
}

/// Why [`bounded`] has no answer.
#[derive(Debug)]
enum Unanswered {
    /// No permit, or no result, within the time.
    Late,
    /// The work panicked.
    Failed(String),
}

/// Runs `work` on the blocking pool with one of `permits`, answering within `within`
/// (waiting for the permit included). Work that runs over keeps its permit until it
/// ends, so slow requests cannot pile up behind the answer.
async fn bounded<T: Send + 'static>(
    permits: &std::sync::Arc<tokio::sync::Semaphore>,
    within: std::time::Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unanswered> {
    let deadline = tokio::time::Instant::now() + within;
    let permit = match tokio::time::timeout_at(deadline, permits.clone().acquire_owned()).await {
        Ok(Ok(p)) => p,
        _ => return Err(Unanswered::Late),
    };
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    });
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Unanswered::Failed(e.to_string())),
        Err(_) => Err(Unanswered::Late),
    }
}

/// Refuses a NUL byte in `field`: it can be neither an argument nor an environment value.
fn nul_in<'a>(field: &str, mut texts: impl Iterator<Item = &'a str>) -> Result<(), ApiError> {
    match texts.any(|t| t.contains('\0')) {
        true => Err(ApiError::bad_request(format!(
            "`{field}` holds a NUL byte, which no argument or environment value can"
        ))),
        false => Ok(()),
    }
}

/// Every name and string value of a `params` object.
fn param_texts(params: &serde_json::Map<String, Value>) -> impl Iterator<Item = &str> {
    params.iter().flat_map(|(k, v)| {
        std::iter::once(k.as_str()).chain(match v {
            Value::String(t) => Some(t.as_str()),
            _ => None,
        })
    })
}

/// The id of the run a request starts: the one its `Idempotency-Key` was claimed with.
fn run_id_of(preset: Option<Extension<keys::Preset>>) -> RunId {
    preset.map_or_else(|| RunId::generate(chrono::Utc::now()), |Extension(p)| p.0)
}

async fn submit(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    preset: Option<Extension<keys::Preset>>,
    JsonBody(body): JsonBody<Submit>,
) -> Result<Response, ApiError> {
    let id = run_id_of(preset);
    nul_in("params", param_texts(&body.params))?;
    // Posted YAML runs any command: it needs `author` in its project, not only `launch`
    // (decided once it is validated and its project known).
    let overrides: Vec<(String, String)> = body
        .params
        .iter()
        .map(|(k, v)| (k.clone(), drivetrain_engine::template::value_text(v)))
        .collect();
    let (started, submitted_in) = match (body.pipeline, body.yaml) {
        (Some(name), None) => {
            let project = s.loaded().get(&name).map(|l| l.pipeline.project.clone());
            if let Some(p) = &project {
                ApiError::unless_allowed(decide(&who, Verb::Launch, p, None), Some(p))?;
            }
            (s.submit_named(&name, &overrides, id), project)
        }
        (None, Some(yaml)) => {
            let (pipeline, yaml) = validate_posted(&s, yaml).await?;
            let p = pipeline.project.clone();
            ApiError::unless_allowed(decide(&who, Verb::Author, &p, None), Some(&p))?;
            name_is_projects(&s, &pipeline.name, &p)?;
            (s.submit_yaml(pipeline, &yaml, &overrides, id), Some(p))
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `pipeline` (a name) and `yaml`",
            ))
        }
    };
    let run = started?;
    let note = access::AuditNote {
        after: Some(serde_json::json!({ "run": run })),
        project: submitted_in,
        ..Default::default()
    };
    let mut response = (StatusCode::CREATED, Json(Started { run })).into_response();
    response.extensions_mut().insert(note);
    Ok(response)
}

/// A pipeline name belongs to one project: a posted pipeline may not take the name of
/// one this server serves in another project (its runs would pass for that one's).
fn name_is_projects(s: &Server, name: &str, project: &str) -> Result<(), ApiError> {
    let owner = s.loaded().get(name).map(|l| l.pipeline.project.clone());
    match owner.filter(|o| o != project) {
        Some(owner) => Err(ApiError::forbidden(
            format!("pipeline `{name}` belongs to project `{owner}`; give project `{project}`'s pipeline a name of its own"),
            Some(&owner),
        )),
        None => Ok(()),
    }
}

async fn cancel(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Cancelling>), ApiError> {
    let run = RunId(id.clone());
    let accepted = (
        StatusCode::ACCEPTED,
        Json(Cancelling {
            run: id.clone(),
            cancelling: true,
        }),
    );
    let state = s.engine.state().clone();
    if s.cancel(&run) || drivetrain_engine::engine::recover::cancel_waiting(state.as_ref(), &run)? {
        return Ok(accepted);
    }
    // Recorded for whichever engine drives the run now or next: another server of the
    // home, a `drivetrain run`, or this server once it resumes a run just claimed (an
    // approval's deciding vote); each reads it within seconds, or as the run starts.
    let asked = {
        let run = run.clone();
        tokio::task::spawn_blocking(move || {
            state.ask_cancel(&run).map(|live| (live, state.run(&run)))
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??
    };
    match asked {
        (true, _) => Ok(accepted),
        (false, Ok(r)) => Err(ApiError::conflict(format!(
            "run `{id}` already ended: {}",
            r.phase
        ))),
        (false, Err(_)) => Err(ApiError::not_found(format!("no run `{id}`"))),
    }
}

/// `POST /api/v1/runs/{id}/rerun`: `{"stages": [..], "downstream": bool, "params": {..}}`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RerunBody {
    #[serde(default)]
    stages: Vec<String>,
    #[serde(default)]
    downstream: bool,
    #[serde(default)]
    params: serde_json::Map<String, Value>,
}

async fn rerun(
    State(s): State<Shared>,
    Path(id): Path<String>,
    preset: Option<Extension<keys::Preset>>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Spawned>), ApiError> {
    // No body at all reads as `{}`, which then says what is missing.
    let body: RerunBody = match body.is_empty() {
        true => RerunBody::default(),
        false => serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body: {e}")))?,
    };
    nul_in("stages", body.stages.iter().map(String::as_str))?;
    nul_in("params", param_texts(&body.params))?;
    if body.stages.is_empty() {
        return Err(ApiError::bad_request("name the `stages` to execute again"));
    }
    let stages = body.stages.into_iter().map(Into::into).collect();
    let mut spec = RerunSpec::rerun(RunId(id), stages);
    spec.downstream = body.downstream;
    spec.params = body
        .params
        .iter()
        .map(|(k, v)| (k.clone(), drivetrain_engine::template::value_text(v)))
        .collect();
    from_run(&s, spec, run_id_of(preset)).await
}

async fn retry(
    State(s): State<Shared>,
    Path(id): Path<String>,
    preset: Option<Extension<keys::Preset>>,
) -> Result<(StatusCode, Json<Spawned>), ApiError> {
    from_run(&s, RerunSpec::retry(RunId(id)), run_id_of(preset)).await
}

/// A rerun or retry, run in this process; the engine's refusal says the status.
async fn from_run(
    s: &Shared,
    spec: RerunSpec,
    id: RunId,
) -> Result<(StatusCode, Json<Spawned>), ApiError> {
    let trigger = if spec.retry { "retry" } else { "rerun" };
    let run = s.rerun(&spec, id).await?;
    Ok((
        StatusCode::CREATED,
        Json(Spawned {
            run,
            parent: spec.parent,
            trigger: trigger.to_owned(),
        }),
    ))
}

/// `POST /api/v1/schedules`: `{"yaml": TEXT, "replace": bool}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Register {
    yaml: String,
    #[serde(default)]
    replace: bool,
}

async fn register(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    JsonBody(body): JsonBody<Register>,
) -> Result<(StatusCode, Json<Registered>), ApiError> {
    let (pipeline, yaml) = validate_posted(&s, body.yaml).await?;
    let p = pipeline.project.clone();
    ApiError::unless_allowed(decide(&who, Verb::Author, &p, None), Some(&p))?;
    let owner = s
        .loaded()
        .get(&pipeline.name)
        .map(|l| l.pipeline.project.clone());
    let (schedule, next) = match s.register(pipeline, &yaml, body.replace, &who) {
        Ok(registered) => registered,
        // The caller's refusal, audited in the project it reached for.
        Err((403, reason)) => return Err(ApiError::forbidden(reason, owner.as_deref())),
        Err(e) => return Err(e.into()),
    };
    Ok((StatusCode::CREATED, Json(Registered { schedule, next })))
}

/// A place for one more stream to the request's client, or the `503` that refuses it.
fn admit_stream(
    s: &Shared,
    client: Option<axum::Extension<crate::listener::Client>>,
) -> Result<crate::listener::StreamPermit, Box<Response>> {
    let ip = client.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |c| c.0 .0.ip());
    s.streams
        .admit(ip)
        .map_err(|why| Box::new(crate::listener::busy(&why)))
}

/// The most of a live log one read sends.
const FOLLOW_CHUNK: u64 = 64 << 10;

/// Streams the live log of an attempt from its start, as it grows, until the attempt has
/// ended and everything it wrote was sent; at most [`FOLLOW_CHUNK`] bytes a read.
fn follow(
    s: Shared,
    run: RunId,
    stage: String,
    attempt: u32,
    path: std::path::PathBuf,
    permit: crate::listener::StreamPermit,
) -> Response {
    use std::io::{Read as _, Seek as _};
    let ended = move |s: &Server| attempt_ended(s.engine.state().as_ref(), &run, &stage, attempt);
    // The permit rides in the stream's state: given back when the stream is dropped.
    let start = (0u64, false, permit);
    let stream = futures::stream::unfold(start, move |(offset, done, permit)| {
        let s = s.clone();
        let path = path.clone();
        let ended = ended.clone();
        async move {
            if done {
                return None;
            }
            loop {
                let (server, path, ended) = (s.clone(), path.clone(), ended.clone());
                let turn = s.stream_reads.acquire().await;
                let read = tokio::task::spawn_blocking(move || {
                    // Ended is read before the file, so nothing written before the end is missed.
                    let finished = ended(&server);
                    let mut chunk = Vec::new();
                    if let Ok(mut f) = std::fs::File::open(&path) {
                        if f.seek(std::io::SeekFrom::Start(offset)).is_ok() {
                            let _ = f.take(FOLLOW_CHUNK).read_to_end(&mut chunk);
                        }
                    }
                    (finished, chunk)
                })
                .await;
                drop(turn);
                let Ok((finished, chunk)) = read else {
                    return None;
                };
                if !chunk.is_empty() {
                    let next = offset + chunk.len() as u64;
                    let state = (next, false, permit);
                    return Some((Ok::<_, std::convert::Infallible>(chunk), state));
                }
                // A reader left open does not hold up a server that is stopping.
                if finished || s.stopping.load(Ordering::SeqCst) {
                    return None;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

#[derive(Deserialize)]
struct LogsQuery {
    stage: String,
    /// Stream the log as it grows until the stage's attempt ends.
    #[serde(default)]
    follow: bool,
    /// Start this many bytes into the log (what a reader already has).
    #[serde(default)]
    offset: u64,
}

/// The start `Range: bytes=N-` asks for, if the request has that header.
fn range_start(headers: &axum::http::HeaderMap) -> Option<Result<u64, ()>> {
    let range = headers.get(header::RANGE)?;
    let start = range
        .to_str()
        .ok()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<u64>().ok());
    Some(start.ok_or(()))
}

/// A live log file's bytes `from..to`, a piece at a time, as a response body (what it
/// had when asked for: it may grow meanwhile).
fn file_body(path: std::path::PathBuf, from: u64, to: u64) -> axum::body::Body {
    use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
    let pieces = futures::stream::unfold(
        None,
        move |file: Option<tokio::io::Take<tokio::fs::File>>| {
            let path = path.clone();
            async move {
                let mut file = match file {
                    Some(f) => f,
                    None => {
                        let mut f = tokio::fs::File::open(&path).await.ok()?;
                        f.seek(std::io::SeekFrom::Start(from)).await.ok()?;
                        f.take(to.saturating_sub(from))
                    }
                };
                let mut piece = vec![0u8; FOLLOW_CHUNK as usize];
                let n = file.read(&mut piece).await.ok()?;
                if n == 0 {
                    return None;
                }
                piece.truncate(n);
                Some((Ok::<_, std::io::Error>(piece), Some(file)))
            }
        },
    );
    axum::body::Body::from_stream(pieces)
}

/// The number of the latest attempt of `stage_key` (a stage, or `STAGE/items/I`, an item
/// of a map stage), if it has one.
fn latest_attempt(
    state: &dyn drivetrain_engine::state::StateStore,
    run: &RunId,
    stage_key: &str,
) -> Result<Option<u32>, drivetrain_engine::state::StateError> {
    let key = AttemptKey::from_stage_key(run.0.clone(), stage_key, 0);
    if let Some(index) = key.item {
        let items = state.map_items(run, &key.stage)?;
        let mut attempts = items.get(index).map(|i| i.attempts);
        // A search's trial (`STAGE/items/I` too): its attempts across its rungs.
        if items.is_empty() {
            let trials = state.trials(run, &key.stage)?;
            attempts = trials
                .iter()
                .find(|t| t.trial.index == index)
                .map(|t| t.trial.attempts);
        }
        return Ok(attempts.filter(|n| *n > 0));
    }
    let attempts = state.attempts(run)?;
    let stage = attempts.iter().filter(|a| a.stage == stage_key);
    Ok(stage.map(|a| a.attempt).max())
}

/// Whether attempt `attempt` of trial `index` of a search has ended: a later one started,
/// or the trial is not running.
fn trial_ended(
    state: &dyn drivetrain_engine::state::StateStore,
    run: &RunId,
    stage: &str,
    (index, attempt): (usize, u32),
) -> bool {
    use drivetrain_engine::search::rungs::TrialState;
    match state.trials(run, stage) {
        Ok(trials) => trials
            .iter()
            .find(|t| t.trial.index == index)
            .is_none_or(|t| t.trial.attempts > attempt || t.trial.state != TrialState::Running),
        Err(_) => true,
    }
}

/// Whether attempt `attempt` of `stage_key` (a stage or a map item) has ended: a later one
/// started, or it is recorded as ended (or cannot be read).
fn attempt_ended(
    state: &dyn drivetrain_engine::state::StateStore,
    run: &RunId,
    stage_key: &str,
    attempt: u32,
) -> bool {
    let key = AttemptKey::from_stage_key(run.0.clone(), stage_key, attempt);
    let after = |n: u32, phase: drivetrain_engine::state::Phase| {
        n > attempt || (n == attempt && phase.is_terminal())
    };
    if let Some(index) = key.item {
        return match state.map_items(run, &key.stage) {
            Ok(items) if items.is_empty() => trial_ended(state, run, &key.stage, (index, attempt)),
            Ok(items) => items.get(index).is_none_or(|i| after(i.attempts, i.phase)),
            Err(_) => true,
        };
    }
    state
        .attempts(run)
        .map(|a| {
            a.iter()
                .any(|a| a.stage == stage_key && after(a.attempt, a.phase))
        })
        .unwrap_or(true)
}

/// The latest attempt's log of a stage: the published one, or the live file while it runs.
async fn logs(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Params(q): Params<LogsQuery>,
    client: Option<axum::Extension<crate::listener::Client>>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let run = RunId(id);
    let Some(latest) = latest_attempt(s.engine.state().as_ref(), &run, &q.stage)? else {
        return Err(ApiError::not_found(format!(
            "run `{run}` has no attempts of stage `{}`",
            q.stage
        )));
    };
    let key = AttemptKey::from_stage_key(run.0.clone(), &q.stage, latest);
    let live =
        drivetrain_engine::engine::home::live_log(s.engine.work_dir(), &run.0, &q.stage, latest);
    if q.follow {
        return Ok(match admit_stream(&s, client) {
            Ok(permit) => follow(s.clone(), run, q.stage, latest, live, permit),
            Err(busy) => *busy,
        });
    }
    // Sent as it is read, never whole in memory: from `offset`, or from a `Range`'s start
    // (answered 206 with the range it covers).
    let ranged = match range_start(&headers) {
        Some(Ok(start)) => Some(start),
        Some(Err(())) => {
            return Err(ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "only `Range: bytes=N-` is understood here",
            ))
        }
        None => None,
    };
    let from = ranged.unwrap_or(q.offset);
    let project = s
        .engine
        .state()
        .run(&run)
        .map_err(ApiError::internal)?
        .project;
    let store = s.store_for(&project).map_err(ApiError::internal)?;
    let logged = store
        .log_from(&key, from)
        .await
        .map_err(ApiError::internal)?;
    let (size, body) = match logged {
        Some((size, pieces)) => (size, axum::body::Body::from_stream(pieces)),
        None => {
            let size = std::fs::metadata(&live).map(|m| m.len()).unwrap_or(0);
            (size, file_body(live, from, size))
        }
    };
    let mut response = (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
            (header::ACCEPT_RANGES, "bytes".to_owned()),
            (
                header::CONTENT_LENGTH,
                size.saturating_sub(from).to_string(),
            ),
        ],
        body,
    )
        .into_response();
    if let Some(start) = ranged {
        if start >= size && size > 0 {
            return Err(ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("the log has {size} bytes; the range starts at {start}"),
            ));
        }
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let range = format!("bytes {start}-{}/{size}", size.saturating_sub(1));
        if let Ok(v) = header::HeaderValue::from_str(&range) {
            response.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(response)
}

async fn schedules(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
) -> Result<Json<ScheduleList>, ApiError> {
    let list = s.engine.state().schedules()?;
    let mut out = Vec::new();
    for e in list.into_iter().filter(|e| s.readable(&who, &e.pipeline)) {
        let ticks = s.engine.state().ticks(&e.pipeline, 10).unwrap_or_default();
        let next_tick = crate::query::next_tick(
            std::path::Path::new(&e.file),
            chrono::Utc::now(),
            &s.catalog,
        );
        out.push(ScheduleStatus {
            schedule: e,
            next_tick,
            recent_ticks: ticks,
        });
    }
    Ok(Json(ScheduleList { schedules: out }))
}

/// `Ok` where schedule `name` exists, else the 404 that names it.
fn known(s: &Server, name: &str) -> Result<(), ApiError> {
    match s.engine.state().schedule(name)? {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!("no schedule `{name}`"))),
    }
}

/// Whether schedule `name` is suspended, as the audit log's before.
fn suspended(s: &Server, name: &str) -> Value {
    let now = s.engine.state().schedule(name).ok().flatten();
    serde_json::json!({"suspended": now.map(|e| e.suspended)})
}

async fn suspend(State(s): State<Shared>, Path(name): Path<String>) -> Result<Response, ApiError> {
    known(&s, &name)?;
    let before = suspended(&s, &name);
    s.engine.state().set_suspended(&name, true, None)?;
    Ok(access::noted(
        Json(Suspension {
            schedule: name,
            suspended: true,
            backlog: None,
        })
        .into_response(),
        before,
        serde_json::json!({"suspended": true}),
    ))
}

#[derive(Deserialize)]
struct ResumeQuery {
    #[serde(default)]
    catchup: bool,
}

async fn resume(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Params(q): Params<ResumeQuery>,
) -> Result<Response, ApiError> {
    known(&s, &name)?;
    let anchor = (!q.catchup).then(crate::query::now_text);
    let before = suspended(&s, &name);
    s.engine
        .state()
        .set_suspended(&name, false, anchor.as_deref())?;
    Ok(access::noted(
        Json(Suspension {
            schedule: name,
            suspended: false,
            backlog: Some(q.catchup),
        })
        .into_response(),
        before,
        serde_json::json!({"suspended": false, "catchup": q.catchup}),
    ))
}

async fn trigger(
    State(s): State<Shared>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Queued>), ApiError> {
    known(&s, &name)?;
    let run = crate::query::queue_manual_tick(s.engine.state().as_ref(), &name)
        .map_err(ApiError::internal)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Queued {
            schedule: name,
            run,
        }),
    ))
}

/// Prometheus' text: counts of every project without names, and the per-stage series of
/// the projects the caller may read.
async fn metrics(State(s): State<Shared>, Extension(who): Extension<Subject>) -> Response {
    let mut out = String::new();
    let m = &s.metrics;
    out.push_str("# HELP drivetrain_runs Runs by status.\n# TYPE drivetrain_runs gauge\n");
    for (phase, n) in s.engine.state().run_counts().unwrap_or_default() {
        out.push_str(&format!("drivetrain_runs{{status=\"{phase}\"}} {n}\n"));
    }
    out.push_str("# HELP drivetrain_queue_depth Runs in flight in this server.\n# TYPE drivetrain_queue_depth gauge\n");
    out.push_str(&format!("drivetrain_queue_depth {}\n", s.in_flight()));
    out.push_str("# HELP drivetrain_http_streams Event streams and followed logs open.\n# TYPE drivetrain_http_streams gauge\n");
    out.push_str(&format!("drivetrain_http_streams {}\n", s.streams.open()));
    for (name, help, v) in [
        (
            "drivetrain_ticks_fired_total",
            "Cron ticks that started a run.",
            &m.ticks_fired,
        ),
        (
            "drivetrain_ticks_skipped_total",
            "Cron ticks recorded but not run.",
            &m.ticks_skipped,
        ),
        (
            "drivetrain_cache_hits_total",
            "Stages whose outputs came from the cache.",
            &m.cache_hits,
        ),
        (
            "drivetrain_cache_misses_total",
            "Cacheable stages that executed.",
            &m.cache_misses,
        ),
    ] {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            v.load(Ordering::Relaxed)
        ));
    }
    crate::server::render_gpu_queues(&mut out, s.engine.state().as_ref());
    m.render_usage(&mut out, &who.projects_for(Verb::Read));
    m.stage_seconds.render(
        &mut out,
        "drivetrain_stage_duration_seconds",
        "Stage durations.",
    );
    m.transition_seconds.render(
        &mut out,
        "drivetrain_stage_transition_seconds",
        "From a run start or an upstream stage's end to the next stage's start.",
    );
    m.schedule_lag_seconds.render(
        &mut out,
        "drivetrain_schedule_lag_seconds",
        "A run's start minus its tick's scheduled time.",
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

#[cfg(test)]
mod router_tests;

#[cfg(test)]
mod tests {

    /// Posted YAML is validated two at a time, each answered within its bound: the same
    /// `bounded` with slow work and short bounds instead of 30 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bounded_work_runs_two_at_a_time_and_answers_in_time() {
        use super::{bounded, Unanswered};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::Duration;
        let permits = Arc::new(tokio::sync::Semaphore::new(crate::server::VALIDATIONS));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut jobs = Vec::new();
        for _ in 0..6 {
            let (permits, now, most) = (permits.clone(), now.clone(), most.clone());
            jobs.push(tokio::spawn(async move {
                bounded(&permits, Duration::from_secs(10), move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        for j in jobs {
            assert!(j.await.unwrap().is_ok());
        }
        assert_eq!(most.load(Ordering::SeqCst), crate::server::VALIDATIONS);

        // Over its bound: answered late at the bound, its permit kept until it ends, so
        // the next one waits for it (and, with a bound shorter than that, is late too).
        let slow = bounded(&permits, Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(1000))
        });
        let started = std::time::Instant::now();
        assert!(matches!(slow.await, Err(Unanswered::Late)));
        assert!(started.elapsed() < Duration::from_millis(800));
        assert_eq!(permits.available_permits(), crate::server::VALIDATIONS - 1);
        let all = permits.clone().acquire_many_owned(2);
        assert!(tokio::time::timeout(Duration::from_millis(50), all)
            .await
            .is_err());
        let busy: Vec<_> = (0..crate::server::VALIDATIONS - 1)
            .map(|_| {
                let permits = permits.clone();
                tokio::spawn(async move {
                    bounded(&permits, Duration::from_secs(5), || {
                        std::thread::sleep(Duration::from_millis(600))
                    })
                    .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let queued = bounded(&permits, Duration::from_millis(100), || ()).await;
        assert!(matches!(queued, Err(Unanswered::Late)), "{queued:?}");
        for b in busy {
            assert!(b.await.unwrap().is_ok());
        }
        assert!(bounded(&permits, Duration::from_secs(1), || ())
            .await
            .is_ok());
    }
    /// Every route of the table has a handler (the router is built from the table).
    #[test]
    fn every_route_has_a_handler() {
        for r in super::openapi::ROUTES {
            let _ = super::handler(r.method, r.path);
        }
    }

    #[test]
    fn hosts_name_the_bound_address() {
        let bound: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for ok in ["127.0.0.1:8080", "localhost:8080"] {
            assert!(super::host_is_bound(ok, bound), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1:9",
            "127.0.0.1",
            "",
            "[::1]:8080",
            "127.0.0.2:8080",
        ] {
            assert!(!super::host_is_bound(bad, bound), "{bad}");
        }
        let v6: std::net::SocketAddr = "[::1]:80".parse().unwrap();
        assert!(super::host_is_bound("[::1]", v6));
        assert!(super::host_is_bound("localhost", v6));
        assert!(!super::host_is_bound("evil.example", v6));
    }
}
