//! People in the loop through the real `drivetrain serve` on loopback: tokens with roles
//! against every route, approvals that wait across kills and restarts, the audit log, and
//! OpenID Connect ID tokens from an issuer the test runs (keys and tokens made by PyJWT).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::http::{self, request, Server};
use crate::common::{assert_ok, run_id, text, Home};

/// `drivetrain token create --project P --role R --name N`: the secret it printed.
fn project_token(home: &Home, project: &str, role: &str, name: &str) -> String {
    let args = [
        "token",
        "create",
        "--project",
        project,
        "--role",
        role,
        "--name",
        name,
    ];
    let o = home.drivetrain(&args);
    assert_ok(&o);
    text(&o.stdout).trim().to_owned()
}

/// `drivetrain token create …`: the secret it printed.
fn token(home: &Home, name: &str, role: &str, approves: &[&str]) -> String {
    let mut args = vec!["token", "create", "--role", role, "--name", name];
    for a in approves {
        args.extend(["--approves", a]);
    }
    let o = home.drivetrain(&args);
    assert_ok(&o);
    let secret = text(&o.stdout).trim().to_owned();
    assert!(secret.starts_with("dt_") && secret.len() > 40, "{secret}");
    secret
}

fn served(home: &Home, name: &str, yaml: &str) {
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write(&format!("served/{name}.yaml"), yaml);
}

/// A gate that waits for `min` people of role `safety`, after a stage that leaves a
/// value, before one that writes a file.
fn gate(min: u32, timeout: &str) -> String {
    format!(
        r#"version: 1
name: gate{min}
stages:
  validate:
    run: {{command: [sh, -c, 'echo "{{\"accuracy\": 0.93}}" > "$DRIVETRAIN_VALUES"']}}
  release-gate:
    needs: [validate]
    approval:
      approvers: {{role: safety, min: {min}}}
      {timeout}
  promote:
    needs: [release-gate]
    run: {{command: [echo, promoted]}}
"#
    )
}

/// The status of one request, read from its head alone (event streams never end).
fn status(s: &Server, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        s.addr,
        body.len()
    );
    c.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap() == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn call(s: &Server, method: &str, path: &str, token: &str, body: Option<&str>) -> (u16, String) {
    request(s, method, path, Some(token), body)
}

