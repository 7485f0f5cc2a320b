//! The local executor: each attempt is a child process in its own process group.
//!
//! argv goes to `execve` as it is (no shell). The child gets the engine's `PATH`, `HOME`,
//! `LANG` and `TZ` and the attempt's environment, nothing else; stdout and stderr both go
//! to the attempt's log file. Cancelling (a timeout, a user's cancel) kills the whole
//! group, and so does a normal exit, so nothing a stage started outlives it.
//! `distributed: {workers: N}` starts N ranks in one group with the rendezvous environment
//! torchrun and Horovod read ([`Rank::env`]); when one rank fails, the others are killed
//! (gang semantics). A stage without `distributed:` is a world of one with the same
//! variables, so `init_process_group(init_method="env://")` works there too.
//!
//! Each attempt also gets a private mount namespace (as root, or through an unprivileged
//! user namespace where the kernel allows one) in which the paths of
//! [`AttemptSpec::access`] are bind-mounted read-only or writable: the store and the
//! engine's home are read-only, the attempt's own directory and outputs writable, its
//! inputs read-only again. A stage then cannot change an artifact even through the hard
//! links its inputs are, not with `chmod`, not by writing into the store directly. Where no
//! namespace can be had, attempts run without one ([`Isolation::Auto`]) and the run loop's
//! check of every input against its manifest still catches a write.
//!
//! An isolated attempt cannot undo its mounts: before `exec` it loses every capability
//! but Docker's default set less `CAP_MKNOD` ([`KEPT_CAPS`]) from its bounding, inheritable
//! and ambient sets, and gets `no_new_privs`. A stage the root engine starts is still uid
//! 0, but without `CAP_SYS_ADMIN` it cannot unmount, remount or mount, nor `setns` into
//! another namespace, and without `CAP_SYS_PTRACE` it cannot reach `/proc/1/root`. It
//! also runs in a user namespace of its own (uid 0 mapped to 0), so `/proc/PID/root` of
//! no process outside it is open to it, not even of a root process with no capabilities
//! (which a stage with a superset of them could otherwise enter); where the kernel
//! refuses a user namespace to root, the mount namespace alone is made.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use drivetrain_engine::executor::{
    AttemptOutcome, AttemptSpec, Executor, ExecutorError, Rank, RunningAttempt,
};
use futures::FutureExt as _;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

mod isolate;

use isolate::MountPlan;
pub use isolate::{layers, namespaces_work, user_namespaces_work, KEPT_CAPS};

/// Runs attempts as local processes.
#[derive(Debug, Default, Clone)]
pub struct LocalExecutor {
    pub isolation: Isolation,
}

/// Whether attempts get a private mount namespace enforcing [`AttemptSpec::access`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Where the kernel allows one; otherwise without, and a warning once.
    #[default]
    Auto,
    /// Always: an attempt fails to start when no namespace can be had.
    Required,
    /// Never.
    Off,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "" => Ok(Isolation::Auto),
            "required" => Ok(Isolation::Required),
            "off" => Ok(Isolation::Off),
            other => Err(format!(
                "isolation `{other}` is not one of auto, required, off"
            )),
        }
    }
}

impl LocalExecutor {
    /// The executor configured from `DRIVETRAIN_ISOLATION` (`auto`, `required`, `off`).
    pub fn from_env() -> Result<Self, String> {
        Ok(LocalExecutor {
            isolation: std::env::var("DRIVETRAIN_ISOLATION")
                .unwrap_or_default()
                .parse()?,
        })
    }
}

/// Environment variables the engine passes through to every stage.
const PASS_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];

/// One rank's process: spawned by the standard library (`posix_spawn`) when the attempt
/// is not isolated, or cloned into its namespaces by [`isolate::spawn`].
enum Proc {
    Spawned(Child),
    Cloned(isolate::RawChild),
}

impl Proc {
    fn id(&self) -> Option<u32> {
        match self {
            Proc::Spawned(c) => c.id(),
            Proc::Cloned(c) => Some(c.id()),
        }
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Proc::Spawned(c) => c.wait().await,
            Proc::Cloned(c) => c.wait().await,
        }
    }
}

struct Started {
    pgid: i32,
    children: Vec<(usize, Proc)>,
    /// Set when the command could not be started (does not exist, not executable).
    failed_to_start: Option<String>,
    cancelled: bool,
}

