//! `ingest` and `label-import` on inputs nobody here wrote: MCAP files from the Python
//! `mcap` writer (the venv `.ci/run` installs, see `drivetrain_engine::testing`), and
//! Label Studio exports in the shapes Label Studio writes them (`JSON` and `JSON_MIN`).
//! Each test is a case that lost data silently before: frames dropped for out-of-order or
//! equal log times, corruption ingested as nulls, non-vehicle logs refused, skipped logs
//! left in the index, labels lost to renumbered tasks, another control or a cancelled
//! annotation.

use crate::common;
use common::{rt, tmp};

use std::path::{Path, PathBuf};

use drivetrain_steps::ingest::{IngestConfig, OnError};
use drivetrain_steps::label::LabelImportConfig;
use drivetrain_steps::logsource::LogSource;
use serde_json::{json, Value};

/// Writes an MCAP file with the Python `mcap` writer, chunks uncompressed.
fn python_mcap(path: &Path, profile: &str, chunk_size: u64, messages: &[Value]) {
    common::python_mcap(path, profile, chunk_size, "NONE", messages)
}

fn vehicle(t_s: f64, speed: f64) -> Value {
    json!({"topic": "/vehicle", "encoding": "json", "log_time": (t_s * 1e9) as u64,
           "data": json!({"speed_mps": speed, "accel_x": 0.0}).to_string()})
}

fn lane(t_s: f64, confidence: f64) -> Value {
    json!({"topic": "/lane", "encoding": "json", "log_time": (t_s * 1e9) as u64,
           "data": json!({"lane_confidence": confidence}).to_string()})
}

fn cfg(on_error: Option<OnError>) -> IngestConfig {
    IngestConfig {
        source: None,
        objects: None,
        format: None,
        on_error,
        max_unfinished: None,
        ..IngestConfig::default()
    }
}

#[derive(Debug)]
struct Out {
    frames: PathBuf,
    index: PathBuf,
}

fn outputs(dir: &Path) -> Out {
    let out = Out {
        frames: dir.join("frames"),
        index: dir.join("index"),
    };
    std::fs::create_dir_all(&out.frames).unwrap();
    std::fs::create_dir_all(&out.index).unwrap();
    out
}

fn ingest(dir: &Path, logs: &Path, on_error: Option<OnError>) -> anyhow::Result<(Value, Out)> {
    let out = outputs(dir);
    let v = drivetrain_steps::ingest::ingest(
        &cfg(on_error),
        &LogSource::Local(logs.to_path_buf()),
        &out.frames,
        Some(&out.index),
        None,
    )?;
    Ok((v, out))
}

fn query(tables: &[(&str, &Path)], sql: &str) -> Vec<serde_json::Map<String, Value>> {
    rt().block_on(async {
        let ctx = drivetrain_steps::table::session(tables).await.unwrap();
        drivetrain_steps::table::rows(&ctx, sql).await.unwrap()
    })
}

