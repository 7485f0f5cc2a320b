//! One batched poll per cluster: every attempt waiting on a job registers its job id; a
//! single task asks `squeue` about all of them at once each interval (`-t all`: ended jobs
//! too, while the controller keeps them), then `sacct` about those the controller no
//! longer knows, and hands each waiter its job's state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drivetrain_engine::executor::AttemptOutcome;
use tokio::sync::watch;

use super::cli::Cli;

/// What Slurm says about one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    /// `PENDING`, `RUNNING`, `COMPLETED`, `FAILED`, … (`GONE`: Slurm knows it no more).
    pub state: String,
    /// Why it is pending, or how it ended (`Resources`, `NonZeroExitCode`, …).
    pub reason: String,
    /// The exit code and the signal that ended the batch script, once it has ended.
    pub exit_code: i32,
    pub signal: i32,
}

impl JobStatus {
    pub fn gone() -> JobStatus {
        JobStatus {
            state: "GONE".into(),
            reason: String::new(),
            exit_code: 0,
            signal: 0,
        }
    }

    /// Whether the job has ended (any state but pending, running and the like).
    pub fn ended(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "PENDING"
                | "RUNNING"
                | "CONFIGURING"
                | "COMPLETING"
                | "SUSPENDED"
                | "REQUEUED"
                | "REQUEUE_FED"
                | "REQUEUE_HOLD"
                | "RESIZING"
                | "SIGNALING"
                | "STAGE_OUT"
                | "STOPPED"
                | "RESV_DEL_HOLD"
        )
    }

    /// Why Slurm will never start this pending job, if that is what its reason says:
    /// a request beyond what the partition, account or QoS allows.
    pub fn never_runs(&self) -> Option<&'static str> {
        if self.state != "PENDING" {
            return None;
        }
        Some(match self.reason.as_str() {
            "PartitionConfig" => "it asks for more than the partition's nodes have",
            "PartitionNodeLimit" => "it asks for more nodes than the partition allows",
            "PartitionTimeLimit" => "its time limit is beyond the partition's",
            "BadConstraints" => "no node satisfies its constraints",
            "InvalidAccount" => "its account is not valid",
            "InvalidQOS" => "its QoS is not valid",
            "DependencyNeverSatisfied" => "its dependency can never be satisfied",
            _ => return None,
        })
    }

    /// How the attempt ended, in the run loop's terms; `argv0` names a command that was
    /// not found, `log_tail` is the end of the job's output (Slurm's own poll-based memory
    /// enforcement says so there).
    pub fn outcome(&self, job: &str, argv0: &str, log_tail: &str) -> AttemptOutcome {
        let exceeded_memory = log_tail.contains("Exceeded job memory limit")
            || log_tail.contains("exceeded memory limit");
        match self.state.as_str() {
            "COMPLETED" => AttemptOutcome::Succeeded,
            "OUT_OF_MEMORY" => AttemptOutcome::OutOfMemory {
                reason: format!("out of memory: Slurm job {job} exceeded its memory (`--mem`)"),
            },
            _ if exceeded_memory => AttemptOutcome::OutOfMemory {
                reason: format!(
                    "out of memory: Slurm killed job {job} for exceeding its memory (`--mem`)"
                ),
            },
            "CANCELLED" => AttemptOutcome::Cancelled,
            "TIMEOUT" | "DEADLINE" => AttemptOutcome::TimedOut {
                reason: format!("Slurm job {job} ran past its time limit ({})", self.state),
            },
            "PREEMPTED" => AttemptOutcome::Preempted {
                reason: format!(
                    "preempted by the cluster: Slurm job {job} ended PREEMPTED (a job of a higher QoS took its place); it is submitted again and resumes from its checkpoints"
                ),
            },
            "NODE_FAIL" | "BOOT_FAIL" | "GONE" => AttemptOutcome::Lost {
                reason: match self.state.as_str() {
                    "GONE" => format!("lost: Slurm no longer knows job {job}"),
                    s => format!("lost: Slurm job {job} ended {s} ({})", self.reason),
                },
            },
            _ if self.exit_code == 127 => AttemptOutcome::Failed {
                exit_code: Some(127),
                reason: format!("command `{argv0}` not found (Slurm job {job})"),
            },
            state => {
                let (code, how) = match (self.exit_code, self.signal) {
                    (_, s) if s > 0 => (128 + s, format!("killed by signal {s}")),
                    (c, _) => (c, format!("exit code {c}")),
                };
                AttemptOutcome::Failed {
                    exit_code: Some(code),
                    reason: format!("Slurm job {job} ended {state}: {how} ({})", self.reason),
                }
            }
        }
    }
}