fn submit(s: &Server, token: &str, pipeline: &str) -> String {
    let (code, body) = call(
        s,
        "POST",
        "/api/v1/runs",
        token,
        Some(&format!(r#"{{"pipeline": "{pipeline}"}}"#)),
    );
    assert_eq!(code, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["run"].as_str().unwrap().to_owned()
}

fn phase(s: &Server, token: &str, run: &str) -> serde_json::Value {
    let (code, body) = call(s, "GET", &format!("/api/v1/runs/{run}"), token, None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn wait_phase(s: &Server, token: &str, run: &str, want: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = phase(s, token, run);
        if v["run"]["phase"] == want {
            return v;
        }
        assert!(Instant::now() < deadline, "run {run} never {want}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The least role of the ladder each route needs, written here by hand (not read from
/// the server's table), or `approver` for routes only an approval role opens. Every
/// route of `docs/openapi.json` must be here: a new route without a rule fails.
fn expected() -> BTreeMap<(&'static str, &'static str), &'static str> {
    [
        ("get", "/metrics", "viewer"),
        ("get", "/api/v1/runs", "viewer"),
        ("post", "/api/v1/runs", "launcher"),
        ("get", "/api/v1/runs/{id}", "viewer"),
        ("post", "/api/v1/runs/{id}/cancel", "launcher"),
        ("post", "/api/v1/runs/{id}/rerun", "launcher"),
        ("post", "/api/v1/runs/{id}/retry", "launcher"),
        ("get", "/api/v1/runs/{id}/logs", "viewer"),
        ("get", "/api/v1/runs/{id}/graph", "viewer"),
        ("get", "/api/v1/runs/{id}/attempts", "viewer"),
        ("get", "/api/v1/runs/{id}/events", "viewer"),
        ("get", "/api/v1/runs/{id}/stages/{stage}/explain", "viewer"),
        ("get", "/api/v1/runs/{id}/stages/{stage}/history", "viewer"),
        ("get", "/api/v1/runs/{id}/stages/{stage}/items", "viewer"),
        ("get", "/api/v1/runs/{id}/stages/{stage}/trials", "viewer"),
        ("get", "/api/v1/events", "viewer"),
        ("get", "/api/v1/lineage", "viewer"),
        ("get", "/api/v1/registry", "viewer"),
        (
            "post",
            "/api/v1/registry/{model}/aliases/{alias}/rollback",
            "approver",
        ),
        ("get", "/api/v1/schedules", "viewer"),
        ("post", "/api/v1/schedules", "editor"),
        ("post", "/api/v1/schedules/{name}/suspend", "editor"),
        ("post", "/api/v1/schedules/{name}/resume", "editor"),
        ("post", "/api/v1/schedules/{name}/trigger", "launcher"),
        ("get", "/api/v1/triggers", "viewer"),
        (
            "post",
            "/api/v1/triggers/{pipeline}/{trigger}/pause",
            "editor",
        ),
        (
            "post",
            "/api/v1/triggers/{pipeline}/{trigger}/resume",
            "editor",
        ),
        ("get", "/api/v1/notifications", "viewer"),
        ("get", "/api/v1/approvals", "viewer"),
        (
            "post",
            "/api/v1/runs/{id}/stages/{stage}/approve",
            "approver",
        ),
        (
            "post",
            "/api/v1/runs/{id}/stages/{stage}/reject",
            "approver",
        ),
        ("get", "/api/v1/audit", "admin"),
        ("get", "/api/v1/whoami", "viewer"),
    ]
    .into_iter()
    .map(|(m, p, r)| ((m, p), r))
    .collect()
}

const LADDER: [&str; 4] = ["viewer", "launcher", "editor", "admin"];

/// Every role against every route of `docs/openapi.json`: 403 exactly where the table
/// above says the role may not; 401 without a token; every mutating request, allowed or
/// denied, in the audit log. A launcher may start a served pipeline but not post YAML.
#[test]
fn each_role_against_every_route() {
    let home = Home::new("roles");
    served(
        &home,
        "hello",
        "version: 1\nname: hello\nstages:\n  a:\n    run: {command: [\"true\"]}\n",
    );
    served(&home, "gate5", &gate(5, ""));
    let mut tokens: BTreeMap<&str, String> = LADDER
        .iter()
        .map(|r| (*r, token(&home, r, r, &[])))
        .collect();
    tokens.insert("approver", token(&home, "approver", "viewer", &["safety"]));
    assert_ok(&home.drivetrain(&["registry", "protect", "production", "--role", "safety"]));
    let s = http::start(&home, &[]);
    let admin = tokens["admin"].clone();
    // A run waiting for five people: the approval routes act on a real request.
    let run = submit(&s, &admin, "gate5");
    wait_phase(&s, &admin, &run, "Waiting");

    let doc = http::openapi();
    let table = expected();
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let rule = op["x-drivetrain-rule"].as_str().unwrap();
            if rule == "open" || rule == "signed" {
                continue;
            }
            let least = *table
                .get(&(method.as_str(), path.as_str()))
                .unwrap_or_else(|| {
                    panic!("{method} {path} (rule {rule}) is not in this test's table")
                });
            let concrete = path
                .replace("{id}", &run)
                .replace("{stage}", "release-gate")
                .replace("{name}", "hello")
                .replace("{pipeline}", "hello")
                .replace("{trigger}", "t")
                .replace("{model}", "lane-model")
                .replace("{alias}", "production");
            let body = (method == "post").then_some("{}");
            let m = method.to_uppercase();
            let code = status(&s, &m, &concrete, None, body);
            assert_eq!(code, 401, "{m} {concrete} without a token");
            for (role, secret) in &tokens {
                let allowed = match (least, *role) {
                    ("approver", r) => r == "approver",
                    (least, "approver") => least == "viewer",
                    (least, r) => {
                        LADDER.iter().position(|x| *x == r)
                            >= LADDER.iter().position(|x| *x == least)
                    }
                };
                let code = status(&s, &m, &concrete, Some(secret), body);
                assert_eq!(
                    code == 403,
                    !allowed,
                    "{role} {m} {concrete} (needs {least}): {code}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(
        checked,
        table.len() * tokens.len(),
        "every route of the table is in the document"
    );
    // Posted YAML runs any command: a launcher may not, an editor may.
    let yaml = serde_json::json!({"yaml": "version: 1\nname: y\nstages:\n  a:\n    run: {command: [\"true\"]}\n"}).to_string();
    let (code, body) = call(&s, "POST", "/api/v1/runs", &tokens["launcher"], Some(&yaml));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("author"), "{body}");
    let (code, body) = call(&s, "POST", "/api/v1/runs", &tokens["editor"], Some(&yaml));
    assert_eq!(code, 201, "{body}");
    // A revoked token opens nothing.
    assert_ok(&home.drivetrain(&["token", "revoke", "viewer"]));
    let (code, _) = call(&s, "GET", "/api/v1/runs", &tokens["viewer"], None);
    assert_eq!(code, 401);

    // The audit log has every mutating request, by whom, allowed or denied.
    let (code, body) = call(&s, "GET", "/api/v1/audit?limit=1000", &admin, None);
    assert_eq!(code, 200, "{body}");
    let log: serde_json::Value = serde_json::from_str(&body).unwrap();
    let entries = log["entries"].as_array().unwrap();
    let denied = |who: &str, action: &str| {
        entries.iter().any(|e| {
            e["subject"] == format!("token:{who}")
                && e["action"] == action
                && e["decision"] == "denied"
        })
    };
    assert!(denied("viewer", "runs.cancel"), "{log}");
    assert!(
        denied("admin", "runs.stages.approve"),
        "an admin is no safety approver: {log}"
    );
    assert!(denied("launcher", "runs.create"), "posted YAML: {log}");
    assert!(entries.iter().any(|e| e["subject"] == "token:approver"
        && e["action"] == "runs.stages.approve"
        && e["decision"] == "allowed"));
    // Token changes made on the command line are there too, as the local user's.
    let o = home.drivetrain(&["audit", "-o", "json", "-n", "1000"]);
    assert_ok(&o);
    let cli: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let actions: Vec<&str> = cli
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(actions.contains(&"tokens.create") && actions.contains(&"tokens.revoke"));
    // Nothing of the API edits or deletes it: no route but GET names it.
    let audit_ops = doc["paths"]["/api/v1/audit"].as_object().unwrap();
    assert_eq!(audit_ops.keys().collect::<Vec<_>>(), ["get"]);
    // The stored tokens are hashes: no secret is in the state store's file.
    let db = std::fs::read(home.dir.join(".drivetrain/state.db")).unwrap();
    for secret in tokens.values() {
        assert!(
            !db.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "a token's secret is in the state store"
        );
    }
    // `auth can` explains.
    let o = home.drivetrain(&["auth", "can", "launcher", "cancel", &format!("run/{run}")]);
    assert_ok(&o);
    assert!(text(&o.stdout).starts_with("allowed: cancel needs launcher"));
    let o = home.drivetrain(&[
        "auth",
        "can",
        "admin",
        "approve",
        &format!("approval/{run}/release-gate"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stdout).contains("needs the approval role `safety`"),
        "{}",
        text(&o.stdout)
    );
}

/// An approval through `serve`: it waits holding no process across a SIGKILL of the
/// server (and the engine in it) and a restart; one without the role is refused; two
/// people with the role approve and the run goes on; another run's timeout rejects it.
/// The wait is told of through the notifications outbox.
#[test]
fn approvals_wait_across_restarts_and_time_out() {
    let home = Home::new("approvals");
    served(&home, "gate2", &gate(2, ""));
    served(&home, "gate1", &gate(1, "timeout: 4s"));
    home.write(
        "notify.yaml",
        "notify:\n  - webhook: {url: \"http://127.0.0.1:9/hook\"}\n    on: [waiting]\n",
    );
    let alice = token(&home, "alice", "viewer", &["safety"]);
    let bob = token(&home, "bob", "viewer", &["safety"]);
    let carol = token(&home, "carol", "editor", &[]);
    let admin = token(&home, "admin", "admin", &[]);
    let mut s = http::start(&home, &["--notify", "notify.yaml"]);
    let run = submit(&s, &admin, "gate2");
    let timed = submit(&s, &admin, "gate1");
    let v = wait_phase(&s, &admin, &run, "Waiting");
    wait_phase(&s, &admin, &timed, "Waiting");
    let gate_stage = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["stage"] == "release-gate")
        .unwrap();
    assert_eq!(gate_stage["phase"], "Waiting", "{v}");

    // What people are asked, with the evidence.
    let (code, body) = call(&s, "GET", "/api/v1/approvals?waiting=true", &carol, None);
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let asked = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["run"] == run.as_str())
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(asked["role"], "safety");
    assert_eq!(asked["min"], 2);
    assert_eq!(
        asked["evidence"]["stages"]["validate"]["values"]["accuracy"],
        0.93
    );
    assert_eq!(
        asked["evidence"]["stages"]["validate"]["lineage"],
        format!("{run}/validate")
    );

    // The wait is told of (the sink is down: the notification waits in the outbox).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = call(&s, "GET", "/api/v1/notifications?limit=100", &admin, None);
        if body.contains(&format!("{run}/waiting/")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no `waiting` notification: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let approve = |s: &Server, who: &str| {
        call(
            s,
            "POST",
            &format!("/api/v1/runs/{run}/stages/release-gate/approve"),
            who,
            Some(r#"{"comment": "slices hold"}"#),
        )
    };
    let (code, body) = approve(&s, &carol);
    assert_eq!(code, 403, "an editor without `safety`: {body}");
    let (code, body) = approve(&s, &alice);
    assert_eq!(code, 200, "{body}");
    let a: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(a["outcome"].is_null(), "one of two: {a}");

    // The server (and every engine in it) killed, started again: the run still waits.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let s = http::start(&home, &["--notify", "notify.yaml"]);
    std::thread::sleep(Duration::from_secs(2));
    let v = phase(&s, &admin, &run);
    assert_eq!(v["run"]["phase"], "Waiting");
    assert!(
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|st| st["stage"] != "promote" || st["phase"] == "Pending"),
        "nothing after the gate ran: {v}"
    );
    let (code, body) = approve(&s, &alice);
    assert_eq!(code, 409, "one person, one vote: {body}");
    let (code, body) = approve(&s, &bob);
    assert_eq!(code, 200, "{body}");
    let a: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(a["outcome"], "approved", "{a}");
    let v = wait_phase(&s, &admin, &run, "Succeeded");
    let gate_stage = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["stage"] == "release-gate")
        .unwrap();
    assert_eq!(
        gate_stage["values"]["by"],
        serde_json::json!(["token:alice", "token:bob"]),
        "{v}"
    );

    // The other run timed out into a rejection: its gate failed, nothing after it ran.
    let v = wait_phase(&s, &admin, &timed, "Failed");
    let stages = v["stages"].as_array().unwrap();
    let find = |name: &str| stages.iter().find(|st| st["stage"] == name).unwrap();
    assert_eq!(find("release-gate")["phase"], "Failed", "{v}");
    assert!(
        find("release-gate")["reason"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{v}"
    );
    assert_eq!(find("promote")["phase"], "Omitted", "{v}");
    let (code, body) = call(
        &s,
        "POST",
        &format!("/api/v1/runs/{timed}/stages/release-gate/approve"),
        &alice,
        None,
    );
    assert_eq!(code, 409, "decided already: {body}");

    // A waiting run is cancelled without an engine; its approval takes no more votes.
    let third = submit(&s, &admin, "gate2");
    wait_phase(&s, &admin, &third, "Waiting");
    let (code, body) = call(
        &s,
        "POST",
        &format!("/api/v1/runs/{third}/cancel"),
        &admin,
        None,
    );
    assert_eq!(code, 202, "{body}");
    let v = wait_phase(&s, &admin, &third, "Cancelled");
    let stages = v["stages"].as_array().unwrap();
    assert!(stages
        .iter()
        .any(|st| st["stage"] == "release-gate" && st["phase"] == "Cancelled"));
    let (code, body) = call(
        &s,
        "POST",
        &format!("/api/v1/runs/{third}/stages/release-gate/approve"),
        &bob,
        None,
    );
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("ended"), "{body}");
}

/// The OpenID Connect issuer of `tests/people/issuer.py`, on a free port.
struct Issuer {
    child: std::process::Child,
    base: String,
}

impl Drop for Issuer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Issuer {
    fn start() -> Issuer {
        use std::io::BufRead;
        let mut child = std::process::Command::new(drivetrain_engine::testing::venv_bin("python"))
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/people/issuer.py"
            ))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the issuer said {line}"))
            .to_owned();
        Issuer { child, base }
    }

    fn get(&self, path_and_query: &str) -> String {
        let addr = self.base.trim_start_matches("http://");
        let (code, body) = http::raw(addr, "GET", path_and_query, None);
        assert_eq!(code, 200, "{body}");
        body
    }

    fn mint(&self, query: &str) -> String {
        self.get(&format!("/mint?{query}"))
    }
}

/// ID tokens of an issuer the test runs (PyJWT signs, RS256): a valid one maps its
/// groups to roles; an expired one, another issuer's, another audience's and a forged
/// signature are refused; after the issuer rotates its key, a token of the new key is
/// verified (the keys fetched again), and one of the old key is refused.
#[test]
fn openid_connect_tokens_are_verified() {
    let home = Home::new("oidc");
    served(
        &home,
        "hello",
        "version: 1\nname: hello\nstages:\n  a:\n    run: {command: [\"true\"]}\n",
    );
    let issuer = Issuer::start();
    home.write(
        "oidc.yaml",
        &format!(
            "issuer: {}\naudience: drivetrain\nroles:\n  - {{group: perception-eng, role: launcher}}\n  - {{group: safety-board, role: viewer, approves: [safety]}}\n",
            issuer.base
        ),
    );
    let s = http::start(&home, &["--oidc", "oidc.yaml"]);
    let whoami = |token: &str| call(&s, "GET", "/api/v1/whoami", token, None);

    let good = issuer.mint("sub=alice&groups=perception-eng,safety-board");
    let (code, body) = whoami(&good);
    assert_eq!(code, 200, "{body}");
    let me: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(me["subject"], format!("oidc:{}#alice", issuer.base));
    assert_eq!(me["grants"].as_array().unwrap().len(), 2, "{me}");
    assert!(me["may"]["default"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("launch")));
    // The roles hold: the launcher's group starts a served pipeline; a viewer's group
    // alone may not.
    let (code, body) = call(
        &s,
        "POST",
        "/api/v1/runs",
        &good,
        Some(r#"{"pipeline": "hello"}"#),
    );
    assert_eq!(code, 201, "{body}");
    let viewer = issuer.mint("sub=dave&groups=safety-board");
    let (code, _) = call(
        &s,
        "POST",
        "/api/v1/runs",
        &viewer,
        Some(r#"{"pipeline": "hello"}"#),
    );
    assert_eq!(code, 403);
    let nobody = issuer.mint("sub=eve&groups=marketing");
    let (code, body) = whoami(&nobody);
    assert_eq!(code, 403, "no group of hers has a role: {body}");

    for (what, query) in [
        ("expired", "exp=-120&groups=perception-eng"),
        (
            "another issuer",
            "iss=https://evil.example&groups=perception-eng",
        ),
        ("another audience", "aud=someone-else&groups=perception-eng"),
        ("a forged signature", "forge=1&groups=perception-eng"),
        ("an unknown key", "kid=k2&groups=perception-eng"),
    ] {
        let token = issuer.mint(query);
        let (code, body) = whoami(&token);
        assert_eq!(code, 401, "{what}: {body}");
    }
    // A token whose signature was cut or changed is refused too.
    let mut parts: Vec<&str> = good.split('.').collect();
    let tampered_sig = format!("{}x", &parts[2][..parts[2].len() - 1]);
    parts[2] = &tampered_sig;
    assert_eq!(whoami(&parts.join(".")).0, 401);

    // The issuer rotates its key: the new key's tokens are verified (the server fetches
    // the keys again for the unknown key id, at most once per 10 s: wait that out after
    // the unknown-key probe above), the old key's are refused.
    let addr = issuer.base.trim_start_matches("http://").to_owned();
    assert_eq!(http::raw(&addr, "POST", "/rotate", None).0, 200);
    std::thread::sleep(Duration::from_secs(11));
    let rotated = issuer.mint("kid=k2&sub=alice&groups=perception-eng");
    let (code, body) = whoami(&rotated);
    assert_eq!(code, 200, "after rotation: {body}");
    let old = issuer.mint("kid=k1&sub=alice&groups=perception-eng");
    let (code, body) = whoami(&old);
    assert_eq!(code, 401, "the old key is gone: {body}");
    // And the unknown key ids of a flood are not a flood at the issuer.
    for _ in 0..20 {
        assert_eq!(whoami(&issuer.mint("kid=k9&groups=x")).0, 401);
    }
    let stats: serde_json::Value = serde_json::from_str(&issuer.get("/stats")).unwrap();
    assert!(stats["jwks_fetches"].as_u64().unwrap() <= 4, "{stats}");
}

const MAKE_AND_PROMOTE: &str = r#"version: 1
name: NAME
stages:
  make:
    run: {command: [sh, -c, 'echo "{\"v\": 1}" > "$DRIVETRAIN_OUTPUT_MODEL/model.json"']}
    outputs: [model]
GATE
  promote:
    uses: promote
    NEEDS
    inputs: {model: make.model}
    with: {model: lane, alias: production}
    outputs: [registration]
"#;

/// A protected alias (`registry protect`) moves only through a run whose approval by its
/// role passed upstream of the stage that moves it; the move records who approved.
#[test]
fn a_protected_alias_moves_only_through_an_approval() {
    let home = Home::new("protect");
    assert_ok(&home.drivetrain(&["registry", "protect", "production", "--role", "safety"]));
    let bare = MAKE_AND_PROMOTE
        .replace("NAME", "bare")
        .replace("GATE\n", "")
        .replace("    NEEDS\n", "");
    home.write("bare.yaml", &bare);
    let o = home.drivetrain(&["run", "bare.yaml"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&crate::common::run_id(&o));
    let promote = crate::common::stage(&st, "promote");
    assert_eq!(promote["phase"], "Error", "{st}");
    assert!(
        promote["reason"]
            .as_str()
            .unwrap()
            .contains("alias `production` is protected"),
        "{st}"
    );

    // In a project: its promotion lands in the project's own registry.
    let gated = MAKE_AND_PROMOTE
        .replace("NAME", "gated\nproject: perception")
        .replace(
            "GATE\n",
            "  gate:\n    needs: [make]\n    approval: {approvers: {role: safety}}\n",
        )
        .replace("    NEEDS\n", "    needs: [gate]\n");
    home.write("gated.yaml", &gated);
    let o = home.drivetrain(&["run", "gated.yaml"]);
    assert_eq!(o.status.code(), Some(3), "waits: {}", text(&o.stdout));
    let run = crate::common::run_id(&o);
    let o = home.drivetrain(&[
        "approve",
        &run,
        "gate",
        "--comment",
        "regression suite green",
    ]);
    assert_ok(&o);
    let st = home.status(&run);
    assert_eq!(st["run"]["phase"], "Succeeded", "{st}");
    let o = home.drivetrain(&["registry", "list", "-o", "json"]);
    assert_ok(&o);
    assert_eq!(
        text(&o.stdout).trim(),
        "[]",
        "nothing in the default project's registry"
    );
    let o = home.drivetrain(&[
        "registry",
        "--project",
        "perception",
        "history",
        "lane",
        "-o",
        "json",
    ]);
    assert_ok(&o);
    let history: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let moves = history.as_array().unwrap();
    let last = moves.last().unwrap_or_else(|| panic!("{history}"));
    assert_eq!(last["alias"], "production", "{history}");
    let approvals = &last["note"]["approvals"];
    assert_eq!(approvals[0]["stage"], "gate", "{history}");
    assert_eq!(approvals[0]["role"], "safety", "{history}");
    assert!(
        approvals[0]["by"][0].as_str().unwrap().starts_with("user:"),
        "{history}"
    );
}

/// A pipeline of project `project` whose `make` writes the same bytes in every project
/// (sleeping first: then keyed by its run, so that no run of it is a cache hit).
fn project_pipeline(name: &str, project: &str, sleep: &str) -> String {
    let slow = match sleep {
        "0" => "",
        _ => " {{ run.id }}",
    };
    format!(
        r#"version: 1
name: {name}
project: {project}
stages:
  make:
    run: {{command: [sh, -c, 'sleep {sleep}; echo same > "$DRIVETRAIN_OUTPUT_OUT/x"']}}
    env: {{SLOW: "{sleep}{slow}"}}
    outputs: [out]
  use:
    inputs: {{out: make.out}}
    run: {{command: [cat, "{{{{ inputs.out }}}}/x"]}}
"#
    )
}

fn stage_of<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == name)
        .unwrap_or_else(|| panic!("no stage {name}: {v}"))
}

/// Two projects on one server share no cache entry, and neither's token reads the
/// other's runs, logs, artifacts or lineage, nor starts the other's pipelines; a project's
/// quota of two runs holds under six concurrent submissions (the rest wait, Pending).
#[test]
fn two_projects_share_nothing_and_a_quota_holds() {
    let home = Home::new("projects");
    let a = project_pipeline("a", "alpha", "0");
    served(
        &home,
        "a",
        &a.replacen("stages:", "schedule: {cron: \"0 3 * * *\"}\nstages:", 1),
    );
    served(&home, "b", &project_pipeline("b", "beta", "0"));
    served(&home, "slow", &project_pipeline("slow", "alpha", "3"));
    let of_project =
        |project: &str, role: &str, name: &str| project_token(&home, project, role, name);
    let alpha = of_project("alpha", "launcher", "alpha");
    let beta = of_project("beta", "launcher", "beta");
    let beta_admin = of_project("beta", "admin", "beta-admin");
    assert_ok(&home.drivetrain(&["project", "quota", "alpha", "--max-runs", "2"]));
    let s = http::start(&home, &[]);

    let a1 = submit(&s, &alpha, "a");
    let v = wait_phase(&s, &alpha, &a1, "Succeeded");
    assert_eq!(v["run"]["project"], "alpha");
    assert_eq!(stage_of(&v, "make")["origin"], "ran");
    let b1 = submit(&s, &beta, "b");
    let v = wait_phase(&s, &beta, &b1, "Succeeded");
    assert_eq!(
        stage_of(&v, "make")["origin"],
        "ran",
        "no cache hit across projects: {v}"
    );
    let a2 = submit(&s, &alpha, "a");
    let v = wait_phase(&s, &alpha, &a2, "Succeeded");
    assert_eq!(
        stage_of(&v, "make")["origin"],
        "cached",
        "a hit within the project: {v}"
    );
    // Each project's artifacts under its own prefix of the store, none at the top.
    let store = home.dir.join(".drivetrain/artifacts");
    for (project, run) in [("alpha", &a1), ("beta", &b1)] {
        let own = store.join(format!("projects/{project}/runs/{run}/make/1/out/x"));
        assert!(own.is_file(), "{} is missing", own.display());
        assert!(!store.join(format!("runs/{run}")).exists());
    }
    let (code, body) = call(
        &s,
        "GET",
        &format!("/api/v1/runs/{b1}/logs?stage=use"),
        &beta,
        None,
    );
    assert_eq!(
        (code, body.trim()),
        (200, "same"),
        "its log, from its project's store"
    );

    // Beta's tokens see nothing of alpha's.
    for (m, path) in [
        ("GET", format!("/api/v1/runs/{a1}")),
        ("GET", format!("/api/v1/runs/{a1}/logs?stage=use")),
        ("GET", format!("/api/v1/runs/{a1}/graph")),
        ("POST", format!("/api/v1/runs/{a1}/rerun")),
        ("POST", format!("/api/v1/runs/{a1}/cancel")),
    ] {
        let body = (m == "POST").then_some(r#"{"stages": ["use"]}"#);
        let (code, answer) = call(&s, m, &path, &beta_admin, body);
        assert_eq!(code, 403, "{m} {path}: {answer}");
    }
    let (code, _) = call(
        &s,
        "POST",
        "/api/v1/runs",
        &beta,
        Some(r#"{"pipeline": "a"}"#),
    );
    assert_eq!(code, 403, "beta starts no pipeline of alpha");
    let schedules = |token: &str| {
        let (_, body) = call(&s, "GET", "/api/v1/schedules", token, None);
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["schedules"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(
        (schedules(&alpha), schedules(&beta_admin)),
        (1, 0),
        "alpha's schedule is alpha's"
    );
    let (_, body) = call(&s, "GET", "/api/v1/runs?limit=100", &beta_admin, None);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [b1.as_str()], "{list}");
    let (code, _) = call(
        &s,
        "GET",
        &format!("/api/v1/lineage?target={a1}/use"),
        &beta_admin,
        None,
    );
    assert_eq!(code, 404, "alpha's lineage is not beta's to walk");
    let (_, body) = call(&s, "GET", &format!("/api/v1/runs/{a1}"), &alpha, None);
    let detail: serde_json::Value = serde_json::from_str(&body).unwrap();
    let digest = stage_of(&detail, "make")["outputs"]["out"]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("{detail}"))
        .to_owned();
    let (code, _) = call(
        &s,
        "GET",
        &format!("/api/v1/lineage?target={digest}"),
        &beta_admin,
        None,
    );
    assert_eq!(code, 404, "alpha's artifact by digest");
    let (code, body) = call(
        &s,
        "GET",
        &format!("/api/v1/lineage?target={digest}"),
        &alpha,
        None,
    );
    assert_eq!(code, 200, "{body}");
    // Beta's lineage never reaches alpha: its `use` read its own `make`.
    let (_, body) = call(
        &s,
        "GET",
        &format!("/api/v1/lineage?target={b1}/use"),
        &beta_admin,
        None,
    );
    assert!(!body.contains(&a1) && !body.contains(&a2), "{body}");
    // The audit log of beta's admin holds beta's entries only.
    let (_, body) = call(&s, "GET", "/api/v1/audit?limit=1000", &beta_admin, None);
    let log: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        log["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["project"] == "beta"),
        "{log}"
    );

    // `/metrics`: a project's stage series go to its own readers only (issue 46).
    let (_, m) = call(&s, "GET", "/metrics", &beta_admin, None);
    assert!(
        !m.contains("project=\"alpha\"") && !m.contains("pipeline=\"a\""),
        "{m}"
    );
    let doctor = home.drivetrain(&["doctor", "-o", "json"]);
    if crate::common::doctor_layer(&doctor, "cgroup limits")["active"] == true {
        let (_, m) = call(&s, "GET", "/metrics", &alpha, None);
        let alphas = "pipeline=\"a\",stage=\"make\",project=\"alpha\"";
        assert!(m.contains(alphas) && !m.contains("project=\"beta\""), "{m}");
        let (_, m) = call(&s, "GET", "/metrics", &beta, None);
        assert!(m.contains("project=\"beta\""), "{m}");
    }

    // Six runs of alpha at once: never more than two in flight, the rest Pending.
    let runs: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6)
            .map(|_| sc.spawn(|| submit(&s, &alpha, "slow")))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let pending = runs
        .iter()
        .filter(|r| phase(&s, &alpha, r)["run"]["phase"] == "Pending")
        .count();
    assert!(pending >= 4, "{pending} of 6 wait for the quota");
    let mut edges: Vec<(String, i32)> = Vec::new();
    for r in &runs {
        let v = wait_phase(&s, &alpha, r, "Succeeded");
        let make = stage_of(&v, "make");
        edges.push((make["started_at"].as_str().unwrap().to_owned(), 1));
        edges.push((make["finished_at"].as_str().unwrap().to_owned(), -1));
    }
    // Same-format UTC times sort as text; an end before a start at the same instant.
    edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0, 0);
    for (_, d) in &edges {
        now += d;
        most = most.max(now);
    }
    assert_eq!(most, 2, "the quota is 2 runs at once: {edges:?}");
}

/// A pipeline name belongs to one project (issue 46): an editor of beta who posts
/// alpha's pipeline name with `replace: true` is refused, the served file stays alpha's,
/// alpha still launches it, and the refusal is in the audit log; an editor of alpha
/// replaces it within alpha.
#[test]
fn a_project_cannot_take_over_anothers_pipeline() {
    let home = Home::new("takeover");
    let scheduled = |project: &str| {
        project_pipeline("a", project, "0").replacen(
            "stages:",
            "schedule: {cron: \"0 3 * * *\"}\nstages:",
            1,
        )
    };
    served(&home, "a", &scheduled("alpha"));
    let token = |project: &str, role: &str, name: &str| project_token(&home, project, role, name);
    let alpha = token("alpha", "launcher", "alpha");
    let alpha_editor = token("alpha", "editor", "alpha-editor");
    let beta_editor = token("beta", "editor", "beta-editor");
    let s = http::start(&home, &[]);
    let post = |token: &str, project: &str| {
        let body = serde_json::json!({"yaml": scheduled(project), "replace": true}).to_string();
        call(&s, "POST", "/api/v1/schedules", token, Some(&body))
    };
    let (code, body) = post(&beta_editor, "beta");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("belongs to project `alpha`"), "{body}");
    let file = std::fs::read_to_string(home.dir.join("served/a.yaml")).unwrap();
    assert!(
        file.contains("project: alpha"),
        "the served file stays alpha's: {file}"
    );
    let run = submit(&s, &alpha, "a");
    assert_eq!(
        wait_phase(&s, &alpha, &run, "Succeeded")["run"]["project"],
        "alpha"
    );
    let (_, schedules) = call(&s, "GET", "/api/v1/schedules", &beta_editor, None);
    assert!(
        !schedules.contains("\"a\""),
        "beta reads none of alpha's schedule: {schedules}"
    );
    let (code, body) = post(&alpha_editor, "alpha");
    assert_eq!(code, 201, "replaced within its project: {body}");
    let audit = home.drivetrain(&["audit", "-o", "json", "-n", "1000"]);
    assert_ok(&audit);
    let entries: serde_json::Value = serde_json::from_slice(&audit.stdout).unwrap();
    let refused = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["subject"] == "token:beta-editor" && e["action"] == "schedules.create")
        .unwrap_or_else(|| panic!("{entries}"));
    assert_eq!(refused["decision"], "denied", "{refused}");
    assert_eq!(
        refused["project"], "alpha",
        "alpha's admin sees it: {refused}"
    );
}

/// `explain` compares a stage with cache entries of its own project only (issue 46): a
/// pipeline of the same name in another project, run with other values, is never the
/// closest entry, and nothing of its definition is shown.
#[test]
fn explain_stays_inside_the_runs_project() {
    let home = Home::new("explain-projects");
    let pipeline = |project: &str, value: &str| {
        format!(
            "version: 1\nname: p\nproject: {project}\nstages:\n  make:\n    env: {{HINT: \"{value}\"}}\n    run: {{command: [sh, -c, 'echo \"$HINT\" > \"$DRIVETRAIN_OUTPUT_OUT/x\"']}}\n    outputs: [out]\n"
        )
    };
    let run = |file: &str, yaml: &str| {
        home.write(file, yaml);
        let o = home.drivetrain(&["run", file]);
        assert_ok(&o);
        run_id(&o)
    };
    let beta = run("beta.yaml", &pipeline("beta", "beta-only-value"));
    let alpha1 = run("alpha1.yaml", &pipeline("alpha", "first"));
    let alpha2 = run("alpha2.yaml", &pipeline("alpha", "second"));
    let o = home.drivetrain(&["explain", &alpha2, "make", "-o", "json"]);
    assert_ok(&o);
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["compared_with_run"], alpha1.as_str(), "{e}");
    let printed = text(&o.stdout);
    assert!(
        !printed.contains("beta-only-value") && !printed.contains(&beta),
        "{printed}"
    );
    // Alpha's first run is compared with its second, never with beta's.
    let o = home.drivetrain(&["explain", &alpha1, "make", "-o", "json"]);
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["compared_with_run"], alpha2.as_str(), "{e}");
    // Beta's only run has no other entry of its own project.
    let o = home.drivetrain(&["explain", &beta, "make", "-o", "json"]);
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        e["compared_with_run"].is_null(),
        "alpha's runs are not beta's: {e}"
    );
}

