//! End-to-end tests of `drivetrain run` on the local executor: real processes, a real
//! `file://` artifact store and SQLite state, each test in a fresh home directory.

use std::path::Path;
use std::process::Command;

use crate::common;
use common::{
    assert_ok, doctor_layer, pid_alive, run_id, spawn_run, stage, text, wait_dead, wait_for_file,
    Home,
};

/// The host pid of the one process whose command line is exactly `command`: a stage's
/// own `$$` is its PID namespace's, not the host's. Polls up to 30 s.
fn host_pid(command: &str) -> String {
    for _ in 0..300 {
        let o = std::process::Command::new("pgrep")
            .args(["-x", "-f", command])
            .output()
            .expect("pgrep runs");
        let found = text(&o.stdout);
        if let Some(pid) = found.lines().next() {
            return pid.to_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("no process `{command}`");
}

#[test]
fn the_shell_demo_passes_files_between_stages() {
    let home = Home::new("demo");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/shell-demo.yaml");
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--param", "lines=500"]);
    assert_ok(&o);
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Succeeded");
    for s in ["generate", "count", "checksum", "report"] {
        assert_eq!(stage(&st, s)["phase"], "Succeeded", "{st}");
    }
    assert_eq!(stage(&st, "count")["values"]["lines"], 500);
    // The report artifact holds what the last stage computed from its inputs.
    let digest = stage(&st, "report")["outputs"]["report"]["manifest"]
        .as_str()
        .unwrap()
        .to_owned();
    let store = home.dir.join(".drivetrain/artifacts");
    assert!(store.join(&digest).exists(), "manifest {digest}");
    let report =
        std::fs::read_to_string(store.join(format!("runs/{id}/report/1/report/report.txt")))
            .unwrap();
    assert!(
        report.starts_with(&format!("run {id}: 500 lines, sha256 ")),
        "{report}"
    );
    let logs = home.drivetrain(&["logs", &id, "--stage", "count"]);
    assert_eq!(text(&logs.stdout), "counted 500 lines\n");
    let list = home.drivetrain(&["list"]);
    assert!(text(&list.stdout).contains(&id));
}

#[test]
fn a_failed_stage_stops_its_dependants_and_quotes_its_log() {
    let home = Home::new("fail");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: failing
stages:
  noisy:
    run: {command: [sh, -c, 'for i in $(seq 1 30); do echo "line $i"; done; exit 3']}
    outputs: [x]
  after:
    inputs: {x: noisy.x}
    run: {command: [echo, never]}
  independent:
    run: {command: [sh, -c, 'sleep 0.3; echo fine']}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    assert_eq!(st["run"]["phase"], "Failed");
    let noisy = stage(&st, "noisy");
    assert_eq!(noisy["phase"], "Failed");
    assert_eq!(noisy["exit_code"], 3);
    let reason = noisy["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("exited with code 3\nlast 20 log lines:\nline 11\n"),
        "{reason}"
    );
    assert!(reason.ends_with("line 30"), "{reason}");
    assert_eq!(stage(&st, "after")["phase"], "Omitted");
    assert_eq!(stage(&st, "independent")["phase"], "Succeeded");
}

#[test]
fn a_missing_command_is_named() {
    let home = Home::new("enoent");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: typo\nstages:\n  train:\n    run: {command: [pyhton, train.py]}\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stdout).contains("stage `train`: command `pyhton` not found"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let home = Home::new("timeout");
    let pidfile = home.dir.join("grandchild.pid");
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: hung
stages:
  hang:
    timeout: 1s
    run: {{command: [sh, -c, 'sleep 300.101 & echo $! > {}; wait']}}
"#,
            pidfile.display()
        ),
    );
    let grandchild = std::thread::spawn(|| host_pid("sleep 300.101"));
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    let reason = stage(&st, "hang")["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.starts_with("timed out after 1.0s; the process group was killed"),
        "{reason}"
    );
    assert!(pidfile.exists());
    let pid = grandchild.join().unwrap();
    // The grandchild was in the stage's group: it is gone (give the kernel a moment to reap).
    let mut alive = pid_alive(&pid);
    for _ in 0..50 {
        if !alive {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        alive = pid_alive(&pid);
    }
    assert!(!alive, "process {pid} outlived its stage");
}

#[test]
fn retries_rerun_a_failed_attempt() {
    let home = Home::new("retry");
    let counter = home.dir.join("count");
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: flaky
stages:
  flaky:
    retries: {{limit: 2, backoff: 0s}}
    run: {{command: [sh, -c, 'echo x >> {c}; [ $(wc -l < {c}) -ge 2 ]']}}
  strict:
    retries: {{limit: 3, backoff: 0s, on: [75]}}
    run: {{command: [sh, -c, 'exit 1']}}
"#,
            c = counter.display()
        ),
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let st = home.status(&run_id(&o));
    assert_eq!(stage(&st, "flaky")["phase"], "Succeeded");
    assert_eq!(stage(&st, "flaky")["attempts"], 2);
    // Exit 1 is not in `on: [75]`: no retry.
    assert_eq!(stage(&st, "strict")["attempts"], 1);
    assert!(
        text(&o.stdout).contains("↻ flaky: exited with code 1; attempt 2 in"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn conditions_skip_stages_and_optional_inputs_become_absent() {
    let home = Home::new("when");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: conditional
params:
  publish: {type: boolean, default: false}
stages:
  gate:
    run: {command: [sh, -c, 'echo "{\"ok\": false}" > "$DRIVETRAIN_VALUES"']}
  publish:
    when: "params.publish || stages.gate.values.ok"
    run: {command: [sh, -c, 'echo data > "$0/f"', "{{ outputs.data }}"]}
    outputs: [data]
  needs-data:
    inputs: {data: publish.data}
    run: {command: [echo, unreachable]}
  maybe-data:
    inputs: {data: {from: publish.data, optional: true}}
    run: {command: [sh, -c, 'echo "input=[$0]"', "{{ inputs.data }}"]}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(stage(&st, "publish")["phase"], "Skipped");
    assert_eq!(
        stage(&st, "publish")["reason"],
        "`when: params.publish || stages.gate.values.ok` was false"
    );
    assert_eq!(stage(&st, "needs-data")["phase"], "Skipped");
    assert_eq!(stage(&st, "maybe-data")["phase"], "Succeeded");
    let logs = home.drivetrain(&["logs", &id, "--stage", "maybe-data"]);
    assert_eq!(text(&logs.stdout), "input=[]\n");

    // With the param set, the condition holds and the data flows.
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "-p", "publish=true"]);
    assert_eq!(o.status.code(), Some(0));
    let st = home.status(&run_id(&o));
    assert_eq!(stage(&st, "needs-data")["phase"], "Succeeded");
}

#[test]
fn fail_fast_stops_independent_branches() {
    let home = Home::new("failfast");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: fast
stages:
  broken:
    run: {command: [sh, -c, 'exit 2']}
  slow:
    run: {command: [sleep, "300"]}
  later:
    needs: [slow]
    run: {command: [echo, later]}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--fail-fast"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    assert_eq!(stage(&st, "broken")["phase"], "Failed");
    assert_eq!(stage(&st, "slow")["phase"], "Cancelled");
    assert_eq!(stage(&st, "later")["phase"], "Omitted");
}

#[test]
fn distributed_ranks_get_the_rendezvous_environment_and_fail_together() {
    let home = Home::new("ranks");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: ranks
stages:
  train:
    distributed: {workers: 3}
    run: {command: [sh, -c, 'echo "$RANK/$WORLD_SIZE $MASTER_ADDR:$MASTER_PORT" > "$0/rank-$RANK"', "{{ outputs.ranks }}"]}
    outputs: [ranks]
  gang:
    distributed: {workers: 3}
    run: {command: [sh, -c, 'if [ "$RANK" = 1 ]; then exit 4; fi; sleep 300']}
  talk:
    distributed: {workers: 3}
    run: {command: [sh, -c, 'for i in 1 2 3; do printf "r$RANK step $i "; sleep 0.1; printf "done\n"; done; printf "r$RANK end"']}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(stage(&st, "train")["phase"], "Succeeded");
    let dir = home
        .dir
        .join(format!(".drivetrain/artifacts/runs/{id}/train/1/ranks"));
    let mut ports = std::collections::BTreeSet::new();
    for rank in 0..3 {
        let line = std::fs::read_to_string(dir.join(format!("rank-{rank}"))).unwrap();
        let (who, addr) = line.trim().split_once(' ').unwrap();
        assert_eq!(who, format!("{rank}/3"));
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        ports.insert(addr.to_owned());
    }
    assert_eq!(ports.len(), 1, "every rank sees the same MASTER_PORT");
    let gang = stage(&st, "gang");
    assert_eq!(gang["phase"], "Failed");
    assert_eq!(
        gang["reason"],
        "rank 1 exited with code 4; the other ranks were stopped"
    );
    // Ranks writing halves of lines at once: every line of the log whole and led by
    // its rank (as `srun --label`), the unended last line too.
    let logs = home.drivetrain(&["logs", &id, "--stage", "talk"]);
    assert_ok(&logs);
    let log = text(&logs.stdout);
    let mut lines: Vec<&str> = log.lines().collect();
    lines.sort();
    let mut want = Vec::new();
    for r in 0..3 {
        want.extend((1..=3).map(|i| format!("[rank {r}] r{r} step {i} done")));
        want.push(format!("[rank {r}] r{r} end"));
    }
    want.sort();
    assert_eq!(lines, want, "{log}");
}

#[test]
fn bad_outputs_and_values_fail_the_stage() {
    let home = Home::new("badout");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: bad
stages:
  link:
    run: {command: [sh, -c, 'ln -s /etc/passwd "$0/pw"', "{{ outputs.data }}"]}
    outputs: [data]
  values:
    run: {command: [sh, -c, 'echo "[1, 2]" > "$DRIVETRAIN_VALUES"']}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let st = home.status(&run_id(&o));
    let link = stage(&st, "link")["reason"].as_str().unwrap().to_owned();
    assert!(link.contains("holds a symlink `pw`"), "{link}");
    assert_eq!(
        stage(&st, "values")["reason"],
        "values.json is not a JSON object"
    );
}

#[test]
fn run_refuses_bad_params_before_starting() {
    let home = Home::new("params");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/shell-demo.yaml");
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "-p", "lines=many"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("param `lines`: expected an integer, got `many`"));
    assert!(
        !home.dir.join(".drivetrain/state.db").exists(),
        "nothing was recorded"
    );
}

