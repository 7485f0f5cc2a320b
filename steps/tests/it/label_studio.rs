//! The labeling round trip through a real Label Studio (`label-studio` from PyPI, started
//! on loopback by the test; see `drivetrain_engine::testing::LabelStudio`): `label-export`
//! writes the tasks and the labeling config, Label Studio gets a project with that config
//! (and, as teams do, another control before ours), the tasks are imported over its API
//! (it gives them ids of its own), annotated over its API (one annotation cancelled
//! before the real one, one task labeled twice), exported in its `JSON` and `JSON_MIN`
//! formats, and `label-import` reads the exports back. An annotator's choice the
//! mapping does not name (`unsure`) fails the import until it is mapped, and the same
//! export read against another run's tasks (task ids restart at 1 in every export) is
//! refused as foreign, never applied to the other run's frames.

use crate::common;
use common::{rt, tmp};

use std::path::Path;
use std::process::Command;

use datafusion::arrow::datatypes::DataType;
use drivetrain_engine::testing::LabelStudio;
use drivetrain_steps::label::{LabelExportConfig, LabelImportConfig};
use serde_json::{json, Value};

/// Creates the project, imports the tasks, annotates them as `plan` says (our task id →
/// annotations, oldest first: `[choice or null for cancelled]`) and writes both exports.
const ROUND_TRIP: &str = r#"
import json, sys, time, urllib.request
url, token, tasks_file, config_file, plan_file, out = sys.argv[1:7]
def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Token " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")
config = open(config_file).read()
# Another project's tasks first: Label Studio's task ids are its own, not ours.
other = call("POST", "/api/projects", {"title": "another team", "label_config": config})
call("POST", f"/api/projects/{other['id']}/import", [{"data": {"source_file": "x"}}] * 3)
project = call("POST", "/api/projects", {"title": "drivetrain round trip", "label_config": config})
pid = project["id"]
call("POST", f"/api/projects/{pid}/import", json.load(open(tasks_file)))
listed = call("GET", f"/api/tasks?project={pid}&page_size=1000")
listed = listed["tasks"] if isinstance(listed, dict) else listed
plan = json.load(open(plan_file))
for task in listed:
    for choice in plan[str(task["data"]["task_id"])]:
        if choice is None:
            body = {"result": [], "was_cancelled": True, "lead_time": 1.0}
        else:
            body = {"was_cancelled": False, "lead_time": 2.0, "result": [
                {"from_name": "weather", "to_name": "frame", "type": "choices", "value": {"choices": ["rain"]}},
                {"from_name": "risk", "to_name": "frame", "type": "choices", "value": {"choices": [choice]}},
            ]}
        call("POST", f"/api/tasks/{task['id']}/annotations/", body)
        time.sleep(1.1)  # the newest annotation is told by its time
for kind in ["JSON", "JSON_MIN"]:
    exported = call("GET", f"/api/projects/{pid}/export?exportType={kind}&download_all_tasks=true")
    json.dump(exported, open(f"{out}/{kind}.json", "w"))
print(json.dumps({"studio_ids": sorted(t["id"] for t in listed)}))
"#;

/// Corner cases of two drives, as `mine-corner-cases` writes them (`seed` names them).
fn corner_cases(dir: &Path, seed: u32) -> std::path::PathBuf {
    let cols = drivetrain_steps::table::frame_columns(&[("rules", DataType::Utf8)]);
    let rows: Vec<serde_json::Map<String, Value>> = (0..6)
        .map(|i| {
            json!({"drive": format!("s{seed}-{}", if i < 3 { "d1" } else { "d2" }), "ts": i as f64 * 10.0,
                   "log_time_ns": i * 10_000_000_000i64, "source_file": "drive.mcap",
                   "source_offset": 100 * i, "rules": "hard_brake"})
            .as_object()
            .unwrap()
            .clone()
        })
        .collect();
    let file = dir.join(format!("corner_cases-{seed}.parquet"));
    drivetrain_steps::table::write_rows(&file, &cols, &rows).unwrap();
    file
}

