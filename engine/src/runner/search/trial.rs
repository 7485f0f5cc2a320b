//! One trial's run at one rung: its attempt loop (retries as any stage's), the metrics it
//! pushes read while it runs (each line recorded as rows in the state store), a trial
//! that reports nothing for `stale_after` stopped, and what its end means for the search.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;

use crate::artifacts::AttemptKey;
use crate::plan::{Stage, StageId};
use crate::search::lines;
use crate::search::rungs::{Outcome, Trial};
use crate::state::{MetricRow, Phase, MAX_METRIC_ROWS};
use crate::template::{value_text, TrialRef};

use super::super::attempt::attempt_loop;
use super::super::keys::{cache_hit, Hit};
use super::super::{humanize, Ctx, RunError, StageResult, Track};
use crate::cache::KeyParts;

/// What an attempt of a trial knows of it (templates, environment).
#[derive(Debug)]
pub(in crate::runner) struct TrialRun {
    pub(in crate::runner) id: String,
    params: Value,
    /// The budget this attempt trains to.
    budget: Option<u64>,
    /// The file the trial appends its metrics to on this machine, kept across its
    /// attempts (`work/RUN/STAGE/items/I.metrics/metrics.jsonl`).
    pub(in crate::runner) metrics: PathBuf,
    /// Set when the search stops the attempt (it went stale).
    pub(in crate::runner) stop: watch::Receiver<bool>,
}

impl TrialRun {
    /// What a `trial.*` template reads.
    pub(in crate::runner) fn value(&self, r: &TrialRef) -> Option<Value> {
        match r {
            TrialRef::Id => Some(Value::String(self.id.clone())),
            TrialRef::Budget => self.budget.map(Value::from),
            TrialRef::Param(name) => self.params.get(name).cloned(),
        }
    }

    /// `DRIVETRAIN_TRIAL_*`: its id, index, params (JSON, and each by name) and budget.
    pub(in crate::runner) fn env(&self, index: usize) -> Vec<(String, String)> {
        let mut env = vec![
            ("DRIVETRAIN_TRIAL_ID".into(), self.id.clone()),
            ("DRIVETRAIN_TRIAL_INDEX".into(), index.to_string()),
            ("DRIVETRAIN_TRIAL_PARAMS".into(), self.params.to_string()),
        ];
        if let Some(b) = self.budget {
            env.push(("DRIVETRAIN_TRIAL_BUDGET".into(), b.to_string()));
        }
        if let Value::Object(params) = &self.params {
            for (name, v) in params {
                let name = name.to_ascii_uppercase().replace('-', "_");
                env.push((format!("DRIVETRAIN_TRIAL_PARAM_{name}"), value_text(v)));
            }
        }
        env
    }
}

/// How a trial's run at its rung ended, for the search.
pub(super) struct TrialDone {
    pub(super) index: usize,
    pub(super) outcome: Outcome,
    /// Attempts beyond the first (retries).
    pub(super) retries: u32,
    /// The outputs of a rung that succeeded (artifact refs by name), and its values.
    pub(super) outputs: Option<Value>,
    pub(super) values: Option<Value>,
    /// Metric lines refused (not JSON objects of numbers), and the first's why.
    pub(super) refused: usize,
    pub(super) first_refused: Option<String>,
    /// The rung came from the cache: the run that made it.
    pub(super) cached: Option<String>,
}