/// The crash-safety promise: `kill -9` of the engine mid-run loses nothing, and
/// `resume` finishes the run without executing succeeded stages again.
#[test]
fn a_killed_engine_loses_nothing_and_resume_finishes_the_run() {
    let home = Home::new("kill9");
    let d = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: crashy
stages:
  first:
    run: {{command: [sh, -c, 'echo run >> {d}/first-count; echo artifact > "$0/a"', "{{{{ outputs.data }}}}"]}}
    outputs: [data]
  second:
    needs: [first]
    run: {{command: [sh, -c, 'if [ -e {d}/marker ]; then exit 0; fi; touch {d}/marker; echo $$ > {d}/second.pid; exec sleep 300.102']}}
  third:
    needs: [second]
    inputs: {{data: first.data}}
    run: {{command: [cat, "{{{{ inputs.data }}}}/a"]}}
"#
        ),
    );
    let (mut engine, id) = spawn_run(&home, &file);
    wait_for_file(&home.dir.join("second.pid"));
    let orphan = host_pid("sleep 300.102");
    let beat = [("DRIVETRAIN_HEARTBEAT", "200ms")];
    let orphaned = |id: &str| {
        let o = home.drivetrain_env(&["status", id, "-o", "json"], &beat);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["orphaned"].clone()
    };
    assert_eq!(
        orphaned(&id),
        false,
        "a beating engine's run is not orphaned"
    );
    engine.kill().unwrap(); // SIGKILL
    engine.wait().unwrap();
    // Three heartbeats missed: `status` and `list` say the run is orphaned and what to do.
    std::thread::sleep(std::time::Duration::from_millis(900));
    assert_eq!(orphaned(&id), true);
    let st = text(&home.drivetrain_env(&["status", &id], &beat).stdout);
    assert!(
        st.contains(&format!(
            "orphaned: the engine of run {id} stopped; `drivetrain resume {id}`"
        )),
        "{st}"
    );
    let list = text(&home.drivetrain_env(&["list"], &beat).stdout);
    assert!(list.contains("Running (orphaned)"), "{list}");

    let before = home.status(&id);
    assert_eq!(
        before["run"]["phase"], "Running",
        "the record shows the run in flight"
    );
    assert_eq!(stage(&before, "second")["phase"], "Running");
    let manifest = stage(&before, "first")["outputs"]["data"].clone();
    // In a prepared sandbox (a root engine's, `doctor` says) the stage ends with its
    // engine: the sandbox's init reads the end of the engine's socket and exits, and its
    // PID namespace with it. Elsewhere it outlives the killed engine until `resume`.
    let doctor = home.drivetrain(&["doctor", "-o", "json"]);
    if doctor_layer(&doctor, "prepared sandboxes")["active"] == true {
        assert!(wait_dead(&orphan), "the stage ended with its engine");
    } else {
        assert!(
            pid_alive(&orphan),
            "the stage outlives the killed engine until resume"
        );
    }

    let o = home.drivetrain(&["resume", &id]);
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("1 of 3 stages succeeded before, 1 attempt(s) lost"),
        "{}",
        text(&o.stdout)
    );
    assert!(
        wait_dead(&orphan),
        "resume stops the orphaned process group"
    );

    let after = home.status(&id);
    assert_eq!(after["run"]["phase"], "Succeeded");
    assert_eq!(
        std::fs::read_to_string(home.dir.join("first-count")).unwrap(),
        "run\n",
        "first ran once"
    );
    assert_eq!(stage(&after, "first")["attempts"], 1);
    assert_eq!(
        stage(&after, "first")["outputs"]["data"],
        manifest,
        "its artifact is the same"
    );
    assert_eq!(stage(&after, "second")["attempts"], 2);
    let logs = home.drivetrain(&["logs", &id, "--stage", "third"]);
    assert_eq!(text(&logs.stdout), "artifact\n");
}

