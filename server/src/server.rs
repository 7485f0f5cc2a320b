//! Everything the scheduler loop and the API share: the [`Server`] (the engine runs
//! execute on, the pipelines served, the runs in flight, tokens, quotas, metrics) and
//! how it starts, reruns and resumes runs in this process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drivetrain_engine::access::{decide, Subject, Verb};
use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::engine::{Engine, Refusal, RerunSource, RerunSpec, RunRequest};
use drivetrain_engine::executor::ResourceUsage;
use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::runner::{self, RunEvent};
use drivetrain_engine::schedule::{self, Decision, Ticker};
use drivetrain_engine::state::{Origin, Phase, Quota, RunId, StateStore};
use drivetrain_engine::Catalog;
use serde_json::Value;

use drivetrain_engine::engine::home::digest;
use drivetrain_engine::engine::recover::stale_before;

use crate::query::now_text;

/// A histogram in Prometheus' cumulative form.
#[derive(Debug)]
pub struct Histogram {
    buckets: &'static [f64],
    counts: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    pub(crate) fn new(buckets: &'static [f64]) -> Histogram {
        Histogram {
            buckets,
            counts: Mutex::new((vec![0; buckets.len()], 0.0, 0)),
        }
    }

    pub fn observe(&self, v: f64) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for (i, b) in self.buckets.iter().enumerate() {
            if v <= *b {
                c.0[i] += 1;
            }
        }
        c.1 += v;
        c.2 += 1;
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (b, n) in self.buckets.iter().zip(&c.0) {
            out.push_str(&format!("{name}_bucket{{le=\"{b}\"}} {n}\n"));
        }
        out.push_str(&format!(
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}\n",
            c.2, c.1, c.2
        ));
    }
}

/// The home's GPU ledger as gauges per queue: attempts waiting, devices held, and how
/// long the longest waiter has waited. (A ledger that cannot be read leaves them out.)
pub(crate) fn render_gpu_queues(
    out: &mut String,
    state: &dyn drivetrain_engine::state::StateStore,
) {
    use std::collections::BTreeMap;
    let (Ok(claims), Ok(waits)) = (state.gpu_claims(), state.gpu_waits()) else {
        return;
    };
    let now = chrono::Utc::now();
    let mut queues: BTreeMap<&str, (u64, u64, f64)> = BTreeMap::new();
    for c in &claims {
        queues.entry(&c.queue).or_default().1 += 1;
    }
    for w in &waits {
        let waited = chrono::DateTime::parse_from_rfc3339(&w.since)
            .map(|t| (now - t.with_timezone(&chrono::Utc)).num_milliseconds() as f64 / 1000.0)
            .unwrap_or(0.0)
            .max(0.0);
        let q = queues.entry(&w.queue).or_default();
        q.0 += 1;
        q.2 = q.2.max(waited);
    }
    for (name, help, pick) in [
        (
            "drivetrain_gpu_queue_depth",
            "Attempts waiting for GPUs in this home, by queue.",
            0,
        ),
        (
            "drivetrain_gpus_held",
            "GPUs held by attempts in this home, by queue.",
            1,
        ),
        (
            "drivetrain_gpu_queue_oldest_wait_seconds",
            "How long the longest waiter for GPUs has waited, by queue.",
            2,
        ),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (queue, (depth, held, oldest)) in &queues {
            let v = match pick {
                0 => depth.to_string(),
                1 => held.to_string(),
                _ => format!("{oldest:.3}"),
            };
            out.push_str(&format!("{name}{{queue=\"{queue}\"}} {v}\n"));
        }
    }
}

pub(crate) const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// A stage of a pipeline of a project: (project, pipeline, stage).
pub type StageOf = (String, String, String);

/// What `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    pub ticks_fired: AtomicU64,
    pub ticks_skipped: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub stage_seconds: Histogram,
    pub transition_seconds: Histogram,
    pub schedule_lag_seconds: Histogram,
    /// What stages used: their latest attempt's usage and the CPU seconds of all their
    /// attempts since this server started.
    pub usage: Mutex<BTreeMap<StageOf, (ResourceUsage, f64)>>,
}

impl Metrics {
    /// Every counter at zero.
    pub(crate) fn new() -> Metrics {
        Metrics {
            ticks_fired: AtomicU64::new(0),
            ticks_skipped: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            stage_seconds: Histogram::new(SECONDS),
            transition_seconds: Histogram::new(SECONDS),
            schedule_lag_seconds: Histogram::new(SECONDS),
            usage: Mutex::new(BTreeMap::new()),
        }
    }