fn positives(v: &Value) -> u64 {
    ["train", "val", "test"]
        .iter()
        .map(|s| v["splits"][s]["positives"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn labels_make_the_round_trip_through_label_studio() {
    let dir = tmp("label-studio");
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    let export: LabelExportConfig =
        serde_json::from_value(json!({"budget": 6, "formats": ["label-studio"]})).unwrap();
    let v = rt()
        .block_on(drivetrain_steps::label::export(
            &export,
            &corner_cases(&dir, 7),
            None,
            &tasks,
            "run-7/label-export",
        ))
        .unwrap();
    assert_eq!(v["selected"], 6, "{v}");
    // Another run's export: the same task ids, other frames.
    let other_tasks = dir.join("other-tasks");
    std::fs::create_dir_all(&other_tasks).unwrap();
    rt().block_on(drivetrain_steps::label::export(
        &export,
        &corner_cases(&dir, 9),
        None,
        &other_tasks,
        "run-9/label-export",
    ))
    .unwrap();
    // A team's config: another control before ours.
    let config = std::fs::read_to_string(tasks.join("label-config.xml"))
        .unwrap()
        .replace(
            "  <Choices name=\"risk\"",
            "  <Choices name=\"weather\" toName=\"frame\"><Choice value=\"rain\"/><Choice value=\"dry\"/></Choices>\n  <Choices name=\"risk\"",
        )
        // and a choice of their own that is neither class.
        .replace(
            "<Choice value=\"normal\"/>",
            "<Choice value=\"normal\"/>\n    <Choice value=\"unsure\"/>",
        );
    std::fs::write(dir.join("config.xml"), config).unwrap();
    let plan = json!({
        "1": ["risky"],
        "2": [null, "normal"],
        "3": ["normal", "risky"],
        "4": ["normal"], "5": ["unsure"], "6": ["risky"],
    });
    std::fs::write(dir.join("plan.json"), plan.to_string()).unwrap();

    let studio = LabelStudio::start();
    let o = Command::new(LabelStudio::bin("python"))
        .arg("-c")
        .arg(ROUND_TRIP)
        .arg(studio.url())
        .arg(LabelStudio::TOKEN)
        .arg(tasks.join("label-studio.json"))
        .arg(dir.join("config.xml"))
        .arg(dir.join("plan.json"))
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    drop(studio);
    let ids: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ids["studio_ids"], json!([4, 5, 6, 7, 8, 9]), "renumbered");

    let import = |kind: &str, tasks: &Path, extra: Value| {
        let mut config = json!({"split": {"train": 0.5, "val": 0.5}, "min_labeled": 5});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let cfg: LabelImportConfig = serde_json::from_value(config).unwrap();
        let out = dir.join(format!("dataset-{kind}"));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let labels = dir.join(format!("{kind}.json"));
        rt().block_on(drivetrain_steps::label::import(
            &cfg,
            tasks,
            Some(&labels),
            &out,
        ))
    };
    let mapped = json!({"risky": "risky", "normal": "normal", "unsure": "skip"});
    for (kind, from_name) in [("JSON", None), ("JSON_MIN", Some("risk"))] {
        // `unsure` is no class: refused with its count until the stage maps it.
        let e = import(kind, &tasks, json!({"from_name": from_name})).unwrap_err();
        assert!(format!("{e:#}").contains("`unsure` ×1"), "{kind}: {e:#}");
        let v = import(
            kind,
            &tasks,
            json!({"from_name": from_name, "choices": mapped}),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{kind}: {e:#}\n{}",
                std::fs::read_to_string(dir.join(format!("{kind}.json"))).unwrap()
            )
        });
        assert_eq!(v["frames"], 5, "{kind}: {v}");
        assert_eq!(v["unlabeled"], 1, "{kind}: task 5 was unsure: {v}");
        assert_eq!(v["skipped_choices"], 1, "{kind}: {v}");
        assert_eq!(v["foreign_items"], 0, "{kind}: {v}");
        assert_eq!(v["export_id"], "run-7/label-export", "{kind}: {v}");
        if kind == "JSON" {
            // Task 3's newer annotation counts; task 2's cancelled one does not.
            assert_eq!(v["cancelled_annotations"], 1, "{v}");
        }
        // JSON_MIN has one item per annotation (cancelled ones left out by Label
        // Studio): the newest still decides.
        assert_eq!(positives(&v), 3, "tasks 1, 3 and 6: {v}");
        // The same labels against the other run's tasks: ids 1 to 6 there too, but
        // other frames of another export: every item is foreign, nothing is labeled.
        let e = import(
            kind,
            &other_tasks,
            json!({"from_name": from_name, "choices": mapped}),
        )
        .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("are not tasks of this export"), "{kind}: {e}");
        assert!(e.contains("not run-9/label-export"), "{kind}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
