//! `ingest` on drive logs as fleets write them, by writers nobody here wrote
//! (`fleet_writers.py`: mcap-protobuf-support, rosbags' rosbag2 writer, mcap-ros2-support,
//! rosbags' ROS 1 serializer; a vendor message whose schema is rosidl-style IDL, written
//! and read back by rosbags), mapped to frames by a declared mapping; every frame
//! compared, field by field, with what the Python readers decode from the same file.
//! Messages that do not decode are counted and warned of, and fail the stage on the clock
//! topic; a mapping that does not fit the logs says what they have.

use crate::common;
use common::{rt, tmp};

use std::path::{Path, PathBuf};
use std::process::Command;

use drivetrain_steps::ingest::{FramesConfig, HoldConfig, IngestConfig};
use drivetrain_steps::logsource::LogSource;
use serde_json::{json, Map, Value};

const CLOCK: &str = "/vehicle/odometry";

fn python(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fleet_writers.py");
    let out = Command::new(drivetrain_engine::testing::venv_bin("python"))
        .arg(script)
        .args(args)
        .output()
        .expect("the tests' venv python");
    assert!(
        out.status.success(),
        "fleet_writers.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Writes a drive log of `kind` at `path` (a `.mcap` file; rosbags writes a bag
/// directory, whose one file is moved there).
fn write(kind: &str, path: &Path, flags: &[&str]) {
    let bag = kind == "ros2" || kind == "ros2-idl";
    let target = if bag {
        path.with_extension("bag")
    } else {
        path.to_path_buf()
    };
    let mut args = vec!["write", kind, target.to_str().unwrap()];
    args.extend(flags);
    python(&args);
    if bag {
        let name = target.file_name().unwrap().to_str().unwrap();
        std::fs::rename(target.join(format!("{name}.mcap")), path).unwrap();
        std::fs::remove_dir_all(&target).unwrap();
    }
}

/// (topic, log time, mapped values) of every message of a mapped topic, as the Python
/// readers decode them.
fn decoded(path: &Path, mapping: &[(&str, &str)]) -> Vec<(String, u64, Map<String, Value>)> {
    let m: Map<String, Value> = mapping
        .iter()
        .map(|(c, s)| (c.to_string(), json!(s)))
        .collect();
    python(&[
        "decode",
        path.to_str().unwrap(),
        &Value::Object(m).to_string(),
    ])
    .lines()
    .map(|l| {
        let v: Value = serde_json::from_str(l).unwrap();
        (
            v["topic"].as_str().unwrap().to_owned(),
            v["log_time"].as_u64().unwrap(),
            v["values"].as_object().unwrap().clone(),
        )
    })
    .collect()
}

/// The frames the documented rule makes of decoded messages: one per clock message, its
/// own fields, and each other topic's latest value at or before it (null when older
/// than `max_age`).
fn expected(
    mut msgs: Vec<(String, u64, Map<String, Value>)>,
    max_age: Option<u64>,
) -> Vec<(u64, Map<String, Value>)> {
    msgs.sort_by_key(|m| m.1);
    let mut held: std::collections::BTreeMap<String, (u64, Map<String, Value>)> =
        Default::default();
    let mut out = Vec::new();
    for (topic, t, values) in msgs {
        if topic != CLOCK {
            held.insert(topic, (t, values));
            continue;
        }
        let mut row = values;
        for (since, vals) in held.values() {
            let fresh = max_age.is_none_or(|max| t - since <= max);
            for (c, v) in vals {
                row.insert(c.clone(), if fresh { v.clone() } else { Value::Null });
            }
        }
        out.push((t, row));
    }
    out
}

fn cfg(mapping: &[(&str, &str)], max_age: Option<&str>) -> IngestConfig {
    IngestConfig {
        frames: Some(FramesConfig {
            clock: CLOCK.into(),
            fields: mapping
                .iter()
                .map(|(c, s)| (c.to_string(), s.to_string()))
                .collect(),
            hold: max_age.map(|m| HoldConfig { max_age: m.into() }),
        }),
        ..IngestConfig::default()
    }
}

fn ingest(dir: &Path, logs: &Path, cfg: &IngestConfig) -> anyhow::Result<(Value, PathBuf)> {
    let frames = dir.join("frames");
    let _ = std::fs::remove_dir_all(&frames);
    std::fs::create_dir_all(&frames).unwrap();
    let v = drivetrain_steps::ingest::ingest(
        cfg,
        &LogSource::Local(logs.to_path_buf()),
        &frames,
        None,
        None,
    )?;
    Ok((v, frames))
}

fn rows(frames: &Path, drive: &str) -> Vec<Map<String, Value>> {
    rt().block_on(async {
        let ctx = drivetrain_steps::table::session(&[("f", frames)])
            .await
            .unwrap();
        drivetrain_steps::table::rows(
            &ctx,
            &format!("SELECT * FROM f WHERE drive = '{drive}' ORDER BY log_time_ns"),
        )
        .await
        .unwrap()
    })
}

/// Ingests `logs` by `mapping` and checks every frame of `drive` against the Python
/// readers' decoding of `file`, column by column.
fn same_as_python(
    dir: &Path,
    logs: &Path,
    drive: &str,
    mapping: &[(&str, &str)],
    max_age: Option<(&str, u64)>,
) -> Value {
    let (v, frames) = ingest(dir, logs, &cfg(mapping, max_age.map(|m| m.0))).unwrap();
    let want = expected(
        decoded(&logs.join(format!("{drive}.mcap")), mapping),
        max_age.map(|m| m.1),
    );
    let got = rows(&frames, drive);
    assert_eq!(got.len(), want.len(), "{drive}: frames");
    assert!(got.len() >= 40, "{drive}: {} frames", got.len());
    for (row, (t, values)) in got.iter().zip(&want) {
        assert_eq!(row["log_time_ns"], json!(t), "{drive}");
        for (c, v) in values {
            // Python's integers are the table's float64s.
            let same = match (row[c].as_f64(), v.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => &row[c] == v,
            };
            assert!(same, "{drive}: {c} of the frame at {t}: {} != {v}", row[c]);
        }
    }
    assert_eq!(v["undecodable_messages_total"], json!(0), "{v}");
    v
}

#[test]
fn protobuf_logs_become_the_frames_python_decodes() {
    let dir = tmp("fleet-proto");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    write("protobuf", &logs.join("proto.mcap"), &[]);
    write("protobuf", &logs.join("shuffled.mcap"), &["--shuffle"]);
    let mapping = [
        ("speed_mps", "/vehicle/odometry.twist.linear.x"),
        ("yaw_rate", "/vehicle/odometry.twist.angular.z"),
        ("steering", "/vehicle/odometry.covariance[3]"),
        ("object_class", "/vehicle/odometry.frame_id"),
        ("accel_x", "/imu/data.linear_acceleration.x"),
        ("lane_confidence", "/perception/lanes.confidence"),
        ("lateral_offset_m", "/perception/lanes.count"),
    ];
    for drive in ["proto", "shuffled"] {
        let v = same_as_python(&dir, &logs, drive, &mapping, None);
        assert_eq!(v["reordered"], json!(["shuffled.mcap"]), "{v}");
        assert_eq!(v["frames"], json!(80), "{v}");
    }
    // Put in order through sorted runs on disk (a 4 KiB bound): the same frames as in
    // memory, and the runs gone after.
    let (_, in_memory) = ingest(&dir.join("in-memory"), &logs, &cfg(&mapping, None)).unwrap();
    let mut small = cfg(&mapping, None);
    small.reorder_memory = Some("4Ki".into());
    let (v, spilled) = ingest(&dir, &logs, &small).unwrap();
    assert!(v["reorder_runs"].as_u64().unwrap() > 5, "{v}");
    assert_eq!(rows(&spilled, "shuffled"), rows(&in_memory, "shuffled"));
    let left: Vec<_> = std::fs::read_dir(&spilled)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|n| n.starts_with("drive=")), "{left:?}");
    // Held values older than `max_age` are null; their age stays a column.
    same_as_python(&dir, &logs, "proto", &mapping, Some(("150ms", 150_000_000)));
    let (_, frames) = ingest(&dir, &logs, &cfg(&mapping, Some("150ms"))).unwrap();
    let held = rows(&frames, "proto");
    let stale = held
        .iter()
        .filter(|r| r["lane_confidence"].is_null())
        .count();
    assert!(stale > 0 && stale < held.len(), "{stale} of {}", held.len());
    assert!(
        held[1..].iter().all(|r| r["lane_age_s"].is_f64()),
        "{:?}",
        held[1]
    );
    // An enum reads as its value's name.
    let (_, frames) = ingest(
        &dir,
        &logs,
        &cfg(&[("weather", "/vehicle/odometry.gear")], None),
    )
    .unwrap();
    assert_eq!(rows(&frames, "proto")[0]["weather"], json!("DRIVE"));
}

