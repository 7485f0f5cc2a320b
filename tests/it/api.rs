//! The HTTP API of `drivetrain serve` over real HTTP on loopback: the server is the real
//! binary, requests are plain HTTP/1.1 over a TCP socket.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use common::http::{documented, json, request, request_to, start, wait_phase, Server, TOKEN};
use common::{assert_ok, doctor_layer, text, Home};

fn served(home: &Home) {
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write(
        "served/hello.yaml",
        r#"
version: 1
name: hello
params:
  sleep: {type: number, default: 0}
  who: {type: string, default: world}
stages:
  greet:
    run: {command: [sh, -c, 'echo "hello $0"', "{{ params.who }}"]}
  slow:
    needs: [greet]
    run: {command: [sleep, "{{ params.sleep }}"]}
    when: "params.sleep > 0"
"#,
    );
    home.write(
        "served/nightly.yaml",
        "version: 1\nname: nightly\nschedule: {cron: \"0 3 * * *\", timezone: Europe/Berlin}\nstages:\n  s:\n    run: {command: [\"true\"]}\n",
    );
}

#[test]
fn runs_schedules_logs_and_metrics_over_http() {
    let home = Home::new("api");
    served(&home);
    let s = start(&home, &["--token", TOKEN]);

    assert_eq!(request(&s, "GET", "/healthz", None, None).0, 200);
    assert_eq!(request(&s, "GET", "/readyz", None, None).0, 200);
    // Without the token, or with a wrong one: refused.
    assert_eq!(request(&s, "GET", "/api/v1/runs", None, None).0, 401);
    assert_eq!(
        request(&s, "GET", "/api/v1/runs", Some("wrong"), None).0,
        401
    );
    assert_eq!(request(&s, "GET", "/metrics", None, None).0, 401);
    let run = a_run_by_name_and_one_posted(&s);
    a_long_run_is_cancelled(&s);
    schedules_suspend_resume_and_trigger(&s);
    metrics_in_prometheus_text(&s, &home);
    every_documented_route_answers(&s, &run);
}

/// Submit by name with a param; it runs, its status and logs come back. Posted YAML; a bad
/// param and an invalid pipeline are 400s that say why. The first run's id.
fn a_run_by_name_and_one_posted(s: &Server) -> String {
    let (status, v) = json(
        s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"who": "fleet"}}"#),
    );
    assert_eq!(status, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    let done = wait_phase(s, &run, "Succeeded");
    assert_eq!(done["run"]["trigger"], "api");
    let (status, log) = request(
        s,
        "GET",
        &format!("/api/v1/runs/{run}/logs?stage=greet"),
        Some(TOKEN),
        None,
    );
    assert_eq!((status, log.as_str()), (200, "hello fleet\n"));

    // Posted YAML; a bad param and an invalid pipeline are 400s that say why.
    let yaml = serde_json::json!({"yaml": "version: 1\nname: adhoc\nstages:\n  a:\n    run: {command: [\"true\"]}\n"}).to_string();
    let (status, v) = json(s, "POST", "/api/v1/runs", Some(&yaml));
    assert_eq!(status, 201, "{v}");
    wait_phase(s, v["run"].as_str().unwrap(), "Succeeded");
    let (status, v) = json(
        s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"sleep": "long"}}"#),
    );
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("sleep"), "{v}");
    let (status, v) = json(s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "nope"}"#));
    assert_eq!(status, 400);
    assert!(
        v["error"].as_str().unwrap().contains("no pipeline `nope`"),
        "{v}"
    );
    run
}

