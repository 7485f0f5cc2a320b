//! The run loop: a planned pipeline in, stage attempts out, every transition recorded.
//!
//! Event-driven: a stage is decided the moment its last upstream stage ends (no polling),
//! then either launched (bounded by `parallelism`), skipped (its `when` is false, or a
//! required input's producer was skipped) or omitted (something it depends on failed).
//! Each attempt is recorded in the state store before its process starts; retries follow
//! the stage's policy (exponential backoff with jitter, capped, filtered by `retries.on`);
//! timeouts cancel the attempt. A failed stage stops its dependants while independent
//! branches finish, unless `fail_fast` stops everything.

use crate::names::StageName;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use crate::artifacts::{ArtifactRef, ArtifactStore, AttemptKey};
use crate::executor::Executor;
use crate::plan::{Action, Pipeline, RetryPolicy, Stage, StageId};
use crate::spec::{ErrorClass, Hook, RetryOn};
use crate::state::{ArtifactRecord, CacheEntry, Origin, Provenance, Success};
use crate::state::{Phase, RunId, RunRecord, StateError, StateStore};
use crate::template::Ref;

mod approval;
mod attempt;
mod dag;
mod end;
pub mod folder;
mod gpus;
#[cfg(test)]
mod in_process;
mod keys;
mod map;
mod prepare;
mod request;
mod search;
mod secrets;
mod unseen;
mod when;
use attempt::{attempt_loop, AbortOnDrop};
use dag::{Dag, StageResult};
use gpus::GpuPool;
use keys::{cache_hit, cacheable, input_artifacts, key_parts, resolve_external};
use map::execute_map;
pub use request::RunRequest;

/// How a run is carried out: its request, with what the engine settled for it.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    /// What was asked; its params and resume are taken out when the run starts.
    pub request: RunRequest,
    /// The most attempts running at once.
    pub parallelism: usize,
    /// Where attempts get their working directories (`.drivetrain/work`).
    pub work_dir: PathBuf,
    /// GPUs of this machine that stages may claim (`resources.gpu`), as
    /// `CUDA_VISIBLE_DEVICES` names them (UUIDs or indices).
    pub gpus: Vec<String>,
    /// How a built-in step runs: this argv plus the step's name (`drivetrain step`),
    /// with the rendered `with:` block in `DRIVETRAIN_STEP_CONFIG`. Empty: steps cannot
    /// run here.
    pub step_command: Vec<String>,
    /// Resolves what stages read from outside their inputs (`registry:MODEL@ALIAS`) for
    /// their cache keys; `None`: such stages are not looked up in the cache.
    pub resolver: Option<Arc<dyn crate::cache::Resolver>>,
}

/// How a run uses the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheMode {
    /// Look entries up (`--no-cache` and `--overwrite-cache` turn this off).
    pub read: bool,
    /// Record entries (`--no-cache` turns this off).
    pub write: bool,
}

impl Default for CacheMode {
    fn default() -> Self {
        CacheMode {
            read: true,
            write: true,
        }
    }
}

/// A stage's results taken from an earlier run by a rerun or retry.
#[derive(Debug, Clone)]
pub struct Reused {
    pub outputs: BTreeMap<String, ArtifactRef>,
    pub values: Value,
    /// How the earlier run came by them: its origin names the run the outputs are from.
    pub provenance: Provenance,
}

/// What the run loop reports as it goes (for progress output).
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    Started {
        stage: StageName,
        attempt: u32,
    },
    Retrying {
        stage: StageName,
        attempt: u32,
        delay: Duration,
        reason: String,
    },
    Finished {
        stage: StageName,
        phase: Phase,
        /// How a stage that succeeded came by its outputs; `None` in every other phase.
        origin: Option<Origin>,
        reason: Option<String>,
        elapsed: Duration,
    },
    /// A map stage starts its items.
    Items {
        stage: StageName,
        total: usize,
    },
    /// One item of a map stage ended.
    ItemDone {
        stage: StageName,
        succeeded: bool,
    },
    /// What an attempt used, where its executor measured it.
    Used {
        stage: StageName,
        usage: crate::executor::ResourceUsage,
    },
}

/// A run-level failure of the engine or its infrastructure (not of a stage).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The state store failed; the run's record may be incomplete.
    #[error(transparent)]
    State(#[from] StateError),
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub id: RunId,
    pub phase: Phase,
    pub stages: BTreeMap<StageName, Phase>,
}

/// What a resumed run keeps from before: its record and every stage that succeeded.
#[derive(Debug, Clone)]
pub struct Resume {
    pub record: RunRecord,
    /// Succeeded stages: name → (outputs, values). They are not executed again.
    pub succeeded: BTreeMap<StageName, (BTreeMap<String, ArtifactRef>, Value)>,
    /// The highest attempt number recorded per stage; new attempts count on from it.
    pub attempts: BTreeMap<StageName, u32>,
    /// Stages whose next attempt is one still running on the executor, which watches it
    /// again: its directory, inputs and outputs are the job's, not prepared afresh.
    pub reattached: std::collections::BTreeSet<StageName>,
}

