//! `drivetrain schedule`: the schedules `serve` keeps, read and changed in the state
//! store (list with the next tick, the upcoming ticks, suspend, resume, trigger).

use std::path::Path;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use drivetrain_engine::plan::Schedule;
use drivetrain_engine::schedule::Ticker;
use drivetrain_engine::state::{ScheduleStore, StateStore};
use serde_json::{json, Value};

use crate::runs::open_state;

/// The schedule of the pipeline file `file`, if it validates and has one.
fn schedule_in(file: &Path) -> anyhow::Result<Schedule> {
    let source = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let pipeline = drivetrain_engine::validate(&source, &crate::catalog::catalog())
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
fn find(state: &dyn ScheduleStore, pipeline: &str) -> anyhow::Result<Option<Schedule>> {
    let file = match state.schedule(pipeline)? {
        Some(s) => s.file,
        None if Path::new(pipeline).is_file() => pipeline.to_owned(),
        None => return Ok(None),
    };
    schedule_in(Path::new(&file)).map(Some)
}

/// A tick as JSON: the UTC instant and the wall-clock time in the schedule's zone.
fn tick(s: &Schedule, at: DateTime<Utc>) -> Value {
    let local = at.with_timezone(&s.timezone);
    json!({
        "utc": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "local": local.format("%Y-%m-%d %H:%M:%S %Z (%:z)").to_string(),
    })
}

/// The next `n` ticks of `s` after `now`.
fn upcoming(s: &Schedule, now: DateTime<Utc>, n: usize) -> anyhow::Result<Vec<Value>> {
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
pub(crate) fn next_tick(file: &Path, now: DateTime<Utc>) -> Value {
    match schedule_in(file).and_then(|sched| upcoming(&sched, now, 1)) {
        Ok(mut next) => next.pop().unwrap_or(Value::Null),
        Err(e) => json!({"error": format!("{e:#}")}),
    }
}

/// `drivetrain schedule list|next|suspend|resume|trigger`.
pub fn command(
    home: &Path,
    command: crate::cli::ScheduleCommand,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    use crate::cli::ScheduleCommand as C;
    let state = open_state(home)?;
    let now = Utc::now();
    match command {
        C::List => {
            let mut rows = Vec::new();
            for s in state.schedules()? {
                let ticks = state.ticks(&s.pipeline, 50)?;
                let next = next_tick(Path::new(&s.file), now);
                rows.push(json!({
                    "pipeline": s.pipeline, "file": s.file, "suspended": s.suspended,
                    "anchor": s.anchor, "next_tick": next, "last_tick": ticks.first(),
                    "recent_ticks": ticks,
                }));
            }
            if json_out {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if rows.is_empty() {
                println!("no schedules yet: `drivetrain serve --pipelines DIR` registers them");
            } else {
                println!("{:<24} {:<9} {:<22} LAST", "PIPELINE", "STATE", "NEXT");
                for r in &rows {
                    let next = &r["next_tick"];
                    println!(
                        "{:<24} {:<9} {:<22} {}",
                        r["pipeline"].as_str().unwrap_or_default(),
                        if r["suspended"] == true {
                            "suspended"
                        } else {
                            "active"
                        },
                        next["utc"]
                            .as_str()
                            .or(next["error"].as_str().map(|_| "(file invalid)"))
                            .unwrap_or("-"),
                        r["last_tick"]["scheduled_time"].as_str().unwrap_or("-")
                    );
                }
            }
        }
        C::Next { pipeline, count } => {
            let Some(s) = find(&*state, &pipeline)? else {
                eprintln!("error: no schedule `{pipeline}` (a registered pipeline's name or a pipeline file)");
                return Ok(ExitCode::from(2));
            };
            let ticks = upcoming(&s, now, count)?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&ticks)?);
            } else {
                println!("`{}` in {}:", s.cron, s.timezone);
                for t in &ticks {
                    println!(
                        "  {}   {}",
                        t["local"].as_str().unwrap_or_default(),
                        t["utc"].as_str().unwrap_or_default()
                    );
                }
            }
        }
        C::Suspend { pipeline } => {
            crate::people::audit_local(
                &*state,
                crate::server::access::DEFAULT_PROJECT,
                "schedules.suspend",
                format!("/api/v1/schedules/{pipeline}/suspend"),
                serde_json::json!({"pipeline": pipeline}),
            )?;
            state.set_suspended(&pipeline, true, None)?;
            println!("{pipeline}: suspended");
        }
        C::Resume { pipeline, catchup } => {
            let anchor = (!catchup).then(now_text);
            crate::people::audit_local(
                &*state,
                crate::server::access::DEFAULT_PROJECT,
                "schedules.resume",
                format!("/api/v1/schedules/{pipeline}/resume"),
                serde_json::json!({"pipeline": pipeline}),
            )?;
            state.set_suspended(&pipeline, false, anchor.as_deref())?;
            println!(
                "{pipeline}: resumed{}",
                if catchup {
                    " (missed ticks follow the catch-up policy)"
                } else {
                    "; ticks missed while suspended do not fire"
                }
            );
        }
        C::Trigger { pipeline } => {
            if state.schedule(&pipeline)?.is_none() {
                eprintln!("error: no schedule `{pipeline}`");
                return Ok(ExitCode::from(2));
            }
            crate::people::audit_local(
                &*state,
                crate::server::access::DEFAULT_PROJECT,
                "schedules.trigger",
                format!("/api/v1/schedules/{pipeline}/trigger"),
                serde_json::json!({"pipeline": pipeline}),
            )?;
            let run = queue_manual_tick(&*state, &pipeline)?;
            println!("{pipeline}: run {run} queued; the server starts it within a second");
        }
    }
    Ok(ExitCode::SUCCESS)
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