/// Cancel a long run.
fn a_long_run_is_cancelled(s: &Server) {
    let (_, v) = json(
        s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"sleep": 30}}"#),
    );
    let long = v["run"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while json(s, "GET", &format!("/api/v1/runs/{long}"), None).1["stages"]
        .as_array()
        .map(|a| {
            a.iter()
                .any(|st| st["stage"] == "slow" && st["phase"] == "Running")
        })
        != Some(true)
    {
        assert!(Instant::now() < deadline, "slow never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        json(s, "POST", &format!("/api/v1/runs/{long}/cancel"), None).0,
        202
    );
    wait_phase(s, &long, "Cancelled");
}

/// Schedules: listed, suspended, resumed, triggered.
fn schedules_suspend_resume_and_trigger(s: &Server) {
    let (_, v) = json(s, "GET", "/api/v1/schedules", None);
    assert_eq!(v["schedules"][0]["schedule"]["pipeline"], "nightly", "{v}");
    assert_eq!(
        json(s, "POST", "/api/v1/schedules/nightly/suspend", None).1["suspended"],
        true
    );
    assert_eq!(
        json(s, "POST", "/api/v1/schedules/nightly/resume", None).1["suspended"],
        false
    );
    assert_eq!(
        json(s, "POST", "/api/v1/schedules/nope/suspend", None).0,
        404
    );
    let (status, v) = json(s, "POST", "/api/v1/schedules/nightly/trigger", None);
    assert_eq!(status, 202);
    let triggered = wait_phase(s, v["run"].as_str().unwrap(), "Succeeded");
    assert_eq!(triggered["run"]["trigger"], "schedule");
    assert!(triggered["run"]["scheduled_time"].is_string());
}

/// Metrics in Prometheus text, and what stages used where the machine gives cgroups
/// (CI's does).
fn metrics_in_prometheus_text(s: &Server, home: &Home) {
    let (status, m) = request(s, "GET", "/metrics", Some(TOKEN), None);
    assert_eq!(status, 200);
    for name in [
        "drivetrain_runs{status=\"Succeeded\"}",
        "drivetrain_runs{status=\"Cancelled\"} 1",
        "drivetrain_queue_depth 0",
        "drivetrain_stage_duration_seconds_count",
        "drivetrain_schedule_lag_seconds_count 1",
        "drivetrain_ticks_fired_total",
        "drivetrain_cache_misses_total",
    ] {
        assert!(m.contains(name), "{name} in:\n{m}");
    }
    // What stages used, where the machine gives cgroups (CI's does).
    let doctor = home.drivetrain(&["doctor", "-o", "json"]);
    if doctor_layer(&doctor, "cgroup limits")["active"] == true {
        for name in [
            "drivetrain_stage_cpu_seconds_total{pipeline=\"hello\",stage=\"greet\",project=\"default\"}",
            "drivetrain_stage_peak_memory_bytes{pipeline=\"hello\",stage=\"greet\",project=\"default\"}",
        ] {
            assert!(m.contains(name), "{name} in:\n{m}");
        }
    }
}

/// Every documented route answers (not 404 / 405).
fn every_documented_route_answers(s: &Server, run: &str) {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        // The stream of the run list never ends: read apart below.
        if path == "/api/v1/events" {
            continue;
        }
        for method in ops.as_object().unwrap().keys() {
            let p = path.replace("{id}", run).replace("{name}", "nightly")
                + if path.ends_with("/logs") {
                    "?stage=greet"
                } else {
                    ""
                };
            // A 404 of ours says why in JSON; the router's own 404 (no such route) is empty.
            let (status, body) = request(s, &method.to_uppercase(), &p, Some(TOKEN), Some("{}"));
            assert!(
                status != 405 && (status != 404 || body.contains("\"error\"")),
                "{method} {p}: {status} {body}"
            );
        }
    }
}

