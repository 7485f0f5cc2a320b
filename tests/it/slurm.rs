//! The slurm executor against a real Slurm: Debian's slurm-wlm (munge, slurmctld, slurmd)
//! as a single-node cluster on loopback under each test's own directory
//! (`tests/slurm/cluster.sh`, stopped by PID), driven through the binary with
//! `--executor slurm` exactly as a user would. What each job was is read back from Slurm
//! itself (`squeue`), not from the engine.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drivetrain_engine::testing::SlurmCluster;

use crate::common;
use common::{assert_ok, run_id, stage, text, Home};

/// A running single-node cluster ([`SlurmCluster`]), and what the tests ask Slurm.
struct Cluster {
    _cluster: SlurmCluster,
    conf: String,
}

impl Cluster {
    fn start(home: &Home) -> Cluster {
        Cluster::start_with(home, false)
    }

    /// With `accounting`: slurmdbd on a MariaDB of its own, and a controller that forgets
    /// ended jobs after 2 s.
    fn start_with(home: &Home, accounting: bool) -> Cluster {
        let cluster = SlurmCluster::start(&home.dir.join("slurm"), accounting);
        Cluster {
            conf: cluster.conf.display().to_string(),
            _cluster: cluster,
        }
    }

    /// `drivetrain run FILE --executor slurm` in the background: the engine, and the run
    /// its first line names.
    fn spawn_run(&self, home: &Home, file: &std::path::Path) -> (std::process::Child, String) {
        let mut engine = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
            .args(["run", file.to_str().unwrap(), "--executor", "slurm"])
            .current_dir(&home.dir)
            .env_remove("DRIVETRAIN_HOME")
            .env("SLURM_CONF", &self.conf)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(engine.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let run = line.trim().strip_prefix("run ").expect(&line).to_owned();
        (engine, run)
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("SLURM_CONF", self.conf.as_str())]
    }

