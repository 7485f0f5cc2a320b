//! The reads the web view needs beyond runs and schedules: a run's graph, its attempts,
//! its live events, `explain` for a stage, lineage, and the model registry. Each is a
//! route of [`super::openapi::ROUTES`] like any other, so the CLI's users get them too.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use drivetrain_engine::access::{Subject, Verb};
use drivetrain_engine::engine::Home;
use drivetrain_engine::plan::Action;
use drivetrain_engine::state::RunId;

use super::openapi::{
    AttemptList, GraphNode, ItemPage, ItemSpan, ItemView, RunGraph, StageHistory,
    StageHistoryEntry, TrialCurve, TrialPage,
};
use super::{known_run, ApiError, Params, Shared};
use crate::listener::Client;

/// How often a live stream reads the state store. The browser never polls: it holds one
/// stream per page and the server sends what changed.
pub const EVENT_INTERVAL: Duration = Duration::from_millis(400);

/// `GET /api/v1/runs/{id}/graph`: the run's stages and what each needs, from the
/// pipeline the run was started from (its file, or the text kept when it started).
pub(super) async fn graph(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<RunGraph>, ApiError> {
    let run = RunId(id);
    let record = known_run(&s, &run)?;
    let server = s.clone();
    let digest = record.spec_digest.clone();
    let made = tokio::task::spawn_blocking(move || {
        let state = server.engine.state().clone();
        let source = drivetrain_engine::state::sources::pipeline_text(state.as_ref(), &record)
            .map_err(|why| format!("{why}; its stages are shown without edges"))?;
        server.validated_run(&record, &source)
    })
    .await?;
    let pipeline = match made {
        Ok(p) => p,
        Err(why) => {
            // The stages the state store knows, without edges: still a picture of the run.
            let stages = s.engine.state().stages(&run)?;
            let names: Vec<&str> = stages.iter().map(|st| st.stage.as_str()).collect();
            let key = drivetrain_engine::engine::home::digest(&names.join("\n"));
            let nodes = stages
                .into_iter()
                .map(|st| GraphNode {
                    name: st.stage.to_string(),
                    needs: Vec::new(),
                    kind: String::new(),
                    map: false,
                    search: false,
                    hook: false,
                })
                .collect();
            return Ok(Json(RunGraph::new(nodes, Some(why), &key)));
        }
    };
    let nodes = pipeline
        .stages
        .iter()
        .map(|st| GraphNode {
            name: st.name.to_string(),
            needs: pipeline
                .upstream(st.id)
                .into_iter()
                .map(|u| pipeline.stage(u).name.to_string())
                .collect(),
            kind: match &st.action {
                Action::Step { name, version, .. } => format!("{name}@{version}"),
                Action::Command { .. } => "command".into(),
                Action::Approval { role, min, .. } => format!("approval: {min} of {role}"),
            },
            map: st.map.is_some(),
            search: st.search.is_some(),
            hook: st.hook.is_some(),
        })
        .collect();
    // Laid out on the blocking pool: a 1,000-stage pipeline takes a while the first time.
    let graph = tokio::task::spawn_blocking(move || RunGraph::new(nodes, None, &digest)).await?;
    Ok(Json(graph))
}

/// `GET /api/v1/runs/{id}/attempts`.
pub(super) async fn attempts(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<AttemptList>, ApiError> {
    let run = RunId(id);
    known_run(&s, &run)?;
    let read = tokio::task::spawn_blocking(move || {
        let state = s.engine.state();
        let attempts = state.attempts(&run)?;
        let mut items = Vec::new();
        for stage in state.stages(&run)? {
            items.extend(
                state
                    .map_items(&run, &stage.stage)?
                    .into_iter()
                    .map(|i| ItemSpan {
                        stage: stage.stage.to_string(),
                        index: i.index,
                        attempts: i.attempts,
                        phase: i.phase,
                        started_at: i.started_at,
                        finished_at: i.finished_at,
                        reason: i.reason,
                    }),
            );
        }
        Ok::<_, drivetrain_engine::state::StateError>(AttemptList { attempts, items })
    })
    .await;
    // The run exists: any failure here is the server's.
    Ok(Json(read?.map_err(ApiError::internal)?))
}

fn sse_event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// What a run's stream has sent so far.
struct Sent {
    run: Option<Value>,
    stages: BTreeMap<String, Value>,
    done: bool,
}

/// `GET /api/v1/runs/{id}/events`: `snapshot` (the run and its stages) first, then
/// `run` and `stage` events as they change, and `end` once the run has ended.
pub(super) async fn run_events(
    State(s): State<Shared>,
    Path(id): Path<String>,
    client: Option<Extension<Client>>,
) -> Result<Response, ApiError> {
    let run = RunId(id);
    known_run(&s, &run)?;
    let permit = match super::admit_stream(&s, client) {
        Ok(p) => p,
        Err(busy) => return Ok(*busy),
    };
    let start = Sent {
        run: None,
        stages: BTreeMap::new(),
        done: false,
    };
    let stream = futures::stream::unfold((start, permit), move |(mut sent, permit)| {
        let (s, run) = (s.clone(), run.clone());
        async move {
            if sent.done {
                return None;
            }
            loop {
                // A page left open does not hold up a server that is stopping.
                if s.stopping.load(Ordering::SeqCst) {
                    return None;
                }
                let (server, id) = (s.clone(), run.clone());
                let turn = s.stream_reads.acquire().await;
                let read = tokio::task::spawn_blocking(move || {
                    let state = server.engine.state();
                    let record = state.run(&id);
                    let view = record.map(|r| super::openapi::RunView::one(state.as_ref(), r));
                    (view, state.stages(&id))
                })
                .await;
                drop(turn);
                let (record, stages) = match read {
                    Ok((Ok(Ok(r)), Ok(st))) => (r, st),
                    _ => return None,
                };
                let ended = record.record.phase.is_terminal();
                let record = serde_json::to_value(&record).unwrap_or_default();
                let mut events = Vec::new();
                if sent.run.is_none() {
                    events.push(sse_event(
                        "snapshot",
                        &json!({"run": record, "stages": stages}),
                    ));
                    sent.stages = stages
                        .iter()
                        .map(|st| (st.stage.to_string(), json!(st)))
                        .collect();
                } else {
                    if sent.run.as_ref() != Some(&record) {
                        events.push(sse_event("run", &record));
                    }
                    for st in &stages {
                        let v = json!(st);
                        if sent.stages.get(st.stage.as_str()) != Some(&v) {
                            events.push(sse_event("stage", &v));
                            sent.stages.insert(st.stage.to_string(), v);
                        }
                    }
                }
                sent.run = Some(record);
                if ended {
                    events.push(sse_event("end", &json!({})));
                    sent.done = true;
                }
                if !events.is_empty() {
                    let batch = futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>));
                    return Some((batch, (sent, permit)));
                }
                tokio::time::sleep(EVENT_INTERVAL).await;
            }
        }
    });
    Ok(Sse::new(futures::StreamExt::flatten(stream))
        .keep_alive(KeepAlive::default())
        .into_response())
}

