//! Priorities and preemption of GPU stages under `drivetrain serve` (`scheduling:`): the
//! real server on loopback, its runs in one process, on a machine of two GPUs as
//! `DRIVETRAIN_LOCAL_GPUS` says (no GPU here; which attempt holds which device is the
//! ledger's, the real code path).

use std::time::{Duration, Instant};

use crate::common;
use common::http::{json, request, start_wrapped, wait_phase, Server, TOKEN};
use common::Home;

/// A pipeline of one stage asking both GPUs with `scheduling` (YAML): a trainer of 12
/// steps of 0.25 s that keeps its step and its sum of squares in its checkpoints, resumes
/// from them, and saves them on SIGTERM. Alone it ends with `{"steps": 12, "sum": 650}`.
pub(crate) fn resuming_trainer(scheduling: &str) -> String {
    format!(
        r#"version: 1
name: train
stages:
  train:
    resources: {{gpu: 2}}
    scheduling: {scheduling}
    run:
      command:
        - sh
        - -c
        - |
          c="$DRIVETRAIN_CHECKPOINTS/state"
          i=0; sum=0
          if [ -f "$c" ]; then read i sum < "$c"; echo "resumed from step $i"; fi
          trap 'echo "$i $sum" > "$c"; echo "stopped at step $i"; exit 143' TERM
          while [ "$i" -lt 12 ]; do
            i=$((i+1)); sum=$((sum+i*i)); echo "step $i"
            echo "$i $sum" > "$c"
            sleep 0.25 & wait $!
          done
          echo "{{\"steps\": $i, \"sum\": $sum}}" > "$DRIVETRAIN_VALUES"
"#
    )
}

fn pipelines(home: &Home) {
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write(
        "served/train.yaml",
        &resuming_trainer("{priority: 1, preemptible: true, grace: 5s}"),
    );
    let holder = |name: &str, scheduling: &str, command: &str| {
        format!("version: 1\nname: {name}\nstages:\n  {name}:\n    resources: {{gpu: 2}}\n    scheduling: {scheduling}\n    run: {{command: [sh, -c, '{command}']}}\n")
    };
    home.write(
        "served/urgent.yaml",
        &holder(
            "urgent",
            "{priority: urgent}",
            "echo on $CUDA_VISIBLE_DEVICES; sleep 0.5",
        ),
    );
    home.write(
        "served/unknown.yaml",
        &holder("unknown", "{priority: nope}", "true"),
    );
    home.write(
        "served/steady.yaml",
        &holder("steady", "{priority: 0, preemptible: false}", "sleep 3"),
    );
}