impl Resume {
    /// A run recorded a moment ago by whoever asked for it, before it started: nothing
    /// done yet.
    pub fn recorded(record: RunRecord) -> Resume {
        Resume {
            record,
            succeeded: BTreeMap::new(),
            attempts: BTreeMap::new(),
            reattached: Default::default(),
        }
    }
}

/// Everything attempts share.
struct Ctx {
    pipeline: Arc<Pipeline>,
    params: BTreeMap<String, Value>,
    run: RunRecord,
    state: Arc<dyn StateStore>,
    artifacts: ArtifactStore,
    executor: Arc<dyn Executor>,
    opts: RunOptions,
    events: mpsc::UnboundedSender<RunEvent>,
    cancel: watch::Receiver<bool>,
    /// Hooks stop only on a cancel that arrives while they run: they still run after a
    /// failure, fail-fast or a cancel of the rest of the run.
    hook_cancel: watch::Receiver<bool>,
    /// The run's parallelism: an attempt holds one slot from when it is recorded as
    /// started until its process has ended and its log and outputs are stored.
    slots: Arc<Semaphore>,
    gpus: GpuPool,
    /// How the ordinary stages ended, once they have (`run.status` for hooks).
    main_phase: std::sync::OnceLock<Phase>,
    /// Attempt numbers already used, on a resume.
    prior_attempts: BTreeMap<StageName, u32>,
    /// Stages whose first attempt here re-attaches ([`Resume::reattached`]).
    reattached: std::collections::BTreeSet<StageName>,
    files: crate::cache::FileDigests,
    /// The pipeline file's folder ([`folder::pipeline_dir`]).
    folder: Option<std::path::PathBuf>,
    /// Each plugin step's snapshot (by digest), where its attempts read `{{ step.dir }}`,
    /// or why there is none ([`crate::plugin::snapshot`]).
    plugins: HashMap<String, Result<std::path::PathBuf, crate::plugin::PluginError>>,
    /// The code the run ran: the git commit of the pipeline's folder ([`folder::code`]),
    /// kept in each stage's provenance (not its cache key).
    code: Value,
}

impl Ctx {
    /// Whether `key` is an attempt a restarted engine watches again rather than starts.
    fn reattaches(&self, key: &AttemptKey) -> bool {
        key.item.is_none()
            && self.reattached.contains(key.stage.as_str())
            && self
                .prior_attempts
                .get(key.stage.as_str())
                .copied()
                .unwrap_or(0)
                + 1
                == key.attempt
    }

    fn stop_for(&self, stage: &Stage) -> watch::Receiver<bool> {
        match stage.hook {
            Some(_) => self.hook_cancel.clone(),
            None => self.cancel.clone(),
        }
    }
}

/// What a run needs: the request's parts and the engine's services
/// ([`crate::engine::Engine::run`] makes it).
pub(crate) struct Job {
    pub(crate) state: Arc<dyn StateStore>,
    pub(crate) artifacts: ArtifactStore,
    pub(crate) executor: Arc<dyn Executor>,
    pub(crate) opts: RunOptions,
}

/// The run `request` asks for, recorded: created, or reopened by a resume; and the text
/// of its pipeline kept, for its graph should the file change or go (the web view,
/// reruns, resume).
fn recorded(
    state: &dyn StateStore,
    request: &mut RunRequest,
    executor: &str,
) -> Result<Resume, RunError> {
    let resume = match request.resume.take() {
        Some(r) => {
            state.reopen_run(&request.id, std::process::id())?;
            // What the dead engine's attempts held in the GPU ledger is theirs no more.
            state.release_gpus(&request.id, None)?;
            r
        }
        None => {
            let fresh = request.record(executor);
            state.create_run(&fresh)?;
            Resume::recorded(fresh)
        }
    };
    crate::state::sources::keep_file(state, &request.file, &request.spec_digest)?;
    Ok(resume)
}

