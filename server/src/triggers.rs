//! `serve`'s triggers: each trigger of a served pipeline finds objects (listing its
//! prefix from a durable cursor, and its SQS queue of bucket notifications where it has
//! one), puts them in the state store's inbox, and starts a run when a batch is due.
//!
//! Crash safety is the inbox's: an object is recorded before its queue message is
//! deleted, and a batch's objects become a run's in the transaction that creates the
//! run, so a server killed anywhere starts no batch twice and loses no object; the run
//! it created but did not start is resumed by the next server like any orphaned run.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drivetrain_engine::events::batch::{self, Decision};
use drivetrain_engine::events::discover::Source;
use drivetrain_engine::events::sqs::{self, Queue};
use drivetrain_engine::events::{After, Objects, Trigger, Watch};
use drivetrain_engine::state::{InboxObject, RunId, RunRecord};
use serde_json::{json, Value};

use crate::server::{Loaded, Server};

/// How often waiting objects are weighed (and `max_wait` noticed).
const EVALUATE_EVERY: Duration = Duration::from_millis(500);

impl Server {
    /// Registers every trigger of the served pipelines and starts its loops.
    pub(crate) fn start_triggers(self: &Arc<Self>) -> anyhow::Result<()> {
        let loaded: Vec<Arc<Loaded>> = self.loaded().values().cloned().collect();
        for l in loaded {
            for t in l.pipeline.triggers.values() {
                self.engine.state().ensure_trigger(
                    &l.pipeline.name,
                    &t.name,
                    &l.file.display().to_string(),
                    t.paused,
                )?;
                let wake = Arc::new(tokio::sync::Notify::new());
                let o = match &t.watch {
                    Watch::Objects(o) => o.clone(),
                    Watch::Webhook(_) => {
                        println!(
                            "trigger {}/{}: signed calls to POST /api/v1/pipelines/{}/triggers/{}",
                            l.pipeline.name, t.name, l.pipeline.name, t.name
                        );
                        tokio::spawn(self.clone().hook_loop(l.clone(), t.clone(), wake));
                        continue;
                    }
                    Watch::After(a) => {
                        println!(
                            "trigger {}/{}: after runs of {} end {:?}",
                            l.pipeline.name, t.name, a.pipeline, a.phases
                        );
                        tokio::spawn(self.clone().after_loop(l.clone(), t.clone(), a.clone()));
                        continue;
                    }
                };
                println!(
                    "trigger {}/{}: objects under {}{}",
                    l.pipeline.name,
                    t.name,
                    o.source,
                    o.queue
                        .as_ref()
                        .map(|q| format!(" (notifications from {q})"))
                        .unwrap_or_default()
                );
                tokio::spawn(self.clone().trigger_loop(
                    l.clone(),
                    t.clone(),
                    o.clone(),
                    wake.clone(),
                ));
                if let Some(q) = &o.queue {
                    tokio::spawn(self.clone().queue_loop(
                        l.clone(),
                        t.clone(),
                        o.source.clone(),
                        q.clone(),
                        wake,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Lists the prefix every `poll` (the whole prefix every `rescan`) and weighs what
    /// waits every [`EVALUATE_EVERY`], or at once when the queue found something.
    async fn trigger_loop(
        self: Arc<Self>,
        l: Arc<Loaded>,
        t: Trigger,
        o: Objects,
        wake: Arc<tokio::sync::Notify>,
    ) {
        let pipeline = l.pipeline.name.clone();
        let name = format!("trigger {pipeline}/{}", t.name);
        // A prefix that cannot be opened or listed is said once and tried again less and
        // less often; what its queue announces is still weighed.
        let (mut source, mut failed) = (None, None);
        let mut cursor = self
            .engine
            .state()
            .trigger_state(&pipeline, &t.name)
            .ok()
            .flatten()
            .and_then(|(_, cursor)| cursor);
        let (mut listed_at, mut rescanned_at): (Option<Instant>, Option<Instant>) = (None, None);
        let mut failing = crate::failing::Failing::default();
        let hint = failing_hint(&pipeline, &t.name);
        while !self.stopping.load(Ordering::SeqCst) {
            if source.is_none() && failing.may_try() {
                match Source::open(&o.source) {
                    Ok(s) => source = Some(s),
                    Err(e) => {
                        if let Some(line) = failing.failed(&e.to_string(), &hint) {
                            eprintln!("{name}: {line}");
                        }
                        failed = Some(e);
                    }
                }
            }
            let rescan_due = rescanned_at.is_none_or(|at| at.elapsed() >= o.rescan);
            let due = rescan_due || listed_at.is_none_or(|at| at.elapsed() >= o.poll);
            if let Some(source) = source.as_ref().filter(|_| due && failing.may_try()) {
                let rescan = rescan_due || source.lists_whole();
                let after = if rescan { None } else { cursor.clone() };
                match source.list(&t, after.as_deref()).await {
                    Ok(found) => {
                        failed = None;
                        if let Some(m) = failing.succeeded() {
                            println!("{name}: {m}");
                        }
                        let next = found
                            .last_key
                            .clone()
                            .filter(|k| cursor.as_ref().is_none_or(|c| k > c));
                        let state = self.engine.state().clone();
                        let (p, n, objs, c) = (
                            pipeline.clone(),
                            t.name.clone(),
                            found.objects,
                            next.clone(),
                        );
                        let added = tokio::task::spawn_blocking(move || {
                            state.add_objects(&p, &n, &objs, c.as_deref(), rescan)
                        })
                        .await;
                        match added {
                            Ok(Ok(new)) => {
                                if new > 0 {
                                    println!("{name}: {new} new object(s) listed");
                                }
                                cursor = next.or(cursor);
                                listed_at = Some(Instant::now());
                                if rescan {
                                    rescanned_at = listed_at;
                                }
                            }
                            Ok(Err(e)) => eprintln!("{name}: cannot record objects: {e}"),
                            Err(e) => eprintln!("{name}: {e}"),
                        }
                    }
                    Err(e) => {
                        if let Some(line) = failing.failed(&e.to_string(), &hint) {
                            eprintln!("{name}: {line}");
                        }
                        failed = Some(e);
                        listed_at = Some(Instant::now());
                    }
                }
            }
            self.evaluate_and_start(&l, &t).await;
            // What the listing met stays in `trigger show` until a listing succeeds.
            if let Some(e) = &failed {
                let _ = self
                    .engine
                    .state()
                    .note_evaluation(&pipeline, &t.name, &e.to_string());
            }
            tokio::select! {
                _ = tokio::time::sleep(EVALUATE_EVERY) => {}
                _ = wake.notified() => {}
            }
        }
    }

    /// Weighs what waits (off the async workers) and starts the runs that are due.
    async fn evaluate_and_start(self: &Arc<Self>, l: &Arc<Loaded>, t: &Trigger) {
        let name = format!("trigger {}/{}", l.pipeline.name, t.name);
        let me = self.clone();
        let (l2, t2) = (l.clone(), t.clone());
        match tokio::task::spawn_blocking(move || me.evaluate(&l2, &t2)).await {
            Ok(Err(e)) => eprintln!("{name}: {e:#}"),
            Err(e) => eprintln!("{name}: {e}"),
            Ok(Ok(fired)) => {
                for (id, objs) in fired {
                    if let Err(e) = self.start_triggered(&id, l, t, &objs).await {
                        eprintln!("run {id}: cannot start: {e:#}");
                    }
                }
            }
        }
    }

    /// Weighs a webhook trigger's calls every [`EVALUATE_EVERY`], or at once when one
    /// is recorded ([`Server::hook_wake`]).
    async fn hook_loop(
        self: Arc<Self>,
        l: Arc<Loaded>,
        t: Trigger,
        wake: Arc<tokio::sync::Notify>,
    ) {
        self.hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((l.pipeline.name.clone(), t.name.clone()), wake.clone());
        while !self.stopping.load(Ordering::SeqCst) {
            self.evaluate_and_start(&l, &t).await;
            tokio::select! {
                _ = tokio::time::sleep(EVALUATE_EVERY) => {}
                _ = wake.notified() => {}
            }
        }
    }

    /// The webhook trigger `pipeline/trigger` of this server: its secret, or why none.
    pub(crate) fn hook(
        &self,
        pipeline: &str,
        trigger: &str,
    ) -> Result<drivetrain_engine::events::Hook, String> {
        let l = self
            .loaded()
            .get(pipeline)
            .cloned()
            .ok_or_else(|| format!("no pipeline `{pipeline}` is served here"))?;
        match l.pipeline.triggers.get(trigger).map(|t| &t.watch) {
            Some(Watch::Webhook(h)) => Ok(h.clone()),
            Some(_) => Err(format!(
                "trigger `{trigger}` of `{pipeline}` is not a webhook"
            )),
            None => Err(format!("pipeline `{pipeline}` has no trigger `{trigger}`")),
        }
    }

    /// Wakes a webhook trigger's loop: a call was recorded.
    pub(crate) fn hook_wake(&self, pipeline: &str, trigger: &str) {
        if let Some(w) = self
            .hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(pipeline.to_owned(), trigger.to_owned()))
        {
            w.notify_one();
        }
    }

    /// Every second: the upstream pipeline's runs that ended in one of the phases since
    /// the cursor (the newest end seen; at first, when the trigger was first served) go
    /// into the inbox, one object each, and what waits is weighed.
    async fn after_loop(self: Arc<Self>, l: Arc<Loaded>, t: Trigger, a: After) {
        let pipeline = l.pipeline.name.clone();
        let name = format!("trigger {pipeline}/{}", t.name);
        while !self.stopping.load(Ordering::SeqCst) {
            let state = self.engine.state().clone();
            let (p, n, a2) = (pipeline.clone(), t.name.clone(), a.clone());
            let found = tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
                let cursor = state.trigger_state(&p, &n)?.and_then(|(_, cursor)| cursor);
                let Some(cursor) = cursor else {
                    // First served now: runs that ended before do not count.
                    state.add_objects(
                        &p,
                        &n,
                        &[],
                        Some(&drivetrain_engine::state::now()),
                        false,
                    )?;
                    return Ok(0);
                };
                let filter = drivetrain_engine::state::RunFilter {
                    pipeline: Some(a2.pipeline.clone()),
                    ..Default::default()
                };
                let now = drivetrain_engine::state::now();
                let ended: Vec<InboxObject> = state
                    .find_runs(&filter, 1000)?
                    .into_iter()
                    .filter(|r| a2.phases.contains(&r.phase))
                    .filter(|r| {
                        r.finished_at
                            .as_deref()
                            .is_some_and(|f| f > cursor.as_str())
                    })
                    .map(|r| InboxObject {
                        url: a2.url(&r.id.0),
                        etag: r.phase.as_str().to_owned(),
                        size: None,
                        modified: r.finished_at.clone(),
                        group: String::new(),
                        discovered_at: now.clone(),
                        payload: None,
                    })
                    .collect();
                let newest = ended.iter().filter_map(|o| o.modified.clone()).max();
                state
                    .add_objects(&p, &n, &ended, newest.as_deref(), false)
                    .map_err(Into::into)
            })
            .await;
            match found {
                Ok(Ok(new)) if new > 0 => println!("{name}: {new} upstream run(s) ended"),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => eprintln!("{name}: {e:#}"),
                Err(e) => eprintln!("{name}: {e}"),
            }
            self.evaluate_and_start(&l, &t).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Receives the queue's notifications, records their objects, then deletes them.
    async fn queue_loop(
        self: Arc<Self>,
        l: Arc<Loaded>,
        t: Trigger,
        source: String,
        queue: String,
        wake: Arc<tokio::sync::Notify>,
    ) {
        let pipeline = l.pipeline.name.clone();
        let name = format!("trigger {pipeline}/{}", t.name);
        let q = match Queue::new(&queue) {
            Ok(q) => q,
            Err(e) => {
                eprintln!("{name}: {e}");
                return;
            }
        };
        let base = match source.ends_with('/') {
            true => source.clone(),
            false => format!("{source}/"),
        };
        let mut failing = crate::failing::Failing::default();
        let hint = failing_hint(&pipeline, &t.name);
        while !self.stopping.load(Ordering::SeqCst) {
            let messages = match q.receive(1).await {
                Ok(m) => {
                    if let Some(back) = failing.succeeded() {
                        println!("{name}: the queue is {back}");
                    }
                    m
                }
                Err(e) => {
                    if let Some(line) = failing.failed(&e.to_string(), &hint) {
                        eprintln!("{name}: {line}");
                    }
                    tokio::time::sleep(failing.wait()).await;
                    continue;
                }
            };
            if messages.is_empty() {
                continue;
            }
            let now = drivetrain_engine::state::now();
            let mut objects = Vec::new();
            let mut done = Vec::new();
            for m in &messages {
                match sqs::announced(&m.body) {
                    Ok(found) => {
                        for a in found {
                            let url = a.url();
                            let Some(key) = url.strip_prefix(&base) else {
                                continue;
                            };
                            if !t.matches(key) {
                                continue;
                            }
                            objects.push(InboxObject {
                                group: t.group(key),
                                url: url.clone(),
                                etag: a.etag,
                                size: a.size,
                                modified: a.event_time,
                                discovered_at: now.clone(),
                                payload: None,
                            });
                        }
                        done.push(m.receipt.clone());
                    }
                    // Left in the queue (its redrive policy decides), and said.
                    Err(e) => eprintln!("{name}: a message that is not an S3 event: {e}"),
                }
            }
            let state = self.engine.state().clone();
            let (p, n) = (pipeline.clone(), t.name.clone());
            let added = tokio::task::spawn_blocking(move || {
                state.add_objects(&p, &n, &objects, None, false)
            })
            .await;
            match added {
                Ok(Ok(new)) => {
                    if new > 0 {
                        println!("{name}: {new} new object(s) announced");
                        wake.notify_one();
                    }
                    // Only once recorded: a server killed before this receives them again.
                    if let Err(e) = q.delete(&done).await {
                        eprintln!("{name}: {e}");
                    }
                }
                Ok(Err(e)) => eprintln!("{name}: cannot record objects: {e}"),
                Err(e) => eprintln!("{name}: {e}"),
            }
        }
    }

    /// Weighs what waits and creates the runs that are due, with their objects
    /// (blocking: state-store calls); the caller starts them.
    #[allow(clippy::type_complexity)]
    fn evaluate(
        self: &Arc<Self>,
        l: &Arc<Loaded>,
        t: &Trigger,
    ) -> anyhow::Result<Vec<(RunId, Vec<InboxObject>)>> {
        let pipeline = &l.pipeline.name;
        let state = self.engine.state().clone();
        let mut out = Vec::new();
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return Ok(out);
            }
            let paused = state
                .trigger_state(pipeline, &t.name)?
                .is_some_and(|(paused, _)| paused);
            let waiting = state.waiting(pipeline, &t.name)?;
            let decisions = batch::decide(t, &waiting, chrono::Utc::now(), paused);
            if decisions.is_empty() {
                if out.is_empty() {
                    state.note_evaluation(pipeline, &t.name, "no object waiting")?;
                }
                return Ok(out);
            }
            let mut fired = false;
            let mut said = Vec::new();
            for d in decisions {
                match d {
                    Decision::Wait { why, .. } => said.push(why),
                    Decision::Fire {
                        group,
                        min,
                        max,
                        why,
                    } => {
                        let id = RunId::generate(chrono::Utc::now());
                        let record =
                            |objs: &[InboxObject]| self.trigger_run(&id, l, t, &group, objs);
                        let objs =
                            state.claim_batch(pipeline, &t.name, &group, min, max, &record)?;
                        if objs.is_empty() {
                            said.push(format!("{why}, but another server took them"));
                            continue;
                        }
                        fired = true;
                        said.push(format!("fired run {id}: {why}"));
                        println!(
                            "trigger {pipeline}/{}: run {id} for {} object(s) ({why})",
                            t.name,
                            objs.len()
                        );
                        out.push((id, objs));
                    }
                }
            }
            state.note_evaluation(pipeline, &t.name, &said.join("; "))?;
            // A fired batch may have left a full one behind.
            if !fired {
                return Ok(out);
            }
        }
    }

    /// The run a batch becomes: Running, this process its engine, its params rendered.
    fn trigger_run(
        &self,
        id: &RunId,
        l: &Loaded,
        t: &Trigger,
        group: &str,
        objs: &[InboxObject],
    ) -> RunRecord {
        // The project's store (opened at the run's start anyway; the engine's if it cannot
        // be, where the run then fails to start and says why).
        let store = self
            .store_for(&l.pipeline.project)
            .unwrap_or_else(|_| self.engine.artifacts().clone());
        let values = trigger_values(&manifest_location(&store, id), t, group, objs);
        let overrides: Vec<(String, String)> = t
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.render(|r| values.get(r).cloned())))
            .collect();
        // A param the trigger sets that does not take its value: the run ends at once, as
        // Error, with the reason (its objects stay its, for `forget` and a retry).
        let (params, bad) = match l.pipeline.resolve_params(&overrides) {
            Ok(p) => (p, None),
            Err(e) => (BTreeMap::new(), Some(e.join("; "))),
        };
        let mut r = self
            .request_of(id, l, params, "trigger")
            .record(self.engine.executor().name());
        if let Some(why) = bad {
            r.phase = drivetrain_engine::state::Phase::Error;
            r.reason = Some(format!("trigger `{}`: {why}", t.name));
            r.finished_at = Some(drivetrain_engine::state::now());
            r.engine_pid = None;
        }
        r
    }

    /// Writes the batch's manifest and starts its run.
    async fn start_triggered(
        self: &Arc<Self>,
        id: &RunId,
        l: &Arc<Loaded>,
        t: &Trigger,
        objs: &[InboxObject],
    ) -> anyhow::Result<()> {
        let record = self.engine.state().run(id)?;
        let store = self.store_for(&l.pipeline.project)?;
        write_manifest(&store, id, &l.pipeline.name, &t.name, objs).await?;
        if record.phase.is_terminal() {
            eprintln!("run {id}: {}", record.reason.as_deref().unwrap_or("ended"));
            return Ok(());
        }
        let params: BTreeMap<String, Value> = serde_json::from_value(record.params.clone())?;
        let mut request = self.request_of(id, l, params, "trigger");
        request.resume = Some(drivetrain_engine::runner::Resume::recorded(record));
        self.start(request)
    }

    /// Writes again the manifest of a triggered run about to be resumed (the server that
    /// created the run may have died before it wrote it).
    pub(crate) async fn restore_manifest(&self, run: &RunId) -> anyhow::Result<()> {
        let Some(rt) = self.engine.state().run_trigger(run)? else {
            return Ok(());
        };
        let record = self.engine.state().run(run)?;
        write_manifest(
            &self.store_for(&record.project)?,
            run,
            &record.pipeline,
            &rt.trigger,
            &rt.objects,
        )
        .await
    }
}

/// The manifest's key in the artifact store.
fn manifest_key(run: &RunId) -> String {
    format!("triggers/{run}/objects.json")
}

/// Where a run's manifest is, as a stage reads it: a path with a `file://` store, else
/// its URL.
fn manifest_location(store: &drivetrain_engine::artifacts::ArtifactStore, run: &RunId) -> String {
    let key = manifest_key(run);
    match store.local_root() {
        Some(root) => root.join(&key).display().to_string(),
        None => store.artifact_url(&key),
    }
}

/// The values a trigger's params are rendered with.
fn trigger_values(
    manifest: &str,
    t: &Trigger,
    group: &str,
    objs: &[InboxObject],
) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("trigger.manifest", manifest.to_owned()),
        ("trigger.name", t.name.clone()),
        (
            "trigger.body",
            objs.first()
                .and_then(|o| o.payload.clone())
                .unwrap_or_default(),
        ),
        (
            "trigger.run",
            objs.first()
                .and_then(|o| drivetrain_engine::events::upstream_run(&o.url))
                .unwrap_or_default()
                .to_owned(),
        ),
        ("trigger.count", objs.len().to_string()),
        ("trigger.group", group.to_owned()),
        (
            "trigger.urls",
            objs.iter()
                .map(|o| o.url.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    ])
}

/// Writes the JSON list of a batch's objects (the same bytes however often).
async fn write_manifest(
    store: &drivetrain_engine::artifacts::ArtifactStore,
    run: &RunId,
    pipeline: &str,
    trigger: &str,
    objs: &[InboxObject],
) -> anyhow::Result<()> {
    let body = serde_json::to_vec_pretty(&json!({
        "pipeline": pipeline,
        "trigger": trigger,
        "run": run.0,
        "objects": objs.iter().map(|o| json!({"url": o.url, "etag": o.etag, "size": o.size, "payload": o.payload})).collect::<Vec<_>>(),
    }))?;
    let path = object_store::path::Path::from(manifest_key(run));
    use object_store::ObjectStoreExt as _;
    store.object_store().put(&path, body.into()).await?;
    Ok(())
}

/// What a person can do about a trigger whose source keeps failing.
fn failing_hint(pipeline: &str, trigger: &str) -> String {
    format!(
        "check the credentials serve has for it (AWS_*, GOOGLE_*, AZURE_*); `drivetrain trigger pause {pipeline}/{trigger}` holds its runs, and taking the trigger out of the pipeline stops the tries"
    )
}
