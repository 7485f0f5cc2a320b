//! The HTTP API of `drivetrain serve` over real HTTP on loopback: the server is the real
//! binary, requests are plain HTTP/1.1 over a TCP socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{assert_ok, text, Home};

const TOKEN: &str = "t0ken-for-tests";

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(home: &Home, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["serve", "--pipelines", "served", "--bind", "127.0.0.1:0"])
        .args(extra)
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env_remove("DRIVETRAIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the server prints its address")
            .unwrap();
        if let Some(a) = line.strip_prefix("listening on http://") {
            break a.to_owned();
        }
    };
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr }
}

/// One request; returns (status, body).
fn request(
    s: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        s.addr
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    req.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    c.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let status: u16 = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn json(s: &Server, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let (status, text) = request(s, method, path, Some(TOKEN), body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

fn wait_phase(s: &Server, run: &str, phase: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = json(s, "GET", &format!("/api/v1/runs/{run}"), None);
        if v["run"]["phase"] == phase {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} never reached {phase}: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

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

    // Submit by name with a param; it runs, its status and logs come back.
    let (status, v) = json(
        &s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"who": "fleet"}}"#),
    );
    assert_eq!(status, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    let done = wait_phase(&s, &run, "Succeeded");
    assert_eq!(done["run"]["trigger"], "api");
    let (status, log) = request(
        &s,
        "GET",
        &format!("/api/v1/runs/{run}/logs?stage=greet"),
        Some(TOKEN),
        None,
    );
    assert_eq!((status, log.as_str()), (200, "hello fleet\n"));

    // Posted YAML; a bad param and an invalid pipeline are 400s that say why.
    let yaml = serde_json::json!({"yaml": "version: 1\nname: adhoc\nstages:\n  a:\n    run: {command: [\"true\"]}\n"}).to_string();
    let (status, v) = json(&s, "POST", "/api/v1/runs", Some(&yaml));
    assert_eq!(status, 201, "{v}");
    wait_phase(&s, v["run"].as_str().unwrap(), "Succeeded");
    let (status, v) = json(
        &s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"sleep": "long"}}"#),
    );
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("sleep"), "{v}");
    let (status, v) = json(&s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "nope"}"#));
    assert_eq!(status, 400);
    assert!(
        v["error"].as_str().unwrap().contains("no pipeline `nope`"),
        "{v}"
    );

    // Cancel a long run.
    let (_, v) = json(
        &s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"sleep": 30}}"#),
    );
    let long = v["run"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while json(&s, "GET", &format!("/api/v1/runs/{long}"), None).1["stages"]
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
        json(&s, "POST", &format!("/api/v1/runs/{long}/cancel"), None).0,
        202
    );
    wait_phase(&s, &long, "Cancelled");

    // Schedules: listed, suspended, resumed, triggered.
    let (_, v) = json(&s, "GET", "/api/v1/schedules", None);
    assert_eq!(v["schedules"][0]["schedule"]["pipeline"], "nightly", "{v}");
    assert_eq!(
        json(&s, "POST", "/api/v1/schedules/nightly/suspend", None).1["suspended"],
        true
    );
    assert_eq!(
        json(&s, "POST", "/api/v1/schedules/nightly/resume", None).1["suspended"],
        false
    );
    assert_eq!(
        json(&s, "POST", "/api/v1/schedules/nope/suspend", None).0,
        404
    );
    let (status, v) = json(&s, "POST", "/api/v1/schedules/nightly/trigger", None);
    assert_eq!(status, 202);
    let triggered = wait_phase(&s, v["run"].as_str().unwrap(), "Succeeded");
    assert_eq!(triggered["run"]["trigger"], "schedule");
    assert!(triggered["run"]["scheduled_time"].is_string());

    // Metrics in Prometheus text.
    let (status, m) = request(&s, "GET", "/metrics", Some(TOKEN), None);
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

    // Every documented route answers (not 404 / 405).
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            let p = path.replace("{id}", &run).replace("{name}", "nightly")
                + if path.ends_with("/logs") {
                    "?stage=greet"
                } else {
                    ""
                };
            // A 404 of ours says why in JSON; the router's own 404 (no such route) is empty.
            let (status, body) = request(&s, &method.to_uppercase(), &p, Some(TOKEN), Some("{}"));
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