/// Notifications follow the run's project (issue 46): a run of project beta named like
/// alpha's served pipeline is told to the server's sinks only, never to alpha's own, and
/// shows in beta's list of notifications, not in alpha's; a posted pipeline may not take
/// a name alpha serves.
#[test]
fn notifications_follow_the_runs_project() {
    let home = Home::new("notify-projects");
    let alpha_sink =
        "notify:\n  - webhook: {url: \"http://127.0.0.1:9/alpha\"}\n    on: [succeeded]\n";
    served(
        &home,
        "a",
        &(project_pipeline("a", "alpha", "0") + alpha_sink),
    );
    home.write("beta-a.yaml", &project_pipeline("a", "beta", "0"));
    let o = home.drivetrain(&["run", "beta-a.yaml"]);
    assert_ok(&o);
    let beta_run = run_id(&o);
    home.write(
        "notify.yaml",
        "notify:\n  - webhook: {url: \"http://127.0.0.1:9/all\"}\n    on: [succeeded]\n",
    );
    let token = |project: &str, role: &str, name: &str| project_token(&home, project, role, name);
    let everyone = token("*", "admin", "everyone");
    let alpha = token("alpha", "editor", "alpha");
    let beta = token("beta", "viewer", "beta");
    let s = http::start(&home, &["--notify", "notify.yaml"]);
    let alpha_run = submit(&s, &alpha, "a");
    wait_phase(&s, &alpha, &alpha_run, "Succeeded");
    let ids = |token: &str| {
        let (code, body) = call(&s, "GET", "/api/v1/notifications?limit=1000", token, None);
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<String> = v["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap().to_owned())
            .collect();
        ids
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let all = loop {
        let all = ids(&everyone);
        let told = |run: &str| {
            all.iter()
                .any(|i| i.starts_with(&format!("{run}/succeeded/")))
        };
        if told(&beta_run) && told(&alpha_run) {
            break all;
        }
        assert!(Instant::now() < deadline, "not yet in the outbox: {all:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let of = |run: &str| -> Vec<&String> {
        all.iter()
            .filter(|i| i.starts_with(&format!("{run}/")))
            .collect()
    };
    assert!(
        of(&beta_run).iter().all(|i| !i.ends_with("/notify[0]")),
        "beta's run is not told to alpha's sink: {all:?}"
    );
    assert!(
        of(&alpha_run).iter().any(|i| i.ends_with("/notify[0]")),
        "{all:?}"
    );
    let alpha_sees = ids(&alpha);
    assert!(
        alpha_sees.iter().all(|i| !i.starts_with(&beta_run)),
        "{alpha_sees:?}"
    );
    assert!(
        alpha_sees.iter().any(|i| i.starts_with(&alpha_run)),
        "{alpha_sees:?}"
    );
    let beta_sees = ids(&beta);
    assert!(
        beta_sees.iter().any(|i| i.starts_with(&beta_run)),
        "{beta_sees:?}"
    );
    assert!(
        beta_sees.iter().all(|i| !i.starts_with(&alpha_run)),
        "{beta_sees:?}"
    );
    // Nor can a posted pipeline of beta take alpha's name now.
    let beta_editor = token("beta", "editor", "beta-editor");
    let body = serde_json::json!({"yaml": project_pipeline("a", "beta", "0")}).to_string();
    let (code, answer) = call(&s, "POST", "/api/v1/runs", &beta_editor, Some(&body));
    assert_eq!(code, 403, "{answer}");
    assert!(answer.contains("belongs to project `alpha`"), "{answer}");
}

/// Every route of `docs/openapi.json`, for every role of project beta, with alpha's ids
/// (issue 46): nothing of alpha is changed (no 2xx on a mutating route) and nothing of it
/// is read (an answer that is not a refusal names no run, pipeline or project of alpha).
#[test]
fn every_route_with_another_projects_ids_gives_nothing_of_it() {
    let home = Home::new("walk");
    let a = project_pipeline("a", "alpha", "0");
    served(
        &home,
        "a",
        &a.replacen("stages:", "schedule: {cron: \"0 3 * * *\"}\nstages:", 1),
    );
    served(
        &home,
        "gate5",
        &gate(5, "").replacen("name: gate5", "name: gate5\nproject: alpha", 1),
    );
    let alpha = project_token(&home, "alpha", "admin", "alpha-admin");
    let mut beta: Vec<(String, String)> = LADDER
        .iter()
        .map(|r| {
            (
                r.to_string(),
                project_token(&home, "beta", r, &format!("beta-{r}")),
            )
        })
        .collect();
    let o = home.drivetrain(&[
        "token",
        "create",
        "--project",
        "beta",
        "--role",
        "viewer",
        "--approves",
        "safety",
        "--name",
        "beta-approver",
    ]);
    assert_ok(&o);
    beta.push(("approver".into(), text(&o.stdout).trim().to_owned()));
    let s = http::start(&home, &[]);
    let done = submit(&s, &alpha, "a");
    wait_phase(&s, &alpha, &done, "Succeeded");
    let waiting = submit(&s, &alpha, "gate5");
    wait_phase(&s, &alpha, &waiting, "Waiting");
    let secrets = [
        done.as_str(),
        waiting.as_str(),
        "\"alpha\"",
        "gate5",
        "pipeline\":\"a\"",
        "pipeline=\"a\"",
    ];
    let doc = http::openapi();
    let mut walked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let rule = op["x-drivetrain-rule"].as_str().unwrap();
            if rule == "open" || rule == "signed" {
                continue;
            }
            let run = if path.contains("{stage}") {
                &waiting
            } else {
                &done
            };
            let mut concrete = path
                .replace("{id}", run)
                .replace("{stage}", "release-gate")
                .replace("{name}", "a")
                .replace("{pipeline}", "a")
                .replace("{trigger}", "t")
                .replace("{model}", "lane-model")
                .replace("{alias}", "production");
            if path.contains("registry") {
                concrete.push_str("?project=alpha");
            }
            if path.ends_with("/logs") {
                concrete.push_str("?stage=use");
            }
            let m = method.to_uppercase();
            let body = (m == "POST").then_some(r#"{"stages": ["use"]}"#);
            for (role, token) in &beta {
                walked += 1;
                // A stream answers with its status; its events are counts and phases of
                // what the caller may read, checked by the routes that list them.
                if path.ends_with("/events") {
                    let code = status(&s, &m, &concrete, Some(token), None);
                    assert!(
                        path == "/api/v1/events" || code >= 400,
                        "{role} {m} {concrete}: {code}"
                    );
                    continue;
                }
                let (code, answer) = call(&s, &m, &concrete, token, body);
                if m == "POST" {
                    assert!(
                        code >= 400,
                        "{role} {m} {concrete} changed alpha's: {code} {answer}"
                    );
                }
                if code < 400 {
                    for secret in secrets {
                        assert!(
                            !answer.contains(secret),
                            "{role} {m} {concrete} shows {secret}: {answer}"
                        );
                    }
                }
            }
        }
    }
    assert!(walked > 100, "{walked} requests");
    // Alpha's run still waits, its schedule still runs.
    assert_eq!(phase(&s, &alpha, &waiting)["run"]["phase"], "Waiting");
    let (_, body) = call(&s, "GET", "/api/v1/schedules", &alpha, None);
    assert!(body.contains("\"suspended\":false"), "{body}");
}

/// `gc` sweeps every project's prefix of the store, not only the default one's.
#[test]
fn gc_sweeps_the_prefix_of_each_project() {
    let home = Home::new("project-gc");
    home.write("a.yaml", &project_pipeline("a", "alpha", "0"));
    let o = home.drivetrain(&["run", "a.yaml"]);
    assert_ok(&o);
    let run = crate::common::run_id(&o);
    let own = home
        .dir
        .join(format!(".drivetrain/artifacts/projects/alpha/runs/{run}"));
    assert!(own.is_dir());
    let o = home.drivetrain(&["gc", "--keep-days", "0"]);
    assert_ok(&o);
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!(
            "would delete  projects/alpha/runs/{run}/make/1/out/x"
        )),
        "{out}"
    );
    assert!(own.is_dir(), "a dry run deletes nothing");
    assert_ok(&home.drivetrain(&["gc", "--keep-days", "0", "--apply"]));
    assert!(!own.join("make/1/out/x").exists());
}

