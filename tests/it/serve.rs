//! `drivetrain serve` as a real process on the wall clock, with a schedule firing every
//! two seconds: runs start on their ticks with `{{ schedule.time }}`, a `kill -9` and a
//! restart neither fire a tick twice nor lose one, and suspend/resume from the command line
//! stop and restart firing without a backlog. (The scheduling rules themselves, daylight
//! saving and catch-up after long downtime, are tested with an injected clock in
//! `engine/src/schedule.rs`.)

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common;
use common::{assert_ok, text, Home};

fn start(home: &Home) -> Child {
    home.serve(&[])
}

/// The recorded ticks: (scheduled time, outcome, run id).
fn ticks(home: &Home) -> Vec<(String, String, Option<String>)> {
    home.ticks(&[])
}

fn wait_for(home: &Home, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while ticks(home).len() < n {
        assert!(
            Instant::now() < deadline,
            "no {n} ticks within 30 s: {:?}",
            ticks(home)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn ticks_fire_once_across_a_kill_and_restart() {
    let home = Home::new("serve");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let log = home.dir.join("fired.txt");
    home.write(
        "scheduled/every2s.yaml",
        &format!(
            r#"
version: 1
name: every2s
schedule: {{cron: "*/2 * * * * *", seconds: true, timezone: Europe/Berlin, catchup: all, max_catchup: 20}}
stages:
  tick:
    run: {{command: [sh, -c, 'echo "$0" >> {}', "{{{{ schedule.time }}}}"]}}
"#,
            log.display()
        ),
    );
    let mut server = start(&home);
    wait_for(&home, 2);
    // kill -9 mid-flight, then start again at once.
    server.kill().unwrap();
    server.wait().unwrap();
    let before = ticks(&home).len();
    let mut server = start(&home);
    wait_for(&home, before + 2);

    // Suspended: no new ticks; resumed without catch-up: no backlog either.
    let o = home.drivetrain(&["schedule", "suspend", "every2s"]);
    assert_ok(&o);
    std::thread::sleep(Duration::from_millis(1500));
    let at_suspend = ticks(&home).len();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        ticks(&home).len(),
        at_suspend,
        "a suspended schedule fires nothing"
    );
    let resumed_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    home.drivetrain(&["schedule", "resume", "every2s"]);
    wait_for(&home, at_suspend + 1);
    // Nothing scheduled while suspended was recorded: every new tick is after the resume.
    let after_resume = ticks(&home);
    for (t, _, _) in after_resume.iter().skip(at_suspend) {
        assert!(
            t.as_str() >= resumed_at.as_str(),
            "tick {t} before the resume at {resumed_at}: {after_resume:?}"
        );
    }

    // SIGTERM: graceful, the runs in flight finish.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");

    let all = ticks(&home);
    let times: BTreeSet<&String> = all.iter().map(|t| &t.0).collect();
    assert_eq!(times.len(), all.len(), "no tick recorded twice: {all:?}");
    // Every tick from the first to the one before the suspension is there (fired or
    // skipped): none lost across the kill.
    let parse = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
    let first = parse(&all[0].0);
    let before_suspend: Vec<_> = all.iter().take(at_suspend).map(|t| parse(&t.0)).collect();
    for (i, t) in before_suspend.iter().enumerate() {
        assert_eq!(
            (*t - first).num_seconds(),
            2 * i as i64,
            "gap before {t}: {all:?}"
        );
    }
    // Each fired tick ran exactly once, with its scheduled time.
    let fired: Vec<&String> = all
        .iter()
        .filter(|t| t.1 == "fired")
        .map(|t| &t.0)
        .collect();
    let ran = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = ran.lines().collect();
    lines.sort();
    let all_lines = lines.len();
    lines.dedup();
    let mut want: Vec<&str> = fired.iter().map(|s| s.as_str()).collect();
    want.sort();
    assert_eq!(
        lines, want,
        "each fired tick ran, with {{{{ schedule.time }}}}"
    );
    // A tick is one run, but the run in flight at the kill is resumed by the next server
    // and its interrupted stage runs again (stages are at-least-once across a crash, as
    // with `drivetrain resume`): at most one line repeats.
    assert!(
        all_lines - lines.len() <= 1,
        "only the run interrupted by the kill may have run its stage twice: {ran}"
    );
    let list = home.drivetrain(&["list", "--output", "json"]);
    let runs: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let run = &runs[0];
    assert_eq!(run["trigger"], "schedule");
    assert!(run["scheduled_time"].is_string(), "{run}");
    // One run per fired tick, none for a tick twice.
    let scheduled: BTreeSet<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "schedule")
        .filter_map(|r| r["scheduled_time"].as_str())
        .collect();
    let cron_runs = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "schedule")
        .count();
    assert_eq!(cron_runs, scheduled.len(), "a tick with two runs: {runs}");
    assert_eq!(cron_runs, fired.len(), "{runs}");
}