/// Runs trial `t` at its rung, to `budget`: from the cache where an earlier run ran the
/// same trial to the same budget (`cache`: the stage's key parts, when it may be cached).
pub(super) async fn run(
    ctx: &Ctx,
    stage: &Stage,
    (t, budget): (Trial, Option<u64>),
    cache: Option<&KeyParts>,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<TrialDone, RunError> {
    let plan = stage.search.as_ref().expect("a search stage");
    let key = cache.map(|base| trial_key(base, &plan.metric, &t, budget));
    if let (Some(parts), true) = (&key, ctx.opts.request.cache.read) {
        if let Ok(hit) = cache_hit(ctx, stage, &parts.key()).await? {
            return from_cache(ctx, stage, &t, hit);
        }
    }
    let dir = AttemptKey {
        run: ctx.run.id.0.clone(),
        stage: stage.name.to_string(),
        item: Some(t.index),
        attempt: 0,
    }
    .checkpoints_dir(&ctx.opts.work_dir)
    .with_extension("metrics");
    let metrics = dir.join("metrics.jsonl");
    let mut done = TrialDone {
        index: t.index,
        outcome: Outcome::Interrupted,
        retries: 0,
        outputs: None,
        values: None,
        refused: 0,
        first_refused: None,
        cached: None,
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        done.outcome = Outcome::Failed(format!("cannot create {}: {e}", dir.display()));
        return Ok(done);
    }
    let (stop_tx, stop) = watch::channel(false);
    let trial = TrialRun {
        id: t.id.clone(),
        params: Value::Object(t.params.clone()),
        budget,
        metrics: metrics.clone(),
        stop,
    };
    // Only what this rung's attempts append is this rung's.
    let mut tail = Tail::new(metrics, t.index);
    let track = Track::Trial {
        index: t.index,
        trial: &trial,
    };
    let attempts = attempt_loop(ctx, stage, track, upstream, t.attempts);
    tokio::pin!(attempts);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut stale = None;
    // What this rung reported, for its cache entry.
    let mut rung = Vec::new();
    // A pod's metrics come back when it ends: nothing to be stale on while it runs.
    let stale_after = plan
        .stale_after
        .filter(|_| ctx.executor.container_root().is_none());
    let end = loop {
        tokio::select! {
            end = &mut attempts => break end?,
            _ = tick.tick() => {
                keep(ctx, stage, tail.read(), &mut rung)?;
                if let Some(limit) = stale_after {
                    if stale.is_none() && tail.quiet_for() > limit {
                        stale = Some(limit);
                        let _ = stop_tx.send(true);
                    }
                }
            }
        }
    };
    keep(ctx, stage, tail.read(), &mut rung)?;
    if ctx.executor.container_root().is_some() && end.phase == Phase::Succeeded {
        let rows = remote_metrics(ctx, stage, &t, end.attempt, &mut tail).await;
        keep(ctx, stage, rows, &mut rung)?;
    }
    done.retries = end.attempt.map_or(0, |a| a.saturating_sub(t.attempts));
    (done.refused, done.first_refused) = (tail.refused, tail.first_refused.take());
    done.outcome = match (end.phase, stale) {
        (Phase::Succeeded, _) => match tail.last.get(&plan.metric) {
            Some(v) => Outcome::Reported(*v),
            None => Outcome::Failed(no_metric(&plan.metric, &tail)),
        },
        (Phase::Cancelled, Some(limit)) => Outcome::Stale(format!(
            "reported no metric for {} (stale_after): stopped",
            humanize(limit)
        )),
        (Phase::Cancelled, None) => Outcome::Interrupted,
        _ => Outcome::Failed(end.reason.unwrap_or_else(|| "failed".into())),
    };
    if end.phase == Phase::Succeeded {
        done.outputs = Some(serde_json::to_value(&end.outputs).unwrap_or_default());
        done.values = Some(end.values.clone());
    }
    if let (Outcome::Reported(m), Some(parts)) = (&done.outcome, &key) {
        if ctx.opts.request.cache.write && rung.len() <= MAX_CACHED_ROWS {
            let reported = (*m, rung.as_slice(), &end.values);
            remember(ctx, (stage, t.index), parts, reported, &end.outputs)?;
        }
    }
    Ok(done)
}

/// One value a rung reported: its step, name and value.
type RungValue = (Option<i64>, String, f64);

/// The most metric values a rung's cache entry keeps (more: the rung is not cached).
const MAX_CACHED_ROWS: usize = 10_000;

/// A trial's rung's cache key: the stage's (but for its search, which the trial's params
/// stand for) with the trial's params, the budget it trains to and the metric read.
fn trial_key(base: &KeyParts, metric: &str, t: &Trial, budget: Option<u64>) -> KeyParts {
    let mut parts = base.clone();
    parts.components.remove("search");
    let params = Value::Object(t.params.clone()).to_string();
    parts.plain("trial.params".into(), params);
    let budget = budget.map_or_else(|| "none".to_owned(), |b| b.to_string());
    parts.plain("trial.budget".into(), budget);
    parts.plain("trial.metric".into(), metric.to_owned());
    parts
}

/// Keeps a rung that reported `metric` (and `rows`) as a cache entry of its own, of the
/// trial's stage key (`STAGE/items/I`: not one `explain` compares the stage with).
fn remember(
    ctx: &Ctx,
    (stage, index): (&Stage, usize),
    parts: &KeyParts,
    (metric, rows, values): (f64, &[RungValue], &Value),
    outputs: &BTreeMap<String, crate::artifacts::ArtifactRef>,
) -> Result<(), RunError> {
    let entry = crate::state::CacheEntry {
        key: parts.key(),
        pipeline: ctx.pipeline.name.clone(),
        stage: format!("{}/items/{index}", stage.name),
        run_id: ctx.run.id.0.clone(),
        outputs: serde_json::to_value(outputs).unwrap_or_default(),
        values: serde_json::json!({"metric": metric, "rows": rows, "values": values}),
        components: serde_json::to_value(&parts.components).unwrap_or_default(),
        created_at: crate::state::now(),
    };
    ctx.state.put_cache_entry(&entry)?;
    Ok(())
}

/// A rung an earlier run ran: its metric rows recorded again for this run's trial, its
/// metric and outputs taken.
fn from_cache(ctx: &Ctx, stage: &Stage, t: &Trial, hit: Hit) -> Result<TrialDone, RunError> {
    let at = crate::state::now();
    let rows: Vec<RungValue> =
        serde_json::from_value(hit.values["rows"].clone()).unwrap_or_default();
    let rows: Vec<MetricRow> = rows
        .into_iter()
        .map(|(step, name, value)| MetricRow {
            trial: t.index,
            step,
            name,
            value,
            at: at.clone(),
        })
        .collect();
    ctx.state.add_metrics(&ctx.run.id, &stage.name, &rows)?;
    let outcome = match hit.values["metric"].as_f64() {
        Some(m) => Outcome::Reported(m),
        None => Outcome::Failed("its cache entry holds no metric".into()),
    };
    Ok(TrialDone {
        index: t.index,
        outcome,
        retries: 0,
        outputs: Some(serde_json::to_value(&hit.outputs).unwrap_or_default()),
        values: Some(hit.values["values"].clone()),
        refused: 0,
        first_refused: None,
        cached: Some(hit.run_id),
    })
}

/// Why a trial that succeeded gave the search nothing to decide on.
fn no_metric(metric: &str, tail: &Tail) -> String {
    let example = serde_json::json!({"step": 1, metric: 0.5});
    let mut why = format!(
        "the trial reported no `{metric}`: append lines like {example} to $DRIVETRAIN_METRICS, or run `drivetrain report --step 1 {metric}=0.5`"
    );
    if let Some(first) = &tail.first_refused {
        why.push_str(&format!(
            "; {} of its lines were refused, the first: {first}",
            tail.refused
        ));
    }
    why
}

/// Records metric rows, and adds them to what the rung reported (`rung`).
fn keep(
    ctx: &Ctx,
    stage: &Stage,
    rows: Vec<MetricRow>,
    rung: &mut Vec<RungValue>,
) -> Result<(), RunError> {
    ctx.state.add_metrics(&ctx.run.id, &stage.name, &rows)?;
    rung.extend(rows.into_iter().map(|r| (r.step, r.name, r.value)));
    Ok(())
}

/// The metrics a trial in a pod pushed: uploaded with its values when it ended.
async fn remote_metrics(
    ctx: &Ctx,
    stage: &Stage,
    t: &Trial,
    attempt: Option<u32>,
    tail: &mut Tail,
) -> Vec<MetricRow> {
    let key = AttemptKey {
        run: ctx.run.id.0.clone(),
        stage: stage.name.to_string(),
        item: Some(t.index),
        attempt: attempt.unwrap_or(t.attempts),
    };
    match ctx
        .artifacts
        .attempt_file(&key, "metrics.jsonl", MAX_READ)
        .await
    {
        Ok(Ok(Some(bytes))) => tail.take(&bytes),
        Ok(Ok(None)) => Vec::new(),
        Ok(Err(size)) => {
            tail.refuse(format!("metrics.jsonl is {size} bytes, over {MAX_READ}"));
            Vec::new()
        }
        Err(e) => {
            tail.refuse(format!("cannot read metrics.jsonl: {e}"));
            Vec::new()
        }
    }
}

/// The most of a metrics file read at once.
const MAX_READ: u64 = 16 << 20;

/// Reads what a trial appends to its metrics file, line by line, from where the file
/// ended when its rung started.
struct Tail {
    file: PathBuf,
    offset: u64,
    /// A line not yet ended by `\n`.
    partial: Vec<u8>,
    index: usize,
    /// The last value of each metric this rung.
    last: BTreeMap<String, f64>,
    kept: usize,
    refused: usize,
    first_refused: Option<String>,
    since: Instant,
}

impl Tail {
    fn new(file: PathBuf, index: usize) -> Tail {
        let offset = std::fs::metadata(&file).map_or(0, |m| m.len());
        Tail {
            file,
            offset,
            partial: Vec::new(),
            index,
            last: BTreeMap::new(),
            kept: 0,
            refused: 0,
            first_refused: None,
            since: Instant::now(),
        }
    }

    /// How long since the rung started or the trial last reported.
    fn quiet_for(&self) -> Duration {
        self.since.elapsed()
    }

    /// The lines appended since the last read.
    fn read(&mut self) -> Vec<MetricRow> {
        let Ok(mut f) = std::fs::File::open(&self.file) else {
            return Vec::new();
        };
        let mut bytes = Vec::new();
        let read = f
            .seek(std::io::SeekFrom::Start(self.offset))
            .and_then(|_| f.take(MAX_READ).read_to_end(&mut bytes));
        match read {
            Ok(n) => self.offset += n as u64,
            Err(_) => return Vec::new(),
        }
        self.take(&bytes)
    }

    /// The rows of the whole lines in `bytes` (after what was left of the last read).
    fn take(&mut self, bytes: &[u8]) -> Vec<MetricRow> {
        self.partial.extend_from_slice(bytes);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            if self.partial.len() > lines::MAX_LINE {
                self.partial.clear();
                self.refuse(format!("a line over {} bytes", lines::MAX_LINE));
            }
            return Vec::new();
        };
        let whole: Vec<u8> = self.partial.drain(..=end).collect();
        let at = crate::state::now();
        let mut rows = Vec::new();
        for line in String::from_utf8_lossy(&whole).lines() {
            if line.trim().is_empty() {
                continue;
            }
            match lines::parse(line) {
                Ok((step, metrics)) => {
                    self.since = Instant::now();
                    for (name, value) in metrics {
                        self.last.insert(name.clone(), value);
                        self.kept += 1;
                        if self.kept <= MAX_METRIC_ROWS {
                            let at = at.clone();
                            let trial = self.index;
                            rows.push(MetricRow {
                                trial,
                                step,
                                name,
                                value,
                                at,
                            });
                        } else if self.kept == MAX_METRIC_ROWS + 1 {
                            self.refuse(format!(
                                "over {MAX_METRIC_ROWS} values in one rung: the rest are used, not kept"
                            ));
                        }
                    }
                }
                Err(why) => self.refuse(why.to_string()),
            }
        }
        rows
    }

    fn refuse(&mut self, why: String) {
        self.refused += 1;
        if self.first_refused.is_none() {
            self.first_refused = Some(why);
        }
    }
}