#[test]
fn every_vehicle_message_is_a_frame_whatever_the_order_of_log_times() {
    let dir = tmp("order");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // Out of order, each message in a chunk of its own (chunks out of order); the lane
    // signal written last but logged first must still be held by the frames after it.
    python_mcap(
        &logs.join("shuffled.mcap"),
        "",
        1,
        &[
            vehicle(3.0, 30.0),
            lane(2.5, 0.9),
            vehicle(1.0, 10.0),
            vehicle(2.0, 20.0),
            lane(0.5, 0.1),
        ],
    );
    // Two frames at the same log time, in one chunk.
    python_mcap(
        &logs.join("ties.mcap"),
        "",
        1 << 20,
        &[vehicle(1.0, 1.0), vehicle(1.0, 1.5), vehicle(2.0, 2.0)],
    );
    let (v, out) = ingest(&dir, &logs, None).unwrap();
    assert_eq!(v["frames"], 6, "{v}");
    assert_eq!(v["drives"]["shuffled"], 3, "{v}");
    assert_eq!(v["drives"]["ties"], 3, "{v}");
    assert_eq!(v["reordered"], json!(["shuffled.mcap"]), "{v}");
    let rows = query(
        &[("f", &out.frames)],
        "SELECT drive, ts, speed_mps, lane_confidence FROM f ORDER BY drive, ts, speed_mps",
    );
    let got: Vec<(String, f64, f64, Option<f64>)> = rows
        .iter()
        .map(|r| {
            (
                r["drive"].as_str().unwrap().to_owned(),
                r["ts"].as_f64().unwrap(),
                r["speed_mps"].as_f64().unwrap(),
                r["lane_confidence"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("shuffled".to_owned(), 0.0, 10.0, Some(0.1)),
            ("shuffled".to_owned(), 1.0, 20.0, Some(0.1)),
            ("shuffled".to_owned(), 2.0, 30.0, Some(0.9)),
            ("ties".to_owned(), 0.0, 1.0, None),
            ("ties".to_owned(), 0.0, 1.5, None),
            ("ties".to_owned(), 1.0, 2.0, None),
        ]
    );
}

#[test]
fn a_flipped_byte_in_a_chunk_is_an_error_naming_the_file_and_offset() {
    let dir = tmp("crc");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let file = logs.join("drive.mcap");
    python_mcap(
        &file,
        "",
        1 << 20,
        &[vehicle(1.0, 10.0), vehicle(2.0, 20.0), lane(2.0, 0.5)],
    );
    // The file as written reads; with `speed_mps` turned into `speed_mpt` (the JSON still
    // parses, the column would silently be null) it must not.
    ingest(&dir.join("good"), &logs, None).unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(9)
        .position(|w| w == b"speed_mps")
        .expect("the uncompressed chunk holds the JSON")
        + 8;
    bytes[at] = b't';
    std::fs::write(&file, &bytes).unwrap();
    let e = ingest(&dir.join("bad"), &logs, None).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("drive.mcap"), "{e}");
    assert!(e.contains("CRC mismatch"), "{e}");
    assert!(e.contains("at byte offset"), "{e}");
}

#[test]
fn logs_without_vehicle_messages_are_indexed_with_zero_frames() {
    let dir = tmp("profiles");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let ros1 = |topic: &str, t: u64| json!({"topic": topic, "encoding": "ros1", "log_time": t, "data": "\u{1}\u{2}\u{3}"});
    python_mcap(
        &logs.join("ros1.mcap"),
        "ros1",
        1 << 20,
        &[
            ros1("/tf", 1),
            ros1("/diagnostics", 2),
            ros1("/tf", 3),
            ros1("/tf", (1 << 63) + 5),
        ],
    );
    // Alone in the source: indexed, zero frames, counted; not "no drive logs".
    let (v, out) = ingest(&dir.join("alone"), &logs, None).unwrap();
    assert_eq!(v["frames"], 0, "{v}");
    assert_eq!(v["files_without_frames"], 1, "{v}");
    assert_eq!(v["channels"]["/tf"]["messages"], 3, "{v}");
    let index = query(
        &[("i", &out.index.join("messages.parquet"))],
        "SELECT topic, message_encoding, log_time_ns FROM i ORDER BY log_time_ns",
    );
    assert_eq!(index.len(), 4);
    assert_eq!(index[1]["topic"], "/diagnostics");
    // Log times past 2^63 (any topic but the frames' clock) are indexed as they are,
    // unsigned, never wrapped to negative numbers.
    assert_eq!(
        index[3]["log_time_ns"],
        json!((1u64 << 63) + 5),
        "{index:?}"
    );
    // And a valid file with no messages at all.
    python_mcap(&logs.join("empty.mcap"), "", 1 << 20, &[]);
    let (v, _) = ingest(&dir.join("empty"), &logs, None).unwrap();
    assert_eq!(v["files"], 2, "{v}");
    assert_eq!(v["files_without_frames"], 2, "{v}");
    // Only a source with no logs is an error.
    let nothing = dir.join("nothing");
    std::fs::create_dir_all(&nothing).unwrap();
    std::fs::write(nothing.join("README.txt"), "not a log").unwrap();
    let e = ingest(&dir.join("none"), &nothing, None).unwrap_err();
    assert!(format!("{e:#}").contains("no drive logs"), "{e:#}");
}

#[test]
fn a_skipped_log_is_absent_from_the_index_too() {
    let dir = tmp("skip-index");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let many: Vec<Value> = (0..50).map(|i| vehicle(i as f64, 1.0)).collect();
    python_mcap(&logs.join("a-good.mcap"), "", 1 << 20, &many);
    // Corrupt in a later chunk: the messages before it were read (and indexed) before
    // the error was found.
    python_mcap(&logs.join("b-cut.mcap"), "", 256, &many);
    let mut bad = std::fs::read(logs.join("b-cut.mcap")).unwrap();
    let at = bad.len() * 2 / 3;
    let at = at
        + bad[at..]
            .windows(9)
            .position(|w| w == b"speed_mps")
            .unwrap();
    bad[at] = b'S';
    std::fs::write(logs.join("b-cut.mcap"), &bad).unwrap();
    let (v, out) = ingest(&dir, &logs, Some(OnError::Skip)).unwrap();
    assert_eq!(v["skipped_files"], 1, "{v}");
    assert_eq!(v["frames"], 50, "{v}");
    let index = query(
        &[("i", &out.index.join("messages.parquet"))],
        "SELECT file, count(*) AS n FROM i GROUP BY file",
    );
    assert_eq!(index.len(), 1, "{index:?}");
    assert_eq!(index[0]["file"], "a-good.mcap");
    assert_eq!(index[0]["n"], 50);
    let leftovers: Vec<_> = std::fs::read_dir(&out.index)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["messages.parquet"], "no per-file parts remain");
    // Every log unreadable: nothing was ingested, and that is an error, not a success.
    std::fs::remove_file(logs.join("a-good.mcap")).unwrap();
    let e = ingest(&dir.join("all-bad"), &logs, Some(OnError::Skip)).unwrap_err();
    assert!(format!("{e:#}").contains("could not be read"), "{e:#}");
}

