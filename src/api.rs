//! The HTTP API of `drivetrain serve` (axum, JSON under `/api/v1`), `/healthz`, `/readyz`
//! and `/metrics` (Prometheus text). Every route but the health checks needs
//! `Authorization: Bearer TOKEN` when the server has a token. [`ROUTES`] is the list the
//! router is built from and `docs/openapi.json` is checked against.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use drivetrain_engine::artifacts::AttemptKey;
use drivetrain_engine::state::RunId;

use crate::serve::Server;

/// Every route: method and path (axum syntax), as `docs/openapi.json` lists them.
#[cfg_attr(not(test), allow(dead_code))]
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/api/v1/runs"),
    ("post", "/api/v1/runs"),
    ("get", "/api/v1/runs/{id}"),
    ("post", "/api/v1/runs/{id}/cancel"),
    ("post", "/api/v1/runs/{id}/rerun"),
    ("post", "/api/v1/runs/{id}/retry"),
    ("get", "/api/v1/runs/{id}/logs"),
    ("get", "/api/v1/schedules"),
    ("post", "/api/v1/schedules"),
    ("post", "/api/v1/schedules/{name}/suspend"),
    ("post", "/api/v1/schedules/{name}/resume"),
    ("post", "/api/v1/schedules/{name}/trigger"),
];

type Shared = Arc<Server>;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn internal(e: impl std::fmt::Display) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The router over `server`.
pub fn router(server: Shared) -> Router {
    let api = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/runs", get(list_runs).post(submit))
        .route("/api/v1/runs/{id}", get(get_run))
        .route("/api/v1/runs/{id}/cancel", post(cancel))
        .route("/api/v1/runs/{id}/rerun", post(rerun))
        .route("/api/v1/runs/{id}/retry", post(retry))
        .route("/api/v1/runs/{id}/logs", get(logs))
        .route("/api/v1/schedules", get(schedules).post(register))
        .route("/api/v1/schedules/{name}/suspend", post(suspend))
        .route("/api/v1/schedules/{name}/resume", post(resume))
        .route("/api/v1/schedules/{name}/trigger", post(trigger))
        .layer(axum::middleware::from_fn_with_state(server.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .merge(api)
        .with_state(server)
}

async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(token) = &s.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Compared in full whatever the input, so timing says nothing about the token.
        let ok = given.is_some_and(|g| {
            g.len() == token.len()
                && g.bytes()
                    .zip(token.bytes())
                    .fold(0u8, |a, (x, y)| a | (x ^ y))
                    == 0
        });
        if !ok {
            return error(
                StatusCode::UNAUTHORIZED,
                "a valid `Authorization: Bearer TOKEN` is required",
            );
        }
    }
    next.run(req).await
}

