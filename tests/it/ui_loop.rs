//! The web view's pictures of the driving loop, in real Chromium (see `ui.rs`): two runs of
//! `pipelines/driving-loop.yaml` (two model versions), then the run page's DAG against
//! `drivetrain graph`'s edges, its timeline against the recorded attempt times, the loss
//! chart against the training stage's recorded series, the validation chart against the
//! validate stage's metrics, the registry's charts and notes, a one-click walk from a
//! model version to the drive logs, and axe-core (Deque's accessibility checker, vendored
//! in `vendor/`) on each view.
//!
//! `DRIVETRAIN_SCREENSHOTS=1 cargo test --test it ui_loop` also writes the screenshots in
//! `docs/screenshots/`.

use std::collections::BTreeSet;

use fantoccini::{Client, Locator};
use serde_json::Value;

use crate::common;
use crate::ui::{click, eval, keep, screenshot, signed_in, until};
use common::http::json as call;
use common::{assert_ok, run_id, text, Home};

const AXE: &str = include_str!("vendor/axe.min.js");

/// The pipeline's edges as `drivetrain graph --format dot` prints them.
fn graph_edges(home: &Home, file: &str) -> BTreeSet<(String, String)> {
    let o = home.drivetrain(&["graph", file, "--format", "dot"]);
    assert_ok(&o);
    text(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (from, rest) = l.trim().split_once(" -> ")?;
            let to = rest.split(" [").next()?;
            Some((
                from.trim_matches('"').to_owned(),
                to.trim_matches('"').to_owned(),
            ))
        })
        .collect()
}