/// `retry` of a run whose engine was killed ends that run (its processes stopped, the
/// reason said) before it starts the new one: no run is left `Running` behind it.
#[test]
fn retry_of_an_orphaned_run_ends_the_orphan() {
    let home = Home::new("retry-orphan");
    let d = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: orphaned
stages:
  first:
    run: {{command: [echo, done]}}
  second:
    needs: [first]
    run: {{command: [sh, -c, 'if [ -e {d}/marker ]; then exit 0; fi; touch {d}/marker; echo $$ > {d}/second.pid; exec sleep 300.104']}}
"#
        ),
    );
    let (mut engine, id) = spawn_run(&home, &file);
    wait_for_file(&home.dir.join("second.pid"));
    let orphan = host_pid("sleep 300.104");
    engine.kill().unwrap(); // SIGKILL
    engine.wait().unwrap();
    let o = home.drivetrain(&["retry", &id]);
    assert_ok(&o);
    assert!(
        text(&o.stderr).contains(&format!(
            "run {id} was orphaned (its engine stopped): ended as Error"
        )),
        "{}",
        text(&o.stderr)
    );
    assert!(wait_dead(&orphan), "the orphan's stage was stopped");
    let old = home.status(&id);
    assert_eq!(old["run"]["phase"], "Error", "{old}");
    assert!(
        old["run"]["reason"]
            .as_str()
            .unwrap()
            .contains("ended by `drivetrain retry`"),
        "{old}"
    );
    assert_eq!(stage(&old, "second")["phase"], "Error");
    let new = home.status(&run_id(&o));
    assert_eq!(new["run"]["phase"], "Succeeded", "{new}");
    assert_eq!(new["run"]["parent"], id.as_str());
    assert_eq!(stage(&new, "first")["origin"], "reused", "{new}");
}