async fn ready(State(s): State<Shared>) -> Response {
    match s.state.list_runs(1) {
        Ok(_) => "ready\n".into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

async fn list_runs(State(s): State<Shared>, Query(q): Query<ListQuery>) -> Response {
    match s.state.list_runs(q.limit.unwrap_or(50)) {
        Ok(runs) => Json(json!({"runs": runs})).into_response(),
        Err(e) => internal(e),
    }
}

async fn get_run(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let id = RunId(id);
    let run = match s.state.run(&id) {
        Ok(r) => r,
        Err(_) => return error(StatusCode::NOT_FOUND, format!("no run `{id}`")),
    };
    match s.state.stages(&id) {
        Ok(stages) => Json(json!({"run": run, "stages": stages})).into_response(),
        Err(e) => internal(e),
    }
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

async fn submit(State(s): State<Shared>, Json(body): Json<Submit>) -> Response {
    let overrides: Vec<(String, String)> = body
        .params
        .iter()
        .map(|(k, v)| (k.clone(), drivetrain_engine::template::value_text(v)))
        .collect();
    let started = match (body.pipeline, body.yaml) {
        (Some(name), None) => s.submit_named(&name, &overrides),
        (None, Some(yaml)) => s.submit_yaml(&yaml, &overrides),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give exactly one of `pipeline` (a name) and `yaml`",
            )
        }
    };
    match started {
        Ok(run) => (StatusCode::CREATED, Json(json!({"run": run}))).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn cancel(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let run = RunId(id.clone());
    let accepted = (
        StatusCode::ACCEPTED,
        Json(json!({"run": id, "cancelling": true})),
    );
    if s.cancel(&run) {
        return accepted.into_response();
    }
    // A rerun or retry this server started runs in an engine of its own.
    match s.state.run(&run) {
        Ok(r)
            if !r.phase.is_terminal()
                && r.engine_pid
                    .is_some_and(|p| p != i64::from(std::process::id())) =>
        {
            let pid = r.engine_pid.unwrap_or_default() as i32;
            match nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            ) {
                Ok(()) => accepted.into_response(),
                Err(e) => error(
                    StatusCode::CONFLICT,
                    format!(
                        "run `{id}`'s engine is gone ({e}); `drivetrain cancel {id}` records it"
                    ),
                ),
            }
        }
        Ok(r) if r.phase.is_terminal() => error(
            StatusCode::CONFLICT,
            format!("run `{id}` already ended: {}", r.phase),
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            format!("run `{id}` is not running in this server"),
        ),
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
    body: Option<Json<RerunBody>>,
) -> Response {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    if body.stages.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "name the `stages` to execute again",
        );
    }
    let mut extra = Vec::new();
    for st in &body.stages {
        extra.extend(["--stage".to_owned(), st.clone()]);
    }
    if body.downstream {
        extra.push("--downstream".into());
    }
    for (k, v) in &body.params {
        extra.extend([
            "--param".to_owned(),
            format!("{k}={}", drivetrain_engine::template::value_text(v)),
        ]);
    }
    from_run(&s, "rerun", id, &extra)
}

async fn retry(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    from_run(&s, "retry", id, &[])
}

fn from_run(s: &Server, verb: &str, id: String, extra: &[String]) -> Response {
    let parent = RunId(id);
    match s.state.run(&parent) {
        Ok(r) if !r.phase.is_terminal() => {
            return error(
                StatusCode::CONFLICT,
                format!("run `{parent}` is still running; wait for it or cancel it first"),
            )
        }
        Ok(_) => {}
        Err(_) => return error(StatusCode::NOT_FOUND, format!("no run `{parent}`")),
    }
    match s.spawn_from(verb, &parent, extra) {
        Ok(run) => (
            StatusCode::CREATED,
            Json(json!({"run": run, "parent": parent, "trigger": verb})),
        )
            .into_response(),
        Err(e) => internal(e),
    }
}

/// `POST /api/v1/schedules`: `{"yaml": TEXT, "replace": bool}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Register {
    yaml: String,
    #[serde(default)]
    replace: bool,
}

async fn register(State(s): State<Shared>, Json(body): Json<Register>) -> Response {
    match s.register(&body.yaml, body.replace) {
        Ok((name, next)) => (
            StatusCode::CREATED,
            Json(json!({"schedule": name, "next": next})),
        )
            .into_response(),
        Err((code, message)) => error(
            StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
            message,
        ),
    }
}