    /// `squeue` (every state the controller still keeps) for jobs named `name…`:
    /// (job id, name, state, reason, `tres-per-node`).
    fn jobs(&self, prefix: &str) -> Vec<(String, String, String, String, String)> {
        let out = Command::new("squeue")
            .args([
                "-h",
                "-t",
                "all",
                "-O",
                "JobID:0|,Name:0|,State:0|,tres-per-node:0|,Reason:0",
            ])
            .env("SLURM_CONF", &self.conf)
            .output()
            .expect("squeue runs");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.splitn(5, '|').map(str::trim).collect();
                (f.len() == 5 && f[1].starts_with(prefix)).then(|| {
                    (
                        f[0].to_owned(),
                        f[1].to_owned(),
                        f[2].to_owned(),
                        f[4].to_owned(),
                        f[3].to_owned(),
                    )
                })
            })
            .collect()
    }

    /// The tasks of the job array named `name`: (`JOB_TASK`, state).
    fn tasks(&self, name: &str) -> Vec<(String, String)> {
        let out = Command::new("squeue")
            .args([
                "-h",
                "-r",
                "-t",
                "all",
                "-n",
                name,
                "-O",
                "JobArrayID:0|,State:0",
            ])
            .env("SLURM_CONF", &self.conf)
            .output()
            .expect("squeue runs");
        text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(a, b)| (a.trim().to_owned(), b.trim().to_owned()))
            .collect()
    }

    /// `scontrol show job ID`.
    fn show(&self, id: &str) -> String {
        let out = Command::new("scontrol")
            .args(["show", "job", id])
            .env("SLURM_CONF", &self.conf)
            .output()
            .expect("scontrol runs");
        text(&out.stdout)
    }

    /// One `squeue` field of the job named `name`.
    fn field(&self, name: &str, field: &str) -> String {
        let out = Command::new("squeue")
            .args(["-h", "-t", "all", "-n", name, "-O", &format!("{field}:0")])
            .env("SLURM_CONF", &self.conf)
            .output()
            .expect("squeue runs");
        text(&out.stdout).trim().to_owned()
    }

    /// Waits until a job named `name` is in `state`.
    fn wait_for(&self, name: &str, state: &str) {
        let until = Instant::now() + Duration::from_secs(60);
        while !self.jobs(name).iter().any(|j| j.1 == name && j.2 == state) {
            assert!(
                Instant::now() < until,
                "job {name} never {state}: {:?}",
                self.jobs("dt.")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn pipeline(name: &str) -> String {
    format!("{}/pipelines/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The README's driving loop, unchanged, with `--executor slurm`: every stage one batch
/// job (the 3-rank training one allocation of 3 tasks), the model promoted.
#[test]
fn the_driving_loop_runs_on_slurm() {
    let home = Home::new("slurm-loop");
    let cluster = Cluster::start(&home);
    let o = home.drivetrain_env(
        &[
            "run",
            &pipeline("driving-loop.yaml"),
            "--param",
            "drives=5",
            "--executor",
            "slurm",
        ],
        &cluster.env(),
    );
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("promote: promoted risk-model version 1 to `production`"),
        "{}",
        text(&o.stdout)
    );
    let run = run_id(&o);
    let jobs = cluster.jobs(&format!("dt.{run}."));
    for s in [
        "fleet-sim",
        "ingest",
        "mine",
        "label-export",
        "label-import",
        "train",
        "validate",
        "promote",
    ] {
        let name = format!("dt.{run}.{s}.1");
        let job: Vec<_> = jobs.iter().filter(|j| j.1 == name).collect();
        assert_eq!(job.len(), 1, "one job for {s}: {jobs:?}");
        assert_eq!(job[0].2, "COMPLETED", "{s}: {jobs:?}");
    }
    // The three ranks ran as three tasks of one allocation (`srun --label` prefixes).
    assert_eq!(cluster.field(&format!("dt.{run}.train.1"), "NumTasks"), "3");
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "train"]).stdout);
    assert!(log.starts_with("0: "), "{log}");
    let st = home.status(&run);
    assert_eq!(stage(&st, "validate")["values"]["passed"], true, "{st}");
}

/// `pipelines/lane-detection-ddp.yaml` on Slurm: two PyTorch ranks through `srun` in one
/// allocation end with identical weights; a first attempt that fails after epoch 1 ends
/// the allocation, and the retry resumes from the checkpoint with the same weights.
#[test]
fn ddp_training_on_slurm_trains_identical_weights_and_resumes() {
    let python = drivetrain_engine::testing::torch_venv_bin("python3");
    let path = format!(
        "{}:{}",
        python.parent().unwrap().display(),
        std::env::var("PATH").unwrap()
    );
    let home = Home::new("slurm-ddp");
    let cluster = Cluster::start(&home);
    let ddp = pipeline("lane-detection-ddp.yaml");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", ddp.as_str(), "--executor", "slurm"];
        args.extend(extra);
        let o = home.drivetrain_env(&args, &[("PATH", &path), cluster.env()[0]]);
        assert_ok(&o);
        run_id(&o)
    };
    let straight = run(&[]);
    let v = stage(&home.status(&straight), "train-lanes")["values"].clone();
    assert_eq!(v["world_size"], 2, "{v}");
    let weights = v["weights_sha256"].as_str().unwrap().to_owned();
    let log = text(
        &home
            .drivetrain(&["logs", &straight, "--stage", "train-lanes"])
            .stdout,
    );
    for rank in 0..2 {
        assert!(
            log.contains(&format!("{rank}: rank {rank}: weights sha256 {weights}")),
            "{log}"
        );
    }
    let resumed = run(&["-p", "fail_after_epoch=1"]);
    let st = home.status(&resumed);
    assert_eq!(stage(&st, "train-lanes")["attempts"], 2, "{st}");
    let v = stage(&st, "train-lanes")["values"].clone();
    assert_eq!(v["resumed_after_epoch"], 0, "{v}");
    assert_eq!(v["weights_sha256"], weights.as_str(), "{v}");
    // Each attempt was one job of two tasks.
    let jobs = cluster.jobs(&format!("dt.{resumed}.train-lanes."));
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(jobs.iter().any(|j| j.2 == "FAILED") && jobs.iter().any(|j| j.2 == "COMPLETED"));
}

