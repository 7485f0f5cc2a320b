//! The engine with its state in PostgreSQL (`DRIVETRAIN_STATE`), a real server started by
//! the test (`initdb` + `pg_ctl` on a loopback port): runs recorded by one machine's
//! engine are read by another's, and two `drivetrain serve` replicas on one database fire
//! every cron tick exactly once between them.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{run_id, text, Home};
use drivetrain_engine::testing::Postgres;

#[test]
fn runs_are_recorded_in_postgres_and_read_from_anywhere() {
    let pg = Postgres::start();
    let store = Home::new("pg-store");
    let env = [
        ("DRIVETRAIN_STATE", pg.url()),
        (
            "DRIVETRAIN_STORE",
            format!("file://{}", store.dir.display()),
        ),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Home::new("pg-a");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/shell-demo.yaml");
    let o = a.drivetrain_env(&["run", file, "--param", "lines=20"], &env);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let run = run_id(&o);
    assert!(!a.dir.join(".drivetrain/state.db").exists());
    // Another machine (another home) sees the run, its stages and their values.
    let b = Home::new("pg-b");
    let o = b.drivetrain_env(&["status", &run, "--output", "json"], &env);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
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
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let bad = b.drivetrain_env(&["list"], &[("DRIVETRAIN_STATE", "mysql://x")]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("postgres://"),
        "{}",
        text(&bad.stderr)
    );
}

fn serve(home: &Home, env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["serve", "--pipelines", "scheduled", "--bind", "127.0.0.1:0"])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts")
}

#[test]
fn two_serve_replicas_fire_each_tick_once() {
    let pg = Postgres::start();
    let shared = Home::new("pg-replicas");
    let log = shared.dir.join("fired.txt");
    let env = [
        ("DRIVETRAIN_STATE", pg.url()),
        (
            "DRIVETRAIN_STORE",
            format!("file://{}", shared.dir.join("store").display()),
        ),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
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
schedule: {{cron: "*/2 * * * * *", timezone: UTC, catchup: all, max_catchup: 20}}
stages:
  tick:
    run: {{command: [sh, -c, 'echo "$0" >> {}', "{{{{ schedule.time }}}}"]}}
"#,
                log.display()
            ),
        );
    }
    let mut servers: Vec<Child> = replicas.iter().map(|r| serve(r, &env)).collect();
    let ticks = || -> Vec<(String, String)> {
        let o = replicas[0].drivetrain_env(&["schedule", "list", "--output", "json"], &env);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v[0]["recent_ticks"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["scheduled_time"].as_str().unwrap_or_default().to_owned(),
                    t["outcome"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
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
    assert_eq!(lines.into_iter().collect::<BTreeSet<_>>(), fired);
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
