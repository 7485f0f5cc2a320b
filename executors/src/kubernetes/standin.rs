//! A Kubernetes API stand-in for tests: an HTTP server on loopback that the real kube-rs
//! client talks to, so the client's HTTP, watcher (list, watch, `410 Gone`, relist) and
//! backoff paths all run. It is not a cluster; it serves the API paths and semantics the
//! kubernetes executor uses and nothing more:
//!
//! - create (`409 AlreadyExists` for a taken name), get, list and watch with label
//!   (`k=v`) and `metadata.name` field selectors, `resourceVersion`s, and a watch that
//!   starts from a compacted version answers `410 Gone` (an `ERROR` event, as the real
//!   API server does);
//! - delete with propagation: dependents (by `ownerReferences`) go too, and pods' processes
//!   are stopped (SIGTERM, then SIGKILL);
//! - a Job controller and a kubelet in one: pods are created for a Job (one per index of
//!   an Indexed Job), scheduled against one node (its labels and GPU count are
//!   settings; a pod that does not fit stays Pending with `PodScheduled=False,
//!   reason=Unschedulable`), and their init containers and main container run as **local
//!   processes** with the container's argv and env. Volume mounts are emulated by
//!   rewriting each mount path to a host directory in argv, env and the working
//!   directory (emptyDirs per pod, claims shared by name). An image on the `.invalid`
//!   top-level domain cannot be pulled (`ImagePullBackOff`); a container killed by
//!   SIGKILL is reported `OOMKilled` with exit code 137 (how the kubelet reports a cgroup
//!   OOM kill); `activeDeadlineSeconds` fails the Job with `DeadlineExceeded`;
//!   `backoffLimit` is taken as 0 (the engine owns retries); a suspended Job never starts
//!   (there is no Kueue here);
//! - pod logs: `GET …/pods/NAME/log?follow=true` streams the container's output.
//!
//! The executor's code is the same against a real cluster.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

/// The stand-in's node: what pods are scheduled against.
#[derive(Debug, Clone)]
pub struct Node {
    pub labels: BTreeMap<String, String>,
    /// `nvidia.com/gpu` allocatable.
    pub gpus: u64,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            labels: BTreeMap::from([
                ("kubernetes.io/hostname".into(), "standin".into()),
                ("kubernetes.io/os".into(), "linux".into()),
            ]),
            gpus: 0,
        }
    }
}

/// A running stand-in; dropped, it stops serving (pods' processes are killed).
#[derive(Debug)]
pub struct StandIn {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.server.abort();
        let procs: Vec<_> = self
            .shared
            .inner
            .lock()
            .unwrap()
            .procs
            .values()
            .cloned()
            .collect();
        for p in procs {
            let _ = p.send(true);
        }
    }
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Change>,
    node: Node,
    dir: PathBuf,
}

/// A stored change, for watches.
#[derive(Debug, Clone)]
enum Change {
    Event {
        rv: u64,
        resource: String,
        kind: &'static str,
        object: Value,
    },
    /// Ends every open watch (what an API server restart or a timeout does).
    Drop,
}

#[derive(Debug, Default)]
struct Inner {
    rv: u64,
    uid: u64,
    /// (resource, namespace, name) → object; resource is `group/version/plural`.
    objects: BTreeMap<(String, String, String), Value>,
    history: Vec<Change>,
    /// Watches from before this version answer 410 Gone.
    compacted: u64,
    /// Objects created (not `AlreadyExists`), per resource.
    created: BTreeMap<String, usize>,
    /// Kill switches of pods' processes.
    procs: BTreeMap<String, watch::Sender<bool>>,
    logs: BTreeMap<String, Arc<LogBuf>>,
}

#[derive(Debug)]
struct LogBuf {
    data: Mutex<Vec<u8>>,
    /// (length, done)
    state: watch::Sender<(usize, bool)>,
}

impl LogBuf {
    fn new() -> Arc<LogBuf> {
        Arc::new(LogBuf {
            data: Mutex::new(Vec::new()),
            state: watch::channel((0, false)).0,
        })
    }

