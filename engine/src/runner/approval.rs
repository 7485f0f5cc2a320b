//! An approval stage: it asks people (a request in the state store, with the evidence of
//! its upstream stages) and settles from what they decided. Undecided, the stage is
//! `Waiting` and its dependants do not start; the run ends `Waiting` once nothing else
//! can run, holding no process, and is resumed when the approval is decided
//! (`drivetrain approve`, the API, a timeout).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::dag::StageResult;
use super::{Ctx, RunError, RunEvent};
use crate::plan::{Action, Stage, StageId};
use crate::state::{ApprovalRequest, Phase};

/// What the upstream stages left, as shown with the request: each one's values, its
/// outputs (digest and location) and where its lineage starts (`RUN/STAGE`).
fn evidence(ctx: &Ctx, upstream: &BTreeMap<StageId, StageResult>) -> Value {
    let stages: serde_json::Map<String, Value> = upstream
        .iter()
        .map(|(id, r)| {
            let name = ctx.pipeline.stage(*id).name.clone();
            let entry = json!({
                "phase": r.phase.as_str(),
                "values": r.values,
                "outputs": r.outputs,
                "lineage": format!("{}/{name}", ctx.run.id),
            });
            (name.to_string(), entry)
        })
        .collect();
    json!({ "stages": stages })
}

/// Asks (once) and settles: `Succeeded` with who approved in its values, `Failed` when
/// rejected, `Waiting` while undecided.
pub(super) fn settle(
    ctx: &Ctx,
    stage: &Stage,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<StageResult, RunError> {
    let Action::Approval {
        role,
        min,
        timeout,
        on_timeout,
    } = &stage.action
    else {
        unreachable!("settle is called for approval stages");
    };
    let now = chrono::Utc::now();
    let at =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let request = ApprovalRequest {
        run: ctx.run.id.clone(),
        stage: stage.name.to_string(),
        pipeline: ctx.pipeline.name.clone(),
        project: ctx.run.project.clone(),
        role: role.clone(),
        min: *min,
        requested_at: at(now),
        timeout_at: timeout
            .and_then(|d| chrono::Duration::from_std(d).ok())
            .map(|d| at(now + d)),
        on_timeout: on_timeout.as_str().into(),
        evidence: evidence(ctx, upstream),
    };
    let mut record = ctx.state.request_approval(&request)?;
    // A timeout that passed while no server watched decides now.
    if record.outcome.is_none() && record.request.timeout_at.as_deref() < Some(&at(now)) {
        ctx.state.expire_approvals(&at(now))?;
        record = ctx
            .state
            .approval(&ctx.run.id, &stage.name)?
            .unwrap_or(record);
    }
    let run = &ctx.run.id;
    let (phase, reason, values) = match record.outcome.as_deref() {
        None => {
            let yes = record.votes.len();
            let until = match &record.request.timeout_at {
                Some(t) => format!(", until {t} (then {})", record.request.on_timeout),
                None => String::new(),
            };
            let reason = format!(
                "waiting for {min} approval(s) by role `{role}` ({yes} so far{until}): \
                 drivetrain approve {run} {}",
                stage.name
            );
            ctx.state
                .set_stage(run, &stage.name, Phase::Waiting, None, Some(&reason))?;
            (Phase::Waiting, reason, Value::Null)
        }
        Some(outcome) => {
            let approved = outcome == "approved";
            let by = record.approvers();
            let reason = record.reason.clone().unwrap_or_else(|| outcome.to_owned());
            let values = json!({
                "approved": approved,
                "outcome": outcome,
                "by": by,
                "reason": reason,
            });
            let phase = if approved {
                Phase::Succeeded
            } else {
                Phase::Failed
            };
            ctx.state
                .set_stage_results(run, &stage.name, &json!({}), &values)?;
            ctx.state
                .set_stage(run, &stage.name, phase, None, Some(&reason))?;
            (phase, reason, values)
        }
    };
    let _ = ctx.events.send(RunEvent::Finished {
        stage: stage.name.clone(),
        phase,
        origin: None,
        reason: Some(reason),
        elapsed: std::time::Duration::ZERO,
    });
    Ok(StageResult {
        phase,
        outputs: BTreeMap::new(),
        values,
    })
}

/// The approvals that passed among the stages `stage` depends on (transitively): each
/// `{stage, role, by, reason}`.
pub(super) fn passed_upstream(ctx: &Ctx, stage: &Stage) -> Result<Vec<Value>, RunError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = ctx.pipeline.upstream(stage.id);
    let mut passed = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        todo.extend(ctx.pipeline.upstream(id));
        let up = ctx.pipeline.stage(id);
        if !matches!(up.action, Action::Approval { .. }) {
            continue;
        }
        if let Some(a) = ctx.state.approval(&ctx.run.id, &up.name)? {
            if a.outcome.as_deref() == Some("approved") {
                passed.push(json!({
                    "stage": up.name,
                    "role": a.request.role,
                    "by": a.approvers(),
                    "reason": a.reason,
                }));
            }
        }
    }
    Ok(passed)
}

/// Why a stage that writes the registry may not start: the alias it moves (its `alias`)
/// is protected (`drivetrain registry protect`) and no approval by the alias's role passed
/// upstream of it in this run.
pub(super) fn guard(
    ctx: &Ctx,
    stage: &Stage,
    alias: Option<String>,
) -> Result<Option<String>, RunError> {
    let Some(alias) = alias else {
        return Ok(None);
    };
    let protected = ctx.state.protected_aliases()?;
    let Some(role) = protected.get(&alias) else {
        return Ok(None);
    };
    let passed = passed_upstream(ctx, stage)?;
    if passed.iter().any(|p| p["role"] == role.as_str()) {
        return Ok(None);
    }
    Ok(Some(format!(
        "alias `{alias}` is protected: it moves only through a run whose approval by role \
         `{role}` passed upstream of the stage that moves it (give `{}` an upstream \
         `approval:` with `approvers: {{role: {role}}}`), or by a person with that role",
        stage.name
    )))
}
