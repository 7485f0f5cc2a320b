//! Searches seen from the command line: a search stage's trials (`trials`), its rungs
//! before a run (`search preview`), what a trial reports (`report`), and runs side by
//! side (`compare`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use serde_json::{json, Value};

use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::search::report::TrialRow;
use drivetrain_engine::search::{Goal, SearchPlan};
use drivetrain_engine::state::StateStore;
use drivetrain_engine::Catalog;

use crate::output::Format;
use crate::runs::{open_state, resolve_run};

/// `drivetrain trials RUN STAGE`: every trial of the stage's search.
pub fn trials(
    catalog: &Catalog,
    home: &Path,
    run: &str,
    stage: &str,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let id = resolve_run(home, &*state, Some(run))?;
    let record = state.run(&id)?;
    let plan = search_of(catalog, &*state, &record, stage)?;
    let stored = state.trials(&id, stage)?;
    let metrics = state.metrics(&id, stage)?;
    let rows = drivetrain_engine::search::report::rows(&plan, &stored, &metrics);
    let doc = json!({
        "run": id.0,
        "stage": stage,
        "metric": plan.metric,
        "goal": plan.goal,
        "trials": rows,
    });
    out.print(&doc, |doc| print_trials(doc, &plan, &rows))?;
    Ok(ExitCode::SUCCESS)
}

/// The search of `stage` in the pipeline the run ran (its kept text).
fn search_of(
    catalog: &Catalog,
    state: &dyn StateStore,
    record: &drivetrain_engine::state::RunRecord,
    stage: &str,
) -> anyhow::Result<SearchPlan> {
    let source = drivetrain_engine::state::sources::pipeline_text(state, record)?;
    let pipeline = drivetrain_engine::validate_file(Path::new(&record.file), &source, catalog)
        .pipeline
        .with_context(|| format!("the pipeline of run {} no longer validates", record.id))?;
    let Some(s) = pipeline.stage_by_name(stage) else {
        let names: Vec<&str> = pipeline.stages.iter().map(|s| s.name.as_str()).collect();
        anyhow::bail!(
            "run {} has no stage `{stage}` (it has {})",
            record.id,
            names.join(", ")
        );
    };
    s.search
        .clone()
        .with_context(|| format!("stage `{stage}` has no `search`"))
}

fn print_trials(doc: &Value, plan: &SearchPlan, rows: &[TrialRow]) {
    let goal = match plan.goal {
        Goal::Minimize => "lower is better",
        Goal::Maximize => "higher is better",
    };
    let (run, stage) = (doc["run"].as_str(), doc["stage"].as_str());
    say!(
        "{}  {}  ({}, {goal})",
        run.unwrap_or(""),
        stage.unwrap_or(""),
        plan.metric
    );
    say!(
        "{:<6} {:<10} {:>4} {:>6} {:>12}  PARAMS",
        "TRIAL",
        "STATE",
        "RUNG",
        "STEPS",
        "METRIC"
    );
    for t in rows {
        let metric = t.metric.map_or("-".to_owned(), |m| format!("{m:.6}"));
        let params: Vec<String> = t
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", short(v)))
            .collect();
        say!(
            "{:<6} {:<10} {:>4} {:>6} {:>12}  {}",
            t.id,
            t.state,
            t.rung,
            t.steps,
            metric,
            params.join(" ")
        );
    }
}

/// A param's value, short: numbers to 4 significant digits.
fn short(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if v.is_f64() => format!("{x:.4e}"),
        _ => drivetrain_engine::template::value_text(v),
    }
}

