//! `serve`'s notifications: runs whose start or end has not been weighed get their
//! notifications put in the outbox (with the note that they were weighed, in one
//! transaction), and due notifications are delivered, retried with backoff, and
//! dead-lettered after [`notify::MAX_ATTEMPTS`].
//!
//! The outbox is filled from the runs table, not from the engine's events, so a run
//! ended by anything (its engine, a resume that found it lost, `cancel` from another
//! process, a server killed and restarted) is told of all the same.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use drivetrain_engine::events::{notify, NotifyEvent};
use drivetrain_engine::state::{OutboxItem, Phase, RunRecord};

use crate::server::Server;

/// Deliveries at once.
const DELIVERIES: usize = 8;

impl Server {
    /// Weighs runs and delivers notifications every half second until the server stops.
    pub(crate) async fn notify_loop(self: Arc<Self>) {
        drivetrain_engine::cloud::install_crypto();
        let http = match reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
        {
            Ok(h) => h,
            Err(e) => {
                eprintln!("notifications: {e}");
                return;
            }
        };
        let source = format!(
            "drivetrain://{}",
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into())
        );
        while !self.stopping.load(Ordering::SeqCst) {
            let me = self.clone();
            let src = source.clone();
            match tokio::task::spawn_blocking(move || {
                me.weigh_runs(&src)?;
                me.missed_deadlines(&src)
            })
            .await
            {
                Ok(Err(e)) => eprintln!("notifications: {e:#}"),
                Err(e) => eprintln!("notifications: {e}"),
                Ok(Ok(())) => {}
            }
            if let Err(e) = self.deliver_due(&http).await {
                eprintln!("notifications: {e:#}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Puts the notifications of runs not yet weighed in the outbox.
    fn weigh_runs(&self, source: &str) -> anyhow::Result<()> {
        let state = self.engine.state();
        let mut runs = state.unnotified_runs(500)?;
        runs.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        for run in runs {
            let items = self.notifications_of(&run, source);
            state.enqueue_notifications(&run.id, run.phase.as_str(), &items)?;
        }
        Ok(())
    }

    /// Puts in the outbox the missed deadlines of running runs (and their running
    /// stages) of the served pipelines that have one; each once, by its id.
    fn missed_deadlines(&self, source: &str) -> anyhow::Result<()> {
        let state = self.engine.state();
        let now = chrono::Utc::now();
        let passed = |since: Option<&str>, d: Duration| {
            since
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .and_then(|t| chrono::Duration::from_std(d).ok().map(|d| t + d))
                .is_some_and(|due| due <= now)
        };
        let loaded: Vec<_> = self.loaded().values().cloned().collect();
        for l in loaded {
            let p = &l.pipeline;
            let staged = p.stages.iter().any(|s| s.deadline.is_some());
            if p.deadline.is_none() && !staged {
                continue;
            }
            let sinks = self.sinks_of(&p.name, &p.project);
            if sinks.is_empty() {
                continue;
            }
            // The runs of this pipeline in its project: a run of another project under
            // the same name is not told to this pipeline's sinks.
            let filter = drivetrain_engine::state::RunFilter {
                pipeline: Some(p.name.clone()),
                phase: Some(drivetrain_engine::state::Phase::Running),
                projects: Some(vec![p.project.clone()]),
                ..Default::default()
            };
            for run in state.find_runs(&filter, 500)? {
                let mut items = Vec::new();
                if let Some(d) = p.deadline.filter(|d| passed(Some(&run.created_at), *d)) {
                    let mut made = notify::deadline_items(&run, None, d, &sinks, source);
                    self.details_of(&run, None).add_to(&mut made);
                    items.extend(made);
                }
                if staged {
                    for st in state.stages(&run.id)? {
                        let Some(d) = p.stage_by_name(&st.stage).and_then(|s| s.deadline) else {
                            continue;
                        };
                        if st.phase == drivetrain_engine::state::Phase::Running
                            && passed(st.started_at.as_deref(), d)
                        {
                            let stage = Some(st.stage.as_str());
                            let mut made = notify::deadline_items(&run, stage, d, &sinks, source);
                            self.details_of(&run, stage).add_to(&mut made);
                            items.extend(made);
                        }
                    }
                }
                if !items.is_empty() {
                    state.add_notifications(&items)?;
                }
            }
        }
        Ok(())
    }

    /// A run's notifications for the sinks of its pipeline: its start, and its end once
    /// it has ended (a start already enqueued is kept: the outbox's ids are unique).
    fn notifications_of(&self, run: &RunRecord, source: &str) -> Vec<OutboxItem> {
        let sinks = self.sinks_of(&run.pipeline, &run.project);
        if sinks.is_empty() {
            return Vec::new();
        }
        let mut events = vec![NotifyEvent::Started];
        if run.phase.is_terminal() || run.phase == Phase::Waiting {
            events.extend(NotifyEvent::of_phase(run.phase));
        }
        let mut items = notify::outbox_items(run, &events, &sinks, source);
        self.details_of(run, None).add_to(&mut items);
        items
    }

    /// The link to `run` (or its `stage`) in the web view, and, for a run that failed,
    /// each stage that failed with its reason.
    fn details_of(&self, run: &RunRecord, stage: Option<&str>) -> notify::Details {
        let at = stage.map(|s| format!("/{s}")).unwrap_or_default();
        let failed = match run.phase {
            Phase::Failed | Phase::Error => self.engine.state().stages(&run.id).unwrap_or_default(),
            _ => Vec::new(),
        };
        notify::Details {
            url: Some(format!("{}/#/runs/{}{at}", self.public_url, run.id)),
            failed_stages: failed
                .into_iter()
                .filter(|st| matches!(st.phase, Phase::Failed | Phase::Error))
                .map(|st| {
                    let reason = st.reason.as_deref().unwrap_or("(no reason recorded)");
                    (st.stage.to_string(), notify::Details::reason(reason))
                })
                .collect(),
        }
    }

    /// The sinks a run of `pipeline` in `project` is told to: the pipeline's own (when
    /// this server serves it in that project) and the server's `--notify` ones.
    fn sinks_of(&self, pipeline: &str, project: &str) -> Vec<drivetrain_engine::events::Sink> {
        let mut sinks = self
            .loaded()
            .get(pipeline)
            .filter(|l| l.pipeline.project == project)
            .map(|l| l.pipeline.notify.clone())
            .unwrap_or_default();
        sinks.extend(self.default_sinks.iter().cloned());
        sinks
    }

    /// Delivers the notifications that are due, [`DELIVERIES`] at once.
    async fn deliver_due(&self, http: &reqwest::Client) -> anyhow::Result<()> {
        let state = self.engine.state().clone();
        let now = drivetrain_engine::state::now();
        let due = tokio::task::spawn_blocking(move || state.due_notifications(&now, 64)).await??;
        let outcomes = futures::future::join_all(due.chunks(DELIVERIES).map(|chunk| async move {
            let mut out = Vec::new();
            for item in chunk {
                out.push((item, notify::deliver(item, http).await));
            }
            out
        }))
        .await;
        let state = self.engine.state().clone();
        let outcomes: Vec<(String, u32, Result<(), String>)> = outcomes
            .into_iter()
            .flatten()
            .map(|(i, r)| (i.id.clone(), i.attempts, r.map_err(|e| e.to_string())))
            .collect();
        tokio::task::spawn_blocking(move || {
            for (id, attempts, r) in outcomes {
                let done = match r {
                    Ok(()) => state.notification_outcome(&id, None, None),
                    Err(e) if attempts + 1 >= notify::MAX_ATTEMPTS => {
                        eprintln!(
                            "notification {id}: dead after {} attempts: {e}",
                            attempts + 1
                        );
                        state.notification_outcome(&id, Some(&e), None)
                    }
                    Err(e) => {
                        let at = chrono::Utc::now()
                            + chrono::Duration::from_std(notify::backoff(attempts + 1))
                                .unwrap_or_default();
                        let at = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
                        state.notification_outcome(&id, Some(&e), Some(&at))
                    }
                };
                if let Err(e) = done {
                    eprintln!("notification {id}: cannot record its delivery: {e}");
                }
            }
        })
        .await?;
        Ok(())
    }
}