    fn push(&self, bytes: &[u8]) {
        let mut d = self.data.lock().unwrap();
        d.extend_from_slice(bytes);
        let len = d.len();
        self.state.send_modify(|s| s.0 = len);
    }

    fn close(&self) {
        self.state.send_modify(|s| s.1 = true);
    }
}

const JOBS: &str = "batch/v1/jobs";
const PODS: &str = "/v1/pods";
const SECRETS: &str = "/v1/secrets";

impl StandIn {
    /// Starts a stand-in with one node, keeping pods' files under `dir`.
    pub async fn start(dir: &Path, node: Node) -> StandIn {
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            events,
            node,
            dir: dir.to_path_buf(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StandIn {
            url,
            shared,
            server,
        }
    }

    /// A kube client for this stand-in (what a kubeconfig with `server: URL` gives).
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().expect("url"));
        kube::Client::try_from(config).expect("client")
    }

    /// A kubeconfig file pointing at the stand-in.
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster: {{server: \"{}\"}}\ncontexts:\n- name: standin\n  context: {{cluster: standin, user: standin, namespace: default}}\ncurrent-context: standin\nusers:\n- name: standin\n  user: {{}}\n",
            self.url
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// Forgets the change history and ends every open watch: a watch resumed from an
    /// older `resourceVersion` then answers `410 Gone`.
    pub fn compact(&self) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.compacted = inner.rv + 1;
        inner.history.clear();
        let _ = self.shared.events.send(Change::Drop);
    }

    /// How many objects of `resource` (`batch/v1/jobs`, `/v1/pods`, …) were created.
    pub fn created(&self, resource: &str) -> usize {
        let inner = self.shared.inner.lock().unwrap();
        inner.created.get(resource).copied().unwrap_or(0)
    }

    /// The stored objects of `resource`.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let inner = self.shared.inner.lock().unwrap();
        inner
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Evicts a running Job as Kueue does when it preempts its workload: `spec.suspend`
    /// set again, its pods deleted (their processes get SIGTERM, then SIGKILL). Whether
    /// the Job existed.
    pub fn suspend_job(&self, ns: &str, name: &str) -> bool {
        let s = &self.shared;
        let Some(job) = s.update(JOBS, ns, name, |j| j["spec"]["suspend"] = json!(true)) else {
            return false;
        };
        let uid = job["metadata"]["uid"].clone();
        let pods: Vec<String> = self
            .objects(PODS)
            .into_iter()
            .filter(|p| {
                p["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|os| os.iter().any(|o| o["uid"] == uid))
            })
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        for pod in pods {
            s.delete(PODS, ns, &pod);
        }
        true
    }

    /// Stores a Secret with one key.
    pub fn put_secret(&self, ns: &str, name: &str, key: &str, value: &str) {
        // Kept as `stringData` (the real API server would encode it into `data`).
        let object = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns},
            "stringData": {key: value},
        });
        self.shared.store(SECRETS, ns, name, object, "ADDED");
    }
}

impl Shared {
    fn next_rv(inner: &mut Inner) -> u64 {
        inner.rv += 1;
        inner.rv
    }

    /// Stores `object` under a new resourceVersion and tells the watches.
    fn store(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        mut object: Value,
        kind: &'static str,
    ) -> Value {
        let mut inner = self.inner.lock().unwrap();
        let rv = Shared::next_rv(&mut inner);
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if kind == "DELETED" {
            inner
                .objects
                .remove(&(resource.to_owned(), ns.to_owned(), name.to_owned()));
        } else {
            inner.objects.insert(
                (resource.to_owned(), ns.to_owned(), name.to_owned()),
                object.clone(),
            );
        }
        let change = Change::Event {
            rv,
            resource: resource.to_owned(),
            kind,
            object: object.clone(),
        };
        inner.history.push(change.clone());
        let _ = self.events.send(change);
        object
    }

    fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let inner = self.inner.lock().unwrap();
        inner
            .objects
            .get(&(resource.to_owned(), ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Applies `f` to a stored object and stores it again (if it still exists).
    fn update(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut object = self.get(resource, ns, name)?;
        f(&mut object);
        Some(self.store(resource, ns, name, object, "MODIFIED"))
    }

    /// Deletes an object and everything that names it as owner; stops pods' processes.
    fn delete(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let object = self.get(resource, ns, name)?;
        let uid = object["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        let dependents: Vec<(String, String, String)> = {
            let inner = self.inner.lock().unwrap();
            inner
                .objects
                .iter()
                .filter(|(_, v)| {
                    v["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|os| os.iter().any(|o| o["uid"] == json!(uid)))
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        for (r, n, d) in dependents {
            self.delete(&r, &n, &d);
        }
        if resource == PODS {
            let kill = self.inner.lock().unwrap().procs.remove(name);
            if let Some(k) = kill {
                let _ = k.send(true);
            }
        }
        let mut gone = object;
        gone["metadata"]["deletionTimestamp"] = json!(now());
        Some(self.store(resource, ns, name, gone, "DELETED"))
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `(resource, namespace, name, subresource)` of an API path.
fn parse_path(path: &str) -> Option<(String, String, Option<String>, Option<String>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    match rest {
        ["namespaces", ns, plural, tail @ ..] => Some((
            format!("{group}/{version}/{plural}"),
            ns.to_string(),
            tail.first().map(|s| s.to_string()),
            tail.get(1).map(|s| s.to_string()),
        )),
        _ => None,
    }
}

fn selected(object: &Value, labels: Option<&str>, fields: Option<&str>) -> bool {
    let label_ok = labels.is_none_or(|sel| {
        sel.split(',').filter(|s| !s.is_empty()).all(|term| {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            object["metadata"]["labels"][k].as_str() == Some(v)
        })
    });
    let field_ok = fields.is_none_or(|sel| {
        sel.split(',')
            .filter(|s| !s.is_empty())
            .all(|term| match term.split_once('=') {
                Some(("metadata.name", v)) => object["metadata"]["name"].as_str() == Some(v),
                Some(("metadata.namespace", v)) => {
                    object["metadata"]["namespace"].as_str() == Some(v)
                }
                _ => false,
            })
    });
    label_ok && field_ok
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some((resource, ns, name, sub)) = parse_path(uri.path()) else {
        return status(
            404,
            "NotFound",
            format!("the stand-in does not serve {}", uri.path()),
        );
    };
    let labels = query.get("labelSelector").map(String::as_str);
    let fields = query.get("fieldSelector").map(String::as_str);
    match (method, name, sub) {
        (Method::POST, None, None) => create(&shared, resource, ns, &body),
        (Method::GET, None, None)
            if query.get("watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            let from: u64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .unwrap_or(290u64);
            watch_response(
                shared,
                resource,
                ns,
                labels.map(str::to_owned),
                fields.map(str::to_owned),
                from,
                timeout,
            )
        }
        (Method::GET, None, None) => {
            let inner = shared.inner.lock().unwrap();
            let items: Vec<Value> = inner
                .objects
                .iter()
                .filter(|((r, n, _), v)| *r == resource && *n == ns && selected(v, labels, fields))
                .map(|(_, v)| v.clone())
                .collect();
            let kind = items
                .first()
                .and_then(|i| i["kind"].as_str())
                .map(|k| format!("{k}List"))
                .unwrap_or_else(|| "List".into());
            ok(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items}),
            )
        }
        (Method::GET, Some(name), None) => match shared.get(&resource, &ns, &name) {
            Some(o) => ok(StatusCode::OK, &o),
            None => status(404, "NotFound", format!("{resource} \"{name}\" not found")),
        },
        (Method::DELETE, Some(name), None) => match shared.delete(&resource, &ns, &name) {
            Some(o) => ok(StatusCode::OK, &o),
            None => status(404, "NotFound", format!("{resource} \"{name}\" not found")),
        },
        (Method::GET, Some(name), Some(sub)) if sub == "log" && resource == PODS => {
            let follow = query.get("follow").is_some_and(|f| f == "true");
            pod_log(&shared, &name, follow)
        }
        (m, _, _) => status(
            405,
            "MethodNotAllowed",
            format!("the stand-in does not serve {m} {}", uri.path()),
        ),
    }
}

/// `POST`: stores a new object (a Job also starts running).
fn create(shared: &Arc<Shared>, resource: String, ns: String, body: &Bytes) -> Response {
    let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not JSON".into());
    };
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name is required".into());
    };
    if shared.get(&resource, &ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        );
    }
    {
        let mut inner = shared.inner.lock().unwrap();
        inner.uid += 1;
        object["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", inner.uid));
        *inner.created.entry(resource.clone()).or_default() += 1;
    }
    object["metadata"]["namespace"] = json!(ns);
    object["metadata"]["creationTimestamp"] = json!(now());
    let stored = shared.store(&resource, &ns, &name, object, "ADDED");
    if resource == JOBS {
        tokio::spawn(run_job(shared.clone(), ns, name));
    }
    ok(StatusCode::CREATED, &stored)
}

/// `GET …/pods/NAME/log[?follow=true]`: what the pod wrote, to its end when followed.
fn pod_log(shared: &Arc<Shared>, name: &str, follow: bool) -> Response {
    let buf = shared.inner.lock().unwrap().logs.get(name).cloned();
    let Some(buf) = buf else {
        return status(
            400,
            "BadRequest",
            format!("container in pod \"{name}\" is waiting to start"),
        );
    };
    let rx = buf.state.subscribe();
    let stream =
        futures::stream::unfold((buf, rx, 0usize), move |(buf, mut rx, offset)| async move {
            loop {
                let (len, done) = *rx.borrow_and_update();
                if len > offset {
                    let chunk = buf.data.lock().unwrap()[offset..len].to_vec();
                    return Some((Ok::<_, Infallible>(Bytes::from(chunk)), (buf, rx, len)));
                }
                if done || !follow || rx.changed().await.is_err() {
                    return None;
                }
            }
        });
    Response::builder()
        .header("content-type", "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

fn watch_response(
    shared: Arc<Shared>,
    resource: String,
    ns: String,
    labels: Option<String>,
    fields: Option<String>,
    from: u64,
    timeout: u64,
) -> Response {
    let (backlog, rx, gone) = {
        let inner = shared.inner.lock().unwrap();
        let rx = shared.events.subscribe();
        if from < inner.compacted {
            (Vec::new(), rx, true)
        } else {
            let backlog: Vec<Change> = inner
                .history
                .iter()
                .filter(|c| matches!(c, Change::Event { rv, .. } if *rv > from))
                .cloned()
                .collect();
            (backlog, rx, false)
        }
    };
    let line = |kind: &str, object: &Value| {
        Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
    };
    if gone {
        let expired = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410});
        let body = line("ERROR", &expired);
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap_or_default();
    }
    let matches = move |c: &Change| -> Option<Bytes> {
        match c {
            Change::Event {
                resource: r,
                kind,
                object,
                ..
            } if *r == resource
                && object["metadata"]["namespace"].as_str() == Some(&ns)
                && selected(object, labels.as_deref(), fields.as_deref()) =>
            {
                Some(line(kind, object))
            }
            _ => None,
        }
    };
    let first: Vec<Bytes> = backlog.iter().filter_map(&matches).collect();
    let live = futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(Change::Drop) | Err(_) => None,
            Ok(c) => Some((c, rx)),
        }
    })
    .filter_map(move |c| futures::future::ready(matches(&c)));
    let deadline = tokio::time::sleep(Duration::from_secs(timeout));
    let stream = futures::stream::iter(first)
        .chain(live)
        .take_until(deadline)
        .map(Ok::<_, Infallible>);
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

