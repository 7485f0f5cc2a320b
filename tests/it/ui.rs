//! The web view in a real browser: Debian's headless Chromium, driven over WebDriver by
//! Debian's chromedriver (the `fantoccini` client), against the real `drivetrain serve`
//! on loopback with a token the test types into the page. `.ci/run` installs both
//! packages; where they are missing the test fails and says how to get them.
//!
//! `DRIVETRAIN_SCREENSHOTS=1 cargo test --test it ui::` also writes the screenshots in
//! `docs/screenshots/`.

use drivetrain_engine::state::prelude::*;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::common;
use common::http::{json as call, start, start_wrapped, wait_phase, TOKEN};
use common::Home;

pub(crate) struct Driver(Child);

impl Drop for Driver {
    /// chromedriver and the browser it started lead and share one process group: all go,
    /// whether the test passed or not.
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn found(names: &[&str]) -> Option<PathBuf> {
    names.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// chromedriver on a free loopback port, and a session of headless Chromium.
pub(crate) async fn browser(home: &Home) -> (Driver, Client) {
    let driver = found(&["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]);
    let chromium = found(&["/usr/bin/chromium", "/usr/lib/chromium/chromium"]);
    let (Some(driver), Some(chromium)) = (driver, chromium) else {
        panic!(
            "the web view's browser test needs Debian's chromium and chromium-driver: \
             `apt-get install chromium chromium-driver` (`.ci/run` does)"
        );
    };
    let port = free_port();
    let child = Command::new(driver)
        .process_group(0)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let driver = Driver(child);
    let profile = home.dir.join("chromium-profile");
    let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1500,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    }))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        let mut builder =
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
        match builder
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no browser session: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    (driver, client)
}

/// Clicks the element `at` finds, as a person would.
pub(crate) async fn click(c: &Client, at: Locator<'_>) {
    c.find(at).await.unwrap().click().await.unwrap();
}

/// Evaluates `script` (a function body) in the page.
pub(crate) async fn eval(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.unwrap()
}

/// Waits until `script` returns something truthy; returns it.
pub(crate) async fn until(c: &Client, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = eval(c, script).await;
        if !(v.is_null() || v == false || v == "" || v == json!([])) {
            return v;
        }
        if Instant::now() > deadline {
            let status = eval(c, "return document.getElementById('status').textContent").await;
            let shot = c.screenshot().await.unwrap_or_default();
            let at = std::env::temp_dir().join("drivetrain-ui-failure.png");
            let _ = std::fs::write(&at, shot);
            panic!(
                "{what}: not seen in 60 s (status: {status}; screenshot {})",
                at.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The phase classes of the DAG's nodes: stage → phase.
const PHASES: &str = "return Object.fromEntries([...document.querySelectorAll('.dag .node')]
    .map(n => [n.dataset.node, (n.getAttribute('class').match(/phase-(\\w+)/) || [])[1]]))";

pub(crate) async fn screenshot(c: &Client, home: &Home, name: &str) {
    keep(home, name, &c.screenshot().await.unwrap());
}

/// Keeps a screenshot `name`: in `docs/screenshots/` with `DRIVETRAIN_SCREENSHOTS` set,
/// else in the home.
pub(crate) fn keep(home: &Home, name: &str, png: &[u8]) {
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let dir = match std::env::var_os("DRIVETRAIN_SCREENSHOTS") {
        Some(_) => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/screenshots")),
        None => home.dir.join("screenshots"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// `serve` of the home's `served/` with the test's token, and a browser whose tab holds
/// that token (as if typed in): the server, the driver, the browser and the base address.
pub(crate) async fn signed_in(home: &Home) -> (common::http::Server, Driver, Client, String) {
    let s = start(home, &["--token", TOKEN]);
    let (driver, c) = browser(home).await;
    let base = format!("http://{}", s.addr);
    c.goto(&format!("{base}/")).await.unwrap();
    let keep = format!("sessionStorage.setItem('drivetrain-token', '{TOKEN}'); return true");
    eval(&c, &keep).await;
    // The page reads the token when it loads.
    c.goto("about:blank").await.unwrap();
    (s, driver, c, base)
}

const PIPELINE: &str = r#"
version: 1
name: drive-loop-demo
description: a small loop for the browser test
params:
  fail: {type: boolean, default: false}
stages:
  ingest:
    run: {command: [sh, -c, 'sleep 1; echo 1200 frames > "$0/frames.txt"', "{{ outputs.frames }}"]}
    outputs: [frames]
  mine:
    inputs: {frames: ingest.frames}
    run: {command: [sh, -c, 'sleep 1; cat "$0/frames.txt"; echo "{\"corner_cases\": 17}" > "$DRIVETRAIN_VALUES"', "{{ inputs.frames }}"]}
  calibrate:
    needs: [ingest]
    run:
      command: [sh, -c, 'sleep 1; if [ "$0" = true ]; then echo "error: calibration file cam_front.yaml missing" >&2; exit 3; fi; echo calibrated', "{{ params.fail }}"]
  train:
    needs: [mine, calibrate]
    run: {command: [sh, -c, 'sleep 1; echo "epoch 1 loss 0.42"']}
"#;

/// The server and the browser a test drives, and the base of the server's address.
struct Page {
    c: Client,
    s: common::http::Server,
    base: String,
    home: Home,
}

/// A run started by the test appears in the list; its DAG turns green stage by stage; a
/// failed stage shows its log line; the rerun button starts a linked run, which succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_in_a_browser() {
    let home = Home::new("ui");
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write("served/demo.yaml", PIPELINE);
    home.write(
        "served/nightly.yaml",
        "version: 1\nname: nightly\nschedule: {cron: \"0 3 * * *\", timezone: Europe/Berlin}\nstages:\n  s:\n    run: {command: [\"true\"]}\n",
    );
    std::fs::create_dir_all(home.dir.join("landing")).unwrap();
    home.write(
        "served/landing.yaml",
        &format!(
            "version: 1\nname: landing\ntriggers:\n  logs:\n    objects: {{source: \"file://{}/\", poll: 200ms}}\n    paused: true\nstages:\n  s:\n    run: {{command: [\"true\"]}}\n",
            home.dir.join("landing").display()
        ),
    );
    home.write(
        "served/gate.yaml",
        "version: 1\nname: gate\nstages:\n  validate:\n    run: {command: [sh, -c, 'echo \"{\\\"accuracy\\\": 0.93}\" > \"$DRIVETRAIN_VALUES\"']}\n  release:\n    needs: [validate]\n    approval: {approvers: {role: safety}}\n  promote:\n    needs: [release]\n    run: {command: [\"true\"]}\n",
    );
    let approver = home.drivetrain(&[
        "token",
        "create",
        "--role",
        "viewer",
        "--approves",
        "safety",
        "--name",
        "alice",
    ]);
    common::assert_ok(&approver);
    let approver = common::text(&approver.stdout).trim().to_owned();
    home.write(
        "served/gpus.yaml",
        "version: 1\nname: gpus\nparams:\n  hold: {type: number, default: 0}\nstages:\n  next:\n    resources: {gpu: 2}\n    run: {command: [sleep, \"{{ params.hold }}\"]}\n",
    );
    // A machine of two GPUs (no GPU here: the ledger hands out what it is told of).
    let s = start_wrapped(
        &home,
        &["env", "DRIVETRAIN_LOCAL_GPUS=2"],
        &["--token", TOKEN],
    );
    let (_driver, c) = browser(&home).await;
    let base = format!("http://{}", s.addr);
    let p = Page { c, s, base, home };
    the_token_opens_the_list(&p).await;
    let run = a_run_turns_green_upstream_first(&p).await;
    a_stage_panel_has_values_log_and_explain(&p).await;
    let failed = a_failed_stage_shows_its_log_line(&p).await;
    the_rerun_button_starts_a_linked_run(&p, &failed).await;
    lineage_reaches_the_ingest(&p, &run).await;
    the_registry_shows_versions_and_rolls_back(&p, &run).await;
    schedules_trigger_and_suspend(&p).await;
    a_paused_trigger_queues_and_resumes_skipping(&p).await;
    the_list_filters_to_failures(&p, &failed).await;
    an_approver_decides_with_the_evidence_in_view(&p, &approver).await;
    a_stage_waiting_for_gpus_says_why(&p).await;
    p.c.close().await.unwrap();
}

/// A stage waiting for GPUs another run holds: its panel says who holds them and where it
/// stands in the queue while it waits; once it ran, the timeline draws the wait as a
/// segment of its own before the attempt's bar, with the same words.
async fn a_stage_waiting_for_gpus_says_why(p: &Page) {
    let submit = |hold: u32| {
        let (code, v) = call(
            &p.s,
            "POST",
            "/api/v1/runs",
            Some(&format!(
                r#"{{"pipeline": "gpus", "params": {{"hold": {hold}}}}}"#
            )),
        );
        assert_eq!(code, 201, "{v}");
        v["run"].as_str().unwrap().to_owned()
    };
    let holder = submit(4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while call(&p.s, "GET", &format!("/api/v1/runs/{holder}"), None).1["stages"][0]["phase"]
        != "Running"
    {
        assert!(Instant::now() < deadline, "the holder never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiter = submit(0);
    p.c.goto(&format!("{}/#/runs/{waiter}", p.base))
        .await
        .unwrap();
    until(
        &p.c,
        "the DAG",
        "return document.querySelector('.dag .node[data-node=\"next\"]')",
    )
    .await;
    click(&p.c, Locator::Css(".dag .node[data-node=\"next\"]")).await;
    let reason = until(
        &p.c,
        "the wait's reason",
        "const r = document.querySelector('.stage-panel .reason'); return r && r.textContent.startsWith('waiting for') && r.textContent",
    )
    .await;
    let reason = reason.as_str().unwrap();
    assert!(
        reason.contains(&format!("by run {holder} (next#1)")),
        "{reason}"
    );
    assert!(reason.contains("place 1 of 1"), "{reason}");
    screenshot(&p.c, &p.home, "waiting-for-gpus").await;
    wait_phase(&p.s, &waiter, "Succeeded");
    p.c.refresh().await.unwrap();
    let title = until(
        &p.c,
        "the wait's segment",
        "return document.querySelector('svg.timeline rect.gpu-wait[data-stage=next] title')?.textContent",
    )
    .await;
    let title = title.as_str().unwrap();
    assert!(
        title.starts_with("next attempt 1: waiting for 2 GPU(s)"),
        "{title}"
    );
    assert!(title.contains(&format!("by run {holder}")), "{title}");
    let ends = eval(
        &p.c,
        "const w = document.querySelector('svg.timeline rect.gpu-wait'), b = document.querySelector('svg.timeline rect.bar[data-stage=next]'); return w.getAttribute('data-end') && Math.abs((+w.getAttribute('x') + +w.getAttribute('width')) - +b.getAttribute('x')) < 2",
    )
    .await;
    assert_eq!(ends, true, "the attempt's bar starts where its wait ends");
}

/// A run waits for an approval: the admin sees it with its evidence but no Approve button
/// (no `safety` role) and the Audit link; the approver sees no Audit link, approves with
/// a comment, and the run goes on to succeed.
async fn an_approver_decides_with_the_evidence_in_view(p: &Page, approver: &str) {
    let base = &p.base;
    let (code, v) = call(
        &p.s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "gate"}"#),
    );
    assert_eq!(code, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    wait_phase(&p.s, &run, "Waiting");
    p.c.goto(&format!("{base}/#/approvals")).await.unwrap();
    let row = format!("document.querySelector('[data-approval=\"{run}/release\"]')");
    until(&p.c, "the approval's row", &format!("return {row}")).await;
    let accuracy = eval(
        &p.c,
        &format!("return {row}.querySelector('[data-value=accuracy]').textContent"),
    )
    .await;
    assert_eq!(accuracy, "accuracy 0.93 ");
    let buttons = eval(
        &p.c,
        &format!("return {row}.querySelectorAll('button').length"),
    )
    .await;
    assert_eq!(buttons, 0, "the admin holds no `safety`: nothing to press");
    let audit = eval(
        &p.c,
        "return !document.querySelector('nav a[data-section=audit]').hidden",
    )
    .await;
    assert_eq!(audit, true, "the admin reads the audit log");
    screenshot(&p.c, &p.home, "approvals").await;

    let field = p.c.find(Locator::Id("token")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(approver).await.unwrap();
    click(&p.c, Locator::Css("#token-form button")).await;
    until(
        &p.c,
        "the Approve button",
        &format!("return {row} && {row}.querySelector('button')"),
    )
    .await;
    let audit = eval(
        &p.c,
        "return document.querySelector('nav a[data-section=audit]').hidden",
    )
    .await;
    assert_eq!(audit, true, "the approver does not read the audit log");
    let comment =
        p.c.find(Locator::Css(&format!(
            "[data-approval=\"{run}/release\"] input"
        )))
        .await
        .unwrap();
    comment.send_keys("slices hold").await.unwrap();
    click(
        &p.c,
        Locator::XPath(&format!(
            "//tr[@data-approval='{run}/release']//button[text()='Approve']"
        )),
    )
    .await;
    until(&p.c, "the decision", "const s = document.getElementById('status').textContent; return s.startsWith('approve: approved') && s").await;
    let v = wait_phase(&p.s, &run, "Succeeded");
    assert!(v.to_string().contains("token:alice"), "{v}");
}

/// Without the token the page says it needs one; with it, the list shows.
async fn the_token_opens_the_list(p: &Page) {
    let base = &p.base;
    p.c.goto(&format!("{base}/")).await.unwrap();
    let refusal = until(
        &p.c,
        "the refusal",
        "const s = document.getElementById('status'); return s.className === 'error' && s.textContent",
    )
    .await;
    assert!(refusal.as_str().unwrap().contains("Bearer"), "{refusal}");
    let field = p.c.find(Locator::Id("token")).await.unwrap();
    field.send_keys(TOKEN).await.unwrap();
    click(&p.c, Locator::Css("#token-form button")).await;
    until(
        &p.c,
        "the run list",
        "return document.querySelector('table.runs')",
    )
    .await;
}

/// A run started elsewhere appears without a reload, and its DAG turns green stage by
/// stage, upstream first. Its id.
async fn a_run_turns_green_upstream_first(p: &Page) -> String {
    let base = &p.base;
    // A run started elsewhere appears without a reload.
    let (code, v) = call(
        &p.s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "drive-loop-demo"}"#),
    );
    assert_eq!(code, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    until(
        &p.c,
        "the new run in the list",
        &format!("return document.querySelector('tr[data-run=\"{run}\"]')"),
    )
    .await;

    // Its DAG turns green stage by stage, upstream first.
    p.c.goto(&format!("{base}/#/runs/{run}")).await.unwrap();
    until(
        &p.c,
        "the DAG",
        "return document.querySelectorAll('.dag .node').length === 4",
    )
    .await;
    let mut order: Vec<String> = Vec::new();
    let mut partial = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while order.len() < 4 {
        assert!(
            Instant::now() < deadline,
            "the DAG never turned green: {order:?}"
        );
        let phases = eval(&p.c, PHASES).await;
        let green: Vec<String> = phases
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, p)| *p == "Succeeded")
            .map(|(n, _)| n.clone())
            .collect();
        partial |= !green.is_empty() && green.len() < 4;
        for n in green {
            if !order.contains(&n) {
                order.push(n);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(partial, "some stages were green while others ran");
    let at = |n: &str| order.iter().position(|o| o == n).unwrap();
    assert!(
        at("ingest") < at("mine") && at("ingest") < at("calibrate"),
        "{order:?}"
    );
    assert!(
        at("mine") < at("train") && at("calibrate") < at("train"),
        "{order:?}"
    );
    until(
        &p.c,
        "the run's phase",
        "return document.querySelector('.run-head .badge.phase-Succeeded')",
    )
    .await;
    screenshot(&p.c, &p.home, "run").await;
    run
}

/// A stage's panel: its values, its log, and explain.
async fn a_stage_panel_has_values_log_and_explain(p: &Page) {
    click(&p.c, Locator::Css(".dag .node[data-node=\"mine\"]")).await;
    let values = until(
        &p.c,
        "mine's values",
        "return document.querySelector('.stage-panel pre.json')?.textContent",
    )
    .await;
    assert!(
        values.as_str().unwrap().contains("corner_cases"),
        "{values}"
    );
    let log = until(&p.c, "mine's log", "const l = document.getElementById('log'); return l && l.textContent.includes('frames') && l.textContent").await;
    assert!(log.as_str().unwrap().contains("1200 frames"), "{log}");
    click(&p.c, Locator::Id("explain")).await;
    let why = until(
        &p.c,
        "explain",
        "return document.querySelector('.explain p')?.textContent",
    )
    .await;
    assert!(why.as_str().unwrap().starts_with("ran"), "{why}");
}

/// A failing run: the failed stage shows its log line, the rest of the DAG says why. Its id.
async fn a_failed_stage_shows_its_log_line(p: &Page) -> String {
    let base = &p.base;
    let (_, v) = call(
        &p.s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "drive-loop-demo", "params": {"fail": true}}"#),
    );
    let failed = v["run"].as_str().unwrap().to_owned();
    p.c.goto(&format!("{base}/#/runs/{failed}/calibrate"))
        .await
        .unwrap();
    let line = until(
        &p.c,
        "the failed stage's log line",
        "const l = document.getElementById('log'); return l && l.textContent.includes('calibration') && l.textContent",
    )
    .await;
    assert!(
        line.as_str()
            .unwrap()
            .contains("error: calibration file cam_front.yaml missing"),
        "{line}"
    );
    until(
        &p.c,
        "calibrate failed",
        "return document.querySelector('.dag .node.phase-Failed[data-node=\"calibrate\"]')",
    )
    .await;
    until(
        &p.c,
        "the run failed",
        "return document.querySelector('.run-head .badge.phase-Failed')",
    )
    .await;
    screenshot(&p.c, &p.home, "failed-stage").await;
    failed
}

/// The rerun button: calibrate and downstream again with fail=false, in a linked run.
async fn the_rerun_button_starts_a_linked_run(p: &Page, failed: &str) {
    until(
        &p.c,
        "rerun enabled",
        "return !document.getElementById('rerun').disabled",
    )
    .await;
    let params = p.c.find(Locator::Id("rerun-params")).await.unwrap();
    params.send_keys("fail=false").await.unwrap();
    click(&p.c, Locator::Id("rerun")).await;
    let hash = until(
        &p.c,
        "the rerun's page",
        &format!("return !location.hash.includes('{failed}') && location.hash"),
    )
    .await;
    let rerun = hash
        .as_str()
        .unwrap()
        .trim_start_matches("#/runs/")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let linked = until(
        &p.c,
        "the link to the parent",
        &format!("return [...document.querySelectorAll('.run-head a')].some(a => a.textContent === '{failed}')"),
    )
    .await;
    assert_eq!(linked, true);
    until(
        &p.c,
        "the rerun succeeded",
        "return document.querySelector('.run-head .badge.phase-Succeeded')",
    )
    .await;
    let done = wait_phase(&p.s, &rerun, "Succeeded");
    assert_eq!(done["run"]["trigger"], "rerun");
    assert_eq!(done["run"]["parent"], failed);
    // ingest and mine were reused from the failed run, calibrate and train ran again.
    let origins = eval(&p.c, "return [...document.querySelectorAll('.dag .node .sub')].map(t => t.textContent).join('|')").await;
    assert!(origins.as_str().unwrap().contains("reused"), "{origins}");
}

/// Lineage from the first run's mine stage reaches the ingest that made its frames.
async fn lineage_reaches_the_ingest(p: &Page, run: &str) {
    let base = &p.base;
    p.c.goto(&format!(
        "{base}/#/lineage?target={run}/mine&downstream=false"
    ))
    .await
    .unwrap();
    until(
        &p.c,
        "the lineage graph",
        "return document.querySelectorAll('.dag .node.kind-artifact').length > 0",
    )
    .await;
    let nodes = eval(
        &p.c,
        "return [...document.querySelectorAll('.dag .node')].map(n => n.dataset.node)",
    )
    .await;
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().ends_with("/ingest")),
        "{nodes}"
    );
    screenshot(&p.c, &p.home, "lineage").await;
}

/// The registry: versions with metrics and the run that made them, an alias, and the
/// roll-back button, whose move the history then shows.
async fn the_registry_shows_versions_and_rolls_back(p: &Page, run: &str) {
    let base = &p.base;
    let artifacts = p.home.dir.join(".drivetrain/artifacts");
    let url = format!(
        "file://{}",
        std::fs::canonicalize(&artifacts).unwrap().display()
    );
    let reg = drivetrain_steps::registry::Registry::open_for(None, &url).unwrap();
    let model = p.home.dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("model.json"), "{}").unwrap();
    for accuracy in [0.81, 0.87] {
        let meta = json!({"metrics": {"accuracy": accuracy}, "source": {"run": run, "stage": "train", "pipeline": "drive-loop-demo"}});
        reg.register("lanes", &model, meta).await.unwrap();
    }
    for version in [1, 2] {
        reg.move_alias("lanes", "production", version, json!({"manual": true}))
            .await
            .unwrap();
    }
    p.c.goto(&format!("{base}/#/registry")).await.unwrap();
    let alias = until(
        &p.c,
        "the alias",
        "return document.querySelector('.aliases li')?.textContent",
    )
    .await;
    assert!(
        alias
            .as_str()
            .unwrap()
            .starts_with("production → version 2"),
        "{alias}"
    );
    let versions = eval(
        &p.c,
        "return document.querySelector('.model table.versions tbody').textContent",
    )
    .await;
    let accuracy = eval(
        &p.c,
        "return document.querySelector('.model table.versions [data-metric=accuracy]').textContent",
    )
    .await;
    assert_eq!(accuracy, "0.87", "the newest version first");
    assert!(versions.as_str().unwrap().contains(run), "{versions}");
    click(&p.c, Locator::Css("[data-rollback=\"lanes@production\"]")).await;
    until(&p.c, "the rollback", "return document.querySelector('.aliases li')?.textContent.startsWith('production → version 1')").await;
    let moves = eval(
        &p.c,
        "return document.querySelectorAll('.model table.alias-history tbody tr').length",
    )
    .await;
    assert_eq!(moves, 3, "two moves and the rollback");
    screenshot(&p.c, &p.home, "registry").await;
}

/// Schedules: the next tick, and a trigger that queues a run the list then shows.
async fn schedules_trigger_and_suspend(p: &Page) {
    let base = &p.base;
    p.c.goto(&format!("{base}/#/schedules")).await.unwrap();
    let next = until(
        &p.c,
        "the schedule's row",
        "const r = document.querySelector('tbody tr'); return r?.cells[2]?.textContent",
    )
    .await;
    assert!(
        !next.as_str().unwrap().is_empty() && next != "never",
        "{next}"
    );
    screenshot(&p.c, &p.home, "schedules").await;
    click(&p.c, Locator::XPath("//button[text()='Trigger']")).await;
    let queued = until(
        &p.c,
        "the queued tick",
        "const s = document.getElementById('status').textContent; return s.includes('queued') && s",
    )
    .await;
    let ticked = queued
        .as_str()
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_owned();
    wait_phase(&p.s, &ticked, "Succeeded");
    click(&p.c, Locator::XPath("//button[text()='Suspend']")).await;
    until(
        &p.c,
        "suspended",
        "return document.querySelector('tbody tr')?.cells[1].textContent === 'suspended'",
    )
    .await;
    // The audit log has the button's change, before and after.
    let (code, log) = call(&p.s, "GET", "/api/v1/audit?limit=1000", None);
    assert_eq!(code, 200, "{log}");
    let entry = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "schedules.suspend")
        .unwrap_or_else(|| panic!("{log}"));
    assert_eq!(entry["before"], json!({"suspended": false}), "{entry}");
    assert_eq!(entry["after"], json!({"suspended": true}), "{entry}");
    assert_eq!(entry["subject"], "token:server", "{entry}");
}

/// A paused trigger's row counts what lands; resuming with a skip drops it and starts
/// nothing.
async fn a_paused_trigger_queues_and_resumes_skipping(p: &Page) {
    let base = &p.base;
    std::fs::write(p.home.dir.join("landing/drive.mcap"), "x").unwrap();
    let row = "document.querySelector('tr[data-trigger=\"landing/logs\"]')";
    let mut waiting = Value::Null;
    for _ in 0..50 {
        p.c.goto(&format!("{base}/#/runs")).await.unwrap();
        p.c.goto(&format!("{base}/#/triggers")).await.unwrap();
        waiting = until(
            &p.c,
            "the trigger's row",
            &format!(
                "const r = {row}; return r && [r.cells[1].textContent, r.cells[3].textContent]"
            ),
        )
        .await;
        if waiting[1] == "1" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        waiting,
        serde_json::json!(["paused", "1"]),
        "the object queued"
    );
    screenshot(&p.c, &p.home, "triggers").await;
    click(
        &p.c,
        Locator::XPath("//button[text()='Resume, skip queued']"),
    )
    .await;
    until(
        &p.c,
        "resumed, one skipped",
        &format!("const s = document.getElementById('status').textContent; const r = {row}; return s.includes('1 skipped') && r && r.cells[1].textContent === 'active'"),
    )
    .await;
}

/// The list, filtered to failures, shows the failed run only.
async fn the_list_filters_to_failures(p: &Page, failed: &str) {
    let base = &p.base;
    p.c.goto(&format!("{base}/#/runs?phase=Failed"))
        .await
        .unwrap();
    until(
        &p.c,
        "the filtered list",
        &format!("return document.querySelector('tr[data-run=\"{failed}\"]')"),
    )
    .await;
    let shown = eval(
        &p.c,
        "return document.querySelectorAll('table.runs tbody tr').length",
    )
    .await;
    assert_eq!(shown, 1);
    p.c.goto(&format!("{base}/#/runs")).await.unwrap();
    until(
        &p.c,
        "the whole list",
        "return document.querySelectorAll('table.runs tbody tr').length === 4",
    )
    .await;
    screenshot(&p.c, &p.home, "runs").await;
}

/// The figures of `bench/README.md` (web view at scale), not a check: a list of 10,000
/// runs and the DAG of a 1,000-stage run in the same headless Chromium.
/// `cargo test --release --test it -- --ignored --nocapture ui::at_scale`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it by name"]
async fn at_scale() {
    use drivetrain_engine::state::{Phase, RunId, RunRecord, SqliteState};
    let home = Home::new("ui-scale");
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    let mut wide =
        String::from("version: 1\nname: wide\nstages:\n  root:\n    run: {command: [\"true\"]}\n");
    for i in 0..999 {
        wide.push_str(&format!(
            "  s{i:03}:\n    needs: [root]\n    run: {{command: [\"true\"]}}\n"
        ));
    }
    home.write("served/wide.yaml", &wide);
    let o = home.drivetrain(&["run", "served/wide.yaml", "--parallelism", "8"]);
    common::assert_ok(&o);
    let wide_run = common::run_id(&o);
    // 1,000 stages in 100 layers of 10: each needs two of the layer before, every fifth
    // also one three layers up (edges the layout must bend around stages).
    let mut deep = String::from("version: 1\nname: deep\nstages:\n");
    for layer in 0..100 {
        for i in 0..10 {
            let mut needs = Vec::new();
            if layer > 0 {
                needs.push(format!("l{:02}s{i}", layer - 1));
                needs.push(format!("l{:02}s{}", layer - 1, (i * 3 + 1) % 10));
            }
            if layer > 2 && i % 5 == 0 {
                needs.push(format!("l{:02}s{}", layer - 3, (i + 7) % 10));
            }
            needs.dedup();
            deep.push_str(&format!(
                "  l{layer:02}s{i}:\n    needs: [{}]\n    run: {{command: [\"true\"]}}\n",
                needs.join(", ")
            ));
        }
    }
    home.write("served/deep.yaml", &deep);
    let o = home.drivetrain(&["run", "served/deep.yaml", "--parallelism", "8"]);
    common::assert_ok(&o);
    let deep_run = common::run_id(&o);
    // A map of 10,000 items.
    home.write(
        "served/map.yaml",
        "version: 1\nname: map\nstages:\n  list:\n    run: {command: [python3, -c, 'import json, sys; json.dump(list(range(10000)), open(sys.argv[1] + \"/items.json\", \"w\"))', \"{{ outputs.items }}\"]}\n    outputs: [items]\n  each:\n    map: {from: list.items, max_parallel: 8}\n    run: {command: [\"true\"]}\n",
    );
    let made = Instant::now();
    let o = home.drivetrain(&["run", "served/map.yaml", "--parallelism", "8"]);
    common::assert_ok(&o);
    let map_run = common::run_id(&o);
    println!(
        "the 10,000-item map ran in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let made = Instant::now();
    {
        let state = SqliteState::open(&home.dir.join(".drivetrain/state.db")).unwrap();
        let phases = [
            Phase::Succeeded,
            Phase::Failed,
            Phase::Cancelled,
            Phase::Succeeded,
        ];
        for i in 0..10_000u32 {
            let id = RunId(format!("20261101-{i:06}-bench"));
            state
                .create_run(&RunRecord {
                    id: id.clone(),
                    pipeline: format!("pipeline-{}", i % 7),
                    file: "served/none.yaml".into(),
                    spec_digest: String::new(),
                    params: json!({}),
                    trigger: ["cli", "schedule", "api"][i as usize % 3].into(),
                    parent: None,
                    phase: Phase::Running,
                    created_at: format!(
                        "2026-11-01T{:02}:{:02}:{:02}.000Z",
                        i / 3600 % 24,
                        i / 60 % 60,
                        i % 60
                    ),
                    finished_at: None,
                    reason: None,
                    engine_pid: None,
                    overrides: json!({}),
                    selection: None,
                    scheduled_time: None,
                    executor: Some("local".into()),
                    project: "default".into(),
                })
                .unwrap();
            let phase = phases[i as usize % 4];
            let reason = (phase == Phase::Failed).then_some("stage `train` failed: exit 1");
            state.finish_run(&id, phase, reason).unwrap();
        }
    }
    println!(
        "10,000 runs recorded in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let edges: usize = deep
        .lines()
        .filter_map(|l| l.strip_prefix("    needs: ["))
        .map(|l| {
            l.trim_end_matches(']')
                .split(", ")
                .filter(|n| !n.is_empty())
                .count()
        })
        .sum();
    let (_s, _driver, c, base) = signed_in(&home).await;

    let mut figures = Vec::new();
    let rows = "return document.querySelectorAll('table.runs tbody tr').length";
    for (what, target, ready) in [
        (
            "runs: 10,000 read, the first 500 drawn",
            "#/runs?limit=10000".to_owned(),
            format!("{rows} === 500"),
        ),
        (
            "the next 500 drawn (Show more)",
            "#more".to_owned(),
            format!("{rows} === 1000"),
        ),
        (
            "runs: the newest 200",
            "#/runs".to_owned(),
            format!("{rows} === 200"),
        ),
        (
            "runs: Failed among 10,001 (2,500)",
            "#/runs?phase=Failed&limit=10000".to_owned(),
            format!(
                "{rows} === 500 && document.querySelector('.count').textContent.startsWith('2500')"
            ),
        ),
        (
            "DAG of 1,000 stages",
            format!("#/runs/{wide_run}"),
            "return document.querySelectorAll('.dag .node').length === 1000".to_owned(),
        ),
        (
            "a stage of it chosen",
            format!("#/runs/{wide_run}/s500"),
            "return document.querySelector('.stage-panel h2')?.textContent.startsWith('s500')"
                .to_owned(),
        ),
        (
            "DAG of 1,000 stages in 100 layers, first view (laid out), with its timeline",
            format!("#/runs/{deep_run}"),
            format!("return document.querySelectorAll('.dag .node').length === 1000 && document.querySelectorAll('.dag [data-from]').length === {edges} && document.querySelectorAll('svg.timeline rect.bar').length === 1000"),
        ),
        (
            "the same again (layout kept)",
            format!("#/runs/{deep_run}"),
            format!("return document.querySelectorAll('.dag .node').length === 1000 && document.querySelectorAll('.dag [data-from]').length === {edges} && document.querySelectorAll('svg.timeline rect.bar').length === 1000"),
        ),
        (
            "map of 10,000 items: node counts and a timeline bar an item",
            format!("#/runs/{map_run}"),
            "return document.querySelector('.dag .node[data-node=\"each\"]')?.getAttribute('aria-label').includes('10000 items') && document.querySelectorAll('svg.timeline rect.item').length === 10000".to_owned(),
        ),
    ] {
        let t = Instant::now();
        match target.as_str() {
            // A click on the page as it is.
            "#more" => click(&c, Locator::Id("more")).await,
            // Choosing a stage keeps the drawing.
            t if t.ends_with("/s500") => c.goto(&format!("{base}/{t}")).await.unwrap(),
            t => {
                c.goto("about:blank").await.unwrap();
                c.goto(&format!("{base}/{t}")).await.unwrap();
            }
        }
        until(&c, what, &ready).await;
        let wall = t.elapsed().as_millis();
        let shown = eval(&c, "return document.body.dataset.shownMs").await;
        let shown = match target.as_str() {
            "#more" => "-",
            _ => shown.as_str().unwrap_or("-"),
        };
        figures.push(format!("| {what} | {wall} | {shown} |"));
    }
    println!("| page | load to ready (ms) | route to drawn, in the page (ms) |\n|---|---|---|");
    for f in figures {
        println!("{f}");
    }
    c.close().await.unwrap();
}
