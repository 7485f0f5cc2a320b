//! The web view as a new user first sees it (issue 47), in Debian's headless Chromium
//! against `drivetrain ui` (a viewer: it takes no orphaned run over): a run whose engine
//! was killed says it is orphaned and stops growing; the attempt `resume` then finds lost
//! says Lost, not Failed; a run whose pipeline file was edited and moved keeps its graph;
//! a 13-node lineage is drawn top to bottom with no text below 11 px at first paint; and
//! a map stage shows its items (value, phase, values, log).

use std::process::{Command, Stdio};

use fantoccini::{Client, Locator};

use crate::common::{self, assert_ok, run_id, wait_for_file, Home};
use crate::ui::{browser, click, eval, keep, until};
use common::http::{start_command, TOKEN};

/// Heartbeats this often, so an engine three beats silent is orphaned after 0.6 s.
const BEAT: (&str, &str) = ("DRIVETRAIN_HEARTBEAT", "200ms");

/// A chain of seven stages, each handing a file to the next: its lineage from the last
/// stage is 13 nodes (7 stages, 6 artifacts) in one line.
fn chain() -> String {
    let mut p = String::from("version: 1\nname: chain\nstages:\n");
    for i in 1..=7 {
        let input = match i {
            1 => String::new(),
            _ => format!("    inputs: {{d: s{}.d}}\n", i - 1),
        };
        p.push_str(&format!(
            "  s{i}:\n{input}    run: {{command: [sh, -c, 'echo {i} > \"$0/f\"', \"{{{{ outputs.d }}}}\"]}}\n    outputs: [d]\n"
        ));
    }
    p
}