fn condition(kind: &str, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": "True", "reason": reason, "message": message,
           "lastTransitionTime": now(), "lastProbeTime": now()})
}

/// The Job controller: pods for the Job, then its status from theirs.
async fn run_job(shared: Arc<Shared>, ns: String, name: String) {
    // A suspended Job (queued by Kueue) starts when resumed; there is no Kueue here.
    loop {
        match shared.get(JOBS, &ns, &name) {
            None => return,
            Some(j) if j["spec"]["suspend"] == json!(true) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(_) => break,
        }
    }
    let Some(job) = shared.get(JOBS, &ns, &name) else {
        return;
    };
    let spec = &job["spec"];
    let indexed = spec["completionMode"] == json!("Indexed");
    let count = spec["parallelism"].as_u64().unwrap_or(1).max(1);
    let deadline = spec["activeDeadlineSeconds"].as_u64();
    shared.update(JOBS, &ns, &name, |j| {
        j["status"] = json!({"startTime": now(), "active": count});
    });
    let mut tasks = Vec::new();
    for index in 0..count {
        let (pod_name, pod) = job_pod(&job, &ns, &name, index, indexed);
        {
            let mut inner = shared.inner.lock().unwrap();
            *inner.created.entry(PODS.into()).or_default() += 1;
        }
        shared.store(PODS, &ns, &pod_name, pod, "ADDED");
        tasks.push(tokio::spawn(run_pod(shared.clone(), ns.clone(), pod_name)));
    }
    let all = futures::future::join_all(tasks);
    let outcome = match deadline {
        Some(secs) => tokio::time::timeout(Duration::from_secs(secs), all)
            .await
            .ok(),
        None => Some(all.await),
    };
    let results: Option<Vec<Option<bool>>> =
        outcome.map(|rs| rs.into_iter().map(|r| r.ok().flatten()).collect());
    match results {
        None => fail_past_deadline(&shared, &ns, &name, count),
        Some(rs) if rs.iter().any(|r| r.is_none()) => {} // a pod was deleted: so was the Job
        Some(rs) => complete(&shared, &ns, &name, &rs),
    }
}