/// `squeue`'s wait status (`exit_code`, as `wait(2)` gives it) as (code, signal).
fn wait_status(raw: i32) -> (i32, i32) {
    match raw & 0x7f {
        0 => ((raw >> 8) & 0xff, 0),
        s => (0, s),
    }
}

/// `CODE:SIGNAL`, as `sacct` and `scontrol` print an exit code.
fn exit_pair(text: &str) -> (i32, i32) {
    let mut parts = text.split(':');
    let n = |p: Option<&str>| p.and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    (n(parts.next()), n(parts.next()))
}

/// The `squeue` format the poll reads: id, state, exit status, reason (last: free text).
pub const SQUEUE_FORMAT: &str = "JobArrayID:0|,State:0|,exit_code:0|,Reason:0";

/// The `sacct` format the poll reads (`JobID`: `123_4` for an array's task, as `squeue`).
pub const SACCT_FORMAT: &str = "JobID,State,ExitCode,Reason";

/// Parses `squeue -h -O SQUEUE_FORMAT` output into job id → status.
pub fn parse_squeue(text: &str) -> HashMap<String, JobStatus> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(4, '|');
            let id = f.next()?.trim().to_owned();
            let state = f.next()?.trim().to_owned();
            let raw: i32 = f.next()?.trim().parse().unwrap_or(0);
            let reason = f.next().unwrap_or("").trim().to_owned();
            let (exit_code, signal) = wait_status(raw);
            (!id.is_empty()).then_some((
                id,
                JobStatus {
                    state,
                    reason,
                    exit_code,
                    signal,
                },
            ))
        })
        .collect()
}

/// Parses `sacct -n -P -X -o JobID,State,ExitCode,Reason` into job id → status (a
/// state like `CANCELLED by 0` keeps its first word).
pub fn parse_sacct(text: &str) -> HashMap<String, JobStatus> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let (exit_code, signal) = exit_pair(f.get(2)?);
            Some((
                f.first()?.trim().to_owned(),
                JobStatus {
                    state: f.get(1)?.split_whitespace().next()?.to_owned(),
                    reason: f.get(3).unwrap_or(&"").trim().to_owned(),
                    exit_code,
                    signal,
                },
            ))
        })
        .collect()
}

type Waiters = HashMap<String, watch::Sender<Option<JobStatus>>>;

/// The cluster's poller: waiters register a job id and watch its status.
#[derive(Debug)]
pub struct Poller {
    cli: Arc<Cli>,
    every: Duration,
    jobs: Arc<Mutex<Waiters>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Poller {
    pub fn new(cli: Arc<Cli>, every: Duration) -> Poller {
        Poller {
            cli,
            every,
            jobs: Arc::default(),
            task: Mutex::new(None),
        }
    }

    /// The status of job `id` as the polls see it (`None` until the first poll).
    pub fn watch(&self, id: &str) -> watch::Receiver<Option<JobStatus>> {
        let rx = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            match jobs.get(id) {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    jobs.insert(id.to_owned(), tx);
                    rx
                }
            }
        };
        // The polling task lives on the runtime of the attempts that wait; one whose
        // runtime has gone (a finished run's) is started again.
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            let (cli, jobs, every) = (self.cli.clone(), self.jobs.clone(), self.every);
            *task = Some(tokio::spawn(poll_loop(cli, jobs, every)));
        }
        rx
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

