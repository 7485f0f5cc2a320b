//! What the engine does for a run whose engine is gone (killed, crashed, a reboot) or
//! failed: stop what it left running and record it as lost, end the run, or take it up
//! again ([`Engine::resume_request`]).

use crate::names::StageName;
use std::collections::BTreeMap;
use std::time::Duration;

use super::{home, Engine, Refusal};
use crate::artifacts::ArtifactRef;
use crate::executor::Executor;
use crate::runner::{CacheMode, Resume, RunRequest};
use crate::state::{Phase, RunId, RunRecord, StateError, StateStore};
use crate::Catalog;

/// Whether process `pid` exists on this machine.
pub fn alive(pid: i64) -> bool {
    i32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .is_some_and(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok())
}

/// The moment before which a heartbeat is a dead engine's (three intervals ago).
pub fn stale_before() -> String {
    let silence = chrono::Duration::from_std(crate::runner::heartbeat_interval() * 3)
        .unwrap_or_else(|_| chrono::Duration::seconds(15));
    (chrono::Utc::now() - silence).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Refuses a run that an engine process of this machine (another than this one) drives.
fn driven_here(record: &RunRecord) -> Result<(), Refusal> {
    let other = record
        .engine_pid
        .filter(|p| alive(*p) && *p != i64::from(std::process::id()));
    match other {
        Some(pid) if !record.phase.is_terminal() => Err(Refusal::Busy(format!(
            "run {} is still running (engine process {pid}); cancel it first",
            record.id
        ))),
        _ => Ok(()),
    }
}

/// What [`reap_lost`] found: how many attempts and items it recorded as lost, and the
/// attempts the executor watches again (stage → attempt number), to be started once more.
#[derive(Debug, Default)]
pub struct Reaped {
    pub lost: usize,
    pub reattach: BTreeMap<StageName, u32>,
}

/// Stops the attempts a dead engine left running and records them as lost, except (when
/// `may_reattach`) those the executor can watch again.
pub async fn reap_lost(
    state: &dyn StateStore,
    executor: &dyn Executor,
    id: &RunId,
    may_reattach: bool,
) -> Result<Reaped, StateError> {
    const LOST: &str = "lost: the engine stopped while it ran";
    let mut reaped = Reaped::default();
    for a in state.attempts(id)? {
        if a.phase != Phase::Running {
            continue;
        }
        // An engine that died between starting the attempt and recording its handle:
        // the executor may find it by its name.
        let handle = match &a.handle {
            Some(h) => Some(h.clone()),
            None => executor.find(&id.0, &a.stage, a.attempt).await,
        };
        if let Some(h) = &handle {
            if may_reattach && executor.reattach(h).await {
                reaped.reattach.insert(a.stage.clone(), a.attempt);
                continue;
            }
        }
        let stopped = match &handle {
            Some(h) => executor.reap(h).await,
            None => false,
        };
        let reason = match stopped {
            true => "lost: the engine stopped while it ran; its processes were stopped",
            false => LOST,
        };
        state.finish_attempt(id, &a.stage, a.attempt, Phase::Error, None, Some(reason))?;
        state.set_stage(id, &a.stage, Phase::Error, None, Some(reason))?;
        reaped.lost += 1;
    }
    // Items of map stages that were running.
    for s in state.stages(id)? {
        if s.phase.is_terminal() {
            continue;
        }
        for item in state.map_items(id, &s.stage)? {
            if item.phase != Phase::Running {
                continue;
            }
            if let Some(h) = &item.handle {
                executor.reap(h).await;
            }
            let empty = serde_json::json!({});
            let end = crate::state::ItemEnd {
                phase: Phase::Error,
                reason: Some(LOST),
                outputs: &empty,
                values: &serde_json::Value::Null,
            };
            state.finish_item(id, &s.stage, item.index, end)?;
            reaped.lost += 1;
        }
        // Trials of a search that were running: stopped; the resumed search runs their
        // rung again from their checkpoints (their record says so already).
        for t in state.trials(id, &s.stage)? {
            if t.trial.state == crate::search::rungs::TrialState::Running {
                if let Some(h) = &t.handle {
                    executor.reap(h).await;
                }
                reaped.lost += 1;
            }
        }
    }
    Ok(reaped)
}

impl Engine {
    /// Ends `record`, a run whose engine stopped: the attempts it left running are
    /// stopped and recorded as lost, then the run ends as `phase` with `reason`.
    pub async fn end_orphan(
        &self,
        record: &RunRecord,
        phase: Phase,
        reason: &str,
    ) -> Result<(), Refusal> {
        let executor = self.executor_named(record.executor.as_deref())?;
        reap_lost(self.state().as_ref(), executor.as_ref(), &record.id, false).await?;
        self.state().finish_run(&record.id, phase, Some(reason))?;
        Ok(())
    }

    /// After the engine failed with `why` while running `id`: gives up the home's reserve
    /// (room to record this on a full disk), then ends the run as `Error` with that reason
    /// (its attempts stopped and recorded as lost), retrying with backoff for a few
    /// seconds.
    pub async fn end_after_failure(&self, id: &RunId, why: &str) {
        home::give_up_reserve(self.work_dir());
        let reason = format!("the engine stopped: {why}");
        let mut wait = Duration::from_millis(100);
        for left in (0..6).rev() {
            let ended = match self.state().run(id) {
                Ok(r) if r.phase.is_terminal() => Ok(()),
                Ok(r) => self.end_orphan(&r, Phase::Error, &reason).await,
                Err(e) => Err(Refusal::from(e)),
            };
            match ended {
                Ok(()) => {
                    eprintln!("run {id} ended as Error: {reason}");
                    return;
                }
                Err(e) if left == 0 => eprintln!("error: cannot record the end of run {id}: {e}"),
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        }
    }

    /// The request that finishes run `id`, whose engine stopped: succeeded stages are not
    /// executed again and keep their artifacts; attempts that were running are stopped,
    /// recorded as lost and run again, or re-attached where the executor can watch them.
    /// The pipeline is read again from the run's file, which must not have changed.
    pub async fn resume_request(
        &self,
        catalog: &Catalog,
        id: &RunId,
    ) -> Result<(RunRequest, Reaped), Refusal> {
        let record = self.state().run(id)?;
        self.take_up(&record)?;
        self.resume_held(catalog, id).await
    }

    /// Takes `record`'s run over for resuming it here, refusing while an engine drives
    /// it: one alive on this machine, or (the state store shared with other machines,
    /// where a pid says nothing) one whose heartbeat is fresh. The take-over is one
    /// conditional update, so of two resumes at once one wins.
    fn take_up(&self, record: &RunRecord) -> Result<(), Refusal> {
        let id = &record.id;
        let state = self.state();
        driven_here(record)?;
        if !matches!(record.phase, Phase::Running | Phase::Pending) {
            return Ok(());
        }
        // On a store of this machine alone, the dead pid said it all.
        let before = if state.shared() {
            stale_before()
        } else {
            (chrono::Utc::now() + chrono::Duration::seconds(1))
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        if state.take_over(id, &before)? {
            return Ok(());
        }
        let silence = humantime::format_duration(crate::runner::heartbeat_interval() * 3);
        Err(Refusal::Busy(format!(
            "run {id} is still running: its engine's heartbeat is fresh (an engine on \
             another machine sharing the state store drives it); wait for it or cancel it, \
             or resume it once its engine has been silent for {silence}"
        )))
    }

    /// [`Engine::resume_request`] for a run the caller has already taken over
    /// ([`crate::state::RunStore::take_over`], as `serve` does for the runs it finds
    /// orphaned) or whose approvals were decided.
    pub async fn resume_held(
        &self,
        catalog: &Catalog,
        id: &RunId,
    ) -> Result<(RunRequest, Reaped), Refusal> {
        let state = self.state().clone();
        let record = state.run(id)?;
        if record.phase == Phase::Succeeded {
            return Err(Refusal::Nothing(format!(
                "run {id} already succeeded; nothing to resume"
            )));
        }
        driven_here(&record)?;
        let pipeline = self.pipeline_of(catalog, &record)?;
        // The executor the run started on (`--executor` may have overridden the pipeline's).
        let executor = self.executor_named(Some(
            record.executor.as_deref().unwrap_or(&pipeline.executor),
        ))?;
        let reaped = reap_lost(state.as_ref(), executor.as_ref(), id, true).await?;
        let mut request = RunRequest::new(
            id.clone(),
            std::sync::Arc::new(pipeline),
            record.file.clone(),
            record.spec_digest.clone(),
        );
        request.params = serde_json::from_value(record.params.clone()).unwrap_or_default();
        request.trigger = record.trigger.clone();
        request.parent = record.parent.clone();
        request.selection = record
            .selection
            .as_ref()
            .map(|s| s.iter().cloned().collect());
        request.overrides = record.overrides.clone();
        // A rerun executes what it selected, whatever the cache holds.
        request.cache = CacheMode {
            read: record.trigger != "rerun",
            write: true,
        };
        request.scheduled_time = record.scheduled_time.clone();
        request.executor = Some(executor);
        request.store = Some(self.run_store(&request.pipeline)?);
        request.resume = Some(resumed(state.as_ref(), record, &reaped.reattach)?);
        Ok((request, reaped))
    }

    /// The pipeline `record` ran, validated again from its file, unchanged since.
    fn pipeline_of(
        &self,
        catalog: &Catalog,
        record: &RunRecord,
    ) -> Result<crate::plan::Pipeline, Refusal> {
        let source = crate::state::sources::pipeline_text(self.state().as_ref(), record)?;
        crate::validate_file(std::path::Path::new(&record.file), &source, catalog)
            .pipeline
            .ok_or_else(|| Refusal::Failed(format!("{} no longer validates", record.file)))
    }
}

/// What a resumed run keeps: its record, the stages that succeeded, the attempt numbers
/// used (a re-attached attempt starts again under its own number).
fn resumed(
    state: &dyn StateStore,
    record: RunRecord,
    reattach: &BTreeMap<StageName, u32>,
) -> Result<Resume, StateError> {
    let id = record.id.clone();
    let mut succeeded = BTreeMap::new();
    for s in state.stages(&id)? {
        if s.phase != Phase::Succeeded {
            continue;
        }
        let outputs: BTreeMap<String, ArtifactRef> =
            serde_json::from_value(s.outputs.clone()).unwrap_or_default();
        succeeded.insert(s.stage.clone(), (outputs, s.values.clone()));
    }
    let mut attempts: BTreeMap<StageName, u32> = BTreeMap::new();
    for a in state.attempts(&id)? {
        let e = attempts.entry(a.stage.clone()).or_default();
        *e = (*e).max(a.attempt);
    }
    // An attempt still running on the executor starts again under its own number: the
    // executor finds it (by its deterministic name) and watches it instead.
    for (stage, attempt) in reattach {
        attempts.insert(stage.clone(), attempt - 1);
    }
    Ok(Resume {
        record,
        succeeded,
        attempts,
        reattached: reattach.keys().cloned().collect(),
    })
}

/// Cancels a run that waits for people (no engine runs it): taken from `Waiting` first,
/// so an approval resuming it at the same moment and this cancel do not both win. False
/// when it was not waiting.
pub fn cancel_waiting(state: &dyn StateStore, id: &RunId) -> Result<bool, StateError> {
    if !state.claim_waiting(id)? {
        return Ok(false);
    }
    let reason = "cancelled while waiting for approval";
    for s in state.stages(id)? {
        if s.phase == Phase::Waiting {
            state.set_stage(id, &s.stage, Phase::Cancelled, None, Some(reason))?;
        }
    }
    state.finish_run(id, Phase::Cancelled, Some(reason))?;
    Ok(true)
}
