//! What `sbatch` is given for one attempt: its options, the batch script (fixed text; the
//! stage's argv are the script's arguments, never parsed by a shell) and the environment
//! the job inherits (`--export=ALL` of a cleared environment: values, secrets too, never on
//! a command line). Pure, so the tests read it as it is.

use drivetrain_engine::executor::{AttemptSpec, Rank};
use drivetrain_engine::plan::{Priority, Scheduling};
use drivetrain_engine::spec::Framework;

use super::Settings;

/// The batch script every attempt runs: a world of one runs argv as it is; a distributed
/// attempt runs one `srun` task per rank (`--kill-on-bad-exit`: a rank that fails ends the
/// allocation), each given torchrun's contract (and with `framework: mpi` Open MPI's and
/// Horovod's names) from Slurm's own variables, the first host of the allocation as
/// `MASTER_ADDR`.
pub const SCRIPT: &str = r#"#!/bin/sh
# drivetrain: one stage attempt. The stage's argv are this script's arguments.
if ! command -v "$1" >/dev/null 2>&1; then
  echo "drivetrain: \`$1\`: command not found" >&2
  exit 127
fi
if [ "${DRIVETRAIN_SLURM_RANKS:-1}" = 1 ]; then
  exec "$@"
fi
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
export MASTER_PORT="${DRIVETRAIN_MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}"
exec srun --kill-on-bad-exit=1 --label sh -c '
export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID"
export GROUP_RANK="$SLURM_NODEID" NODE_RANK="$SLURM_NODEID" GROUP_WORLD_SIZE="$SLURM_JOB_NUM_NODES"
export ROLE_RANK="$SLURM_PROCID" ROLE_WORLD_SIZE="$SLURM_NTASKS"
# This node'"'"'s task count, from SLURM_TASKS_PER_NODE ("2(x3),1").
LOCAL_WORLD_SIZE=$(echo "$SLURM_TASKS_PER_NODE" | awk -F, -v n="$SLURM_NODEID" "{
  i = 0
  for (f = 1; f <= NF; f++) {
    c = \$f; r = 1
    if (match(c, /\\(x[0-9]+\\)/)) { r = substr(c, RSTART + 2, RLENGTH - 3); c = substr(c, 1, RSTART - 1) }
    for (k = 0; k < r; k++) { if (i == n) { print c; exit } i++ }
  }
}")
export LOCAL_WORLD_SIZE="${LOCAL_WORLD_SIZE:-1}"
if [ "$DRIVETRAIN_FRAMEWORK" = mpi ]; then
  export OMPI_COMM_WORLD_RANK="$RANK" OMPI_COMM_WORLD_SIZE="$WORLD_SIZE"
  export OMPI_COMM_WORLD_LOCAL_RANK="$LOCAL_RANK" OMPI_COMM_WORLD_LOCAL_SIZE="$LOCAL_WORLD_SIZE"
  export OMPI_COMM_WORLD_NODE_RANK="$NODE_RANK" PMI_RANK="$RANK" PMI_SIZE="$WORLD_SIZE"
  export HOROVOD_RANK="$RANK" HOROVOD_SIZE="$WORLD_SIZE" HOROVOD_LOCAL_RANK="$LOCAL_RANK"
  export HOROVOD_LOCAL_SIZE="$LOCAL_WORLD_SIZE" HOROVOD_CROSS_RANK="$NODE_RANK"
  export HOROVOD_CROSS_SIZE="$GROUP_WORLD_SIZE"
fi
exec "$@"' drivetrain-rank "$@"
"#;

/// The engine's variables a job gets besides the attempt's own (as the local executor).
const PASS_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];

/// One `sbatch` call: its options (the script and argv follow them) and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    pub name: String,
    pub options: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The job name of an attempt: the run, the stage (with its map item) and the attempt,
/// so a restarted engine, `squeue` and people can tell whose job it is.
pub fn job_name(spec: &AttemptSpec) -> String {
    attempt_name(&spec.run_id, &spec.stage, spec.attempt)
}