fn kill_group(pgid: i32) {
    if pgid > 0 {
        // ESRCH (the group is gone) is the expected case after a clean exit.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

#[async_trait]
impl RunningAttempt for Started {
    fn handle(&self) -> String {
        format!("pgid:{}", self.pgid)
    }

    async fn wait(&mut self) -> AttemptOutcome {
        if let Some(reason) = self.failed_to_start.take() {
            return AttemptOutcome::Failed {
                exit_code: None,
                reason,
            };
        }
        let world = self.children.len();
        let mut failure: Option<AttemptOutcome> = None;
        while !self.children.is_empty() {
            // Wait for whichever rank ends first.
            let (idx, status) = {
                let mut waits = Vec::with_capacity(self.children.len());
                for (i, (_, child)) in self.children.iter_mut().enumerate() {
                    waits.push(async move { (i, child.wait().await) }.boxed());
                }
                futures::future::select_all(waits).await.0
            };
            let (rank, _) = self.children.remove(idx);
            let status = match status {
                Ok(s) => s,
                Err(e) => {
                    failure.get_or_insert(AttemptOutcome::Failed {
                        exit_code: None,
                        reason: format!("cannot wait for the process: {e}"),
                    });
                    kill_group(self.pgid);
                    continue;
                }
            };
            if self.cancelled {
                continue;
            }
            if !status.success() && failure.is_none() {
                use std::os::unix::process::ExitStatusExt;
                let who = if world > 1 {
                    format!("rank {rank} ")
                } else {
                    String::new()
                };
                let reason = match (status.code(), status.signal()) {
                    (Some(c), _) => format!("{who}exited with code {c}"),
                    (None, Some(sig)) => format!("{who}was killed by signal {sig}"),
                    _ => format!("{who}ended abnormally"),
                };
                failure = Some(AttemptOutcome::Failed {
                    exit_code: status.code(),
                    reason: if world > 1 {
                        format!("{reason}; the other ranks were stopped")
                    } else {
                        reason
                    },
                });
                // Gang semantics: one rank down stops them all.
                kill_group(self.pgid);
            }
        }
        // Whatever the stage left running in its group goes with it.
        kill_group(self.pgid);
        if self.cancelled {
            return AttemptOutcome::Cancelled;
        }
        failure.unwrap_or(AttemptOutcome::Succeeded)
    }

    async fn cancel(&mut self) {
        self.cancelled = true;
        kill_group(self.pgid);
        for (_, child) in &mut self.children {
            let _ = child.wait().await;
        }
        self.children.clear();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[async_trait]
impl Executor for LocalExecutor {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn reap(&self, handle: &str) -> bool {
        let Some(pgid) = handle
            .strip_prefix("pgid:")
            .and_then(|p| p.parse::<i32>().ok())
        else {
            return false;
        };
        if pgid <= 1 {
            return false;
        }
        killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok()
    }

    async fn start(&self, spec: AttemptSpec) -> Result<Box<dyn RunningAttempt>, ExecutorError> {
        let Some(program) = spec.argv.first().cloned() else {
            return Err(ExecutorError("empty argv".into()));
        };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|e| ExecutorError(format!("cannot open log {}: {e}", spec.log.display())))?;
        let workers = spec
            .distributed
            .as_ref()
            .map(|d| d.workers as usize)
            .unwrap_or(1);
        // Every attempt gets a rendezvous port, a world of one too: a single-process
        // `torch.distributed` job initialises from the environment like any other.
        let port =
            free_port().map_err(|e| ExecutorError(format!("no free port for MASTER_PORT: {e}")))?;
        let framework = spec
            .distributed
            .as_ref()
            .map(|d| d.framework)
            .unwrap_or_default();
        let isolate = match self.isolation {
            Isolation::Off => false,
            _ if spec.access.is_empty() => false,
            Isolation::Auto => namespaces_work(),
            Isolation::Required => {
                if !namespaces_work() {
                    return Err(ExecutorError(
                        "isolation is required but this process cannot create mount namespaces"
                            .into(),
                    ));
                }
                true
            }
        };
        let plan = if isolate {
            Some(Arc::new(
                MountPlan::new(&spec.access, self.isolation == Isolation::Required)
                    .map_err(|e| ExecutorError(e.to_string()))?,
            ))
        } else {
            None
        };
        let mut started = Started {
            pgid: 0,
            children: Vec::with_capacity(workers),
            failed_to_start: None,
            cancelled: false,
        };
        for rank in 0..workers {
            // All ranks on this one machine: one node, local ranks = ranks.
            let place = Rank {
                rank: rank as u32,
                world: workers as u32,
                local_rank: rank as u32,
                local_world: workers as u32,
                node: 0,
                nodes: 1,
            };
            // The engine's pass-through variables, then the attempt's, then the rank's:
            // a later one of the same name wins.
            let mut env: BTreeMap<String, String> = PASS_THROUGH
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
                .collect();
            env.extend(spec.env.iter().cloned());
            env.extend(
                place
                    .env("127.0.0.1", port, framework)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v)),
            );
            // The first rank leads a new group; the others join it.
            let spawned = match &plan {
                Some(plan) => isolate::spawn(
                    &program,
                    &spec.argv[1..],
                    &env,
                    &spec.workdir,
                    &log,
                    started.pgid,
                    plan.clone(),
                )
                .map(|pid| Proc::Cloned(isolate::RawChild::new(pid))),
                None => log.try_clone().and_then(|out| {
                    let err = out.try_clone()?;
                    Command::new(&program)
                        .args(&spec.argv[1..])
                        .current_dir(&spec.workdir)
                        .env_clear()
                        .envs(&env)
                        .stdin(Stdio::null())
                        .stdout(Stdio::from(out))
                        .stderr(Stdio::from(err))
                        .process_group(started.pgid)
                        .spawn()
                        .map(Proc::Spawned)
                }),
            };
            match spawned {
                Ok(child) => {
                    if started.pgid == 0 {
                        started.pgid = child.id().map(|p| p as i32).unwrap_or(0);
                    }
                    started.children.push((rank, child));
                }
                Err(e) => {
                    kill_group(started.pgid);
                    started.failed_to_start = Some(match e.kind() {
                        std::io::ErrorKind::NotFound => format!(
                            "stage `{}`: command `{program}` not found (in {} or on PATH)",
                            spec.stage,
                            spec.workdir.display()
                        ),
                        std::io::ErrorKind::PermissionDenied => {
                            format!(
                                "stage `{}`: command `{program}` is not executable",
                                spec.stage
                            )
                        }
                        _ => format!("stage `{}`: cannot start `{program}`: {e}", spec.stage),
                    });
                    for (_, mut c) in started.children.drain(..) {
                        let _ = c.wait().await;
                    }
                    break;
                }
            }
        }
        Ok(Box::new(started))
    }
}