fn submit(s: &Server, pipeline: &str) -> String {
    let body = format!(r#"{{"pipeline": "{pipeline}"}}"#);
    let (status, v) = json(s, "POST", "/api/v1/runs", Some(&body));
    assert_eq!(status, 201, "{v}");
    v["run"].as_str().unwrap().to_owned()
}

/// The run's stage `name` once `ok` holds of it (30 s at most).
fn until(
    s: &Server,
    run: &str,
    name: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = json(s, "GET", &format!("/api/v1/runs/{run}"), None);
        let found = v["stages"]
            .as_array()
            .and_then(|a| a.iter().find(|st| st["stage"] == name).cloned());
        if let Some(st) = found.filter(|st| ok(st)) {
            return st;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn attempts(s: &Server, run: &str) -> Vec<serde_json::Value> {
    let (status, v) = json(s, "GET", &format!("/api/v1/runs/{run}/attempts"), None);
    assert_eq!(status, 200, "{v}");
    v["attempts"].as_array().unwrap().clone()
}

/// A priority-10 stage submitted while a preemptible priority-1 stage holds both GPUs
/// starts within seconds; the preempted attempt ends `Preempted` (not failed, not a
/// retry), waits, resumes from its checkpoint and ends with what it would have alone. A
/// stage that is not preemptible is never preempted: the urgent one waits its turn, first
/// in the queue, and says so.
#[test]
fn a_higher_priority_stage_preempts_a_preemptible_one_which_resumes() {
    let home = Home::new("preempt");
    pipelines(&home);
    // A machine of two GPUs (`DRIVETRAIN_LOCAL_GPUS`).
    let s = start_wrapped(
        &home,
        &["env", "DRIVETRAIN_LOCAL_GPUS=2"],
        &["--token", TOKEN],
    );
    // A project's weight (its share when projects contend) is kept with its quota.
    let o = home.drivetrain(&["project", "quota", "vision", "--weight", "4"]);
    common::assert_ok(&o);
    assert!(common::text(&o.stdout).contains("weight 4"));
    let list: serde_json::Value =
        serde_json::from_slice(&home.drivetrain(&["project", "list", "-o", "json"]).stdout)
            .unwrap();
    assert_eq!(list["vision"]["quota"]["weight"], 4, "{list}");
    // `urgent` is a class of this home's: priority 10.
    common::assert_ok(&home.drivetrain(&["queue", "class", "urgent", "10"]));
    let unknown = submit(&s, "unknown");
    let failed = wait_phase(&s, &unknown, "Error");
    assert!(
        failed
            .to_string()
            .contains("priority class `nope` is not defined in this home (defined: urgent (10))"),
        "{failed}"
    );

    let low = submit(&s, "train");
    until(&s, &low, "train", |st| st["phase"] == "Running");
    // Let it take a few steps (and checkpoint them).
    std::thread::sleep(Duration::from_millis(1200));
    let asked = Instant::now();
    let urgent = submit(&s, "urgent");
    wait_phase(&s, &urgent, "Succeeded");
    let first = attempts(&s, &urgent)[0]["started_at"].clone();
    eprintln!(
        "the urgent stage started {first}; asked {:?} ago",
        asked.elapsed()
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );

    let done = wait_phase(&s, &low, "Succeeded");
    let train = done["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["stage"] == "train")
        .unwrap()
        .clone();
    assert_eq!(
        train["values"],
        serde_json::json!({"steps": 12, "sum": 650}),
        "{train}"
    );
    let tries = attempts(&s, &low);
    let phases: Vec<&str> = tries.iter().map(|a| a["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["Preempted", "Succeeded"], "{tries:?}");
    let why = tries[0]["reason"].as_str().unwrap();
    assert!(
        why.starts_with(&format!(
            "preempted by urgent#1 of run {urgent} (priority 10): SIGTERM"
        )),
        "{why}"
    );
    let (_, log) = request(
        &s,
        "GET",
        &format!("/api/v1/runs/{low}/logs?stage=train"),
        Some(TOKEN),
        None,
    );
    assert!(log.contains("resumed from step "), "{log}");
    assert!(
        !log.lines().any(|l| l == "step 1"),
        "it started over: {log}"
    );

    // Not preemptible: the urgent stage waits, first in the queue, and says for what.
    let steady = submit(&s, "steady");
    until(&s, &steady, "steady", |st| st["phase"] == "Running");
    std::thread::sleep(Duration::from_millis(300));
    let urgent = submit(&s, "urgent");
    let waiting = until(&s, &urgent, "urgent", |st| {
        st["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("waiting for 2 GPU(s)"))
    });
    let reason = waiting["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("by run {steady} (steady#1)")),
        "{reason}"
    );
    assert!(reason.contains("place 1 of 1"), "{reason}");
    assert!(!reason.contains("preempting"), "{reason}");
    // `/metrics` counts it per queue.
    let (_, m) = request(&s, "GET", "/metrics", Some(TOKEN), None);
    for line in [
        "drivetrain_gpu_queue_depth{queue=\"default\"} 1",
        "drivetrain_gpus_held{queue=\"default\"} 2",
        "drivetrain_gpu_queue_oldest_wait_seconds{queue=\"default\"} ",
    ] {
        assert!(m.contains(line), "{line} in:\n{m}");
    }
    // `list` says why the run waits.
    let list = common::text(&home.drivetrain(&["list"]).stdout);
    let line = list
        .lines()
        .find(|l| l.starts_with(urgent.as_str()))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        line.ends_with("(urgent#1 waits for 2 GPU(s), place 1)"),
        "{line}"
    );
    // `drivetrain queue` says the same from the ledger, by queue.
    let q = home.drivetrain(&["queue", "-o", "json"]);
    common::assert_ok(&q);
    let q: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    let entries = q["entries"].as_array().unwrap();
    let find = |holder: &str| {
        entries
            .iter()
            .find(|e| e["holder"] == holder)
            .unwrap_or_else(|| panic!("{q}"))
    };
    let (held, waits) = (find("steady#1"), find("urgent#1"));
    assert_eq!(held["state"], "holding", "{q}");
    assert_eq!(held["devices"], serde_json::json!(["0", "1"]), "{q}");
    assert_eq!(held["preemptible"], false, "{q}");
    assert_eq!(
        (
            waits["state"].as_str(),
            waits["place"].as_u64(),
            waits["gpus"].as_u64(),
            waits["priority"].as_i64()
        ),
        (Some("waiting"), Some(1), Some(2), Some(10)),
        "{q}"
    );
    assert_eq!(waits["run"], urgent.as_str(), "{q}");
    let text = common::text(&home.drivetrain(&["queue"]).stdout);
    assert!(
        text.starts_with("priority classes: urgent = 10\nqueue default:\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "waiting  urgent#1 of run {urgent} (pipeline urgent"
        )),
        "{text}"
    );
    wait_phase(&s, &steady, "Succeeded");
    wait_phase(&s, &urgent, "Succeeded");
    let phases: Vec<serde_json::Value> = attempts(&s, &steady)
        .iter()
        .map(|a| a["phase"].clone())
        .collect();
    assert_eq!(phases, ["Succeeded"]);
}

/// `doctor` lists the ledger's claims and says which are stale: a claim left by a run
/// that ended (the next claim frees it).
#[test]
fn doctor_marks_claims_of_ended_runs_stale() {
    use drivetrain_engine::state::{DeviceStore as _, GpuAsk, RunId, SqliteState};
    let home = Home::new("doctor-ledger");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: g\nstages:\n  g:\n    resources: {gpu: 1}\n    run: {command: [\"true\"]}\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--gpus", "1"]);
    common::assert_ok(&o);
    let run = common::run_id(&o);
    let doctor = |home: &Home| -> serde_json::Value {
        let o = home.drivetrain(&["doctor", "-o", "json"]);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["gpu_claims"].clone()
    };
    assert_eq!(
        doctor(&home),
        serde_json::json!([]),
        "the run gave its GPU back"
    );
    // A claim its ended run left (as an engine that died between claiming and recording
    // its end would).
    let state = SqliteState::open(&home.dir.join(".drivetrain/state.db")).unwrap();
    let devices = ["0".to_owned()];
    let id = RunId(run.clone());
    let ask = GpuAsk {
        host: "elsewhere",
        devices: &devices,
        count: 1,
        cpu_millis: 0,
        memory_bytes: 0,
        capacity: drivetrain_engine::state::Capacity {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
        },
        run: &id,
        holder: "g#9",
        queue: "default",
        project: "default",
        priority: 0,
        preemptible: false,
        stale_before: "2000-01-01T00:00:00.000Z",
        waits_stale_before: "2000-01-01T00:00:00.000Z",
    };
    assert!(matches!(
        state.claim_gpus(&ask).unwrap(),
        drivetrain_engine::state::Claimed::Granted(_)
    ));
    let claims = doctor(&home);
    assert_eq!(claims[0]["holder"], "g#9", "{claims}");
    assert_eq!(claims[0]["stale"], true, "{claims}");
    let text = common::text(&home.drivetrain(&["doctor"]).stdout);
    assert!(
        text.contains(&format!("elsewhere:0 run {run} (g#9) since "))
            && text.contains("— stale: its run ended, the next claim frees it"),
        "{text}"
    );
}