/// Runs axe-core on the page as it is: no violation of serious or critical impact.
async fn accessible(c: &Client, view: &str) {
    c.execute(&format!("{AXE}\n;return true"), vec![])
        .await
        .unwrap();
    let found = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations
               .filter(v => v.impact === 'serious' || v.impact === 'critical')
               .map(v => ({id: v.id, impact: v.impact, help: v.help,
                           nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' + n.failureSummary)}))));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        found,
        Value::Array(vec![]),
        "{view}: axe-core found serious violations"
    );
}

/// Times in RFC 3339 as milliseconds since the epoch.
fn ms(t: &Value) -> f64 {
    chrono::DateTime::parse_from_rfc3339(t.as_str().unwrap())
        .unwrap()
        .timestamp_millis() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driving_loop_in_pictures() {
    let home = Home::new("ui-loop");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/driving-loop.yaml");
    // Two runs, two model versions (a second seed finds other corner cases).
    let mut run = String::new();
    for seed in ["7", "9"] {
        let o = home.drivetrain(&["run", file, "-p", "drives=5", "-p", &format!("seed={seed}")]);
        assert_ok(&o);
        run = run_id(&o);
    }
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    std::fs::copy(file, home.dir.join("served/driving-loop.yaml")).unwrap();
    let (s, _driver, c, base) = signed_in(&home).await;

    // The DAG: every edge of the pipeline, and no other.
    c.goto(&format!("{base}/#/runs/{run}")).await.unwrap();
    let want = graph_edges(&home, file);
    assert_eq!(want.len(), 11, "{want:?}");
    let drawn = until(
        &c,
        "the DAG's edges",
        &format!("const e = [...document.querySelectorAll('.dag [data-from]')]; return e.length === {} && e.map(p => [p.dataset.from, p.dataset.to])", want.len()),
    )
    .await;
    let drawn: BTreeSet<(String, String)> = serde_json::from_value(drawn).unwrap();
    assert_eq!(drawn, want);
    until(
        &c,
        "the run's phase",
        "return document.querySelector('.run-head .badge.phase-Succeeded')",
    )
    .await;

    // The keyboard walks the graph: right goes downstream, left upstream.
    let walked = eval(
        &c,
        "const at = (n) => document.querySelector(`.dag .node[data-node='${n}']`);
         const press = (k) => document.activeElement.dispatchEvent(new KeyboardEvent('keydown', {key: k, bubbles: true}));
         at('ingest').focus(); press('ArrowRight'); const right = document.activeElement.dataset.node;
         at('train').focus(); press('ArrowLeft'); const left = document.activeElement.dataset.node;
         return [right, left];",
    )
    .await;
    let right = walked[0].as_str().unwrap();
    assert!(["mine", "label-export"].contains(&right), "{walked}");
    assert_eq!(walked[1], "label-import");

    // The timeline: one bar per recorded attempt, where its times put it.
    let (code, attempts) = call(&s, "GET", &format!("/api/v1/runs/{run}/attempts"), None);
    assert_eq!(code, 200, "{attempts}");
    let attempts = attempts["attempts"].as_array().unwrap().clone();
    assert!(attempts.len() >= 8, "{attempts:?}");
    let bars = until(
        &c,
        "the timeline's bars",
        &format!("const t = document.querySelector('svg.timeline'); const b = t && [...t.querySelectorAll('rect.bar')]; return b && b.length === {} && {{t0: t.dataset.t0, per: +t.dataset.msPerPx, left: +t.dataset.labelWidth, bars: b.map(r => ({{stage: r.dataset.stage, attempt: +r.dataset.attempt, x: +r.getAttribute('x'), w: +r.getAttribute('width')}}))}}", attempts.len()),
    )
    .await;
    let (t0, per, left) = (
        ms(&bars["t0"]),
        bars["per"].as_f64().unwrap(),
        bars["left"].as_f64().unwrap(),
    );
    for a in &attempts {
        let bar = bars["bars"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["stage"] == a["stage"] && b["attempt"] == a["attempt"])
            .unwrap_or_else(|| panic!("no bar for {a}"));
        let (start, end) = (ms(&a["started_at"]), ms(&a["finished_at"]));
        let x = left + (start - t0) / per;
        let w = ((end - start) / per).max(1.5);
        assert!(
            (bar["x"].as_f64().unwrap() - x).abs() < 0.6,
            "{a}: {bar} not at x {x}"
        );
        assert!(
            (bar["w"].as_f64().unwrap() - w).abs() < 0.6,
            "{a}: {bar} not {w} wide"
        );
    }
    screenshot(&c, &home, "run-dag").await;
    accessible(&c, "the run page").await;
    let timeline = c.find(Locator::Css(".run-timeline")).await.unwrap();
    keep(&home, "timeline", &timeline.screenshot().await.unwrap());

    // The loss chart: the points the training stage recorded.
    let (_, detail) = call(&s, "GET", &format!("/api/v1/runs/{run}"), None);
    let stage = |name: &str| {
        detail["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|st| st["stage"] == name)
            .unwrap()
            .clone()
    };
    let recorded = stage("train")["values"]["series"]["loss"]["points"].clone();
    assert_eq!(
        recorded.as_array().unwrap().len(),
        20,
        "20 epochs: {recorded}"
    );
    click(&c, Locator::Css(".dag .node[data-node=\"train\"]")).await;
    let drawn = until(
        &c,
        "the loss chart",
        "const s = document.querySelector('.charts [data-series=\"loss\"]'); return s && JSON.parse(s.dataset.points)",
    )
    .await;
    assert_eq!(drawn, recorded);
    let markers = eval(
        &c,
        "return document.querySelectorAll('.charts [data-series=\"loss\"] circle').length",
    )
    .await;
    assert_eq!(markers, 20, "a mark a point");
    let charts = c.find(Locator::Css(".charts")).await.unwrap();
    keep(&home, "train-charts", &charts.screenshot().await.unwrap());

    // Validation: candidate against production, slice by slice, as recorded.
    click(&c, Locator::Css(".dag .node[data-node=\"validate\"]")).await;
    let drawn = until(
        &c,
        "the validation chart",
        "const c = document.querySelector('.charts [data-series=\"candidate\"]'); const p = document.querySelector('.charts [data-series=\"production\"]'); return c && p && [JSON.parse(c.dataset.points), JSON.parse(p.dataset.points)]",
    )
    .await;
    let metrics = &stage("validate")["values"]["metrics"];
    for (i, side) in ["candidate", "production"].iter().enumerate() {
        for point in drawn[i].as_array().unwrap() {
            let name = point[0].as_str().unwrap();
            let want = match name.split_once('.') {
                Some((a, b)) => &metrics[side][a][b],
                None => &metrics[side][name],
            };
            assert_eq!(point[1].as_f64(), want.as_f64(), "{side} {name}");
        }
    }
    let slices = drawn[0]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p[0].as_str().unwrap().starts_with("recall."))
        .count();
    assert!(slices >= 3, "recall per corner-case slice: {drawn}");
    accessible(&c, "the validate panel").await;
    let charts = c.find(Locator::Css(".charts")).await.unwrap();
    keep(&home, "validation", &charts.screenshot().await.unwrap());

    // The registry: metrics version by version; the alias moves as text with links.
    c.goto(&format!("{base}/#/registry")).await.unwrap();
    let loss = until(
        &c,
        "the registry's loss chart",
        "const s = document.querySelector('[data-chart=\"loss\"] [data-series=\"loss\"]'); return s && JSON.parse(s.dataset.points)",
    )
    .await;
    assert_eq!(loss.as_array().unwrap().len(), 2, "two versions: {loss}");
    let note = eval(
        &c,
        "return document.querySelector('.note-text').textContent",
    )
    .await;
    let note = note.as_str().unwrap();
    assert!(
        note.contains("by run") && note.contains("gate passed") && !note.contains('{'),
        "{note}"
    );
    assert!(
        eval(
            &c,
            "return !!document.querySelector('.note-text a[href^=\"#/runs/\"]')"
        )
        .await
            == true,
        "the note links its run"
    );
    screenshot(&c, &home, "registry-versions").await;
    accessible(&c, "the registry").await;

    // One click from a model version to its lineage, which reaches the drive logs.
    click(&c, Locator::Css("a[data-lineage=\"risk-model@2\"]")).await;
    let labels = until(
        &c,
        "the lineage graph",
        "const n = [...document.querySelectorAll('.dag .node')]; return n.length > 10 && n.map(e => e.getAttribute('aria-label'))",
    )
    .await;
    let labels: Vec<String> = serde_json::from_value(labels).unwrap();
    assert!(
        labels.iter().any(|l| l.starts_with("logs ")),
        "the drive logs: {labels:?}"
    );
    assert!(
        labels.iter().any(|l| l.starts_with("fleet-sim ")),
        "{labels:?}"
    );
    // The root is named by the version asked for, and drawn on top; no text is below
    // 11 px at first paint.
    let root = eval(
        &c,
        "const n = [...document.querySelectorAll('.dag .node.root')]; return n.map(e => [e.getAttribute('aria-label'), e.getBoundingClientRect().top, Math.min(...[...document.querySelectorAll('.dag .node')].map(o => o.getBoundingClientRect().top))])",
    )
    .await;
    assert_eq!(root.as_array().unwrap().len(), 1, "{root}");
    assert!(
        root[0][0].as_str().unwrap().starts_with("risk-model@2 "),
        "{root}"
    );
    assert_eq!(root[0][1], root[0][2], "the model version on top: {root}");
    let smallest = eval(
        &c,
        "return Math.min(...[...document.querySelectorAll('.dag .node text')].map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a))",
    )
    .await;
    assert!(
        smallest.as_f64().unwrap() >= 11.0,
        "smallest text {smallest} px"
    );
    let into_ingest = eval(
        &c,
        "const logs = [...document.querySelectorAll('.dag .node')].find(e => e.getAttribute('aria-label').startsWith('logs ')).dataset.node;
         return [...document.querySelectorAll('.dag [data-from]')].filter(p => p.dataset.from === logs)
           .map(p => document.querySelector(`.dag .node[data-node='${p.dataset.to}']`).getAttribute('aria-label'));",
    )
    .await;
    assert!(
        into_ingest
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().starts_with("ingest ")),
        "{into_ingest}"
    );
    screenshot(&c, &home, "lineage-model").await;
    accessible(&c, "lineage").await;
    // And on into the run's stage that read them.
    click(&c, Locator::Css(".dag .node[aria-label^=\"ingest \"]")).await;
    until(
        &c,
        "ingest's panel",
        "return document.querySelector('.stage-panel h2')?.textContent.startsWith('ingest')",
    )
    .await;
    c.close().await.unwrap();
}