/// The job name of attempt `attempt` of `stage` (a stage key: `stage/items/N` for an
/// item) in `run`.
pub fn attempt_name(run: &str, stage: &str, attempt: u32) -> String {
    format!("dt.{run}.{}.{attempt}", stage.replace("/items/", ".item"))
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// What `sbatch` gets for `spec` under `settings` (`script` is where the batch script
/// is; argv follows it).
pub fn submission(settings: &Settings, spec: &AttemptSpec) -> Submission {
    let name = job_name(spec);
    let mut o = vec![
        "--parsable".to_owned(),
        format!("--job-name={name}"),
        format!(
            "--comment=drivetrain run={} stage={} attempt={}",
            spec.run_id, spec.stage, spec.attempt
        ),
        format!("--output={}", spec.log.display()),
        "--open-mode=append".to_owned(),
        format!("--chdir={}", spec.workdir.display()),
    ];
    o.extend(placement_options(settings, spec));
    let ranks = spec.distributed.as_ref().map(|d| d.workers).unwrap_or(1);
    let mut env = engine_env(settings);
    env.extend(spec.env.iter().cloned());
    let framework = spec
        .distributed
        .as_ref()
        .map(|d| d.framework)
        .unwrap_or_default();
    if ranks > 1 {
        env.push(("DRIVETRAIN_SLURM_RANKS".into(), ranks.to_string()));
        if framework == Framework::Mpi {
            env.push(("DRIVETRAIN_FRAMEWORK".into(), "mpi".into()));
        }
        if let Some(p) = settings.master_port {
            env.push(("DRIVETRAIN_MASTER_PORT".into(), p.to_string()));
        }
    } else {
        env.extend(alone(settings, framework));
    }
    Submission {
        name,
        options: o,
        env,
    }
}

/// A world of one: its whole contract is known before it starts.
pub fn alone(settings: &Settings, framework: Framework) -> Vec<(String, String)> {
    let port = settings.master_port.unwrap_or(29500);
    Rank::ALONE
        .env("127.0.0.1", port, framework)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// The engine's variables every job gets, and the cluster's `SLURM_CONF`.
pub fn engine_env(settings: &Settings) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = PASS_THROUGH
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    if let Some(conf) = &settings.conf {
        env.push(("SLURM_CONF".into(), conf.display().to_string()));
    }
    env
}

/// The batch script of a map's job array: each task runs the item its task file names
/// (`drivetrain exec --task`, which reads and removes it).
pub const ARRAY_SCRIPT: &str = r#"#!/bin/sh
# drivetrain: a map's items, one array task each.
exec "$DRIVETRAIN_EXE" exec --task "$DRIVETRAIN_TASKS/$SLURM_ARRAY_TASK_ID.json"
"#;

/// What each task of a map's job array runs: one item's attempt, as the executor wrote it
/// into the task's file (mode 0600; its environment holds the item's secrets).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Task {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: std::path::PathBuf,
    pub log: std::path::PathBuf,
}

/// The job name of a map's job array: the run, the stage and the items' attempt.
pub fn array_name(spec: &AttemptSpec) -> String {
    let stage = spec.stage.split("/items/").next().unwrap_or(&spec.stage);
    format!("dt.{}.{stage}.items.{}", spec.run_id, spec.attempt)
}