/// Reruns and retries run in engines of their own that the server starts; logs stream
/// while a stage runs; pipelines with a schedule can be registered over the API.
#[test]
fn reruns_retries_followed_logs_and_registered_schedules_over_http() {
    let home = Home::new("api-more");
    served(&home);
    let s = start(&home, &["--token", TOKEN]);

    // A rerun of one stage with a new param, in its own engine.
    let (code, v) = json(
        &s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "hello", "params": {"who": "a"}}"#),
    );
    assert_eq!(code, 201, "{v}");
    let first = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &first, "Succeeded");
    let (code, v) = json(
        &s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some(r#"{"stages": ["greet"], "params": {"who": "b"}}"#),
    );
    assert_eq!(code, 201, "{v}");
    let rerun = v["run"].as_str().unwrap().to_owned();
    let done = wait_phase(&s, &rerun, "Succeeded");
    assert_eq!(done["run"]["trigger"], "rerun");
    assert_eq!(done["run"]["parent"], first.as_str());
    let (_, log) = request(
        &s,
        "GET",
        &format!("/api/v1/runs/{rerun}/logs?stage=greet"),
        Some(TOKEN),
        None,
    );
    assert!(log.contains("hello b"), "{log}");
    let (code, _) = json(
        &s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some("{}"),
    );
    assert_eq!(code, 400, "a rerun names its stages");
    let (code, _) = json(&s, "POST", "/api/v1/runs/no-such-run/retry", None);
    assert_eq!(code, 404);

    // A retry executes what failed, once it can succeed.
    let flag = home.dir.join("flag");
    let yaml = format!(
        "version: 1\nname: flaky\nstages:\n  check:\n    run: {{command: [test, -e, {}]}}\n",
        flag.display()
    );
    let body = serde_json::json!({ "yaml": yaml }).to_string();
    let (code, v) = json(&s, "POST", "/api/v1/runs", Some(&body));
    assert_eq!(code, 201, "{v}");
    let failed = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &failed, "Failed");
    std::fs::write(&flag, "").unwrap();
    let (code, v) = json(&s, "POST", &format!("/api/v1/runs/{failed}/retry"), None);
    assert_eq!(code, 201, "{v}");
    let retried = wait_phase(&s, v["run"].as_str().unwrap(), "Succeeded");
    assert_eq!(retried["run"]["trigger"], "retry");

    // A followed log streams until the stage ends.
    let yaml = "version: 1\nname: chatty\nstages:\n  talk:\n    run: {command: [sh, -c, 'echo first line; sleep 1; echo last line']}\n";
    let body = serde_json::json!({ "yaml": yaml }).to_string();
    let (_, v) = json(&s, "POST", "/api/v1/runs", Some(&body));
    let chatty = v["run"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while request(
        &s,
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
        &s,
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

    // A schedule registered over the API is served (and written into the directory).
    let yaml = "version: 1\nname: hourly\nschedule: {cron: \"0 * * * *\", timezone: Asia/Tokyo}\nstages:\n  s:\n    run: {command: [\"true\"]}\n";
    let body = serde_json::json!({ "yaml": yaml }).to_string();
    let (code, v) = json(&s, "POST", "/api/v1/schedules", Some(&body));
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["schedule"], "hourly");
    assert!(home.dir.join("served/hourly.yaml").exists());
    let (_, list) = json(&s, "GET", "/api/v1/schedules", None);
    assert!(
        list["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["schedule"]["pipeline"] == "hourly"),
        "{list}"
    );
    let (code, _) = json(&s, "POST", "/api/v1/schedules", Some(&body));
    assert_eq!(code, 409, "a served name is not replaced unless asked");
    let body = serde_json::json!({ "yaml": yaml, "replace": true }).to_string();
    assert_eq!(json(&s, "POST", "/api/v1/schedules", Some(&body)).0, 201);
    let unscheduled = serde_json::json!({ "yaml": "version: 1\nname: x\nstages:\n  s:\n    run: {command: [\"true\"]}\n" }).to_string();
    assert_eq!(
        json(&s, "POST", "/api/v1/schedules", Some(&unscheduled)).0,
        400
    );
    // And it can be triggered at once.
    let (code, v) = json(&s, "POST", "/api/v1/schedules/hourly/trigger", None);
    assert_eq!(code, 202, "{v}");
    wait_phase(&s, v["run"].as_str().unwrap(), "Succeeded");

    // A rerun the server started is cancelled through the server.
    let (code, v) = json(
        &s,
        "POST",
        &format!("/api/v1/runs/{first}/rerun"),
        Some(r#"{"stages": ["slow"], "params": {"sleep": 60}}"#),
    );
    assert_eq!(code, 201, "{v}");
    let slow = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &slow, "Running");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, v) = json(&s, "GET", &format!("/api/v1/runs/{slow}"), None);
        if v["stages"].as_array().is_some_and(|a| {
            a.iter()
                .any(|st| st["stage"] == "slow" && st["phase"] == "Running")
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "slow never ran: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, v) = json(&s, "POST", &format!("/api/v1/runs/{slow}/cancel"), None);
    assert_eq!(code, 202, "{v}");
    wait_phase(&s, &slow, "Cancelled");
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
    // A detached submission, cancelled through the server.
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
    let slow = text(&o.stdout)
        .lines()
        .next()
        .unwrap()
        .strip_prefix("run ")
        .unwrap()
        .to_owned();
    wait_phase(&s, &slow, "Running");
    // Cancelling it locally would signal the server's own process: refused, with the way.
    let o = cli(&["cancel", &slow], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("--server"), "{}", text(&o.stderr));
    assert_eq!(
        json(&s, "GET", "/api/v1/runs", None).0,
        200,
        "the server still serves"
    );
    let o = cli(&["cancel", &slow, "--server", &url], Some(TOKEN));
    assert_ok(&o);
    wait_phase(&s, &slow, "Cancelled");
}
