//! `search` stages: the search's core ([`crate::search::rungs`]) decides which trial runs
//! next at which rung; each decision is recorded in the state store before its attempt
//! starts, and each end of a trial's rung after, so a resumed run builds the same search
//! again and runs on from there. At most `max_concurrent` trials run at once (and never
//! more than the run's parallelism). The stage's outputs are the best trial's; its values
//! say which trial that is, with its params and metric.

use std::collections::BTreeMap;

use futures::stream::{FuturesUnordered, StreamExt as _};
use serde_json::{json, Value};

use crate::artifacts::ArtifactRef;
use crate::cache::KeyParts;
use crate::plan::{Stage, StageId};
use crate::search::rungs::{Outcome, Search, TrialState};
use crate::search::SearchPlan;
use crate::state::Phase;

use super::{first_line, Ctx, LoopEnd, RunError, RunEvent, StageResult};

mod trial;
pub(super) use trial::TrialRun;

/// A search stage: its trials to the end of the search (or of the run).
pub(super) async fn execute_search(
    ctx: &Ctx,
    stage: &Stage,
    cache: Option<&KeyParts>,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<LoopEnd, RunError> {
    let plan = stage.search.as_ref().expect("a search stage");
    let run = &ctx.run.id;
    ctx.state
        .set_stage(run, &stage.name, Phase::Running, None, None)?;
    let _ = ctx.events.send(RunEvent::Started {
        stage: stage.name.clone(),
        attempt: 1,
    });
    let _ = ctx.events.send(RunEvent::Items {
        stage: stage.name.clone(),
        total: plan.trials,
    });
    // A resumed run takes up the search it recorded.
    let stored = ctx.state.trials(run, &stage.name)?;
    let mut outputs: Kept = stored
        .iter()
        .map(|r| (r.trial.index, (r.outputs.clone(), r.values.clone())))
        .collect();
    let mut search = Search::new(plan, stored.into_iter().map(|r| r.trial).collect());
    for t in search.trials().iter().filter(|t| settled(t.state)) {
        item_done(ctx, stage, t.state);
    }
    let mut tally = Tally::default();
    let taken = (&mut outputs, &mut tally);
    let stop = drive(ctx, stage, &mut search, taken, cache, upstream).await?;
    if stop.is_none() {
        for i in search.finish() {
            record(ctx, stage, &search, &outputs, i)?;
            item_done(ctx, stage, TrialState::Pruned);
        }
    }
    Ok(end_of(plan, &search, &outputs, stop, &tally))
}

/// Each trial's outputs and values of its last rung that succeeded, by index.
type Kept = BTreeMap<usize, (Value, Value)>;

/// Why a search stopped before it decided everything.
enum Stop {
    Cancelled,
    /// More trials failed than the search allows: the last one's reason.
    TooManyFailures(String),
}

/// What the trials' metric files held that the engine did not take as metrics, and the
/// rungs taken from the cache.
#[derive(Default)]
struct Tally {
    cached: usize,
    refused: usize,
    first_refused: Option<String>,
}

/// Runs trials as the search decides until it has nothing left to decide, or stops.
async fn drive(
    ctx: &Ctx,
    stage: &Stage,
    search: &mut Search<'_>,
    (outputs, tally): (&mut Kept, &mut Tally),
    cache: Option<&KeyParts>,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<Option<Stop>, RunError> {
    let plan = stage.search.as_ref().expect("a search stage");
    let limit = plan
        .max_concurrent
        .map_or(usize::MAX, |m| m as usize)
        .clamp(1, ctx.opts.parallelism.max(1));
    let mut running = FuturesUnordered::new();
    let mut stop = None;
    loop {
        while stop.is_none() && running.len() < limit {
            if *ctx.stop_for(stage).borrow() {
                stop = Some(Stop::Cancelled);
                break;
            }
            let Some(i) = search.decide() else { break };
            search.started(i);
            // The decision (this trial, at this rung), recorded before it is acted on.
            record(ctx, stage, search, outputs, i)?;
            let t = search.trial(i).clone();
            let budget = plan.budget.as_ref().map(|_| search.budget(t.rung));
            running.push(trial::run(ctx, stage, (t, budget), cache, upstream));
        }
        let Some(done) = running.next().await else {
            break;
        };
        let done = done?;
        let i = done.index;
        search.retried(i, done.retries);
        if done.cached.is_some() {
            // Taken from an earlier run's same trial and budget: no attempt ran.
            search.taken(i);
            tally.cached += 1;
        }
        if let Some(o) = done.outputs {
            outputs.insert(i, (o, done.values.unwrap_or_default()));
        }
        tally.refused += done.refused;
        if tally.first_refused.is_none() {
            tally.first_refused = done.first_refused;
        }
        let interrupted = done.outcome == Outcome::Interrupted;
        search.ended(i, done.outcome);
        record(ctx, stage, search, outputs, i)?;
        let t = search.trial(i);
        if settled(t.state) {
            item_done(ctx, stage, t.state);
        }
        if interrupted {
            stop = Some(Stop::Cancelled);
        } else if stop.is_none() && search.failures() > plan.max_failed_trials as usize {
            let why = t.reason.as_deref().map(first_line).unwrap_or_default();
            stop = Some(Stop::TooManyFailures(format!("trial {}: {why}", t.id)));
        }
    }
    Ok(stop)
}

/// Records trial `i` as the search has it now.
fn record(
    ctx: &Ctx,
    stage: &Stage,
    search: &Search<'_>,
    outputs: &Kept,
    i: usize,
) -> Result<(), RunError> {
    let none = json!({});
    let kept = outputs.get(&i).map_or((&none, &none), |(o, v)| (o, v));
    ctx.state
        .put_trial(&ctx.run.id, &stage.name, search.trial(i), kept)?;
    Ok(())
}

/// Whether a trial is done for good (its progress counted).
fn settled(state: TrialState) -> bool {
    !matches!(
        state,
        TrialState::Pending | TrialState::Running | TrialState::Paused | TrialState::Promoted
    )
}

fn item_done(ctx: &Ctx, stage: &Stage, state: TrialState) {
    let _ = ctx.events.send(RunEvent::ItemDone {
        stage: stage.name.clone(),
        succeeded: !state.failed(),
    });
}

/// The stage's end: the best trial's outputs, and values that say which trial it is
/// (`best.trial`, `best.params`, `best.metric`) and how the trials ended, beside what
/// the best trial reported.
fn end_of(
    plan: &SearchPlan,
    search: &Search<'_>,
    outputs: &Kept,
    stop: Option<Stop>,
    tally: &Tally,
) -> LoopEnd {
    let count = |s: TrialState| search.trials().iter().filter(|t| t.state == s).count();
    let failed = search.failures();
    let mut values = json!({
        "trials": search.trials().len(),
        "succeeded": count(TrialState::Succeeded),
        "pruned": count(TrialState::Pruned),
        "failed": failed,
        "metrics_refused": tally.refused,
        "rungs_cached": tally.cached,
    });
    let ended = |phase, reason: String, values| LoopEnd {
        attempt: None,
        phase,
        exit: None,
        reason: Some(reason),
        outputs: BTreeMap::new(),
        values,
    };
    let best = match stop {
        Some(Stop::Cancelled) => return ended(Phase::Cancelled, "cancelled".into(), values),
        Some(Stop::TooManyFailures(why)) => {
            let reason = format!(
                "{failed} trials failed, more than max_failed_trials ({}); {why}",
                plan.max_failed_trials
            );
            return ended(Phase::Failed, reason, values);
        }
        None => match search.best() {
            Some(best) => best,
            None => {
                let reason = format!(
                    "no trial reached the full budget with a `{}` ({failed} failed, {} pruned)",
                    plan.metric,
                    count(TrialState::Pruned)
                );
                return ended(Phase::Failed, reason, values);
            }
        },
    };
    values["best"] = json!({
        "trial": best.id,
        "params": best.params,
        "metric": best.metric(),
    });
    let (outs, own) = outputs.get(&best.index).cloned().unwrap_or_default();
    let outs: BTreeMap<String, ArtifactRef> = serde_json::from_value(outs).unwrap_or_default();
    // What the best trial reported is the stage's too (its `series`, a step's values),
    // so what reads the stage's values reads them as without a search.
    let mut warnings: Vec<String> = own["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str().map(str::to_owned))
        .collect();
    if let (Value::Object(own), Value::Object(summary)) = (own, &mut values) {
        for (k, v) in own {
            summary.entry(k).or_insert(v);
        }
    }
    if failed > 0 {
        warnings.push(format!("{failed} trials failed (within max_failed_trials)"));
    }
    if tally.refused > 0 {
        warnings.push(format!(
            "{} metric lines were refused; the first: {}",
            tally.refused,
            tally.first_refused.as_deref().unwrap_or_default()
        ));
    }
    if !warnings.is_empty() {
        values["warnings"] = json!(warnings);
    }
    LoopEnd {
        attempt: None,
        phase: Phase::Succeeded,
        exit: None,
        reason: super::attempt::warnings(&values),
        outputs: outs,
        values,
    }
}
