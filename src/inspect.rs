//! `status`, `list` and `logs`: reading what runs recorded.

use crate::output::Format;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use drivetrain_engine::artifacts::{ArtifactStore, AttemptKey};
use drivetrain_engine::state::{Phase, RunId, RunStore};
use serde_json::json;

use crate::runs::*;

/// `drivetrain status [RUN]`.
pub fn status(home: &Path, run: Option<&str>, out: Format) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(home, &*state, run)?;
    let record = state.run(&id)?;
    let stages = state.stages(&id)?;
    if out.json() {
        let mut items = serde_json::Map::new();
        let mut item_usage = serde_json::Map::new();
        let mut trial_states = serde_json::Map::new();
        for st in &stages {
            let trials = trial_counts(state.as_ref(), &id, &st.stage)?;
            if !trials.is_empty() {
                trial_states.insert(st.stage.to_string(), serde_json::to_value(trials)?);
            }
            let counts = state.item_counts(&id, &st.stage)?;
            if !counts.is_empty() {
                items.insert(st.stage.to_string(), serde_json::to_value(counts)?);
                if let Some(u) = items_usage(&state.map_items(&id, &st.stage)?) {
                    item_usage.insert(st.stage.to_string(), serde_json::to_value(u)?);
                }
            }
        }
        let notes: serde_json::Map<String, serde_json::Value> = stages
            .iter()
            .filter_map(|s| Some((s.stage.to_string(), json!(executor_note(home, &id, s)?))))
            .collect();
        crate::output::print_json(&json!({
            "run": record,
            "trigger": state.run_trigger(&id)?,
            "orphaned": orphaned(state.as_ref())?.contains(&id),
            "stages": stages,
            "items": items,
            "trials": trial_states,
            "item_usage": item_usage,
            "notes": notes,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "run {} of {} ({}): {}{}",
        record.id,
        record.pipeline,
        record.file,
        record.phase,
        record
            .reason
            .as_ref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    if orphaned(state.as_ref())?.contains(&id) {
        println!("{}", orphan_hint(&id));
    }
    if let Some(parent) = &record.parent {
        println!("{} of run {parent}", record.trigger);
    }
    if let Some(t) = state.run_trigger(&id)? {
        print_trigger(&t);
    }
    println!(
        "{:<24} {:<10} {:<38} {:>8} {:>9} {:>5}  reason",
        "stage", "phase", "origin", "attempts", "duration", "exit"
    );
    for s in &stages {
        let duration = match (&s.started_at, &s.finished_at) {
            (Some(a), Some(b)) => elapsed(a, b),
            _ => String::new(),
        };
        let origin = match (&s.how.origin, s.how.origin.run()) {
            _ if s.phase != Phase::Succeeded => String::new(),
            (o, Some(r)) => format!("{} (from run {r})", o.name()),
            (o, None) => o.name().to_owned(),
        };
        println!(
            "{:<24} {:<10} {:<38} {:>8} {:>9} {:>5}  {}",
            s.stage,
            s.phase.as_str(),
            origin,
            s.attempts,
            duration,
            s.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            s.reason
                .as_deref()
                .and_then(|r| r.lines().next())
                .map(str::to_owned)
                .or_else(|| executor_note(home, &id, s))
                .unwrap_or_default()
        );
        if let Some(used) = s.usage.as_ref().map(usage_line).filter(|l| !l.is_empty()) {
            println!("{:<24} used: {used}", "");
        }
        // A map stage: how its items stand.
        let counts = state.item_counts(&id, &s.stage)?;
        if !counts.is_empty() {
            let total: u64 = counts.values().sum();
            let parts: Vec<String> = counts
                .iter()
                .map(|(p, n)| format!("{n} {}", p.to_lowercase()))
                .collect();
            println!("{:<24} items: {total} ({})", "", parts.join(", "));
        }
        // A search stage: how its trials stand (`drivetrain trials` lists them).
        let trials = trial_counts(state.as_ref(), &id, &s.stage)?;
        if !trials.is_empty() {
            let total: usize = trials.values().sum();
            let parts: Vec<String> = trials.iter().map(|(st, n)| format!("{n} {st}")).collect();
            println!("{:<24} trials: {total} ({})", "", parts.join(", "));
        }
        if !counts.is_empty() {
            if let Some(u) = items_usage(&state.map_items(&id, &s.stage)?) {
                println!(
                    "{:<24} items used: {} (memory: the largest item's peak; CPU: all items)",
                    "",
                    usage_line(&u)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The trigger that started a run and (the first ten of) its objects.
fn print_trigger(t: &drivetrain_engine::state::RunTrigger) {
    println!(
        "started by trigger {} for {} object(s):",
        t.trigger,
        t.objects.len()
    );
    for o in t.objects.iter().take(10) {
        println!("  {} ({})", o.url, o.etag);
    }
    if t.objects.len() > 10 {
        println!(
            "  … and {} more (`-o json` lists them all)",
            t.objects.len() - 10
        );
    }
}

/// What the executor last said of a running stage's attempt in its log (a line
/// `drivetrain: …`, such as a Slurm job's pending reason), if anything.
fn executor_note(
    home: &Path,
    id: &RunId,
    s: &drivetrain_engine::state::StageRecord,
) -> Option<String> {
    if s.phase != Phase::Running || s.attempts == 0 {
        return None;
    }
    // The end of the log only: a running stage's log may be large.
    let log = drivetrain_executors::file_tail(
        &live_log(&home.join("work"), &id.0, &s.stage, s.attempts),
        64 * 1024,
    );
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("drivetrain: "))
        .map(str::to_owned)
}

/// What an attempt used, for people: `peak 812.0 MiB memory, 3.2 CPU s, GPUs 41% …`.
/// What a map stage's items used together: the largest peak of memory (of GPU memory)
/// among them, their CPU seconds summed, their GPUs' mean utilization; `None` when no
/// item recorded any.
fn items_usage(
    items: &[drivetrain_engine::state::ItemRecord],
) -> Option<drivetrain_engine::executor::ResourceUsage> {
    let used: Vec<_> = items.iter().filter_map(|i| i.usage).collect();
    if used.is_empty() {
        return None;
    }
    let max = |f: fn(&drivetrain_engine::executor::ResourceUsage) -> Option<u64>| {
        used.iter().filter_map(f).max()
    };
    let gpu: Vec<f64> = used
        .iter()
        .filter_map(|u| u.gpu_utilization_percent)
        .collect();
    Some(drivetrain_engine::executor::ResourceUsage {
        peak_memory_bytes: max(|u| u.peak_memory_bytes),
        cpu_seconds: used
            .iter()
            .filter_map(|u| u.cpu_seconds)
            .reduce(|a, b| a + b),
        gpu_utilization_percent: (!gpu.is_empty())
            .then(|| gpu.iter().sum::<f64>() / gpu.len() as f64),
        gpu_memory_bytes: max(|u| u.gpu_memory_bytes),
    })
}

fn usage_line(u: &drivetrain_engine::executor::ResourceUsage) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0));
    [
        u.peak_memory_bytes
            .map(|b| format!("peak {} memory", mib(b))),
        u.cpu_seconds.map(|c| format!("{c:.2} CPU s")),
        u.gpu_utilization_percent
            .map(|g| format!("GPUs {g:.0}% busy")),
        u.gpu_memory_bytes
            .map(|b| format!("peak {} GPU memory", mib(b))),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ")
}

fn elapsed(a: &str, b: &str) -> String {
    match (
        chrono::DateTime::parse_from_rfc3339(a),
        chrono::DateTime::parse_from_rfc3339(b),
    ) {
        (Ok(a), Ok(b)) => format!("{:.1}s", (b - a).num_milliseconds() as f64 / 1000.0),
        _ => String::new(),
    }
}

/// `drivetrain list`.
/// `status --watch`: the status every second (the screen cleared first on a terminal)
/// until the run ends; exit 0 when it succeeded, 1 otherwise.
pub fn watch(home: &Path, run: Option<&str>, out: Format) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let state = open_state(home)?;
    let id = resolve_run(home, &*state, run)?;
    let clear = std::io::stdout().is_terminal() && !out.json();
    loop {
        let phase = state.run(&id)?.phase;
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        status(home, Some(&id.0), out)?;
        if phase.is_terminal() {
            return Ok(ExitCode::from(u8::from(phase != Phase::Succeeded)));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `drivetrain list`.
pub fn list(
    home: &Path,
    filter: &drivetrain_server::query::ListFilter,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let runs = match drivetrain_server::query::runs_matching(&*state, filter)? {
        Ok(runs) => runs,
        Err(why) => {
            eprintln!("error: --phase {why}");
            return Ok(crate::exit::usage());
        }
    };
    let orphans = orphaned(state.as_ref())?;
    // Why a running run's stages wait, where they wait for GPUs.
    let waits = state.gpu_waits().unwrap_or_default();
    if out.json() {
        let mut out = Vec::new();
        for r in &runs {
            let mut v = serde_json::to_value(r)?;
            v["orphaned"] = json!(orphans.contains(&r.id));
            let waiting = crate::queue::waiting_in(&r.id, &waits);
            if !waiting.is_empty() {
                v["waiting"] = json!(waiting);
            }
            out.push(v);
        }
        crate::output::print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    for r in &runs {
        let phase = match orphans.contains(&r.id) {
            true => format!("{} (orphaned)", r.phase.as_str()),
            false => r.phase.as_str().to_owned(),
        };
        let waiting = crate::queue::waiting_in(&r.id, &waits);
        let waiting = match waiting.is_empty() {
            true => String::new(),
            false => format!("  ({})", waiting.join("; ")),
        };
        println!(
            "{}  {:<19} {:<24} {}{waiting}",
            r.id, phase, r.pipeline, r.created_at
        );
    }
    if let Some(r) = runs.iter().find(|r| orphans.contains(&r.id)) {
        println!("{}", orphan_hint(&r.id));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs recorded as running whose engine stopped beating.
fn orphaned(state: &dyn RunStore) -> anyhow::Result<std::collections::BTreeSet<RunId>> {
    Ok(drivetrain_server::query::orphans(state)?)
}

fn orphan_hint(run: &RunId) -> String {
    format!(
        "orphaned: the engine of run {run} stopped; `drivetrain resume {run}` goes on where it \
         stopped, `drivetrain cancel {run}` ends it"
    )
}

/// `drivetrain logs RUN --stage S --follow`: prints the stage's log as it is written,
/// attempt after attempt, until the stage has ended.
pub fn follow(home: &Path, run: Option<&str>, stage: &str) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let state = open_state(home)?;
    let id = resolve_run(home, &*state, run)?;
    let mut attempt = 0u32;
    let mut offset = 0u64;
    let out = std::io::stdout();
    loop {
        let attempts: Vec<_> = state
            .attempts(&id)?
            .into_iter()
            .filter(|a| a.stage == stage)
            .collect();
        let current = attempts.iter().find(|a| a.attempt == attempt);
        let newest = attempts.iter().map(|a| a.attempt).max().unwrap_or(0);
        let path = live_log(&home.join("work"), &id.0, stage, attempt);
        if attempt > 0 {
            if let Ok(mut f) = std::fs::File::open(&path) {
                f.seek(SeekFrom::Start(offset))?;
                let mut buf = Vec::new();
                f.read_to_end(&mut buf)?;
                offset += buf.len() as u64;
                out.lock().write_all(&buf)?;
                out.lock().flush()?;
            }
        }
        let attempt_done = current.is_none_or(|a| a.phase.is_terminal());
        if attempt_done && newest > attempt {
            attempt += 1;
            offset = 0;
            if attempt > 1 {
                println!("── {stage} (attempt {attempt}) ──");
            }
            continue;
        }
        let stage_done = state
            .stages(&id)?
            .iter()
            .any(|s| s.stage == stage && s.phase.is_terminal());
        let run_done = state.run(&id)?.phase.is_terminal();
        if attempt_done && (stage_done || run_done) && newest <= attempt {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `drivetrain logs RUN --follow`: every attempt's log as it is written, each line led by
/// its stage (and attempt, from the second on), until the run ends. Exit 0 when the run
/// succeeded, 1 when it did not, 130 when it was cancelled.
pub fn follow_run(home: &Path, run: Option<&str>) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let state = open_state(home)?;
    let id = resolve_run(home, &*state, run)?;
    state.run(&id)?;
    // (stage, attempt) → (bytes read, the line begun but not ended).
    let mut read: BTreeMap<(String, u32), (u64, Vec<u8>)> = BTreeMap::new();
    let out = std::io::stdout();
    loop {
        // The run's phase is read before the files, so nothing written before its end is
        // missed.
        let phase = state.run(&id)?.phase;
        for a in state.attempts(&id)? {
            let path = live_log(&home.join("work"), &id.0, &a.stage, a.attempt);
            let label = match a.attempt {
                1 => a.stage.to_string(),
                n => format!("{}#{n}", a.stage),
            };
            let (offset, partial) = read.entry((a.stage.to_string(), a.attempt)).or_default();
            let mut chunk = Vec::new();
            if let Ok(mut f) = std::fs::File::open(&path) {
                f.seek(SeekFrom::Start(*offset))?;
                f.read_to_end(&mut chunk)?;
            }
            *offset += chunk.len() as u64;
            partial.extend_from_slice(&chunk);
            let mut lock = out.lock();
            while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial.drain(..=end).collect();
                write!(lock, "{label} | ")?;
                lock.write_all(&line)?;
            }
            if a.phase.is_terminal() && !partial.is_empty() {
                write!(lock, "{label} | ")?;
                lock.write_all(partial)?;
                writeln!(lock)?;
                partial.clear();
            }
            lock.flush()?;
        }
        if phase.is_terminal() || phase == Phase::Waiting {
            return Ok(match phase {
                Phase::Succeeded => ExitCode::SUCCESS,
                Phase::Cancelled => ExitCode::from(crate::runs::EXIT_CANCELLED),
                Phase::Waiting => ExitCode::from(crate::runs::EXIT_WAITING),
                _ => crate::exit::failed(),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `drivetrain logs RUN [--stage S]`: each stage's latest attempt's log.
pub fn logs(home: &Path, run: Option<&str>, stage: Option<&str>) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(home, &*state, run)?;
    let record = state.run(&id)?;
    let attempts = state.attempts(&id)?;
    if let Some(s) = stage {
        if !attempts.iter().any(|a| a.stage == s)
            && state.map_items(&id, s)?.is_empty()
            && state.trials(&id, s)?.is_empty()
        {
            eprintln!("error: run {id} has no attempts of stage `{s}`");
            return Ok(crate::exit::usage());
        }
    }
    // The pipeline's own store may differ from the default; the run recorded its text.
    let ran = drivetrain_engine::state::sources::pipeline_text(state.as_ref(), &record);
    let pipeline_store = ran.ok().and_then(|src| {
        drivetrain_engine::yaml::parse(&src)
            .ok()
            .and_then(|n| n.get("store").and_then(|s| s.as_str().map(str::to_owned)))
    });
    let artifacts = ArtifactStore::open_project(
        &crate::runs::run_store_url(pipeline_store.as_deref(), &record.project, home)?,
        &record.project,
    )?;
    let mut latest: BTreeMap<&str, u32> = BTreeMap::new();
    for a in &attempts {
        let e = latest.entry(&a.stage).or_default();
        *e = (*e).max(a.attempt);
    }
    let rt = crate::runtime()?;
    let mut out = std::io::stdout().lock();
    // Every stage in the run's order; a map stage's logs are its items'.
    let stages: Vec<String> = match stage {
        Some(s) => vec![s.to_owned()],
        None => state.stages(&id)?.into_iter().map(|s| s.stage.0).collect(),
    };
    for s in &stages {
        let items = state.map_items(&id, s)?;
        for item in items.iter().filter(|i| i.attempts > 0) {
            let key = AttemptKey {
                run: id.0.clone(),
                stage: s.clone(),
                item: Some(item.index),
                attempt: item.attempts,
            };
            writeln!(
                out,
                "── {s}[{}] {} (attempt {}, {}) ──",
                item.index,
                drivetrain_engine::template::value_text(&item.item),
                item.attempts,
                item.phase
            )?;
            copy_log(rt, &artifacts, &key, None, &mut out)?;
        }
        // A search's trials: each one's latest attempt (its last rung).
        for t in state
            .trials(&id, s)?
            .iter()
            .filter(|t| t.trial.attempts > 0)
        {
            let t = &t.trial;
            let key = AttemptKey {
                run: id.0.clone(),
                stage: s.clone(),
                item: Some(t.index),
                attempt: t.attempts,
            };
            let state = t.state.as_str();
            let head = format!("── {s} trial {} (attempt {}, {state}) ──", t.id, t.attempts);
            writeln!(out, "{head}")?;
            copy_log(rt, &artifacts, &key, None, &mut out)?;
        }
        let Some(&attempt) = latest.get(s.as_str()) else {
            continue;
        };
        let key = AttemptKey::of_stage(id.0.clone(), s.clone(), attempt);
        if stage.is_none() {
            writeln!(out, "── {s} (attempt {attempt}) ──")?;
        }
        // Still running: the attempt's local log.
        let live = live_log(&home.join("work"), &id.0, s, attempt);
        copy_log(rt, &artifacts, &key, Some(&live), &mut out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes an attempt's log to `out` a piece at a time (the stored one, else the `live`
/// file), ending it with a newline if it has none.
fn copy_log(
    rt: &tokio::runtime::Runtime,
    artifacts: &ArtifactStore,
    key: &AttemptKey,
    live: Option<&Path>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut last = b'\n';
    match rt.block_on(artifacts.log_from(key, 0))? {
        Some((_, mut pieces)) => {
            while let Some(piece) = rt.block_on(futures::StreamExt::next(&mut pieces)) {
                let piece = piece?;
                if let Some(b) = piece.last() {
                    last = *b;
                }
                out.write_all(&piece)?;
            }
        }
        None => {
            if let Some(mut f) = live.and_then(|p| std::fs::File::open(p).ok()) {
                let mut piece = vec![0u8; 64 << 10];
                loop {
                    let n = std::io::Read::read(&mut f, &mut piece)?;
                    if n == 0 {
                        break;
                    }
                    last = piece[n - 1];
                    out.write_all(&piece[..n])?;
                }
            }
        }
    }
    if last != b'\n' {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// How many trials of a search stage are in each state (none for another stage).
fn trial_counts(
    state: &dyn drivetrain_engine::state::StateStore,
    id: &drivetrain_engine::state::RunId,
    stage: &str,
) -> anyhow::Result<std::collections::BTreeMap<&'static str, usize>> {
    let mut counts = std::collections::BTreeMap::new();
    for t in state.trials(id, stage)? {
        *counts.entry(t.trial.state.as_str()).or_default() += 1;
    }
    Ok(counts)
}