#[test]
fn ros2_logs_become_the_frames_python_decodes() {
    let dir = tmp("fleet-ros2");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    write("ros2", &logs.join("rosbags.mcap"), &[]);
    write("ros2", &logs.join("big_endian.mcap"), &["--big-endian"]);
    write("ros2-mcap", &logs.join("mcap_ros2.mcap"), &[]);
    write("ros2", &logs.join("shuffled.mcap"), &["--shuffle"]);
    let mapping = [
        ("speed_mps", "/vehicle/odometry.twist.twist.linear.x"),
        ("yaw_rate", "/vehicle/odometry.twist.twist.angular.z"),
        ("steering", "/vehicle/odometry.pose.covariance[35]"),
        ("object_class", "/imu/data.header.frame_id"),
        ("lat", "/imu/data.header.stamp.nanosec"),
        ("accel_x", "/imu/data.linear_acceleration.x"),
        ("accel_y", "/imu/data.linear_acceleration_covariance[8]"),
        ("lane_confidence", "/perception/lanes.data"),
    ];
    for drive in ["rosbags", "big_endian", "mcap_ros2", "shuffled"] {
        same_as_python(&dir, &logs, drive, &mapping, None);
    }
}

#[test]
fn ros2_idl_schemas_decode_as_rosbags_reads_them() {
    let dir = tmp("fleet-ros2idl");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    write("ros2-idl", &logs.join("idl.mcap"), &[]);
    let mapping = [
        ("speed_mps", "/vehicle/odometry.speeds[2]"),
        ("lat", "/vehicle/odometry.stamp.nanosec"),
        ("object_class", "/vehicle/odometry.frame_id"),
        ("accel_x", "/vehicle/odometry.temps[1]"),
        ("yaw_rate", "/vehicle/odometry.codes[2]"),
        ("brake_pressure", "/vehicle/odometry.mode"),
        ("lon", "/vehicle/odometry.odometer"),
        ("steering", "/vehicle/odometry.status.level"),
        ("weather", "/vehicle/odometry.status.text"),
        ("accel_y", "/imu/data.linear_acceleration.x"),
        ("lane_confidence", "/perception/lanes.data"),
    ];
    same_as_python(&dir, &logs, "idl", &mapping, None);
}

