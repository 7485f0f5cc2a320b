//! GPUs of the machine on local runs, and the rendezvous environment of every stage.
//!
//! There is no GPU here or in CI: the machine's GPUs come from an `nvidia-smi` put first
//! on PATH that prints what the real one prints with `-L` on a two-GPU machine (NVML is
//! not loadable here, so detection falls back to it, as on a machine whose driver
//! library is not where NVML looks). What the engine does with what it found — which
//! stage gets which device, what an outer `CUDA_VISIBLE_DEVICES` hides, what a stage
//! needing more than there is hears — is the real code path.

use crate::common;

use common::*;

const SMI: &str = "#!/bin/sh\n[ \"$1\" = -L ] || exit 2\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a0a0a0a-1111-2222-3333-444444444444)'\necho 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0b0b0b0b-5555-6666-7777-888888888888)'\n";

/// PATH with a stand-in `nvidia-smi` of two H100s first.
fn two_gpus(home: &Home) -> String {
    let bin = home.dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let smi = bin.join("nvidia-smi");
    std::fs::write(&smi, SMI).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap())
}

const GPU_A: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";
const GPU_B: &str = "GPU-0b0b0b0b-5555-6666-7777-888888888888";

#[test]
fn stages_get_the_gpus_the_machine_has_one_stage_each() {
    let home = Home::new("gpus");
    let path = two_gpus(&home);
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: gpus
stages:
  a:
    resources: {gpu: 1}
    run: {command: [sh, -c, 'echo "$CUDA_VISIBLE_DEVICES"; sleep 1']}
  b:
    resources: {gpu: 1}
    run: {command: [sh, -c, 'echo "$CUDA_VISIBLE_DEVICES"; sleep 1']}
  both:
    needs: [a, b]
    resources: {gpu: 2}
    run: {command: [sh, -c, 'echo "$CUDA_VISIBLE_DEVICES"']}
"#,
    );
    let doctor = home.drivetrain_env(&["doctor"], &[("PATH", &path)]);
    let report = text(&doctor.stdout);
    assert!(report.contains("gpus: 2 from nvidia-smi"), "{report}");
    assert!(
        report.contains(&format!("{GPU_A} NVIDIA H100 80GB HBM3")),
        "{report}"
    );

    // No --gpus: the two found are used, one stage each while both run at once.
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--parallelism", "2"],
        &[("PATH", &path)],
    );
    assert_ok(&o);
    let id = run_id(&o);
    let logs = |stage: &str| text(&home.drivetrain(&["logs", &id, "--stage", stage]).stdout);
    let (a, b) = (logs("a"), logs("b"));
    let mut got = [a.trim(), b.trim()];
    got.sort();
    assert_eq!(got, [GPU_A, GPU_B], "a={a} b={b}");
    assert_eq!(logs("both").trim(), format!("{GPU_A},{GPU_B}"));

    // An outer CUDA_VISIBLE_DEVICES is the machine's slice: one GPU, as it names it.
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("PATH", &path), ("CUDA_VISIBLE_DEVICES", "1")],
    );
    assert_eq!(o.status.code(), Some(1));
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(stage(&st, "a")["phase"], "Succeeded");
    let reason = stage(&st, "both")["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.starts_with("stage needs 2 GPU(s); this machine has 1 (1;"),
        "{reason}"
    );
    let logs = |stage: &str| text(&home.drivetrain(&["logs", &id, "--stage", stage]).stdout);
    assert_eq!(logs("a").trim(), "1");
}

#[test]
fn without_gpus_nothing_changes_and_gpu_stages_say_why() {
    let home = Home::new("no-gpus");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: g\nstages:\n  cpu:\n    run: {command: [\"true\"]}\n  gpu:\n    resources: {gpu: 1}\n    run: {command: [\"true\"]}\n",
    );
    // PATH without nvidia-smi; no NVML on this machine.
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("PATH", "/usr/bin:/bin")],
    );
    assert_eq!(o.status.code(), Some(1));
    let st = home.status(&run_id(&o));
    assert_eq!(stage(&st, "cpu")["phase"], "Succeeded");
    let reason = stage(&st, "gpu")["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.contains("this machine has 0 (none found by NVML or nvidia-smi"),
        "{reason}"
    );
    // --gpus still overrides: the stage runs, given index 0.
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--gpus", "1"],
        &[("PATH", "/usr/bin:/bin")],
    );
    assert_ok(&o);
}

