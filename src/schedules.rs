//! `drivetrain schedule`: the schedules `serve` keeps, read and changed in the state
//! store (list with the next tick, the upcoming ticks, suspend, resume, trigger).

use crate::output::Format;
use std::path::Path;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::json;

use crate::runs::open_state;
use drivetrain_server::query::{find_schedule, next_tick, now_text, upcoming};

/// `drivetrain schedule list|next|suspend|resume|trigger`.
pub fn command(
    home: &Path,
    command: crate::cli::ScheduleCommand,
    out: Format,
) -> anyhow::Result<ExitCode> {
    use crate::cli::ScheduleCommand as C;
    let state = open_state(home)?;
    let now = Utc::now();
    match command {
        C::List => {
            let mut rows = Vec::new();
            for s in state.schedules()? {
                let ticks = state.ticks(&s.pipeline, 50)?;
                let next = next_tick(Path::new(&s.file), now, &crate::catalog::catalog());
                rows.push(json!({
                    "pipeline": s.pipeline, "file": s.file, "suspended": s.suspended,
                    "anchor": s.anchor, "next_tick": next, "last_tick": ticks.first(),
                    "recent_ticks": ticks,
                }));
            }
            if out.json() {
                crate::output::print_json(&rows)?;
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
            let Some(s) = find_schedule(&*state, &pipeline, &crate::catalog::catalog())? else {
                eprintln!("error: no schedule `{pipeline}` (a registered pipeline's name or a pipeline file)");
                return Ok(crate::exit::usage());
            };
            let ticks = upcoming(&s, now, count)?;
            out.print(&ticks, |_| {
                println!("`{}` in {}:", s.cron, s.timezone);
                for t in &ticks {
                    println!(
                        "  {}   {}",
                        t["local"].as_str().unwrap_or_default(),
                        t["utc"].as_str().unwrap_or_default()
                    );
                }
            })?;
        }
        C::Suspend { pipeline } => {
            crate::audit::audit_local(
                &*state,
                drivetrain_server::access::DEFAULT_PROJECT,
                "schedules.suspend",
                format!("/api/v1/schedules/{pipeline}/suspend"),
                serde_json::json!({"pipeline": pipeline}),
            )?;
            state.set_suspended(&pipeline, true, None)?;
            println!("{pipeline}: suspended");
        }
        C::Resume { pipeline, catchup } => {
            let anchor = (!catchup).then(now_text);
            crate::audit::audit_local(
                &*state,
                drivetrain_server::access::DEFAULT_PROJECT,
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
                return Ok(crate::exit::usage());
            }
            crate::audit::audit_local(
                &*state,
                drivetrain_server::access::DEFAULT_PROJECT,
                "schedules.trigger",
                format!("/api/v1/schedules/{pipeline}/trigger"),
                serde_json::json!({"pipeline": pipeline}),
            )?;
            let run = drivetrain_server::query::queue_manual_tick(&*state, &pipeline)?;
            println!("{pipeline}: run {run} queued; the server starts it within a second");
        }
    }
    Ok(ExitCode::SUCCESS)
}