#[test]
fn ros1_logs_become_the_frames_python_decodes() {
    let dir = tmp("fleet-ros1");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    write("ros1", &logs.join("noetic.mcap"), &[]);
    let mapping = [
        ("speed_mps", "/vehicle/odometry.twist.twist.linear.x"),
        ("steering", "/vehicle/odometry.pose.covariance[35]"),
        ("object_class", "/imu/data.header.frame_id"),
        ("accel_x", "/imu/data.linear_acceleration.x"),
        ("lane_confidence", "/perception/lanes.data"),
    ];
    same_as_python(&dir, &logs, "noetic", &mapping, None);
}

#[test]
fn a_mapping_that_does_not_fit_the_logs_says_what_they_have() {
    let dir = tmp("fleet-misfit");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    write("ros2", &logs.join("drive.mcap"), &[]);
    let e = ingest(
        &dir,
        &logs,
        &cfg(&[("accel_x", "/imu/data.linear_accel.x")], None),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("frames.fields.accel_x: `/imu/data` has no `linear_accel.x`")
            && e.contains("linear_acceleration.{x,y,z}")
            && e.contains("header.{stamp,frame_id}"),
        "{e}"
    );
    let e = ingest(
        &dir,
        &logs,
        &cfg(&[("speed_mps", "/odom.twist.twist.linear.x")], None),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("topic(s) /odom are in none of the 1 log(s)") && e.contains("/imu/data"),
        "{e}"
    );
}

#[test]
fn the_default_layout_reads_every_encoding_of_vehicle() {
    // One JSON (spelled `JSON`) and one protobuf `/vehicle` channel: every message a
    // frame (100 of 200 before, the protobuf half silently dropped).
    let dir = tmp("fleet-mixed");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    write("mixed", &logs.join("mixed.mcap"), &[]);
    let (v, frames) = ingest(&dir, &logs, &IngestConfig::default()).unwrap();
    assert_eq!(v["frames"], json!(200), "{v}");
    for (i, r) in rows(&frames, "mixed").iter().enumerate() {
        assert_eq!(r["speed_mps"], json!(i as f64), "frame {i}");
        assert_eq!(r["accel_x"], json!(-1.0), "frame {i}");
    }
    // A protobuf `/vehicle` of another layout has none of its fields: said, not nulls.
    std::fs::remove_file(logs.join("mixed.mcap")).unwrap();
    write(
        "protobuf",
        &logs.join("odometry.mcap"),
        &["--vehicle-topic"],
    );
    let e = ingest(&dir, &logs, &IngestConfig::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`/vehicle` (protobuf `fleet.Odometry`) has none of the fields the default frame layout reads")
            && e.contains("twist.{linear,angular}")
            && e.contains("declare `frames:`"),
        "{e}"
    );
}

