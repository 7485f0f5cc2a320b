//! The search's synchronous core: trials and their rungs, which trial runs next (a trial
//! promoted from a rung, one continued or resumed, or a new one), and what a trial's end
//! at a rung means for it. No clock, no process, no store: the runner records each
//! trial this core changes before it acts on the change, and builds the core again from
//! those records on a resume.
//!
//! ASHA (Li et al., "A System for Massively Parallel Hyperparameter Tuning", 2020):
//! rungs of budget `r·η^k`; `promote` (the paper's and Determined's) pauses a trial at a
//! rung, and a free slot goes to a paused trial in the best `1/η` of the highest rung
//! that has one, else to a new trial; `stop` (Ray Tune's `ASHAScheduler`, Determined's
//! `stop_once`) decides when the trial reaches the rung: on at once when its metric is
//! at least the rung's `1 - 1/η` quantile of those recorded there (itself included),
//! else stopped.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{SearchPlan, Variant};

/// Where a trial is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    /// Decided, not yet started.
    Pending,
    Running,
    /// Ended its rung; waits to be promoted or pruned (`promote`).
    Paused,
    /// Decided to go on to its next rung, not yet started there.
    Promoted,
    /// Stopped at a rung: not among the best there.
    Pruned,
    Failed,
    /// Reported nothing for `stale_after`: stopped, counted as failed.
    Stale,
    /// Reached the full budget.
    Succeeded,
}

impl TrialState {
    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Pending => "pending",
            TrialState::Running => "running",
            TrialState::Paused => "paused",
            TrialState::Promoted => "promoted",
            TrialState::Pruned => "pruned",
            TrialState::Failed => "failed",
            TrialState::Stale => "stale",
            TrialState::Succeeded => "succeeded",
        }
    }

    pub fn parse(s: &str) -> Option<TrialState> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }

    /// Whether the trial is decided to run (again) at its rung.
    fn to_run(self) -> bool {
        matches!(
            self,
            TrialState::Pending | TrialState::Promoted | TrialState::Running
        )
    }

    /// A failure of the trial's own (counted against `max_failed_trials`).
    pub fn failed(self) -> bool {
        matches!(self, TrialState::Failed | TrialState::Stale)
    }
}

/// A trial as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub index: usize,
    pub id: String,
    pub params: Map<String, Value>,
    pub state: TrialState,
    /// The rung it runs, ran or is decided to run.
    pub rung: usize,
    /// The search metric it reported at the end of each rung it ended, in order.
    pub metrics: Vec<f64>,
    /// The budget it has reached (the last rung it ended).
    pub used: u64,
    /// Attempts made so far (across its rungs and retries).
    pub attempts: u32,
    /// Why it failed, was pruned or went stale.
    pub reason: Option<String>,
}

impl Trial {
    /// The metric it ended rung `k` with.
    pub fn metric_at(&self, k: usize) -> Option<f64> {
        self.metrics.get(k).copied()
    }

    /// Its last reported metric.
    pub fn metric(&self) -> Option<f64> {
        self.metrics.last().copied()
    }
}

/// How a trial's run at its rung ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Succeeded, reporting this value of the search metric.
    Reported(f64),
    /// Failed (or reported no metric): why.
    Failed(String),
    /// Reported nothing for too long: why.
    Stale(String),
    /// The run is stopping: the trial runs its rung again on a resume.
    Interrupted,
}

/// A search in progress: its plan, rungs and trials.
#[derive(Debug, Clone)]
pub struct Search<'p> {
    plan: &'p SearchPlan,
    rungs: Vec<u64>,
    trials: Vec<Trial>,
    /// Trials decided to run and not yet handed out, in order.
    queue: VecDeque<usize>,
}