async fn poll_loop(cli: Arc<Cli>, jobs: Arc<Mutex<Waiters>>, every: Duration) {
    loop {
        let ids: Vec<String> = {
            let mut jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
            // Nobody waits on an ended job any more: forget it.
            jobs.retain(|_, tx| tx.receiver_count() > 0);
            jobs.keys().cloned().collect()
        };
        if !ids.is_empty() {
            if let Some(found) = poll_once(&cli, &ids).await {
                let jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
                for (id, status) in found {
                    if let Some(tx) = jobs.get(&id) {
                        tx.send_if_modified(|s| {
                            let changed = s.as_ref() != Some(&status);
                            *s = Some(status);
                            changed
                        });
                    }
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Every job's status, `GONE` for those neither `squeue` nor `sacct` knows; `None` when
/// the controller could not be asked (the next poll asks again).
async fn poll_once(cli: &Cli, ids: &[String]) -> Option<HashMap<String, JobStatus>> {
    let list = ids.join(",");
    let out = cli
        .run(
            "squeue",
            &["-h", "-r", "-t", "all", "-j", &list, "-O", SQUEUE_FORMAT],
        )
        .await;
    let mut found = match out {
        Ok(text) => parse_squeue(&text),
        // One id the controller has purged makes a single-id query fail.
        Err(e) if e.contains("Invalid job id") => HashMap::new(),
        Err(e) => {
            tracing::warn!("cannot poll Slurm: {e}");
            return None;
        }
    };
    let missing: Vec<&String> = ids.iter().filter(|i| !found.contains_key(*i)).collect();
    if !missing.is_empty() {
        let list = missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(",");
        // Accounting, where the cluster keeps it, remembers jobs the controller forgot.
        if let Ok(text) = cli
            .run(
                "sacct",
                &["-n", "-P", "-X", "-j", &list, "-o", SACCT_FORMAT],
            )
            .await
        {
            found.extend(parse_sacct(&text));
        }
        for id in missing {
            found.entry(id.clone()).or_insert_with(JobStatus::gone);
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_lines_and_wait_statuses() {
        let jobs = parse_squeue(
            "3|CANCELLED|15|None\n1|FAILED|9|JobLaunchFailure\n2|FAILED|768|NonZeroExitCode\n4|PENDING|0|ReqNodeNotAvail, UnavailableNodes:n[1-2]\n",
        );
        assert_eq!(jobs["2"].exit_code, 3);
        assert_eq!(jobs["1"].signal, 9);
        assert_eq!(jobs["4"].reason, "ReqNodeNotAvail, UnavailableNodes:n[1-2]");
        assert!(!jobs["4"].ended() && jobs["3"].ended());
        match jobs["2"].outcome("2", "python", "") {
            AttemptOutcome::Failed { exit_code, reason } => {
                assert_eq!(exit_code, Some(3));
                assert!(reason.contains("exit code 3"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(jobs["3"].outcome("3", "x", ""), AttemptOutcome::Cancelled);
    }

    #[test]
    fn slurm_outcomes_map_truthfully() {
        let st = |state: &str| JobStatus {
            state: state.into(),
            reason: "r".into(),
            exit_code: 0,
            signal: 9,
        };
        assert!(matches!(
            st("OUT_OF_MEMORY").outcome("1", "x", ""),
            AttemptOutcome::OutOfMemory { .. }
        ));
        assert!(matches!(
            st("FAILED").outcome("1", "x", "slurmstepd: error: Exceeded job memory limit"),
            AttemptOutcome::OutOfMemory { .. }
        ));
        assert!(matches!(
            st("TIMEOUT").outcome("1", "x", ""),
            AttemptOutcome::TimedOut { .. }
        ));
        assert!(matches!(
            st("PREEMPTED").outcome("1", "x", ""),
            AttemptOutcome::Preempted { .. }
        ));
        for lost in ["NODE_FAIL", "GONE"] {
            assert!(matches!(
                st(lost).outcome("1", "x", ""),
                AttemptOutcome::Lost { .. }
            ));
        }
        let sacct = parse_sacct("7|CANCELLED by 0|0:15|None\n8|COMPLETED|0:0|None\n");
        assert_eq!(sacct["7"].state, "CANCELLED");
        assert_eq!(sacct["7"].signal, 15);
        assert_eq!(sacct["8"].outcome("8", "x", ""), AttemptOutcome::Succeeded);
    }
}