#[test]
fn cancel_stops_a_running_run_from_another_process() {
    let home = Home::new("cancel");
    let d = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: long
stages:
  long:
    run: {{command: [sh, -c, 'echo $$ > {d}/long.pid; exec sleep 300.103']}}
  after:
    needs: [long]
    run: {{command: [echo, after]}}
"#
        ),
    );
    let (mut engine, id) = spawn_run(&home, &file);
    wait_for_file(&home.dir.join("long.pid"));
    let pid = host_pid("sleep 300.103");
    let o = home.drivetrain(&["cancel", &id]);
    assert_ok(&o);
    assert_eq!(engine.wait().unwrap().code(), Some(130));
    assert!(wait_dead(&pid), "the stage's process was stopped");
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Cancelled");
    assert_eq!(stage(&st, "long")["phase"], "Cancelled");
    assert_eq!(stage(&st, "after")["phase"], "Omitted");
}

/// A run driven on another machine of a shared home is cancelled through the state
/// store, by its own engine: its engine's pid means nothing here. Stood for by an engine
/// in a PID namespace of its own, with a pid no process here has (issue 46: `cancel` took
/// the run for an orphan and ended it under its live engine, or sent SIGTERM to whatever
/// had that pid on this machine).
#[test]
fn cancel_reaches_an_engine_whose_pid_is_another_machines() {
    if !crate::isolation::root_or_skip("a PID namespace of its own for the engine") {
        return;
    }
    use std::io::BufRead;
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let far = (pid_max - 200..pid_max - 2)
        .find(|p| {
            !Path::new(&format!("/proc/{p}")).exists()
                && !Path::new(&format!("/proc/{}", p + 1)).exists()
        })
        .unwrap();
    let home = Home::new("cancel-elsewhere");
    let d = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: far\nstages:\n  long:\n    run: {{command: [sh, -c, 'echo $$ > {d}/long.pid; exec sleep 300.109']}}\n"
        ),
    );
    // The engine is the namespace's next pid after `far`.
    let mut engine = in_a_pid_namespace(&home, &file, far)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(engine.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let id = first.trim().strip_prefix("run ").unwrap().to_owned();
    wait_for_file(&home.dir.join("long.pid"));
    let recorded = home.status(&id)["run"]["engine_pid"].clone();
    assert_eq!(recorded, far + 1, "the engine's pid is its namespace's");
    let o = home.drivetrain_env(&["cancel", &id], &[("DRIVETRAIN_HEARTBEAT", "200ms")]);
    assert_ok(&o);
    assert_eq!(
        engine.wait().unwrap().code(),
        Some(130),
        "its engine stopped it"
    );
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Cancelled", "{st}");
    let reason = st["run"]["reason"].as_str().unwrap_or("").to_owned();
    assert!(!reason.contains("engine stopped"), "not an orphan: {st}");
    assert_eq!(stage(&st, "long")["phase"], "Cancelled", "{st}");
}

/// `drivetrain run FILE` in a PID namespace of its own (and its `/proc`), as pid
/// `after + 1` there: an engine of another machine or container.
fn in_a_pid_namespace(home: &Home, file: &Path, after: u32) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "sh",
        "-c",
    ])
    .arg(r#"echo "$1" > /proc/sys/kernel/ns_last_pid && "$0" run "$2""#)
    .arg(env!("CARGO_BIN_EXE_drivetrain"))
    .arg(after.to_string())
    .arg(file)
    .current_dir(&home.dir)
    .env_remove("DRIVETRAIN_HOME")
    .env("DRIVETRAIN_HEARTBEAT", "200ms")
    .stderr(std::process::Stdio::null());
    c
}