use crate::feed::{Reading, RunsFeed};

impl RunsFeed {
    fn subscribe(&self, s: &Shared) -> watch::Receiver<Option<Reading>> {
        self.sender
            .get_or_init(|| {
                let sender = Arc::new(watch::channel(None).0);
                tokio::spawn(poll_runs(s.clone(), sender.clone()));
                sender
            })
            .subscribe()
    }
}

/// What the run list's streams report, read on the blocking pool.
async fn read_runs(s: &Shared) -> Option<Value> {
    let server = s.clone();
    let read = tokio::task::spawn_blocking(move || {
        let counts = server.engine.state().run_counts().ok()?;
        let runs = server.engine.state().list_runs(200).ok()?;
        let phases: Vec<(String, String)> = runs
            .into_iter()
            .map(|r| (r.id.0, r.phase.as_str().to_owned()))
            .collect();
        Some(json!({"counts": counts, "phases": phases}))
    });
    read.await.ok().flatten()
}

/// The feed's one reader: a reading per interval while a stream listens, and one at once
/// when a new stream wants it. Every reading is sent (its time is new); each stream skips
/// what it has already sent.
async fn poll_runs(s: Shared, sender: Arc<watch::Sender<Option<Reading>>>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVENT_INTERVAL) => {}
            _ = s.runs_feed.wanted.notified() => {}
        }
        if s.stopping.load(Ordering::SeqCst) {
            sender.send_replace(Some((tokio::time::Instant::now(), Arc::new(Value::Null))));
            return;
        }
        if sender.receiver_count() == 0 {
            sender.send_replace(None);
            continue;
        }
        let Some(now) = read_runs(&s).await else {
            continue;
        };
        sender.send_replace(Some((tokio::time::Instant::now(), Arc::new(now))));
    }
}

