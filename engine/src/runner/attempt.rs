//! Attempts of one stage: the attempt loop (retries with backoff, decided in one place),
//! starting an attempt on the executor with its inputs materialized, waiting for it with
//! its timeout, heartbeat and cancel, and publishing its outputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

use crate::artifacts::{ArtifactRef, AttemptKey};
use crate::executor::{AttemptOutcome, AttemptSpec};
use crate::plan::{Stage, StageId};
use crate::spec::{ErrorClass, IoMode};
use crate::state::Phase;

use super::end::AttemptEnd;
use super::prepare::{prepare, Layout};
use super::{
    backoff, chain, first_line, humanize, retryable, Ctx, LoopEnd, RunError, RunEvent, StageResult,
    Track,
};

/// Attempts of a stage (or of one item of a map stage) until one succeeds, the retry
/// policy gives up, or the run is cancelled; each attempt recorded before it starts.
pub(super) async fn attempt_loop(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    upstream: &BTreeMap<StageId, StageResult>,
    first: u32,
) -> Result<LoopEnd, RunError> {
    let run = &ctx.run.id;
    let mut attempt = first - 1;
    // Attempts preempted for others' GPUs: not the stage's failures, not its retries.
    let mut preempted = 0;
    loop {
        attempt += 1;
        let key = AttemptKey {
            run: run.0.clone(),
            stage: stage.name.to_string(),
            item: match track {
                Track::Stage => None,
                Track::Item { index, .. } | Track::Trial { index, .. } => Some(index),
            },
            attempt,
        };
        // A slot from recording the attempt as started until its process has ended and
        // its log and outputs are stored; the cache lookup before, and recording the end
        // and any backoff after, hold none.
        // (The items of an executor that throttles them itself hold none.)
        let slot = match track {
            Track::Item { .. } if ctx.executor.runs_items_together() => None,
            _ => Some(ctx.slots.acquire().await.expect("never closed")),
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
            Track::Trial { .. } => {}
        }
        let result = run_attempt(ctx, stage, track, &key, upstream).await;
        drop(slot);
        let (phase, exit, reason, class) = match how_it_ended(result) {
            Ok((outputs, values)) => {
                // The stage records its attempt's end with its own (one commit).
                return Ok(LoopEnd {
                    attempt: matches!(track, Track::Stage | Track::Trial { .. }).then_some(attempt),
                    phase: Phase::Succeeded,
                    exit: Some(0),
                    reason: warnings(&values),
                    outputs,
                    values,
                });
            }
            Err(ended) => ended,
        };
        if let Track::Stage = track {
            ctx.state
                .finish_attempt(run, &stage.name, attempt, phase, exit, Some(&reason))?;
        }
        // A preempted stage waits for its GPUs again (a budget of its own), unless the run
        // is stopping or the budget is spent.
        let spent = phase == Phase::Preempted;
        let (phase, reason) = match phase {
            Phase::Preempted if *ctx.stop_for(stage).borrow() => (Phase::Cancelled, reason),
            Phase::Preempted if preempted < MAX_PREEMPTIONS => {
                preempted += 1;
                if let Track::Stage = track {
                    let _ = ctx.events.send(RunEvent::Retrying {
                        stage: stage.name.clone(),
                        attempt: attempt + 1,
                        delay: Duration::ZERO,
                        reason: first_line(&reason),
                    });
                }
                continue;
            }
            Phase::Preempted => (
                Phase::Failed,
                format!("{reason}\npreempted {MAX_PREEMPTIONS} times in this run, the most a stage may be"),
            ),
            p => (p, reason),
        };
        let retry = phase != Phase::Cancelled
            && !spent
            && attempt - first - preempted < stage.retries.limit
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
            // A trial's search counts its attempts; a stage's failed one is recorded.
            attempt: matches!(track, Track::Trial { .. }).then_some(attempt),
            phase,
            exit,
            reason: Some(reason),
            outputs: BTreeMap::new(),
            values: Value::Null,
        });
    }
}

/// A succeeded attempt's outputs and values, or how one that did not ended: its phase,
/// exit code, reason and class.
#[allow(clippy::type_complexity)]
fn how_it_ended(
    result: Result<AttemptEnd, String>,
) -> Result<(BTreeMap<String, ArtifactRef>, Value), (Phase, Option<i32>, String, ErrorClass)> {
    Err(match result {
        Ok(AttemptEnd::Succeeded { outputs, values }) => return Ok((outputs, values)),
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
        Ok(AttemptEnd::Preempted { reason }) => (Phase::Preempted, None, reason, ErrorClass::Lost),
        Err(reason) => (Phase::Error, None, reason, ErrorClass::Error),
    })
}