/// Every stage is a world of one with torchrun's environment, so a single-process
/// `torch.distributed` job can `init_process_group(init_method="env://")`; distributed
/// ranks with `framework: mpi` also get Open MPI's and Horovod's names.
#[test]
fn every_stage_has_the_rendezvous_environment() {
    let home = Home::new("rendezvous");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: ranks
stages:
  alone:
    run: {command: [sh, -c, 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK $MASTER_ADDR ${MASTER_PORT:+port}"']}
  mpi:
    distributed: {framework: mpi, workers: 2}
    run: {command: [sh, -c, 'echo "$OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE $HOROVOD_RANK/$HOROVOD_SIZE $RANK/$WORLD_SIZE"']}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let id = run_id(&o);
    let alone = text(&home.drivetrain(&["logs", &id, "--stage", "alone"]).stdout);
    assert_eq!(alone, "0 1 0 1 0 0 127.0.0.1 port\n");
    let mpi = text(&home.drivetrain(&["logs", &id, "--stage", "mpi"]).stdout);
    let mut lines: Vec<&str> = mpi.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["[rank 0] 0/2 0/2 0/2", "[rank 1] 1/2 1/2 1/2"],
        "{mpi}"
    );
}

/// What a stage's GPU did is recorded from NVML: a stage that holds 4 GiB of GPU memory
/// and multiplies matrices shows that memory and a busy GPU; a stage given the same GPU
/// that only sleeps shows an idle one and no memory.
///
/// This needs a real NVIDIA GPU, its driver's NVML and a Python with PyTorch
/// (`DRIVETRAIN_TEST_GPU_PYTHON`, default `python3`): CI has none, and there the test says
/// so and checks nothing. It was run on an H200 (bench/README.md, "GPU usage").
#[test]
fn a_stage_records_what_its_gpu_did() {
    let home = Home::new("gpu-usage");
    let doctor = home.drivetrain(&["doctor", "-o", "json"]);
    if doctor_layer(&doctor, "gpu usage")["active"] != true {
        eprintln!("no NVML here (no NVIDIA GPU): skipped");
        return;
    }
    let python = std::env::var("DRIVETRAIN_TEST_GPU_PYTHON").unwrap_or("python3".into());
    let burn = r#"
import time, torch
held = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + 6
while time.time() < end:
    b = a @ a
    torch.cuda.synchronize()
print("held", held.numel() * 4, "bytes")
"#;
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: gpu-usage
stages:
  burn:
    resources: {{gpu: 1}}
    run: {{command: [{python}, -c, {burn}]}}
  idle:
    needs: [burn]
    resources: {{gpu: 1}}
    run: {{command: [sleep, "3"]}}
"#,
            burn = serde_json::to_string(burn).unwrap()
        ),
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    let id = run_id(&o);
    let logs = text(&home.drivetrain(&["logs", &id]).stdout);
    assert!(o.status.success(), "{}\n{logs}", text(&o.stderr));
    let st = home.status(&id);
    let used = |name: &str| stage(&st, name)["usage"].clone();
    let burn = used("burn");
    eprintln!("burn used {burn}, idle used {}", used("idle"));
    let memory = burn["gpu_memory_bytes"].as_u64().unwrap_or(0);
    assert!(memory >= 4 << 30, "{burn}");
    let busy = burn["gpu_utilization_percent"].as_f64().unwrap_or(0.0);
    assert!(busy >= 30.0, "{burn}");
    let idle = used("idle");
    assert!(idle["gpu_memory_bytes"].is_null(), "{idle}");
    let quiet = idle["gpu_utilization_percent"].as_f64();
    assert!(quiet.is_some_and(|u| u < 5.0), "{idle}");
    // `status` says it to people too.
    let text = text(&home.drivetrain(&["status", &id]).stdout);
    assert!(text.contains("GPU memory"), "{text}");
}