#[test]
fn serve_refuses_a_public_address_without_a_token() {
    let home = Home::new("api-public");
    served(&home);
    let o = home.drivetrain(&["serve", "--pipelines", "served", "--bind", "0.0.0.0:0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("refusing to serve on 0.0.0.0:0 without a token"),
        "{}",
        text(&o.stderr)
    );
}

/// A token from a file stays out of the command line every process can read; `--token`
/// still works, with a warning that says so; `--bind` takes a host name.
#[test]
fn the_token_from_a_file_is_in_no_command_line() {
    let home = Home::new("api-token-file");
    served(&home);
    let secret = home.write("token", &format!("{TOKEN}\n"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    cmd.args(["serve", "--pipelines", "served", "--bind", "localhost:0"])
        .arg("--token-file")
        .arg(&secret)
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env_remove("DRIVETRAIN_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(home.dir.join("err")).unwrap());
    let s = common::http::start_command(cmd);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));
    assert_eq!(request(&s, "GET", "/api/v1/runs", None, None).0, 401);
    assert_eq!(request(&s, "GET", "/api/v1/runs", Some(TOKEN), None).0, 200);
    assert!(!std::fs::read_to_string(home.dir.join("err"))
        .unwrap()
        .contains("warning"));
    drop(s);

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    cmd.args([
        "serve",
        "--pipelines",
        "served",
        "--bind",
        "127.0.0.1:0",
        "--token",
        TOKEN,
    ])
    .current_dir(&home.dir)
    .env_remove("DRIVETRAIN_HOME")
    .stdout(std::process::Stdio::piped())
    .stderr(std::fs::File::create(home.dir.join("err")).unwrap());
    let s = common::http::start_command(cmd);
    assert_eq!(request(&s, "GET", "/api/v1/runs", Some(TOKEN), None).0, 200);
    let err = std::fs::read_to_string(home.dir.join("err")).unwrap();
    assert!(
        err.contains("warning: --token is in this process's command line"),
        "{err}"
    );
    drop(s);
    let empty = home.write("empty", "\n");
    let o = home.drivetrain(&[
        "serve",
        "--pipelines",
        "served",
        "--token-file",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("its first line is empty"),
        "{}",
        text(&o.stderr)
    );
}

/// Reruns and retries run in the server's engine; logs stream
/// while a stage runs; pipelines with a schedule can be registered over the API.
#[test]
fn reruns_retries_followed_logs_and_registered_schedules_over_http() {
    let home = Home::new("api-more");
    served(&home);
    let s = start(&home, &["--token", TOKEN]);
    let first = a_rerun_of_one_stage_with_a_new_param(&s);
    a_retry_executes_what_failed(&s, &home);
    a_followed_log_streams_until_the_stage_ends(&s);
    a_schedule_registered_over_the_api(&s, &home);
    a_rerun_is_cancelled_through_the_server(&s, &first);
}

/// A rerun of one stage with a new param, in the server's engine. The first run's id.
fn a_rerun_of_one_stage_with_a_new_param(s: &Server) -> String {
    let (code, v) = json(
        s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"who": "a"}}"#),
    );
    assert_eq!(code, 201, "{v}");
    let first = v["run"].as_str().unwrap().to_owned();
    wait_phase(s, &first, "Succeeded");
    let (code, v) = json(
        s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some(r#"{"stages": ["greet"], "params": {"who": "b"}}"#),
    );
    assert_eq!(code, 201, "{v}");
    let rerun = v["run"].as_str().unwrap().to_owned();
    let done = wait_phase(s, &rerun, "Succeeded");
    assert_eq!(done["run"]["trigger"], "rerun");
    assert_eq!(done["run"]["parent"], first.as_str());
    let (_, log) = request(
        s,
        "GET",
        &format!("/api/v1/runs/{rerun}/logs?stage=greet"),
        Some(TOKEN),
        None,
    );
    assert!(log.contains("hello b"), "{log}");
    let (code, _) = json(
        s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some("{}"),
    );
    assert_eq!(code, 400, "a rerun names its stages");
    let (code, _) = json(s, "POST", "/api/v1/runs/no-such-run/retry", None);
    assert_eq!(code, 404);
    first
}

/// A retry executes what failed, once it can succeed; retrying a run that succeeded is a
/// conflict that says why, as the CLI says it.
fn a_retry_executes_what_failed(s: &Server, home: &Home) {
    let flag = home.dir.join("flag");
    let yaml = format!(
        "version: 1\nname: flaky\nstages:\n  check:\n    run: {{command: [test, -e, {}]}}\n",
        flag.display()
    );
    let body = serde_json::json!({ "yaml": yaml }).to_string();
    let (code, v) = json(s, "POST", "/api/v1/runs", Some(&body));
    assert_eq!(code, 201, "{v}");
    let failed = v["run"].as_str().unwrap().to_owned();
    wait_phase(s, &failed, "Failed");
    std::fs::write(&flag, "").unwrap();
    let (code, v) = json(s, "POST", &format!("/api/v1/runs/{failed}/retry"), None);
    assert_eq!(code, 201, "{v}");
    let retried = wait_phase(s, v["run"].as_str().unwrap(), "Succeeded");
    assert_eq!(retried["run"]["trigger"], "retry");
    // Retrying a run that succeeded is a conflict that says why, as the CLI says it.
    let done = retried["run"]["id"].as_str().unwrap().to_owned();
    let (code, v) = json(s, "POST", &format!("/api/v1/runs/{done}/retry"), None);
    assert_eq!(code, 409, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("succeeded; nothing to retry"),
        "{v}"
    );
}

/// A followed log streams until the stage ends.
fn a_followed_log_streams_until_the_stage_ends(s: &Server) {
    let yaml = "version: 1\nname: chatty\nstages:\n  talk:\n    run: {command: [sh, -c, 'echo first line; sleep 1; echo last line']}\n";
    let body = serde_json::json!({ "yaml": yaml }).to_string();
    let (_, v) = json(s, "POST", "/api/v1/runs", Some(&body));
    let chatty = v["run"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while request(
        s,
        "GET",
        &format!("/api/v1/runs/{chatty}/logs?stage=talk"),
        Some(TOKEN),
        None,
    )
    .0 != 200
    {
        assert!(Instant::now() < deadline, "the stage never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, streamed) = request(
        s,
        "GET",
        &format!("/api/v1/runs/{chatty}/logs?stage=talk&follow=true"),
        Some(TOKEN),
        None,
    );
    assert_eq!(code, 200);
    assert!(
        streamed.contains("first line") && streamed.contains("last line"),
        "{streamed}"
    );
}

/// A schedule registered over the API is served (and written into the directory), and it
/// can be triggered at once.
fn a_schedule_registered_over_the_api(s: &Server, home: &Home) {
    let yaml = "version: 1\nname: hourly\nschedule: {cron: \"0 * * * *\", timezone: Asia/Tokyo}\nstages:\n  s:\n    run: {command: [\"true\"]}\n";
    let body = serde_json::json!({ "yaml": yaml }).to_string();
    let (code, v) = json(s, "POST", "/api/v1/schedules", Some(&body));
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["schedule"], "hourly");
    assert!(home.dir.join("served/hourly.yaml").exists());
    let (_, list) = json(s, "GET", "/api/v1/schedules", None);
    assert!(
        list["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["schedule"]["pipeline"] == "hourly"),
        "{list}"
    );
    let (code, _) = json(s, "POST", "/api/v1/schedules", Some(&body));
    assert_eq!(code, 409, "a served name is not replaced unless asked");
    let body = serde_json::json!({ "yaml": yaml, "replace": true }).to_string();
    assert_eq!(json(s, "POST", "/api/v1/schedules", Some(&body)).0, 201);
    let unscheduled = serde_json::json!({ "yaml": "version: 1\nname: x\nstages:\n  s:\n    run: {command: [\"true\"]}\n" }).to_string();
    assert_eq!(
        json(s, "POST", "/api/v1/schedules", Some(&unscheduled)).0,
        400
    );
    // And it can be triggered at once.
    let (code, v) = json(s, "POST", "/api/v1/schedules/hourly/trigger", None);
    assert_eq!(code, 202, "{v}");
    wait_phase(s, v["run"].as_str().unwrap(), "Succeeded");
}

/// A rerun the server started is cancelled through the server.
fn a_rerun_is_cancelled_through_the_server(s: &Server, first: &str) {
    let (code, v) = json(
        s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some(r#"{"stages": ["slow"], "params": {"sleep": 60}}"#),
    );
    assert_eq!(code, 201, "{v}");
    let slow = v["run"].as_str().unwrap().to_owned();
    wait_phase(s, &slow, "Running");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = json(s, "GET", &format!("/api/v1/runs/{slow}"), None);
        if v["stages"].as_array().is_some_and(|a| {
            a.iter()
                .any(|st| st["stage"] == "slow" && st["phase"] == "Running")
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "slow never ran: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, v) = json(s, "POST", &format!("/api/v1/runs/{slow}/cancel"), None);
    assert_eq!(code, 202, "{v}");
    wait_phase(s, &slow, "Cancelled");
}

/// `run`, `status`, `logs` and `cancel` with `--server URL` go through the API.
#[test]
fn the_cli_talks_to_a_server() {
    let home = Home::new("api-cli");
    served(&home);
    let s = start(&home, &["--token", TOKEN]);
    let url = format!("http://{}", s.addr);
    let cli = |args: &[&str], token: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
        c.args(args)
            .current_dir(&home.dir)
            .env_remove("DRIVETRAIN_TOKEN");
        if let Some(t) = token {
            c.env("DRIVETRAIN_TOKEN", t);
        }
        c.output().unwrap()
    };
    let o = cli(
        &[
            "run",
            "served/hello.yaml",
            "--server",
            &url,
            "--param",
            "who=cli",
        ],
        Some(TOKEN),
    );
    assert_ok(&o);
    let out = text(&o.stdout);
    let id = out
        .lines()
        .next()
        .unwrap()
        .strip_prefix("run ")
        .unwrap()
        .to_owned();
    assert!(out.contains(&format!("run {id} Succeeded")), "{out}");
    // The run is the server's: this machine's engine has no such run in its own home.
    let o = cli(
        &["status", &id, "--server", &url, "--output", "json"],
        Some(TOKEN),
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["run"]["phase"], "Succeeded");
    assert_eq!(v["run"]["trigger"], "api");
    let o = cli(
        &["logs", &id, "--stage", "greet", "--server", &url],
        Some(TOKEN),
    );
    assert!(text(&o.stdout).contains("hello cli"), "{}", text(&o.stdout));
    // Without the token the server refuses, and the CLI says so.
    let o = cli(&["status", &id, "--server", &url], None);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o.stderr).contains("401"), "{}", text(&o.stderr));
    // Detached submissions: one cancelled on this machine's home, one through the server.
    let submit = || {
        let o = cli(
            &[
                "run",
                "served/hello.yaml",
                "--server",
                &url,
                "--detach",
                "--param",
                "sleep=60",
            ],
            Some(TOKEN),
        );
        assert_ok(&o);
        let run = text(&o.stdout).lines().next().unwrap().to_owned();
        run.strip_prefix("run ").unwrap().to_owned()
    };
    let (here, there) = (submit(), submit());
    wait_phase(&s, &here, "Running");
    // Cancelled locally: recorded in the home's state, and the server stops it (a signal
    // would have stopped the server's own process).
    let o = cli(&["cancel", &here], None);
    assert_ok(&o);
    assert!(text(&o.stdout).contains("Cancelled"), "{}", text(&o.stdout));
    wait_phase(&s, &here, "Cancelled");
    assert_eq!(
        json(&s, "GET", "/api/v1/runs", None).0,
        200,
        "the server still serves"
    );
    wait_phase(&s, &there, "Running");
    let o = cli(&["cancel", &there, "--server", &url], Some(TOKEN));
    assert_ok(&o);
    wait_phase(&s, &there, "Cancelled");
}

/// The check every request goes through fails on what the document does not say.
#[test]
#[should_panic(expected = "does not document")]
fn an_undocumented_status_fails_the_check() {
    documented("GET", "/api/v1/runs", 418, None);
}

#[test]
#[should_panic(expected = "does not match docs/openapi.json")]
fn a_body_unlike_its_schema_fails_the_check() {
    documented(
        "POST",
        "/api/v1/runs",
        201,
        Some(r#"{"id": "not how a run is answered"}"#),
    );
}

fn submit_body(yaml: &str) -> String {
    serde_json::json!({ "yaml": yaml }).to_string()
}

/// Posted pipelines that overflowed the stack or the memory of `serve` (deep `when:`
/// nesting, `!` repeated, an alias bomb, hundreds of errors on one line, a mining rule of
/// thousands of terms) are answered 400
/// with where the problem is, and the server goes on serving; a NUL byte in a rerun is a
/// 400 naming its field.
#[test]
fn hostile_requests_are_refused_and_the_server_goes_on() {
    let home = Home::new("api-hostile");
    served(&home);
    let s = start(&home, &["--token", TOKEN]);
    use common::hostile::Hostile;
    for (yaml, expect) in [
        (
            Hostile::Parens(1_800).yaml(),
            "6:76: invalid `when` condition: the condition nests deeper than 64 levels",
        ),
        (Hostile::Nots(20_000).yaml(), "nests deeper than 64"),
        (Hostile::AliasBytes(100).yaml(), "more than 32 MiB of text"),
        (
            Hostile::ErrorsOnOneLine(800).yaml(),
            "795 more problems are not shown",
        ),
        // A 100 kB mining rule (8,000 `OR` terms): it overflowed the stack of `serve`.
        (
            Hostile::RuleTerms(8_000).yaml(),
            "rule `r` is 127996 bytes long, more than the 16384 a rule may have",
        ),
        (
            Hostile::RuleTerms(1_000).yaml(),
            "rule `r` has 4999 terms, more than the 400",
        ),
    ] {
        let (status, body) = request(
            &s,
            "POST",
            "/api/v1/runs",
            Some(TOKEN),
            Some(&submit_body(&yaml)),
        );
        assert_eq!(status, 400, "{body}");
        assert!(
            body.contains(expect),
            "{expect}: {}",
            &body[..body.len().min(2_000)]
        );
        assert!(body.len() < 64 << 10, "{} bytes", body.len());
    }
    // Still serving: a run submitted now runs.
    let (status, v) = json(&s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "hello"}"#));
    assert_eq!(status, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &run, "Succeeded");
    for (body, field) in [
        (r#"{"stages": ["gr\u0000eet"]}"#, "`stages`"),
        (
            r#"{"stages": ["greet"], "params": {"who": "a\u0000b"}}"#,
            "`params`",
        ),
    ] {
        let (status, text) = request(
            &s,
            "POST",
            &format!("/api/v1/runs/{run}/rerun"),
            Some(TOKEN),
            Some(body),
        );
        assert_eq!(status, 400, "{text}");
        assert!(text.contains(field) && text.contains("NUL"), "{text}");
    }
}

/// Without a token a loopback server answers reads only; `--insecure-no-auth` opens the
/// rest. Either way a request naming another host (a DNS-rebinding page) is refused.
#[test]
fn without_a_token_reads_only_and_only_for_this_host() {
    let home = Home::new("api-no-token");
    served(&home);
    let hello = Some(r#"{"pipeline": "hello"}"#);
    let s = start(&home, &[]);
    let (status, _) = request(&s, "GET", "/api/v1/runs", None, None);
    assert_eq!(status, 200);
    let (status, body) = request(&s, "POST", "/api/v1/runs", None, hello);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("--insecure-no-auth"), "{body}");
    let port = s.addr.rsplit_once(':').unwrap().1.to_owned();
    for host in [
        "evil.example",
        "evil.example:80",
        &format!("evil.example:{port}"),
        "127.0.0.1:1",
    ] {
        let (status, body) = request_to(&s, host, "GET", "/api/v1/runs", None, None);
        assert_eq!(status, 403, "{host}: {body}");
    }
    drop(s);

    let s = start(&home, &["--insecure-no-auth"]);
    let (status, body) = request_to(&s, "evil.example", "POST", "/api/v1/runs", None, hello);
    assert_eq!(status, 403, "{body}");
    for host in [
        s.addr.clone(),
        format!(
            "localhost:{port}",
            port = s.addr.rsplit_once(':').unwrap().1
        ),
    ] {
        let (status, body) = request_to(&s, &host, "POST", "/api/v1/runs", None, hello);
        assert_eq!(status, 201, "{host}: {body}");
    }
}

/// Hundreds of submissions in the same second get distinct run ids (16 random bits gave
/// four collisions in 411), and none is answered as the client's fault.
#[test]
fn run_ids_of_a_burst_of_submissions_are_distinct() {
    let home = Home::new("api-burst");
    served(&home);
    let s = std::sync::Arc::new(start(&home, &["--token", TOKEN]));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                (0..40)
                    .map(|_| json(&s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "hello"}"#)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut ids = std::collections::HashSet::new();
    for t in threads {
        for (status, v) in t.join().unwrap() {
            assert_eq!(status, 201, "{v}");
            ids.insert(v["run"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(ids.len(), 320);
}

/// Sends `head` (a request line and headers, no body) and reads until `until` appears in
/// the answer or the server closes; returns what came.
fn raw(addr: &str, head: &str, until: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(until) {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// What the web view reads: a run's graph, attempts, live events and `explain`, lineage,
/// the registry, filtered lists; the page itself; and a page of another site refused.
#[test]
fn the_routes_of_the_web_view() {
    let home = Home::new("api-view");
    served(&home);
    home.write(
        "served/made.yaml",
        r#"
version: 1
name: made
stages:
  make:
    run: {command: [sh, -c, 'echo frames > "$0/f"', "{{ outputs.data }}"]}
    outputs: [data]
  use:
    inputs: {data: make.data}
    run: {command: [cat, "{{ inputs.data }}/f"]}
"#,
    );
    let mut s = start(&home, &["--token", TOKEN]);
    let (_, v) = json(&s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "made"}"#));
    let run = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &run, "Succeeded");
    let (_, v) = json(&s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "hello"}"#));
    let hello = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &hello, "Succeeded");
    a_run_s_graph_and_attempts(&s, &run);
    events_of_a_run_and_of_the_list(&s, &run);
    explain_of_a_stage(&s, &run);
    lineage_and_the_empty_registry(&s, &run);
    filters_and_schedules(&s, &run);
    the_page_and_its_policy(&s);
    let started = another_site_is_refused(&s);
    an_open_page_does_not_hold_up_a_stop(&mut s, &started);
}

/// The graph: each stage with what it needs, in the pipeline's order; and its attempts.
fn a_run_s_graph_and_attempts(s: &Server, run: &str) {
    let (code, g) = json(s, "GET", &format!("/api/v1/runs/{run}/graph"), None);
    assert_eq!(code, 200, "{g}");
    assert_eq!(g["nodes"][0]["name"], "make");
    assert_eq!(g["nodes"][1]["needs"], serde_json::json!(["make"]), "{g}");
    assert_eq!(g["nodes"][1]["kind"], "command");
    assert!(g.get("note").is_none(), "{g}");

    let (code, a) = json(s, "GET", &format!("/api/v1/runs/{run}/attempts"), None);
    assert_eq!(code, 200);
    let attempts = a["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{a}");
    assert!(attempts.iter().all(|a| a["phase"] == "Succeeded"), "{a}");
}

/// Events of an ended run: the snapshot, then the end, then the stream closes; the
/// list's stream announces the runs at once.
fn events_of_a_run_and_of_the_list(s: &Server, run: &str) {
    let events = raw(
        &s.addr,
        &format!(
            "GET /api/v1/runs/{run}/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n",
            s.addr
        ),
        "event: end",
    );
    assert!(events.contains("text/event-stream"), "{events}");
    let snapshot = events.find("event: snapshot").expect("a snapshot");
    assert!(
        events[snapshot..].contains("\"phase\":\"Succeeded\""),
        "{events}"
    );
    assert!(events.contains("event: end"), "{events}");
    // The list's stream announces the runs at once.
    let listed = raw(
        &s.addr,
        &format!(
            "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
            s.addr
        ),
        "\n\n",
    );
    assert!(listed.contains("event: runs"), "{listed}");
    assert!(listed.contains("\"Succeeded\":2"), "{listed}");
}

/// `explain` of a stage, and of a stage the run does not have.
fn explain_of_a_stage(s: &Server, run: &str) {
    let (code, e) = json(
        s,
        "GET",
        &format!("/api/v1/runs/{run}/stages/use/explain"),
        None,
    );
    assert_eq!(code, 200, "{e}");
    assert!(e["verdict"].as_str().unwrap().starts_with("ran"), "{e}");
    assert!(e["components"]["input:data"].is_string(), "{e}");
    let (code, e) = json(
        s,
        "GET",
        &format!("/api/v1/runs/{run}/stages/nope/explain"),
        None,
    );
    assert_eq!(code, 404);
    assert!(
        e["error"].as_str().unwrap().contains("has no stage `nope`"),
        "{e}"
    );
}

/// Lineage from the consuming stage up to the artifact and the stage that made it; an
/// empty registry.
fn lineage_and_the_empty_registry(s: &Server, run: &str) {
    let (code, l) = json(s, "GET", &format!("/api/v1/lineage?target={run}/use"), None);
    assert_eq!(code, 200, "{l}");
    let kinds: Vec<&str> = l["nodes"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"artifact") && kinds.contains(&"stage"),
        "{l}"
    );
    assert!(l["nodes"][format!("{run}/make")].is_object(), "{l}");
    assert_eq!(
        json(s, "GET", "/api/v1/lineage?target=sha256:0000", None).0,
        404
    );
    assert_eq!(json(s, "GET", "/api/v1/lineage", None).0, 400);

    let (code, r) = json(s, "GET", "/api/v1/registry", None);
    assert_eq!((code, r["models"].clone()), (200, serde_json::json!([])));
    assert_eq!(
        json(
            s,
            "POST",
            "/api/v1/registry/lanes/aliases/production/rollback",
            None
        )
        .0,
        404
    );
}

/// The run list's filters, and the schedules' next ticks.
fn filters_and_schedules(s: &Server, run: &str) {
    let (_, v) = json(s, "GET", "/api/v1/runs?pipeline=made&phase=Succeeded", None);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{v}");
    assert_eq!(runs[0]["id"], run);
    let (_, v) = json(s, "GET", "/api/v1/runs?phase=Failed", None);
    assert_eq!(v["runs"], serde_json::json!([]));
    let (_, v) = json(s, "GET", "/api/v1/runs?trigger=api&limit=1", None);
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    let (_, v) = json(s, "GET", "/api/v1/runs?since=2999-01-01T00:00:00Z", None);
    assert_eq!(v["runs"], serde_json::json!([]));
    let (code, v) = json(s, "GET", "/api/v1/runs?phase=Sleeping", None);
    assert_eq!(code, 400);
    assert!(v["error"].as_str().unwrap().contains("Sleeping"), "{v}");

    // Schedules show their next tick.
    let (_, v) = json(s, "GET", "/api/v1/schedules", None);
    assert!(v["schedules"][0]["next_tick"].is_object(), "{v}");
}

/// The page: open, with a policy that keeps other sites' scripts out.
fn the_page_and_its_policy(s: &Server) {
    let page = raw(
        &s.addr,
        &format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            s.addr
        ),
        "</html>",
    );
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("content-security-policy: default-src 'none'"),
        "{page}"
    );
    assert!(page.contains("/ui/app.js"), "{page}");
    let script = raw(
        &s.addr,
        &format!(
            "GET /ui/app.js HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            s.addr
        ),
        "route();",
    );
    assert!(script.contains("text/javascript"), "{script}");
}

/// A page of another site cannot make the browser start a run, even with the token a
/// person typed into this one: the browser names the page's origin. The run this
/// server's own origin started.
fn another_site_is_refused(s: &Server) -> String {
    let post = |origin: &str| {
        let body = r#"{"pipeline": "hello"}"#;
        raw(
            &s.addr,
            &format!(
                "POST /api/v1/runs HTTP/1.1\r\nHost: {}\r\nOrigin: {origin}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                s.addr,
                body.len()
            ),
            "}",
        )
    };
    let refused = post("http://evil.example");
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("cannot change this server"), "{refused}");
    let accepted = post(&format!("http://{}", s.addr));
    assert!(accepted.starts_with("HTTP/1.1 201"), "{accepted}");
    accepted.rsplit('"').nth(1).unwrap().to_owned()
}

/// A page left open (its stream of the run list) does not hold up a graceful stop.
fn an_open_page_does_not_hold_up_a_stop(s: &mut Server, run: &str) {
    let mut open = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        open,
        "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
        s.addr
    )
    .unwrap();
    let mut first = [0u8; 512];
    let n = open.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
    wait_phase(s, run, "Succeeded");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not stop with a page open"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(open);
}