/// A run in flight when the server is killed (-9) is resumed by the next server: what
/// succeeded is kept, the lost attempt runs again, and the run ends.
#[test]
fn a_run_in_flight_survives_a_killed_server() {
    let home = Home::new("serve-resume");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let gate = home.dir.join("gate");
    home.write(
        "scheduled/yearly.yaml",
        &format!(
            r#"
version: 1
name: yearly
schedule: {{cron: "0 0 1 1 *", timezone: UTC, catchup: none}}
stages:
  first:
    run: {{command: [echo, first]}}
  wait:
    needs: [first]
    run: {{command: [sh, -c, 'while [ ! -e {} ]; do sleep 0.1; done; echo opened']}}
"#,
            gate.display()
        ),
    );
    let mut server = start(&home);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !text(&home.drivetrain(&["schedule", "list"]).stdout).contains("yearly") {
        assert!(
            Instant::now() < deadline,
            "the server never registered `yearly`"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The next ticks, from the registered schedule.
    let year = chrono::Datelike::year(&chrono::Utc::now());
    let listed = text(&home.drivetrain(&["schedule", "list"]).stdout);
    assert!(
        listed.contains(&format!("{}-01-01T00:00:00Z", year + 1)),
        "{listed}"
    );
    let next = home.drivetrain(&["schedule", "next", "yearly", "-n", "2", "--output", "json"]);
    assert_ok(&next);
    let next: serde_json::Value = serde_json::from_slice(&next.stdout).unwrap();
    assert_eq!(next[1]["utc"], format!("{}-01-01T00:00:00Z", year + 2));
    assert_eq!(
        next[1]["local"],
        format!("{}-01-01 00:00:00 UTC (+00:00)", year + 2)
    );
    let o = home.drivetrain(&["schedule", "trigger", "yearly"]);
    assert_ok(&o);
    let run = text(&o.stdout)
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('-'))
        .unwrap_or_else(|| panic!("no run id in {}", text(&o.stdout)))
        .to_owned();
    let stage_phase = |name: &str| -> String {
        let o = home.drivetrain(&["status", &run, "--output", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["stages"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["stage"] == name))
            .and_then(|s| s["phase"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while stage_phase("wait") != "Running" {
        assert!(Instant::now() < deadline, "`wait` never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.kill().unwrap();
    server.wait().unwrap();

    // `ui`, the viewer, shows the orphan and executes nothing of it, for longer than a
    // heartbeat's staleness (three intervals of 1 s here).
    let mut ui = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["ui", "--bind", "127.0.0.1:0"])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env("DRIVETRAIN_HEARTBEAT", "1s")
        .stdout(std::fs::File::create(home.dir.join("ui.log")).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let o = home.drivetrain(&["status", &run, "--output", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    ui.kill().unwrap();
    ui.wait().unwrap();
    let log = std::fs::read_to_string(home.dir.join("ui.log")).unwrap();
    assert!(log.contains("listening on"), "{log}");
    assert!(
        !log.contains("resuming") && !log.contains("taking over"),
        "{log}"
    );
    let wait = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "wait")
        .unwrap();
    assert_eq!(wait["attempts"], 1, "ui executed the stage again: {v}");
    assert_eq!(v["run"]["phase"], "Running", "{v}");

    let mut server = start(&home);
    std::fs::write(&gate, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = home.drivetrain(&["status", &run, "--output", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if v["run"]["phase"] == "Succeeded" {
            let stages = v["stages"].as_array().unwrap();
            let get = |n: &str| stages.iter().find(|s| s["stage"] == n).unwrap().clone();
            assert_eq!(get("first")["attempts"], 1, "what succeeded is kept: {v}");
            assert_eq!(
                get("wait")["attempts"],
                2,
                "the lost attempt ran again: {v}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the run never ended: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = server.kill();
    let _ = server.wait();
}