/// Runs every stage of the job's pipeline once and records it. Returns when the run has
/// ended; the run's phase is `Succeeded` when every stage succeeded or was skipped.
pub(crate) async fn run(
    job: Job,
    events: mpsc::UnboundedSender<RunEvent>,
    cancel: watch::Receiver<bool>,
) -> Result<RunSummary, RunError> {
    let Job {
        state,
        artifacts,
        executor,
        mut opts,
    } = job;
    let id = opts.request.id.clone();
    let pipeline = opts.request.pipeline.clone();
    let resume = recorded(state.as_ref(), &mut opts.request, executor.name())?;
    let params = std::mem::take(&mut opts.request.params);
    let Resume {
        record,
        succeeded: prior,
        attempts: prior_attempts,
        reattached,
    } = resume;
    let _beat = heartbeat(state.clone(), id.clone());
    let slots = Arc::new(Semaphore::new(opts.parallelism.max(1)));
    // Stages in hand (looking up the cache, waiting for a slot, recording how they
    // ended): twice the parallelism, so that one stage's bookkeeping overlaps another's
    // process rather than holding up a slot.
    let in_hand = Arc::new(Semaphore::new(opts.parallelism.max(1).saturating_mul(2)));
    // Attempts stop on `stop`: set by the caller's cancel, or by fail-fast.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (hook_stop_tx, hook_stop_rx) = watch::channel(false);
    let forward = {
        let mut external = cancel.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            if external.wait_for(|c| *c).await.is_ok() {
                let _ = stop_tx.send(true);
            }
        })
    };
    let opts_home = opts
        .work_dir
        .parent()
        .unwrap_or(&opts.work_dir)
        .to_path_buf();
    let folder = folder::pipeline_dir(&opts.request.file, &opts_home);
    let opts_home = &opts_home;
    let gpus = GpuPool::new(
        state.clone(),
        id.clone(),
        record.project.clone(),
        opts.gpus.clone(),
    );
    let ctx = Arc::new(Ctx {
        pipeline: pipeline.clone(),
        params,
        run: record,
        state: state.clone(),
        artifacts,
        executor,
        opts,
        events,
        cancel: stop_rx,
        hook_cancel: hook_stop_rx,
        slots,
        gpus,
        main_phase: std::sync::OnceLock::new(),
        prior_attempts,
        reattached,
        files: Default::default(),
        code: folder.as_deref().map(folder::code).unwrap_or_default(),
        plugins: snapshots(&pipeline, opts_home),
        folder,
    });

    let mut dag = Dag::new(&pipeline);
    take_earlier(&ctx, &pipeline, &prior, &mut dag)?;
    let waiting = drive_stages(&ctx, &mut dag, &cancel, &stop_tx, in_hand).await?;
    let cancelled = *cancel.borrow();
    if !waiting.is_empty() && !cancelled {
        // No process, no slot: `approve` (or a timeout) resumes it.
        forward.abort();
        return wait_for_people(&ctx, &dag, waiting);
    }
    for name in &waiting {
        // Cancelled while waiting for people.
        let sid = pipeline
            .stage_by_name(name)
            .expect("a stage of the pipeline")
            .id;
        end_without_running(
            &ctx,
            sid,
            Phase::Cancelled,
            "cancelled while waiting for approval".into(),
            &mut dag,
        )?;
    }
    let main_phase = dag.run_phase(&pipeline, cancelled, |s| s.hook.is_none());
    let _ = ctx.main_phase.set(main_phase);

    run_hooks(&ctx, &mut dag, &cancel, hook_stop_tx, main_phase).await?;
    forward.abort();

    let stages = dag.phases(&pipeline);
    let phase = dag.run_phase(&pipeline, cancelled, |_| true);
    let failed: Vec<&str> = stages
        .iter()
        .filter(|(_, p)| matches!(p, Phase::Failed | Phase::Error))
        .map(|(s, _)| s.as_str())
        .collect();
    let reason = (!failed.is_empty()).then(|| format!("failed: {}", failed.join(", ")));
    state.finish_run(&id, phase, reason.as_deref())?;
    Ok(RunSummary { id, phase, stages })
}

/// The run's heartbeat, for replicas that take over the runs of a dead engine: beats
/// until dropped.
fn heartbeat(state: Arc<dyn StateStore>, id: RunId) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let every = heartbeat_interval();
        loop {
            // A missed beat is retried on the next one; only a long silence counts.
            let _ = state.heartbeat(&id);
            tokio::time::sleep(every).await;
        }
    }))
}