/// `drivetrain search preview FILE --stage S`.
pub fn preview(pipeline: &Pipeline, stage: &str, out: Format) -> anyhow::Result<ExitCode> {
    let Some(s) = pipeline.stage_by_name(stage) else {
        anyhow::bail!("the pipeline has no stage `{stage}`");
    };
    let plan = s
        .search
        .as_ref()
        .with_context(|| format!("stage `{stage}` has no `search`"))?;
    let rows = plan.preview();
    let used: u64 = rows.iter().map(|r| r.budget_used).sum();
    let max = plan.budget.as_ref().map_or(0, |b| b.max);
    let full = plan.trials as u64 * max;
    let doc = json!({
        "stage": stage,
        "method": plan.method,
        "variant": plan.variant,
        "trials": plan.trials,
        "unit": plan.budget.as_ref().map(|b| b.unit.clone()),
        "rungs": rows,
        "budget_used": used,
        "every_trial_to_the_full_budget": full,
    });
    out.print(&doc, |doc| {
        let unit = doc["unit"].as_str().unwrap_or("steps");
        say!(
            "{:>4} {:>10} {:>8} {:>12}",
            "RUNG",
            "BUDGET",
            "TRIALS",
            "USED"
        );
        for r in &rows {
            say!(
                "{:>4} {:>10} {:>8} {:>12}",
                r.rung,
                r.budget,
                r.trials,
                r.budget_used
            );
        }
        let share = match full {
            0 => String::new(),
            f => format!(" ({:.0} % of", 100.0 * used as f64 / f as f64),
        };
        say!("total: {used} {unit}{share} {full} for every trial to {max})");
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `drivetrain report [--step N] NAME=VALUE…`: one line appended to `$DRIVETRAIN_METRICS`
/// in one write (lines of trials writing at once never interleave).
pub fn report(step: Option<i64>, values: &[String]) -> anyhow::Result<ExitCode> {
    let path = std::env::var_os("DRIVETRAIN_METRICS").context(
        "DRIVETRAIN_METRICS is not set: `drivetrain report` runs inside a trial of a search",
    )?;
    let mut pairs = Vec::new();
    for v in values {
        let (name, value) = v
            .split_once('=')
            .with_context(|| format!("`{v}` is not NAME=VALUE"))?;
        let x: f64 = value
            .trim()
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite())
            .with_context(|| format!("`{v}`: `{value}` is not a finite number"))?;
        pairs.push((name.trim().to_owned(), x));
    }
    let mut line = drivetrain_engine::search::lines::line(step, &pairs);
    line.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", Path::new(&path).display()))?;
    f.write_all(line.as_bytes())
        .with_context(|| format!("cannot append to {}", Path::new(&path).display()))?;
    Ok(ExitCode::SUCCESS)
}

/// `drivetrain compare RUN RUN…`: rows of what each run had (`params.X`,
/// `STAGE.values.KEY`, `STAGE.phase`), only those that differ unless `all`.
pub fn compare(home: &Path, runs: &[String], all: bool, out: Format) -> anyhow::Result<ExitCode> {
    let state = open_state(home)?;
    let mut ids = Vec::new();
    let mut columns: Vec<BTreeMap<String, Value>> = Vec::new();
    for r in runs {
        let id = resolve_run(home, &*state, Some(r))?;
        let record = state.run(&id)?;
        let mut col = BTreeMap::new();
        col.insert("pipeline".to_owned(), json!(record.pipeline));
        col.insert("phase".to_owned(), json!(record.phase.as_str()));
        for (k, v) in record.params.as_object().into_iter().flatten() {
            col.insert(format!("params.{k}"), v.clone());
        }
        let stages = state.stages(&id)?;
        // The code it ran: its pipeline folder's commit, as its stages recorded it.
        if let Some(code) = stages
            .iter()
            .find_map(|s| s.how.provenance.get("code").filter(|c| !c.is_null()))
        {
            flatten("code", code, &mut col);
        }
        for s in stages {
            col.insert(format!("{}.phase", s.stage), json!(s.phase.as_str()));
            // The digest of each file its command named.
            let components = s
                .how
                .provenance
                .get("components")
                .and_then(Value::as_object);
            for (k, v) in components
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.starts_with("file:"))
            {
                col.insert(format!("{}.{k}", s.stage), v.clone());
            }
            flatten(&format!("{}.values", s.stage), &s.values, &mut col);
        }
        ids.push(id.0);
        columns.push(col);
    }
    let keys: std::collections::BTreeSet<&String> = columns.iter().flat_map(|c| c.keys()).collect();
    let mut rows = Vec::new();
    for k in keys {
        let cells: Vec<Value> = columns
            .iter()
            .map(|c| c.get(k).cloned().unwrap_or(Value::Null))
            .collect();
        if all || cells.iter().any(|c| c != &cells[0]) {
            rows.push(json!({"key": k, "values": cells}));
        }
    }
    let doc = json!({"runs": ids, "rows": rows, "all": all});
    out.print(&doc, |doc| {
        let width = 24;
        let mut head = format!("{:<40}", "");
        for id in doc["runs"].as_array().into_iter().flatten() {
            head.push_str(&format!(" {:<width$}", id.as_str().unwrap_or("")));
        }
        say!("{}", head.trim_end());
        for r in doc["rows"].as_array().into_iter().flatten() {
            let mut line = format!("{:<40}", r["key"].as_str().unwrap_or(""));
            for v in r["values"].as_array().into_iter().flatten() {
                let text = match v {
                    Value::Null => "-".to_owned(),
                    v => drivetrain_engine::template::value_text(v),
                };
                line.push_str(&format!(" {:<width$}", clip(&text, width)));
            }
            say!("{}", line.trim_end());
        }
        if doc["rows"].as_array().is_some_and(Vec::is_empty) {
            say!("(the runs differ in nothing compared; `--all` shows every row)");
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `v`'s leaves as `prefix.KEY…` rows (a list is one row; at most 4 levels deep).
fn flatten(prefix: &str, v: &Value, into: &mut BTreeMap<String, Value>) {
    fn walk(prefix: String, v: &Value, depth: usize, into: &mut BTreeMap<String, Value>) {
        match v {
            Value::Object(o) if depth < 4 && !o.is_empty() => {
                for (k, inner) in o {
                    if k != "series" {
                        walk(format!("{prefix}.{k}"), inner, depth + 1, into);
                    }
                }
            }
            Value::Object(o) if o.is_empty() => {}
            other => {
                into.insert(prefix, other.clone());
            }
        }
    }
    walk(prefix.to_owned(), v, 0, into);
}

fn clip(s: &str, width: usize) -> String {
    match s.chars().count() > width {
        true => format!("{}…", s.chars().take(width - 1).collect::<String>()),
        false => s.to_owned(),
    }
}
