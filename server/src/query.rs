//! What the API and the command line both read from a home: the runs that pass a filter,
//! why a stage was a cache hit or a miss, the model a registry target names, the trigger a
//! name names, and a schedule's ticks.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Utc};
use drivetrain_engine::cache::diff;
use drivetrain_engine::plan::Schedule;
use drivetrain_engine::schedule::Ticker;
use drivetrain_engine::state::{Origin, Phase, RunId, ScheduleStore, StateStore, TriggerRecord};
use drivetrain_engine::Catalog;
use serde_json::{json, Value};

/// Which runs `list` shows.
#[derive(Debug, Default)]
pub struct ListFilter {
    pub limit: usize,
    pub pipeline: Option<String>,
    pub phase: Option<String>,
    /// `cli`, `api`, `schedule`, `rerun`, `retry`.
    pub trigger: Option<String>,
    /// Created at or after this RFC 3339 time.
    pub since: Option<String>,
    /// Of one of these projects (`None`: any).
    pub projects: Option<Vec<String>>,
}

/// A phase as a person types it, in any case: `failed`, `Failed`, `FAILED`.
fn parse_phase(p: &str) -> Option<Phase> {
    let mut chars = p.chars();
    let word: String = chars
        .next()
        .into_iter()
        .flat_map(char::to_uppercase)
        .collect();
    Phase::parse(&(word + &chars.as_str().to_ascii_lowercase()))
}

/// The newest runs that pass `filter`, filtered by the state store. `Err` names a phase
/// that is none.
pub fn runs_matching(
    state: &dyn StateStore,
    filter: &ListFilter,
) -> anyhow::Result<Result<Vec<drivetrain_engine::state::RunRecord>, String>> {
    let given = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
    let phase = match given(&filter.phase) {
        None => None,
        Some(p) => match parse_phase(&p) {
            Some(phase) => Some(phase),
            None => {
                return Ok(Err(format!(
                    "{p}: not a phase of a run (pending, running, succeeded, failed, …)"
                )))
            }
        },
    };
    let by = drivetrain_engine::state::RunFilter {
        pipeline: given(&filter.pipeline),
        phase,
        trigger: given(&filter.trigger),
        since: given(&filter.since),
        projects: filter.projects.clone(),
    };
    Ok(Ok(state.find_runs(&by, filter.limit)?))
}

/// Runs recorded as going on whose engine stopped beating (three heartbeats missed),
/// wherever it ran: killed, or its machine gone.
pub fn orphans(
    state: &dyn drivetrain_engine::state::RunStore,
) -> Result<std::collections::BTreeSet<RunId>, drivetrain_engine::state::StateError> {
    let before = drivetrain_engine::engine::recover::stale_before();
    Ok(state.stale_runs(&before)?.into_iter().collect())
}