/// One attempt: prepare it ([`prepare`]), start it and wait (with the timeout), publish,
/// then check that it left its inputs as they were. `Err` is an infrastructure fault
/// with its reason.
async fn run_attempt(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    key: &AttemptKey,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<AttemptEnd, String> {
    let (spec, layout) = match prepare(ctx, stage, track, key, upstream).await? {
        Ok(prepared) => prepared,
        Err(end) => return Ok(end),
    };
    let mut result = start_and_wait(ctx, stage, (key, track), spec, &layout).await;
    if let Some(end) = wrote_to_an_input(ctx, stage, upstream).await {
        result = Ok(end);
    }
    // Inputs are hard links to upstream artifacts: nothing of a finished attempt may keep
    // a writable name for them. (In a pod they were copies, gone with the pod.)
    if layout.remote.is_none() && !stage.inputs.is_empty() {
        let _ = std::fs::remove_dir_all(&layout.inputs);
    }
    result
}

/// Inputs are hard links into the store: a stage that wrote to one changed an artifact.
/// Say so, and fail the stage, rather than let it pass unnoticed.
async fn wrote_to_an_input(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Option<AttemptEnd> {
    for input in &stage.inputs {
        let Some(art) = upstream
            .get(&input.stage)
            .and_then(|r| r.outputs.get(&input.output))
        else {
            continue;
        };
        if let Err(e) = ctx.artifacts.verify(art).await {
            return Some(AttemptEnd::Failed {
                exit_code: None,
                reason: format!(
                    "the stage wrote to its input `{}` (an artifact of `{}`): {e}; artifacts are immutable, write to an output instead",
                    input.name,
                    ctx.pipeline.stage(input.stage).name
                ),
                class: ErrorClass::Failed,
            });
        }
    }
    None
}

async fn start_and_wait(
    ctx: &Ctx,
    stage: &Stage,
    (key, track): (&AttemptKey, Track<'_>),
    spec: AttemptSpec,
    layout: &Layout,
) -> Result<AttemptEnd, String> {
    let mut spec = spec;
    let holder = match key.item {
        Some(i) => format!("{}/items/{i}#{}", key.stage, key.attempt),
        None => format!("{}#{}", key.stage, key.attempt),
    };
    // GPUs, CPU and memory the stage declares come from the home's ledger, where the
    // executor does not schedule them itself (a cluster does).
    let (cpu, memory) = stage.cpu_and_memory();
    let asks = !ctx.executor.schedules_gpus() && (stage.gpus() > 0 || cpu > 0 || memory > 0);
    let gpus = match asks {
        false => Vec::new(),
        true => {
            // A cancel ends the wait: the attempt never started its process.
            let mut cancel = ctx.stop_for(stage);
            tokio::select! {
                claimed = claim_gpus(ctx, stage, key, &holder) => claimed?,
                _ = cancel.wait_for(|c| *c) => return Ok(AttemptEnd::Cancelled),
            }
        }
    };
    if !gpus.is_empty() {
        let list = gpus.join(",");
        spec.env.push(("CUDA_VISIBLE_DEVICES".into(), list.clone()));
        spec.env.push(("NVIDIA_VISIBLE_DEVICES".into(), list));
    }
    // Only an attempt holding devices can be asked for them.
    let watch = (!gpus.is_empty() && stage.scheduling.preemptible).then_some(holder.as_str());
    let result = wait_attempt(ctx, stage, (key, track), spec, layout, watch).await;
    if asks {
        if let Err(e) = ctx.gpus.release(&holder) {
            // The ledger frees them once this run ends anyway.
            eprintln!("warning: giving back what {holder} held: {e}");
        }
    }
    result
}

/// Claims the stage's GPUs, CPU and memory in the home's ledger for `holder` (the
/// devices' names), saying on the stage (its reason, which `status`, the API and the web
/// view show) who holds them while it waits. A map item waits without saying so: its
/// items share the stage's one reason, and one item clearing it would hide another's
/// wait.
async fn claim_gpus(
    ctx: &Ctx,
    stage: &Stage,
    key: &AttemptKey,
    holder: &str,
) -> Result<Vec<String>, String> {
    let run = &ctx.run.id;
    let mut waited: Option<String> = None;
    let (cpu_millis, memory_bytes) = stage.cpu_and_memory();
    let want = super::gpus::Want {
        count: stage.gpus(),
        cpu_millis,
        memory_bytes,
        holder,
        scheduling: &stage.scheduling,
        priority: super::gpus::priority_of(ctx.state.as_ref(), &stage.scheduling.priority)?,
    };
    let devices = ctx
        .gpus
        .acquire(want, |at| {
            let why = super::gpus::why_waiting(&want, stage.scheduling.queue(), at);
            if key.item.is_none() {
                let _ = ctx
                    .state
                    .set_stage(run, &stage.name, Phase::Running, None, Some(&why));
            }
            waited = Some(why);
        })
        .await
        .map_err(|e| format!("the GPU ledger: {e}"))?;
    if let (Some(why), None) = (&waited, key.item) {
        // The wait stays on the attempt (the timeline draws it); the stage's reason goes.
        let _ = ctx
            .state
            .set_attempt_waited(run, &stage.name, key.attempt, why);
        let _ = ctx
            .state
            .set_stage(run, &stage.name, Phase::Running, None, None);
    }
    Ok(devices)
}

/// Starts the attempt and waits for it (its timeout, a cancel), stores its log, and
/// takes what a successful one left: its values and outputs.
async fn wait_attempt(
    ctx: &Ctx,
    stage: &Stage,
    (key, track): (&AttemptKey, Track<'_>),
    spec: AttemptSpec,
    layout: &Layout,
    preemptible: Option<&str>,
) -> Result<AttemptEnd, String> {
    let mask = spec.mask.clone();
    let access = spec.access.clone();
    let log_path = spec.log.clone();
    let log = log_path.as_path();
    let mut running = ctx.executor.start(spec).await.map_err(|e| e.to_string())?;
    record_handle(ctx, stage, (key, track), &running.handle()).map_err(|e| e.to_string())?;
    let timeout = stage.timeout.unwrap_or(Duration::MAX);
    // A trial's search may stop its attempt (one that went stale).
    let stop = match track {
        Track::Trial { trial, .. } => Some(trial.stop.clone()),
        _ => None,
    };
    let outcome = match until_ended(ctx, stage, running.as_mut(), preemptible, stop).await {
        Ended::Outcome(o) => o,
        Ended::Preempted(by) => {
            mask.file(log);
            ctx.artifacts
                .put_log(key, log)
                .await
                .map_err(|e| format!("cannot store the log: {}", chain(&e)))?;
            let grace = humanize(stage.scheduling.grace);
            return Ok(AttemptEnd::Preempted {
                reason: format!(
                    "preempted by {by}: SIGTERM, then up to {grace} to end; the stage waits for its GPUs again and resumes from its checkpoints"
                ),
            });
        }
        Ended::TimedOut => {
            mask.file(log);
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
    if let Some(usage) = running.usage() {
        record_usage(ctx, key, usage);
    }
    mask.file(log);
    mask.file(&layout.values);
    ctx.artifacts
        .put_log(key, log)
        .await
        .map_err(|e| format!("cannot store the log: {}", chain(&e)))?;
    match outcome {
        AttemptOutcome::Succeeded => {}
        AttemptOutcome::Cancelled => return Ok(AttemptEnd::Cancelled),
        AttemptOutcome::OutOfMemory { reason } => {
            return Ok(AttemptEnd::Failed {
                exit_code: Some(137),
                reason: mask.text(&format!("{reason}{}", log_tail(log))),
                class: ErrorClass::Oom,
            })
        }
        AttemptOutcome::Failed { exit_code, reason } => {
            let tail = log_tail(log);
            let hidden = super::unseen::note(ctx.executor.as_ref(), &access, &tail);
            return Ok(AttemptEnd::Failed {
                exit_code,
                reason: mask.text(&format!("{reason}{hidden}{tail}")),
                class: ErrorClass::Failed,
            });
        }
        AttemptOutcome::TimedOut { reason } => {
            return Ok(AttemptEnd::Failed {
                exit_code: None,
                reason: mask.text(&format!("{reason}{}", log_tail(log))),
                class: ErrorClass::Timeout,
            })
        }
        AttemptOutcome::Lost { reason } => {
            return Ok(AttemptEnd::Failed {
                exit_code: None,
                reason: mask.text(&format!("{reason}{}", log_tail(log))),
                class: ErrorClass::Lost,
            })
        }
        AttemptOutcome::Preempted { reason } => {
            return Ok(AttemptEnd::Preempted {
                reason: mask.text(&reason),
            })
        }
    }
    let mut values = match read_values(ctx, key, layout).await? {
        Ok(v) => v,
        Err(end) => return Ok(end),
    };
    if let (Value::Object(v), Some(Value::Object(made))) = (&mut values, running.made()) {
        v.extend(made);
    }
    mask.json(&mut values);
    match publish(ctx, stage, key, layout).await? {
        Ok(outputs) => Ok(AttemptEnd::Succeeded { outputs, values }),
        Err(end) => Ok(end),
    }
}

/// Records the executor's handle of a started attempt on what it is an attempt of: the
/// stage, a map item, or a search's trial (to stop it when its engine is gone).
fn record_handle(
    ctx: &Ctx,
    stage: &Stage,
    (key, track): (&AttemptKey, Track<'_>),
    handle: &str,
) -> Result<(), crate::state::StateError> {
    match track {
        Track::Trial { index, .. } => {
            ctx.state
                .set_trial_handle(&ctx.run.id, &stage.name, index, handle)
        }
        Track::Item { index, .. } => {
            ctx.state
                .set_item_handle(&ctx.run.id, &stage.name, index, handle)
        }
        Track::Stage => ctx
            .state
            .set_attempt_handle(&ctx.run.id, &stage.name, key.attempt, handle),
    }
}

/// How waiting for a started attempt ended.
enum Ended {
    Outcome(AttemptOutcome),
    /// Its timeout passed (it is stopped).
    TimedOut,
    /// An attempt of higher priority asked for its GPUs: who (it is stopped, with its
    /// grace).
    Preempted(String),
}

/// Waits for a started attempt: its end, its timeout, a cancel (of the run, or of the
/// attempt by its search: `stop`), or (a preemptible `holder` of GPUs) a preemption;
/// whatever stops it first stops it.
async fn until_ended(
    ctx: &Ctx,
    stage: &Stage,
    running: &mut dyn crate::executor::RunningAttempt,
    preemptible: Option<&str>,
    stop: Option<watch::Receiver<bool>>,
) -> Ended {
    let mut cancel = ctx.stop_for(stage);
    let timeout = stage.timeout.unwrap_or(Duration::MAX);
    let preempted = async {
        match preemptible {
            Some(holder) => ctx.gpus.preempted(holder).await,
            None => std::future::pending().await,
        }
    };
    let stopped = async {
        match stop {
            // A search gone (its sender dropped) stops nothing.
            Some(mut rx) => {
                if rx.wait_for(|s| *s).await.is_err() {
                    std::future::pending::<()>().await
                }
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        o = running.wait() => Ended::Outcome(o),
        _ = stopped => {
            running.cancel().await;
            Ended::Outcome(AttemptOutcome::Cancelled)
        }
        _ = tokio::time::sleep(timeout) => {
            running.cancel().await;
            Ended::TimedOut
        }
        _ = cancel.changed() => {
            running.cancel().await;
            Ended::Outcome(AttemptOutcome::Cancelled)
        }
        by = preempted => {
            running.stop(stage.scheduling.grace).await;
            Ended::Preempted(by)
        }
    }
}

/// A succeeded attempt's `values.json`: an object, of at most [`MAX_VALUES`] bytes (the
/// inner `Err` fails the attempt), or an empty object where it wrote none.
async fn read_values(
    ctx: &Ctx,
    key: &AttemptKey,
    layout: &Layout,
) -> Result<Result<Value, AttemptEnd>, String> {
    let stored = if layout.remote.is_some() {
        ctx.artifacts
            .values(key, MAX_VALUES)
            .await
            .map_err(|e| format!("cannot read values.json: {}", chain(&e)))?
    } else {
        match std::fs::metadata(&layout.values) {
            Ok(m) if m.len() > MAX_VALUES => Err(m.len()),
            Ok(_) => Ok(std::fs::read(&layout.values).ok()),
            Err(_) => Ok(None),
        }
    };
    let failed = |reason: String| AttemptEnd::Failed {
        exit_code: Some(0),
        reason,
        class: ErrorClass::Failed,
    };
    Ok(match stored {
        Err(size) => Err(failed(format!(
            "values.json is {size} bytes, over the {MAX_VALUES}-byte bound on a stage's values: \
             put data in an output, and in values only what a later stage's template or `when` reads"
        ))),
        Ok(None) => Ok(Value::Object(Default::default())),
        Ok(Some(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(failed("values.json is not a JSON object".into())),
        },
    })
}

/// Publishes a succeeded attempt's outputs as artifacts; an output the store refuses
/// (a key out of bounds, a symlink) fails the attempt (the inner `Err`).
async fn publish(
    ctx: &Ctx,
    stage: &Stage,
    key: &AttemptKey,
    layout: &Layout,
) -> Result<Result<BTreeMap<String, ArtifactRef>, AttemptEnd>, String> {
    let remote = layout.remote.is_some();
    let mut outputs = BTreeMap::new();
    for o in &stage.outputs {
        // `drivetrain exec` uploaded a pod's outputs where `mode: url` ones go.
        let art = if remote || o.mode == IoMode::Url {
            ctx.artifacts.publish_listing(key, &o.name).await
        } else {
            ctx.artifacts
                .publish_dir(key, &o.name, &layout.outputs.join(&o.name))
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
                return Ok(Err(AttemptEnd::Failed {
                    exit_code: Some(0),
                    reason: e.to_string(),
                    class: ErrorClass::Failed,
                }))
            }
            Err(e) => return Err(format!("cannot publish output `{}`: {}", o.name, chain(&e))),
        }
    }
    // The published files are hard links: drop the attempt's own names for them so
    // nothing left of the attempt can write to an artifact.
    if !remote && !stage.outputs.is_empty() {
        let _ = std::fs::remove_dir_all(&layout.outputs);
    }
    Ok(Ok(outputs))
}

/// What a stage that succeeded still says about its result (`warnings` in its values:
/// logs read only in part, values it could not take), kept as the stage's reason so
/// `run`, `status`, the API and the web view show it beside the phase: a partial result
/// is never a plain success.
pub(super) fn warnings(values: &Value) -> Option<String> {
    let list: Vec<&str> = values
        .get("warnings")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    (!list.is_empty()).then(|| crate::diag::clip(format!("warning: {}", list.join("\nwarning: "))))
}

/// Stops a background task when the run ends, however it ends.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Records what an attempt used (a map item's on the item) and tells the
/// listeners (`serve`'s `/metrics`). A store that cannot record it loses only the figure
/// (and fails the attempt's own record a moment later, which the run reports).
fn record_usage(ctx: &Ctx, key: &AttemptKey, usage: crate::executor::ResourceUsage) {
    let stage = key.stage.as_str();
    let _ = match key.item {
        Some(idx) => ctx.state.set_item_usage(&ctx.run.id, stage, idx, &usage),
        None => ctx
            .state
            .set_attempt_usage(&ctx.run.id, stage, key.attempt, &usage),
    };
    let _ = ctx.events.send(RunEvent::Used {
        stage: stage.into(),
        usage,
    });
}

/// How many times one stage (or item) may be preempted in a run before a preemption
/// ends it: a budget of its own, apart from `retries`.
pub const MAX_PREEMPTIONS: u32 = 20;

/// The most of a stage's `values.json` the engine reads; past it the attempt fails.
pub const MAX_VALUES: u64 = 4 << 20;
/// The most of a log's end a failure reason looks at.
const TAIL_BYTES: u64 = 64 << 10;

/// The last 20 lines of a log, for failure reasons: read from its last [`TAIL_BYTES`]
/// only, each line clipped ([`crate::diag::clip`]), whatever the log's size or the
/// length of its lines (a progress bar's `\r`-joined line is one line).
pub(super) fn log_tail(log: &Path) -> String {
    use std::io::{Read as _, Seek as _};
    let Ok(mut f) = std::fs::File::open(log) else {
        return String::new();
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = size.saturating_sub(TAIL_BYTES);
    let mut end = Vec::new();
    if f.seek(std::io::SeekFrom::Start(start)).is_err()
        || f.take(TAIL_BYTES).read_to_end(&mut end).is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&end);
    let mut lines: Vec<&str> = text.lines().collect();
    // A line cut by the start of the tail is not shown as if it were whole.
    if start > 0 && lines.len() > 1 {
        lines.remove(0);
    }
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<String> = lines[lines.len().saturating_sub(20)..]
        .iter()
        .map(|l| crate::diag::clip((*l).to_owned()))
        .collect();
    format!("\nlast {} log lines:\n{}", tail.len(), tail.join("\n"))
}