#[test]
fn two_logs_of_one_drive_name_are_refused() {
    let dir = tmp("same-drive");
    let logs = dir.join("logs");
    for d in ["day1", "day2"] {
        std::fs::create_dir_all(logs.join(d)).unwrap();
        python_mcap(
            &logs.join(d).join("car-7.mcap"),
            "",
            1 << 20,
            &[vehicle(1.0, 1.0)],
        );
    }
    let e = ingest(&dir, &logs, None).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("day1/car-7.mcap and day2/car-7.mcap are both drive `car-7`"),
        "{e}"
    );
}

/// The `tasks` directory `label-export` writes, for three frames of two drives.
fn exported_tasks(dir: &Path) -> PathBuf {
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    let cols = drivetrain_steps::table::frame_columns(&[
        ("rules", datafusion::arrow::datatypes::DataType::Utf8),
        ("task_id", datafusion::arrow::datatypes::DataType::Int64),
    ]);
    let rows: Vec<serde_json::Map<String, Value>> = (1..=4)
        .map(|i| {
            json!({"drive": if i <= 2 { "d1" } else { "d2" }, "ts": i as f64, "log_time_ns": i * 1_000_000_000i64,
                   "source_file": "x.mcap", "source_offset": 0, "rules": "hard_brake", "task_id": i})
            .as_object()
            .unwrap()
            .clone()
        })
        .collect();
    drivetrain_steps::table::write_rows(&tasks.join("frames.parquet"), &cols, &rows).unwrap();
    tasks
}

/// The frame task `id` of [`exported_tasks`] was made from, as its `data`.
fn frame(id: i64) -> Value {
    json!({"task_id": id, "drive": if id <= 2 { "d1" } else { "d2" }, "log_time_ns": id * 1_000_000_000,
           "ts": id as f64, "source_file": "x.mcap", "rules": "hard_brake"})
}

/// One annotation as Label Studio exports it.
fn annotation(id: i64, updated: &str, cancelled: bool, results: Value) -> Value {
    json!({"id": id, "completed_by": 1, "result": results, "was_cancelled": cancelled,
           "ground_truth": false, "created_at": updated, "updated_at": updated,
           "lead_time": 2.5, "prediction": {}, "result_count": 0, "task": 0, "project": 1})
}

fn choices(from_name: &str, picked: &[&str]) -> Value {
    json!({"id": "r1", "from_name": from_name, "to_name": "frame", "type": "choices",
           "origin": "manual", "value": {"choices": picked}})
}

