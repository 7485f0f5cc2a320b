//! The run loop: a planned pipeline in, stage attempts out, every transition recorded.
//!
//! Event-driven: a stage is decided the moment its last upstream stage ends (no polling),
//! then either launched (bounded by `parallelism`), skipped (its `when` is false, or a
//! required input's producer was skipped) or omitted (something it depends on failed).
//! Each attempt is recorded in the state store before its process starts; retries follow
//! the stage's policy (exponential backoff with jitter, capped, filtered by `retries.on`);
//! timeouts cancel the attempt. A failed stage stops its dependants while independent
//! branches finish, unless `fail_fast` stops everything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use crate::artifacts::{ArtifactRef, ArtifactStore, AttemptKey};
use crate::executor::{AttemptOutcome, AttemptSpec, Executor, PathAccess};
use crate::plan::{Action, MapSource, Pipeline, RetryPolicy, Stage, StageId};
use crate::spec::{ErrorClass, Hook, IoMode, RetryOn};
use crate::state::{ArtifactRecord, CacheEntry, Provenance};
use crate::state::{Phase, RunId, RunRecord, StateError, StateStore};
use crate::step::env_suffix;
use crate::template::{value_text, Ref, Template};

/// How a run is carried out.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The most attempts running at once.
    pub parallelism: usize,
    /// Stop everything at the first failure.
    pub fail_fast: bool,
    /// Where attempts get their working directories (`.drivetrain/work`).
    pub work_dir: PathBuf,
    /// The pipeline file, as given.
    pub file: String,
    /// sha256 of the pipeline file.
    pub spec_digest: String,
    pub trigger: String,
    /// GPUs of this machine that stages may claim (`resources.gpu`), indices `0..gpus`.
    pub gpus: usize,
    /// The run this one reruns or retries.
    pub parent: Option<RunId>,
    /// The stages to execute (a rerun's or retry's selection); the others end at once,
    /// `reused` when listed in [`RunOptions::reuse`], else `Skipped`. `None`: all.
    pub selection: Option<BTreeSet<String>>,
    /// Stages whose outputs come from an earlier run, not executed.
    pub reuse: BTreeMap<String, Reused>,
    /// What a rerun overrode (recorded with the run).
    pub overrides: Value,
    pub cache: CacheMode,
    /// The cron tick this run is for (`{{ schedule.time }}`); default: the run's start.
    pub scheduled_time: Option<String>,
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
    /// How the earlier run came by them: `origin_run` names the run the outputs are from.
    pub provenance: Provenance,
}

/// The machine's GPUs: a stage asking for `n` waits until `n` are free and gets their
/// indices (as `CUDA_VISIBLE_DEVICES`), so two stages never share one.
#[derive(Debug)]
struct GpuPool {
    free: std::sync::Mutex<Vec<bool>>,
    released: tokio::sync::Notify,
}

impl GpuPool {
    fn new(n: usize) -> Self {
        GpuPool {
            free: std::sync::Mutex::new(vec![true; n]),
            released: tokio::sync::Notify::new(),
        }
    }

    async fn acquire(&self, n: usize) -> Vec<usize> {
        loop {
            let notified = self.released.notified();
            {
                let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
                let idle: Vec<usize> = (0..free.len()).filter(|&i| free[i]).take(n).collect();
                if idle.len() == n {
                    for &i in &idle {
                        free[i] = false;
                    }
                    return idle;
                }
            }
            notified.await;
        }
    }

    fn release(&self, gpus: &[usize]) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for &i in gpus {
            free[i] = true;
        }
        drop(free);
        self.released.notify_waiters();
    }
}

/// What the run loop reports as it goes (for progress output).
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    Started {
        stage: String,
        attempt: u32,
    },
    Retrying {
        stage: String,
        attempt: u32,
        delay: Duration,
        reason: String,
    },
    Finished {
        stage: String,
        phase: Phase,
        reason: Option<String>,
        elapsed: Duration,
    },
    /// A map stage starts its items.
    Items {
        stage: String,
        total: usize,
    },
    /// One item of a map stage ended.
    ItemDone {
        stage: String,
        succeeded: bool,
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
    pub stages: BTreeMap<String, Phase>,
}

/// What a finished stage leaves for its dependants.
#[derive(Debug, Clone)]
struct StageResult {
    phase: Phase,
    outputs: BTreeMap<String, ArtifactRef>,
    values: Value,
}

/// What a resumed run keeps from before: its record and every stage that succeeded.
#[derive(Debug, Clone)]
pub struct Resume {
    pub record: RunRecord,
    /// Succeeded stages: name → (outputs, values). They are not executed again.
    pub succeeded: BTreeMap<String, (BTreeMap<String, ArtifactRef>, Value)>,
    /// The highest attempt number recorded per stage; new attempts count on from it.
    pub attempts: BTreeMap<String, u32>,
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
    /// The run's parallelism: attempts (and map items) hold one slot each.
    slots: Arc<Semaphore>,
    gpus: GpuPool,
    /// How the ordinary stages ended, once they have (`run.status` for hooks).
    main_phase: std::sync::OnceLock<Phase>,
    /// Attempt numbers already used, on a resume.
    prior_attempts: BTreeMap<String, u32>,
    files: crate::cache::FileDigests,
}

impl Ctx {
    fn stop_for(&self, stage: &Stage) -> watch::Receiver<bool> {
        match stage.hook {
            Some(_) => self.hook_cancel.clone(),
            None => self.cancel.clone(),
        }
    }
}

