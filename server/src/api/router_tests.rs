//! The router in-process, on an [`Engine`] with the fake executor: every route of
//! [`openapi::ROUTES`] answers a request naming nothing that exists with a status its
//! document lists (never a 500), and the engine's refusals of reruns and retries map to
//! their statuses (400, 404, 409) in one place ([`crate::server::refusal_status`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::openapi;
use crate::server::{Auth, Server};
use drivetrain_engine::Catalog;

const TOKEN: &str = "router-test-token";

/// A server (token [`TOKEN`]) on a scratch home, its runs on the fake executor.
struct Bench {
    dir: std::path::PathBuf,
    server: Arc<Server>,
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bench {
    fn new(name: &str) -> Bench {
        let dir = std::env::temp_dir().join(format!("dt-router-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("served")).unwrap();
        let (engine, _) = drivetrain_engine::testing::fake_engine(&dir);
        let auth = Auth {
            token: Some(TOKEN.into()),
            auth_required: true,
            ..Auth::default()
        };
        let limits = crate::listener::Limits::for_files(1024);
        let server = Arc::new(Server::new(
            engine,
            Catalog::new(Vec::new(), vec!["local"]),
            (dir.clone(), dir.join("served")),
            Default::default(),
            auth,
            ("127.0.0.1:8080".parse().unwrap(), limits),
            Vec::new(),
        ));
        Bench { dir, server }
    }

    /// One request through the whole router (the auth layer included): status and body.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let (status, value, _) = self.keyed(method, path, body, None).await;
        (status, value)
    }

    /// [`Bench::call`] with an `Idempotency-Key`; also whether the answer is a replay.
    async fn keyed(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> (StatusCode, Value, bool) {
        let mut request = Request::builder()
            .method(method.to_uppercase().as_str())
            .uri(path)
            .header(header::HOST, "127.0.0.1:8080")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = key {
            request = request.header("idempotency-key", k);
        }
        let request = request
            .body(match body {
                Some(b) => Body::from(b.to_string()),
                None => Body::empty(),
            })
            .unwrap();
        let router = super::router(self.server.clone());
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let streamed = response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
        // A stream is not read to its end: its status is the answer.
        if streamed {
            return (status, Value::Null, replayed);
        }
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value, replayed)
    }

    /// Submits `yaml` and waits for its run to end: its id.
    async fn ended_run(&self, yaml: &str) -> String {
        let (code, v) = self
            .call("post", "/api/v1/runs", Some(json!({ "yaml": yaml })))
            .await;
        assert_eq!(code, StatusCode::CREATED, "{v}");
        let run = v["run"].as_str().unwrap().to_owned();
        for _ in 0..200 {
            let (_, v) = self.call("get", &format!("/api/v1/runs/{run}"), None).await;
            if !["Pending", "Running"].contains(&v["run"]["phase"].as_str().unwrap_or("")) {
                return run;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("run {run} never ended");
    }
}

/// A path with every `{param}` naming something that does not exist.
fn nothing_at(path: &str) -> String {
    let mut out = String::new();
    for (i, part) in path.split('{').enumerate() {
        match (i, part.split_once('}')) {
            (0, _) | (_, None) => out.push_str(part),
            (_, Some((name, rest))) => {
                out.push_str(&format!("no-such-{name}"));
                out.push_str(rest);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_a_request_for_nothing_as_documented() {
    let b = Bench::new("routes");
    let mut asked = 0;
    for route in openapi::ROUTES {
        let path = nothing_at(route.path);
        let body = (route.method != "get").then(|| json!({}));
        let (code, v) = b.call(route.method, &path, body).await;
        let documented: Vec<u16> = openapi::responses(route).iter().map(|r| r.0).collect();
        assert!(
            documented.contains(&code.as_u16()),
            "{} {path}: {code} is not among {documented:?}: {v}",
            route.method
        );
        assert_ne!(code, StatusCode::INTERNAL_SERVER_ERROR, "{path}: {v}");
        if code.is_client_error() {
            assert!(v["error"].is_string(), "{path}: an error says why: {v}");
        }
        asked += 1;
    }
    assert_eq!(asked, openapi::ROUTES.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_s_refusals_of_reruns_and_retries_have_their_statuses() {
    let b = Bench::new("refusals");
    let yaml = "version: 1\nname: chain\nstages:\n  a:\n    run: {command: [ok]}\n  b:\n    needs: [a]\n    run: {command: [ok]}\n";
    let run = b.ended_run(yaml).await;
    let rerun = format!("/api/v1/runs/{run}/rerun");
    // Rerun: what to execute is named; an unknown stage is the request's fault.
    let (code, v) = b.call("post", &rerun, Some(json!({}))).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    let (code, v) = b
        .call("post", &rerun, Some(json!({"stages": ["bb"]})))
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("no stage named `bb`"),
        "{v}"
    );
    // Retry of a run whose stages all succeeded: nothing to do, said as a conflict.
    let (code, v) = b
        .call("post", &format!("/api/v1/runs/{run}/retry"), None)
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("nothing to retry"),
        "{v}"
    );
    // No such run.
    let (code, _) = b.call("post", "/api/v1/runs/no-such-run/retry", None).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    // A rerun that the engine accepts runs in this process, linked to its parent.
    let (code, v) = b.call("post", &rerun, Some(json!({"stages": ["b"]}))).await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
    assert_eq!(v["parent"], run.as_str());
    assert_eq!(v["trigger"], "rerun");
}

/// A cancel in the window after an approval is decided, when the run is claimed to be
/// resumed but its engine has not started (issue 46: answered 404 and lost, and the
/// stages after the gate ran): accepted, and the run starts cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_between_the_deciding_vote_and_the_resume_wins() {
    use drivetrain_engine::state::{Phase, RunId, Vote};
    let b = Bench::new("cancel-claimed");
    let yaml = "version: 1\nname: gated\nstages:\n  gate:\n    approval: {approvers: {role: safety, min: 1}}\n  after:\n    needs: [gate]\n    run: {command: [ok]}\n";
    let (code, v) = b
        .call("post", "/api/v1/runs", Some(json!({ "yaml": yaml })))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
    let run = RunId(v["run"].as_str().unwrap().to_owned());
    let state = b.server.engine.state().clone();
    for _ in 0..200 {
        if state.run(&run).unwrap().phase == Phase::Waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state.run(&run).unwrap().phase, Phase::Waiting);
    // The deciding vote, and the run claimed as the server's vote route claims it.
    let vote = Vote {
        subject: "token:alice".into(),
        decision: "approve".into(),
        comment: None,
        at: drivetrain_engine::state::now(),
    };
    state.vote(&run, "gate", &vote).unwrap().unwrap();
    assert!(state.take_decided(&run).unwrap());
    let (code, v) = b
        .call("post", &format!("/api/v1/runs/{run}/cancel"), None)
        .await;
    assert_eq!(code, StatusCode::ACCEPTED, "{v}");
    b.server.resume(std::slice::from_ref(&run)).await.unwrap();
    for _ in 0..200 {
        if state.run(&run).unwrap().phase.is_terminal() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state.run(&run).unwrap().phase, Phase::Cancelled);
    let after = state.stage(&run, "after").unwrap();
    assert!(
        after.as_ref().is_none_or(|s| s.phase != Phase::Succeeded),
        "the stage after the gate did not run: {after:?}"
    );
    // A run that does not exist is still 404.
    let (code, _) = b
        .call("post", "/api/v1/runs/no-such-run/cancel", None)
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

/// A request sent again with its `Idempotency-Key` gets the first answer and starts
/// nothing more, also when the copies race; the key with another request is refused;
/// a request whose server died after starting its run is answered with that run (issue
/// 46: a client that never heard its answer started the run twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_key_starts_one_run() {
    use drivetrain_engine::state::{KeyClaim, RunId};
    let b = Bench::new("keys");
    let yaml = "version: 1\nname: keyed\nstages:\n  a:\n    run: {command: [ok]}\n";
    let body = json!({ "yaml": yaml });
    let runs = "/api/v1/runs";
    let (code, first, replayed) = b.keyed("post", runs, Some(body.clone()), Some("k-1")).await;
    assert_eq!((code, replayed), (StatusCode::CREATED, false), "{first}");
    let (code, again, replayed) = b.keyed("post", runs, Some(body.clone()), Some("k-1")).await;
    assert_eq!((code, replayed), (StatusCode::CREATED, true), "{again}");
    assert_eq!(again, first);
    let (code, v, _) = b
        .keyed(
            "post",
            runs,
            Some(json!({"yaml": yaml, "params": {}})),
            Some("k-1"),
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("another request"),
        "{v}"
    );
    let (code, v, _) = b
        .keyed("post", runs, Some(body.clone()), Some("bad key"))
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    // Eight copies at once: one run, every answer names it (or says to retry).
    let copies = (0..8).map(|_| b.keyed("post", runs, Some(body.clone()), Some("k-race")));
    let answers = futures::future::join_all(copies).await;
    let named: std::collections::BTreeSet<String> = answers
        .iter()
        .filter(|(code, _, _)| *code == StatusCode::CREATED)
        .map(|(_, v, _)| v["run"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(named.len(), 1, "{answers:?}");
    assert!(answers
        .iter()
        .all(|(c, _, _)| [StatusCode::CREATED, StatusCode::CONFLICT].contains(c)));
    let state = b.server.engine.state().clone();
    let keyed_runs = state
        .list_runs(100)
        .unwrap()
        .into_iter()
        .filter(|r| r.pipeline == "keyed")
        .count();
    assert_eq!(keyed_runs, 2, "k-1's run and k-race's, nothing more");
    // A retry with a key, twice: one new run.
    let parent = first["run"].as_str().unwrap();
    let retry = format!("/api/v1/runs/{parent}/rerun");
    let stages = json!({"stages": ["a"]});
    let (code, r1, _) = b
        .keyed("post", &retry, Some(stages.clone()), Some("k-2"))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{r1}");
    let (_, r2, replayed) = b.keyed("post", &retry, Some(stages), Some("k-2")).await;
    assert!(replayed && r1 == r2, "{r1} {r2}");
    // A claim left unanswered by a server that died after starting its run: the run.
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    digest.update(format!("POST {runs}\n{body}"));
    let claim = KeyClaim {
        scope: "token:admin".into(),
        key: "k-died".into(),
        fingerprint: hex::encode(digest.finalize()),
        run: RunId(parent.to_owned()),
        claimed_at: drivetrain_engine::state::now(),
    };
    let scope = b.keyed("get", "/api/v1/whoami", None, None).await.1["subject"].clone();
    let claim = KeyClaim {
        scope: scope.as_str().unwrap().to_owned(),
        ..claim
    };
    assert_eq!(state.claim_key(&claim).unwrap(), None);
    let (code, v, replayed) = b.keyed("post", runs, Some(body), Some("k-died")).await;
    assert_eq!((code, replayed), (StatusCode::CREATED, true), "{v}");
    assert_eq!(v["run"], parent);
}

/// YAML posted to the server has no folder: a relative `workdir` or `{{ pipeline.dir }}`
/// is refused with where it is written (issue 47), and an absolute one runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_yaml_has_no_folder_to_read_scripts_from() {
    let b = Bench::new("folder");
    let yaml = "version: 1\nname: beside\nstages:\n  train:\n    run: {workdir: ., command: [ok]}\n  named:\n    env: {SCRIPTS: \"{{ pipeline.dir }}/scripts\"}\n    run: {command: [ok]}\n";
    let (code, v) = b
        .call("post", "/api/v1/runs", Some(json!({ "yaml": yaml })))
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("stages.train.run.workdir, stages.named.env.SCRIPTS")
            && error.contains("has none"),
        "{v}"
    );
    let absolute =
        "version: 1\nname: beside\nstages:\n  train:\n    run: {workdir: /, command: [ok]}\n";
    let (code, v) = b
        .call("post", "/api/v1/runs", Some(json!({ "yaml": absolute })))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
}

/// A run keeps its graph when the pipeline it ran is gone from disk (issue 47: every
/// stage sat in one column without edges), and a rerun runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_keeps_its_graph_without_its_file() {
    let b = Bench::new("kept-graph");
    let yaml = "version: 1\nname: kept\nstages:\n  a:\n    run: {command: [ok]}\n  b:\n    needs: [a]\n    run: {command: [ok]}\n";
    let run = b.ended_run(yaml).await;
    let record = b
        .server
        .engine
        .state()
        .run(&drivetrain_engine::state::RunId(run.clone()))
        .unwrap();
    std::fs::remove_file(&record.file).unwrap();
    let (code, g) = b
        .call("get", &format!("/api/v1/runs/{run}/graph"), None)
        .await;
    assert_eq!(code, StatusCode::OK, "{g}");
    assert_eq!(g["note"], Value::Null, "{g}");
    let b_node = g["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "b")
        .unwrap()
        .clone();
    assert_eq!(b_node["needs"], json!(["a"]), "{g}");
    let (code, v) = b
        .call(
            "post",
            &format!("/api/v1/runs/{run}/rerun"),
            Some(json!({"stages": ["b"]})),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
}