/// Pod `index` of Job `name` (its own name and object), as the Job controller makes it.
fn job_pod(job: &Value, ns: &str, name: &str, index: u64, indexed: bool) -> (String, Value) {
    let pod_name = if indexed {
        format!("{name}-{index}-{:05x}", rand_suffix(index))
    } else {
        format!("{name}-{:05x}", rand_suffix(index))
    };
    let mut labels = job["spec"]["template"]["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["job-name"] = json!(name);
    let mut annotations = job["spec"]["template"]["metadata"]["annotations"].clone();
    if !annotations.is_object() {
        annotations = json!({});
    }
    if indexed {
        annotations["batch.kubernetes.io/job-completion-index"] = json!(index.to_string());
    }
    let mut pod_spec = job["spec"]["template"]["spec"].clone();
    if indexed {
        pod_spec["hostname"] = json!(format!("{name}-{index}"));
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels, "annotations": annotations,
            "uid": format!("pod-{pod_name}"), "creationTimestamp": now(),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                "uid": job["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
        "spec": pod_spec,
        "status": {"phase": "Pending"},
    });
    (pod_name, pod)
}

/// Past `activeDeadlineSeconds`: stops the Job's pods and fails it.
fn fail_past_deadline(shared: &Arc<Shared>, ns: &str, name: &str, count: u64) {
    // Past activeDeadlineSeconds: stop the pods, fail the Job.
    let pods: Vec<String> = shared
        .inner
        .lock()
        .unwrap()
        .objects
        .iter()
        .filter(|((r, n, _), v)| {
            r == PODS && n == ns && v["metadata"]["labels"]["job-name"] == json!(name)
        })
        .map(|((_, _, p), _)| p.clone())
        .collect();
    for p in pods {
        shared.delete(PODS, ns, &p);
    }
    shared.update(JOBS, ns, name, |j| {
        j["status"]["active"] = json!(0);
        j["status"]["failed"] = json!(count);
        j["status"]["conditions"] = json!([
            condition(
                "FailureTarget",
                "DeadlineExceeded",
                "Job was active longer than specified deadline"
            ),
            condition(
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline"
            ),
        ]);
    });
}

/// Every pod ended: the Job completes, or fails at its backoff limit.
fn complete(shared: &Arc<Shared>, ns: &str, name: &str, rs: &[Option<bool>]) {
    let succeeded = rs.iter().filter(|r| **r == Some(true)).count();
    let failed = rs.len() - succeeded;
    shared.update(JOBS, ns, name, |j| {
        j["status"]["active"] = json!(0);
        j["status"]["succeeded"] = json!(succeeded);
        j["status"]["failed"] = json!(failed);
        j["status"]["completionTime"] = json!(now());
        j["status"]["conditions"] = if failed == 0 {
            json!([
                condition(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods"
                ),
                condition(
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods"
                )
            ])
        } else {
            json!([
                condition(
                    "FailureTarget",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit"
                ),
                condition(
                    "Failed",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit"
                )
            ])
        };
    });
}

fn rand_suffix(index: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    (nanos ^ (index.wrapping_mul(0x9e37_79b9))) & 0xfffff
}

/// Why a pod cannot be placed on the node, if it cannot.
fn unschedulable(node: &Node, spec: &Value) -> Option<String> {
    let wanted_gpus: u64 = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["resources"]["limits"]["nvidia.com/gpu"].as_str())
        .filter_map(|g| g.parse::<u64>().ok())
        .sum();
    if wanted_gpus > node.gpus {
        return Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.".into());
    }
    let selector_ok = spec["nodeSelector"].as_object().is_none_or(|m| {
        m.iter()
            .all(|(k, v)| node.labels.get(k).map(String::as_str) == v.as_str())
    });
    if !selector_ok {
        return Some(
            "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.".into(),
        );
    }
    None
}