/// A task of a `JSON` export: Label Studio's own id (not ours), `data` as we gave it.
fn task(studio_id: i64, our_id: i64, annotations: Vec<Value>) -> Value {
    json!({"id": studio_id, "inner_id": studio_id, "annotations": annotations, "drafts": [],
           "predictions": [], "data": frame(our_id), "meta": {},
           "created_at": "2026-11-20T10:00:00.000000Z", "updated_at": "2026-11-20T10:00:00.000000Z",
           "total_annotations": 1, "cancelled_annotations": 0, "project": 1})
}

fn import(dir: &Path, export: &Value, extra: Value) -> anyhow::Result<Value> {
    let tasks = exported_tasks(dir);
    let labels = dir.join("export.json");
    std::fs::write(&labels, export.to_string()).unwrap();
    let out = dir.join("dataset");
    std::fs::create_dir_all(&out).unwrap();
    let mut config = json!({"split": {"train": 0.5, "val": 0.5}});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let cfg: LabelImportConfig = serde_json::from_value(config).unwrap();
    rt().block_on(drivetrain_steps::label::import(
        &cfg,
        &tasks,
        Some(&labels),
        &out,
    ))
}

#[test]
fn labels_come_back_from_real_label_studio_exports() {
    let dir = tmp("labels");
    let weather = json!({"id": "w", "from_name": "weather", "to_name": "frame", "type": "choices",
                         "origin": "manual", "value": {"choices": ["rain"]}});
    // Renumbered tasks (ids 101…), another control first, a cancelled annotation before
    // the real one, and two annotations of which the newer counts.
    let export = json!([
        task(
            101,
            1,
            vec![annotation(
                1,
                "2026-11-21T09:00:00Z",
                false,
                json!([weather, choices("risk", &["risky"])])
            )]
        ),
        task(
            102,
            2,
            vec![
                annotation(2, "2026-11-21T09:00:00Z", true, json!([])),
                annotation(
                    3,
                    "2026-11-21T09:05:00Z",
                    false,
                    json!([choices("risk", &["normal"])])
                ),
            ]
        ),
        task(
            103,
            3,
            vec![
                annotation(
                    4,
                    "2026-11-21T09:00:00Z",
                    false,
                    json!([choices("risk", &["normal"])])
                ),
                annotation(
                    5,
                    "2026-11-21T10:00:00Z",
                    false,
                    json!([choices("risk", &["risky"])])
                ),
            ]
        ),
        task(
            104,
            4,
            vec![annotation(
                6,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
    ]);
    let v = import(&dir.join("json"), &export, json!({})).unwrap();
    assert_eq!(v["frames"], 4, "{v}");
    assert_eq!(v["unlabeled"], 0, "{v}");
    assert_eq!(v["cancelled_annotations"], 1, "{v}");
    let positives: u64 = ["train", "val", "test"]
        .iter()
        .map(|s| v["splits"][s]["positives"].as_u64().unwrap())
        .sum();
    assert_eq!(positives, 2, "tasks 1 and 3 are risky: {v}");
}

/// JSON_MIN: one flat item per annotation, the control's value at the top level.
#[test]
fn labels_come_back_from_a_json_min_export() {
    let dir = tmp("labels-min");
    let min = json!([
        {"id": 101, "task_id": 1, "drive": "d1", "log_time_ns": 1_000_000_000i64, "risk": "risky", "annotator": 1, "annotation_id": 1, "created_at": "2026-11-21T09:00:00Z", "updated_at": "2026-11-21T09:00:00Z", "lead_time": 1.0},
        {"id": 102, "task_id": 2, "drive": "d1", "log_time_ns": 2_000_000_000i64, "risk": {"choices": ["normal"]}, "annotator": 1, "annotation_id": 2, "created_at": "2026-11-21T09:00:00Z", "updated_at": "2026-11-21T09:00:00Z", "lead_time": 1.0},
        {"id": 103, "task_id": 3, "drive": "d2", "log_time_ns": 3_000_000_000i64, "risk": "normal", "annotator": 1, "annotation_id": 3, "created_at": "2026-11-21T09:00:00Z", "updated_at": "2026-11-21T09:00:00Z", "lead_time": 1.0},
        {"id": 104, "task_id": 4, "drive": "d2", "log_time_ns": 4_000_000_000i64, "risk": "normal", "annotator": 1, "annotation_id": 4, "created_at": "2026-11-21T09:00:00Z", "updated_at": "2026-11-21T09:00:00Z", "lead_time": 1.0},
    ]);
    let v = import(&dir.join("min"), &min, json!({"from_name": "risk"})).unwrap();
    assert_eq!(v["unlabeled"], 0, "{v}");
}

/// Majority: two `normal` against one newer `risky`.
#[test]
fn a_majority_outvotes_the_newest_annotation() {
    let dir = tmp("labels-majority");
    let export = json!([
        task(
            101,
            1,
            vec![
                annotation(
                    1,
                    "2026-11-21T09:00:00Z",
                    false,
                    json!([choices("risk", &["normal"])])
                ),
                annotation(
                    2,
                    "2026-11-21T09:01:00Z",
                    false,
                    json!([choices("risk", &["normal"])])
                ),
                annotation(
                    3,
                    "2026-11-21T09:02:00Z",
                    false,
                    json!([choices("risk", &["risky"])])
                ),
            ]
        ),
        task(
            102,
            2,
            vec![annotation(
                4,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
        task(
            103,
            3,
            vec![annotation(
                5,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
        task(
            104,
            4,
            vec![annotation(
                6,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
    ]);
    let newest = import(&dir.join("newest"), &export, json!({})).unwrap();
    let majority = import(
        &dir.join("majority"),
        &export,
        json!({"policy": "majority"}),
    )
    .unwrap();
    assert_eq!((positives(&newest), positives(&majority)), (1, 0));
}

/// Positive labels over the splits of a dataset's values.
fn positives(v: &Value) -> u64 {
    ["train", "val", "test"]
        .iter()
        .map(|s| v["splits"][s]["positives"].as_u64().unwrap())
        .sum()
}

/// A 1–1 tie under `policy: majority` is settled by the declared `tie` rule and counted
/// (it went silently to the newest annotation, the rule written only in a comment).
#[test]
fn a_tied_majority_follows_the_tie_rule_and_is_counted() {
    let dir = tmp("labels-tie");
    let single = |studio: i64, ours: i64| {
        task(
            studio,
            ours,
            vec![annotation(
                studio,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])]),
            )],
        )
    };
    let export = json!([
        task(
            101,
            1,
            vec![
                annotation(
                    1,
                    "2026-11-21T09:00:00Z",
                    false,
                    json!([choices("risk", &["normal"])])
                ),
                annotation(
                    2,
                    "2026-11-21T09:05:00Z",
                    false,
                    json!([choices("risk", &["risky"])])
                ),
            ]
        ),
        single(102, 2),
        single(103, 3),
        single(104, 4),
    ]);
    let run = |name: &str, extra: Value| import(&dir.join(name), &export, extra).unwrap();
    let newest = run("newest", json!({"policy": "majority"}));
    assert_eq!(
        (
            positives(&newest),
            &newest["majority_ties"],
            &newest["tie_rule"]
        ),
        (1, &json!(1), &json!("newest")),
        "{newest}"
    );
    let oldest = run("oldest", json!({"policy": "majority", "tie": "oldest"}));
    assert_eq!(
        (positives(&oldest), &oldest["tie_rule"]),
        (0, &json!("oldest")),
        "{oldest}"
    );
    let none = run(
        "unlabeled",
        json!({"policy": "majority", "tie": "unlabeled", "min_labeled": 0.5}),
    );
    assert_eq!(
        (
            &none["unlabeled"],
            &none["ties_unlabeled"],
            none["frames"].as_u64()
        ),
        (&json!(1), &json!(1), Some(3)),
        "{none}"
    );
    // Left unlabeled, the tie counts against `min_labeled` (0.9 by default: 3 of 4 fail).
    let e = import(
        &dir.join("short"),
        &export,
        json!({"policy": "majority", "tie": "unlabeled"}),
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("labeled"), "{e:#}");
}

/// Regression (round 2): annotation times compared as text put `10:00:00Z` after
/// `10:00:00.500000Z`; JSON_MIN items of tasks nobody annotated were counted as
/// annotations without a choice; a config with `Risky`/`Normal` (or an added `unsure`)
/// made every other choice a negative label.
#[test]
fn label_choices_are_mapped_and_times_parsed() {
    let dir = tmp("label-choices");
    let export = json!([
        task(
            101,
            1,
            vec![
                annotation(
                    1,
                    "2026-11-21T10:00:00.500000Z",
                    false,
                    json!([choices("risk", &["normal"])])
                ),
                annotation(
                    2,
                    "2026-11-21T10:00:01Z",
                    false,
                    json!([choices("risk", &["risky"])])
                ),
            ]
        ),
        task(
            102,
            2,
            vec![annotation(
                3,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
        task(
            103,
            3,
            vec![annotation(
                4,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
        task(
            104,
            4,
            vec![annotation(
                5,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["normal"])])
            )]
        ),
    ]);
    let v = import(&dir.join("times"), &export, json!({})).unwrap();
    let positives = |v: &Value| -> u64 {
        ["train", "val", "test"]
            .iter()
            .map(|s| v["splits"][s]["positives"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        positives(&v),
        1,
        "task 1's newest (by time, not text) is risky: {v}"
    );

    // Capitalized choices: refused until mapped, never read as `normal`.
    let caps = json!([
        task(
            101,
            1,
            vec![annotation(
                1,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["Risky"])])
            )]
        ),
        task(
            102,
            2,
            vec![annotation(
                2,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["Normal"])])
            )]
        ),
        task(
            103,
            3,
            vec![annotation(
                3,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["Risky"])])
            )]
        ),
        task(
            104,
            4,
            vec![annotation(
                4,
                "2026-11-21T09:00:00Z",
                false,
                json!([choices("risk", &["unsure"])])
            )]
        ),
    ]);
    for from_name in [json!(null), json!("risk")] {
        let e = import(&dir.join("caps"), &caps, json!({"from_name": from_name})).unwrap_err();
        let e = format!("{e:#}");
        for counted in ["`Risky` ×2", "`Normal` ×1", "`unsure` ×1"] {
            assert!(e.contains(counted), "{e}");
        }
    }
    let v = import(
        &dir.join("mapped"),
        &caps,
        json!({"choices": {"Risky": "risky", "Normal": "normal", "unsure": "skip"}, "min_labeled": 3}),
    )
    .unwrap();
    assert_eq!(
        (
            positives(&v),
            v["frames"].as_u64(),
            v["skipped_choices"].as_u64()
        ),
        (2, Some(3), Some(1)),
        "{v}"
    );

    // JSON_MIN with a task nobody annotated: unlabeled, not an annotation without a choice.
    let mut unannotated = frame(4);
    unannotated["id"] = json!(104);
    let min = json!([
        {"id": 101, "task_id": 1, "drive": "d1", "log_time_ns": 1_000_000_000i64, "risk": "risky", "annotator": 1, "annotation_id": 1, "updated_at": "2026-11-21T09:00:00Z"},
        {"id": 102, "task_id": 2, "drive": "d1", "log_time_ns": 2_000_000_000i64, "risk": "normal", "annotator": 1, "annotation_id": 2, "updated_at": "2026-11-21T09:00:00Z"},
        {"id": 103, "task_id": 3, "drive": "d2", "log_time_ns": 3_000_000_000i64, "risk": "normal", "annotator": 1, "annotation_id": 3, "updated_at": "2026-11-21T09:00:00Z"},
        unannotated,
    ]);
    let v = import(&dir.join("min"), &min, json!({"min_labeled": 3})).unwrap();
    assert_eq!(v["unlabeled"], 1, "{v}");
    assert_eq!(v["annotations_without_label"], 0, "{v}");
}

#[test]
fn too_few_labels_fail_the_stage_with_the_numbers() {
    let dir = tmp("min-labeled");
    // Only task 1 labeled; task 2's only annotation was cancelled; an item of some other
    // project has no task id of ours.
    let export = json!([
        task(101, 1, vec![annotation(1, "2026-11-21T09:00:00Z", false, json!([choices("risk", &["risky"])]))]),
        task(102, 2, vec![annotation(2, "2026-11-21T09:00:00Z", true, json!([]))]),
        {"id": 7, "annotations": [], "data": {"image": "x.jpg"}},
    ]);
    let e = import(&dir.join("foreign"), &export, json!({})).unwrap_err();
    assert!(
        format!("{e:#}").contains(
            "1 labeled item(s) are not tasks of this export (max_foreign 0), e.g. no `task_id`"
        ),
        "{e:#}"
    );
    let e = import(&dir.join("default"), &export, json!({"max_foreign": 1})).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("only 1 of 4 exported tasks came back labeled (min_labeled 0.9 needs 4)"),
        "{e}"
    );
    assert!(e.contains("1 cancelled annotation(s) skipped"), "{e}");
    assert!(e.contains("1 item(s) not of this export"), "{e}");
    // A count the user accepts.
    let v = import(
        &dir.join("count"),
        &export,
        json!({"min_labeled": 1, "max_foreign": 1}),
    )
    .unwrap();
    assert_eq!(v["unlabeled"], 3, "{v}");
}

/// Regression (round 2): a `/vehicle` message without `accel_x` took the previous
/// message's value, so one hard brake followed by nine messages without the field made
/// ten hard-brake frames. A frame's own fields are its message's; the other channels
/// are held, with their age in a column of their own so rules can exclude stale values.
#[test]
fn a_missing_vehicle_field_is_null_never_the_previous_value() {
    let dir = tmp("own-fields");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut messages = vec![lane(0.0, 0.8)];
    messages.push(
        json!({"topic": "/vehicle", "encoding": "json", "log_time": 0u64,
        "data": json!({"speed_mps": 12.0, "accel_x": -6.0}).to_string()}),
    );
    for i in 1..10u64 {
        let data = if i == 5 {
            json!({"speed_mps": 12.0, "accel_x": null})
        } else {
            json!({"speed_mps": 12.0})
        };
        messages.push(
            json!({"topic": "/vehicle", "encoding": "json", "log_time": i * 100_000_000,
            "data": data.to_string()}),
        );
    }
    python_mcap(&logs.join("brake.mcap"), "", 1 << 20, &messages);
    let (v, out) = ingest(&dir, &logs, None).unwrap();
    assert_eq!(v["frames"], 10, "{v}");
    let rows = query(
        &[("f", &out.frames)],
        "SELECT count(*) AS n, count(accel_x) AS with_accel, min(lane_confidence) AS lane, max(lane_age_s) AS oldest FROM f WHERE accel_x < -4 OR accel_x IS NULL",
    );
    assert_eq!(rows[0]["n"], 10, "{rows:?}");
    assert_eq!(
        rows[0]["with_accel"], 1,
        "one hard brake, not ten: {rows:?}"
    );
    // The lane message is held onto every frame, and its age says how old it is.
    assert_eq!(rows[0]["lane"], 0.8, "{rows:?}");
    assert_eq!(rows[0]["oldest"], 0.9, "{rows:?}");
    let fresh = query(&[("f", &out.frames)], "SELECT objects_age_s FROM f LIMIT 1");
    assert_eq!(
        fresh[0]["objects_age_s"],
        Value::Null,
        "no /objects message yet"
    );
}

/// Regression (round 2): one `/vehicle` value of the wrong type (`"12.5"`, Python's
/// `NaN`), or an unrelated topic with a known key of another type (`/diagnostics
/// {"class": 3}`) or a JSON array, failed the whole file. Now the bad field is null and
/// counted per drive and field, the message's other fields are kept, and topics that
/// make no column are never parsed.
#[test]
fn one_bad_value_is_null_and_counted_never_the_drive() {
    let dir = tmp("bad-values");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let raw = |topic: &str, t: u64, data: &str| json!({"topic": topic, "encoding": "json", "log_time": t, "data": data});
    let mut messages = vec![
        raw("/diagnostics", 0, r#"{"class": 3}"#),
        raw("/diagnostics", 0, "[1, 2, 3]"),
    ];
    for i in 0..200u64 {
        let t = i * 50_000_000;
        let data = match i {
            7 => r#"{"speed_mps": "12.5", "accel_x": -1.0}"#.to_owned(),
            8 => r#"{"speed_mps": NaN, "accel_x": -1.0}"#.to_owned(),
            9 => r#"{"speed_mps": 3.0, "steering": [0.1]}"#.to_owned(),
            _ => json!({"speed_mps": 10.0, "accel_x": 0.0}).to_string(),
        };
        messages.push(raw("/vehicle", t, &data));
    }
    messages.push(raw(
        "/objects",
        10_000_000_000,
        r#"{"class": 3, "distance_m": 4.5}"#,
    ));
    messages.push(raw("/vehicle", 10_000_000_000, "[1]"));
    python_mcap(&logs.join("drive.mcap"), "", 4096, &messages);
    let (v, out) = ingest(&dir, &logs, None).unwrap();
    assert_eq!(v["frames"], 200, "{v}");
    assert_eq!(
        v["invalid_values"]["drive"],
        json!({"/vehicle.speed_mps": 2, "/vehicle.steering": 1, "/objects.class": 1}),
        "{v}"
    );
    assert_eq!(v["invalid_values_total"], 4, "{v}");
    assert_eq!(
        v["unreadable_messages"]["drive"],
        json!({"/vehicle": 1}),
        "{v}"
    );
    assert_eq!(v["warnings"].as_array().unwrap().len(), 2, "{v}");
    let rows = query(
        &[("f", &out.frames)],
        "SELECT count(speed_mps) AS speeds, count(accel_x) AS accels FROM f",
    );
    assert_eq!(
        (rows[0]["speeds"].as_i64(), rows[0]["accels"].as_i64()),
        (Some(198), Some(199)),
        "{rows:?}"
    );
}

/// Regression (round 2): a JSON-lines log out of time order got `ts` measured from its
/// first line (earlier frames clamped to 0.0); a log time at or past 2^63 ns turned
/// negative in the int64 column.
#[test]
fn json_lines_times_are_exact_whatever_the_order() {
    let dir = tmp("jsonl-order");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut lines: Vec<String> = (0..100u64)
        .map(|i| json!({"log_time_ns": 1_000_000_000 + i * 10_000_000, "speed_mps": i}).to_string())
        .collect();
    // A fixed shuffle.
    for i in 0..lines.len() {
        lines.swap(i, (i * 37 + 11) % 100);
    }
    std::fs::write(logs.join("shuffled.jsonl"), lines.join("\n")).unwrap();
    let (_, out) = ingest(&dir, &logs, None).unwrap();
    let rows = query(
        &[("f", &out.frames)],
        "SELECT count(*) AS wrong FROM f WHERE abs(ts - speed_mps / 100.0) > 1e-9",
    );
    assert_eq!(rows[0]["wrong"], 0, "{rows:?}");
    std::fs::write(
        logs.join("shuffled.jsonl"),
        format!(
            "{}\n{}\n",
            json!({"log_time_ns": 5}),
            json!({"log_time_ns": 1u64 << 63})
        ),
    )
    .unwrap();
    let e = format!("{:#}", ingest(&dir.join("far"), &logs, None).unwrap_err());
    assert!(
        e.contains("9223372036854775808 ns") && e.contains("byte offset"),
        "{e}"
    );
}

/// A log cut inside a chunk: the chunks before the cut are read (as `mcap recover`
/// does), the log is listed as unfinished with where it was cut, the stage says so in
/// its warnings, and `max_unfinished: 0` fails it.
#[test]
fn a_cut_log_keeps_its_whole_chunks_and_says_it_is_unfinished() {
    let dir = tmp("cut-log");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let many: Vec<Value> = (0..400).map(|i| vehicle(i as f64 / 10.0, 1.0)).collect();
    python_mcap(&logs.join("cut.mcap"), "", 1024, &many);
    let bytes = std::fs::read(logs.join("cut.mcap")).unwrap();
    std::fs::write(logs.join("cut.mcap"), &bytes[..bytes.len() / 2]).unwrap();
    let (v, _) = ingest(&dir, &logs, None).unwrap();
    let frames = v["frames"].as_u64().unwrap();
    assert!(frames > 100 && frames < 400, "{v}");
    assert_eq!(v["unfinished"], json!(["cut.mcap"]), "{v}");
    assert!(
        v["unfinished_detail"][0]["cut_at"].as_u64().is_some(),
        "{v}"
    );
    assert!(
        v["warnings"][0]
            .as_str()
            .unwrap()
            .contains("1 log(s) unfinished"),
        "{v}"
    );
    let strict = drivetrain_steps::ingest::IngestConfig {
        max_unfinished: Some(0),
        ..Default::default()
    };
    let out = outputs(&dir.join("strict"));
    let e =
        drivetrain_steps::ingest::ingest(&strict, &LogSource::Local(logs), &out.frames, None, None)
            .unwrap_err();
    assert!(
        format!("{e:#}").contains("more than max_unfinished 0"),
        "{e:#}"
    );
}