/// What Slurm does to a job becomes the attempt's truthful outcome: a map's items are one
/// job array throttled by `max_parallel`, a timeout cancels the job, Slurm's memory
/// enforcement is `oom`, a GPU stage gets the device Slurm gave it, a stage's `slurm:`
/// partition is its job's, a failing rank ends its whole allocation.
#[test]
fn slurm_outcomes_are_the_attempts() {
    let home = Home::new("slurm-outcomes");
    let cluster = Cluster::start(&home);
    let file = home.write(
        "outcomes.yaml",
        r#"version: 1
name: slurm-outcomes
stages:
  each:
    map: {items: [a, b, c, d], max_parallel: 2}
    run:
      command: [sh, -c, 'echo "item $0 task ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" | tee "$1/item.txt"', "{{ item }}", "{{ outputs.out }}"]
    outputs: [out]
  slow:
    timeout: 2s
    run: {command: [sleep, "60"]}
  hog:
    resources: {memory: 64Mi}
    run:
      command: [python3, -c, "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"]
  gpu:
    resources: {gpu: 1}
    run:
      command: [sh, -c, 'echo "{\"cvd\": \"$CUDA_VISIBLE_DEVICES\"}" > "$DRIVETRAIN_VALUES"']
  placed:
    slurm: {partition: long}
    run: {command: ["true"]}
  gang:
    distributed: {workers: 2}
    run:
      command: [sh, -c, 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60']
"#,
    );
    let started = Instant::now();
    let o = home.drivetrain_env(
        &[
            "run",
            file.to_str().unwrap(),
            "--executor",
            "slurm",
            "--parallelism",
            "6",
        ],
        &cluster.env(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    // Nothing waited for a 60 s sleep or a 30 s hog.
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
    let run = run_id(&o);
    let st = home.status(&run);
    let reason = |s: &str| stage(&st, s)["reason"].as_str().unwrap_or("").to_owned();

    // The map: one job array of four tasks, two at a time (`max_parallel`), each item's
    // output written by its own task.
    assert_eq!(stage(&st, "each")["phase"], "Succeeded", "{st}");
    let array = format!("dt.{run}.each.items.1");
    let tasks = cluster.tasks(&array);
    assert_eq!(tasks.len(), 4, "{tasks:?}");
    let job = tasks[0].0.split('_').next().unwrap().to_owned();
    for i in 0..4 {
        let task = format!("{job}_{i}");
        assert!(
            tasks.iter().any(|t| t.0 == task && t.1 == "COMPLETED"),
            "{task}: {tasks:?}"
        );
    }
    assert!(
        cluster.show(&job).contains("ArrayTaskThrottle=2"),
        "{}",
        cluster.show(&job)
    );
    let st_items = &st["items"]["each"];
    assert_eq!(st_items["Succeeded"], 4, "{st}");
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "each"]).stdout);
    for (i, item) in ["a", "b", "c", "d"].iter().enumerate() {
        assert!(
            log.contains(&format!("item {item} task {job}_{i}\n")),
            "{log}"
        );
    }

    assert_eq!(stage(&st, "slow")["phase"], "Failed", "{st}");
    assert!(
        reason("slow").contains("timed out after 2"),
        "{}",
        reason("slow")
    );
    cluster.wait_for(&format!("dt.{run}.slow.1"), "CANCELLED");

    assert_eq!(stage(&st, "hog")["phase"], "Failed", "{st}");
    assert!(reason("hog").contains("out of memory"), "{}", reason("hog"));
    assert!(
        reason("hog").contains("exceeded memory limit"),
        "{}",
        reason("hog")
    );

    assert_eq!(stage(&st, "gpu")["phase"], "Succeeded", "{st}");
    assert_eq!(stage(&st, "gpu")["values"]["cvd"], "0", "{st}");
    let gpu = cluster.jobs(&format!("dt.{run}.gpu.1"));
    assert!(gpu[0].4.contains("gpu:1"), "{gpu:?}");

    assert_eq!(stage(&st, "placed")["phase"], "Succeeded", "{st}");
    let placed = format!("dt.{run}.placed.1");
    assert_eq!(cluster.field(&placed, "Partition"), "long");
    assert_eq!(
        cluster.field(&format!("dt.{run}.gpu.1"), "Partition"),
        "debug"
    );

    assert_eq!(stage(&st, "gang")["phase"], "Failed", "{st}");
    let gang = cluster.jobs(&format!("dt.{run}.gang.1"));
    assert_eq!(gang[0].2, "FAILED", "{gang:?}");
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "gang"]).stdout);
    assert!(
        log.contains("srun: error") || log.contains("task 1"),
        "{log}"
    );
}