#[test]
fn undecodable_messages_are_counted_and_fail_the_clock_topic_by_default() {
    let dir = tmp("fleet-garbage");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mapping = [
        ("speed_mps", "/vehicle/odometry.twist.linear.x"),
        ("accel_x", "/imu/data.linear_acceleration.x"),
    ];
    // Every 10th IMU message is garbage: counted per drive, topic and reason, warned.
    write("garbage", &logs.join("g.mcap"), &["0"]);
    let (v, _) = ingest(&dir, &logs, &cfg(&mapping, None)).unwrap();
    assert_eq!(v["frames"], json!(40), "{v}");
    assert_eq!(v["undecodable_messages_total"], json!(20), "{v}");
    let reasons = v["undecodable_messages"]["g"]["/imu/data"]
        .as_object()
        .unwrap();
    assert_eq!(
        reasons.values().map(|n| n.as_u64().unwrap()).sum::<u64>(),
        20
    );
    assert!(
        reasons
            .keys()
            .all(|r| r.starts_with("payload: not a fleet.Imu")),
        "{reasons:?}"
    );
    let warned = v["warnings"].as_array().unwrap();
    assert!(
        warned.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("20 message(s) could not be decoded")),
        "{warned:?}"
    );
    // Three garbage clock messages and one in an encoding nobody reads: the stage fails
    // naming them, unless `max_undecodable` allows them.
    write("garbage", &logs.join("g.mcap"), &["3", "--other-encoding"]);
    let e = ingest(&dir, &logs, &cfg(&mapping, None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("4 message(s) of the frame clock topic `/vehicle/odometry` could not be decoded, more than max_undecodable 0")
            && e.contains("message encoding `cbor` is not one ingest decodes")
            && e.contains("3 × payload: not a fleet.Odometry"),
        "{e}"
    );
    let mut allowing = cfg(&mapping, None);
    allowing.max_undecodable = Some(4);
    let (v, _) = ingest(&dir, &logs, &allowing).unwrap();
    assert_eq!(v["frames"], json!(37), "{v}");
    assert_eq!(v["undecodable_messages_total"], json!(24), "{v}");
}

/// `fleet-sim` writes protobuf and ROS 2 as well as JSON: the Python readers decode its
/// files, and ingest makes the same frame table of each encoding (all but where each
/// message lies in its file).
#[test]
fn fleet_sim_in_every_encoding_ingests_to_the_same_frames() {
    use drivetrain_steps::sim::{simulate, FleetSimConfig, SimEncoding};
    let dir = tmp("fleet-sim-encodings");
    let mut tables = Vec::new();
    for (name, encoding) in [
        ("json", SimEncoding::Json),
        ("protobuf", SimEncoding::Protobuf),
        ("ros2", SimEncoding::Ros2),
    ] {
        let logs = dir.join(name).join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let cfg = FleetSimConfig {
            drives: Some(2),
            duration: Some("30s".into()),
            rate_hz: Some(10.0),
            seed: Some(7),
            events: None,
            encoding: Some(encoding),
        };
        simulate(&cfg, &logs).unwrap();
        let (v, frames) = ingest(&dir.join(name), &logs, &IngestConfig::default()).unwrap();
        assert_eq!(v["frames"], json!(600), "{name}: {v}");
        assert_eq!(v["undecodable_messages_total"], json!(0), "{name}: {v}");
        assert_eq!(v["invalid_values_total"], json!(0), "{name}: {v}");
        let mut rows = rows(&frames, "drive-001");
        for r in &mut rows {
            r.remove("source_offset");
            r.remove("source_chunk_offset");
        }
        // What the Python readers decode from our protobuf and ROS 2 files.
        if name != "json" {
            let python = decoded(
                &logs.join("drive-001.mcap"),
                &[
                    ("speed_mps", "/vehicle.speed_mps"),
                    ("weather", "/context.weather"),
                ],
            );
            let speeds: Vec<&Value> = python
                .iter()
                .filter(|m| m.0 == "/vehicle")
                .map(|m| &m.2["speed_mps"])
                .collect();
            let ours: Vec<&Value> = rows.iter().map(|r| &r["speed_mps"]).collect();
            assert_eq!(speeds, ours, "{name}");
            assert!(python.iter().any(|m| m.0 == "/context"), "{name}");
        }
        tables.push((name, rows));
    }
    assert!(tables[0].1.len() == 300 && tables[0].1[0].len() == 27);
    for (name, rows) in &tables[1..] {
        assert!(rows == &tables[0].1, "{name}: frames differ from json's");
    }
}