impl<'p> Search<'p> {
    /// The search with the trials recorded so far (none on a first try): a trial
    /// recorded as decided or running runs its rung again, first.
    pub fn new(plan: &'p SearchPlan, mut trials: Vec<Trial>) -> Search<'p> {
        trials.sort_by_key(|t| t.index);
        let queue = trials
            .iter()
            .filter(|t| t.state.to_run())
            .map(|t| t.index)
            .collect();
        let rungs = match plan.rungs() {
            r if r.is_empty() => vec![0],
            r => r,
        };
        Search {
            plan,
            rungs,
            trials,
            queue,
        }
    }

    pub fn trials(&self) -> &[Trial] {
        &self.trials
    }

    pub fn trial(&self, index: usize) -> &Trial {
        &self.trials[index]
    }

    /// The budget of rung `k`.
    pub fn budget(&self, k: usize) -> u64 {
        self.rungs[k]
    }

    fn top(&self) -> usize {
        self.rungs.len() - 1
    }

    /// The failed (and stale) trials so far.
    pub fn failures(&self) -> usize {
        self.trials.iter().filter(|t| t.state.failed()).count()
    }

    /// The next trial to run, now decided (`Pending` or `Promoted` at its rung) for the
    /// caller to record before it starts it; none while nothing can run until a running
    /// trial ends, or when the search is done deciding.
    pub fn decide(&mut self) -> Option<usize> {
        if let Some(i) = self.queue.pop_front() {
            return Some(i);
        }
        if self.plan.variant == Variant::Promote {
            if let Some(i) = self.promotable() {
                let t = &mut self.trials[i];
                t.state = TrialState::Promoted;
                t.rung += 1;
                return Some(i);
            }
        }
        if self.trials.len() < self.plan.trials {
            let index = self.trials.len();
            self.trials.push(Trial {
                index,
                id: SearchPlan::trial_id(index),
                params: self.plan.params(index),
                state: TrialState::Pending,
                rung: 0,
                metrics: Vec::new(),
                used: 0,
                attempts: 0,
                reason: None,
            });
            return Some(index);
        }
        None
    }

    /// A paused trial in the best `1/η` of the highest rung that has one.
    fn promotable(&self) -> Option<usize> {
        let eta = self.plan.reduction_factor.max(2) as usize;
        for k in (0..self.top()).rev() {
            let ended = self.ended_at(k);
            let best = ended.len() / eta;
            let found = ended
                .into_iter()
                .take(best)
                .find(|&i| self.trials[i].state == TrialState::Paused && self.trials[i].rung == k);
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// The trials that ended rung `k` (succeeded there, or failed there), best first;
    /// a failed trial counts as the worst.
    fn ended_at(&self, k: usize) -> Vec<usize> {
        let mut ended: Vec<(usize, Option<f64>)> = self
            .trials
            .iter()
            .filter_map(|t| match t.metric_at(k) {
                Some(m) => Some((t.index, Some(m))),
                None if t.state.failed() && t.rung == k => Some((t.index, None)),
                None => None,
            })
            .collect();
        ended.sort_by(|(ia, a), (ib, b)| match (a, b) {
            (Some(a), Some(b)) if self.plan.better(*a, *b) => std::cmp::Ordering::Less,
            (Some(a), Some(b)) if self.plan.better(*b, *a) => std::cmp::Ordering::Greater,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            _ => ia.cmp(ib),
        });
        ended.into_iter().map(|(i, _)| i).collect()
    }

    /// The trial the caller is starting at its rung (one more attempt).
    pub fn started(&mut self, index: usize) {
        let t = &mut self.trials[index];
        t.state = TrialState::Running;
        t.attempts += 1;
    }

    /// The trial's run at its rung was taken from the cache: the attempt it was counted
    /// as starting never ran.
    pub fn taken(&mut self, index: usize) {
        let t = &mut self.trials[index];
        t.attempts = t.attempts.saturating_sub(1);
    }

    /// Adds the attempts a trial's run at its rung made beyond its first (retries).
    pub fn retried(&mut self, index: usize, more: u32) {
        self.trials[index].attempts += more;
    }

    /// A trial's run at its rung ended: what that makes of it.
    pub fn ended(&mut self, index: usize, outcome: Outcome) {
        let top = self.top();
        let rung_budget = self.rungs[self.trials[index].rung];
        let cut = match &outcome {
            Outcome::Reported(m) if self.plan.variant == Variant::Stop => {
                Some(self.below_cut(index, *m))
            }
            _ => None,
        };
        let t = &mut self.trials[index];
        match outcome {
            Outcome::Interrupted => t.state = TrialState::Running,
            Outcome::Failed(why) => {
                t.state = TrialState::Failed;
                t.reason = Some(why);
            }
            Outcome::Stale(why) => {
                t.state = TrialState::Stale;
                t.reason = Some(why);
            }
            Outcome::Reported(m) => {
                t.metrics.truncate(t.rung);
                t.metrics.push(m);
                t.used = rung_budget;
                t.state = match (t.rung == top, cut) {
                    (true, _) => TrialState::Succeeded,
                    (false, None) => TrialState::Paused,
                    (false, Some(Some(why))) => {
                        t.reason = Some(why);
                        TrialState::Pruned
                    }
                    (false, Some(None)) => {
                        t.rung += 1;
                        self.queue.push_back(index);
                        TrialState::Promoted
                    }
                };
            }
        }
    }

    /// `stop`: why a trial reporting `m` at its rung is below the rung's cut (the
    /// `1 - 1/η` quantile of the metrics recorded there, itself included, interpolated
    /// linearly as numpy's), or none when it goes on.
    fn below_cut(&self, index: usize, m: f64) -> Option<String> {
        let k = self.trials[index].rung;
        let sign = match self.plan.better(1.0, 0.0) {
            true => 1.0,
            false => -1.0,
        };
        let mut seen: Vec<f64> = self
            .trials
            .iter()
            .filter(|t| t.index != index)
            .filter_map(|t| t.metric_at(k))
            .chain([m])
            .map(|v| v * sign)
            .collect();
        seen.sort_by(f64::total_cmp);
        let q = 1.0 - 1.0 / f64::from(self.plan.reduction_factor.max(2));
        let pos = q * (seen.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        let cut = seen[lo] + (seen[hi] - seen[lo]) * (pos - lo as f64);
        (m * sign < cut).then(|| {
            format!(
                "stopped at rung {k} ({} {}): {} {m} is below the rung's cut {} of {} trials",
                self.rungs[k],
                self.unit(),
                self.plan.metric,
                cut * sign,
                seen.len()
            )
        })
    }

    fn unit(&self) -> &str {
        self.plan.budget.as_ref().map_or("", |b| b.unit.as_str())
    }

    /// The search has decided everything (nothing left to run or start): the trials
    /// still paused are pruned. Returns those it pruned.
    pub fn finish(&mut self) -> Vec<usize> {
        let mut pruned = Vec::new();
        let unit = self.unit().to_owned();
        for t in &mut self.trials {
            if t.state == TrialState::Paused {
                t.state = TrialState::Pruned;
                t.reason = Some(format!(
                    "paused at rung {} ({} {unit}), never among the best to promote",
                    t.rung, self.rungs[t.rung]
                ));
                pruned.push(t.index);
            }
        }
        pruned
    }

    /// The best trial that reached the full budget.
    pub fn best(&self) -> Option<&Trial> {
        self.trials
            .iter()
            .filter(|t| t.state == TrialState::Succeeded)
            .filter_map(|t| Some((t, t.metric()?)))
            .reduce(|a, b| match self.plan.better(b.1, a.1) {
                true => b,
                false => a,
            })
            .map(|(t, _)| t)
    }
}

#[cfg(test)]
mod tests;