/// Engines of one home claim GPUs through its ledger: two `drivetrain run`s each asking
/// for both GPUs twice never hold one device at once; a stage waiting says who holds what
/// it waits for; an engine killed with `kill -9` holds nothing once its heartbeat is
/// stale, and the waiting engine's stage then runs.
#[test]
fn engines_of_one_home_never_share_a_gpu() {
    let home = Home::new("gpu-ledger");
    let path = two_gpus(&home);
    let stage = |name: &str| {
        format!("  {name}:\n    resources: {{gpu: 2}}\n    run: {{command: [sh, -c, 'echo start $(date +%s%N) $CUDA_VISIBLE_DEVICES; sleep 0.4; echo end $(date +%s%N)']}}\n")
    };
    let file = home.write(
        "both.yaml",
        &format!(
            "version: 1\nname: both\nstages:\n{}{}",
            stage("g1"),
            stage("g2")
        ),
    );
    let spawn = |file: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_drivetrain"))
            .args(["run", file.to_str().unwrap(), "--parallelism", "2"])
            .current_dir(&home.dir)
            .env_remove("DRIVETRAIN_HOME")
            .env("PATH", &path)
            .env("DRIVETRAIN_HEARTBEAT", "200ms")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let engines: Vec<_> = (0..2).map(|_| spawn(&file)).collect();
    let mut spans = Vec::new();
    for e in engines {
        let o = e.wait_with_output().unwrap();
        assert_ok(&o);
        let id = run_id(&o);
        for s in ["g1", "g2"] {
            let log = text(&home.drivetrain(&["logs", &id, "--stage", s]).stdout);
            assert!(log.contains(&format!("{GPU_A},{GPU_B}")), "{log}");
            spans.push((
                stamp(&log, "start"),
                stamp(&log, "end"),
                format!("{id}/{s}"),
            ));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "{} and {} held the GPUs at once: {spans:?}",
            w[0].2,
            w[1].2
        );
    }

    // A holder killed with -9; the waiter says why it waits, then runs.
    let hold = home.write(
        "hold.yaml",
        "version: 1\nname: hold\nstages:\n  hold:\n    resources: {gpu: 2}\n    run: {command: [sleep, '30']}\n",
    );
    let wait = home.write(
        "wait.yaml",
        "version: 1\nname: wait\nstages:\n  next:\n    resources: {gpu: 1}\n    run: {command: ['true']}\n",
    );
    let mut holder = spawn(&hold);
    let holder_id = first_line_run_id(&mut holder);
    until(&home, &holder_id, "hold", |s| s["phase"] == "Running");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut waiter = spawn(&wait);
    let waiter_id = first_line_run_id(&mut waiter);
    let reason = until_waiting(&home, &waiter_id, "next", "waiting for 1 GPU(s)");
    assert!(
        reason.contains(&format!("by run {holder_id} (hold#1)")),
        "{reason}"
    );
    // A second waiter cancelled while it waits ends at once, its attempt cancelled.
    let mut cancelled = spawn(&wait);
    let cancelled_id = first_line_run_id(&mut cancelled);
    until_waiting(&home, &cancelled_id, "next", "waiting for 1 GPU(s)");
    let asked = std::time::Instant::now();
    assert_ok(&home.drivetrain(&["cancel", &cancelled_id]));
    let o = cancelled.wait_with_output().unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        common::stage(&home.status(&cancelled_id), "next")["phase"],
        "Cancelled"
    );
    let killed = std::time::Instant::now();
    holder.kill().unwrap();
    holder.wait().unwrap();
    let o = waiter.wait_with_output().unwrap();
    assert_ok(&o);
    assert!(
        killed.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
}

/// The nanoseconds on the log's line that starts with `word` (`start 1795…`).
fn stamp(log: &str, word: &str) -> u128 {
    let line = log
        .lines()
        .find(|l| l.starts_with(word))
        .unwrap_or_else(|| panic!("no `{word}` in {log}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The run id a spawned `drivetrain run` prints first.
fn first_line_run_id(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    first
        .trim()
        .strip_prefix("run ")
        .expect("run id first")
        .to_owned()
}

/// Polls `stage` of `run` until its reason starts with `waiting` (20 s at most); the
/// reason then.
fn until_waiting(home: &Home, run: &str, stage_name: &str, waiting: &str) -> String {
    until(home, run, stage_name, |s| {
        s["reason"].as_str().is_some_and(|r| r.starts_with(waiting))
    })
}

/// Polls `stage` of `run` until `ok` holds of it (20 s at most); its reason then.
fn until(
    home: &Home,
    run: &str,
    stage_name: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // The run id is printed before the run is recorded: not found yet is no answer.
        let o = home.drivetrain(&["status", run, "--output", "json"]);
        let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let s = &st["stages"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["stage"] == stage_name).cloned());
        if let Some(s) = s.as_ref().filter(|s| ok(s)) {
            return s["reason"].as_str().unwrap_or_default().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "{st}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The CPU and memory stages declare are held in the home's ledger too: on a machine of
/// two CPUs (`DRIVETRAIN_LOCAL_CPUS`), two engines each running a stage of `cpu: 2` never
/// run them at once, and the one that waits says for what and who holds it. A stage
/// asking more than the machine has runs alone, not never.
#[test]
fn engines_of_one_home_share_the_machines_cpus() {
    let home = Home::new("cpu-ledger");
    let file = home.write(
        "cpu.yaml",
        "version: 1\nname: cpu\nstages:\n  work:\n    resources: {cpu: 2}\n    run: {command: [sh, -c, 'echo start $(date +%s%N); sleep 1; echo end $(date +%s%N)']}\n  huge:\n    needs: [work]\n    resources: {cpu: 64}\n    run: {command: ['true']}\n",
    );
    let cpus = [("DRIVETRAIN_LOCAL_CPUS", "2")];
    let (first, first_id) = common::spawn_run_env(&home, &file, &cpus);
    until(&home, &first_id, "work", |s| s["phase"] == "Running");
    let (second, second_id) = common::spawn_run_env(&home, &file, &cpus);
    let reason = until_waiting(&home, &second_id, "work", "waiting for 2 CPU(s)");
    assert!(
        reason.contains(&format!(
            "the machine's CPU and memory held by run {first_id} (work#1)"
        )),
        "{reason}"
    );
    let mut spans = Vec::new();
    for (engine, id) in [(first, first_id), (second, second_id)] {
        let o = engine.wait_with_output().unwrap();
        assert_ok(&o);
        let log = text(&home.drivetrain(&["logs", &id, "--stage", "work"]).stdout);
        spans.push((stamp(&log, "start"), stamp(&log, "end")));
    }
    spans.sort();
    assert!(
        spans[0].1 <= spans[1].0,
        "the two held the CPUs at once: {spans:?}"
    );
}