pub fn components(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Why a stage was a cache hit or a miss, as `explain --output json` prints it and the
/// API answers: the verdict, the key's components, and the components that changed since
/// the closest other cache entry of the stage. `Err` names the stages a run has when it
/// has no stage `stage`.
pub fn explanation(
    state: &dyn StateStore,
    run: &str,
    stage: &str,
) -> anyhow::Result<Result<Value, String>> {
    let id = RunId(run.to_owned());
    let record = state.run(&id)?;
    let Some(s) = state.stage(&id, stage)? else {
        let names: Vec<String> = state.stages(&id)?.into_iter().map(|s| s.stage.0).collect();
        return Ok(Err(format!(
            "run {run} has no stage `{stage}`; it has {}",
            names.join(", ")
        )));
    };
    let mine = components(&s.how.provenance["components"]);
    let lookup = s.how.provenance["cache"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let key = s.how.cache_key.clone().unwrap_or_default();
    let (verdict, changes, compared) = match &s.how.origin {
        Origin::Cached { run: from } => (
            format!("hit: outputs taken from run {from} (key {key})"),
            Vec::new(),
            None,
        ),
        Origin::Reused { run: from } => (
            format!(
                "reused: a {} of run {} took this stage's outputs from run {from} without executing it",
                record.trigger,
                record.parent.as_ref().map(|p| p.0.as_str()).unwrap_or("?"),
            ),
            Vec::new(),
            None,
        ),
        Origin::Ran => {
            // The closest of the recent entries: fewest changed components, then newest.
            let previous = state
                .recent_cache_entries(&record.pipeline, &record.project, stage, &key, 50)?
                .into_iter()
                .map(|p| (diff(&components(&p.components), &mine).len(), p))
                .min_by_key(|(changed, _)| *changed)
                .map(|(_, p)| p);
            let verdict = match lookup.as_str() {
                "" => "ran (no cache record)".to_owned(),
                l if l.starts_with("not") => format!("ran: {l}"),
                l => format!("ran: cache {l}"),
            };
            match previous {
                Some(p) => {
                    let changes = diff(&components(&p.components), &mine);
                    (verdict, changes, Some(p.run_id))
                }
                None => (verdict, Vec::new(), None),
            }
        }
    };
    // What changed in the rendered definition itself, beside the digests.
    let mut definition_changes = Vec::new();
    if let Some(other) = compared
        .as_ref()
        .and_then(|r| state.stage(&RunId(r.clone()), stage).ok().flatten())
    {
        definition_diff(
            &other.how.provenance["definition"],
            &s.how.provenance["definition"],
            "",
            &mut definition_changes,
        );
    }
    Ok(Ok(json!({
        "run": run,
        "stage": stage,
        "definition_changes": definition_changes,
        "origin": s.how.origin.name(),
        "origin_run": s.how.origin.run(),
        "verdict": verdict,
        "cache_key": s.how.cache_key,
        "compared_with_run": compared,
        "changes": changes,
        "components": mine,
        // What a stage that succeeded still said about its result (logs read only in
        // part, values it could not take): a cache hit passes these on too.
        "warnings": s.values.get("warnings").cloned().unwrap_or(json!([])),
    })))
}

/// A value of a definition as `explain` shows it, clipped as diagnostics are.
pub fn shown(v: Option<&Value>) -> String {
    use drivetrain_engine::diag::clip;
    match v {
        None => "(absent)".to_owned(),
        Some(Value::String(t)) => clip(format!("{t:?}")),
        Some(v) => clip(v.to_string()),
    }
}

/// Appends `PATH: OLD → NEW` for each leaf that differs between two rendered definitions
/// (objects by key, arrays by position).
pub fn definition_diff(old: &Value, new: &Value, path: &str, out: &mut Vec<String>) {
    let at = |k: &str| match path {
        "" => k.to_owned(),
        p => format!("{p}.{k}"),
    };
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => definition_diff(x, y, &at(k), out),
                    (x, y) => out.push(format!("{}: {} → {}", at(k), shown(x), shown(y))),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                definition_diff(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (x, y) if x != y => out.push(format!(
            "{}: {} → {}",
            if path.is_empty() { "definition" } else { path },
            shown(Some(x)),
            shown(Some(y))
        )),
        _ => {}
    }
}

/// A lineage target naming a registered model (`MODEL@VERSION`, `MODEL@ALIAS`): the
/// digest of the model artifact it was registered from.
pub fn model_target(
    home: &Path,
    target: &str,
    rt: &tokio::runtime::Handle,
) -> anyhow::Result<Option<String>> {
    if !target.contains('@') {
        return Ok(None);
    }
    let reg = drivetrain_steps::registry::Registry::open_for(
        None,
        &drivetrain_engine::engine::Home::at(home)?.store_url(None)?,
    )?;
    let v = rt.block_on(reg.resolve(target))?;
    Ok(v.pointer("/source/model_digest")
        .and_then(Value::as_str)
        .map(str::to_owned))
}

/// The trigger `name` names: `PIPELINE/TRIGGER`, or a trigger name only one pipeline has.
pub fn find_trigger(
    state: &dyn StateStore,
    name: &str,
) -> anyhow::Result<Result<TriggerRecord, String>> {
    let all = state.triggers()?;
    let found: Vec<TriggerRecord> = all
        .iter()
        .filter(|t| match name.split_once('/') {
            Some((p, n)) => t.pipeline == p && t.trigger == n,
            None => t.trigger == name,
        })
        .cloned()
        .collect();
    Ok(match found.len() {
        1 => Ok(found.into_iter().next().expect("one")),
        0 => Err(format!(
            "no trigger `{name}`; known: {}",
            match all.is_empty() {
                true => "none (`drivetrain serve --pipelines DIR` registers them)".to_owned(),
                false => all
                    .iter()
                    .map(|t| format!("{}/{}", t.pipeline, t.trigger))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        )),
        _ => Err(format!(
            "`{name}` is a trigger of several pipelines: write PIPELINE/{name}"
        )),
    })
}

/// The schedule of the pipeline file `file`, if it validates and has one.
pub fn schedule_in(file: &Path, catalog: &Catalog) -> anyhow::Result<Schedule> {
    let source = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let pipeline = drivetrain_engine::validate_file(file, &source, catalog)
        .pipeline
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} does not validate (see `drivetrain validate`)",
                file.display()
            )
        })?;
    pipeline
        .schedule
        .ok_or_else(|| anyhow::anyhow!("{} has no `schedule:`", file.display()))
}

