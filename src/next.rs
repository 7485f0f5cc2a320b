//! What `drivetrain run` says after a run's last line: the model version it promoted with
//! the metrics it was promoted on, and the commands that look further (its stages, the
//! model's lineage, the web view; for a failed run, the failed stage's log and a retry).

use drivetrain_engine::state::{Phase, RunId, StageRecord, StateStore};
use serde_json::Value;

/// The lines to print after `run RUN PHASE`.
pub fn after_run(state: &dyn StateStore, run: &RunId, phase: Phase) -> Vec<String> {
    let stages = state.stages(run).unwrap_or_default();
    let mut lines = Vec::new();
    let promoted = stages.iter().find_map(promoted_version);
    if let (Some(version), Some((stage, metrics))) = (&promoted, stages.iter().find_map(measured)) {
        lines.push(format!("{version} was promoted on {metrics} ({stage})"));
    }
    let mut next = vec![format!("drivetrain status {run}")];
    match phase {
        Phase::Succeeded => {
            if let Some(version) = &promoted {
                next.push(format!("drivetrain lineage {version}"));
            }
        }
        Phase::Failed | Phase::Error => {
            let failed = stages
                .iter()
                .find(|s| matches!(s.phase, Phase::Failed | Phase::Error));
            if let Some(s) = failed {
                next.push(format!("drivetrain logs {run} --stage {}", s.stage));
            }
            next.push(format!("drivetrain retry {run}"));
        }
        Phase::Cancelled => next.push(format!("drivetrain retry {run}")),
        _ => {}
    }
    next.push("drivetrain ui (the web view)".into());
    lines.push(format!("next: {}", next.join(" · ")));
    lines
}

/// `MODEL@VERSION` a stage registered (the `promote` step's values).
fn promoted_version(s: &StageRecord) -> Option<String> {
    let v = &s.values;
    let model = v["model"].as_str()?;
    let version = v["version"].as_u64()?;
    (s.phase == Phase::Succeeded && v["registered"] == true).then(|| format!("{model}@{version}"))
}

/// A stage's measure of the candidate it validated (`metrics.candidate`), as
/// `name value · …`: the numbers at its top, and each slice's `all`.
fn measured(s: &StageRecord) -> Option<(String, String)> {
    let candidate = s.values["metrics"]["candidate"].as_object()?;
    let number = |v: &Value| v.as_f64().map(short);
    let shown: Vec<String> = candidate
        .iter()
        .filter(|(k, _)| k.as_str() != "frames")
        .filter_map(|(k, v)| match v {
            Value::Object(slices) => number(slices.get("all")?).map(|n| format!("{k} {n}")),
            v => number(v).map(|n| format!("{k} {n}")),
        })
        .collect();
    (!shown.is_empty()).then(|| (s.stage.to_string(), shown.join(" · ")))
}

/// A number as people read it, to four significant digits: 0.08625 → `0.08625`,
/// 0.086254 → `0.08625`, 1.0 → `1`.
fn short(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let digits = (3 - x.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let text = format!("{x:.digits$}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_are_short() {
        let shown: Vec<String> = [1.0, 0.086254039, 0.5, 1234.5678, -0.25]
            .into_iter()
            .map(super::short)
            .collect();
        assert_eq!(shown, ["1", "0.08625", "0.5", "1235", "-0.25"]);
    }
}
