//! A client of `drivetrain serve` for the tests: the real binary on loopback, plain
//! HTTP/1.1 over a TCP socket, and every answer checked against `docs/openapi.json`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Home;

pub const TOKEN: &str = "t0ken-for-tests";

pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(home: &Home, extra: &[&str]) -> Server {
    start_wrapped(home, &[], extra)
}

/// `serve` of `served/` with `extra`, started through `wrapper` (a command that execs
/// the binary it is given after its own arguments, such as `sh -c '… exec "$0" "$@"'`).
pub fn start_wrapped(home: &Home, wrapper: &[&str], extra: &[&str]) -> Server {
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(env!("CARGO_BIN_EXE_drivetrain"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_drivetrain")),
    };
    cmd.args(["serve", "--pipelines", "served", "--bind", "127.0.0.1:0"])
        .args(extra)
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env_remove("DRIVETRAIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    start_command(cmd)
}

/// A home's `served/hello.yaml`: one stage of `true`.
pub fn serve_hello(home: &Home) {
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write(
        "served/hello.yaml",
        "version: 1\nname: hello\nstages:\n  a:\n    run: {command: [\"true\"]}\n",
    );
}

/// Starts `cmd` (a `serve` with its stdout piped) and waits for the address it prints.
pub fn start_command(mut cmd: Command) -> Server {
    let mut child = cmd.spawn().unwrap();
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
pub fn request(
    s: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    request_to(s, &s.addr, method, path, token, body)
}

/// One request with `host` as its `Host` header.
pub fn request_to(
    s: &Server,
    host: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    request_raw(&s.addr, host, method, path, &headers, body)
}

/// One request to `addr` with `headers`, its answer checked against `docs/openapi.json`:
/// (status, body).
pub fn request_raw(
    addr: &str,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
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
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let json = head
        .to_ascii_lowercase()
        .contains("content-type: application/json");
    documented(method, path, status, json.then_some(body));
    (status, body.to_owned())
}

/// `docs/openapi.json`.
pub fn openapi() -> &'static serde_json::Value {
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
                .unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// Fails the test unless `docs/openapi.json` documents `status` for the route of
/// `method path` and, for a JSON body, the body matches the documented schema. Every
/// request of these tests goes through here.
pub fn documented(method: &str, path: &str, status: u16, json_body: Option<&str>) {
    let doc = openapi();
    let path = path.split('?').next().unwrap();
    let segs: Vec<&str> = path.split('/').collect();
    let (template, ops) = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(t, _)| {
            let ts: Vec<&str> = t.split('/').collect();
            ts.len() == segs.len()
                && ts
                    .iter()
                    .zip(&segs)
                    .all(|(t, s)| t.starts_with('{') || t == s)
        })
        .unwrap_or_else(|| panic!("{path} is not in docs/openapi.json"));
    let op = &ops[method.to_lowercase()];
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {template} answered {status}, which docs/openapi.json does not document"
    );
    if let Some(body) = json_body {
        let mut schema = response["content"]["application/json"]["schema"].clone();
        assert!(
            schema.is_object(),
            "{method} {template} {status}: JSON is not documented"
        );
        schema["components"] = doc["components"].clone();
        let instance: serde_json::Value = serde_json::from_str(body).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {template} {status} does not match docs/openapi.json: {errors:?}\n{body}"
        );
    }
}

pub fn json(s: &Server, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let (status, text) = request(s, method, path, Some(TOKEN), body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

pub fn wait_phase(s: &Server, run: &str, phase: &str) -> serde_json::Value {
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

/// One request to a server that is not drivetrain's (no document to check it against):
/// (status, body).
pub fn raw(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let status: u16 = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}