    pub(crate) fn used(&self, project: &str, pipeline: &str, stage: &str, usage: ResourceUsage) {
        let mut all = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let key = (project.to_owned(), pipeline.to_owned(), stage.to_owned());
        let entry = all.entry(key).or_insert((usage, 0.0));
        entry.0 = usage;
        entry.1 += usage.cpu_seconds.unwrap_or(0.0);
    }

    /// The usage gauges and counter, in the exposition format: the series of the
    /// projects in `readable` only (`None`: every project's), each labelled with its
    /// project; no other project's pipeline or stage name is in them.
    pub fn render_usage(
        &self,
        out: &mut String,
        readable: &Option<std::collections::BTreeSet<String>>,
    ) {
        let all = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let label = |v: &str| {
            v.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        type Value = fn(&(ResourceUsage, f64)) -> Option<f64>;
        let series: [(&str, &str, &str, Value); 4] = [
            (
                "drivetrain_stage_peak_memory_bytes",
                "gauge",
                "Peak memory of a stage's latest attempt.",
                |(u, _)| u.peak_memory_bytes.map(|b| b as f64),
            ),
            (
                "drivetrain_stage_cpu_seconds_total",
                "counter",
                "CPU time of a stage's attempts since this server started.",
                |(_, total)| Some(*total),
            ),
            (
                "drivetrain_stage_gpu_utilization_percent",
                "gauge",
                "Mean GPU utilization of a stage's latest attempt.",
                |(u, _)| u.gpu_utilization_percent,
            ),
            (
                "drivetrain_stage_gpu_memory_bytes",
                "gauge",
                "Peak GPU memory of a stage's latest attempt.",
                |(u, _)| u.gpu_memory_bytes.map(|b| b as f64),
            ),
        ];
        for (name, kind, help, value) in series {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            let mine = all.iter().filter(|((project, _, _), _)| {
                readable.as_ref().is_none_or(|r| r.contains(project))
            });
            for ((project, pipeline, stage), u) in mine {
                if let Some(v) = value(u) {
                    out.push_str(&format!(
                        "{name}{{pipeline=\"{}\",stage=\"{}\",project=\"{}\"}} {v}\n",
                        label(pipeline),
                        label(stage),
                        label(project)
                    ));
                }
            }
        }
    }
}

/// A pipeline of the served directory.
pub struct Loaded {
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) ticker: Option<Ticker>,
    pub(crate) file: PathBuf,
    pub(crate) digest: String,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("engine", &self.engine)
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

/// Everything the scheduler loop and the API share.
pub struct Server {
    /// Runs execute in this process, on the local executor, with the home's stores.
    pub engine: Engine,
    /// The engine's home (`submitted/` keeps posted pipelines for their reruns).
    pub home: PathBuf,
    /// The served directory, where schedules registered over the API are written.
    pub(crate) dir: PathBuf,
    pub(crate) pipelines: std::sync::RwLock<BTreeMap<String, Arc<Loaded>>>,
    pub(crate) cancels: Mutex<BTreeMap<RunId, tokio::sync::watch::Sender<bool>>>,
    /// `--token`: an admin of every project.
    pub token: Option<String>,
    /// `--insecure-no-auth`: without a token, mutating routes are open too.
    pub insecure_no_auth: bool,
    /// Every request needs a bearer token: the server has `--token`, `--oidc`, or tokens
    /// in its state store when it started.
    pub auth_required: bool,
    pub oidc: Option<crate::oidc::Oidc>,
    /// Each project's runs in flight and GPUs claimed, within its quota.
    pub(crate) quotas: crate::quota::Quotas,
    /// The artifact stores of projects but the default one, opened once each.
    pub(crate) stores: Mutex<BTreeMap<String, ArtifactStore>>,
    /// The address the API listens on (its port resolved).
    pub bound: SocketAddr,
    /// Posted pipelines validated at once (see [`VALIDATIONS`]).
    pub validations: Arc<tokio::sync::Semaphore>,
    pub metrics: Metrics,
    pub(crate) catalog: Catalog,
    /// Set on SIGTERM: no new work, and the live streams of pages end.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// The event streams and followed logs open, within the listener's limits.
    pub streams: Arc<crate::listener::Streams>,
    /// The run list's changes, polled once for every stream of it.
    pub runs_feed: crate::feed::RunsFeed,
    /// The state reads of streams at once (each on the blocking pool): a thousand streams
    /// share a few threads instead of taking a thread each.
    pub stream_reads: tokio::sync::Semaphore,
    /// Fired ticks recorded since then without a run are started by the next loop.
    pub(crate) unstarted_since: Mutex<String>,
    /// The loops of webhook triggers, by (pipeline, trigger), woken by a call.
    pub(crate) hooks: Mutex<BTreeMap<(String, String), Arc<tokio::sync::Notify>>>,
    /// `--notify FILE`'s sinks: told of every run, besides its pipeline's own.
    pub(crate) default_sinks: Vec<drivetrain_engine::events::Sink>,
    /// Where people reach the web view: the base of the run links in notifications.
    pub public_url: String,
}

/// Every valid pipeline under `dir`; those with a `schedule:` are registered.
pub(crate) fn load(
    catalog: &Catalog,
    dir: &Path,
    state: &dyn StateStore,
    schedules: bool,
) -> anyhow::Result<BTreeMap<String, Arc<Loaded>>> {
    let mut out = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    for file in files {
        let source = std::fs::read_to_string(&file)?;
        let Some(mut pipeline) = drivetrain_engine::validate_file(&file, &source, catalog).pipeline
        else {
            eprintln!(
                "skipping {}: it does not validate (see `drivetrain validate`)",
                file.display()
            );
            continue;
        };
        let abs = std::fs::canonicalize(&file)?;
        // A trigger watching a folder beside the pipeline watches it wherever served from.
        if let Some(folder) = abs.parent() {
            pipeline.sources_in_folder(folder);
        }
        let ticker = match &pipeline.schedule {
            Some(s) if schedules => {
                state.upsert_schedule(&pipeline.name, &abs.display().to_string(), &now_text())?;
                Some(Ticker::new(s).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?)
            }
            _ => None,
        };
        out.insert(
            pipeline.name.clone(),
            Arc::new(Loaded {
                digest: digest(&source),
                pipeline: Arc::new(pipeline),
                ticker,
                file: abs,
            }),
        );
    }
    Ok(out)
}

/// Who may call a server: `--token` (an admin of every project), `--insecure-no-auth`
/// (without a token, mutating routes are open too), whether every request needs a bearer
/// token, and an OpenID Connect issuer's ID tokens.
#[derive(Debug, Default)]
pub struct Auth {
    pub token: Option<String>,
    pub insecure_no_auth: bool,
    pub auth_required: bool,
    pub oidc: Option<crate::oidc::Oidc>,
}

impl Server {
    /// A server of the runs of `engine`, serving `pipelines` (loaded from `dir`, of the
    /// engine's `home`), called as `auth` says at `bound`, within the listener's
    /// `limits`; `default_sinks` are told of every run.
    pub fn new(
        engine: Engine,
        catalog: Catalog,
        (home, dir): (PathBuf, PathBuf),
        pipelines: BTreeMap<String, Arc<Loaded>>,
        auth: Auth,
        (bound, limits): (SocketAddr, crate::listener::Limits),
        default_sinks: Vec<drivetrain_engine::events::Sink>,
    ) -> Server {
        Server {
            engine,
            home,
            dir,
            pipelines: std::sync::RwLock::new(pipelines),
            cancels: Mutex::new(BTreeMap::new()),
            token: auth.token,
            insecure_no_auth: auth.insecure_no_auth,
            auth_required: auth.auth_required,
            oidc: auth.oidc,
            quotas: Default::default(),
            stores: Mutex::new(BTreeMap::new()),
            bound,
            validations: Arc::new(tokio::sync::Semaphore::new(VALIDATIONS)),
            metrics: Metrics::new(),
            catalog,
            stopping: std::sync::atomic::AtomicBool::new(false),
            streams: crate::listener::Streams::new(limits),
            runs_feed: Default::default(),
            stream_reads: tokio::sync::Semaphore::new(STREAM_READS),
            hooks: Mutex::new(BTreeMap::new()),
            default_sinks,
            public_url: format!("http://{bound}"),
            // At start, a week back: a tick queued or claimed while no server ran.
            unstarted_since: Mutex::new(
                (chrono::Utc::now() - chrono::Duration::days(7))
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            ),
        }
    }