/// An engine in another PID namespace on this machine leaves this one's cgroups alone
/// (found in CI: it took them for a dead engine's and removed the pooled ones, and the
/// next attempt here that joined one failed with "No such device").
#[test]
fn an_engine_of_another_pid_namespace_removes_no_cgroup_of_this_ones() {
    if !crate::isolation::root_or_skip("a PID namespace of its own for the other engine") {
        return;
    }
    let home = Home::new("cgroups-other-ns");
    let d = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: here\nstages:\n  a1: {{run: {{command: [true]}}}}\n  a2: {{run: {{command: [true]}}}}\n  b:\n    needs: [a1, a2]\n    run: {{command: [sh, -c, 'echo started > {d}/b-started; until [ -e {d}/go ]; do sleep 0.05; done']}}\n  c1: {{needs: [b], run: {{command: [true]}}}}\n  c2: {{needs: [b], run: {{command: [true]}}}}\n"
        ),
    );
    let other = home.write(
        "other.yaml",
        "version: 1\nname: other\nstages:\n  s: {run: {command: [true]}}\n",
    );
    let mut engine = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["run", file.to_str().unwrap(), "--parallelism", "2"])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // `a1` and `a2` have ended (their cgroups wait in the pool, empty) while `b` runs.
    wait_for_file(&home.dir.join("b-started"));
    let o = in_a_pid_namespace(&home, &other, 1000).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    std::fs::write(home.dir.join("go"), "").unwrap();
    assert_eq!(
        engine.wait().unwrap().code(),
        Some(0),
        "c1 and c2 took the pooled cgroups"
    );
}