/// What `sbatch` gets for a job array of `n` tasks, the items like `first`, throttled by
/// the map's `max_parallel`; the tasks' files are in `dir`, `exe` runs them.
pub fn array_submission(
    settings: &Settings,
    first: &AttemptSpec,
    dir: &std::path::Path,
    n: usize,
    exe: &std::path::Path,
) -> Submission {
    let name = array_name(first);
    let throttle = first
        .placement
        .parallel
        .map(|p| format!("%{p}"))
        .unwrap_or_default();
    let mut o = vec![
        "--parsable".to_owned(),
        format!("--job-name={name}"),
        format!(
            "--comment=drivetrain run={} stage={} attempt={} items",
            first.run_id,
            first.stage.split("/items/").next().unwrap_or(&first.stage),
            first.attempt
        ),
        format!("--array=0-{}{throttle}", n.saturating_sub(1)),
        // Slurm's own words about a task (its memory kill) go here; the item's command
        // writes to its own log.
        format!("--output={}/%a.out", dir.display()),
        format!("--chdir={}", dir.display()),
    ];
    o.extend(placement_options(settings, first));
    let mut env = engine_env(settings);
    env.push(("DRIVETRAIN_TASKS".into(), dir.display().to_string()));
    env.push(("DRIVETRAIN_EXE".into(), exe.display().to_string()));
    Submission {
        name,
        options: o,
        env,
    }
}

/// The partition and QoS a stage's `scheduling` asks for: its queue (a partition, or a
/// QoS with `queue_option: qos`), and its priority class as a QoS, or the settings'
/// `preemptible_qos` for a preemptible stage naming none.
fn scheduled(settings: &Settings, s: &Scheduling) -> (Option<String>, Option<String>) {
    let queue_is_qos = settings.queue_option.as_deref() == Some("qos");
    let class = match &s.priority {
        Priority::Class(c) => Some(c.clone()),
        Priority::Value(_) if s.preemptible => Some(
            settings
                .preemptible_qos
                .clone()
                .unwrap_or_else(|| "preemptible".to_owned()),
        ),
        Priority::Value(_) => None,
    };
    match (&s.queue, queue_is_qos) {
        (Some(q), false) => (Some(q.clone()), class),
        (Some(q), true) => (None, class.or_else(|| Some(q.clone()))),
        (None, _) => (None, class),
    }
}