    /// The project of a pipeline this server knows (`default` for one it does not serve).
    pub fn project_of(&self, pipeline: &str) -> String {
        self.loaded()
            .get(pipeline)
            .map(|l| l.pipeline.project.clone())
            .unwrap_or_else(|| drivetrain_engine::access::DEFAULT_PROJECT.to_owned())
    }

    /// Whether `who` may read what belongs to `pipeline`.
    pub fn readable(&self, who: &drivetrain_engine::access::Subject, pipeline: &str) -> bool {
        let readable = who.projects_for(drivetrain_engine::access::Verb::Read);
        drivetrain_engine::access::Subject::may(&readable, &self.project_of(pipeline))
    }

    /// The artifact store of `project`'s runs: the engine's for the default project,
    /// `projects/PROJECT` under it for the others.
    pub fn store_for(&self, project: &str) -> anyhow::Result<ArtifactStore> {
        if project.is_empty() || project == drivetrain_engine::access::DEFAULT_PROJECT {
            return Ok(self.engine.artifacts().clone());
        }
        let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = stores.get(project) {
            return Ok(s.clone());
        }
        let url = drivetrain_engine::artifacts::project_url(self.engine.artifacts().url(), project);
        let store = ArtifactStore::open_project(&url, project)?;
        stores.insert(project.to_owned(), store.clone());
        Ok(store)
    }