#[test]
fn logs_of_a_run_made_only_of_a_map_stage() {
    let home = Home::new("map-logs");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: only-map\nstages:\n  each:\n    map: {items: [a, b]}\n    run: {command: [echo, \"item {{ item }}\"]}\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let logs = home.drivetrain(&["logs", &run_id(&o)]);
    assert_ok(&logs);
    assert_eq!(
        text(&logs.stdout),
        "── each[0] a (attempt 1, Succeeded) ──\nitem a\n── each[1] b (attempt 1, Succeeded) ──\nitem b\n"
    );
}

#[test]
fn map_stages_fan_out_and_fan_in() {
    let home = Home::new("map");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: fanout
params:
  drives: {type: list, default: [d1, d2, d3, bad, d5]}
stages:
  list:
    run: {command: [sh, -c, 'echo "[{\"drive\": \"x\", \"n\": 1}, {\"drive\": \"y\", \"n\": 2}]" > "$0/items.json"', "{{ outputs.items }}"]}
    outputs: [items]
  per-drive:
    map: {param: drives, max_parallel: 2, min_success_ratio: 0.8}
    run:
      command: [sh, -c, 'test "$0" != bad && echo "$0 $DRIVETRAIN_ITEM_INDEX" > "$1/frames.txt"', "{{ item }}", "{{ outputs.frames }}"]
    outputs: [frames]
  per-record:
    map: {from: list.items}
    run:
      command: [sh, -c, 'echo "$0:$1" > "$2/r.txt"', "{{ item.drive }}", "{{ item.n }}", "{{ outputs.out }}"]
    outputs: [out]
  strict:
    map: {items: [ok, fail]}
    run: {command: [sh, -c, 'test "$0" = ok', "{{ item }}"]}
  collect:
    inputs: {frames: per-drive.frames, records: per-record.out}
    run: {command: [sh, -c, 'cat "$0"/*/frames.txt "$1"/*/r.txt', "{{ inputs.frames }}", "{{ inputs.records }}"]}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "strict fails the run: {}",
        text(&o.stdout)
    );
    let id = run_id(&o);
    let st = home.status(&id);
    let per_drive = stage(&st, "per-drive");
    assert_eq!(per_drive["phase"], "Succeeded", "{per_drive}");
    assert_eq!(
        per_drive["values"],
        serde_json::json!({"items": 5, "succeeded": 4, "failed": 1})
    );
    assert_eq!(
        per_drive["reason"],
        "1 of 5 items failed, within min_success_ratio"
    );
    assert_eq!(
        st["items"]["per-drive"],
        serde_json::json!({"Failed": 1, "Succeeded": 4})
    );
    let item_logs = text(
        &home
            .drivetrain(&["logs", &id, "--stage", "per-record"])
            .stdout,
    );
    assert_eq!(
        item_logs,
        "── per-record[0] {\"drive\":\"x\",\"n\":1} (attempt 1, Succeeded) ──\n── per-record[1] {\"drive\":\"y\",\"n\":2} (attempt 1, Succeeded) ──\n"
    );
    let text_status = text(&home.drivetrain(&["status", &id]).stdout);
    assert!(
        text_status.contains("items: 5 (1 failed, 4 succeeded)"),
        "{text_status}"
    );
    let strict = stage(&st, "strict");
    assert_eq!(strict["phase"], "Failed");
    assert!(
        strict["reason"]
            .as_str()
            .unwrap()
            .starts_with("1 of 2 items succeeded, 2 needed"),
        "{strict}"
    );
    assert_eq!(stage(&st, "collect")["phase"], "Succeeded");
    let logs = home.drivetrain(&["logs", &id, "--stage", "collect"]);
    let mut lines: Vec<String> = text(&logs.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    assert_eq!(lines, ["d1 0", "d2 1", "d3 2", "d5 4", "x:1", "y:2"]);
}

#[test]
fn detached_runs_can_be_followed() {
    let home = Home::new("detach");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: ticking
stages:
  tick:
    retries: {limit: 1, backoff: 0s}
    run: {command: [sh, -c, 'if [ "$DRIVETRAIN_ATTEMPT" = 1 ]; then for i in 1 2 3; do echo "tick $i"; sleep 0.2; done; exit 1; fi; echo second']}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--detach"]);
    assert_ok(&o);
    let id = run_id(&o);
    // The background engine records the run; `logs --follow` waits for the stage and
    // prints both attempts as they are written, then returns when the stage has ended.
    let mut follow = None;
    for _ in 0..100 {
        let f = home.drivetrain(&["logs", &id, "--stage", "tick", "--follow"]);
        if f.status.success() {
            follow = Some(f);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let follow = follow.expect("logs --follow succeeded");
    assert_eq!(
        text(&follow.stdout),
        "tick 1\ntick 2\ntick 3\n── tick (attempt 2) ──\nsecond\n"
    );
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Succeeded");
    assert_eq!(stage(&st, "tick")["attempts"], 2);
}

#[test]
fn gpus_are_claimed_exclusively() {
    let home = Home::new("gpus");
    let d = home.dir.display().to_string();
    // Each stage holds a lock directory named after its GPU while it runs: two stages on
    // one GPU at the same time would fail `mkdir`.
    let stage_yaml = |name: &str| {
        format!(
            "  {name}:\n    resources: {{gpu: 1}}\n    run: {{command: [sh, -c, 'mkdir {d}/gpu-$CUDA_VISIBLE_DEVICES && sleep 0.3 && echo $CUDA_VISIBLE_DEVICES >> {d}/used && rmdir {d}/gpu-$CUDA_VISIBLE_DEVICES']}}\n"
        )
    };
    let mut yaml = String::from("version: 1\nname: gpus\nstages:\n");
    for s in ["a", "b", "c", "e"] {
        yaml.push_str(&stage_yaml(s));
    }
    yaml.push_str("  big:\n    resources: {gpu: 3}\n    run: {command: [true]}\n");
    let file = home.write("p.yaml", &yaml);
    let o = home.drivetrain(&[
        "run",
        file.to_str().unwrap(),
        "--gpus",
        "2",
        "--parallelism",
        "4",
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "big cannot run: {}",
        text(&o.stdout)
    );
    let st = home.status(&run_id(&o));
    for s in ["a", "b", "c", "e"] {
        assert_eq!(stage(&st, s)["phase"], "Succeeded", "{st}");
    }
    let mut used: Vec<String> = std::fs::read_to_string(home.dir.join("used"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    used.sort();
    used.dedup();
    assert_eq!(used, ["0", "1"]);
    let big = stage(&st, "big")["reason"].as_str().unwrap().to_owned();
    assert!(
        big.starts_with("stage needs 3 GPU(s); this machine has 2 (0, 1;"),
        "{big}"
    );
}

#[test]
fn a_run_deadline_stops_everything_and_fails_the_run() {
    let home = Home::new("deadline");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: slow\nstages:\n  slow:\n    run: {command: [sleep, '300']}\n  after:\n    needs: [slow]\n    run: {command: [echo]}\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--timeout", "1s"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    assert_eq!(st["run"]["phase"], "Failed");
    assert_eq!(st["run"]["reason"], "run deadline of 1s exceeded");
    assert_eq!(stage(&st, "slow")["phase"], "Cancelled");
    assert_eq!(stage(&st, "after")["phase"], "Omitted");
}

#[test]
fn hooks_run_after_everything_else() {
    let home = Home::new("hooks");
    let pipeline = |fail: bool| {
        format!(
            r#"
version: 1
name: hooked
stages:
  work:
    run: {{command: [sh, -c, 'echo report > "$0/r.txt"; exit {code}', "{{{{ outputs.report }}}}"]}}
    outputs: [report]
  other:
    run: {{command: [sleep, "0.2"]}}
  notify:
    hook: finally
    inputs: {{report: work.report}}
    run: {{command: [sh, -c, 'echo "status=$0 report=[$(cat "$1/r.txt" 2>/dev/null)]"', "{{{{ run.status }}}}", "{{{{ inputs.report }}}}"]}}
  page:
    hook: on_failure
    needs: [notify]
    run: {{command: [echo, paged]}}
"#,
            code = if fail { 1 } else { 0 }
        )
    };
    let ok = home.write("ok.yaml", &pipeline(false));
    let o = home.drivetrain(&["run", ok.to_str().unwrap()]);
    assert_ok(&o);
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(stage(&st, "notify")["phase"], "Succeeded");
    assert_eq!(stage(&st, "page")["phase"], "Skipped");
    assert_eq!(
        stage(&st, "page")["reason"],
        "on_failure hook; the run succeeded"
    );
    let logs = home.drivetrain(&["logs", &id, "--stage", "notify"]);
    assert_eq!(text(&logs.stdout), "status=Succeeded report=[report]\n");

    // A failure: the hooks still run (after fail-fast too), see the failure, and the
    // report input of the failed stage is absent.
    let bad = home.write("bad.yaml", &pipeline(true));
    let o = home.drivetrain(&["run", bad.to_str().unwrap(), "--fail-fast"]);
    assert_eq!(o.status.code(), Some(1));
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Failed");
    assert_eq!(stage(&st, "notify")["phase"], "Succeeded");
    assert_eq!(stage(&st, "page")["phase"], "Succeeded");
    let logs = home.drivetrain(&["logs", &id, "--stage", "notify"]);
    assert_eq!(text(&logs.stdout), "status=Failed report=[]\n");
}

/// Without a mount namespace (`DRIVETRAIN_ISOLATION=off`, or where the kernel gives
/// none) a stage can `chmod` the hard link its input is and write through it: the check of
/// every input against its manifest after the attempt fails the stage.
#[test]
fn a_stage_writing_to_its_input_is_caught() {
    let home = Home::new("tamper");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: tamper
stages:
  make:
    run: {command: [sh, -c, 'echo original > "$0/f"', "{{ outputs.data }}"]}
    outputs: [data]
  vandal:
    inputs: {data: make.data}
    run: {command: [sh, -c, 'chmod u+w "$0/f"; echo vandalised >> "$0/f"', "{{ inputs.data }}"]}
  reader:
    needs: [vandal]
    inputs: {data: make.data}
    run: {command: [cat, "{{ inputs.data }}/f"]}
"#,
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "off")],
    );
    assert_eq!(o.status.code(), Some(1));
    let st = home.status(&run_id(&o));
    let vandal = stage(&st, "vandal")["reason"].as_str().unwrap().to_owned();
    assert!(
        vandal.starts_with("the stage wrote to its input `data` (an artifact of `make`)"),
        "{vandal}"
    );
    assert_eq!(stage(&st, "reader")["phase"], "Omitted");
}

/// With a mount namespace (the default as root, which CI is; `required` makes the test
/// fail rather than pass vacuously elsewhere) the store, the engine's home and the inputs
/// are read-only for a stage: `chmod` and writes through the input, straight into the
/// store and into the state database all fail with EROFS, the stage's own output still
/// works, and the artifact stays as its producer wrote it.
#[test]
fn a_stage_cannot_write_to_its_inputs_or_the_store() {
    let home = Home::new("isolated");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: isolated
stages:
  make:
    run: {command: [sh, -c, 'echo original > "$0/f"', "{{ outputs.data }}"]}
    outputs: [data]
  vandal:
    inputs: {data: make.data}
    outputs: [out]
    run:
      command:
        - sh
        - -c
        - |
          store=${DRIVETRAIN_STORE#file://}
          chmod u+w "$0/f" || echo "chmod refused"
          echo vandalised >> "$0/f" || echo "input refused"
          for f in $(find "$store" -type f -name f); do echo x >> "$f" || echo "store refused"; done
          echo x >> "$store/../state.db" || echo "state refused"
          echo mine > "$1/g" && echo "output written"
        - "{{ inputs.data }}"
        - "{{ outputs.out }}"
  reader:
    needs: [vandal]
    inputs: {data: make.data, out: vandal.out}
    run: {command: [cat, "{{ inputs.data }}/f", "{{ inputs.out }}/g"]}
"#,
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "required")],
    );
    let id = run_id(&o);
    assert_ok(&o);
    let vandal = text(&home.drivetrain(&["logs", &id, "--stage", "vandal"]).stdout);
    for refusal in [
        "chmod refused",
        "input refused",
        "store refused",
        "state refused",
        "output written",
    ] {
        assert!(vandal.contains(refusal), "{refusal}: {vandal}");
    }
    assert!(vandal.contains("Read-only file system"), "{vandal}");
    let reader = text(&home.drivetrain(&["logs", &id, "--stage", "reader"]).stdout);
    assert_eq!(reader, "original\nmine\n");
}

#[test]
fn url_mode_hands_stages_store_urls() {
    let home = Home::new("urlmode");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: urls
stages:
  big:
    run: {command: [sh, -c, 'd=${0#file://}; mkdir -p "$d/part"; echo one > "$d/part/a"; echo two > "$d/b"', "{{ outputs.data }}"]}
    outputs: [{name: data, mode: url}]
  by-url:
    inputs: {data: {from: big.data, mode: url}}
    run: {command: [sh, -c, 'd=${0#file://}; cat "$d/b" "$d/part/a"; echo "$0"', "{{ inputs.data }}"]}
  by-dir:
    inputs: {data: big.data}
    run: {command: [cat, "{{ inputs.data }}/part/a"]}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let id = run_id(&o);
    let by_url = text(&home.drivetrain(&["logs", &id, "--stage", "by-url"]).stdout);
    let lines: Vec<&str> = by_url.lines().collect();
    assert_eq!(lines[..2], ["two", "one"]);
    assert!(
        lines[2].starts_with("file://") && lines[2].ends_with(&format!("/runs/{id}/big/1/data")),
        "{by_url}"
    );
    assert_eq!(
        text(&home.drivetrain(&["logs", &id, "--stage", "by-dir"]).stdout),
        "one\n"
    );
    let st = home.status(&id);
    let manifest = stage(&st, "big")["outputs"]["data"]["manifest"]
        .as_str()
        .unwrap()
        .to_owned();
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(home.dir.join(".drivetrain/artifacts").join(manifest)).unwrap(),
    )
    .unwrap();
    let paths: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["b", "part/a"]);
}

