//! `serve` owns the runs it starts, reruns and resumes: an API rerun runs inside the
//! server's own engine (no child `drivetrain` process in the server's process tree while
//! it runs), and a `kill -9` of the server during that rerun, then a restart, loses and
//! doubles nothing.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::http::{json, start_command, wait_phase, Server, TOKEN};
use common::Home;

/// A pipeline whose second stage waits for the file its `gate` param names.
const GATED: &str = r#"
version: 1
name: gated
params:
  gate: {type: string}
stages:
  first:
    run: {command: [sh, -c, 'echo first']}
  wait:
    needs: [first]
    run: {command: [sh, -c, 'while [ ! -e "$0" ]; do sleep 0.1; done; echo opened', "{{ params.gate }}"]}
"#;

/// `serve` on the home's `served/`, heartbeats every second (a killed server's runs are
/// stale, and so taken over, three seconds after it died).
fn serve(home: &Home) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    cmd.args(["serve", "--pipelines", "served", "--bind", "127.0.0.1:0"])
        .args(["--token", TOKEN])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env_remove("DRIVETRAIN_TOKEN")
        .env("DRIVETRAIN_HEARTBEAT", "1s")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    start_command(cmd)
}

/// Every process below `root`: (pid, argv).
fn descendants(root: u32) -> Vec<(u32, Vec<String>)> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
        .into_iter()
        .skip(1)
        .map(|pid| {
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv = argv
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (pid, argv)
        })
        .collect()
}

/// The stage `name` of a run's status.
fn stage(v: &serde_json::Value, name: &str) -> serde_json::Value {
    v["stages"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["stage"] == name))
        .cloned()
        .unwrap_or_default()
}

/// Waits until the run's stage `name` is `Running`.
fn wait_running(s: &Server, run: &str, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = json(s, "GET", &format!("/api/v1/runs/{run}"), None);
        if stage(&v, name)["phase"] == "Running" {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never ran: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_api_rerun_runs_in_the_server_and_survives_its_kill() {
    let home = Home::new("in-process");
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write("served/gated.yaml", GATED);
    let open = home.dir.join("open");
    std::fs::write(&open, "").unwrap();
    let gate = home.dir.join("gate");
    let mut s = serve(&home);

    let body = serde_json::json!({"pipeline": "gated", "params": {"gate": open}});
    let (code, v) = json(&s, "POST", "/api/v1/runs", Some(&body.to_string()));
    assert_eq!(code, 201, "{v}");
    let first = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &first, "Succeeded");

    let body = serde_json::json!({"stages": ["wait"], "params": {"gate": gate}});
    let (code, v) = json(
        &s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some(&body.to_string()),
    );
    assert_eq!(code, 201, "{v}");
    let rerun = v["run"].as_str().unwrap().to_owned();
    wait_running(&s, &rerun, "wait");

    // While the rerun's stage runs: its process is the server's descendant, and no
    // `drivetrain` engine (run, rerun, retry, resume) is. (The stage is recorded running
    // just before its process execs: until then it shows the server's argv.)
    let names_gate = |tree: &[(u32, Vec<String>)]| {
        tree.iter()
            .any(|(_, argv)| argv.iter().any(|a| a.contains(&*gate.to_string_lossy())))
    };
    let mut tree = descendants(s.child.id());
    for _ in 0..100 {
        if names_gate(&tree) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        tree = descendants(s.child.id());
    }
    assert!(
        names_gate(&tree),
        "the stage's process is not below the server: {tree:?}"
    );
    let engines: Vec<_> = tree
        .iter()
        .filter(|(_, argv)| {
            argv.first().is_some_and(|a| a.ends_with("drivetrain"))
                && argv
                    .get(1)
                    .is_some_and(|c| ["run", "rerun", "retry", "resume"].contains(&c.as_str()))
        })
        .collect();
    assert!(engines.is_empty(), "child engines: {engines:?}");
    let (_, v) = json(&s, "GET", &format!("/api/v1/runs/{rerun}"), None);
    assert_eq!(
        v["run"]["engine_pid"],
        s.child.id(),
        "the server is the rerun's engine: {v}"
    );

    // kill -9 during the rerun, the gate opened while no server runs, a new server.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    std::fs::write(&gate, "").unwrap();
    let s = serve(&home);
    let done = wait_until_ended(&s, &rerun);
    assert_eq!(done["run"]["phase"], "Succeeded", "{done}");
    assert_eq!(done["run"]["parent"], first.as_str());
    let (first_stage, wait) = (stage(&done, "first"), stage(&done, "wait"));
    assert_eq!(first_stage["phase"], "Succeeded", "{done}");
    assert_eq!(
        first_stage["attempts"], 0,
        "`first` is the parent's, never executed again: {done}"
    );
    assert_eq!(wait["phase"], "Succeeded", "{done}");
    assert_eq!(
        wait["attempts"], 2,
        "the lost attempt ran once more: {done}"
    );
    // Nothing doubled: the two runs, the parent untouched.
    let (_, list) = json(&s, "GET", "/api/v1/runs", None);
    let runs = list["runs"].as_array().expect("a run list");
    assert_eq!(runs.len(), 2, "{list}");
    let (_, parent) = json(&s, "GET", &format!("/api/v1/runs/{first}"), None);
    assert_eq!(parent["run"]["phase"], "Succeeded", "{parent}");
    assert_eq!(stage(&parent, "wait")["attempts"], 1, "{parent}");
}

/// The run's status once it has ended (a resumed run may take a heartbeat's staleness to
/// be taken over).
fn wait_until_ended(s: &Server, run: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = json(s, "GET", &format!("/api/v1/runs/{run}"), None);
        let phase = v["run"]["phase"].as_str().unwrap_or("");
        if !["Running", "Pending", ""].contains(&phase) {
            return v;
        }
        assert!(Instant::now() < deadline, "run {run} never ended: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A cancel asked of a server that does not drive the run: recorded in the state store,
/// and the server that drives it stops it (issue 46: the cancel signalled the other
/// server's whole process, which began shutting down while the run went on).
#[test]
fn a_cancel_through_another_server_of_the_home_stops_the_run() {
    let home = Home::new("cancel-elsewhere");
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write("served/gated.yaml", GATED);
    let (a, b) = (serve(&home), serve(&home));
    let gate = home.dir.join("never-opened");
    let body = format!(
        r#"{{"pipeline": "gated", "params": {{"gate": "{}"}}}}"#,
        gate.display()
    );
    let (code, v) = json(&a, "POST", "/api/v1/runs", Some(&body));
    assert_eq!(code, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    wait_running(&a, &run, "wait");
    let (code, v) = json(&b, "POST", &format!("/api/v1/runs/{run}/cancel"), None);
    assert_eq!(code, 202, "{v}");
    let ended = wait_until_ended(&a, &run);
    assert_eq!(ended["run"]["phase"], "Cancelled", "{ended}");
    assert_eq!(stage(&ended, "wait")["phase"], "Cancelled", "{ended}");
    // Both servers still answer: nothing but the run was stopped.
    for s in [&a, &b] {
        assert_eq!(json(s, "GET", "/api/v1/runs", None).0, 200);
    }
    // Once ended, a cancel is a conflict; a run that does not exist is 404.
    let (code, _) = json(&b, "POST", &format!("/api/v1/runs/{run}/cancel"), None);
    assert_eq!(code, 409);
    let (code, _) = json(&b, "POST", "/api/v1/runs/no-such-run/cancel", None);
    assert_eq!(code, 404);
}