/// The schedule `pipeline` names: a registered schedule's name, or a pipeline file.
pub fn find_schedule(
    state: &dyn ScheduleStore,
    pipeline: &str,
    catalog: &Catalog,
) -> anyhow::Result<Option<Schedule>> {
    let file = match state.schedule(pipeline)? {
        Some(s) => s.file,
        None if Path::new(pipeline).is_file() => pipeline.to_owned(),
        None => return Ok(None),
    };
    schedule_in(Path::new(&file), catalog).map(Some)
}

/// A tick as JSON: the UTC instant and the wall-clock time in the schedule's zone.
pub fn tick(s: &Schedule, at: DateTime<Utc>) -> Value {
    let local = at.with_timezone(&s.timezone);
    json!({
        "utc": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "local": local.format("%Y-%m-%d %H:%M:%S %Z (%:z)").to_string(),
    })
}

/// The next `n` ticks of `s` after `now`.
pub fn upcoming(s: &Schedule, now: DateTime<Utc>, n: usize) -> anyhow::Result<Vec<Value>> {
    let ticker = Ticker::new(s).map_err(|e| anyhow::anyhow!(e))?;
    let mut out = Vec::new();
    let mut t = now;
    while out.len() < n {
        let Some(next) = ticker.next_after(t) else {
            break;
        };
        out.push(tick(s, next));
        t = next;
    }
    Ok(out)
}

/// The next tick of the schedule in `file` after `now` (`null` if none); a file that no
/// longer validates has no next tick, and the value says why (`{"error": …}`).
pub fn next_tick(file: &Path, now: DateTime<Utc>, catalog: &Catalog) -> Value {
    match schedule_in(file, catalog).and_then(|sched| upcoming(&sched, now, 1)) {
        Ok(mut next) => next.pop().unwrap_or(Value::Null),
        Err(e) => json!({"error": format!("{e:#}")}),
    }
}

/// Now, as schedules record it (seconds, UTC).
pub fn now_text() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Records a claimed tick for now that the server will start: `schedule trigger`.
pub fn queue_manual_tick(
    state: &dyn StateStore,
    pipeline: &str,
) -> anyhow::Result<drivetrain_engine::state::RunId> {
    let at = chrono::Utc::now();
    let run = drivetrain_engine::schedule::tick_run_id(pipeline, at);
    state.claim_tick(&drivetrain_engine::state::TickRecord {
        id: format!(
            "{}+manual",
            drivetrain_engine::schedule::tick_id(pipeline, at)
        ),
        pipeline: pipeline.to_owned(),
        scheduled_time: at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        outcome: "fired".into(),
        run_id: Some(run.0.clone()),
        reason: Some("triggered by hand".into()),
    })?;
    Ok(run)
}