/// A store that refuses writes mid-run (here: the attempt's prefix is blocked by a file,
/// the way a read-only or full volume refuses it; the blocking stage runs without a mount
/// namespace, which would stop it): the stage errs with the store's own reason, the run is
/// not successful, and no manifest of that stage exists.
#[test]
fn a_failing_store_publishes_nothing_half_written() {
    let home = Home::new("badstore");
    let store = home.dir.join("store");
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: badstore
store: file://{store}
stages:
  blocker:
    run: {{command: [sh, -c, 'mkdir -p {store}/runs/$DRIVETRAIN_RUN_ID && touch {store}/runs/$DRIVETRAIN_RUN_ID/victim']}}
  victim:
    needs: [blocker]
    run: {{command: [sh, -c, 'echo data > "$0/f"', "{{{{ outputs.data }}}}"]}}
    outputs: [data]
"#,
            store = store.display()
        ),
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap()],
        &[("DRIVETRAIN_ISOLATION", "off")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(st["run"]["phase"], "Error");
    let victim = stage(&st, "victim");
    assert_eq!(victim["phase"], "Error");
    let reason = victim["reason"].as_str().unwrap();
    // The log went to the run's `logs/`; the output is what the file blocks.
    assert!(
        reason.starts_with("cannot publish output `data`: create"),
        "{reason}"
    );
    assert!(
        reason.contains("Not a directory") || reason.contains("File exists"),
        "the store's own reason: {reason}"
    );
    assert!(!store.join(format!("runs/{id}/victim/1/manifests")).exists());
}

