//! `drivetrain trigger list|show|pause|resume|backfill` and `drivetrain notifications`:
//! what `serve`'s triggers and outbox keep in the state store, read and changed from any
//! process that shares it.

use crate::output::Format;
use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::events::discover::Source;
use drivetrain_engine::state::{StateStore, TriggerRecord};
use drivetrain_engine::Catalog;
use serde_json::json;

use crate::cli::TriggerCommand;
use crate::runs::open_state;

/// A trigger as `-o json` prints it: as `GET /api/v1/triggers` answers it.
fn view(t: &TriggerRecord) -> drivetrain_server::api::openapi::TriggerStatus {
    drivetrain_server::api::openapi::TriggerStatus {
        trigger: t.clone(),
        lag_seconds: t.lag_seconds(),
    }
}

/// `drivetrain trigger …`.
pub fn command(
    catalog: &Catalog,
    home: &Path,
    command: TriggerCommand,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let state = &*state;
    let found = |name: &str| drivetrain_server::query::find_trigger(state, name);
    match command {
        TriggerCommand::List => list(state, out),
        TriggerCommand::Show { trigger } => with(found(&trigger)?, |t| show(t, out)),
        TriggerCommand::Pause { trigger } => with(found(&trigger)?, |t| pause(state, t)),
        TriggerCommand::Resume {
            trigger,
            replay,
            skip,
        } => with(found(&trigger)?, |t| resume(state, t, replay, skip)),
        TriggerCommand::Backfill { trigger, since } => with(found(&trigger)?, |t| {
            backfill(catalog, state, t, &since, out)
        }),
    }
}

/// `then` of the trigger found, or the usage error that it is not.
fn with(
    found: Result<TriggerRecord, String>,
    then: impl FnOnce(&TriggerRecord) -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    match found {
        Ok(t) => then(&t),
        Err(e) => usage(e),
    }
}

/// A usage error: said, exit 2.
fn usage(e: String) -> anyhow::Result<ExitCode> {
    eprintln!("error: {e}");
    Ok(crate::exit::usage())
}