/// `GET /api/v1/events`: a `runs` event at once, then whenever the set of runs or the
/// phase of one of the newest 200 changes (the page then reads the list it shows, with
/// its filters).
pub(super) async fn list_events(
    State(s): State<Shared>,
    client: Option<Extension<Client>>,
) -> Response {
    let permit = match super::admit_stream(&s, client) {
        Ok(p) => p,
        Err(busy) => return *busy,
    };
    let mut feed = s.runs_feed.subscribe(&s);
    // The feed's reading if it is current; else the next, asked for now.
    let first = feed
        .borrow_and_update()
        .clone()
        .filter(|(at, _)| at.elapsed() <= EVENT_INTERVAL)
        .map(|(_, v)| v);
    if first.is_none() {
        s.runs_feed.wanted.notify_one();
    }
    let stream = futures::stream::unfold(
        (feed, None::<Arc<Value>>, first, permit),
        |(mut feed, last, mut next, permit)| async move {
            loop {
                let now = match next.take() {
                    Some(v) => v,
                    None => {
                        feed.changed().await.ok()?;
                        let reading = feed.borrow_and_update().clone();
                        match reading {
                            Some((_, v)) => v,
                            None => continue,
                        }
                    }
                };
                if now.is_null() {
                    return None;
                }
                if last.as_ref() == Some(&now) {
                    continue;
                }
                let event = sse_event("runs", &json!({"counts": now["counts"]}));
                return Some((Ok::<_, Infallible>(event), (feed, Some(now), None, permit)));
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[derive(Deserialize)]
pub(super) struct ItemsQuery {
    #[serde(default)]
    offset: usize,
    #[serde(default = "default_items")]
    limit: usize,
}

fn default_items() -> usize {
    100
}

/// The most items `…/items` answers at once.
const MAX_ITEMS: usize = 1000;

/// `GET /api/v1/runs/{id}/stages/{stage}/items`: a page of a map stage's items, each with
/// its value, how its last attempt went and what it reported: the table a sweep needs.
pub(super) async fn items(
    State(s): State<Shared>,
    Path((id, stage)): Path<(String, String)>,
    Params(q): Params<ItemsQuery>,
) -> Result<Json<ItemPage>, ApiError> {
    if q.limit == 0 || q.limit > MAX_ITEMS {
        let why = format!("limit: 1 to {MAX_ITEMS} items");
        return Err(ApiError::bad_request(why));
    }
    let run = RunId(id);
    known_run(&s, &run)?;
    let read = tokio::task::spawn_blocking(move || {
        let state = s.engine.state();
        let all = state.map_items(&run, &stage)?;
        let total = all.len();
        let items = all
            .into_iter()
            .skip(q.offset)
            .take(q.limit)
            .map(|i| ItemView {
                log_stage: format!("{stage}/items/{}", i.index),
                index: i.index,
                item: i.item,
                phase: i.phase,
                attempts: i.attempts,
                reason: i.reason,
                started_at: i.started_at,
                finished_at: i.finished_at,
                values: i.values,
                usage: i.usage,
            })
            .collect();
        let known = total > 0 || state.stages(&run)?.iter().any(|st| st.stage == stage);
        Ok::<_, drivetrain_engine::state::StateError>(known.then_some(ItemPage { total, items }))
    })
    .await;
    read?
        .map_err(ApiError::internal)?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no map stage of that name in the run"))
}

/// `GET /api/v1/runs/{id}/stages/{stage}/trials`: a search stage's trials (as
/// `drivetrain trials` lists them) and each one's curve of the search's metric.
pub(super) async fn trials(
    State(s): State<Shared>,
    Path((id, stage)): Path<(String, String)>,
) -> Result<Json<TrialPage>, ApiError> {
    let run = RunId(id);
    let record = known_run(&s, &run)?;
    tokio::task::spawn_blocking(move || {
        let state = s.engine.state().clone();
        let source = drivetrain_engine::state::sources::pipeline_text(state.as_ref(), &record)
            .map_err(ApiError::internal)?;
        let pipeline = s
            .validated_run(&record, &source)
            .map_err(ApiError::internal)?;
        let Some(plan) = pipeline
            .stage_by_name(&stage)
            .and_then(|st| st.search.clone())
        else {
            return Err(ApiError::not_found(
                "no search stage of that name in the run",
            ));
        };
        let stored = state.trials(&run, &stage)?;
        let metrics = state.metrics(&run, &stage)?;
        use drivetrain_engine::search::report;
        Ok(Json(TrialPage {
            trials: report::rows(&plan, &stored, &metrics),
            curves: report::curves(&plan, &stored, &metrics)
                .into_iter()
                .map(|(trial, points)| TrialCurve { trial, points })
                .collect(),
            metric: plan.metric,
            goal: serde_json::to_value(plan.goal)
                .ok()
                .and_then(|g| g.as_str().map(str::to_owned))
                .unwrap_or_default(),
            method: serde_json::to_value(plan.method)
                .ok()
                .and_then(|g| g.as_str().map(str::to_owned))
                .unwrap_or_default(),
        }))
    })
    .await?
}

#[derive(Deserialize)]
pub(super) struct HistoryQuery {
    #[serde(default = "default_history")]
    limit: usize,
}

fn default_history() -> usize {
    20
}

/// The most runs `…/history` reads.
const MAX_HISTORY: usize = 200;

/// `GET /api/v1/runs/{id}/stages/{stage}/history`: the stage's values in the newest runs
/// of the same pipeline and project, this one among them, oldest first (a chart of what
/// the stage found run after run).
pub(super) async fn stage_history(
    State(s): State<Shared>,
    Path((id, stage)): Path<(String, String)>,
    Params(q): Params<HistoryQuery>,
) -> Result<Json<StageHistory>, ApiError> {
    let limit = q.limit;
    if limit == 0 || limit > MAX_HISTORY {
        let why = format!("limit: 1 to {MAX_HISTORY} runs");
        return Err(ApiError::bad_request(why));
    }
    let read = tokio::task::spawn_blocking(move || {
        let state = s.engine.state();
        let Ok(run) = state.run(&RunId(id.clone())) else {
            return Ok(None);
        };
        let filter = drivetrain_engine::state::RunFilter {
            pipeline: Some(run.pipeline.clone()),
            projects: Some(vec![run.project.clone()]),
            ..Default::default()
        };
        let mut runs = state.find_runs(&filter, limit)?;
        if !runs.iter().any(|r| r.id == run.id) {
            runs.pop();
            runs.push(run);
        }
        let mut points = Vec::new();
        for r in runs.into_iter().rev() {
            let found = state
                .stages(&r.id)?
                .into_iter()
                .find(|st| st.stage == stage);
            if let Some(st) = found {
                points.push(StageHistoryEntry {
                    run: r.id.0,
                    created_at: r.created_at,
                    phase: st.phase,
                    values: st.values,
                });
            }
        }
        Ok::<_, drivetrain_engine::state::StateError>(Some(StageHistory { runs: points }))
    })
    .await;
    match read?.map_err(ApiError::internal)? {
        Some(h) => Ok(Json(h)),
        None => Err(ApiError::not_found("no such run")),
    }
}

/// `GET /api/v1/runs/{id}/stages/{stage}/explain`.
pub(super) async fn explain(
    State(s): State<Shared>,
    Path((id, stage)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    known_run(&s, &RunId(id.clone()))?;
    crate::query::explanation(s.engine.state().as_ref(), &id, &stage)
        .map_err(ApiError::internal)?
        .map(Json)
        .map_err(ApiError::not_found)
}

#[derive(Deserialize)]
pub(super) struct LineageQuery {
    target: String,
    #[serde(default)]
    downstream: bool,
}

/// `GET /api/v1/lineage?target=…`: the graph from an artifact, a run's stage or a model
/// version up to the drive logs (or, `downstream`, down to what was made of it).
pub(super) async fn lineage(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Params(q): Params<LineageQuery>,
) -> Result<Json<super::openapi::LineageView>, ApiError> {
    use drivetrain_engine::history::{self, Direction, LineageError};
    let server = s.clone();
    let rt = tokio::runtime::Handle::current();
    let made = tokio::task::spawn_blocking(move || {
        let mut model_version = None;
        let target = match crate::query::model_target(&server.home, &q.target, &rt) {
            Ok(Some(digest)) => {
                model_version = Some(q.target.clone());
                digest
            }
            Ok(None) => q.target.clone(),
            Err(e) => return Err(LineageError::NotFound(e.to_string())),
        };
        let direction = match q.downstream {
            true => Direction::Downstream,
            false => Direction::Upstream,
        };
        let state = server.engine.state().as_ref();
        let roots = history::resolve_target(state, &target)?;
        // Artifacts' locations are in the store of the target's project.
        let project = roots
            .first()
            .and_then(|root| history::root_project(state, root))
            .unwrap_or_default();
        let store = server
            .store_for(&project)
            .unwrap_or_else(|_| server.engine.artifacts().clone());
        let mut g = history::lineage(state, &store, roots, direction)?;
        // What the caller may not read is not there; a target of such a project, not found.
        let readable = who.projects_for(Verb::Read);
        if readable.is_some() {
            let state = server.engine.state();
            let mut projects: BTreeMap<String, bool> = BTreeMap::new();
            let mut visible = |run: &str| {
                *projects.entry(run.to_owned()).or_insert_with(|| {
                    state
                        .run(&RunId(run.to_owned()))
                        .is_ok_and(|r| Subject::may(&readable, &r.project))
                })
            };
            g.nodes.retain(|_, n| visible(n.run()));
            g.edges
                .retain(|(a, b)| g.nodes.contains_key(a) && g.nodes.contains_key(b));
            g.roots.retain(|r| g.nodes.contains_key(r));
            if g.roots.is_empty() {
                return Err(LineageError::NotFound(format!(
                    "no lineage of {} here",
                    q.target
                )));
            }
        }
        // Laid out like a run's graph (not kept: lineage grows with every run).
        // Top to bottom from the target: walking upstream, each edge is laid out turned
        // round (what a node was made of below it), then drawn as it goes.
        let names: Vec<String> = g.nodes.keys().cloned().collect();
        let edges = g.edges.iter().map(|(a, b)| match q.downstream {
            true => (a.as_str(), b.as_str()),
            false => (b.as_str(), a.as_str()),
        });
        let mut layout = super::layout::by_name(&names, edges, super::layout::Flow::Down);
        if !q.downstream {
            for e in &mut layout.edges {
                std::mem::swap(&mut e.from, &mut e.to);
                e.points.reverse();
            }
        }
        Ok(super::openapi::LineageView {
            lineage: g,
            layout,
            model_version,
        })
    })
    .await;
    // A target that names nothing, or a run that is gone: not found.
    Ok(Json(made??))
}

/// The registry of `project`: in its artifact store, where its promotions write; a name
/// that is no project's is the 400 to answer.
fn registry(s: &Shared, project: &str) -> Result<drivetrain_steps::registry::Registry, ApiError> {
    if let Err(e) = drivetrain_engine::validate::dns1123_label(project) {
        return Err(ApiError::bad_request(format!("project `{project}` {e}")));
    }
    let vars = drivetrain_engine::cloud::project_env(project);
    Home::at(&s.home)
        .and_then(|h| h.store_url(None))
        .map_err(anyhow::Error::from)
        .map(|url| drivetrain_engine::artifacts::project_url(&url, project))
        .and_then(|url| drivetrain_steps::registry::Registry::open_with(None, &url, vars))
        .map_err(ApiError::internal)
}

#[derive(Deserialize)]
pub(super) struct ProjectQuery {
    #[serde(default = "default_project")]
    project: String,
}

fn default_project() -> String {
    drivetrain_engine::access::DEFAULT_PROJECT.to_owned()
}

/// `GET /api/v1/registry`: every model with its versions (metrics, source run), its
/// aliases and their history.
pub(super) async fn models(
    State(s): State<Shared>,
    Extension(who): Extension<Subject>,
    Params(q): Params<ProjectQuery>,
) -> Result<Json<super::openapi::Models>, ApiError> {
    let reg = registry(&s, &q.project)?;
    let d = drivetrain_engine::access::decide(&who, Verb::Read, &q.project, None);
    ApiError::unless_allowed(d, Some(&q.project))?;
    let read = async {
        let mut out = Vec::new();
        for model in reg.models().await? {
            let aliases: serde_json::Map<String, Value> = reg
                .aliases(&model)
                .await?
                .into_iter()
                .map(|(a, v)| (a, v["version"].clone()))
                .collect();
            out.push(json!({
                "model": model,
                "versions": reg.versions(&model).await?,
                "aliases": aliases,
                "history": reg.history(&model).await?,
            }));
        }
        anyhow::Ok(out)
    };
    let models = read.await.map_err(ApiError::internal)?;
    Ok(Json(super::openapi::Models { models }))
}

/// `POST /api/v1/registry/{model}/aliases/{alias}/rollback`: the alias back to the
/// version it named before its last move.
pub(super) async fn rollback(
    State(s): State<Shared>,
    Path((model, alias)): Path<(String, String)>,
    Params(q): Params<ProjectQuery>,
) -> Result<Response, ApiError> {
    let reg = registry(&s, &q.project)?;
    let aliases = reg.aliases(&model).await.map_err(ApiError::internal)?;
    if !aliases.iter().any(|(name, _)| *name == alias) {
        return Err(ApiError::not_found(format!(
            "model `{model}` has no alias `{alias}`"
        )));
    }
    let moved = reg
        .rollback(&model, &alias)
        .await
        .map_err(|e| ApiError::conflict(e.to_string()))?;
    let (before, after) = (json!({"version": moved["from"]}), moved.clone());
    Ok(crate::access::noted(
        Json(moved).into_response(),
        before,
        after,
    ))
}