/// Where and with what a job runs: partition, account, QoS, resources, time.
fn placement_options(settings: &Settings, spec: &AttemptSpec) -> Vec<String> {
    let res = &spec.placement.resources;
    let ranks = spec.distributed.as_ref().map(|d| d.workers).unwrap_or(1);
    let gpus = res.gpu.unwrap_or(0);
    let mut o = vec![
        // The job's environment is this call's (cleared, then the attempt's): nothing of
        // the engine's own leaks in, nothing is on a command line.
        "--export=ALL".to_owned(),
        // The engine owns retries: a job Slurm would requeue (a node failure, a
        // preemption) ends, and the run loop decides.
        "--no-requeue".to_owned(),
    ];
    // The stage's own place first, then its scheduling's, then the settings'.
    let own = &spec.placement.slurm;
    let partition = match (gpus, &settings.gpu_partition) {
        (1.., Some(p)) => Some(p),
        _ => settings.partition.as_ref(),
    };
    let (queue_partition, queue_qos) = scheduled(settings, &spec.placement.scheduling);
    let place = [
        (
            "partition",
            own.partition
                .as_ref()
                .or(queue_partition.as_ref())
                .or(partition),
        ),
        (
            "account",
            own.account.as_ref().or(settings.account.as_ref()),
        ),
        (
            "qos",
            own.qos
                .as_ref()
                .or(queue_qos.as_ref())
                .or(settings.qos.as_ref()),
        ),
        ("constraint", own.constraint.as_ref()),
    ];
    for (option, value) in place {
        if let Some(v) = value {
            o.push(format!("--{option}={v}"));
        }
    }
    if let Priority::Value(p @ ..0) = spec.placement.scheduling.priority {
        // Any user may lower a job's priority; raising it is a QoS's (a class).
        o.push(format!("--nice={}", p.unsigned_abs()));
    }
    o.push(format!("--ntasks={ranks}"));
    let cpus = res.cpu.as_ref().map(|c| c.value.ceil().max(1.0) as u64);
    if let Some(c) = cpus {
        o.push(format!("--cpus-per-task={c}"));
    }
    if let Some(m) = &res.memory {
        let mb = ceil_div(m.value.max(0.0) as u64, 1 << 20).max(1);
        if ranks > 1 {
            // Slurm has no memory per task: per CPU of each task instead.
            o.push(format!(
                "--mem-per-cpu={}M",
                ceil_div(mb, cpus.unwrap_or(1))
            ));
        } else {
            o.push(format!("--mem={mb}M"));
        }
    }
    if gpus > 0 {
        if ranks > 1 {
            o.push(format!("--gpus-per-task={gpus}"));
        } else {
            o.push(format!("--gres=gpu:{gpus}"));
        }
    }
    if let Some(t) = &res.ephemeral_storage {
        o.push(format!(
            "--tmp={}M",
            ceil_div(t.value.max(0.0) as u64, 1 << 20)
        ));
    }
    if let Some(t) = spec.placement.timeout {
        // Whole minutes, rounded up: the run loop stops the attempt at its exact
        // timeout; Slurm's limit is the backstop should the engine be gone.
        o.push(format!("--time={}", ceil_div(t.as_secs().max(1), 60)));
    }
    o.extend(settings.sbatch_args.iter().cloned());
    o
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use drivetrain_engine::executor::Placement;
    use drivetrain_engine::plan::{Distributed, Resources};
    use drivetrain_engine::units::Quantity;

    use super::*;

    fn spec() -> AttemptSpec {
        AttemptSpec {
            run_id: "r1".into(),
            stage: "train/items/3".into(),
            attempt: 2,
            argv: vec!["python".into(), "train.py".into()],
            env: vec![("TOKEN".into(), "s3cr3t".into())],
            workdir: PathBuf::from("/w"),
            log: PathBuf::from("/w/log.txt"),
            distributed: None,
            access: Vec::new(),
            mask: Default::default(),
            secret_files: Vec::new(),
            placement: Placement::default(),
        }
    }

    fn q(text: &str, value: f64) -> Option<Quantity> {
        Some(Quantity {
            text: text.into(),
            value,
        })
    }

    #[test]
    fn resources_and_timeout_map_to_options_and_values_stay_off_the_command_line() {
        let mut s = spec();
        s.placement.resources = Resources {
            cpu: q("1500m", 1.5),
            memory: q("1Gi", 1073741824.0),
            gpu: Some(2),
            shm: None,
            ephemeral_storage: None,
        };
        s.placement.timeout = Some(Duration::from_secs(61));
        let settings = Settings {
            partition: Some("cpu".into()),
            gpu_partition: Some("a100".into()),
            account: Some("perception".into()),
            ..Settings::default()
        };
        let sub = submission(&settings, &s);
        assert_eq!(sub.name, "dt.r1.train.item3.2");
        s.placement.slurm.partition = Some("h100".into());
        s.placement.slurm.constraint = Some("ib".into());
        let own = submission(&settings, &s);
        for want in [
            "--partition=h100",
            "--account=perception",
            "--constraint=ib",
        ] {
            assert!(own.options.iter().any(|o| o == want), "{want} in {own:?}");
        }
        for want in [
            "--job-name=dt.r1.train.item3.2",
            "--partition=a100",
            "--account=perception",
            "--ntasks=1",
            "--cpus-per-task=2",
            "--mem=1024M",
            "--gres=gpu:2",
            "--time=2",
            "--output=/w/log.txt",
            "--no-requeue",
        ] {
            assert!(sub.options.iter().any(|o| o == want), "{want} in {sub:?}");
        }
        assert!(!sub.options.iter().any(|o| o.contains("s3cr3t")));
        assert!(sub.env.contains(&("TOKEN".into(), "s3cr3t".into())));
        assert!(sub.env.contains(&("WORLD_SIZE".into(), "1".into())));
    }

    /// `scheduling:` places the job: the queue a partition (or a QoS), a class a QoS, a
    /// preemptible stage the preemptible QoS, a lower priority `--nice`; the stage's own
    /// `slurm:` still wins.
    #[test]
    fn scheduling_maps_to_partition_qos_and_nice() {
        let opts = |settings: &Settings, sched: Scheduling| {
            let mut s = spec();
            s.placement.scheduling = sched;
            submission(settings, &s).options
        };
        let has = |o: &[String], want: &str| o.iter().any(|x| x == want);
        let settings = Settings {
            qos: Some("normal".into()),
            ..Settings::default()
        };
        let o = opts(
            &settings,
            Scheduling {
                queue: Some("perception".into()),
                priority: Priority::Class("urgent".into()),
                ..Scheduling::default()
            },
        );
        assert!(
            has(&o, "--partition=perception") && has(&o, "--qos=urgent"),
            "{o:?}"
        );
        let o = opts(
            &settings,
            Scheduling {
                preemptible: true,
                priority: Priority::Value(-5),
                ..Scheduling::default()
            },
        );
        assert!(has(&o, "--qos=preemptible") && has(&o, "--nice=5"), "{o:?}");
        assert!(
            has(&o, "--no-requeue"),
            "the engine submits a preempted stage again"
        );
        let by_qos = Settings {
            queue_option: Some("qos".into()),
            ..Settings::default()
        };
        let o = opts(
            &by_qos,
            Scheduling {
                queue: Some("perception".into()),
                ..Scheduling::default()
            },
        );
        assert!(
            has(&o, "--qos=perception") && !o.iter().any(|x| x.starts_with("--partition")),
            "{o:?}"
        );
        // Nothing asked: the settings' QoS, no nice.
        let o = opts(&settings, Scheduling::default());
        assert!(
            has(&o, "--qos=normal") && !o.iter().any(|x| x.starts_with("--nice")),
            "{o:?}"
        );
        // The stage's own `slurm.qos` wins over its class.
        let mut s = spec();
        s.placement.scheduling.priority = Priority::Class("urgent".into());
        s.placement.slurm.qos = Some("debug".into());
        assert!(has(&submission(&settings, &s).options, "--qos=debug"));
    }

    #[test]
    fn a_map_is_one_job_array_throttled_by_max_parallel() {
        let mut s = spec();
        s.placement.parallel = Some(3);
        s.placement.item = Some(3);
        let sub = array_submission(
            &Settings::default(),
            &s,
            std::path::Path::new("/w/items/.slurm-1"),
            10,
            std::path::Path::new("/bin/drivetrain"),
        );
        assert_eq!(sub.name, "dt.r1.train.items.2");
        for want in [
            "--array=0-9%3",
            "--output=/w/items/.slurm-1/%a.out",
            "--no-requeue",
        ] {
            assert!(sub.options.iter().any(|o| o == want), "{want} in {sub:?}");
        }
        // The items' own environment (their secrets) is in their task files only.
        assert!(!sub.env.iter().any(|(k, _)| k == "TOKEN"), "{sub:?}");
        assert!(sub
            .env
            .contains(&("DRIVETRAIN_TASKS".into(), "/w/items/.slurm-1".into())));
    }

    #[test]
    fn a_distributed_stage_is_one_allocation_of_its_ranks() {
        let mut s = spec();
        s.distributed = Some(Distributed {
            framework: Framework::Mpi,
            workers: 4,
            slots_per_worker: 1,
        });
        s.placement.resources.gpu = Some(1);
        s.placement.resources.cpu = q("2", 2.0);
        s.placement.resources.memory = q("4Gi", 4294967296.0);
        let sub = submission(&Settings::default(), &s);
        for want in [
            "--ntasks=4",
            "--gpus-per-task=1",
            "--mem-per-cpu=2048M",
            "--cpus-per-task=2",
        ] {
            assert!(sub.options.iter().any(|o| o == want), "{want} in {sub:?}");
        }
        assert!(sub
            .env
            .contains(&("DRIVETRAIN_SLURM_RANKS".into(), "4".into())));
        assert!(sub
            .env
            .contains(&("DRIVETRAIN_FRAMEWORK".into(), "mpi".into())));
        assert!(
            !sub.env.iter().any(|(k, _)| k == "RANK"),
            "ranks set their own"
        );
    }
}