/// `trigger list`.
fn list(state: &dyn StateStore, out: Format) -> anyhow::Result<ExitCode> {
    let all = state.triggers()?;
    if out.json() {
        let rows: Vec<_> = all.iter().map(view).collect();
        crate::output::print_json(&rows)?;
    } else if all.is_empty() {
        println!("no triggers yet: `drivetrain serve --pipelines DIR` registers them");
    } else {
        println!(
            "{:<36} {:<7} {:>8} {:>9} {:>9}  LAST DECISION",
            "TRIGGER", "STATE", "WAITING", "LAG", "CONSUMED"
        );
        for t in &all {
            println!(
                "{:<36} {:<7} {:>8} {:>9} {:>9}  {}",
                format!("{}/{}", t.pipeline, t.trigger),
                if t.paused { "paused" } else { "active" },
                t.waiting,
                t.lag_seconds()
                    .map(|s| format!("{s:.0}s"))
                    .unwrap_or_else(|| "-".into()),
                t.consumed,
                t.last_reason.as_deref().unwrap_or("-")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `trigger show`.
fn show(t: &TriggerRecord, out: Format) -> anyhow::Result<ExitCode> {
    out.print(&view(t), |_| {
        println!("trigger {}/{} ({})", t.pipeline, t.trigger, t.file);
        println!(
            "  state:     {}",
            if t.paused { "paused" } else { "active" }
        );
        println!(
            "  cursor:    {}",
            t.cursor.as_deref().unwrap_or("(none yet)")
        );
        println!(
            "  rescanned: {}",
            t.rescanned_at.as_deref().unwrap_or("never")
        );
        println!(
            "  waiting:   {}{}",
            t.waiting,
            t.lag_seconds()
                .map(|s| format!(" (the oldest for {s:.0} s)"))
                .unwrap_or_default()
        );
        println!("  consumed:  {}   skipped: {}", t.consumed, t.skipped);
        println!(
            "  last:      {} at {}",
            t.last_reason.as_deref().unwrap_or("-"),
            t.evaluated_at.as_deref().unwrap_or("-")
        );
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `trigger pause`.
fn pause(state: &dyn StateStore, t: &TriggerRecord) -> anyhow::Result<ExitCode> {
    crate::audit::audit_local(
        state,
        drivetrain_server::access::DEFAULT_PROJECT,
        "triggers.pause",
        format!("/api/v1/triggers/{}/{}/pause", t.pipeline, t.trigger),
        json!({"paused": true}),
    )?;
    state.set_trigger_paused(&t.pipeline, &t.trigger, true, false)?;
    println!(
        "paused {}/{}: objects keep queueing ({} waiting); no run starts until `drivetrain trigger resume`",
        t.pipeline, t.trigger, t.waiting
    );
    Ok(ExitCode::SUCCESS)
}

/// `trigger resume [--replay | --skip]`.
fn resume(
    state: &dyn StateStore,
    t: &TriggerRecord,
    replay: bool,
    skip: bool,
) -> anyhow::Result<ExitCode> {
    if t.waiting > 0 && !replay && !skip {
        return usage(format!(
            "{} object(s) queued while {}/{} was paused: resume with `--replay` to start runs for them, or `--skip` to drop them (they stay recorded as skipped)",
            t.waiting, t.pipeline, t.trigger
        ));
    }
    let skipped = state.set_trigger_paused(&t.pipeline, &t.trigger, false, skip)?;
    let after = json!({"paused": false, "skipped": skipped});
    crate::audit::audit_local(
        state,
        drivetrain_server::access::DEFAULT_PROJECT,
        "triggers.resume",
        format!("/api/v1/triggers/{}/{}/resume", t.pipeline, t.trigger),
        after,
    )?;
    match skip {
        true => println!(
            "resumed {}/{}: {skipped} queued object(s) skipped",
            t.pipeline, t.trigger
        ),
        false => println!(
            "resumed {}/{}: {} queued object(s) go to runs",
            t.pipeline, t.trigger, t.waiting
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `trigger backfill --since`: the objects of the trigger's listing modified since then,
/// queued unless seen before.
fn backfill(
    catalog: &Catalog,
    state: &dyn StateStore,
    t: &TriggerRecord,
    since: &str,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let since = match parse_since(since) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let source = std::fs::read_to_string(&t.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", t.file))?;
    let Some(mut pipeline) =
        drivetrain_engine::validate_file(Path::new(&t.file), &source, catalog).pipeline
    else {
        return usage(format!(
            "{} does not validate (see `drivetrain validate`)",
            t.file
        ));
    };
    if let Some(folder) = std::path::Path::new(&t.file).parent() {
        pipeline.sources_in_folder(folder);
    }
    let Some(spec) = pipeline.triggers.get(&t.trigger) else {
        return usage(format!(
            "{} has no trigger `{}` any more",
            t.file, t.trigger
        ));
    };
    let drivetrain_engine::events::Watch::Objects(o) = &spec.watch else {
        return usage(format!(
            "`{}` watches runs, not objects: there is no listing to backfill",
            t.trigger
        ));
    };
    let rt = crate::runtime()?;
    let listing = rt.block_on(async {
        Source::open(&o.source)
            .map_err(anyhow::Error::msg)?
            .list(spec, None)
            .await
            .map_err(anyhow::Error::msg)
    })?;
    let objects: Vec<_> = listing
        .objects
        .into_iter()
        .filter(|o| o.modified.as_deref().is_some_and(|m| m >= since.as_str()))
        .collect();
    let new = state.add_objects(&t.pipeline, &t.trigger, &objects, None, false)?;
    if out.json() {
        println!(
            "{}",
            json!({"listed": listing.listed, "since": since, "matched": objects.len(), "new": new})
        );
    } else {
        println!(
            "backfill {}/{}: {} listed, {} modified since {since}, {new} new (the rest were seen before)",
            t.pipeline, t.trigger, listing.listed, objects.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--since`: a date (midnight UTC) or an RFC 3339 time, as RFC 3339 UTC with millis.
pub(crate) fn parse_since(s: &str) -> Result<String, String> {
    let t = match chrono::DateTime::parse_from_rfc3339(s) {
        Ok(t) => t.with_timezone(&chrono::Utc),
        Err(_) => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .map_err(|_| format!("--since `{s}`: give a date (2026-11-01) or an RFC 3339 time"))?
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc(),
    };
    Ok(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// `drivetrain notifications`.
pub fn notifications(
    home: &Path,
    state_filter: Option<&str>,
    limit: usize,
    out: Format,
) -> anyhow::Result<ExitCode> {
    if let Some(s) = state_filter.filter(|s| !["pending", "delivered", "dead"].contains(s)) {
        eprintln!("error: --state `{s}`: give pending, delivered or dead");
        return Ok(crate::exit::usage());
    }
    let state = open_state(home)?;
    let items = state.notifications(state_filter, limit)?;
    if out.json() {
        crate::output::print_json(&items)?;
        return Ok(ExitCode::SUCCESS);
    }
    let counts = state.notification_counts()?;
    println!(
        "{} pending, {} delivered, {} dead",
        counts.get("pending").unwrap_or(&0),
        counts.get("delivered").unwrap_or(&0),
        counts.get("dead").unwrap_or(&0)
    );
    for i in &items {
        println!(
            "{:<9} {:<52} attempts {:<2} {}",
            i.state,
            i.id,
            i.attempts,
            i.last_error.as_deref().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}