/// `cancel` is `scancel`; a kill -9 of the engine leaves the job running, and `resume`
/// watches that job again (no second submission), never submitting a succeeded stage.
#[test]
fn cancel_and_an_engine_killed_mid_run_on_slurm() {
    let home = Home::new("slurm-crash");
    let cluster = Cluster::start(&home);
    let file = home.write(
        "crash.yaml",
        r#"version: 1
name: slurm-crash
stages:
  first:
    run: {command: [sh, -c, 'echo one > "$0/x"', "{{ outputs.out }}"]}
    outputs: [out]
  second:
    inputs: {a: first.out}
    run: {command: [sh, -c, 'sleep 6; cp "$0/x" "$1/y"; echo "{\"job\": \"$SLURM_JOB_ID\", \"read\": \"$(cat "$0/x")\"}" > "$DRIVETRAIN_VALUES"', "{{ inputs.a }}", "{{ outputs.out }}"]}
    outputs: [out]
"#,
    );
    // Cancel: the job Slurm runs is cancelled there.
    let (mut engine, run) = cluster.spawn_run(&home, &file);
    cluster.wait_for(&format!("dt.{run}.second.1"), "RUNNING");
    assert_ok(&home.drivetrain_env(&["cancel", &run], &cluster.env()));
    let status = engine.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    cluster.wait_for(&format!("dt.{run}.second.1"), "CANCELLED");
    assert_eq!(home.status(&run)["run"]["phase"], "Cancelled");

    // kill -9 while `second` runs; resume re-attaches to the very job.
    let (mut engine, run) = cluster.spawn_run(&home, &file);
    let second = format!("dt.{run}.second.1");
    cluster.wait_for(&second, "RUNNING");
    engine.kill().unwrap();
    engine.wait().unwrap();
    let o = home.drivetrain_env(&["resume", &run], &cluster.env());
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("0 attempt(s) lost, 1 re-attached"),
        "{}",
        text(&o.stdout)
    );
    let st = home.status(&run);
    assert_eq!(st["run"]["phase"], "Succeeded", "{st}");
    // `first` came from the cancelled run's cache; `second` ran once, in one job.
    assert_eq!(stage(&st, "first")["origin"], "cached", "{st}");
    assert_eq!(stage(&st, "second")["attempts"], 1, "{st}");
    // One job in Slurm for this run, the second's values written by that very job.
    let jobs = cluster.jobs(&format!("dt.{run}."));
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = jobs.iter().find(|j| j.1 == second).unwrap();
    assert_eq!(job.2, "COMPLETED");
    assert_eq!(
        stage(&st, "second")["values"]["job"],
        job.0.as_str(),
        "{st}"
    );
    assert_eq!(stage(&st, "second")["values"]["read"], "one", "{st}");

    // An engine that died after `sbatch` but before recording the job's handle: the
    // state it leaves (the handle erased with Python's sqlite3, as that crash would leave
    // it). `resume` finds the job by its name and watches it again. (New data upstream,
    // so that nothing of it is in the cache.)
    let text_two = std::fs::read_to_string(&file)
        .unwrap()
        .replace("echo one", "echo two");
    let file = home.write("crash-two.yaml", &text_two);
    let (mut engine, run) = cluster.spawn_run(&home, &file);
    let second = format!("dt.{run}.second.1");
    cluster.wait_for(&second, "RUNNING");
    engine.kill().unwrap();
    engine.wait().unwrap();
    crate::common::erase_handle(&home, &run, "second");
    let o = home.drivetrain_env(&["resume", &run], &cluster.env());
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("0 attempt(s) lost, 1 re-attached"),
        "{}",
        text(&o.stdout)
    );
    let st = home.status(&run);
    assert_eq!(stage(&st, "second")["attempts"], 1, "{st}");
    // One job per stage: `second`'s was not submitted again.
    let jobs = cluster.jobs(&format!("dt.{run}."));
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let job = jobs.iter().find(|j| j.1 == second).unwrap();
    assert_eq!(
        stage(&st, "second")["values"]["job"],
        job.0.as_str(),
        "{st}"
    );
    assert_eq!(stage(&st, "second")["values"]["read"], "two", "{st}");

    // Killed again; while it is down another run does the same work and caches it. The
    // resumed run still watches its own job rather than taking the cache (which would
    // leave that job running unwatched).
    let file = home.write(
        "crash-three.yaml",
        &text_two.replace("echo two", "echo three"),
    );
    let (mut engine, run) = cluster.spawn_run(&home, &file);
    let second = format!("dt.{run}.second.1");
    cluster.wait_for(&second, "RUNNING");
    engine.kill().unwrap();
    engine.wait().unwrap();
    let other = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--executor", "slurm"],
        &cluster.env(),
    );
    assert_ok(&other);
    let o = home.drivetrain_env(&["resume", &run], &cluster.env());
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("0 attempt(s) lost, 1 re-attached"),
        "{}",
        text(&o.stdout)
    );
    let st = home.status(&run);
    assert_eq!(stage(&st, "second")["origin"], "ran", "{st}");
    let job = cluster.field(&second, "JobID");
    assert_eq!(stage(&st, "second")["values"]["job"], job.as_str(), "{st}");
    assert_eq!(cluster.field(&second, "State"), "COMPLETED");
}