const SWEEP: &str = r#"
version: 1
name: sweep
stages:
  each:
    map: {items: [0.1, 0.01, 0.001], min_success_ratio: 0.5}
    run:
      command: [sh, -c, 'echo "training with lr $0"; if [ "$0" = 0.001 ]; then echo "diverged" >&2; exit 3; fi; echo "{\"loss\": $0}" > "$DRIVETRAIN_VALUES"', "{{ item }}"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_new_user_sees_first() {
    let home = Home::new("ui-first");
    let d = home.dir.display().to_string();
    // A run of the chain, whose file is then edited and moved away.
    home.write("chain.yaml", &chain());
    let o = home.drivetrain(&["run", "chain.yaml"]);
    assert_ok(&o);
    let chained = run_id(&o);
    home.write(
        "chain.yaml",
        "version: 1\nname: chain\nstages:\n  other:\n    run: {command: [\"true\"]}\n",
    );
    std::fs::rename(home.dir.join("chain.yaml"), home.dir.join("moved.yaml")).unwrap();
    // A sweep: two items succeed, one fails.
    home.write("sweep.yaml", SWEEP);
    let o = home.drivetrain(&["run", "sweep.yaml"]);
    assert_ok(&o);
    let swept = run_id(&o);
    // A run whose engine is killed while its stage runs.
    home.write(
        "long.yaml",
        &format!("version: 1\nname: long\nstages:\n  wait:\n    run: {{command: [sh, -c, 'if [ -e {d}/again ]; then exit 0; fi; echo $$ > {d}/waiting; exec sleep 4.0417']}}\n"),
    );
    let (mut engine, orphan) = common::spawn_run(&home, &home.dir.join("long.yaml"));
    wait_for_file(&home.dir.join("waiting"));
    engine.kill().unwrap();
    engine.wait().unwrap();

    let mut ui = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    ui.args(["ui", "--bind", "127.0.0.1:0", "--token", TOKEN])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env(BEAT.0, BEAT.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let s = start_command(ui);
    let (_driver, c) = browser(&home).await;
    let base = format!("http://{}", s.addr);
    c.goto(&format!("{base}/")).await.unwrap();
    let token = format!("sessionStorage.setItem('drivetrain-token', '{TOKEN}'); return true");
    eval(&c, &token).await;

    an_orphaned_run_says_so_and_stops_growing(&c, &base, &orphan).await;
    std::fs::write(home.dir.join("again"), "1").unwrap();
    let resumed = home.drivetrain_env(&["resume", &orphan], &[BEAT]);
    assert_ok(&resumed);
    the_lost_attempt_says_lost(&c, &base, &orphan).await;
    an_edited_and_moved_pipeline_keeps_its_graph(&c, &base, &chained).await;
    lineage_is_readable_at_first_paint(&c, &home, &base, &chained).await;
    a_map_stage_shows_its_items(&c, &base, &swept).await;
    c.close().await.unwrap();
}

/// The run page of a run whose engine is gone: "Running (orphaned)" with what to do, its
/// stage drawn orphaned, and a timeline bar that does not grow; the list says so too.
async fn an_orphaned_run_says_so_and_stops_growing(c: &Client, base: &str, run: &str) {
    c.goto("about:blank").await.unwrap();
    c.goto(&format!("{base}/#/runs/{run}")).await.unwrap();
    let head = until(
        c,
        "the orphaned run's head",
        "const h = document.querySelector('.run-head'); return h && h.querySelector('.note.orphaned') && h.textContent",
    )
    .await;
    let head = head.as_str().unwrap();
    assert!(head.contains("Running (orphaned)"), "{head}");
    assert!(head.contains(&format!("drivetrain resume {run}")), "{head}");
    assert!(!head.contains("▶"), "not drawn as running: {head}");
    let node = eval(
        c,
        "const n = document.querySelector('.dag .node[data-node=\"wait\"]'); return [n.getAttribute('class'), n.getAttribute('aria-label')]",
    )
    .await;
    assert!(
        node[0].as_str().unwrap().contains("phase-Orphaned"),
        "{node}"
    );
    assert!(node[1].as_str().unwrap().contains("(orphaned)"), "{node}");
    let width = "const b = document.querySelector('svg.timeline rect.bar[data-stage=\"wait\"]'); return b && b.getAttribute('class').includes('phase-Orphaned') && b.getAttribute('width')";
    let first = until(c, "the orphaned attempt's bar", width).await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(eval(c, width).await, first, "the bar stopped growing");
    c.goto(&format!("{base}/#/runs?pipeline=long"))
        .await
        .unwrap();
    let row = until(
        c,
        "the run list",
        &format!("return document.querySelector('tr[data-run=\"{run}\"]')?.textContent"),
    )
    .await;
    assert!(
        row.as_str().unwrap().contains("Running (orphaned)"),
        "{row}"
    );
}

/// After `resume`: the attempt the dead engine left is Lost (not ✗ Failed), the new one
/// succeeded.
async fn the_lost_attempt_says_lost(c: &Client, base: &str, run: &str) {
    c.goto("about:blank").await.unwrap();
    c.goto(&format!("{base}/#/runs/{run}/wait")).await.unwrap();
    let rows = until(
        c,
        "the attempts table",
        "const r = [...document.querySelectorAll('table.attempts tbody tr')]; return r.length === 2 && r.map(t => t.cells[1].textContent)",
    )
    .await;
    assert_eq!(rows[0], "⚠ Lost", "{rows}");
    assert_eq!(rows[1], "✓ Succeeded", "{rows}");
}

/// The run's own graph, though its file now holds another pipeline under another name.
async fn an_edited_and_moved_pipeline_keeps_its_graph(c: &Client, base: &str, run: &str) {
    c.goto("about:blank").await.unwrap();
    c.goto(&format!("{base}/#/runs/{run}")).await.unwrap();
    let drawn = until(
        c,
        "the chain's graph",
        "const e = [...document.querySelectorAll('.dag [data-from]')]; return e.length === 6 && [[...document.querySelectorAll('.dag .node')].map(n => n.dataset.node), e.map(p => p.dataset.from + '>' + p.dataset.to)]",
    )
    .await;
    let nodes: Vec<String> = serde_json::from_value(drawn[0].clone()).unwrap();
    assert_eq!(nodes, (1..=7).map(|i| format!("s{i}")).collect::<Vec<_>>());
    let edges: Vec<String> = serde_json::from_value(drawn[1].clone()).unwrap();
    for i in 1..7 {
        assert!(edges.contains(&format!("s{i}>s{}", i + 1)), "{edges:?}");
    }
    // Laid out in layers, not stacked in one column.
    let xs = eval(
        c,
        "return new Set([...document.querySelectorAll('.dag .node')].map(n => n.getAttribute('transform').split(',')[0])).size",
    )
    .await;
    assert_eq!(xs, 7, "one layer a stage");
}

/// The lineage of the chain's last stage: 13 nodes top to bottom, every text at least
/// 11 px on the screen, nothing wider than the page.
async fn lineage_is_readable_at_first_paint(c: &Client, home: &Home, base: &str, run: &str) {
    c.goto("about:blank").await.unwrap();
    c.goto(&format!(
        "{base}/#/lineage?target={run}/s7&downstream=false"
    ))
    .await
    .unwrap();
    let seen = until(
        c,
        "the lineage graph, fitted",
        "const n = [...document.querySelectorAll('.dag .node')]; const v = document.querySelector('.dag .viewport'); return n.length === 13 && v.getAttribute('transform') && n.length",
    )
    .await;
    assert_eq!(seen, 13);
    let smallest = eval(
        c,
        "return Math.min(...[...document.querySelectorAll('.dag .node text')].map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a))",
    )
    .await;
    assert!(
        smallest.as_f64().unwrap() >= 11.0,
        "smallest text {smallest} px"
    );
    // Top to bottom: each stage below what it read, the target at the top.
    let ys = eval(
        c,
        "const y = (id) => document.querySelector(`.dag .node[data-node$='/${id}']`).getBoundingClientRect().top; return [1, 2, 3, 4, 5, 6, 7].map(i => y('s' + i))",
    )
    .await;
    let ys: Vec<f64> = serde_json::from_value(ys).unwrap();
    assert!(
        ys.windows(2).all(|w| w[0] > w[1]),
        "s1 lowest, s7 on top: {ys:?}"
    );
    let fits = eval(
        c,
        "const g = document.querySelector('svg.dag').getBoundingClientRect(); return [...document.querySelectorAll('.dag .node')].every(n => { const b = n.getBoundingClientRect(); return b.left >= g.left && b.right <= g.right; })",
    )
    .await;
    assert_eq!(fits, true, "every node within the graph's width");
    let shot = c.screenshot().await.unwrap();
    keep(home, "lineage-chain", &shot);
}

/// The sweep's map stage: a row an item with its value, phase, values and reason; an
/// item's number opens its log.
async fn a_map_stage_shows_its_items(c: &Client, base: &str, run: &str) {
    c.goto("about:blank").await.unwrap();
    c.goto(&format!("{base}/#/runs/{run}/each")).await.unwrap();
    let rows = until(
        c,
        "the items table",
        "const r = [...document.querySelectorAll('table.items tbody tr')]; return r.length === 3 && r.map(t => [...t.cells].map(c => c.textContent))",
    )
    .await;
    let rows: Vec<Vec<String>> = serde_json::from_value(rows).unwrap();
    assert_eq!(rows[0][..4], ["0", "0.1", "✓ Succeeded", "1"], "{rows:?}");
    assert_eq!(rows[0][5], "loss=0.1", "{rows:?}");
    assert_eq!(rows[1][5], "loss=0.01", "{rows:?}");
    assert_eq!(rows[2][..3], ["2", "0.001", "✗ Failed"], "{rows:?}");
    assert!(
        rows[2][6].contains("exit") && rows[2][6].contains("diverged"),
        "{rows:?}"
    );
    let panel = eval(
        c,
        "return document.querySelector('.stage-panel').textContent",
    )
    .await;
    assert!(
        !panel.as_str().unwrap().contains("Attempts0"),
        "no 'Attempts 0' for a map stage: {panel}"
    );
    click(c, Locator::Css("table.items button[data-item=\"1\"]")).await;
    let log = until(
        c,
        "item 1's log",
        "const l = document.getElementById('log'); return l.dataset.ended && l.textContent",
    )
    .await;
    assert_eq!(log.as_str().unwrap().trim(), "training with lr 0.01");
}
