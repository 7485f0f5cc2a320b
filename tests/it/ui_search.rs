//! A search's trials in the web view, in real Chromium (see `ui.rs`): the trials table,
//! the overlaid learning curves and the parallel-coordinates plot against what the run
//! recorded (`drivetrain trials -o json`).

use fantoccini::Locator;
use serde_json::Value;

use crate::common::{assert_ok, run_id, Home};
use crate::ui::{click, eval, screenshot, signed_in, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_shows_its_trials_curves_and_params() {
    let home = Home::new("ui-search");
    let file = crate::search::pipeline(&home, "promote", 2, "none");
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let run = run_id(&o);
    let listed = crate::search::trials(&home, &run);
    let trials = listed["trials"].as_array().unwrap();
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    std::fs::copy(&file, home.dir.join("served/search.yaml")).unwrap();
    let (_s, _driver, c, base) = signed_in(&home).await;
    c.goto(&format!("{base}/#/runs/{run}")).await.unwrap();
    let node = ".dag .node[data-node=\"train\"]";
    until(
        &c,
        "the DAG",
        &format!("return document.querySelector('{node}')"),
    )
    .await;
    click(&c, Locator::Css(node)).await;

    // The table: every trial with its state, the ended-early faded, the best first.
    let rows = until(
        &c,
        "the trials table",
        "const r = [...document.querySelectorAll('#trials tbody tr')];
         return r.length === 27 && r.map(t => [t.dataset.trial, t.children[1].textContent, t.classList.contains('faded')])",
    )
    .await;
    let rows: Vec<(String, String, bool)> = serde_json::from_value(rows).unwrap();
    let state = |id: &str| -> &Value { &trials.iter().find(|t| t["id"] == id).unwrap()["state"] };
    for (id, shown, faded) in &rows {
        assert_eq!(state(id), shown.as_str(), "{id}");
        assert_eq!(*faded, shown == "pruned", "{id}");
    }
    let best = crate::search::best_listed(&listed);
    assert_eq!(rows[0].0, best["id"].as_str().unwrap(), "sorted best first");
    // Only the params that differ are columns: both do here.
    let heads = eval(
        &c,
        "return [...document.querySelectorAll('#trials thead button')].map(b => b.dataset.sort)",
    )
    .await;
    assert_eq!(
        heads,
        serde_json::json!(["Trial", "State", "Rung", "Steps", "val_loss", "lr", "width"])
    );
    click(&c, Locator::Css("#trials button[data-sort=\"Trial\"]")).await;
    let first = eval(
        &c,
        "return document.querySelector('#trials tbody tr').dataset.trial",
    )
    .await;
    assert_eq!(first, "t000", "sorted by trial once its header is chosen");

    // The curves: one per trial, each epoch it trained once, pruned ones faded.
    let curves = eval(
        &c,
        "return [...document.querySelectorAll('.learning-curves g.series')]
           .map(g => [g.dataset.trial, JSON.parse(g.dataset.points), g.classList.contains('faded')])",
    )
    .await;
    let curves: Vec<(String, Vec<[f64; 2]>, bool)> = serde_json::from_value(curves).unwrap();
    assert_eq!(curves.len(), 27);
    for (id, points, faded) in &curves {
        let t = trials.iter().find(|t| t["id"] == id.as_str()).unwrap();
        let steps: Vec<f64> = points.iter().map(|p| p[0]).collect();
        let want: Vec<f64> = (1..=t["steps"].as_u64().unwrap())
            .map(|s| s as f64)
            .collect();
        assert_eq!(steps, want, "{id}: each epoch once, in order");
        let ends = t["rung_metrics"].as_array().unwrap();
        assert_eq!(
            points.last().unwrap()[1],
            ends.last().unwrap().as_f64().unwrap(),
            "{id}"
        );
        assert_eq!(*faded, t["state"] == "pruned", "{id}");
    }

    // Parallel coordinates: a line per trial through lr, width and its best metric.
    let lines = eval(
        &c,
        "return [...document.querySelectorAll('.parallel polyline')].map(l => [l.dataset.trial, JSON.parse(l.dataset.values)])",
    )
    .await;
    let lines: Vec<(String, Vec<f64>)> = serde_json::from_value(lines).unwrap();
    assert_eq!(lines.len(), 27);
    for (id, values) in &lines {
        let t = trials.iter().find(|t| t["id"] == id.as_str()).unwrap();
        let want =
            [&t["params"]["lr"], &t["params"]["width"], &t["metric"]].map(|v| v.as_f64().unwrap());
        assert_eq!(values.as_slice(), want.as_slice(), "{id}");
    }
    assert_eq!(
        lines.last().unwrap().0,
        best["id"].as_str().unwrap(),
        "the best drawn on top"
    );
    eval(
        &c,
        "document.querySelector('.learning-curves').scrollIntoView(); return true",
    )
    .await;
    screenshot(&c, &home, "search-trials").await;

    // A second search (another seed), chosen beside the first in the list and compared.
    let other = std::fs::read_to_string(&file)
        .unwrap()
        .replace("seed: 11", "seed: 12");
    let o = home.drivetrain(&["run", home.write("search2.yaml", &other).to_str().unwrap()]);
    assert_ok(&o);
    let second = run_id(&o);
    c.goto(&format!("{base}/#/runs")).await.unwrap();
    for id in [&run, &second] {
        let at = format!("tr[data-run=\"{id}\"] input.pick");
        until(
            &c,
            "the run's row",
            &format!("return document.querySelector('{at}')"),
        )
        .await;
        click(&c, Locator::Css(&at)).await;
    }
    click(&c, Locator::Id("compare-runs")).await;
    let shown = until(
        &c,
        "the compare table",
        "const r = document.querySelector('#compare tr[data-key=\"train.values.best.trial\"]');
         return r && [...r.querySelectorAll('td')].map(d => [d.dataset.run, d.textContent])",
    )
    .await;
    let shown: Vec<(String, String)> = serde_json::from_value(shown).unwrap();
    let best_of = |id: &str| -> String {
        let st = home.status(id);
        crate::common::stage(&st, "train")["values"]["best"]["trial"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        shown,
        vec![
            (run.clone(), best_of(&run)),
            (second.clone(), best_of(&second))
        ]
    );
    // Only rows that differ: both ran the same pipeline, so no `pipeline` row.
    let keys = eval(
        &c,
        "return [...document.querySelectorAll('#compare tbody tr')].map(r => r.dataset.key)",
    )
    .await;
    assert!(
        !keys.as_array().unwrap().iter().any(|k| k == "pipeline"),
        "{keys}"
    );
    // The best trials' curves overlaid, one a run, each the trial's recorded values.
    let curves = until(
        &c,
        "the compare curves",
        "const g = [...document.querySelectorAll('.chart g.series[data-run]')]; return g.length === 2 && g.map(s => [s.dataset.run, JSON.parse(s.dataset.points).length])",
    )
    .await;
    let curves: Vec<(String, usize)> = serde_json::from_value(curves).unwrap();
    assert_eq!(
        curves,
        vec![(run.clone(), 27), (second.clone(), 27)],
        "each best trial reached 27 epochs"
    );
    screenshot(&c, &home, "search-compare").await;
}