/// The kubelet: runs one pod's containers as local processes. `Some(succeeded)`, or
/// `None` if the pod was deleted first.
async fn run_pod(shared: Arc<Shared>, ns: String, pod: String) -> Option<bool> {
    let spec = shared.get(PODS, &ns, &pod)?["spec"].clone();
    if let Some(message) = unschedulable(&shared.node, &spec) {
        shared.update(PODS, &ns, &pod, |p| {
            p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": message, "lastTransitionTime": now()}]);
        });
        // Stays Pending until deleted.
        let (tx, mut rx) = watch::channel(false);
        shared.inner.lock().unwrap().procs.insert(pod.clone(), tx);
        let _ = rx.changed().await;
        return None;
    }
    let main = spec["containers"][0].clone();
    let image = main["image"].as_str().unwrap_or("");
    if image.split('/').next().unwrap_or("").ends_with(".invalid") {
        shared.update(PODS, &ns, &pod, |p| {
            p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True"}]);
            p["status"]["containerStatuses"] = json!([{"name": main["name"], "image": image, "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                    "message": format!("Back-off pulling image \"{image}\"")}}}]);
        });
        let (tx, mut rx) = watch::channel(false);
        shared.inner.lock().unwrap().procs.insert(pod.clone(), tx);
        let _ = rx.changed().await;
        return None;
    }
    let pod_dir = shared.dir.join("pods").join(&pod);
    let mounts = match mount_table(&shared, &ns, &spec, &pod_dir) {
        Ok(m) => m,
        Err(message) => {
            shared.update(PODS, &ns, &pod, |p| {
                p["status"]["containerStatuses"] = json!([{"name": main["name"], "image": image, "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}]);
            });
            let (tx, mut rx) = watch::channel(false);
            shared.inner.lock().unwrap().procs.insert(pod.clone(), tx);
            let _ = rx.changed().await;
            return None;
        }
    };
    let (kill_tx, kill_rx) = watch::channel(false);
    let log = LogBuf::new();
    {
        let mut inner = shared.inner.lock().unwrap();
        inner.procs.insert(pod.clone(), kill_tx);
        inner.logs.insert(pod.clone(), log.clone());
    }
    shared.update(PODS, &ns, &pod, |p| {
        p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True"}]);
        p["status"]["phase"] = json!("Pending");
        p["status"]["hostIP"] = json!("127.0.0.1");
    });
    let object = shared.get(PODS, &ns, &pod)?;
    let init_log = LogBuf::new();
    for init in spec["initContainers"].as_array().into_iter().flatten() {
        match run_container(
            &shared,
            &ns,
            &object,
            init,
            &mounts,
            &init_log,
            kill_rx.clone(),
        )
        .await
        {
            Ok(0) => {}
            Ok(code) | Err(code) => {
                finish_pod(&shared, &ns, &pod, &main, code, "Init:Error", &log);
                return Some(false);
            }
        }
    }
    shared.update(PODS, &ns, &pod, |p| {
        p["status"]["phase"] = json!("Running");
        p["status"]["startTime"] = json!(now());
        p["status"]["containerStatuses"] = json!([{"name": main["name"], "image": image, "imageID": "",
            "ready": true, "restartCount": 0, "started": true,
            "state": {"running": {"startedAt": now()}}}]);
    });
    let result = run_container(&shared, &ns, &object, &main, &mounts, &log, kill_rx).await;
    let deleted = shared.get(PODS, &ns, &pod).is_none();
    let (code, reason) = match result {
        Ok(0) => (0, "Completed"),
        Ok(code) => (code, "Error"),
        Err(137) => (137, "OOMKilled"),
        Err(code) => (code, "Error"),
    };
    log.close();
    if deleted {
        return None;
    }
    finish_pod(&shared, &ns, &pod, &main, code, reason, &log);
    Some(code == 0)
}

fn finish_pod(
    shared: &Shared,
    ns: &str,
    pod: &str,
    main: &Value,
    code: i32,
    reason: &str,
    log: &LogBuf,
) {
    log.close();
    shared.inner.lock().unwrap().procs.remove(pod);
    shared.update(PODS, ns, pod, |p| {
        p["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
        p["status"]["containerStatuses"] = json!([{"name": main["name"], "image": main["image"], "imageID": "",
            "ready": false, "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": now(), "finishedAt": now()}}}]);
    });
}

/// Mount path → host directory, longest first, for the pod's volumes.
fn mount_table(
    shared: &Shared,
    ns: &str,
    spec: &Value,
    pod_dir: &Path,
) -> Result<Vec<(String, PathBuf, String)>, String> {
    let mut volumes = BTreeMap::new();
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("").to_owned();
        let host = if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
            shared.dir.join("claims").join(claim)
        } else if v["emptyDir"]["medium"] == json!("Memory") {
            // /dev/shm: the host's own.
            continue;
        } else if let Some(secret) = v["secret"]["secretName"].as_str() {
            let dir = pod_dir.join("secrets").join(secret);
            let data = shared
                .get(SECRETS, ns, secret)
                .ok_or_else(|| format!("secret \"{secret}\" not found"))?;
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            for (k, val) in data["stringData"].as_object().into_iter().flatten() {
                std::fs::write(dir.join(k), val.as_str().unwrap_or(""))
                    .map_err(|e| e.to_string())?;
            }
            dir
        } else {
            pod_dir.join("volumes").join(&name)
        };
        std::fs::create_dir_all(&host).map_err(|e| e.to_string())?;
        volumes.insert(name, host);
    }
    let mut table = Vec::new();
    for c in spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(spec["containers"].as_array().into_iter().flatten())
    {
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(path), Some(name)) = (m["mountPath"].as_str(), m["name"].as_str()) else {
                continue;
            };
            if let Some(host) = volumes.get(name) {
                let container = c["name"].as_str().unwrap_or("").to_owned();
                table.push((path.to_owned(), host.clone(), container));
            }
        }
    }
    table.sort_by_key(|(p, _, _)| std::cmp::Reverse(p.len()));
    Ok(table)
}