/// An approval stage that would run or read something is refused, located.
#[test]
fn an_approval_stage_that_runs_something_is_refused() {
    let home = Home::new("approval-invalid");
    home.write(
        "bad.yaml",
        "version: 1\nname: bad\nstages:\n  a:\n    run: {command: [\"true\"]}\n  gate:\n    needs: [a]\n    timeout: 1h\n    approval: {approvers: {role: safety, min: 0}}\n",
    );
    let o = home.drivetrain(&["validate", "bad.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("bad.yaml:8:5"), "{err}");
    assert!(err.contains("`approval.timeout`"), "{err}");
    assert!(err.contains("`min` is at least 1"), "{err}");
    assert!(err.contains("stages.gate.approval.approvers.min"), "{err}");
}

/// On a local store a stage does not see another project's artifacts, even by path: a
/// stage of beta, and one of the default project, cannot read a file alpha's run made,
/// which a stage of alpha reads.
#[test]
fn a_stage_does_not_see_another_projects_artifacts() {
    let home = Home::new("project-sandbox");
    home.write("a.yaml", &project_pipeline("a", "alpha", "0"));
    let o = home.drivetrain(&["run", "a.yaml"]);
    assert_ok(&o);
    let run = crate::common::run_id(&o);
    let made = home.dir.join(format!(
        ".drivetrain/artifacts/projects/alpha/runs/{run}/make/1/out/x"
    ));
    assert!(made.is_file());
    let peek = |project: &str| {
        let project_line = match project {
            "" => String::new(),
            p => format!("project: {p}\n"),
        };
        home.write(
            "peek.yaml",
            &format!(
                "version: 1\nname: peek\n{project_line}stages:\n  look:\n    run: {{command: [cat, \"{}\"]}}\n",
                made.display()
            ),
        );
        home.drivetrain(&["run", "peek.yaml"]).status.code()
    };
    assert_eq!(peek("alpha"), Some(0), "alpha reads its own");
    assert_eq!(peek("beta"), Some(1), "beta does not see alpha's");
    assert_eq!(
        peek(""),
        Some(1),
        "the default project does not see alpha's"
    );
}

/// `drivetrain ui` keeps no loops, but a decision made through it resumes its run there.
#[test]
fn a_run_approved_through_the_ui_goes_on() {
    let home = Home::new("approve-ui");
    served(&home, "gate1", &gate(1, ""));
    let approver = token(&home, "alice", "viewer", &["safety"]);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    cmd.args(["ui", "--pipelines", "served", "--bind", "127.0.0.1:0"])
        .args(["--token", http::TOKEN])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env_remove("DRIVETRAIN_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let s = http::start_command(cmd);
    let run = submit(&s, http::TOKEN, "gate1");
    wait_phase(&s, http::TOKEN, &run, "Waiting");
    let (code, body) = call(
        &s,
        "POST",
        &format!("/api/v1/runs/{run}/stages/release-gate/approve"),
        &approver,
        None,
    );
    assert_eq!(code, 200, "{body}");
    let v = wait_phase(&s, http::TOKEN, &run, "Succeeded");
    assert_eq!(stage_of(&v, "promote")["phase"], "Succeeded", "{v}");
}