/// Starts every stage as it becomes ready (or ends it at once: skipped, omitted, a
/// stopping run's) until none is left; fail-fast and a cancel stop the rest. Returns
/// the stages waiting for people.
async fn drive_stages(
    ctx: &Arc<Ctx>,
    dag: &mut Dag,
    cancel: &watch::Receiver<bool>,
    stop: &watch::Sender<bool>,
    in_hand: Arc<Semaphore>,
) -> Result<Vec<String>, RunError> {
    let pipeline = ctx.pipeline.clone();
    let mut tasks: JoinSet<(StageId, Result<StageResult, RunError>)> = JoinSet::new();
    let mut stopping = false;
    let mut waiting: Vec<String> = Vec::new();

    loop {
        stopping |= *cancel.borrow();
        // Decide every ready stage; decisions that end a stage at once may make more ready.
        while let Some(id) = dag.next_ready() {
            let decision = if stopping {
                Some((Phase::Omitted, "the run is stopping".to_owned()))
            } else {
                decide(&pipeline, ctx, id, dag)
            };
            match decision {
                Some((phase, reason)) => {
                    end_without_running(ctx, id, phase, reason, dag)?;
                }
                None => {
                    let inputs = dag.upstream(&pipeline, id);
                    let ctx = ctx.clone();
                    let in_hand = in_hand.clone();
                    // A map stage's items are bounded by its own limit; the stage itself
                    // holds nothing.
                    let is_map = pipeline.stage(id).map.is_some();
                    tasks.spawn(async move {
                        let _permit = match is_map {
                            true => None,
                            false => Some(in_hand.acquire_owned().await.expect("never closed")),
                        };
                        (id, execute(&ctx, id, inputs).await)
                    });
                }
            }
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let (id, result) = match joined {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let result = result?;
        // Waiting for people: its dependants do not start; the run waits once the rest is
        // done.
        if result.phase == Phase::Waiting {
            waiting.push(pipeline.stage(id).name.to_string());
            continue;
        }
        if matches!(result.phase, Phase::Failed | Phase::Error) && ctx.opts.request.fail_fast {
            stopping = true;
            let _ = stop.send(true);
        }
        if *cancel.borrow() {
            stopping = true;
        }
        dag.end(&pipeline, id, result);
    }

    Ok(waiting)
}

/// Ends a run whose stages wait for people: recorded `Waiting`, holding nothing.
fn wait_for_people(ctx: &Ctx, dag: &Dag, waiting: Vec<String>) -> Result<RunSummary, RunError> {
    let (pipeline, id) = (&ctx.pipeline, ctx.run.id.clone());
    let reason = format!("waiting for approval: {}", waiting.join(", "));
    ctx.state.finish_run(&id, Phase::Waiting, Some(&reason))?;
    let mut stages = dag.phases(pipeline);
    for (name, phase) in stages.iter_mut() {
        if waiting.iter().any(|w| w == name) {
            *phase = Phase::Waiting;
        } else if *phase == Phase::Omitted && dag_unended(pipeline, dag, name) {
            *phase = Phase::Pending;
        }
    }
    Ok(RunSummary {
        id,
        phase: Phase::Waiting,
        stages,
    })
}

/// Whether stage `name` has not ended in `dag` (it waits for an approval upstream).
fn dag_unended(pipeline: &Pipeline, dag: &Dag, name: &str) -> bool {
    pipeline
        .stage_by_name(name)
        .is_some_and(|s| dag.result(s.id).is_none())
}

/// A resumed run starts from what already succeeded: those stages end at once. In
/// plan order an upstream stage ends first, so each is removed from `ready` after any
/// upstream stage queued it.
/// A rerun or retry also ends the stages it reuses from its parent, recorded as its own.
fn take_earlier(
    ctx: &Ctx,
    pipeline: &Pipeline,
    prior: &BTreeMap<StageName, (BTreeMap<String, ArtifactRef>, Value)>,
    dag: &mut Dag,
) -> Result<(), RunError> {
    for &id in &pipeline.order {
        let name = &pipeline.stage(id).name;
        // A rerun or retry records what it takes from its parent as this run's own.
        let taken = match (prior.contains_key(name), ctx.opts.request.reuse.get(name)) {
            (false, Some(r)) => {
                let from = r.provenance.origin.run().unwrap_or("?");
                let reason = format!("reused from run {from}");
                record_taken(
                    ctx,
                    name,
                    &r.provenance,
                    &r.outputs,
                    &r.values,
                    reason,
                    Duration::ZERO,
                )?;
                Some((r.outputs.clone(), r.values.clone()))
            }
            _ => None,
        };
        if let Some((outputs, values)) = prior.get(name).cloned().or(taken) {
            let result = StageResult {
                phase: Phase::Succeeded,
                outputs,
                values,
            };
            dag.end(pipeline, id, result);
        }
    }
    Ok(())
}

/// Ends stage `id` without running it (skipped, omitted), saying why.
fn end_without_running(
    ctx: &Ctx,
    id: StageId,
    phase: Phase,
    reason: String,
    dag: &mut Dag,
) -> Result<(), RunError> {
    let stage = ctx.pipeline.stage(id);
    ctx.state
        .set_stage(&ctx.run.id, &stage.name, phase, None, Some(&reason))?;
    let _ = ctx.events.send(RunEvent::Finished {
        stage: stage.name.clone(),
        phase,
        origin: None,
        reason: Some(reason),
        elapsed: Duration::ZERO,
    });
    dag.end(&ctx.pipeline, id, StageResult::empty(phase));
    Ok(())
}

/// Runs the hooks, after everything else: `finally` always, `on_failure` when the run
/// (`main_phase`) failed. A cancel that arrives while they run stops them.
async fn run_hooks(
    ctx: &Ctx,
    dag: &mut Dag,
    cancel: &watch::Receiver<bool>,
    hook_stop_tx: watch::Sender<bool>,
    main_phase: Phase,
) -> Result<(), RunError> {
    let pipeline = &ctx.pipeline;
    let hook_forward = AbortOnDrop({
        let mut external = cancel.clone();
        external.borrow_and_update();
        tokio::spawn(async move {
            if external.changed().await.is_ok() {
                let _ = hook_stop_tx.send(true);
            }
        })
    });
    for &id in &pipeline.order {
        let stage = pipeline.stage(id);
        let Some(hook) = stage.hook else { continue };
        let triggered = match hook {
            Hook::Finally => true,
            Hook::OnFailure => main_phase != Phase::Succeeded,
        };
        let skip = if !triggered {
            Some(format!(
                "on_failure hook; the run {}",
                main_phase.as_str().to_lowercase()
            ))
        } else {
            hook_condition(pipeline, ctx, id, dag)
        };
        match skip {
            Some(reason) => end_without_running(ctx, id, Phase::Skipped, reason, dag)?,
            None => {
                let inputs = dag.upstream(pipeline, id);
                let result = execute(ctx, id, inputs).await?;
                dag.end(pipeline, id, result);
            }
        }
    }
    drop(hook_forward);
    Ok(())
}

/// A triggered hook runs unless its own `when` is false; what it depends on may have
/// failed (that is what `on_failure` hooks are for).
fn hook_condition(pipeline: &Pipeline, ctx: &Ctx, id: StageId, dag: &Dag) -> Option<String> {
    let (expr, text) = pipeline.stage(id).when.as_ref()?;
    let values = dag.upstream(pipeline, id);
    let lookup = |r: &Ref| lookup_value(pipeline, ctx, &values, r);
    (!expr.eval(&lookup)).then(|| format!("`when: {text}` was false"))
}

/// Whether a ready stage ends without running, and why.
fn decide(pipeline: &Pipeline, ctx: &Ctx, id: StageId, dag: &Dag) -> Option<(Phase, String)> {
    let stage = pipeline.stage(id);
    if let Some(selection) = &ctx.opts.request.selection {
        if stage.hook.is_none() && !selection.contains(&stage.name) {
            let parent = ctx
                .opts
                .request
                .parent
                .as_ref()
                .map(|p| p.0.as_str())
                .unwrap_or("?");
            return Some((
                Phase::Skipped,
                format!("not selected: this run (from run {parent}) executes only its selection"),
            ));
        }
    }
    if let Some(blocked) = dag.blocked(pipeline, id) {
        return Some(blocked);
    }
    if let Some((expr, text)) = &stage.when {
        let values = dag.upstream(pipeline, id);
        if let Some(why) = when::unreported(pipeline, &values, expr) {
            return Some((Phase::Failed, why));
        }
        let lookup = |r: &Ref| lookup_value(pipeline, ctx, &values, r);
        if !expr.eval(&lookup) {
            return Some((Phase::Skipped, format!("`when: {text}` was false")));
        }
    }
    None
}

/// The snapshot of each plugin step the pipeline's stages use, by digest.
fn snapshots(
    pipeline: &Pipeline,
    home: &std::path::Path,
) -> HashMap<String, Result<std::path::PathBuf, crate::plugin::PluginError>> {
    let mut out = HashMap::new();
    for p in pipeline.stages.iter().filter_map(|s| s.plugin.as_ref()) {
        if !out.contains_key(&p.digest) {
            out.insert(p.digest.clone(), crate::plugin::snapshot::snapshot(p, home));
        }
    }
    out
}

/// The value of a reference known before a stage starts.
fn lookup_value(
    pipeline: &Pipeline,
    ctx: &Ctx,
    upstream: &BTreeMap<StageId, StageResult>,
    r: &Ref,
) -> Option<Value> {
    match r {
        Ref::Param(p) => ctx.params.get(p).cloned(),
        Ref::RunId => Some(Value::String(ctx.run.id.0.clone())),
        Ref::RunDate => Some(Value::String(ctx.run.created_at.get(..10)?.to_owned())),
        Ref::RunStatus => Some(Value::String(
            ctx.main_phase
                .get()
                .copied()
                .unwrap_or(Phase::Running)
                .as_str()
                .to_owned(),
        )),
        Ref::PipelineName => Some(Value::String(pipeline.name.clone())),
        Ref::PipelineDir => Some(Value::String(ctx.folder.as_ref()?.display().to_string())),
        Ref::ScheduleTime => Some(Value::String(
            ctx.run
                .scheduled_time
                .clone()
                .unwrap_or_else(|| ctx.run.created_at.clone()),
        )),
        Ref::StageValue { stage, key } => {
            let id = pipeline.stage_by_name(stage)?.id;
            let mut v = &upstream.get(&id)?.values;
            for k in key {
                v = v.get(k)?;
            }
            Some(v.clone())
        }
        Ref::Input(_) | Ref::Output(_) | Ref::Item(_) | Ref::Trial(_) => None,
        // A step file's own: put in place when planned (`with`), the stage's (`step.dir`).
        Ref::With(_) | Ref::StepDir => None,
    }
}

/// Which record an attempt loop writes: the stage's own attempts, one map item's, or
/// (none: the search records it) one trial's.
#[derive(Debug, Clone, Copy)]
enum Track<'v> {
    Stage,
    Item {
        index: usize,
        item: &'v Value,
    },
    /// A search's trial at one rung: its attempts are the search's to record.
    Trial {
        index: usize,
        trial: &'v search::TrialRun,
    },
}

/// How an attempt loop ended.
struct LoopEnd {
    /// The stage's attempt that succeeded, for [`execute`] to record as ended with the
    /// stage (in one commit); none where it is recorded already or there is none.
    attempt: Option<u32>,
    phase: Phase,
    exit: Option<i32>,
    reason: Option<String>,
    outputs: BTreeMap<String, ArtifactRef>,
    values: Value,
}

/// Runs one stage to its end: attempts, retries, publishing.
async fn execute(
    ctx: &Ctx,
    id: StageId,
    upstream: BTreeMap<StageId, StageResult>,
) -> Result<StageResult, RunError> {
    let stage = ctx.pipeline.stage(id);
    if let Action::Approval { .. } = &stage.action {
        return approval::settle(ctx, stage, &upstream);
    }
    let started = Instant::now();
    let unsupported = match unsupported(ctx, stage) {
        Some(why) => Some(why),
        None => approval::guard(ctx, stage, moved_alias(ctx, stage, &upstream))?,
    };
    let (mut parts, external) = key_parts(ctx, stage, &upstream);
    let resolved = resolve_external(ctx, &external, &mut parts).await;
    let key = parts.key();
    let inputs = input_artifacts(stage, &upstream);
    let cacheable = cacheable(ctx, stage).and(resolved);
    // A stage whose attempt a restarted engine watches again is that attempt's: its job
    // runs (or ran) on the executor, whatever another run left in the cache meanwhile.
    let read = ctx.opts.request.cache.read && !ctx.reattached.contains(&stage.name);
    let mut provenance = Provenance {
        origin: Origin::Ran,
        cache_key: Some(key.clone()),
        provenance: serde_json::json!({
            "components": parts.components,
            "definition": parts.definition,
            "code": ctx.code,
            "plugin": stage.plugin,
            "cache": match &cacheable {
                Ok(()) if read => "hit".to_owned(),
                Ok(()) if ctx.opts.request.cache.read => {
                    "not looked up (its attempt was re-attached)".to_owned()
                }
                Ok(()) => "not looked up (--overwrite-cache)".to_owned(),
                Err(why) => format!("not cacheable: {why}"),
            },
        }),
        inputs: serde_json::to_value(&inputs).unwrap_or_default(),
    };
    if cacheable.is_ok() && read {
        let found = cache_hit(ctx, stage, &key).await?;
        if let Err(why) = &found {
            provenance.provenance["cache"] = Value::String(format!("miss: {why}"));
        }
        if let Ok(hit) = found {
            provenance.origin = Origin::Cached {
                run: hit.run_id.clone(),
            };
            // A partial result reused is still partial: its warnings go with it.
            let reason = match attempt::warnings(&hit.values) {
                Some(w) => format!("cached (from run {})\n{w}", hit.run_id),
                None => format!("cached (from run {})", hit.run_id),
            };
            record_taken(
                ctx,
                &stage.name,
                &provenance,
                &hit.outputs,
                &hit.values,
                reason,
                started.elapsed(),
            )?;
            return Ok(StageResult {
                phase: Phase::Succeeded,
                outputs: hit.outputs,
                values: hit.values,
            });
        }
    }
    ctx.state
        .set_provenance(&ctx.run.id, &stage.name, &provenance)?;
    let end = match unsupported {
        Some(reason) => refuse(ctx, stage, reason)?,
        None if stage.map.is_some() => execute_map(ctx, stage, &upstream).await?,
        None if stage.search.is_some() => {
            // A trial's rung may be cached on its own: its key is the stage's, and more.
            let trials = cacheable.is_ok().then_some(&parts);
            search::execute_search(ctx, stage, trials, &upstream).await?
        }
        None => {
            let first = ctx.prior_attempts.get(&stage.name).copied().unwrap_or(0) + 1;
            attempt_loop(ctx, stage, Track::Stage, &upstream, first).await?
        }
    };
    let cache = (cacheable.is_ok() && ctx.opts.request.cache.write).then_some((key, &parts));
    record_end(ctx, stage, &end, cache)?;
    let _ = ctx.events.send(RunEvent::Finished {
        stage: stage.name.clone(),
        phase: end.phase,
        origin: (end.phase == Phase::Succeeded).then_some(Origin::Ran),
        reason: end.reason,
        elapsed: started.elapsed(),
    });
    Ok(StageResult {
        phase: end.phase,
        outputs: end.outputs,
        values: end.values,
    })
}

/// The registry alias a stage moves: the rendered `alias` of a step that writes the
/// registry (`promote`).
fn moved_alias(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Option<String> {
    let Action::Step {
        registry: true,
        config,
        ..
    } = &stage.action
    else {
        return None;
    };
    let lookup = |r: &Ref| lookup_value(&ctx.pipeline, ctx, upstream, r);
    let rendered = crate::template::render_value(config, &lookup);
    rendered.get("alias")?.as_str().map(str::to_owned)
}

/// Why this engine cannot run a stage at all, if it cannot.
fn unsupported(ctx: &Ctx, stage: &Stage) -> Option<String> {
    let executor = ctx.executor.as_ref();
    if !matches!(stage.action, Action::Approval { .. }) {
        let refused = stage.volumes.iter().find_map(|v| {
            let why = executor.refuses_volume(v)?;
            Some(format!("volume `{}` cannot be mounted: {why}", v.name))
        });
        if refused.is_some() {
            return refused;
        }
    }
    match &stage.action {
        Action::Step { name, .. } if ctx.opts.step_command.is_empty() => Some(format!(
            "built-in step `{name}` cannot run: this engine has no step runner"
        )),
        Action::Step { .. } if lacks_gpus(ctx, stage) => Some(too_few_gpus(stage, &ctx.opts.gpus)),
        Action::Step { .. } => None,
        Action::Command { .. }
            if stage.secrets.iter().any(|s| s.mount_path.is_some())
                && !ctx.executor.mounts_secret_files() =>
        {
            Some(format!(
                "secrets mounted as files (`mount_path`) are not supported by the `{}` executor here; expose each key with `env:` instead, or run the stage where its executor can mount them (`kubernetes`, or `local` with its mount namespace)",
                ctx.executor.name()
            ))
        }
        Action::Command { .. } if lacks_gpus(ctx, stage) => {
            Some(too_few_gpus(stage, &ctx.opts.gpus))
        }
        Action::Command { .. } if stage.plugin.is_some() => {
            let p = stage.plugin.as_ref()?;
            ctx.plugins.get(&p.digest)?.as_ref().err().map(|e| e.to_string())
        }
        Action::Command { .. } | Action::Approval { .. } => None,
    }
}

/// Whether the stage asks for more GPUs than this machine has, where they are this
/// machine's to give.
fn lacks_gpus(ctx: &Ctx, stage: &Stage) -> bool {
    stage.gpus() > ctx.opts.gpus.len() && !ctx.executor.schedules_gpus()
}

/// A stage this engine cannot run ends in `Error` with one attempt that says why.
fn refuse(ctx: &Ctx, stage: &Stage, reason: String) -> Result<LoopEnd, RunError> {
    let attempt = ctx.prior_attempts.get(&stage.name).copied().unwrap_or(0) + 1;
    ctx.state.start_attempt(&ctx.run.id, &stage.name, attempt)?;
    ctx.state.finish_attempt(
        &ctx.run.id,
        &stage.name,
        attempt,
        Phase::Error,
        None,
        Some(&reason),
    )?;
    Ok(LoopEnd {
        attempt: None,
        phase: Phase::Error,
        exit: None,
        reason: Some(reason),
        outputs: BTreeMap::new(),
        values: Value::Null,
    })
}

/// Records how a stage that ran ended: a success with its artifacts, results and (when
/// `cache` holds its key and parts) its cache entry in one commit; any other end its
/// phase and reason.
fn record_end(
    ctx: &Ctx,
    stage: &Stage,
    end: &LoopEnd,
    cache: Option<(String, &crate::cache::KeyParts)>,
) -> Result<(), RunError> {
    if end.phase != Phase::Succeeded {
        ctx.state.set_stage(
            &ctx.run.id,
            &stage.name,
            end.phase,
            end.exit,
            end.reason.as_deref(),
        )?;
        return Ok(());
    }
    let outputs_json = serde_json::to_value(&end.outputs).unwrap_or_default();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let published: Vec<ArtifactRecord> = end
        .outputs
        .iter()
        .map(|(output, art)| ArtifactRecord {
            digest: art.digest.clone(),
            manifest: art.manifest.clone(),
            run_id: ctx.run.id.0.clone(),
            stage: stage.name.to_string(),
            output: output.clone(),
            created_at: now.clone(),
        })
        .collect();
    let cache = cache.map(|(key, parts)| CacheEntry {
        key,
        pipeline: ctx.pipeline.name.clone(),
        stage: stage.name.to_string(),
        run_id: ctx.run.id.0.clone(),
        outputs: outputs_json.clone(),
        values: end.values.clone(),
        components: serde_json::to_value(&parts.components).unwrap_or_default(),
        created_at: now,
    });
    ctx.state.record_success(&Success {
        run: &ctx.run.id,
        stage: &stage.name,
        attempt: end.attempt,
        artifacts: &published,
        outputs: &outputs_json,
        values: &end.values,
        cache: cache.as_ref(),
        exit_code: end.exit,
        reason: end.reason.as_deref(),
    })?;
    Ok(())
}

/// Records a stage that ends with outputs it did not make (a cache hit, a rerun's
/// reuse): how it came by them, the outputs, then the phase, so a stage recorded as
/// succeeded always has its outputs.
fn record_taken(
    ctx: &Ctx,
    stage: &str,
    provenance: &Provenance,
    outputs: &BTreeMap<String, ArtifactRef>,
    values: &Value,
    reason: String,
    elapsed: Duration,
) -> Result<(), RunError> {
    let outputs_json = serde_json::to_value(outputs).unwrap_or_default();
    ctx.state.set_provenance(&ctx.run.id, stage, provenance)?;
    ctx.state
        .set_stage_results(&ctx.run.id, stage, &outputs_json, values)?;
    ctx.state
        .set_stage(&ctx.run.id, stage, Phase::Succeeded, None, None)?;
    let _ = ctx.events.send(RunEvent::Finished {
        stage: stage.into(),
        phase: Phase::Succeeded,
        origin: Some(provenance.origin.clone()),
        reason: Some(reason),
        elapsed,
    });
    Ok(())
}

/// An error with its sources, `outer: inner: root`, for reasons people read.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_owned()
}

/// Whether a failure of `class` (with `exit`) is retried under `policy.on`.
pub fn retryable(policy: &RetryPolicy, class: ErrorClass, exit: Option<i32>) -> bool {
    if policy.on.is_empty() {
        return true;
    }
    policy.on.iter().any(|on| match on {
        RetryOn::ExitCode(c) => exit == Some(*c),
        RetryOn::Class(ErrorClass::Failed) => class == ErrorClass::Failed,
        RetryOn::Class(c) => *c == class,
    })
}

/// The delay before retry number `attempt` (1-based): `backoff · 2^(attempt-1)`, capped at
/// `max_backoff`, with ±20% jitter derived from the attempt's identity.
pub fn backoff(policy: &RetryPolicy, attempt: u32, key: &AttemptKey) -> Duration {
    let base = policy
        .backoff
        .saturating_mul(1u32 << (attempt - 1).min(20))
        .min(policy.max_backoff);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key
        .run
        .bytes()
        .chain(key.stage_key().into_bytes())
        .chain(attempt.to_le_bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let jitter = (h % 4001) as f64 / 10_000.0 - 0.2; // -0.2 ..= 0.2
    base.mul_f64(1.0 + jitter).min(policy.max_backoff)
}

/// GPUs an attempt claims: `resources.gpu` per worker.
/// Why a stage needing more GPUs than the machine has cannot run.
fn too_few_gpus(stage: &Stage, gpus: &[String]) -> String {
    format!(
        "stage needs {} GPU(s); this machine has {} ({}; `drivetrain doctor` shows what was \
         found, `--gpus N` or DRIVETRAIN_LOCAL_GPUS overrides)",
        stage.gpus(),
        gpus.len(),
        match gpus.len() {
            0 => "none found by NVML or nvidia-smi, or CUDA_VISIBLE_DEVICES hides them".to_owned(),
            _ => gpus.join(", "),
        }
    )
}

/// How often a running engine records its heartbeat: `DRIVETRAIN_HEARTBEAT` (e.g. `2s`),
/// default 5 s. A run silent for three intervals is taken over by a serving replica.
pub fn heartbeat_interval() -> Duration {
    std::env::var("DRIVETRAIN_HEARTBEAT")
        .ok()
        .and_then(|v| humantime::parse_duration(&v).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(5))
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!("{}h{}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let policy = RetryPolicy {
            limit: 10,
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(60),
            on: Vec::new(),
        };
        let key = AttemptKey::of_stage("r", "s", 1);
        let d1 = backoff(&policy, 1, &key);
        let d2 = backoff(&policy, 2, &key);
        let d5 = backoff(&policy, 5, &key);
        assert!(
            d1 >= Duration::from_secs(8) && d1 <= Duration::from_secs(12),
            "{d1:?}"
        );
        assert!(
            d2 >= Duration::from_secs(16) && d2 <= Duration::from_secs(24),
            "{d2:?}"
        );
        assert!(d5 <= Duration::from_secs(60), "{d5:?}");
        assert!(d5 >= Duration::from_secs(48), "{d5:?}");
    }

    #[test]
    fn retry_filters() {
        let mut policy = RetryPolicy {
            limit: 3,
            ..RetryPolicy::default()
        };
        assert!(retryable(&policy, ErrorClass::Failed, Some(1)));
        policy.on = vec![RetryOn::ExitCode(75), RetryOn::Class(ErrorClass::Timeout)];
        assert!(retryable(&policy, ErrorClass::Failed, Some(75)));
        assert!(!retryable(&policy, ErrorClass::Failed, Some(1)));
        assert!(retryable(&policy, ErrorClass::Timeout, None));
        assert!(!retryable(&policy, ErrorClass::Error, None));
    }
}