/// A stage Slurm keeps pending says why in `status` while it waits (here for a GPU the
/// other stage holds), and runs once the GPU is free.
#[test]
fn a_stage_waiting_for_a_gpu_says_so_in_status() {
    let home = Home::new("slurm-pending");
    let cluster = Cluster::start(&home);
    let file = home.write(
        "gpus.yaml",
        r#"version: 1
name: slurm-gpus
stages:
  hold:
    resources: {gpu: 2}
    run: {command: [sleep, "5"]}
  wants:
    resources: {gpu: 1}
    run: {command: [sh, -c, 'echo "got $CUDA_VISIBLE_DEVICES"']}
"#,
    );
    let (mut engine, run) = cluster.spawn_run(&home, &file);
    // Whichever of the two Slurm started first, the other waits for GPUs ("Resources",
    // or "Priority" behind an earlier pending job).
    let until = Instant::now() + Duration::from_secs(30);
    let (waiting, note) = 'found: loop {
        // (The engine names the run before its record is written.)
        let o = home.drivetrain(&["status", &run, "--output", "json"]);
        let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        for s in ["hold", "wants"] {
            if let Some(n) = st["notes"][s]
                .as_str()
                .filter(|n| n.contains("is pending: "))
            {
                break 'found (s, n.to_owned());
            }
        }
        assert!(Instant::now() < until, "never pending: {st}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        note.contains("pending: Resources") || note.contains("pending: Priority"),
        "{note}"
    );
    let text_status = text(&home.drivetrain(&["status", &run]).stdout);
    assert!(
        text_status
            .lines()
            .any(|l| l.starts_with(waiting) && l.contains("is pending: ")),
        "{text_status}"
    );
    assert!(engine.wait().unwrap().success());
    let log = text(&home.drivetrain(&["logs", &run, "--stage", waiting]).stdout);
    assert!(log.contains("is pending: "), "{log}");
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "wants"]).stdout);
    assert!(log.contains("got 0"), "{log}");
}