/// Streams the live log of an attempt from its start, as it grows, until the attempt has
/// ended and everything it wrote was sent.
fn follow(
    s: Shared,
    run: RunId,
    stage: String,
    attempt: u32,
    path: std::path::PathBuf,
) -> Response {
    use std::io::{Read as _, Seek as _};
    let ended = move |s: &Server| {
        s.state
            .attempts(&run)
            .map(|a| {
                a.iter().any(|a| {
                    a.stage == stage
                        && (a.attempt > attempt || (a.attempt == attempt && a.phase.is_terminal()))
                })
            })
            .unwrap_or(true)
    };
    let stream = futures::stream::unfold((0u64, false), move |(offset, done)| {
        let s = s.clone();
        let path = path.clone();
        let ended = ended.clone();
        async move {
            if done {
                return None;
            }
            loop {
                // Ended is read before the file, so nothing written before the end is missed.
                let finished = ended(&s);
                let mut chunk = Vec::new();
                if let Ok(mut f) = std::fs::File::open(&path) {
                    if f.seek(std::io::SeekFrom::Start(offset)).is_ok() {
                        let _ = f.read_to_end(&mut chunk);
                    }
                }
                if !chunk.is_empty() {
                    let next = offset + chunk.len() as u64;
                    return Some((Ok::<_, std::convert::Infallible>(chunk), (next, false)));
                }
                if finished {
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
}

/// The latest attempt's log of a stage: the published one, or the live file while it runs.
async fn logs(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Response {
    let run = RunId(id);
    let attempts = match s.state.attempts(&run) {
        Ok(a) => a,
        Err(e) => return internal(e),
    };
    let Some(latest) = attempts
        .iter()
        .filter(|a| a.stage == q.stage)
        .map(|a| a.attempt)
        .max()
    else {
        return error(
            StatusCode::NOT_FOUND,
            format!("run `{run}` has no attempts of stage `{}`", q.stage),
        );
    };
    let key = AttemptKey {
        run: run.0.clone(),
        stage: q.stage.clone(),
        attempt: latest,
    };
    let live = s
        .work_dir
        .join(&run.0)
        .join(&q.stage)
        .join(latest.to_string())
        .join("log.txt");
    if q.follow {
        return follow(s.clone(), run, q.stage, latest, live);
    }
    let text = match s.artifacts.log(&key).await {
        Ok(Some(bytes)) => bytes,
        _ => std::fs::read(
            s.work_dir
                .join(&run.0)
                .join(&q.stage)
                .join(latest.to_string())
                .join("log.txt"),
        )
        .unwrap_or_default(),
    };
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn schedules(State(s): State<Shared>) -> Response {
    let list = match s.state.schedules() {
        Ok(l) => l,
        Err(e) => return internal(e),
    };
    let mut out = Vec::new();
    for e in list {
        let ticks = s.state.ticks(&e.pipeline, 10).unwrap_or_default();
        out.push(json!({"schedule": e, "recent_ticks": ticks}));
    }
    Json(json!({"schedules": out})).into_response()
}

fn known(s: &Server, name: &str) -> Option<Response> {
    match s.state.schedule(name) {
        Ok(Some(_)) => None,
        Ok(None) => Some(error(
            StatusCode::NOT_FOUND,
            format!("no schedule `{name}`"),
        )),
        Err(e) => Some(internal(e)),
    }
}

async fn suspend(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    if let Some(r) = known(&s, &name) {
        return r;
    }
    match s.state.set_suspended(&name, true, None) {
        Ok(()) => Json(json!({"schedule": name, "suspended": true})).into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
struct ResumeQuery {
    #[serde(default)]
    catchup: bool,
}

async fn resume(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<ResumeQuery>,
) -> Response {
    if let Some(r) = known(&s, &name) {
        return r;
    }
    let anchor = (!q.catchup).then(crate::serve::now_text);
    match s.state.set_suspended(&name, false, anchor.as_deref()) {
        Ok(()) => Json(json!({"schedule": name, "suspended": false, "backlog": q.catchup}))
            .into_response(),
        Err(e) => internal(e),
    }
}

async fn trigger(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    if let Some(r) = known(&s, &name) {
        return r;
    }
    match crate::serve::queue_manual_tick(s.state.as_ref(), &name) {
        Ok(run) => (
            StatusCode::ACCEPTED,
            Json(json!({"schedule": name, "run": run})),
        )
            .into_response(),
        Err(e) => internal(e),
    }
}

async fn metrics(State(s): State<Shared>) -> Response {
    let mut out = String::new();
    let m = &s.metrics;
    out.push_str("# HELP drivetrain_runs Runs by status.\n# TYPE drivetrain_runs gauge\n");
    for (phase, n) in s.state.run_counts().unwrap_or_default() {
        out.push_str(&format!("drivetrain_runs{{status=\"{phase}\"}} {n}\n"));
    }
    out.push_str("# HELP drivetrain_queue_depth Runs in flight in this server.\n# TYPE drivetrain_queue_depth gauge\n");
    out.push_str(&format!("drivetrain_queue_depth {}\n", s.in_flight()));
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
mod tests {
    /// The OpenAPI document lists exactly the routes the router serves.
    #[test]
    fn the_openapi_document_matches_the_routes() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
                .unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                documented.push((method.clone(), path.clone()));
            }
        }
        documented.sort();
        let mut routes: Vec<(String, String)> = super::ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        routes.sort();
        assert_eq!(documented, routes);
    }
}