    /// The request of a run of `l` with `params`, started by `trigger`.
    pub(crate) fn request_of(
        &self,
        run: &RunId,
        l: &Loaded,
        params: BTreeMap<String, Value>,
        trigger: &str,
    ) -> RunRequest {
        let mut request = RunRequest::new(
            run.clone(),
            l.pipeline.clone(),
            l.file.display().to_string(),
            l.digest.clone(),
        );
        request.params = params;
        request.trigger = trigger.into();
        request
    }

    /// A pipeline given as YAML, or its problems (each with line and column) on one line.
    pub fn validated(&self, yaml: &str) -> Result<Pipeline, String> {
        problems(drivetrain_engine::validate(yaml, &self.catalog))
    }

    /// The pipeline run `record` ran (its kept text `yaml`), validated from its file's
    /// folder as the run was: plugin steps by path are that folder's.
    pub fn validated_run(
        &self,
        record: &drivetrain_engine::state::RunRecord,
        yaml: &str,
    ) -> Result<Pipeline, String> {
        let file = std::path::Path::new(&record.file);
        problems(drivetrain_engine::validate_file(file, yaml, &self.catalog))
    }

    /// [`Server::validated`] for YAML posted to the server, which has no folder of its
    /// own: a relative `workdir` or `{{ pipeline.dir }}` is refused, where it is written.
    pub fn validated_posted(&self, yaml: &str) -> Result<Pipeline, String> {
        let pipeline = self.validated(yaml)?;
        let uses: Vec<String> = pipeline
            .stages
            .iter()
            .flat_map(|s| s.folder_uses())
            .collect();
        if !uses.is_empty() {
            return Err(format!(
                "the pipeline does not validate: {}: a relative `workdir` and `{{{{ pipeline.dir }}}}` name the pipeline file's folder, and a pipeline posted to a server has none; give absolute paths on the server's machine, or serve the pipeline from its folder (`drivetrain serve --pipelines DIR`)",
                uses.join(", ")
            ));
        }
        Ok(pipeline)
    }