/// Runs every stage of `pipeline` once, as run `id`, and records it. Returns when the
/// run has ended; the run's phase is `Succeeded` when every stage succeeded or was
/// skipped.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    id: RunId,
    pipeline: Arc<Pipeline>,
    params: BTreeMap<String, Value>,
    state: Arc<dyn StateStore>,
    artifacts: ArtifactStore,
    executor: Arc<dyn Executor>,
    opts: RunOptions,
    resume: Option<Resume>,
    events: mpsc::UnboundedSender<RunEvent>,
    cancel: watch::Receiver<bool>,
) -> Result<RunSummary, RunError> {
    let fresh = RunRecord {
        id: id.clone(),
        pipeline: pipeline.name.clone(),
        file: opts.file.clone(),
        spec_digest: opts.spec_digest.clone(),
        params: serde_json::to_value(&params).unwrap_or_default(),
        trigger: opts.trigger.clone(),
        parent: opts.parent.clone(),
        phase: Phase::Running,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        finished_at: None,
        reason: None,
        engine_pid: Some(i64::from(std::process::id())),
        overrides: opts.overrides.clone(),
        selection: opts.selection.as_ref().map(|s| s.iter().cloned().collect()),
        scheduled_time: opts.scheduled_time.clone(),
        executor: Some(executor.name().to_owned()),
    };
    let (record, prior, prior_attempts) = match resume {
        Some(r) => {
            state.reopen_run(&id, std::process::id())?;
            (r.record, r.succeeded, r.attempts)
        }
        None => {
            state.create_run(&fresh)?;
            (fresh, BTreeMap::new(), BTreeMap::new())
        }
    };
    // The run's heartbeat, for replicas that take over the runs of a dead engine.
    let _beat = {
        let (state, id) = (state.clone(), id.clone());
        AbortOnDrop(tokio::spawn(async move {
            let every = heartbeat_interval();
            loop {
                // A missed beat is retried on the next one; only a long silence counts.
                let _ = state.heartbeat(&id);
                tokio::time::sleep(every).await;
            }
        }))
    };
    let n = pipeline.stages.len();
    let slots = Arc::new(Semaphore::new(opts.parallelism.max(1)));
    let opts_gpus = opts.gpus;
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
        slots: slots.clone(),
        gpus: GpuPool::new(opts_gpus),
        main_phase: std::sync::OnceLock::new(),
        prior_attempts,
        files: Default::default(),
    });

    let mut results: Vec<Option<StageResult>> = vec![None; n];
    let mut waiting: Vec<usize> = (0..n)
        .map(|i| pipeline.upstream(StageId(i as u32)).len())
        .collect();
    let mut tasks: JoinSet<(StageId, Result<StageResult, RunError>)> = JoinSet::new();
    let mut stopping = false;
    // Ready stages, in the plan's order: (position in `pipeline.order`, stage).
    let mut rank = vec![0usize; n];
    for (i, id) in pipeline.order.iter().enumerate() {
        rank[id.index()] = i;
    }
    let mut ready: BTreeSet<(usize, StageId)> = pipeline
        .order
        .iter()
        .copied()
        .filter(|id| waiting[id.index()] == 0 && pipeline.stage(*id).hook.is_none())
        .map(|id| (rank[id.index()], id))
        .collect();
    // A resumed run starts from what already succeeded: those stages end at once. In
    // plan order an upstream stage ends first, so each is removed from `ready` after any
    // upstream stage queued it.
    for &id in &pipeline.order {
        let name = &pipeline.stage(id).name;
        // A rerun or retry records what it takes from its parent as this run's own.
        let taken = match (prior.contains_key(name), ctx.opts.reuse.get(name)) {
            (false, Some(r)) => {
                let from = r.provenance.origin_run.as_deref().unwrap_or("?");
                let reason = format!("reused from run {from}");
                record_taken(
                    &ctx,
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
            ready.remove(&(rank[id.index()], id));
            let result = StageResult {
                phase: Phase::Succeeded,
                outputs,
                values,
            };
            finish(
                &pipeline,
                &rank,
                id,
                result,
                &mut results,
                &mut waiting,
                &mut ready,
            );
        }
    }

    loop {
        // Decide every ready stage; decisions that end a stage at once may make more ready.
        while let Some((_, id)) = ready.pop_first() {
            let decision = if stopping {
                Some((Phase::Omitted, "the run is stopping".to_owned()))
            } else {
                decide(&pipeline, &ctx, id, &results)
            };
            match decision {
                Some((phase, reason)) => {
                    let stage = pipeline.stage(id);
                    state.set_stage(&ctx.run.id, &stage.name, phase, None, Some(&reason))?;
                    let _ = ctx.events.send(RunEvent::Finished {
                        stage: stage.name.clone(),
                        phase,
                        reason: Some(reason),
                        elapsed: Duration::ZERO,
                    });
                    finish(
                        &pipeline,
                        &rank,
                        id,
                        StageResult {
                            phase,
                            outputs: BTreeMap::new(),
                            values: Value::Null,
                        },
                        &mut results,
                        &mut waiting,
                        &mut ready,
                    );
                }
                None => {
                    let inputs = upstream_results(&pipeline, id, &results);
                    let ctx = ctx.clone();
                    let slots = slots.clone();
                    // A map stage's items take the slots, one each; the stage itself none.
                    let is_map = pipeline.stage(id).map.is_some();
                    tasks.spawn(async move {
                        let _permit = match is_map {
                            true => None,
                            false => Some(slots.acquire_owned().await.expect("never closed")),
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
        if matches!(result.phase, Phase::Failed | Phase::Error) && ctx.opts.fail_fast {
            stopping = true;
            let _ = stop_tx.send(true);
        }
        if *cancel.borrow() {
            stopping = true;
        }
        finish(
            &pipeline,
            &rank,
            id,
            result,
            &mut results,
            &mut waiting,
            &mut ready,
        );
    }

    let cancelled = *cancel.borrow();
    let main_phase = run_phase(&pipeline, &results, cancelled, |s| s.hook.is_none());
    let _ = ctx.main_phase.set(main_phase);

    // Hooks: after everything else, `finally` always, `on_failure` when the run failed.
    let hook_forward = {
        let mut external = cancel.clone();
        external.borrow_and_update();
        tokio::spawn(async move {
            if external.changed().await.is_ok() {
                let _ = hook_stop_tx.send(true);
            }
        })
    };
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
            hook_condition(&pipeline, &ctx, id, &results)
        };
        let result = match skip {
            Some(reason) => {
                state.set_stage(
                    &ctx.run.id,
                    &stage.name,
                    Phase::Skipped,
                    None,
                    Some(&reason),
                )?;
                let _ = ctx.events.send(RunEvent::Finished {
                    stage: stage.name.clone(),
                    phase: Phase::Skipped,
                    reason: Some(reason),
                    elapsed: Duration::ZERO,
                });
                StageResult {
                    phase: Phase::Skipped,
                    outputs: BTreeMap::new(),
                    values: Value::Null,
                }
            }
            None => {
                let inputs = upstream_results(&pipeline, id, &results);
                let _permit = slots.acquire().await.expect("never closed");
                execute(&ctx, id, inputs).await?
            }
        };
        results[id.index()] = Some(result);
    }
    forward.abort();
    hook_forward.abort();

    let stages: BTreeMap<String, Phase> = pipeline
        .stages
        .iter()
        .map(|s| {
            let phase = results[s.id.index()]
                .as_ref()
                .map(|r| r.phase)
                .unwrap_or(Phase::Omitted);
            (s.name.clone(), phase)
        })
        .collect();
    let phase = run_phase(&pipeline, &results, cancelled, |_| true);
    let failed: Vec<&str> = stages
        .iter()
        .filter(|(_, p)| matches!(p, Phase::Failed | Phase::Error))
        .map(|(s, _)| s.as_str())
        .collect();
    let reason = (!failed.is_empty()).then(|| format!("failed: {}", failed.join(", ")));
    state.finish_run(&id, phase, reason.as_deref())?;
    Ok(RunSummary { id, phase, stages })
}

/// The phase of a run over the stages `counted` selects: `Succeeded` when each succeeded
/// or was skipped (a skipped hook counts as skipped).
fn run_phase(
    pipeline: &Pipeline,
    results: &[Option<StageResult>],
    cancelled: bool,
    counted: impl Fn(&Stage) -> bool,
) -> Phase {
    let phases: Vec<Phase> = pipeline
        .stages
        .iter()
        .filter(|s| counted(s))
        .map(|s| {
            results[s.id.index()]
                .as_ref()
                .map(|r| r.phase)
                .unwrap_or(Phase::Omitted)
        })
        .collect();
    if cancelled {
        Phase::Cancelled
    } else if phases
        .iter()
        .all(|p| matches!(p, Phase::Succeeded | Phase::Skipped))
    {
        Phase::Succeeded
    } else if phases.contains(&Phase::Error) {
        Phase::Error
    } else {
        Phase::Failed
    }
}

/// A triggered hook runs unless its own `when` is false; what it depends on may have
/// failed (that is what `on_failure` hooks are for).
fn hook_condition(
    pipeline: &Pipeline,
    ctx: &Ctx,
    id: StageId,
    results: &[Option<StageResult>],
) -> Option<String> {
    let (expr, text) = pipeline.stage(id).when.as_ref()?;
    let values = upstream_results(pipeline, id, results);
    let lookup = |r: &Ref| lookup_value(pipeline, ctx, &values, r);
    (!expr.eval(&lookup)).then(|| format!("`when: {text}` was false"))
}

fn finish(
    pipeline: &Pipeline,
    rank: &[usize],
    id: StageId,
    result: StageResult,
    results: &mut [Option<StageResult>],
    waiting: &mut [usize],
    ready: &mut BTreeSet<(usize, StageId)>,
) {
    results[id.index()] = Some(result);
    for d in pipeline.downstream(id) {
        // Hooks run after the rest; a stage a rerun reused ended before its upstream did.
        if pipeline.stage(d).hook.is_some() || results[d.index()].is_some() {
            continue;
        }
        waiting[d.index()] -= 1;
        if waiting[d.index()] == 0 {
            ready.insert((rank[d.index()], d));
        }
    }
}

fn upstream_results(
    pipeline: &Pipeline,
    id: StageId,
    results: &[Option<StageResult>],
) -> BTreeMap<StageId, StageResult> {
    pipeline
        .upstream(id)
        .into_iter()
        .filter_map(|u| results[u.index()].clone().map(|r| (u, r)))
        .collect()
}

/// Whether a ready stage ends without running, and why.
fn decide(
    pipeline: &Pipeline,
    ctx: &Ctx,
    id: StageId,
    results: &[Option<StageResult>],
) -> Option<(Phase, String)> {
    let stage = pipeline.stage(id);
    if let Some(selection) = &ctx.opts.selection {
        if stage.hook.is_none() && !selection.contains(&stage.name) {
            let parent = ctx
                .opts
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
    for u in pipeline.upstream(id) {
        let phase = results[u.index()]
            .as_ref()
            .map(|r| r.phase)
            .unwrap_or(Phase::Omitted);
        if matches!(
            phase,
            Phase::Failed | Phase::Error | Phase::Omitted | Phase::Cancelled
        ) {
            return Some((
                Phase::Omitted,
                format!("`{}` did not succeed ({phase})", pipeline.stage(u).name),
            ));
        }
    }
    for input in &stage.inputs {
        let phase = results[input.stage.index()].as_ref().map(|r| r.phase);
        if phase == Some(Phase::Skipped) && !input.optional {
            return Some((
                Phase::Skipped,
                format!(
                    "input `{}` comes from `{}`, which was skipped",
                    input.name,
                    pipeline.stage(input.stage).name
                ),
            ));
        }
    }
    if let Some((expr, text)) = &stage.when {
        let values = upstream_results(pipeline, id, results);
        let lookup = |r: &Ref| lookup_value(pipeline, ctx, &values, r);
        if !expr.eval(&lookup) {
            return Some((Phase::Skipped, format!("`when: {text}` was false")));
        }
    }
    None
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
        Ref::Input(_) | Ref::Output(_) | Ref::Item(_) => None,
    }
}

/// Which record an attempt loop writes: the stage's own attempts, or one map item's.
#[derive(Debug, Clone, Copy)]
enum Track<'v> {
    Stage,
    Item { index: usize, item: &'v Value },
}

/// How an attempt loop ended.
struct LoopEnd {
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
    let started = Instant::now();
    let unsupported = match &stage.action {
        Action::Step { name, .. } if ctx.opts.step_command.is_empty() => Some(format!(
            "built-in step `{name}` cannot run: this engine has no step runner"
        )),
        Action::Step { .. } if gpus_needed(stage) > ctx.opts.gpus => Some(format!(
            "stage needs {} GPU(s); this machine declares {} (`--gpus N` or DRIVETRAIN_LOCAL_GPUS)",
            gpus_needed(stage),
            ctx.opts.gpus
        )),
        Action::Step { .. } => None,
        Action::Command { .. } if stage.secrets.iter().any(|s| s.mount_path.is_some()) => {
            Some("secrets mounted as files are not supported by the local executor".to_owned())
        }
        Action::Command { .. } if gpus_needed(stage) > ctx.opts.gpus => Some(format!(
            "stage needs {} GPU(s); this machine declares {} (`--gpus N` or DRIVETRAIN_LOCAL_GPUS)",
            gpus_needed(stage),
            ctx.opts.gpus
        )),
        Action::Command { .. } => None,
    };
    let (mut parts, external) = key_parts(ctx, stage, &upstream);
    let resolved = resolve_external(ctx, &external, &mut parts).await;
    let key = parts.key();
    let inputs = input_artifacts(stage, &upstream);
    let cacheable = cacheable(ctx, stage).and(resolved);
    let mut provenance = Provenance {
        origin: "ran".into(),
        origin_run: None,
        cache_key: Some(key.clone()),
        provenance: serde_json::json!({
            "components": parts.components,
            "definition": parts.definition,
            "cache": match &cacheable {
                Ok(()) if ctx.opts.cache.read => "hit".to_owned(),
                Ok(()) => "not looked up (--overwrite-cache)".to_owned(),
                Err(why) => format!("not cacheable: {why}"),
            },
        }),
        inputs: serde_json::to_value(&inputs).unwrap_or_default(),
    };
    if cacheable.is_ok() && ctx.opts.cache.read {
        let found = cache_hit(ctx, stage, &key).await?;
        if let Err(why) = &found {
            provenance.provenance["cache"] = Value::String(format!("miss: {why}"));
        }
        if let Ok(hit) = found {
            provenance.origin = "cached".into();
            provenance.origin_run = Some(hit.run_id.clone());
            let reason = format!("cached (from run {})", hit.run_id);
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
        Some(reason) => {
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
            LoopEnd {
                phase: Phase::Error,
                exit: None,
                reason: Some(reason),
                outputs: BTreeMap::new(),
                values: Value::Null,
            }
        }
        None if stage.map.is_some() => execute_map(ctx, stage, &upstream).await?,
        None => {
            let first = ctx.prior_attempts.get(&stage.name).copied().unwrap_or(0) + 1;
            attempt_loop(ctx, stage, Track::Stage, &upstream, first).await?
        }
    };
    if end.phase == Phase::Succeeded {
        let outputs_json = serde_json::to_value(&end.outputs).unwrap_or_default();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let published: Vec<ArtifactRecord> = end
            .outputs
            .iter()
            .map(|(output, art)| ArtifactRecord {
                digest: art.digest.clone(),
                manifest: art.manifest.clone(),
                run_id: ctx.run.id.0.clone(),
                stage: stage.name.clone(),
                output: output.clone(),
                created_at: now.clone(),
            })
            .collect();
        ctx.state.add_artifacts(&published)?;
        // Results before the phase: a stage recorded as succeeded always has its outputs.
        ctx.state
            .set_stage_results(&ctx.run.id, &stage.name, &outputs_json, &end.values)?;
        if cacheable.is_ok() && ctx.opts.cache.write {
            ctx.state.put_cache_entry(&CacheEntry {
                key,
                pipeline: ctx.pipeline.name.clone(),
                stage: stage.name.clone(),
                run_id: ctx.run.id.0.clone(),
                outputs: outputs_json,
                values: end.values.clone(),
                components: serde_json::to_value(&parts.components).unwrap_or_default(),
                created_at: now,
            })?;
        }
    }
    ctx.state.set_stage(
        &ctx.run.id,
        &stage.name,
        end.phase,
        end.exit,
        end.reason.as_deref(),
    )?;
    let _ = ctx.events.send(RunEvent::Finished {
        stage: stage.name.clone(),
        phase: end.phase,
        reason: end.reason,
        elapsed: started.elapsed(),
    });
    Ok(StageResult {
        phase: end.phase,
        outputs: end.outputs,
        values: end.values,
    })
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
        stage: stage.to_owned(),
        phase: Phase::Succeeded,
        reason: Some(reason),
        elapsed,
    });
    Ok(())
}

/// Whether a stage's outputs may come from the cache, or why not.
fn cacheable(ctx: &Ctx, stage: &Stage) -> Result<(), String> {
    if stage.hook.is_some() {
        return Err("hooks always run".into());
    }
    if let Action::Step {
        registry: true,
        name,
        ..
    } = &stage.action
    {
        return Err(format!(
            "step `{name}` writes the model registry: it runs every time"
        ));
    }
    if stage.outputs.is_empty() {
        return Err("it declares no outputs".into());
    }
    if !stage.cache.enabled {
        return Err("`cache: {enabled: false}`".into());
    }
    if !ctx.opts.cache.read && !ctx.opts.cache.write {
        return Err("the run has --no-cache".into());
    }
    Ok(())
}

/// The artifacts a stage reads, by input name.
fn input_artifacts(
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> BTreeMap<String, ArtifactRef> {
    stage
        .inputs
        .iter()
        .filter_map(|i| {
            let art = upstream.get(&i.stage)?.outputs.get(&i.output)?;
            Some((i.name.clone(), art.clone()))
        })
        .collect()
}

/// Adds the current value of each reference outside the run to `parts` (component
/// named by the reference: `registry:risk-model@production` → `2`); `Err` says why the
/// stage cannot be looked up in the cache when one cannot be read.
async fn resolve_external(
    ctx: &Ctx,
    external: &[String],
    parts: &mut crate::cache::KeyParts,
) -> Result<(), String> {
    let mut unread = Vec::new();
    for reference in external {
        let value = match &ctx.opts.resolver {
            Some(r) => r.resolve(reference, ctx.artifacts.url()).await,
            None => Err("this engine has no resolver for it".to_owned()),
        };
        match value {
            Ok(v) => parts.plain(reference.clone(), v),
            Err(why) => {
                parts.plain(reference.clone(), "unreadable".into());
                unread.push(format!("`{reference}` could not be read: {why}"));
            }
        }
    }
    match unread.is_empty() {
        true => Ok(()),
        false => Err(unread.join("; ")),
    }
}

/// The components of a stage's cache key (see [`crate::cache`]), and the references
/// outside the run it reads, rendered, for [`resolve_external`].
fn key_parts(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> (crate::cache::KeyParts, Vec<String>) {
    use serde_json::json;
    let lookup = |r: &Ref| match r {
        // Paths differ per attempt; what they hold is keyed by digest below.
        Ref::Input(_) | Ref::Output(_) | Ref::Item(_) => None,
        other => lookup_value(&ctx.pipeline, ctx, upstream, other),
    };
    let render = |t: &Template| t.render(|r| lookup(r).map(|v| value_text(&v)));
    let mut parts = crate::cache::KeyParts {
        definition: json!({}),
        ..Default::default()
    };
    let mut external = Vec::new();
    for (i, t) in stage.cache.key.iter().enumerate() {
        let entry = render(t);
        match crate::cache::is_external(&entry) {
            true => external.push(entry),
            false => parts.plain(format!("key[{i}]"), entry),
        }
    }
    match &stage.action {
        Action::Command {
            image,
            argv,
            workdir,
        } => {
            let argv: Vec<String> = argv.iter().map(render).collect();
            let workdir = workdir.as_ref().map(render);
            // Scripts a command names are part of what it does.
            for a in &argv {
                let p = Path::new(a);
                let path = match (&workdir, p.is_absolute()) {
                    (_, true) => p.to_path_buf(),
                    (Some(w), false) if !a.starts_with('-') => Path::new(w).join(p),
                    _ => continue,
                };
                if let Some(d) = ctx.files.get(&path) {
                    parts.plain(format!("file:{}", path.display()), d);
                }
            }
            parts.field("command", json!(argv));
            parts.field("workdir", json!(workdir));
            if let Some(i) = image {
                parts.plain("image".into(), render(i));
            }
        }
        Action::Step {
            name,
            version,
            config,
            reads,
            ..
        } => {
            external.extend(reads.iter().map(render));
            parts.plain("step".into(), format!("{name}@{version}"));
            let lookup = |r: &Ref| lookup(r);
            parts.field("config", crate::template::render_value(config, &lookup));
            if let Some(i) = &stage.image {
                parts.plain("image".into(), render(i));
            }
        }
    }
    let env: Vec<(String, String)> = stage
        .env
        .iter()
        .map(|(k, t)| (k.clone(), render(t)))
        .collect();
    if !env.is_empty() {
        parts.field("env", json!(env));
    }
    if !stage.secrets.is_empty() {
        let names: Vec<String> = stage
            .secrets
            .iter()
            .map(|s| format!("{}/{}", s.name, s.key.as_deref().unwrap_or("*")))
            .collect();
        parts.field("secrets", json!(names));
    }
    let io = json!({
        "inputs": stage.inputs.iter().map(|i| json!([i.name, i.output, i.mode, i.optional])).collect::<Vec<_>>(),
        "outputs": stage.outputs.iter().map(|o| json!([o.name, o.mode])).collect::<Vec<_>>(),
    });
    parts.field("io", io);
    if let Some(m) = &stage.map {
        let source = match &m.source {
            MapSource::Items(items) => json!({"items": items}),
            MapSource::Param(p) => json!({"items": ctx.params.get(p)}),
            MapSource::From { stage, output } => {
                json!({"from": format!("{}.{output}", ctx.pipeline.stage(*stage).name)})
            }
        };
        parts.field("map", source);
        if let MapSource::From { stage: s, output } = &m.source {
            if let Some(art) = upstream.get(s).and_then(|r| r.outputs.get(output)) {
                parts.plain("map-items".into(), art.digest.clone());
            }
        }
    }
    if let Some(d) = &stage.distributed {
        parts.field(
            "distributed",
            json!([format!("{:?}", d.framework), d.workers, d.slots_per_worker]),
        );
    }
    for (name, art) in input_artifacts(stage, upstream) {
        parts.plain(format!("input:{name}"), art.digest);
    }
    external.sort();
    external.dedup();
    (parts, external)
}

/// A usable cache entry.
struct Hit {
    run_id: String,
    outputs: BTreeMap<String, ArtifactRef>,
    values: Value,
}

/// The cache entry for `key` if it exists, is young enough, covers every declared output
/// and its artifacts are still in the store; otherwise why not.
async fn cache_hit(ctx: &Ctx, stage: &Stage, key: &str) -> Result<Result<Hit, String>, RunError> {
    let Some(entry) = ctx.state.cache_entry(key)? else {
        return Ok(Err("no entry has this key".into()));
    };
    if let Some(max_age) = stage.cache.max_age {
        let created = chrono::DateTime::parse_from_rfc3339(&entry.created_at).ok();
        let age = created.map(|c| chrono::Utc::now().signed_duration_since(c));
        let young = age
            .and_then(|a| a.to_std().ok())
            .is_some_and(|a| a <= max_age);
        if !young {
            return Ok(Err(format!(
                "the entry from run {} ({}) is older than `max_age` {}",
                entry.run_id,
                entry.created_at,
                humanize(max_age)
            )));
        }
    }
    let Ok(outputs) =
        serde_json::from_value::<BTreeMap<String, ArtifactRef>>(entry.outputs.clone())
    else {
        return Ok(Err("the entry's outputs do not parse".into()));
    };
    if let Some(o) = stage
        .outputs
        .iter()
        .find(|o| !outputs.contains_key(&o.name))
    {
        return Ok(Err(format!("the entry has no output `{}`", o.name)));
    }
    for (name, art) in &outputs {
        if ctx.artifacts.manifest(art).await.is_err() {
            return Ok(Err(format!(
                "output `{name}` of the entry from run {} is gone from the store",
                entry.run_id
            )));
        }
    }
    Ok(Ok(Hit {
        run_id: entry.run_id,
        outputs,
        values: entry.values,
    }))
}

/// Attempts of a stage (or of one item of a map stage) until one succeeds, the retry
/// policy gives up, or the run is cancelled; each attempt recorded before it starts.
async fn attempt_loop(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    upstream: &BTreeMap<StageId, StageResult>,
    first: u32,
) -> Result<LoopEnd, RunError> {
    let run = &ctx.run.id;
    let mut attempt = first - 1;
    loop {
        attempt += 1;
        let key = AttemptKey {
            run: run.0.clone(),
            stage: match track {
                Track::Stage => stage.name.clone(),
                Track::Item { index, .. } => format!("{}/items/{index}", stage.name),
            },
            attempt,
        };
        match track {
            Track::Stage => {
                ctx.state.start_attempt(run, &stage.name, attempt)?;
                let _ = ctx.events.send(RunEvent::Started {
                    stage: stage.name.clone(),
                    attempt,
                });
            }
            Track::Item { index, .. } => ctx.state.start_item(run, &stage.name, index, attempt)?,
        }
        let result = run_attempt(ctx, stage, track, &key, upstream).await;
        let (phase, exit, reason, class) = match result {
            Ok(AttemptEnd::Succeeded { outputs, values }) => {
                if let Track::Stage = track {
                    ctx.state.finish_attempt(
                        run,
                        &stage.name,
                        attempt,
                        Phase::Succeeded,
                        Some(0),
                        None,
                    )?;
                }
                return Ok(LoopEnd {
                    phase: Phase::Succeeded,
                    exit: Some(0),
                    reason: None,
                    outputs,
                    values,
                });
            }
            Ok(AttemptEnd::Failed {
                exit_code,
                reason,
                class,
            }) => (Phase::Failed, exit_code, reason, class),
            Ok(AttemptEnd::Cancelled) => (
                Phase::Cancelled,
                None,
                "cancelled".to_owned(),
                ErrorClass::Error,
            ),
            Err(reason) => (Phase::Error, None, reason, ErrorClass::Error),
        };
        if let Track::Stage = track {
            ctx.state
                .finish_attempt(run, &stage.name, attempt, phase, exit, Some(&reason))?;
        }
        let retry = phase != Phase::Cancelled
            && attempt - first < stage.retries.limit
            && retryable(&stage.retries, class, exit)
            && !*ctx.stop_for(stage).borrow();
        if retry {
            let delay = backoff(&stage.retries, attempt, &key);
            if let Track::Stage = track {
                let _ = ctx.events.send(RunEvent::Retrying {
                    stage: stage.name.clone(),
                    attempt: attempt + 1,
                    delay,
                    reason: first_line(&reason),
                });
            }
            let mut cancel = ctx.stop_for(stage);
            tokio::select! {
                _ = tokio::time::sleep(delay) => continue,
                _ = cancel.changed() => {}
            }
        }
        return Ok(LoopEnd {
            phase,
            exit,
            reason: Some(reason),
            outputs: BTreeMap::new(),
            values: Value::Null,
        });
    }
}

/// A map stage: one attempt loop per item, at most `max_parallel` at once (and never
/// more than the run's parallelism), items recorded in the state store. Each output of
/// the stage is the collection of the succeeded items' outputs (`i/…`).
async fn execute_map(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<LoopEnd, RunError> {
    use futures::StreamExt;
    let map = stage.map.as_ref().expect("a map stage");
    let failed = |reason: String| LoopEnd {
        phase: Phase::Failed,
        exit: None,
        reason: Some(reason),
        outputs: BTreeMap::new(),
        values: Value::Null,
    };
    let items: Vec<Value> = match &map.source {
        MapSource::Items(items) => items.clone(),
        MapSource::Param(p) => match ctx.params.get(p) {
            Some(Value::Array(items)) => items.clone(),
            _ => return Ok(failed(format!("param `{p}` is not a list"))),
        },
        MapSource::From {
            stage: from,
            output,
        } => {
            let Some(art) = upstream.get(from).and_then(|r| r.outputs.get(output)) else {
                return Ok(failed(format!("map source `{output}` has no artifact")));
            };
            match read_items(ctx, art).await {
                Ok(items) => items,
                Err(reason) => return Ok(failed(reason)),
            }
        }
    };
    ctx.state
        .set_stage(&ctx.run.id, &stage.name, Phase::Running, None, None)?;
    // On a resume, items that succeeded before keep their outputs and do not run again.
    // Items attempted before count their attempts on.
    let mut kept: BTreeMap<usize, BTreeMap<String, ArtifactRef>> = BTreeMap::new();
    let mut first_attempt = vec![1u32; items.len()];
    let prior = ctx.state.map_items(&ctx.run.id, &stage.name)?;
    let same_items =
        prior.len() == items.len() && prior.iter().zip(&items).all(|(p, i)| &p.item == i);
    if same_items {
        for p in prior {
            first_attempt[p.index] = p.attempts + 1;
            if p.phase == Phase::Succeeded {
                kept.insert(
                    p.index,
                    serde_json::from_value(p.outputs).unwrap_or_default(),
                );
            }
        }
    } else {
        ctx.state.add_map_items(&ctx.run.id, &stage.name, &items)?;
    }
    let _ = ctx.events.send(RunEvent::Started {
        stage: stage.name.clone(),
        attempt: 1,
    });
    let _ = ctx.events.send(RunEvent::Items {
        stage: stage.name.clone(),
        total: items.len(),
    });
    let limit = map
        .max_parallel
        .map(|m| m as usize)
        .unwrap_or(usize::MAX)
        .clamp(1, ctx.opts.parallelism.max(1));
    let items_ref = &items;
    let todo: Vec<usize> = (0..items.len()).filter(|i| !kept.contains_key(i)).collect();
    let results = futures::stream::iter(todo)
        .map(|index| {
            run_item(
                ctx,
                stage,
                index,
                &items_ref[index],
                upstream,
                first_attempt[index],
            )
        })
        .buffer_unordered(limit);
    futures::pin_mut!(results);
    let (mut succeeded, mut failures, mut cancelled) = (Vec::new(), 0usize, false);
    for (index, outputs) in kept {
        let _ = ctx.events.send(RunEvent::ItemDone {
            stage: stage.name.clone(),
            succeeded: true,
        });
        succeeded.push((index, outputs));
    }
    let mut first_failure: Option<String> = None;
    while let Some(r) = results.next().await {
        let (index, end) = r?;
        let _ = ctx.events.send(RunEvent::ItemDone {
            stage: stage.name.clone(),
            succeeded: end.phase == Phase::Succeeded,
        });
        match end.phase {
            Phase::Succeeded => succeeded.push((index, end.outputs)),
            Phase::Cancelled => cancelled = true,
            _ => {
                failures += 1;
                if first_failure.is_none() {
                    first_failure = end
                        .reason
                        .map(|r| format!("item {index}: {}", first_line(&r)));
                }
            }
        }
    }
    succeeded.sort_by_key(|(i, _)| *i);
    let n = items.len();
    let values = serde_json::json!({"items": n, "succeeded": succeeded.len(), "failed": failures});
    if cancelled {
        return Ok(LoopEnd {
            phase: Phase::Cancelled,
            exit: None,
            reason: Some("cancelled".into()),
            outputs: BTreeMap::new(),
            values,
        });
    }
    let needed = (map.min_success_ratio * n as f64).ceil() as usize;
    if succeeded.len() < needed {
        let mut end = failed(format!(
            "{} of {n} items succeeded, {needed} needed (min_success_ratio {}); {}",
            succeeded.len(),
            map.min_success_ratio,
            first_failure.unwrap_or_default()
        ));
        end.values = values;
        return Ok(end);
    }
    let key = AttemptKey {
        run: ctx.run.id.0.clone(),
        stage: stage.name.clone(),
        attempt: 1,
    };
    let mut outputs = BTreeMap::new();
    for o in &stage.outputs {
        let parts: Vec<(usize, ArtifactRef)> = succeeded
            .iter()
            .filter_map(|(i, outs)| outs.get(&o.name).map(|a| (*i, a.clone())))
            .collect();
        match ctx
            .artifacts
            .publish_collection(&key, &o.name, &parts)
            .await
        {
            Ok(a) => {
                outputs.insert(o.name.clone(), a);
            }
            Err(e) => {
                return Ok(LoopEnd {
                    phase: Phase::Error,
                    exit: None,
                    reason: Some(format!("cannot publish output `{}`: {}", o.name, chain(&e))),
                    outputs: BTreeMap::new(),
                    values,
                })
            }
        }
    }
    Ok(LoopEnd {
        phase: Phase::Succeeded,
        exit: None,
        reason: (failures > 0)
            .then(|| format!("{failures} of {n} items failed, within min_success_ratio")),
        outputs,
        values,
    })
}

/// One item of a map stage, holding one of the run's slots while it runs.
async fn run_item(
    ctx: &Ctx,
    stage: &Stage,
    index: usize,
    item: &Value,
    upstream: &BTreeMap<StageId, StageResult>,
    first: u32,
) -> Result<(usize, LoopEnd), RunError> {
    let _permit = ctx.slots.acquire().await.expect("never closed");
    let end = attempt_loop(ctx, stage, Track::Item { index, item }, upstream, first).await?;
    let outputs = serde_json::to_value(&end.outputs).unwrap_or_default();
    ctx.state.finish_item(
        &ctx.run.id,
        &stage.name,
        index,
        end.phase,
        end.reason.as_deref(),
        &outputs,
    )?;
    Ok((index, end))
}

/// The items of a `map.from` source: `items.json` in the artifact, a JSON list.
async fn read_items(ctx: &Ctx, art: &ArtifactRef) -> Result<Vec<Value>, String> {
    let dir = ctx
        .opts
        .work_dir
        .join(&ctx.run.id.0)
        .join("map-sources")
        .join(art.digest.replace(':', "-"));
    let _ = std::fs::remove_dir_all(&dir);
    ctx.artifacts
        .materialize(art, &dir)
        .await
        .map_err(|e| format!("cannot read the map source: {}", chain(&e)))?;
    let text = std::fs::read(dir.join("items.json"))
        .map_err(|_| "the map source has no items.json".to_owned())?;
    let _ = std::fs::remove_dir_all(&dir);
    match serde_json::from_slice(&text) {
        Ok(Value::Array(items)) => Ok(items),
        _ => Err("the map source's items.json is not a JSON list".into()),
    }
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
        .chain(key.stage.bytes())
        .chain(attempt.to_le_bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let jitter = (h % 4001) as f64 / 10_000.0 - 0.2; // -0.2 ..= 0.2
    base.mul_f64(1.0 + jitter).min(policy.max_backoff)
}

enum AttemptEnd {
    Succeeded {
        outputs: BTreeMap<String, ArtifactRef>,
        values: Value,
    },
    Failed {
        exit_code: Option<i32>,
        reason: String,
        class: ErrorClass,
    },
    Cancelled,
}

/// One attempt: prepare directories, render, start, wait (with the timeout), publish.
/// `Err` is an infrastructure fault with its reason.
async fn run_attempt(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    key: &AttemptKey,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<AttemptEnd, String> {
    // An executor that runs stages away from this file system (in a pod) gets paths
    // under its root and a transfer plan for `drivetrain exec`.
    let remote = ctx.executor.container_root();
    let (argv, workdir, step_config) = match &stage.action {
        Action::Command { argv, workdir, .. } => (argv.clone(), workdir.clone(), None),
        // A built-in step runs as `drivetrain step NAME`, the same contract as in a
        // container: the rendered config in the environment.
        Action::Step { name, config, .. } => {
            let command = match &remote {
                Some(root) => vec![
                    root.join("bin/drivetrain").display().to_string(),
                    "step".into(),
                ],
                None => ctx.opts.step_command.clone(),
            };
            let argv: Vec<Template> = command
                .into_iter()
                .chain([name.clone()])
                .map(|a| Template {
                    parts: vec![crate::template::Part::Lit(a)],
                })
                .collect();
            (argv, None, Some(config))
        }
    };
    let dir = ctx
        .opts
        .work_dir
        .join(&key.run)
        .join(&key.stage)
        .join(key.attempt.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    let mk = |p: &Path| {
        std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
    };
    mk(&dir)?;
    let (inputs_dir, outputs_dir) = match &remote {
        Some(root) => (root.join("inputs"), root.join("outputs")),
        None => {
            let (i, o) = (dir.join("inputs"), dir.join("outputs"));
            mk(&i)?;
            mk(&o)?;
            (i, o)
        }
    };
    let mut exec_inputs = Vec::new();
    let mut input_paths = BTreeMap::new();
    for input in &stage.inputs {
        let producer = upstream.get(&input.stage);
        match producer.and_then(|r| r.outputs.get(&input.output)) {
            // For data too large to copy, the stage reads the objects where they are.
            Some(art) if input.mode == IoMode::Url => {
                let url =
                    ctx.artifacts.url_of(art).await.map_err(|e| {
                        format!("cannot resolve input `{}`: {}", input.name, chain(&e))
                    })?;
                input_paths.insert(input.name.clone(), url);
            }
            Some(art) => {
                let dest = inputs_dir.join(&input.name);
                if remote.is_some() {
                    exec_inputs.push(crate::executor::ExecInput {
                        name: input.name.clone(),
                        artifact: art.clone(),
                        dest: dest.clone(),
                    });
                } else {
                    ctx.artifacts.materialize(art, &dest).await.map_err(|e| {
                        format!("cannot materialize input `{}`: {}", input.name, chain(&e))
                    })?;
                }
                input_paths.insert(input.name.clone(), dest.display().to_string());
            }
            // An optional input whose producer was skipped is absent; so is any input of
            // a hook whose producer did not succeed.
            None if input.optional || stage.hook.is_some() => {
                input_paths.insert(input.name.clone(), String::new());
            }
            None => return Err(format!("input `{}` has no artifact", input.name)),
        }
    }
    let mut exec_outputs = Vec::new();
    let mut output_paths = BTreeMap::new();
    for o in &stage.outputs {
        if o.mode == IoMode::Url {
            let url = ctx
                .artifacts
                .output_url(key, &o.name)
                .map_err(|e| format!("cannot prepare output `{}`: {}", o.name, chain(&e)))?;
            output_paths.insert(o.name.clone(), url);
            continue;
        }
        let p = outputs_dir.join(&o.name);
        if remote.is_some() {
            exec_outputs.push(crate::executor::ExecOutput {
                name: o.name.clone(),
                dir: p.clone(),
            });
        } else {
            mk(&p)?;
        }
        output_paths.insert(o.name.clone(), p.display().to_string());
    }
    let values_path = match &remote {
        Some(root) => root.join("values.json"),
        None => dir.join("values.json"),
    };
    let (item, item_index) = match track {
        Track::Item { item, index } => (Some(item), Some(index)),
        Track::Stage => (None, None),
    };
    let render = |t: &Template| -> String {
        t.render(|r| match r {
            Ref::Input(n) => input_paths.get(n).cloned(),
            Ref::Output(n) => output_paths.get(n).cloned(),
            Ref::Item(keys) => {
                let mut v = item?;
                for k in keys {
                    v = v.get(k)?;
                }
                Some(value_text(v))
            }
            other => lookup_value(&ctx.pipeline, ctx, upstream, other).map(|v| value_text(&v)),
        })
    };
    let argv: Vec<String> = argv.iter().map(render).collect();
    let step_config = step_config.map(|c| {
        let lookup = |r: &Ref| match r {
            Ref::Input(n) => input_paths.get(n).cloned().map(Value::String),
            Ref::Output(n) => output_paths.get(n).cloned().map(Value::String),
            Ref::Item(keys) => {
                let mut v = item?;
                for k in keys {
                    v = v.get(k)?;
                }
                Some(v.clone())
            }
            other => lookup_value(&ctx.pipeline, ctx, upstream, other),
        };
        crate::template::render_value(c, &lookup)
    });
    let mut env: Vec<(String, String)> = vec![
        ("DRIVETRAIN_RUN_ID".into(), key.run.clone()),
        ("DRIVETRAIN_STAGE".into(), key.stage.clone()),
        ("DRIVETRAIN_ATTEMPT".into(), key.attempt.to_string()),
        ("DRIVETRAIN_PIPELINE".into(), ctx.pipeline.name.clone()),
        (
            "DRIVETRAIN_INPUTS_DIR".into(),
            inputs_dir.display().to_string(),
        ),
        (
            "DRIVETRAIN_OUTPUTS_DIR".into(),
            outputs_dir.display().to_string(),
        ),
        (
            "DRIVETRAIN_VALUES".into(),
            values_path.display().to_string(),
        ),
        (
            "DRIVETRAIN_PARAMS".into(),
            serde_json::to_string(&ctx.params).unwrap_or_default(),
        ),
        ("DRIVETRAIN_STORE".into(), ctx.artifacts.url().to_owned()),
    ];
    if let Track::Item { index, item } = track {
        env.push(("DRIVETRAIN_ITEM".into(), value_text(item)));
        env.push(("DRIVETRAIN_ITEM_INDEX".into(), index.to_string()));
    }
    for (name, path) in &input_paths {
        env.push((
            format!("DRIVETRAIN_INPUT_{}", env_suffix(name)),
            path.clone(),
        ));
    }
    for (name, art) in input_artifacts(stage, upstream) {
        env.push((
            format!("DRIVETRAIN_INPUT_{}_DIGEST", env_suffix(&name)),
            art.digest,
        ));
    }
    // Kept across the attempts of this stage (and items) in this run: checkpoints. (In a
    // pod they live as long as the pod: a volume keeps them across attempts there.)
    let checkpoints = match &remote {
        Some(root) => root.join("checkpoints"),
        None => {
            let c = ctx
                .opts
                .work_dir
                .join(&key.run)
                .join(&key.stage)
                .join("checkpoints");
            mk(&c)?;
            c
        }
    };
    env.push((
        "DRIVETRAIN_CHECKPOINTS".into(),
        checkpoints.display().to_string(),
    ));
    for (name, path) in &output_paths {
        env.push((
            format!("DRIVETRAIN_OUTPUT_{}", env_suffix(name)),
            path.clone(),
        ));
    }
    if let Some(c) = &step_config {
        env.push(("DRIVETRAIN_STEP_CONFIG".into(), c.to_string()));
        // A built-in step on this machine reaches the store (and the registry) as the
        // engine does; in a pod, credentials come from the pod's own secrets.
        if remote.is_none() {
            env.extend(store_config_env());
        }
    }
    for (k, t) in &stage.env {
        env.push((k.clone(), render(t)));
    }
    // On a cluster secrets come from Secret objects the executor references; here from
    // the engine's environment.
    for s in stage.secrets.iter().filter(|_| remote.is_none()) {
        if let (Some(var), Some(k)) = (&s.env, &s.key) {
            let source = format!(
                "DRIVETRAIN_SECRET_{}_{}",
                env_suffix(&s.name),
                env_suffix(k)
            );
            match std::env::var(&source) {
                Ok(v) => env.push((var.clone(), v)),
                Err(_) => {
                    return Ok(AttemptEnd::Failed {
                        exit_code: None,
                        reason: format!("secret `{}` key `{k}` is not set: the local executor reads it from `{source}`", s.name),
                        class: ErrorClass::Error,
                    })
                }
            }
        }
    }
    if remote.is_some() {
        let plan = crate::executor::ExecPlan {
            store: ctx.artifacts.url().to_owned(),
            run: key.run.clone(),
            stage: key.stage.clone(),
            attempt: key.attempt,
            inputs: exec_inputs,
            outputs: exec_outputs,
            values: values_path.clone(),
        };
        env.push((
            "DRIVETRAIN_EXEC_PLAN".into(),
            serde_json::to_string(&plan).unwrap_or_default(),
        ));
    }
    // In a pod, no `workdir` means the image's own.
    let cwd = match (&workdir, &remote) {
        (Some(w), _) => PathBuf::from(render(w)),
        (None, Some(_)) => PathBuf::new(),
        (None, None) => dir.clone(),
    };
    let log = dir.join("log.txt");
    // The engine's home and the store are read-only for the stage; its own directory and
    // `mode: url` outputs are writable, and its inputs read-only again.
    let mut access = Vec::new();
    let ro = |path: &Path| PathAccess {
        path: path.to_path_buf(),
        writable: false,
    };
    let home = ctx.opts.work_dir.parent().unwrap_or(&ctx.opts.work_dir);
    access.push(ro(home));
    if let Some(root) = ctx.artifacts.local_root() {
        if !root.starts_with(home) {
            access.push(ro(root));
        }
    }
    access.push(PathAccess {
        path: dir.clone(),
        writable: true,
    });
    access.push(PathAccess {
        path: checkpoints.clone(),
        writable: true,
    });
    if let (Action::Step { registry: true, .. }, Some(root)) =
        (&stage.action, ctx.artifacts.local_root())
    {
        let registry = root.join("registry");
        mk(&registry)?;
        access.push(PathAccess {
            path: registry,
            writable: true,
        });
    }
    for o in stage.outputs.iter().filter(|o| o.mode == IoMode::Url) {
        if let Some(p) = ctx.artifacts.output_dir(key, &o.name) {
            access.push(PathAccess {
                path: p,
                writable: true,
            });
        }
    }
    access.push(ro(&inputs_dir));
    let mut placement = crate::executor::Placement::of(
        &ctx.pipeline.name,
        stage,
        stage.image.as_ref().map(render),
        item_index,
    );
    // `from_snapshot` may name a snapshot an upstream stage recorded in its values: a
    // rerun that reuses that stage mounts exactly the data of the original run.
    for v in &mut placement.volumes {
        if let Some(Ok(t)) = v.from_snapshot.as_deref().map(Template::parse) {
            v.from_snapshot = Some(render(&t));
        }
    }
    let spec = AttemptSpec {
        run_id: key.run.clone(),
        stage: key.stage.clone(),
        attempt: key.attempt,
        argv,
        env,
        workdir: cwd,
        log: log.clone(),
        distributed: stage.distributed.clone(),
        access,
        placement,
    };
    let mut result = start_and_wait(ctx, stage, key, spec, &log, &values_path, &outputs_dir).await;
    // Inputs are hard links into the store: a stage that wrote to one changed an
    // artifact. Say so, and fail the stage, rather than let it pass unnoticed.
    for input in &stage.inputs {
        let Some(art) = upstream
            .get(&input.stage)
            .and_then(|r| r.outputs.get(&input.output))
        else {
            continue;
        };
        if let Err(e) = ctx.artifacts.verify(art).await {
            result = Ok(AttemptEnd::Failed {
                exit_code: None,
                reason: format!(
                    "the stage wrote to its input `{}` (an artifact of `{}`): {e}; artifacts are immutable, write to an output instead",
                    input.name,
                    ctx.pipeline.stage(input.stage).name
                ),
                class: ErrorClass::Failed,
            });
            break;
        }
    }
    // Inputs are hard links to upstream artifacts: nothing of a finished attempt may keep
    // a writable name for them. (In a pod they were copies, gone with the pod.)
    if remote.is_none() {
        let _ = std::fs::remove_dir_all(&inputs_dir);
    }
    result
}

async fn start_and_wait(
    ctx: &Ctx,
    stage: &Stage,
    key: &AttemptKey,
    spec: AttemptSpec,
    log: &Path,
    values_path: &Path,
    outputs_dir: &Path,
) -> Result<AttemptEnd, String> {
    let mut spec = spec;
    let gpus = match gpus_needed(stage) {
        0 => Vec::new(),
        n => ctx.gpus.acquire(n).await,
    };
    if !gpus.is_empty() {
        let list = gpus
            .iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(",");
        spec.env.push(("CUDA_VISIBLE_DEVICES".into(), list.clone()));
        spec.env.push(("NVIDIA_VISIBLE_DEVICES".into(), list));
    }
    let result = wait_attempt(ctx, stage, key, spec, log, values_path, outputs_dir).await;
    ctx.gpus.release(&gpus);
    result
}

/// GPUs an attempt claims: `resources.gpu` per worker.
fn gpus_needed(stage: &Stage) -> usize {
    let per = stage.resources.gpu.unwrap_or(0) as usize;
    per * stage
        .distributed
        .as_ref()
        .map(|d| d.workers as usize)
        .unwrap_or(1)
}

async fn wait_attempt(
    ctx: &Ctx,
    stage: &Stage,
    key: &AttemptKey,
    spec: AttemptSpec,
    log: &Path,
    values_path: &Path,
    outputs_dir: &Path,
) -> Result<AttemptEnd, String> {
    let mut running = ctx.executor.start(spec).await.map_err(|e| e.to_string())?;
    let recorded = match key.stage.split_once("/items/") {
        Some((_, index)) => ctx.state.set_item_handle(
            &ctx.run.id,
            &stage.name,
            index.parse().unwrap_or_default(),
            &running.handle(),
        ),
        None => {
            ctx.state
                .set_attempt_handle(&ctx.run.id, &stage.name, key.attempt, &running.handle())
        }
    };
    recorded.map_err(|e| e.to_string())?;
    let mut cancel = ctx.stop_for(stage);
    let timeout = stage.timeout.unwrap_or(Duration::MAX);
    let outcome = tokio::select! {
        o = running.wait() => Some(o),
        _ = tokio::time::sleep(timeout) => None,
        _ = cancel.changed() => { running.cancel().await; Some(AttemptOutcome::Cancelled) }
    };
    let outcome = match outcome {
        Some(o) => o,
        None => {
            running.cancel().await;
            let _ = ctx.artifacts.put_log(key, log).await;
            return Ok(AttemptEnd::Failed {
                exit_code: None,
                reason: format!(
                    "timed out after {}; the process group was killed{}",
                    humanize(timeout),
                    log_tail(log)
                ),
                class: ErrorClass::Timeout,
            });
        }
    };
    ctx.artifacts
        .put_log(key, log)
        .await
        .map_err(|e| format!("cannot store the log: {}", chain(&e)))?;
    match outcome {
        AttemptOutcome::Succeeded => {}
        AttemptOutcome::Cancelled => return Ok(AttemptEnd::Cancelled),
        AttemptOutcome::Failed { exit_code, reason } => {
            return Ok(AttemptEnd::Failed {
                exit_code,
                reason: format!("{reason}{}", log_tail(log)),
                class: ErrorClass::Failed,
            })
        }
    }
    let remote = ctx.executor.container_root().is_some();
    let stored = if remote {
        ctx.artifacts
            .values(key)
            .await
            .map_err(|e| format!("cannot read values.json: {}", chain(&e)))?
    } else {
        std::fs::read(values_path).ok()
    };
    let values = match stored {
        Some(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Ok(AttemptEnd::Failed {
                    exit_code: Some(0),
                    reason: "values.json is not a JSON object".into(),
                    class: ErrorClass::Failed,
                })
            }
        },
        None => Value::Object(Default::default()),
    };
    let mut values = values;
    if let (Value::Object(v), Some(Value::Object(made))) = (&mut values, running.made()) {
        v.extend(made);
    }
    let mut outputs = BTreeMap::new();
    for o in &stage.outputs {
        // `drivetrain exec` uploaded a pod's outputs where `mode: url` ones go.
        let art = if remote || o.mode == IoMode::Url {
            ctx.artifacts.publish_listing(key, &o.name).await
        } else {
            ctx.artifacts
                .publish_dir(key, &o.name, &outputs_dir.join(&o.name))
                .await
        };
        match art {
            Ok(a) => {
                outputs.insert(o.name.clone(), a);
            }
            Err(
                e @ (crate::artifacts::ArtifactError::InvalidKey { .. }
                | crate::artifacts::ArtifactError::Symlink { .. }),
            ) => {
                return Ok(AttemptEnd::Failed {
                    exit_code: Some(0),
                    reason: e.to_string(),
                    class: ErrorClass::Failed,
                })
            }
            Err(e) => return Err(format!("cannot publish output `{}`: {}", o.name, chain(&e))),
        }
    }
    // The published files are hard links: drop the attempt's own names for them so
    // nothing left of the attempt can write to an artifact.
    if !remote {
        let _ = std::fs::remove_dir_all(outputs_dir);
    }
    Ok(AttemptEnd::Succeeded { outputs, values })
}

/// Stops a background task when the run ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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

/// The engine's store and registry configuration (`AWS_*`, `GOOGLE_*`, `AZURE_*`,
/// `DRIVETRAIN_STORE_RETRY_TIMEOUT`, `DRIVETRAIN_REGISTRY`, `MLFLOW_*`), handed to built-in
/// steps, which open the store themselves. User commands get only what their stage
/// declares.
fn store_config_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| {
            ["AWS_", "GOOGLE_", "AZURE_", "MLFLOW_"]
                .iter()
                .any(|p| k.starts_with(p))
                || matches!(
                    k.as_str(),
                    "DRIVETRAIN_STORE_RETRY_TIMEOUT" | "DRIVETRAIN_REGISTRY"
                )
        })
        .collect()
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

/// The last 20 lines of a log, for failure reasons.
fn log_tail(log: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(20)..];
    format!("\nlast {} log lines:\n{}", tail.len(), tail.join("\n"))
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
        let key = AttemptKey {
            run: "r".into(),
            stage: "s".into(),
            attempt: 1,
        };
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
