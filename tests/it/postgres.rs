//! The engine with its state in PostgreSQL (`DRIVETRAIN_STATE`), a real server started by
//! the test (`initdb` + `pg_ctl` on a loopback port): runs recorded by one machine's
//! engine are read by another's, and two `drivetrain serve` replicas on one database fire
//! every cron tick exactly once between them.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::{assert_ok, env_pairs, run_id, text, Home};
use drivetrain_engine::testing::Postgres;

/// The state in PostgreSQL and artifacts under `store`, which every home shares.
fn shared_env(
    pg: &Postgres,
    store: &std::path::Path,
    extra: &[(&str, &str)],
) -> std::collections::BTreeMap<String, String> {
    let mut env = std::collections::BTreeMap::from([
        ("DRIVETRAIN_STATE".to_owned(), pg.url()),
        (
            "DRIVETRAIN_STORE".to_owned(),
            format!("file://{}", store.display()),
        ),
    ]);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

#[test]
fn runs_are_recorded_in_postgres_and_read_from_anywhere() {
    let pg = Postgres::start();
    let store = Home::new("pg-store");
    let env = shared_env(&pg, &store.dir, &[]);
    let env = env_pairs(&env);
    let a = Home::new("pg-a");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/shell-demo.yaml");
    let o = a.drivetrain_env(&["run", file, "--param", "lines=20"], &env);
    assert_ok(&o);
    let run = run_id(&o);
    assert!(!a.dir.join(".drivetrain/state.db").exists());
    // Another machine (another home) sees the run, its stages and their values (`--state`
    // instead of the variable).
    let b = Home::new("pg-b");
    let o = b.drivetrain_env(
        &["--state", &pg.url(), "status", &run, "--output", "json"],
        &env[1..],
    );
    assert_ok(&o);
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["run"]["phase"], "Succeeded", "{st}");
    let count = st["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "count")
        .unwrap();
    assert_eq!(count["values"]["lines"], 20);
    // A rerun from the other machine reuses what the first recorded.
    let o = b.drivetrain_env(&["rerun", &run, "--stage", "report"], &env);
    assert_ok(&o);
    let bad = b.drivetrain_env(&["list"], &[("DRIVETRAIN_STATE", "mysql://x")]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("postgres://"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn two_serve_replicas_fire_each_tick_once() {
    let pg = Postgres::start();
    let shared = Home::new("pg-replicas");
    let log = shared.dir.join("fired.txt");
    let env = shared_env(&pg, &shared.dir.join("store"), &[]);
    let env = env_pairs(&env);
    let replicas: Vec<Home> = (0..2)
        .map(|i| Home::new(&format!("pg-replica-{i}")))
        .collect();
    for r in &replicas {
        std::fs::create_dir_all(r.dir.join("scheduled")).unwrap();
        r.write(
            "scheduled/every2s.yaml",
            &format!(
                r#"
version: 1
name: every2s
schedule: {{cron: "*/2 * * * * *", seconds: true, timezone: UTC, catchup: all, max_catchup: 20}}
stages:
  tick:
    run: {{command: [sh, -c, 'echo "$0" >> {}', "{{{{ schedule.time }}}}"]}}
"#,
                log.display()
            ),
        );
    }
    let mut servers: Vec<Child> = replicas.iter().map(|r| r.serve(&env)).collect();
    let ticks = || replicas[0].ticks(&env);
    let deadline = Instant::now() + Duration::from_secs(40);
    while ticks().iter().filter(|t| t.1 == "fired").count() < 5 {
        assert!(
            Instant::now() < deadline,
            "no 5 ticks within 40 s: {:?}",
            ticks()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    for s in &servers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(s.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }
    for s in &mut servers {
        assert!(s.wait().unwrap().success());
    }
    let all = ticks();
    let times: BTreeSet<&String> = all.iter().map(|t| &t.0).collect();
    assert_eq!(times.len(), all.len(), "a tick recorded twice: {all:?}");
    let fired: BTreeSet<&str> = all
        .iter()
        .filter(|t| t.1 == "fired")
        .map(|t| t.0.as_str())
        .collect();
    // Each fired tick ran exactly once, on one replica or the other.
    let ran = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = ran.lines().collect();
    lines.sort();
    let before = lines.len();
    lines.dedup();
    assert_eq!(before, lines.len(), "a tick ran twice: {ran}");
    // What each replica said and how the runs ended, should a fired tick not have run.
    let said = || {
        let runs = text(
            &replicas[1]
                .drivetrain_env(&["list", "--output", "json"], &env)
                .stdout,
        );
        let logs: Vec<String> = replicas
            .iter()
            .map(|r| std::fs::read_to_string(r.dir.join("serve.err")).unwrap_or_default())
            .collect();
        format!("runs: {runs}\nserve.err: {logs:#?}")
    };
    assert_eq!(
        lines.into_iter().collect::<BTreeSet<_>>(),
        fired,
        "{}",
        said()
    );
    // One run per fired tick in the shared database.
    let o = replicas[1].drivetrain_env(&["list", "--output", "json"], &env);
    let runs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cron_runs = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "schedule")
        .count();
    assert_eq!(cron_runs, fired.len(), "{runs}");
}

/// An engine killed (-9) in the middle of a run, on a "machine" whose process ids mean
/// nothing to the others: the serving replica sees its heartbeat stop and takes the run
/// over; what succeeded is kept and the lost stage runs again.
#[test]
fn a_replica_takes_over_the_run_of_a_dead_engine() {
    let pg = Postgres::start();
    let shared = Home::new("pg-takeover");
    let log = shared.dir.join("ran.txt");
    let env = shared_env(
        &pg,
        &shared.dir.join("store"),
        &[("DRIVETRAIN_HEARTBEAT", "500ms")],
    );
    let env = env_pairs(&env);
    let replica = Home::new("pg-takeover-serve");
    std::fs::create_dir_all(replica.dir.join("scheduled")).unwrap();
    replica.write(
        "scheduled/idle.yaml",
        "version: 1\nname: idle\nstages:\n  noop:\n    run: {command: [true]}\n",
    );
    let mut server = replica.serve(&env);

    let engine_home = Home::new("pg-takeover-engine");
    let file = engine_home.write(
        "slow.yaml",
        &format!(
            r#"version: 1
name: slow
stages:
  first:
    run: {{command: [sh, -c, 'echo first >> {log}']}}
  slow:
    needs: [first]
    run: {{command: [sh, -c, 'echo "slow $DRIVETRAIN_ATTEMPT" >> {log}; if [ "$DRIVETRAIN_ATTEMPT" = 1 ]; then sleep 60; fi']}}
    retries: {{limit: 2, backoff: 1s, on: [lost]}}
  last:
    needs: [slow]
    run: {{command: [sh, -c, 'echo last >> {log}']}}
"#,
            log = log.display()
        ),
    );
    let mut engine = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["run", file.to_str().unwrap()])
        .current_dir(&engine_home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("slow 1")
    {
        assert!(Instant::now() < deadline, "the slow stage never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    engine.kill().unwrap();
    engine.wait().unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(engine.stdout.as_mut().unwrap(), &mut out).unwrap();
    let run = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("run "))
        .unwrap()
        .to_owned();

    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let o = replica.drivetrain_env(&["status", &run, "--output", "json"], &env);
        let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if st["run"]["phase"] == "Succeeded" {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} was not taken over and finished: {st}\n{}{}",
            std::fs::read_to_string(replica.dir.join("serve.log")).unwrap_or_default(),
            std::fs::read_to_string(replica.dir.join("serve.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    server.wait().unwrap();
    let ran = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = ran.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| **l == "first").count(),
        1,
        "what succeeded is kept: {ran}"
    );
    assert!(lines.contains(&"slow 2"), "the lost stage ran again: {ran}");
    assert_eq!(lines.last(), Some(&"last"), "{ran}");
    let slow = status["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "slow")
        .unwrap();
    assert_eq!(slow["attempts"], 2, "{status}");
}

/// Two `serve` replicas on one PostgreSQL database, watching the same prefix with the
/// same trigger: both list every object, and each object still goes to exactly one run
/// (the inbox's claims skip each other's locked rows).
#[test]
fn two_serve_replicas_consume_each_landed_object_once() {
    const OBJECTS: usize = 60;
    let pg = Postgres::start();
    let shared = Home::new("pg-trigger");
    let incoming = shared.dir.join("incoming");
    std::fs::create_dir_all(&incoming).unwrap();
    let env = shared_env(&pg, &shared.dir.join("store"), &[]);
    let env = env_pairs(&env);
    let replicas: Vec<Home> = (0..2)
        .map(|i| Home::new(&format!("pg-trigger-{i}")))
        .collect();
    for r in &replicas {
        std::fs::create_dir_all(r.dir.join("scheduled")).unwrap();
        r.write(
            "scheduled/landed.yaml",
            &format!(
                r#"
version: 1
name: landed
triggers:
  logs:
    objects: {{source: "file://{}/", match: "*.mcap", poll: 200ms}}
    batch: {{min_items: 3, max_items: 5, max_wait: 1s}}
stages:
  a:
    run: {{command: ["true"]}}
"#,
                incoming.display()
            ),
        );
    }
    let mut servers: Vec<Child> = replicas.iter().map(|r| r.serve(&env)).collect();
    for i in 0..OBJECTS {
        // Written aside and renamed in: a listing never sees a file half written.
        let tmp = incoming.join(format!(".d{i:03}.part"));
        std::fs::write(&tmp, i.to_string()).unwrap();
        std::fs::rename(&tmp, incoming.join(format!("d{i:03}.mcap"))).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    let list = || -> Vec<serde_json::Value> {
        let o = replicas[0].drivetrain_env(&["list", "-n", "1000", "-o", "json"], &env);
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let runs = loop {
        let o = replicas[1].drivetrain_env(&["trigger", "show", "logs", "-o", "json"], &env);
        let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let runs = list();
        let ended = runs.iter().all(|r| r["phase"] != "Running");
        if t["consumed"] == OBJECTS as u64 && ended {
            break runs;
        }
        assert!(Instant::now() < deadline, "not all consumed in 60 s: {t}");
        std::thread::sleep(Duration::from_millis(300));
    };
    for s in &mut servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    let mut seen = BTreeSet::new();
    for r in &runs {
        assert_eq!(r["phase"], "Succeeded", "{r}");
        let id = r["id"].as_str().unwrap();
        let o = replicas[0].drivetrain_env(&["status", id, "-o", "json"], &env);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let objects = v["trigger"]["objects"].as_array().unwrap();
        assert!((1..=5).contains(&objects.len()), "{v}");
        for o in objects {
            assert!(
                seen.insert(o["url"].as_str().unwrap().to_owned()),
                "{o} twice"
            );
        }
    }
    assert_eq!(seen.len(), OBJECTS);
}