    pub(crate) fn loaded(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Loaded>>> {
        self.pipelines.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a pipeline given as YAML (it must have a `schedule:`): written into the
    /// served directory, so it is served again after a restart, and scheduled from now.
    /// An existing pipeline of the same name is replaced only when `replace` is set.
    /// A pipeline name belongs to one project: `who` replaces a served pipeline of
    /// another project than the posted one's only as an admin of that project (403).
    pub fn register(
        &self,
        pipeline: Pipeline,
        yaml: &str,
        replace: bool,
        who: &Subject,
    ) -> Result<(String, String), (u16, String)> {
        let Some(sched) = &pipeline.schedule else {
            return Err((
                400,
                format!("pipeline `{}` has no `schedule:`", pipeline.name),
            ));
        };
        let name = pipeline.name.clone();
        let ticker = Ticker::new(sched).map_err(|e| (400, e.to_string()))?;
        let mut pipelines = self.pipelines.write().unwrap_or_else(|e| e.into_inner());
        if let Some(served) = pipelines.get(&name) {
            if !replace {
                return Err((
                    409,
                    format!(
                        "pipeline `{name}` is already served; send `replace: true` to replace it"
                    ),
                ));
            }
            let owner = &served.pipeline.project;
            let admin = decide(who, Verb::ManageTokens, owner, None);
            if *owner != pipeline.project && !admin.allowed {
                return Err((
                    403,
                    format!(
                        "pipeline `{name}` belongs to project `{owner}`: only an admin of `{owner}` gives it to `{}` ({})",
                        pipeline.project, admin.reason
                    ),
                ));
            }
        }
        let file = self.dir.join(format!("{name}.yaml"));
        std::fs::write(&file, yaml)
            .map_err(|e| (500, format!("cannot write {}: {e}", file.display())))?;
        self.engine
            .state()
            .upsert_schedule(&name, &file.display().to_string(), &now_text())
            .map_err(|e| (500, e.to_string()))?;
        let next = ticker
            .next_after(chrono::Utc::now())
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "never".into());
        pipelines.insert(
            name.clone(),
            Arc::new(Loaded {
                digest: digest(yaml),
                pipeline: Arc::new(pipeline),
                ticker: Some(ticker),
                file,
            }),
        );
        Ok((name, next))
    }

    /// Starts a rerun or retry of an ended run in this process; answers once it is
    /// recorded, so a client (the web view) can read it at once.
    /// A refusal answers with its status ([`refusal_status`]), as every submission's error.
    pub async fn rerun(
        self: &Arc<Self>,
        spec: &RerunSpec,
        id: RunId,
    ) -> Result<RunId, (u16, String)> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err((503, "the server is shutting down".into()));
        }
        let refused = |r: Refusal| (refusal_status(&r), r.to_string());
        let parent = self
            .engine
            .state()
            .run(&spec.parent)
            .map_err(|_| (404, format!("no run `{}`", spec.parent)))?;
        let source =
            drivetrain_engine::state::sources::pipeline_text(self.engine.state().as_ref(), &parent)
                .map_err(|why| (500, why.to_string()))?;
        let pipeline = self
            .validated_run(&parent, &source)
            .map_err(|why| (500, why))?;
        let source = RerunSource {
            pipeline,
            file: parent.file.clone(),
            spec_digest: digest(&source),
        };
        let (request, _) = self
            .engine
            .rerun_request(spec, source, id.clone())
            .await
            .map_err(refused)?;
        self.submit(request)
    }

    /// Resumes the runs whose engine is gone (a server or engine killed while they ran):
    /// each taken over here ([`Server::resume`] keeps what succeeded and re-attaches to or
    /// reruns what was in flight).
    pub(crate) fn resume_orphans(&self) -> anyhow::Result<Vec<RunId>> {
        let mut resumed = Vec::new();
        let before = stale_before();
        for r in self.engine.state().list_runs(10_000)? {
            if r.phase.is_terminal()
                || r.engine_pid
                    .is_some_and(drivetrain_engine::engine::recover::alive)
            {
                continue;
            }
            // A pid is only this machine's: a run whose engine still beats (on another
            // machine sharing the state store, or just killed here) is not taken now; the
            // periodic `take_over_stale` takes it once its heartbeat is stale. One replica
            // of any starting together wins.
            if !self.engine.state().take_over(&r.id, &before)? {
                continue;
            }
            resumed.push(r.id);
        }
        Ok(resumed)
    }

    /// Resumes runs taken over (or whose approvals are decided) in this process, a
    /// triggered run's manifest written first.
    pub(crate) async fn resume(self: &Arc<Self>, runs: &[RunId]) -> anyhow::Result<()> {
        for run in runs {
            if let Err(e) = self.restore_manifest(run).await {
                eprintln!("run {run}: cannot write its trigger's manifest again: {e:#}");
            }
            let (mut request, reaped) = match self.engine.resume_held(&self.catalog, run).await {
                Ok(r) => r,
                Err(why) => {
                    eprintln!("run {run}: cannot resume it: {why}");
                    // One that cannot be resumed here ever (its pipeline changed or no
                    // longer validates) ends, rather than being taken over again and again.
                    let lasting = matches!(why, Refusal::Usage(_) | Refusal::Failed(_));
                    match self.engine.state().run(run) {
                        Ok(r) if lasting && !r.phase.is_terminal() => {
                            let reason = format!("cannot be resumed: {why}");
                            self.engine.end_orphan(&r, Phase::Error, &reason).await?;
                        }
                        _ => {}
                    }
                    continue;
                }
            };
            println!(
                "run {run}: resumed here; {} attempt(s) lost, {} re-attached",
                reaped.lost,
                reaped.reattach.len()
            );
            let project = request.pipeline.project.clone();
            if project != drivetrain_engine::access::DEFAULT_PROJECT {
                request.store = Some(self.store_for(&project)?);
            }
            self.start(request)?;
        }
        Ok(())
    }