/// An engine down longer than the controller remembers its job: `resume` learns from
/// accounting (`sacct`, through slurmdbd and MariaDB) that the job it left running
/// succeeded, takes its outputs, and submits nothing again.
#[test]
fn resume_reads_a_job_the_controller_forgot_from_accounting() {
    let home = Home::new("slurm-sacct");
    let cluster = Cluster::start_with(&home, true);
    let file = home.write(
        "forgot.yaml",
        r#"version: 1
name: slurm-forgot
stages:
  work:
    run: {command: [sh, -c, 'sleep 3; echo done > "$0/r"; echo "{\"job\": \"$SLURM_JOB_ID\"}" > "$DRIVETRAIN_VALUES"', "{{ outputs.out }}"]}
    outputs: [out]
"#,
    );
    let (mut engine, run) = cluster.spawn_run(&home, &file);
    let name = format!("dt.{run}.work.1");
    cluster.wait_for(&name, "RUNNING");
    let job = cluster.field(&name, "JobID");
    engine.kill().unwrap();
    engine.wait().unwrap();
    // The job ends; the controller forgets it; accounting keeps it.
    let sacct = || {
        let out = Command::new("sacct")
            .args(["-n", "-P", "-X", "--name", &name, "-o", "JobID,State"])
            .env("SLURM_CONF", &cluster.conf)
            .output()
            .expect("sacct runs");
        text(&out.stdout)
    };
    let until = Instant::now() + Duration::from_secs(90);
    while !cluster.jobs(&name).is_empty() || !sacct().contains("COMPLETED") {
        assert!(
            Instant::now() < until,
            "{:?} / {}",
            cluster.jobs(&name),
            sacct()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let o = home.drivetrain_env(&["resume", &run], &cluster.env());
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("0 attempt(s) lost, 1 re-attached"),
        "{}",
        text(&o.stdout)
    );
    let st = home.status(&run);
    assert_eq!(st["run"]["phase"], "Succeeded", "{st}");
    assert_eq!(stage(&st, "work")["attempts"], 1, "{st}");
    assert_eq!(stage(&st, "work")["values"]["job"], job.as_str(), "{st}");
    // Accounting holds exactly the one job of this run.
    let all = sacct();
    assert_eq!(all.trim(), format!("{job}|COMPLETED"), "{all}");
}

/// On a Slurm configured for QoS preemption (`urgent` preempts `preemptible`): a
/// preemptible stage (its job in QoS `preemptible`) that a job of QoS `urgent` preempts
/// gets SIGTERM, saves its checkpoint and ends its attempt `Preempted` (not a failure,
/// not a retry); the engine submits it again, it resumes from its checkpoint, and its
/// run succeeds with what it would have had alone.
#[test]
fn a_preempted_slurm_job_is_submitted_again_and_resumes() {
    let home = Home::new("slurm-preempt");
    let cluster = SlurmCluster::start_preempting(&home.dir.join("slurm"));
    let cluster = Cluster {
        conf: cluster.conf.display().to_string(),
        _cluster: cluster,
    };
    let train = home.write(
        "train.yaml",
        &crate::preemption::resuming_trainer("{preemptible: true}"),
    );
    let urgent = home.write(
        "urgent.yaml",
        "version: 1\nname: urgent\nstages:\n  urgent:\n    resources: {gpu: 2}\n    scheduling: {priority: urgent}\n    run: {command: [sleep, '1']}\n",
    );
    let (engine, run) = cluster.spawn_run(&home, &train);
    cluster.wait_for(&format!("dt.{run}.train.1"), "RUNNING");
    std::thread::sleep(Duration::from_millis(1500));
    let o = home.drivetrain_env(
        &["run", urgent.to_str().unwrap(), "--executor", "slurm"],
        &cluster.env(),
    );
    assert_ok(&o);
    let o = engine.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));

    let st = home.status(&run);
    let s = stage(&st, "train");
    assert_eq!(
        s["values"],
        serde_json::json!({"steps": 12, "sum": 650}),
        "{s}"
    );
    assert_eq!(s["attempts"], 2, "{s}");
    let state = drivetrain_engine::state::SqliteState::open(&home.dir.join(".drivetrain/state.db"))
        .unwrap();
    use drivetrain_engine::state::AttemptStore as _;
    let tries = state
        .attempts(&drivetrain_engine::state::RunId(run.clone()))
        .unwrap();
    let phases: Vec<&str> = tries.iter().map(|a| a.phase.as_str()).collect();
    assert_eq!(phases, ["Preempted", "Succeeded"], "{tries:?}");
    let why = tries[0].reason.as_deref().unwrap_or_default();
    assert!(why.contains("ended PREEMPTED"), "{why}");
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "train"]).stdout);
    assert!(log.contains("resumed from step "), "{log}");
    assert!(
        !log.lines().any(|l| l == "step 1"),
        "it started over: {log}"
    );
}

/// A search on Slurm: each trial's rung a batch job, its metrics read from the shared
/// file system while it runs, the best trial's output handed on.
#[test]
fn a_search_runs_its_trials_as_slurm_jobs() {
    let home = Home::new("slurm-search");
    let cluster = Cluster::start(&home);
    let search = crate::search::sh_search(
        "slurm-search",
        "",
        "method: asha, metric: loss, max_trials: 4, reduction_factor: 2, budget: {unit: epochs, min: 1, max: 2}, space: {x: {uniform: [0, 1]}}",
    );
    let file = home.write("search.yaml", &search);
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--executor", "slurm"],
        &cluster.env(),
    );
    assert_ok(&o);
    let run = run_id(&o);
    let o = home.drivetrain(&["trials", &run, "train", "-o", "json"]);
    assert_ok(&o);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let trials = listed["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{listed}");
    let jobs = cluster.jobs(&format!("dt.{run}."));
    let rungs: u64 = trials.iter().map(|t| t["rung"].as_u64().unwrap() + 1).sum();
    assert_eq!(
        jobs.len() as u64,
        rungs + 1,
        "a job per trial's rung, and `use`: {jobs:?}"
    );
    assert!(jobs.iter().all(|j| j.2 == "COMPLETED"), "{jobs:?}");
    let best = crate::search::best_listed(&listed);
    let x = best["params"]["x"].as_f64().unwrap();
    let used = text(&home.drivetrain(&["logs", &run, "--stage", "use"]).stdout);
    assert!(used.contains(&format!("best x {x}")), "{used} {best}");
}
