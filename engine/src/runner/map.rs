//! `map` stages: each item its own attempt loop (with its own retries) recorded as a row
//! in the state store, their outputs collected under `<index>/` for downstream stages.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::artifacts::{ArtifactRef, AttemptKey};
use crate::plan::{MapSource, Stage, StageId};
use crate::state::Phase;

use super::attempt::attempt_loop;
use super::{chain, first_line, Ctx, LoopEnd, RunError, RunEvent, StageResult, Track};

/// A map stage: one attempt loop per item, at most `max_parallel` at once (and never
/// more than the run's parallelism), items recorded in the state store. Each output of
/// the stage is the collection of the succeeded items' outputs (`i/…`).
pub(super) async fn execute_map(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<LoopEnd, RunError> {
    let map = stage.map.as_ref().expect("a map stage");
    let items = match items_of(ctx, &map.source, upstream).await {
        Ok(items) => items,
        Err(reason) => return Ok(failed(reason, Value::Null)),
    };
    ctx.state
        .set_stage(&ctx.run.id, &stage.name, Phase::Running, None, None)?;
    let (kept, first_attempt) = resume(ctx, stage, &items)?;
    let _ = ctx.events.send(RunEvent::Started {
        stage: stage.name.clone(),
        attempt: 1,
    });
    let _ = ctx.events.send(RunEvent::Items {
        stage: stage.name.clone(),
        total: items.len(),
    });
    let tally = run_items(ctx, stage, &items, kept, &first_attempt, upstream).await?;
    let n = items.len();
    let values = serde_json::json!({"items": n, "succeeded": tally.succeeded.len(), "failed": tally.failures});
    if tally.cancelled {
        return Ok(LoopEnd {
            attempt: None,
            phase: Phase::Cancelled,
            exit: None,
            reason: Some("cancelled".into()),
            outputs: BTreeMap::new(),
            values,
        });
    }
    let needed = (map.min_success_ratio * n as f64).ceil() as usize;
    if tally.succeeded.len() < needed {
        let reason = format!(
            "{} of {n} items succeeded, {needed} needed (min_success_ratio {}); {}",
            tally.succeeded.len(),
            map.min_success_ratio,
            tally.first_failure.unwrap_or_default()
        );
        return Ok(failed(reason, values));
    }
    let reason = (tally.failures > 0).then(|| {
        format!(
            "{} of {n} items failed, within min_success_ratio",
            tally.failures
        )
    });
    Ok(collect(ctx, stage, &tally.succeeded, values, reason).await)
}

/// A map stage's end before its items ran, or with too few of them succeeded.
fn failed(reason: String, values: Value) -> LoopEnd {
    LoopEnd {
        attempt: None,
        phase: Phase::Failed,
        exit: None,
        reason: Some(reason),
        outputs: BTreeMap::new(),
        values,
    }
}

/// The items a map stage runs over, or why there are none to take.
async fn items_of(
    ctx: &Ctx,
    source: &MapSource,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<Vec<Value>, String> {
    match source {
        MapSource::Items(items) => Ok(items.clone()),
        MapSource::Param(p) => match ctx.params.get(p) {
            Some(Value::Array(items)) => Ok(items.clone()),
            _ => Err(format!("param `{p}` is not a list")),
        },
        MapSource::From {
            stage: from,
            output,
        } => match upstream.get(from).and_then(|r| r.outputs.get(output)) {
            Some(art) => read_items(ctx, art).await,
            None => Err(format!("map source `{output}` has no artifact")),
        },
    }
}

/// The outputs of each item that succeeded in an earlier try of this run (kept, not run
/// again), and the attempt number each item starts at; records the items if this is the
/// first try, or the items changed.
fn resume(ctx: &Ctx, stage: &Stage, items: &[Value]) -> Result<(Kept, Vec<u32>), RunError> {
    let mut kept = BTreeMap::new();
    let mut first_attempt = vec![1u32; items.len()];
    let prior = ctx.state.map_items(&ctx.run.id, &stage.name)?;
    let same_items =
        prior.len() == items.len() && prior.iter().zip(items).all(|(p, i)| &p.item == i);
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
        ctx.state.add_map_items(&ctx.run.id, &stage.name, items)?;
    }
    Ok((kept, first_attempt))
}

/// Items' outputs by index.
type Kept = BTreeMap<usize, BTreeMap<String, ArtifactRef>>;

/// How a map stage's items ended.
struct Tally {
    /// Each succeeded item's outputs, by index.
    succeeded: Vec<(usize, BTreeMap<String, ArtifactRef>)>,
    failures: usize,
    cancelled: bool,
    first_failure: Option<String>,
}

/// Runs the items not kept from an earlier try, `max_parallel` at once.
async fn run_items(
    ctx: &Ctx,
    stage: &Stage,
    items: &[Value],
    kept: Kept,
    first_attempt: &[u32],
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<Tally, RunError> {
    use futures::StreamExt;
    let map = stage.map.as_ref().expect("a map stage");
    let todo: Vec<usize> = (0..items.len()).filter(|i| !kept.contains_key(i)).collect();
    // An executor that throttles items itself (a Slurm job array) gets them all at once.
    let limit = match ctx.executor.runs_items_together() {
        true => todo.len().max(1),
        false => map
            .max_parallel
            .map(|m| m as usize)
            .unwrap_or(usize::MAX)
            .clamp(1, ctx.opts.parallelism.max(1)),
    };
    let results = futures::stream::iter(todo)
        .map(|index| {
            run_item(
                ctx,
                stage,
                index,
                &items[index],
                upstream,
                first_attempt[index],
            )
        })
        .buffer_unordered(limit);
    futures::pin_mut!(results);
    let mut tally = Tally {
        succeeded: Vec::new(),
        failures: 0,
        cancelled: false,
        first_failure: None,
    };
    for (index, outputs) in kept {
        let _ = ctx.events.send(RunEvent::ItemDone {
            stage: stage.name.clone(),
            succeeded: true,
        });
        tally.succeeded.push((index, outputs));
    }
    while let Some(r) = results.next().await {
        let (index, end) = r?;
        let _ = ctx.events.send(RunEvent::ItemDone {
            stage: stage.name.clone(),
            succeeded: end.phase == Phase::Succeeded,
        });
        match end.phase {
            Phase::Succeeded => tally.succeeded.push((index, end.outputs)),
            Phase::Cancelled => tally.cancelled = true,
            _ => {
                tally.failures += 1;
                if tally.first_failure.is_none() {
                    tally.first_failure = end
                        .reason
                        .map(|r| format!("item {index}: {}", first_line(&r)));
                }
            }
        }
    }
    tally.succeeded.sort_by_key(|(i, _)| *i);
    Ok(tally)
}

/// A succeeded map stage: each output the collection of the items' outputs.
async fn collect(
    ctx: &Ctx,
    stage: &Stage,
    succeeded: &[(usize, BTreeMap<String, ArtifactRef>)],
    values: Value,
    reason: Option<String>,
) -> LoopEnd {
    let key = AttemptKey::of_stage(ctx.run.id.0.clone(), stage.name.clone(), 1);
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
                return LoopEnd {
                    attempt: None,
                    phase: Phase::Error,
                    exit: None,
                    reason: Some(format!("cannot publish output `{}`: {}", o.name, chain(&e))),
                    outputs: BTreeMap::new(),
                    values,
                }
            }
        }
    }
    LoopEnd {
        attempt: None,
        phase: Phase::Succeeded,
        exit: None,
        reason,
        outputs,
        values,
    }
}

/// One item of a map stage (each attempt holds one of the run's slots while it runs).
pub(super) async fn run_item(
    ctx: &Ctx,
    stage: &Stage,
    index: usize,
    item: &Value,
    upstream: &BTreeMap<StageId, StageResult>,
    first: u32,
) -> Result<(usize, LoopEnd), RunError> {
    let end = attempt_loop(ctx, stage, Track::Item { index, item }, upstream, first).await?;
    let outputs = serde_json::to_value(&end.outputs).unwrap_or_default();
    let finished = crate::state::ItemEnd {
        phase: end.phase,
        reason: end.reason.as_deref(),
        outputs: &outputs,
        values: &end.values,
    };
    ctx.state
        .finish_item(&ctx.run.id, &stage.name, index, finished)?;
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