    /// Takes over the runs whose engine stopped beating, on this machine or another one
    /// sharing the state store, and resumes them here (as `resume_orphans`).
    pub(crate) fn take_over_stale(&self) -> anyhow::Result<Vec<RunId>> {
        let before = stale_before();
        let mut taken = Vec::new();
        for run in self.engine.state().stale_runs(&before)? {
            // One of ours whose beats were late (a stalled runtime) is still ours.
            let ours = self
                .cancels
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&run);
            if !ours && self.engine.state().take_over(&run, &before)? {
                taken.push(run);
            }
        }
        Ok(taken)
    }

    pub fn in_flight(&self) -> usize {
        self.cancels.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Stops a run this server is running.
    pub fn cancel(&self, run: &RunId) -> bool {
        match self
            .cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run)
        {
            Some(tx) => {
                let _ = tx.send(true);
                true
            }
            None => false,
        }
    }

    /// Starts a run of a served pipeline.
    pub fn submit_named(
        self: &Arc<Self>,
        name: &str,
        overrides: &[(String, String)],
        id: RunId,
    ) -> Result<RunId, (u16, String)> {
        let Some(l) = self.loaded().get(name).cloned() else {
            let loaded = self.loaded();
            let names: Vec<&str> = loaded.keys().map(String::as_str).collect();
            return Err((
                400,
                format!("no pipeline `{name}`; this server has {}", names.join(", ")),
            ));
        };
        let params = l
            .pipeline
            .resolve_params(overrides)
            .map_err(|e| (400, e.join("; ")))?;
        self.submit(self.request_of(&id, &l, params, "api"))
    }

    /// Starts a run of a pipeline given as YAML, validated by [`Server::validated`].
    pub fn submit_yaml(
        self: &Arc<Self>,
        pipeline: Pipeline,
        yaml: &str,
        overrides: &[(String, String)],
        id: RunId,
    ) -> Result<RunId, (u16, String)> {
        let params = pipeline
            .resolve_params(overrides)
            .map_err(|e| (400, e.join("; ")))?;
        // Kept, so a rerun or retry of the run can read the pipeline it ran.
        let dir = self.home.join("submitted");
        let file = dir.join(format!("{id}.yaml"));
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&file, yaml))
            .map_err(|e| {
                (
                    500,
                    format!("cannot keep the pipeline in {}: {e}", file.display()),
                )
            })?;
        let mut request = RunRequest::new(
            id,
            Arc::new(pipeline),
            file.display().to_string(),
            digest(yaml),
        );
        request.params = params;
        request.trigger = "api".into();
        self.submit(request)
    }

    /// The quota of `project`, if it has one.
    pub(crate) fn quota_of(&self, project: &str) -> anyhow::Result<Option<Quota>> {
        let quota = self
            .engine
            .state()
            .quotas()?
            .get(project)
            .copied()
            .unwrap_or_default();
        Ok((quota != Quota::default()).then_some(quota))
    }

    /// Records a new run now (`Pending` while its project has a quota), so a client may
    /// ask for it as soon as its id is answered, and starts it in this process.
    pub(crate) fn submit(
        self: &Arc<Self>,
        mut request: RunRequest,
    ) -> Result<RunId, (u16, String)> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err((503, "the server is shutting down".into()));
        }
        let id = request.id.clone();
        let bounded = self
            .quota_of(&request.pipeline.project)
            .map_err(start_error)?
            .is_some();
        self.engine
            .admit(&mut request, bounded)
            .map_err(|e| start_error(e.into()))?;
        self.start(request).map_err(start_error)?;
        Ok(id)
    }

    /// Runs `request`, recorded already, in this process: first waiting for its place
    /// in its project's quota, then on the engine; cancelled through [`Server::cancel`].
    pub(crate) fn start(self: &Arc<Self>, mut request: RunRequest) -> anyhow::Result<()> {
        if self.stopping.load(Ordering::SeqCst) {
            anyhow::bail!("the server is shutting down");
        }
        let run = request.id.clone();
        let quota = self.quota_of(&request.pipeline.project)?;
        let gpus = crate::quota::demand(&request.pipeline);
        if request.pipeline.project != drivetrain_engine::access::DEFAULT_PROJECT
            && request.store.is_none()
        {
            request.store = Some(self.store_for(&request.pipeline.project)?);
        }
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run.clone(), tx);
        let (events, mut drain) = tokio::sync::mpsc::unbounded_channel();
        let me = self.clone();
        let pipeline_name = request.pipeline.name.clone();
        let project = request.pipeline.project.clone();
        tokio::spawn(async move {
            let mut last = Instant::now();
            while let Some(ev) = drain.recv().await {
                match ev {
                    RunEvent::Used { stage, usage } => {
                        me.metrics.used(&project, &pipeline_name, &stage, usage);
                    }
                    RunEvent::Started { attempt: 1, .. } => {
                        me.metrics
                            .transition_seconds
                            .observe(last.elapsed().as_secs_f64());
                    }
                    RunEvent::Finished {
                        origin, elapsed, ..
                    } => {
                        last = Instant::now();
                        me.metrics.stage_seconds.observe(elapsed.as_secs_f64());
                        match origin {
                            Some(Origin::Cached { .. }) => {
                                me.metrics.cache_hits.fetch_add(1, Ordering::Relaxed)
                            }
                            Some(Origin::Ran) => {
                                me.metrics.cache_misses.fetch_add(1, Ordering::Relaxed)
                            }
                            // Taken from the parent by a rerun: neither a hit nor a miss.
                            Some(Origin::Reused { .. }) | None => 0,
                        };
                    }
                    _ => {}
                }
            }
        });
        let engine = self.engine.clone();
        let me = self.clone();
        let project = request.pipeline.project.clone();
        let mut stop = rx.clone();
        let fut = async move {
            // Its place first (at once without a quota); cancelled while it waits, it ends.
            let bounded = quota.is_some();
            let quota = quota.unwrap_or_default();
            let held = tokio::select! {
                h = me.quotas.enter(&project, quota, gpus), if bounded => Some(h),
                _ = stop.wait_for(|c| *c), if bounded => None,
                else => None,
            };
            let _held = match held {
                Some(Ok(h)) => Some(h),
                Some(Err(why)) => return Err((Phase::Error, format!("cannot start: {why}"))),
                None if bounded => {
                    let why = "cancelled while waiting for its project's quota";
                    return Err((Phase::Cancelled, why.to_owned()));
                }
                None => None,
            };
            engine
                .run(request, events, rx)
                .await
                .map_err(|e| (Phase::Error, format!("{:#}", anyhow::Error::from(e))))
        };
        let me = self.clone();
        tokio::spawn(async move {
            match fut.await {
                Ok(s) => println!("run {run} {}", s.phase),
                Err((Phase::Cancelled, why)) => {
                    println!("run {run} Cancelled: {why}");
                    let (server, id) = (me.clone(), run.clone());
                    let _ = tokio::task::spawn_blocking(move || {
                        server
                            .engine
                            .state()
                            .finish_run(&id, Phase::Cancelled, Some(&why))
                    })
                    .await;
                }
                Err((_, why)) => {
                    eprintln!("run {run}: {why}");
                    // Ended as Error with the reason, not left Running to be taken over
                    // (and fail the same way) again and again (the engine ends the runs
                    // it fails itself; this is for the quota's).
                    me.engine.end_after_failure(&run, &why).await;
                }
            }
            me.cancels
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&run);
        });
        Ok(())
    }

    /// Decides and starts the due ticks of every schedule; returns how long to sleep.
    /// The decisions of all schedules take a fixed number of state-store reads and one
    /// write transaction ([`schedule::due_all`]), and every fired run is recorded in it
    /// before any of them starts: a thousand schedules due at the same second are
    /// recorded within milliseconds of it.
    pub(crate) fn tick(
        self: &Arc<Self>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<Duration> {
        let pipelines: Vec<(String, Arc<Loaded>)> = self
            .loaded()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let due: Vec<schedule::Due<'_>> = pipelines
            .iter()
            .filter_map(|(name, l)| {
                Some(schedule::Due {
                    pipeline: name,
                    schedule: l.pipeline.schedule.as_ref()?,
                    ticker: l.ticker.as_ref()?,
                })
            })
            .collect();
        let by_name: BTreeMap<&str, &Arc<Loaded>> =
            pipelines.iter().map(|(k, l)| (k.as_str(), l)).collect();
        let mut requests: BTreeMap<RunId, RunRequest> = BTreeMap::new();
        let since = self
            .unstarted_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let decided = schedule::due_all(
            self.engine.state().as_ref(),
            &due,
            now,
            &since,
            &mut |pipeline, at, run| {
                let l = by_name[pipeline];
                let p = l.pipeline.resolve_params(&[]).map_err(|e| e.join("; "))?;
                let mut request = self.request_of(run, l, p, "schedule");
                request.scheduled_time =
                    Some(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                let record = request.record(self.engine.executor().name());
                requests.insert(run.clone(), request);
                Ok(Some(record))
            },
        )?;
        // Queued ticks are looked for again among those recorded since a minute before
        // this look (clocks of replicas sharing the store differ a little).
        *self
            .unstarted_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = (chrono::Utc::now()
            - chrono::Duration::seconds(60))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let mut fire = Vec::new();
        for d in decided {
            let l = by_name[d.pipeline.as_str()];
            match d.decision {
                Decision::Skip { at, reason } => {
                    self.metrics.ticks_skipped.fetch_add(1, Ordering::Relaxed);
                    println!(
                        "tick {}: skipped ({reason})",
                        schedule::tick_id(&d.pipeline, at)
                    );
                }
                Decision::Fire { at, run, replace } => {
                    let (Some(record), Some(mut request)) = (d.record, requests.remove(&run))
                    else {
                        continue;
                    };
                    self.metrics.ticks_fired.fetch_add(1, Ordering::Relaxed);
                    for r in &replace {
                        if self.cancel(r) {
                            println!(
                                "tick {}: replacing run {r}",
                                schedule::tick_id(&d.pipeline, at)
                            );
                        }
                    }
                    if let Ok(created) = chrono::DateTime::parse_from_rfc3339(&record.created_at) {
                        let lag = (created.with_timezone(&chrono::Utc) - at)
                            .num_milliseconds()
                            .max(0) as f64
                            / 1000.0;
                        self.metrics.schedule_lag_seconds.observe(lag);
                    }
                    request.resume = Some(runner::Resume::recorded(record));
                    fire.push((run, l.clone(), at, request));
                }
            }
        }
        for (run, l, at, request) in fire {
            println!(
                "tick {}: run {run}",
                schedule::tick_id(&l.pipeline.name, at)
            );
            if let Err(e) = self.start(request) {
                eprintln!("run {run}: cannot start: {e:#}");
            }
        }
        // Until the next tick, but at most a second: suspends, resumes and triggers made
        // elsewhere are seen within it.
        let next = pipelines
            .iter()
            .map(|(_, l)| l)
            .filter_map(|l| l.ticker.as_ref()?.next_after(now))
            .min()
            .map(|t| (t - chrono::Utc::now()).to_std().unwrap_or_default())
            .unwrap_or(Duration::from_secs(1));
        Ok(next.min(Duration::from_secs(1)))
    }
}

/// The status of each refusal of the engine: what was asked does not fit (400), names
/// nothing (404), or conflicts with a run (409: it still runs, or there is nothing to do);
/// the rest is the server's (500).
pub(crate) fn refusal_status(refusal: &Refusal) -> u16 {
    match refusal {
        Refusal::Usage(_) => 400,
        Refusal::NotFound(_) => 404,
        Refusal::Busy(_) | Refusal::Nothing(_) => 409,
        Refusal::Failed(_) | Refusal::State(_) => 500,
    }
}

/// A run that could not start is the server's fault (503 while it shuts down, else 500),
/// never the client's.
fn start_error(e: anyhow::Error) -> (u16, String) {
    let code = if e.to_string().contains("shutting down") {
        503
    } else {
        500
    };
    (code, format!("{e:#}"))
}

/// How many posted pipelines are validated at once: with the per-document bounds of
/// validation, this bounds the memory requests can take together.
pub const VALIDATIONS: usize = 2;
/// State reads of event streams and followed logs at once.
pub const STREAM_READS: usize = 4;

/// The pipeline, or its problems (each with line and column) on one line.
fn problems(validated: drivetrain_engine::Validated) -> Result<Pipeline, String> {
    validated.pipeline.ok_or_else(|| {
        let msgs: Vec<String> = validated
            .diagnostics
            .iter()
            .map(|d| d.to_string())
            .collect();
        format!("the pipeline does not validate: {}", msgs.join("; "))
    })
}
