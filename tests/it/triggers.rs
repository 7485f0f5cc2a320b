//! Triggers and notifications of `drivetrain serve`, as real processes on the wall clock:
//! objects landing under a local prefix and in moto's S3 (discovered by listing, and
//! from moto's real S3 -> SQS event notifications) start runs in batches, each object
//! consumed by exactly one run; pausing queues them; every run's end reaches a
//! CloudEvents receiver that validates each request with the `cloudevents` SDK, a
//! Slack-style webhook and an SMTP server (`aiosmtpd`); and `serve` killed with SIGKILL at
//! random moments while objects land loses no object, starts no batch twice and tells of
//! every run's end once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::{assert_ok, env_pairs, text, Home};
use drivetrain_engine::testing::{free_port, venv_bin, S3Server};

fn events_script(name: &str) -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/events/").to_owned() + name
}

/// Polls `f` every 200 ms until it is `Some`, for at most `secs`.
fn wait<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs (newest first) as `list -o json` gives them.
fn runs(home: &Home, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let o = home.drivetrain_env(&["list", "-n", "1000", "-o", "json"], env);
    serde_json::from_slice(&o.stdout).unwrap_or_default()
}

/// The objects (URLs) a run consumed, by `status -o json`.
fn consumed(home: &Home, run: &str, env: &[(&str, &str)]) -> Vec<String> {
    let o = home.drivetrain_env(&["status", run, "-o", "json"], env);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["trigger"]["objects"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| o["url"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn trigger_show(home: &Home, name: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let o = home.drivetrain_env(&["trigger", "show", name, "-o", "json"], env);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Lands an object as a writer should in a local prefix: written aside (a dot-file the
/// triggers' globs do not match) and renamed into place, so a listing never sees it half
/// written (a file growing in place has a new ETag at each size: each would be an object).
fn land(dir: &Path, key: &str, text: &str) {
    let p = dir.join(key);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let tmp = dir.join(format!(".{}.part", key.replace('/', "_")));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
}

fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A child killed when dropped, a failed test's too.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        kill9(&mut self.0);
    }
}

#[test]
fn objects_under_a_local_prefix_start_runs_in_batches_each_object_once() {
    let home = Home::new("trigger-local");
    let incoming = home.dir.join("incoming");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    std::fs::create_dir_all(&incoming).unwrap();
    home.write(
        "scheduled/fleet.yaml",
        &format!(
            r#"
version: 1
name: fleet-ingest
params:
  manifest: {{type: string, default: ""}}
  count: {{type: integer, default: 0}}
triggers:
  new-logs:
    objects: {{source: "file://{}/", match: "**/*.mcap", poll: 300ms}}
    batch: {{min_items: 3, max_wait: 2s}}
    params: {{manifest: "{{{{ trigger.manifest }}}}", count: "{{{{ trigger.count }}}}"}}
  gone:
    objects: {{source: "file://{}/not-there/"}}
stages:
  read:
    run: {{command: [sh, -c, 'echo "count $2"; cat "$1"', read, "{{{{ params.manifest }}}}", "{{{{ params.count }}}}"]}}
"#,
            incoming.display(),
            home.dir.display()
        ),
    );
    let mut serve = Killed(home.serve(&[]));
    for k in [
        "veh1/a.mcap",
        "veh1/b.mcap",
        "veh2/c.mcap",
        "veh2/notes.txt",
    ] {
        land(&incoming, k, k);
    }
    let first = wait(20, "a run for three objects", || {
        runs(&home, &[])
            .into_iter()
            .find(|r| r["phase"] == "Succeeded")
    });
    let first = first["id"].as_str().unwrap().to_owned();
    let status = home.status(&first);
    assert_eq!(status["run"]["trigger"], "trigger");
    assert_eq!(status["trigger"]["name"], "new-logs");
    let mut got = consumed(&home, &first, &[]);
    got.sort();
    let url = |k: &str| format!("file://{}/{k}", incoming.display());
    assert_eq!(
        got,
        [url("veh1/a.mcap"), url("veh1/b.mcap"), url("veh2/c.mcap")],
        "the glob, once each"
    );
    // The stage read its batch's manifest and count through its params.
    let log = text(&home.drivetrain(&["logs", &first, "--stage", "read"]).stdout);
    assert!(
        log.contains("count 3") && log.contains(&url("veh2/c.mcap")),
        "{log}"
    );

    // One more object: too few for a batch, so it goes after max_wait.
    land(&incoming, "veh3/d.mcap", "d");
    let second = wait(20, "a run after max_wait", || {
        runs(&home, &[])
            .into_iter()
            .find(|r| r["id"] != first.as_str() && r["phase"] == "Succeeded")
    });
    let second = second["id"].as_str().unwrap().to_owned();
    assert_eq!(consumed(&home, &second, &[]), [url("veh3/d.mcap")]);
    let show = trigger_show(&home, "new-logs", &[]);
    assert!(show["last_reason"].as_str().is_some(), "{show}");
    // A prefix that cannot be read says so where people look.
    let gone = trigger_show(&home, "gone", &[]);
    assert!(
        gone["last_reason"]
            .as_str()
            .is_some_and(|r| r.contains("not-there")),
        "{gone}"
    );
    assert_eq!(show["consumed"], 4);

    // `forget` finds the runs an object started.
    let forget = home.drivetrain(&[
        "forget",
        &incoming.join("veh3/d.mcap").display().to_string(),
    ]);
    assert!(
        text(&forget.stdout).contains(&second),
        "{}",
        text(&forget.stdout)
    );

    // Paused: objects queue and no run starts; resuming asks what to do with them.
    assert_ok(&home.drivetrain(&["trigger", "pause", "fleet-ingest/new-logs"]));
    for k in ["veh4/e.mcap", "veh4/f.mcap", "veh4/g.mcap"] {
        land(&incoming, k, k);
    }
    wait(20, "three objects queued", || {
        (trigger_show(&home, "new-logs", &[])["waiting"] == 3).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3)); // past max_wait: still nothing
    assert_eq!(runs(&home, &[]).len(), 2);
    let o = home.drivetrain(&["trigger", "resume", "new-logs"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--replay") && text(&o.stderr).contains("--skip"),
        "{}",
        text(&o.stderr)
    );
    let o = home.drivetrain(&["trigger", "resume", "new-logs", "--skip"]);
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("3 queued object(s) skipped"),
        "{}",
        text(&o.stdout)
    );
    // A backfill lists them again: seen before, so none is new.
    let o = home.drivetrain(&[
        "trigger",
        "backfill",
        "new-logs",
        "--since",
        "2000-01-01",
        "-o",
        "json",
    ]);
    assert_ok(&o);
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (b["matched"].as_u64(), b["new"].as_u64()),
        (Some(7), Some(0)),
        "{b}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(runs(&home, &[]).len(), 2, "skipped objects start nothing");
    kill9(&mut serve.0);
    // The prefix that is not there was tried again and again, and said once, with what
    // to do (issue 47: a failing source printed its error at every poll).
    let said = std::fs::read_to_string(home.dir.join("serve.err")).unwrap();
    let gone: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("fleet-ingest/gone"))
        .collect();
    assert_eq!(gone.len(), 1, "{said}");
    assert!(
        gone[0].contains("trigger pause fleet-ingest/gone"),
        "{said}"
    );
}

#[test]
fn a_trigger_with_bad_fields_is_refused_with_locations() {
    let home = Home::new("trigger-invalid");
    home.write(
        "bad.yaml",
        r#"version: 1
name: bad
params: {source: {type: string, default: ""}}
triggers:
  new-logs:
    objects: {source: "ftp://fleet/in/", match: "[*.mcap"}
    batch: {min_items: 50, max_items: 10, max_wait: soon}
    params: {sorce: "{{ trigger.manifest }}", source: "{{ trigger.nope }}"}
notify:
  - slack: {}
stages:
  a:
    run: {command: ["true", "{{ params.source }}"]}
"#,
    );
    let o = home.drivetrain(&["validate", "bad.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr) + &text(&o.stdout);
    for want in [
        "objects cannot be discovered under `ftp://`",
        "triggers.new-logs.objects.match",
        "`max_items` (10) is below `min_items` (50)",
        "triggers.new-logs.batch.max_wait",
        "sets `sorce`, which is not a param",
        "unknown reference `trigger.nope`",
        "a Slack webhook's URL is a secret",
        "bad.yaml:6:",
    ] {
        assert!(err.contains(want), "no `{want}` in:\n{err}");
    }
}

/// Our SigV4 signature of an SQS call is botocore's, byte for byte.
#[test]
fn the_sqs_signature_is_botocores() {
    let python = venv_bin("python");
    let (url, body, target) = (
        "http://127.0.0.1:4566/",
        r#"{"QueueUrl":"q"}"#,
        "AmazonSQS.ReceiveMessage",
    );
    let o = Command::new(&python)
        .args([
            &events_script("s3_notify.py"),
            "http://unused",
            "sign",
            url,
            body,
            target,
        ])
        .output()
        .unwrap();
    assert_ok(&o);
    let out = text(&o.stdout);
    let mut lines = out.lines();
    let (date, theirs) = (lines.next().unwrap(), lines.next().unwrap());
    use drivetrain_engine::events::sigv4;
    let creds = sigv4::Credentials {
        access_key: "testing".into(),
        secret_key: "testing".into(),
        token: None,
    };
    let req = sigv4::Request {
        method: "POST",
        host: "127.0.0.1:4566",
        path: "/",
        query: &[],
        headers: &[
            ("content-type", "application/x-amz-json-1.0"),
            ("x-amz-target", target),
        ],
        body: body.as_bytes(),
    };
    assert_eq!(
        sigv4::authorization(&req, &creds, "us-east-1", "sqs", date),
        theirs
    );
}

#[test]
fn s3_objects_announced_through_sqs_and_found_by_listing_each_start_one_run() {
    let s3 = S3Server::start();
    let python = venv_bin("python");
    let helper = |args: &[&str]| {
        let o = Command::new(&python)
            .arg(events_script("s3_notify.py"))
            .arg(s3.endpoint())
            .args(args)
            .output()
            .unwrap();
        assert_ok(&o);
        text(&o.stdout).trim().to_owned()
    };
    let queue = helper(&["setup", "fleet", "fleet-events"]);
    let home = Home::new("trigger-s3");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    // `announced` hears only the queue (its listing runs once at start and then hourly);
    // `listed` only lists.
    home.write(
        "scheduled/fleet.yaml",
        &format!(
            r#"
version: 1
name: s3-ingest
triggers:
  announced:
    objects: {{source: "s3://fleet/incoming/", match: "**/*.mcap", queue: "{queue}", poll: 1h, rescan: 1h}}
    batch: {{max_items: 1}}
  listed:
    objects: {{source: "s3://fleet/incoming/", match: "**/*.mcap", poll: 500ms}}
    batch: {{max_items: 1}}
stages:
  a:
    run: {{command: ["true"]}}
"#
        ),
    );
    let env = s3.env();
    let env = env_pairs(&env);
    let mut serve = Killed(home.serve(&env));
    wait(30, "both triggers registered", || {
        let o = home.drivetrain_env(&["trigger", "list", "-o", "json"], &env);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        (v.as_array().map(Vec::len) == Some(2)).then_some(())
    });
    helper(&["put", "fleet", "incoming/veh 7/a b.mcap", "a"]);
    helper(&["multipart", "fleet", "incoming/veh8/big.mcap"]);
    helper(&["put", "fleet", "elsewhere/x.mcap", "x"]);
    helper(&["put", "fleet", "incoming/veh8/notes.txt", "n"]);
    // S3 may announce an object twice: the same record again is no new object.
    helper(&["resend", &queue, "fleet", "incoming/veh 7/a b.mcap"]);
    let want: BTreeSet<String> = [
        "s3://fleet/incoming/veh 7/a b.mcap",
        "s3://fleet/incoming/veh8/big.mcap",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    let by_trigger = |name: &str| -> Vec<String> {
        let mut all = Vec::new();
        for r in runs(&home, &env) {
            let id = r["id"].as_str().unwrap();
            let o = home.drivetrain_env(&["status", id, "-o", "json"], &env);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if v["trigger"]["name"] == name {
                for o in v["trigger"]["objects"].as_array().unwrap() {
                    all.push(o["url"].as_str().unwrap().to_owned());
                }
            }
        }
        all.sort();
        all
    };
    for name in ["announced", "listed"] {
        let got = wait(30, &format!("runs of `{name}`"), || {
            let got = by_trigger(name);
            (got.len() >= 2).then_some(got)
        });
        assert_eq!(
            got.iter().cloned().collect::<BTreeSet<_>>(),
            want,
            "{name}: {got:?}"
        );
    }
    // Nothing more comes of the duplicate record, the test event or a rescan.
    std::thread::sleep(Duration::from_secs(3));
    for name in ["announced", "listed"] {
        assert_eq!(by_trigger(name).len(), 2, "{name}: each object once");
    }
    let listed = trigger_show(&home, "listed", &env);
    assert_eq!(listed["cursor"], "veh8/notes.txt", "{listed}");
    kill9(&mut serve.0);
    let err = std::fs::read_to_string(home.dir.join("serve.err")).unwrap_or_default();
    assert!(!err.contains("not an S3 event"), "{err}");
}

/// A CloudEvents receiver (`tests/events/receiver.py`) on a free port.
struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, secret: &str, fail_first: u32) -> Receiver {
        let port = free_port();
        let log = dir.join(format!("received-{port}.jsonl"));
        let child = Command::new(venv_bin("python"))
            .args([
                &events_script("receiver.py"),
                &port.to_string(),
                secret,
                &log.display().to_string(),
                &fail_first.to_string(),
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        wait(30, "the receiver listening", || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(|_| ())
        });
        Receiver { child, port, log }
    }

    fn received(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        kill9(&mut self.child);
    }
}

#[test]
fn run_ends_reach_a_cloudevents_receiver_a_chat_webhook_and_mail_once_each() {
    let home = Home::new("notify");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let secret = "s3cr3t-for-hmac";
    // Every event is refused once first: it arrives on the retry.
    let hook = Receiver::start(&home.dir, secret, 1);
    let smtp_port = free_port();
    let maildir = home.dir.join("mail");
    let mut smtp = Killed(
        Command::new(venv_bin("python"))
            .args([
                "-m",
                "aiosmtpd",
                "-n",
                "-l",
                &format!("127.0.0.1:{smtp_port}"),
                "-c",
                "aiosmtpd.handlers.Mailbox",
            ])
            .arg(&maildir)
            .spawn()
            .unwrap(),
    );
    wait(30, "aiosmtpd listening", || {
        std::net::TcpStream::connect(("127.0.0.1", smtp_port))
            .ok()
            .map(|_| ())
    });
    let secret_file = home.write("hook.secret", &format!("{secret}\n"));
    home.write(
        "scheduled/notified.yaml",
        &format!(
            r#"
version: 1
name: notified
params: {{fail: {{type: boolean, default: false}}}}
notify:
  - on: [started, succeeded, failed]
    webhook: {{url: "http://127.0.0.1:{port}/events", secret_file: "{secret_file}"}}
  - on: [failed]
    slack: {{url_env: CHAT_HOOK}}
  - on: [failed]
    email: {{smtp: "smtp://127.0.0.1:{smtp_port}", from: "drivetrain@example.com", to: [oncall@example.com]}}
stages:
  work:
    run: {{command: [sh, -c, 'test "$0" = false', "{{{{ params.fail }}}}"]}}
"#,
            port = hook.port,
            secret_file = secret_file.display()
        ),
    );
    let chat = format!("http://127.0.0.1:{}/slack", hook.port);
    let env = [("CHAT_HOOK", chat.as_str())];
    let mut serve = Killed(home.serve(&env));
    let file = home
        .dir
        .join("scheduled/notified.yaml")
        .display()
        .to_string();
    let ok = common::run_id(&home.drivetrain(&["run", &file]));
    let failed = home.drivetrain(&["run", &file, "--param", "fail=true"]);
    assert_eq!(failed.status.code(), Some(1));
    let failed = common::run_id(&failed);
    wait(60, "five events, a chat message and a mail", || {
        let r = hook.received();
        let mails = std::fs::read_dir(maildir.join("new"))
            .map(|d| d.count())
            .unwrap_or(0);
        (r.len() >= 5 && mails >= 1).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3)); // nothing more comes
    let got = hook.received();
    assert!(got.iter().all(|e| e.get("invalid").is_none()), "{got:?}");
    let ids: Vec<&str> = got.iter().filter_map(|e| e["id"].as_str()).collect();
    let mut want = vec![
        format!("{ok}.started"),
        format!("{ok}.succeeded"),
        format!("{failed}.started"),
        format!("{failed}.failed"),
    ];
    want.sort();
    let mut ids_sorted: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    ids_sorted.sort();
    assert_eq!(
        ids_sorted, want,
        "each event once (after its refused first try): {got:?}"
    );
    assert!(got
        .iter()
        .any(|e| e["type"] == "dev.drivetrain.run.failed" && e["subject"] == failed.as_str()));
    let chats: Vec<&serde_json::Value> = got.iter().filter(|e| e.get("slack").is_some()).collect();
    assert_eq!(chats.len(), 1, "{got:?}");
    // What a person on call needs: the run, the stage that failed and why, and the link
    // to it in the web view (`serve` is reached at its address).
    let said = chats[0]["slack"].as_str().unwrap();
    assert!(
        said.contains(&format!("run {failed} of notified failed")),
        "{said}"
    );
    assert!(
        said.contains("\n• stage `work`: exited with code 1"),
        "{said}"
    );
    let link = last_line(said);
    assert!(
        link.starts_with("http://127.0.0.1:") && link.ends_with(&format!("/#/runs/{failed}")),
        "{said}"
    );
    let mail_file = std::fs::read_dir(maildir.join("new"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mail = std::fs::read_to_string(mail_file).unwrap();
    assert!(
        mail.contains("To: oncall@example.com") && mail.contains(&failed),
        "{mail}"
    );
    assert!(
        mail.contains("stage `work`: exited with code 1") && mail.contains(&link),
        "{mail}"
    );
    let o = home.drivetrain(&["notifications", "-o", "json"]);
    let outbox: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(outbox.len(), 6);
    assert!(
        outbox.iter().all(|n| n["state"] == "delivered"),
        "{outbox:?}"
    );
    // The README's filter (issue 47: `--state` was the global state store URL).
    for (status, count) in [("delivered", 6), ("dead", 0)] {
        let o = home.drivetrain(&["notifications", "--status", status, "-o", "json"]);
        assert_ok(&o);
        let some: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(some.len(), count, "{status}: {some:?}");
    }
    // The secrets are in no log.
    for f in ["serve.log", "serve.err"] {
        let t = std::fs::read_to_string(home.dir.join(f)).unwrap_or_default();
        assert!(!t.contains(secret) && !t.contains(&chat), "{f}: {t}");
    }
    kill9(&mut serve.0);
    kill9(&mut smtp.0);
}

#[test]
fn serve_killed_at_random_moments_loses_no_object_and_starts_no_batch_twice() {
    const OBJECTS: usize = 240;
    const KILLS: usize = 24;
    let home = Home::new("trigger-crash");
    let incoming = home.dir.join("incoming");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    std::fs::create_dir_all(&incoming).unwrap();
    let hook = Receiver::start(&home.dir, "k", 0);
    home.write("hook.secret", "k\n");
    home.write(
        "scheduled/crash.yaml",
        &format!(
            r#"
version: 1
name: crash
triggers:
  logs:
    objects: {{source: "file://{}/", match: "*.mcap", poll: 200ms}}
    batch: {{min_items: 4, max_items: 9, max_wait: 1s}}
notify:
  - webhook: {{url: "http://127.0.0.1:{}/", secret_file: "{}"}}
stages:
  a:
    run: {{command: ["true"]}}
"#,
            incoming.display(),
            hook.port,
            home.dir.join("hook.secret").display()
        ),
    );
    // Objects land from another thread while serve is killed and started again.
    let writer = {
        let incoming = incoming.clone();
        std::thread::spawn(move || {
            for i in 0..OBJECTS {
                land(&incoming, &format!("d{i:04}.mcap"), &i.to_string());
                std::thread::sleep(Duration::from_millis(60));
            }
        })
    };
    // A fixed seed: the same moments on every run of the test.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..KILLS {
        let mut serve = Killed(home.serve(&[]));
        std::thread::sleep(Duration::from_millis(150 + next() % 700));
        kill9(&mut serve.0);
    }
    writer.join().unwrap();
    let mut serve = Killed(home.serve(&[]));
    // Settles: every object consumed, every run ended, every end told.
    // The runs are listed once every object is consumed: listed before, a batch made
    // between the listing and the count would be missing from them.
    let all = wait(120, "every object consumed and every run ended", || {
        let t = trigger_show(&home, "logs", &[]);
        if t["consumed"] != OBJECTS as u64 || t["waiting"] != 0 {
            return None;
        }
        let rs = runs(&home, &[]);
        let done = !rs.is_empty()
            && rs
                .iter()
                .all(|r| r["phase"] != "Running" && r["phase"] != "Pending");
        done.then_some(rs)
    });
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for r in &all {
        let id = r["id"].as_str().unwrap();
        let objs = consumed(&home, id, &[]);
        assert!(
            !objs.is_empty() && objs.len() <= 9,
            "run {id}: {} objects",
            objs.len()
        );
        for o in objs {
            if let Some(other) = owner.insert(o.clone(), id.to_owned()) {
                panic!("{o} consumed by {other} and {id}");
            }
        }
        assert_eq!(r["phase"], "Succeeded", "{r}");
    }
    assert_eq!(owner.len(), OBJECTS, "every object consumed by one run");
    // Every run's end told once, after de-duplication by the CloudEvents id.
    let ends: BTreeSet<String> = all
        .iter()
        .map(|r| format!("{}.succeeded", r["id"].as_str().unwrap()))
        .collect();
    let told = wait(60, "every end told", || {
        let got: BTreeSet<String> = hook
            .received()
            .iter()
            .filter_map(|e| e["id"].as_str().map(str::to_owned))
            .filter(|id| id.ends_with(".succeeded"))
            .collect();
        (got.len() >= ends.len()).then_some(got)
    });
    assert_eq!(told, ends);
    kill9(&mut serve.0);
}

#[test]
fn a_run_of_another_pipeline_ending_starts_this_one_once_per_upstream_run() {
    let home = Home::new("trigger-after");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let up = home.write(
        "scheduled/up.yaml",
        r#"
version: 1
name: up
params: {fail: {type: boolean, default: false}}
stages:
  a:
    run: {command: [sh, -c, 'test "$0" = false', "{{ params.fail }}"]}
"#,
    );
    home.write(
        "scheduled/down.yaml",
        r#"
version: 1
name: down
params: {upstream: {type: string, default: ""}}
triggers:
  after-up:
    after: {pipeline: up, phase: [succeeded]}
    params: {upstream: "{{ trigger.run }}"}
stages:
  b:
    run: {command: [sh, -c, 'echo "after $0"', "{{ params.upstream }}"]}
"#,
    );
    // A run that ended before the trigger was served does not count.
    let before = common::run_id(&home.drivetrain(&["run", &up.display().to_string()]));
    let mut serve = Killed(home.serve(&[]));
    wait(30, "the trigger's cursor set", || {
        let o = home.drivetrain(&["trigger", "show", "after-up", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["cursor"].as_str().map(|_| ())
    });
    let up_file = up.display().to_string();
    let ok1 = common::run_id(&home.drivetrain(&["run", &up_file]));
    let failed = home.drivetrain(&["run", &up_file, "--param", "fail=true"]);
    assert_eq!(failed.status.code(), Some(1));
    let ok2 = common::run_id(&home.drivetrain(&["run", &up_file]));
    let downs = |home: &Home| -> Vec<(String, String)> {
        runs(home, &[])
            .into_iter()
            .filter(|r| r["pipeline"] == "down" && r["phase"] == "Succeeded")
            .map(|r| {
                let id = r["id"].as_str().unwrap().to_owned();
                let upstream = home.status(&id)["run"]["params"]["upstream"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                (id, upstream)
            })
            .collect()
    };
    let got = wait(30, "a run of `down` for each succeeded run of `up`", || {
        let d = downs(&home);
        (d.len() >= 2).then_some(d)
    });
    let mut upstream: Vec<String> = got.iter().map(|(_, u)| u.clone()).collect();
    upstream.sort();
    let mut want = vec![ok1.clone(), ok2.clone()];
    want.sort();
    assert_eq!(
        upstream, want,
        "not for {before} (before) nor the failed run"
    );
    for (id, up_run) in &got {
        assert_eq!(consumed(&home, id, &[]), [format!("run://up/{up_run}")]);
    }
    // A restarted server starts none of them again.
    kill9(&mut serve.0);
    let _serve = Killed(home.serve(&[]));
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(downs(&home).len(), 2);
}

/// One signed call to a webhook trigger: (status, body), checked against the API's
/// document.
fn post_raw(addr: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    common::http::request_raw(addr, addr, "POST", path, headers, Some(body))
}

#[test]
fn signed_webhook_calls_start_one_run_per_idempotency_key() {
    let home = Home::new("trigger-webhook");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    home.write(
        "scheduled/hook.yaml",
        r#"
version: 1
name: hook-demo
params: {event: {type: string, default: ""}}
triggers:
  recording:
    webhook: {secret_env: HOOK_SECRET}
    params: {event: "{{ trigger.body }}"}
stages:
  read:
    run: {command: [sh, -c, 'echo "got $0"', "{{ params.event }}"]}
"#,
    );
    let secret = "hook-s3cret";
    let _serve = Killed(home.serve(&[("HOOK_SECRET", secret)]));
    let addr = wait(30, "serve listening", || {
        let log = std::fs::read_to_string(home.dir.join("serve.log")).unwrap_or_default();
        log.lines()
            .find_map(|l| l.strip_prefix("listening on http://").map(str::to_owned))
    });
    // The shape of Foxglove's `recording.imported` webhook.
    let body = r#"{"type":"recording.imported","data":{"recording":{"id":"rec_0dX7","path":"veh7/2026-11-26.mcap"}}}"#;
    let sig = drivetrain_engine::events::notify::signature(secret, body.as_bytes());
    let path = "/api/v1/pipelines/hook-demo/triggers/recording";
    let signed = [
        ("X-Drivetrain-Signature", sig.as_str()),
        ("Idempotency-Key", "evt-1"),
    ];
    let (status, answer) = post_raw(&addr, path, &signed, body);
    assert_eq!(status, 202, "{answer}");
    assert!(answer.contains(r#""new":true"#), "{answer}");
    // A retry of the same call: recorded before, nothing more starts.
    let (status, answer) = post_raw(&addr, path, &signed, body);
    assert_eq!(
        (status, answer.contains(r#""new":false"#)),
        (202, true),
        "{answer}"
    );
    let wrong = drivetrain_engine::events::notify::signature("guess", body.as_bytes());
    let (status, _) = post_raw(
        &addr,
        path,
        &[
            ("X-Drivetrain-Signature", &wrong),
            ("Idempotency-Key", "evt-2"),
        ],
        body,
    );
    assert_eq!(status, 401);
    let (status, _) = post_raw(&addr, path, &[("X-Drivetrain-Signature", &sig)], body);
    assert_eq!(status, 400);
    let (status, _) = post_raw(
        &addr,
        "/api/v1/pipelines/hook-demo/triggers/nope",
        &signed,
        body,
    );
    assert_eq!(status, 404);
    let run = wait(30, "the call's run", || {
        runs(&home, &[])
            .into_iter()
            .find(|r| r["phase"] == "Succeeded")
    });
    let run = run["id"].as_str().unwrap().to_owned();
    assert_eq!(home.status(&run)["run"]["params"]["event"], body);
    assert_eq!(
        consumed(&home, &run, &[]),
        ["webhook://hook-demo/recording/evt-1"]
    );
    let log = text(&home.drivetrain(&["logs", &run, "--stage", "read"]).stdout);
    assert!(log.contains("rec_0dX7"), "{log}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(runs(&home, &[]).len(), 1, "one run per key");
}

#[test]
fn a_run_and_a_stage_past_their_deadline_are_told_of_once_and_keep_running() {
    let home = Home::new("notify-deadline");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let hook = Receiver::start(&home.dir, "k", 0);
    let secret = home.write("hook.secret", "k\n");
    home.write(
        "scheduled/slow.yaml",
        &format!(
            r#"
version: 1
name: slow
deadline: 1s
notify:
  - on: [deadline, succeeded]
    webhook: {{url: "http://127.0.0.1:{}/", secret_file: "{}"}}
stages:
  a:
    deadline: 1s
    run: {{command: [sleep, "3"]}}
"#,
            hook.port,
            secret.display()
        ),
    );
    let _serve = Killed(home.serve(&[]));
    std::thread::sleep(Duration::from_secs(1));
    let file = home.dir.join("scheduled/slow.yaml").display().to_string();
    let run = common::run_id(&home.drivetrain(&["run", &file]));
    wait(30, "two deadlines and the end", || {
        (hook.received().len() >= 3).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2)); // asked for every half second: told once
    let mut ids: Vec<String> = hook
        .received()
        .iter()
        .filter_map(|e| e["id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            format!("{run}.deadline"),
            format!("{run}.deadline:a"),
            format!("{run}.succeeded")
        ]
    );
    assert!(hook
        .received()
        .iter()
        .any(|e| e["type"] == "dev.drivetrain.run.deadline"));
}

#[test]
fn server_wide_sinks_hear_of_every_run_and_a_bad_file_is_located() {
    let home = Home::new("notify-defaults");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let hook = Receiver::start(&home.dir, "k", 0);
    let secret = home.write("hook.secret", "k\n");
    let plain = home.write(
        "scheduled/plain.yaml",
        "version: 1\nname: plain\nstages:\n  a:\n    run: {command: [\"true\"]}\n",
    );
    home.write(
        "bad-notify.yaml",
        "notify:\n  - on: [succeeded]\n    webhook: {url: \"ftp://nowhere\"}\n",
    );
    let serve_with = |file: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
        c.args([
            "serve",
            "--pipelines",
            "scheduled",
            "--bind",
            "127.0.0.1:0",
            "--notify",
            file,
        ])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        c
    };
    let bad = serve_with("bad-notify.yaml").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = text(&bad.stderr);
    assert!(
        err.contains("bad-notify.yaml")
            && err.contains("is not an http:// or https:// URL")
            && err.contains("3:"),
        "{err}"
    );
    home.write(
        "notify.yaml",
        &format!(
            "notify:\n  - on: [succeeded]\n    webhook: {{url: \"http://127.0.0.1:{}/\", secret_file: \"{}\"}}\n",
            hook.port,
            secret.display()
        ),
    );
    let _serve = Killed(
        serve_with("notify.yaml")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let run = common::run_id(&home.drivetrain(&["run", &plain.display().to_string()]));
    let got = wait(30, "the run's end told", || {
        let r = hook.received();
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(got[0]["id"], format!("{run}.succeeded"));
    let o = home.drivetrain(&["notifications", "-o", "json"]);
    let outbox: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(outbox[0]["id"], format!("{run}/succeeded/defaults[0]"));
}

/// `azurite-blob` (Microsoft's Azure Storage emulator, installed from npm by `.ci/run`).
fn azurite_bin() -> PathBuf {
    std::env::var_os("DRIVETRAIN_TEST_AZURITE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/drivetrain/azurite/node_modules/.bin/azurite-blob")
        })
}

#[test]
fn azure_blobs_found_by_listing_start_one_run_each() {
    let home = Home::new("trigger-azure");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    let port = free_port();
    let _azurite = Killed(
        Command::new(azurite_bin())
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--silent",
                "--skipApiVersionCheck",
                "--location",
            ])
            .arg(home.dir.join("azurite"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("azurite-blob runs (.ci/run installs it)"),
    );
    wait(30, "azurite listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    });
    let endpoint = format!("http://127.0.0.1:{port}/devstoreaccount1");
    let put = |args: &[&str]| {
        let o = Command::new(venv_bin("python"))
            .arg(events_script("azure_put.py"))
            .arg(&endpoint)
            .args(args)
            .output()
            .unwrap();
        assert_ok(&o);
    };
    put(&["create", "fleet"]);
    put(&["put", "fleet", "incoming/veh1/a.mcap", "a"]);
    home.write(
        "scheduled/az.yaml",
        r#"
version: 1
name: az-ingest
triggers:
  blobs:
    objects: {source: "az://fleet/incoming/", match: "**/*.mcap", poll: 300ms}
    batch: {max_items: 1}
stages:
  a:
    run: {command: ["true"]}
"#,
    );
    let url = format!("http://127.0.0.1:{port}");
    let env = [
        ("AZURE_STORAGE_USE_EMULATOR", "true"),
        ("AZURITE_BLOB_STORAGE_URL", url.as_str()),
        ("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1"),
    ];
    let _serve = Killed(home.serve(&env));
    put(&["put", "fleet", "incoming/veh2/b.mcap", "b"]);
    put(&["put", "fleet", "incoming/veh2/notes.txt", "n"]);
    let got = wait(30, "a run per blob", || {
        let mut got: Vec<String> = runs(&home, &[])
            .iter()
            .filter(|r| r["phase"] == "Succeeded")
            .flat_map(|r| consumed(&home, r["id"].as_str().unwrap(), &[]))
            .collect();
        got.sort();
        (got.len() >= 2).then_some(got)
    });
    assert_eq!(
        got,
        [
            "az://fleet/incoming/veh1/a.mcap",
            "az://fleet/incoming/veh2/b.mcap"
        ]
    );
}

#[test]
fn group_by_keeps_each_vehicles_objects_in_runs_of_their_own() {
    let home = Home::new("trigger-groups");
    let incoming = home.dir.join("incoming");
    std::fs::create_dir_all(home.dir.join("scheduled")).unwrap();
    std::fs::create_dir_all(&incoming).unwrap();
    home.write(
        "scheduled/groups.yaml",
        &format!(
            r#"
version: 1
name: per-vehicle
params: {{vehicle: {{type: string, default: ""}}}}
triggers:
  logs:
    objects: {{source: "file://{}/", match: "**/*.mcap", poll: 200ms}}
    batch: {{min_items: 2, max_wait: 1h, group_by: "{{{{ object.dir }}}}"}}
    params: {{vehicle: "{{{{ trigger.group }}}}"}}
stages:
  a:
    run: {{command: ["true"]}}
"#,
            incoming.display()
        ),
    );
    let _serve = Killed(home.serve(&[]));
    for k in ["veh1/a.mcap", "veh2/b.mcap", "veh1/c.mcap"] {
        land(&incoming, k, k);
    }
    let run = wait(20, "veh1's run", || {
        runs(&home, &[])
            .into_iter()
            .find(|r| r["phase"] == "Succeeded")
    });
    let run = run["id"].as_str().unwrap().to_owned();
    assert_eq!(home.status(&run)["run"]["params"]["vehicle"], "veh1");
    let url = |k: &str| format!("file://{}/{k}", incoming.display());
    assert_eq!(
        consumed(&home, &run, &[]),
        [url("veh1/a.mcap"), url("veh1/c.mcap")]
    );
    // veh2's one object waits for a second of its own group, not veh1's.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(runs(&home, &[]).len(), 1);
    let t = trigger_show(&home, "logs", &[]);
    assert_eq!(t["waiting"], 1, "{t}");
    assert!(
        t["last_reason"]
            .as_str()
            .unwrap()
            .contains("in group `veh2`"),
        "{t}"
    );
    land(&incoming, "veh2/d.mcap", "d");
    wait(20, "veh2's run", || {
        (runs(&home, &[]).len() == 2).then_some(())
    });
}

/// The last line of a chat message: its link.
fn last_line(chat: &str) -> String {
    chat.lines().last().unwrap_or_default().trim().to_owned()
}

/// A trigger watching a folder beside its pipeline (`source: landing/`, as the examples
/// do) watches it wherever the server was started from, and `..` is taken as written.
#[test]
fn a_folder_beside_the_pipeline_is_watched() {
    let home = Home::new("trigger-beside");
    std::fs::create_dir_all(home.dir.join("scheduled/landing")).unwrap();
    std::fs::create_dir_all(home.dir.join("drops")).unwrap();
    home.write(
        "scheduled/beside.yaml",
        r#"
version: 1
name: beside
params: {manifest: {type: string, default: ""}}
triggers:
  landed:
    objects: {source: landing/, match: "*.mcap", poll: 200ms}
    batch: {min_items: 1}
    params: {manifest: "{{ trigger.manifest }}"}
  dropped:
    objects: {source: ../drops, poll: 200ms}
    batch: {min_items: 1}
    params: {manifest: "{{ trigger.manifest }}"}
stages:
  read:
    run: {command: [cat, "{{ params.manifest }}"]}
"#,
    );
    let mut serve = Killed(home.serve(&[]));
    land(&home.dir.join("scheduled/landing"), "a.mcap", "a");
    land(&home.dir.join("drops"), "b.mcap", "b");
    let done = wait(20, "a run for each folder", || {
        let runs = runs(&home, &[]);
        let ok: Vec<String> = runs
            .iter()
            .filter(|r| r["phase"] == "Succeeded")
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect();
        (ok.len() == 2).then_some(ok)
    });
    let mut got: Vec<String> = done
        .iter()
        .flat_map(|id| consumed(&home, id, &[]))
        .collect();
    got.sort();
    let d = home.dir.display();
    assert_eq!(
        got,
        [
            format!("file://{d}/drops/b.mcap"),
            format!("file://{d}/scheduled/landing/a.mcap")
        ]
    );
    kill9(&mut serve.0);
}

/// A local file is the object its bytes are: touched, or copied again with the same
/// bytes, it starts no second run; new bytes under the same name do.
#[test]
fn a_local_file_is_named_by_its_content() {
    let home = Home::new("trigger-content");
    let landing = home.dir.join("scheduled/landing");
    std::fs::create_dir_all(&landing).unwrap();
    home.write(
        "scheduled/content.yaml",
        r#"
version: 1
name: content
params: {manifest: {type: string, default: ""}}
triggers:
  landed:
    objects: {source: landing/, poll: 200ms}
    batch: {min_items: 1}
    params: {manifest: "{{ trigger.manifest }}"}
stages:
  read:
    run: {command: [cat, "{{ params.manifest }}"]}
"#,
    );
    let mut serve = Killed(home.serve(&[]));
    let succeeded = || {
        runs(&home, &[])
            .iter()
            .filter(|r| r["phase"] == "Succeeded")
            .count()
    };
    land(&landing, "a.mcap", "drive a");
    wait(20, "the first run", || (succeeded() == 1).then_some(()));
    // Touched, then copied over with the same bytes (a new inode and time).
    let a = landing.join("a.mcap");
    let later = std::time::SystemTime::now() + Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&a)
        .unwrap()
        .set_modified(later)
        .unwrap();
    std::fs::remove_file(&a).unwrap();
    std::fs::write(home.dir.join("copy"), "drive a").unwrap();
    std::fs::copy(home.dir.join("copy"), &a).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(succeeded(), 1, "the same bytes are the same object");
    std::fs::write(&a, "drive a, fixed").unwrap();
    wait(20, "a run for the new bytes", || {
        (succeeded() == 2).then_some(())
    });
    kill9(&mut serve.0);
}
