//! `drivetrain queue`: the home's GPUs as its ledger sees them — what holds devices, what
//! waits for them and why (its place, who holds what it waits for, whom it preempts), by
//! queue and project; claims left by runs that ended are marked stale (the next claim
//! frees them).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::state::{GpuClaim, GpuWait, RunId, StateStore};
use serde_json::{json, Value};

use crate::output::Format;

/// Prints the queue, as text or JSON.
pub fn queue(home: &Path, out: Format) -> anyhow::Result<ExitCode> {
    let state = crate::runs::open_state(home)?;
    let claims = state.gpu_claims()?;
    let waits = state.gpu_waits()?;
    let runs = runs_of(state.as_ref(), &claims, &waits);
    let rows = rows(&claims, &waits, &runs);
    let classes: BTreeMap<String, i64> = state.priority_classes()?.into_iter().collect();
    if out.json() {
        crate::output::print_json(&json!({"entries": rows, "classes": classes}))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !classes.is_empty() {
        let list: Vec<String> = classes.iter().map(|(n, v)| format!("{n} = {v}")).collect();
        println!("priority classes: {}", list.join(", "));
    }
    if rows.is_empty() {
        println!("no GPU is held or waited for in this home");
        return Ok(ExitCode::SUCCESS);
    }
    let mut by_queue: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for r in &rows {
        by_queue
            .entry(r["queue"].as_str().unwrap_or("default"))
            .or_default()
            .push(r);
    }
    for (queue, entries) in by_queue {
        println!("queue {queue}:");
        for e in entries {
            println!("  {}", line(e));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `queue class NAME VALUE` (or `--delete`: `value` none).
pub fn class(home: &Path, name: &str, value: Option<i64>) -> anyhow::Result<ExitCode> {
    use drivetrain_engine::validate::{dns1123_label, MAX_PRIORITY};
    if let Err(why) = dns1123_label(name) {
        anyhow::bail!("priority class name `{name}` {why}");
    }
    if let Some(v) = value.filter(|v| v.abs() > MAX_PRIORITY) {
        anyhow::bail!("priority {v} is out of bounds: from -{MAX_PRIORITY} to {MAX_PRIORITY}");
    }
    let state = crate::runs::open_state(home)?;
    state.set_priority_class(name, value)?;
    match value {
        Some(v) => println!("priority class {name} = {v}"),
        None => println!("priority class {name} forgotten"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Each run named by a claim or a wait: its project, pipeline and whether it still runs.
fn runs_of(
    state: &dyn StateStore,
    claims: &[GpuClaim],
    waits: &[GpuWait],
) -> BTreeMap<RunId, Value> {
    let ids = claims
        .iter()
        .map(|c| &c.run)
        .chain(waits.iter().map(|w| &w.run));
    let mut out = BTreeMap::new();
    for id in ids {
        if out.contains_key(id) {
            continue;
        }
        let about = match state.run(id) {
            Ok(r) => {
                json!({"project": r.project, "pipeline": r.pipeline, "ended": r.phase.is_terminal()})
            }
            Err(_) => json!({"project": null, "pipeline": null, "ended": true}),
        };
        out.insert(id.clone(), about);
    }
    out
}

/// One entry a holder (its devices together) or a waiter, holders first.
fn rows(claims: &[GpuClaim], waits: &[GpuWait], runs: &BTreeMap<RunId, Value>) -> Vec<Value> {
    let mut held: Vec<(&GpuClaim, Vec<&str>)> = Vec::new();
    for c in claims {
        match held
            .iter_mut()
            .find(|(h, _)| h.run == c.run && h.holder == c.holder)
        {
            Some((_, devices)) => devices.push(&c.device),
            None => held.push((c, vec![&c.device])),
        }
    }
    let mut rows: Vec<Value> = held
        .into_iter()
        .map(|(c, devices)| {
            let run = &runs[&c.run];
            json!({
                "state": if run["ended"] == true { "stale" } else { "holding" },
                "queue": c.queue, "priority": c.priority, "preemptible": c.preemptible,
                "run": c.run, "holder": c.holder, "project": run["project"],
                "pipeline": run["pipeline"], "host": c.host, "devices": devices,
                "since": c.claimed_at, "preempted_by": c.preempted_by,
            })
        })
        .collect();
    for (w, place) in placed(waits) {
        let run = &runs[&w.run];
        rows.push(json!({
            "state": "waiting", "queue": w.queue, "priority": w.priority, "run": w.run,
            "holder": w.holder, "project": run["project"], "pipeline": run["pipeline"],
            "host": w.host, "gpus": w.count, "since": w.since, "place": place,
        }));
    }
    rows
}

/// Each waiter with its place on its machine (from 1), in the ledger's order.
pub fn placed(waits: &[GpuWait]) -> Vec<(&GpuWait, usize)> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    waits
        .iter()
        .map(|w| {
            let n = seen.entry(&w.host).or_default();
            *n += 1;
            (w, *n)
        })
        .collect()
}

/// What `list` says of a run's attempts waiting for GPUs: `train#1 waits for 2 GPU(s),
/// place 1`.
pub fn waiting_in(run: &RunId, waits: &[GpuWait]) -> Vec<String> {
    placed(waits)
        .into_iter()
        .filter(|(w, _)| &w.run == run)
        .map(|(w, place)| format!("{} waits for {} GPU(s), place {place}", w.holder, w.count))
        .collect()
}

fn line(e: &Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or("-").to_owned();
    let who = format!(
        "{} of run {} (pipeline {}, project {}), priority {}",
        s("holder"),
        s("run"),
        s("pipeline"),
        s("project"),
        e["priority"]
    );
    match e["state"].as_str() {
        Some("waiting") => format!(
            "waiting  {who}: {} GPU(s) on {}, place {} on that machine, since {}",
            e["gpus"],
            s("host"),
            e["place"],
            s("since")
        ),
        Some(state) => {
            let devices: Vec<&str> = e["devices"]
                .as_array()
                .map(|d| d.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut l = format!(
                "{state:<8} {who}: {}:{} since {}",
                s("host"),
                devices.join(","),
                s("since")
            );
            if e["preemptible"] == true {
                l.push_str(", preemptible");
            }
            if let Some(by) = e["preempted_by"].as_str() {
                l.push_str(&format!(", being preempted by {by}"));
            }
            if state == "stale" {
                l.push_str(" (its run ended: the next claim frees it)");
            }
            l
        }
        None => String::new(),
    }
}