#[test]
fn resume_keeps_the_items_a_map_finished() {
    let home = Home::new("mapresume");
    let d = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: mapcrash
stages:
  each:
    map: {{items: [a, b, hang, d], max_parallel: 1}}
    run: {{command: [sh, -c, 'echo "$0" >> {d}/ran; if [ "$0" = hang ] && [ ! -e {d}/marker ]; then touch {d}/marker; echo $$ > {d}/hang.pid; exec sleep 300.104; fi; echo "$0" > "$1/x"', "{{{{ item }}}}", "{{{{ outputs.out }}}}"]}}
    outputs: [out]
  after:
    inputs: {{all: each.out}}
    run: {{command: [sh, -c, 'cat "$0"/*/x | sort | tr "\n" " "', "{{{{ inputs.all }}}}"]}}
"#
        ),
    );
    let (mut engine, id) = spawn_run(&home, &file);
    wait_for_file(&home.dir.join("hang.pid"));
    let orphan = host_pid("sleep 300.104");
    engine.kill().unwrap();
    engine.wait().unwrap();

    let o = home.drivetrain(&["resume", &id]);
    assert_ok(&o);
    assert!(wait_dead(&orphan), "the item left running was stopped");
    let ran = std::fs::read_to_string(home.dir.join("ran")).unwrap();
    assert_eq!(ran, "a\nb\nhang\nhang\nd\n", "a and b ran once; hang twice");
    assert_eq!(
        text(&home.drivetrain(&["logs", &id, "--stage", "after"]).stdout),
        "a b d hang \n"
    );
}

/// `--parallelism N` bounds the stages' processes running at once, stages and map items
/// alike: each process counts the others running beside it. (What a stage does before
/// and after its process, the engine's bookkeeping, overlaps other processes: that is
/// what keeps a wide fan-out near the fork+exec floor.)
#[test]
fn parallelism_bounds_the_processes_running_at_once() {
    let home = Home::new("parallelism");
    let running = home.dir.join("running");
    std::fs::create_dir_all(&running).unwrap();
    std::fs::set_permissions(
        &running,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let seen = home.dir.join("seen");
    // `$$` is 1 in every stage's PID namespace: each takes a file of its own name.
    let count = format!(
        "f=$(mktemp -p {r}) && ls {r} | wc -l >> {s} && sleep 0.3 && rm $f",
        r = running.display(),
        s = seen.display()
    );
    let mut yaml = String::from("version: 1\nname: wide\nstages:\n");
    for i in 0..6 {
        yaml.push_str(&format!(
            "  s{i}:\n    run: {{command: [sh, -c, '{count}']}}\n"
        ));
    }
    yaml.push_str(&format!(
        "  list:\n    run: {{command: [sh, -c, 'echo [1,2,3,4,5,6] > \"$0/items.json\"', \"{{{{ outputs.items }}}}\"]}}\n    outputs: [items]\n  each:\n    map: {{from: list.items}}\n    run: {{command: [sh, -c, '{count}']}}\n"
    ));
    let file = home.write("p.yaml", &yaml);
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--parallelism", "2"]);
    assert_ok(&o);
    let counts: Vec<u32> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 12, "{counts:?}");
    assert_eq!(counts.iter().max(), Some(&2), "{counts:?}");
}