/// `text` with each of `container`'s mount paths replaced by its host directory (where the
/// path is the whole text or a prefix of a longer path within it).
fn rewrite(text: &str, mounts: &[(String, PathBuf, String)], container: &str) -> String {
    let mine: Vec<_> = mounts.iter().filter(|(_, _, c)| c == container).collect();
    if let Some((_, host, _)) = mine.iter().find(|(p, _, _)| p == text) {
        return host.display().to_string();
    }
    // Placeholders first, so a host path is never rewritten again.
    let mut out = text.to_owned();
    for (i, (path, _, _)) in mine.iter().enumerate() {
        out = out.replace(&format!("{path}/"), &format!("\u{0}{i}\u{0}/"));
    }
    for (i, (_, host, _)) in mine.iter().enumerate() {
        out = out.replace(&format!("\u{0}{i}\u{0}/"), &format!("{}/", host.display()));
    }
    out
}

/// Runs one container to its end: `Ok(exit code)`, or `Err(code)` when a signal ended it.
async fn run_container(
    shared: &Shared,
    ns: &str,
    pod: &Value,
    container: &Value,
    mounts: &[(String, PathBuf, String)],
    log: &Arc<LogBuf>,
    mut kill: watch::Receiver<bool>,
) -> Result<i32, i32> {
    let name = container["name"].as_str().unwrap_or("");
    let mut argv: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(container["args"].as_array().into_iter().flatten())
        .filter_map(|a| a.as_str().map(|s| rewrite(s, mounts, name)))
        .collect();
    if argv.is_empty() {
        // The image's own entrypoint: nothing to run here.
        argv = vec!["true".into()];
    }
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.env_clear();
    for k in ["PATH", "HOME", "LANG", "TZ"] {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
    cmd.env(
        "HOSTNAME",
        pod["spec"]["hostname"]
            .as_str()
            .or(pod["metadata"]["name"].as_str())
            .unwrap_or(""),
    );
    for e in container["env"].as_array().into_iter().flatten() {
        let Some(k) = e["name"].as_str() else {
            continue;
        };
        let value = if let Some(v) = e["value"].as_str() {
            Some(rewrite(v, mounts, name))
        } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            field_value(pod, field)
        } else if let Some(sel) = e["valueFrom"]["secretKeyRef"].as_object() {
            let secret = sel.get("name").and_then(|v| v.as_str()).unwrap_or("");
            let key = sel.get("key").and_then(|v| v.as_str()).unwrap_or("");
            shared
                .get(SECRETS, ns, secret)
                .and_then(|s| s["stringData"][key].as_str().map(str::to_owned))
        } else {
            None
        };
        if let Some(v) = value {
            cmd.env(k, v);
        }
    }
    if let Some(w) = container["workingDir"].as_str() {
        cmd.current_dir(rewrite(w, mounts, name));
    }
    cmd.stdout(std::process::Stdio::piped());
    cmd.stderr(std::process::Stdio::piped());
    cmd.stdin(std::process::Stdio::null());
    cmd.process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            log.push(format!("exec {}: {e}\n", argv[0]).as_bytes());
            eprintln!("stand-in: container {name}: exec {argv:?}: {e}");
            return Ok(128);
        }
    };
    let pgid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let pump = |r: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>, log: Arc<LogBuf>| {
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            let Some(mut r) = r else { return };
            let mut buf = [0u8; 8192];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                log.push(&buf[..n]);
            }
        })
    };
    let out = pump(child.stdout.take().map(|s| Box::new(s) as _), log.clone());
    let err = pump(child.stderr.take().map(|s| Box::new(s) as _), log.clone());
    let status = tokio::select! {
        s = child.wait() => s,
        _ = async { kill.wait_for(|k| *k).await.is_ok() } => {
            if let Some(pg) = pgid {
                let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM);
                if tokio::time::timeout(Duration::from_secs(2), child.wait()).await.is_err() {
                    let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
                }
            }
            child.wait().await
        }
    };
    let _ = out.await;
    let _ = err.await;
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => Ok(c),
            (None, Some(sig)) => Err(128 + sig),
            _ => Err(1),
        },
        Err(_) => Err(1),
    }
}

fn field_value(pod: &Value, path: &str) -> Option<String> {
    if let Some(key) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return pod["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned);
    }
    if let Some(key) = path
        .strip_prefix("metadata.labels['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return pod["metadata"]["labels"][key].as_str().map(str::to_owned);
    }
    match path {
        "metadata.name" => pod["metadata"]["name"].as_str().map(str::to_owned),
        "metadata.namespace" => pod["metadata"]["namespace"].as_str().map(str::to_owned),
        "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
        _ => None,
    }
}
