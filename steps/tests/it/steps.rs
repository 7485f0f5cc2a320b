//! The steps' own work on real files: MCAP written by `fleet-sim` and by hand (lz4,
//! unchunked, truncated, corrupt, another profile), Parquet frames, the split, training
//! over TCP between real ranks, checkpoints.

use crate::common;
use common::{rt, tmp};

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::path::Path;

use drivetrain_steps::ingest::{IngestConfig, OnError};
use drivetrain_steps::logsource::LogSource;
use drivetrain_steps::mcapio;
use drivetrain_steps::sim::FleetSimConfig;
use drivetrain_steps::train::TrainConfig;

fn sim(dir: &Path, seed: u64, drives: u32) -> drivetrain_steps::sim::SimSummary {
    let cfg: FleetSimConfig = serde_json::from_value(serde_json::json!({
        "drives": drives, "duration": "30s", "rate_hz": 10, "seed": seed,
        "events": {"hard_brake": 4, "cut_in": 2, "pedestrian_close_call": 2, "low_lane_confidence": 2},
    }))
    .unwrap();
    drivetrain_steps::sim::simulate(&cfg, dir).unwrap()
}

#[test]
fn the_simulator_is_deterministic_and_injects_events() {
    let (a, b, c) = (tmp("sim-a"), tmp("sim-b"), tmp("sim-c"));
    let sa = sim(&a, 7, 2);
    sim(&b, 7, 2);
    sim(&c, 8, 2);
    let bytes = |d: &Path| std::fs::read(d.join("drive-001.mcap")).unwrap();
    assert_eq!(bytes(&a), bytes(&b), "the same seed writes the same bytes");
    assert_ne!(bytes(&a), bytes(&c));
    assert_eq!(sa.frames, 600);
    assert!(sa.events.values().sum::<u64>() > 0, "{:?}", sa.events);
    // Foxglove-readable: the mcap crate's own reader agrees on the messages.
    let data = bytes(&a);
    let n = mcap::MessageStream::new(&data).unwrap().count();
    assert_eq!(n, 300 * 4 + 30, "four channels per frame, context at 1 Hz");
}

#[test]
fn the_reader_gives_exact_offsets() {
    let dir = tmp("offsets");
    sim(&dir, 1, 1);
    let path = dir.join("drive-000.mcap");
    let file = std::fs::read(&path).unwrap();
    let mut seen = 0;
    let mut topics = BTreeMap::new();
    mcapio::scan(&path, &mut |m| {
        seen += 1;
        *topics.entry(m.channel.topic.clone()).or_insert(0) += 1;
        // The offset points at the chunk record holding the message …
        assert_eq!(
            file[m.offset as usize], 0x06,
            "a chunk record at {}",
            m.offset
        );
        // … and the chunk offset at the message record inside it.
        let chunk = mcap::parse_record(0x06, &file[m.offset as usize + 9..]).unwrap();
        let mcap::records::Record::Chunk { header, data } = chunk else {
            panic!()
        };
        let raw = zstd::bulk::decompress(&data, header.uncompressed_size as usize).unwrap();
        let at = m.chunk_offset.unwrap() as usize;
        assert_eq!(raw[at], 0x05, "a message record");
        let len = u64::from_le_bytes(raw[at + 1..at + 9].try_into().unwrap()) as usize;
        assert!(raw[at + 9..at + 9 + len].ends_with(m.data));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, 300 * 4 + 30);
    assert_eq!(topics["/vehicle"], 300);
    assert_eq!(topics["/context"], 30);
}

/// Writes an MCAP file with `opts` holding `n` JSON vehicle messages and `n` ROS 2 (CDR)
/// messages that are indexed but not decoded.
fn hand_written(path: &Path, opts: mcap::WriteOptions, n: u64) {
    let mut w = opts
        .create(BufWriter::new(std::fs::File::create(path).unwrap()))
        .unwrap();
    let js = w.add_schema("Vehicle", "jsonschema", b"{}").unwrap();
    let vehicle = w
        .add_channel(js, "/vehicle", "json", &BTreeMap::new())
        .unwrap();
    let ros = w
        .add_schema("sensor_msgs/msg/Imu", "ros2msg", b"float64 x")
        .unwrap();
    let imu = w.add_channel(ros, "/imu", "cdr", &BTreeMap::new()).unwrap();
    for i in 0..n {
        let t = 1_000_000_000 + i * 100_000_000;
        let header = |c, s| mcap::records::MessageHeader {
            channel_id: c,
            sequence: s,
            log_time: t,
            publish_time: t,
        };
        w.write_to_known_channel(
            &header(vehicle, 2 * i as u32),
            format!("{{\"speed_mps\": {i}}}").as_bytes(),
        )
        .unwrap();
        w.write_to_known_channel(&header(imu, 2 * i as u32 + 1), &[0, 1, 0, 0, 1, 2, 3, 4])
            .unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn lz4_unchunked_unindexed_and_broken_files() {
    let dir = tmp("formats");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    hand_written(
        &logs.join("lz4.mcap"),
        mcap::WriteOptions::new().compression(Some(mcap::Compression::Lz4)),
        50,
    );
    hand_written(
        &logs.join("flat.mcap"),
        mcap::WriteOptions::new().use_chunks(false),
        50,
    );
    // Unindexed: no summary, cut right after the last data record (no footer).
    hand_written(
        &logs.join("cut.mcap"),
        mcap::WriteOptions::new()
            .use_chunks(false)
            .emit_summary_records(false)
            .emit_summary_offsets(false),
        20,
    );
    let full = std::fs::read(logs.join("cut.mcap")).unwrap();
    let mut boundary = 8;
    let mut last_message_end = 8;
    while boundary + 9 <= full.len() {
        let len = u64::from_le_bytes(full[boundary + 1..boundary + 9].try_into().unwrap()) as usize;
        if full[boundary] == 0x05 {
            last_message_end = boundary + 9 + len;
        }
        boundary += 9 + len;
    }
    std::fs::write(logs.join("cut.mcap"), &full[..last_message_end]).unwrap();

    for (name, messages) in [("lz4.mcap", 100), ("flat.mcap", 100), ("cut.mcap", 40)] {
        let mut n = 0;
        let end = mcapio::scan(&logs.join(name), &mut |_| {
            n += 1;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(n, messages, "{name}");
        assert_eq!(end.complete, name != "cut.mcap", "{name}");
    }

    // Truncated in the middle of a record: read up to the record that was cut, which
    // the scan names (the file is unfinished, not complete).
    let lz4 = std::fs::read(logs.join("lz4.mcap")).unwrap();
    let bad = dir.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("truncated.mcap"), &lz4[..lz4.len() / 2]).unwrap();
    let end = mcapio::scan(&bad.join("truncated.mcap"), &mut |_| Ok(())).unwrap();
    assert!(!end.complete && end.cut.is_some_and(|at| at > 0), "{end:?}");
    let mut corrupt = lz4.clone();
    for b in &mut corrupt[200..260] {
        *b ^= 0x5a;
    }
    std::fs::write(bad.join("corrupt.mcap"), &corrupt).unwrap();
    std::fs::write(bad.join("not.mcap"), b"hello, world, not mcap at all").unwrap();
    let e = mcapio::scan(&bad.join("not.mcap"), &mut |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("not an MCAP file"), "{e}");
    // Messages outside chunks are covered by the data section's CRC (the mcap crate
    // writes it): `{"speed_mps": 7}` read as `{"speed_mpt": 7}` would be a null column.
    let mut flat = std::fs::read(logs.join("flat.mcap")).unwrap();
    let at = flat.windows(9).position(|w| w == b"speed_mps").unwrap() + 8;
    flat[at] = b't';
    std::fs::write(bad.join("flipped.mcap"), &flat).unwrap();
    let e = mcapio::scan(&bad.join("flipped.mcap"), &mut |_| Ok(())).unwrap_err();
    assert!(
        e.to_string()
            .contains("flipped.mcap: data section CRC mismatch"),
        "{e}"
    );

    // Ingest: JSON channels decode into frames, the CDR channel is only indexed; with
    // `on_error: skip` the broken files are counted, not fatal.
    for f in ["truncated.mcap", "corrupt.mcap"] {
        std::fs::copy(bad.join(f), logs.join(f)).unwrap();
    }
    let (frames, index) = (dir.join("frames"), dir.join("index"));
    std::fs::create_dir_all(&frames).unwrap();
    std::fs::create_dir_all(&index).unwrap();
    let mut cfg = IngestConfig {
        source: None,
        objects: None,
        format: None,
        on_error: None,
        max_unfinished: None,
        ..IngestConfig::default()
    };
    let fail = drivetrain_steps::ingest::ingest(
        &cfg,
        &LogSource::Local(logs.clone()),
        &frames,
        Some(&index),
        None,
    )
    .unwrap_err();
    assert!(format!("{fail:#}").contains("byte offset"), "{fail:#}");
    cfg.on_error = Some(OnError::Skip);
    std::fs::remove_dir_all(&frames).unwrap();
    std::fs::create_dir_all(&frames).unwrap();
    let v = drivetrain_steps::ingest::ingest(
        &cfg,
        &LogSource::Local(logs.clone()),
        &frames,
        Some(&index),
        None,
    )
    .unwrap();
    // The truncated file is read up to its cut (its one chunk is whole), the corrupt
    // one skipped.
    assert_eq!(v["frames"], 50 + 50 + 20 + 50, "{v}");
    assert_eq!(v["skipped"].as_array().unwrap().len(), 1, "{v}");
    // Read up to where it ends, and said so: a cut file is not a complete one.
    assert_eq!(
        v["unfinished"],
        serde_json::json!(["cut.mcap", "truncated.mcap"]),
        "{v}"
    );
    assert_eq!(v["channels"]["/imu"]["messages"], 170, "{v}");
    assert_eq!(v["channels"]["/imu"]["message_encoding"], "cdr");
    assert!(
        !frames.join("drive=corrupt").exists(),
        "a skipped file leaves no partition"
    );
}

#[test]
fn jsonl_and_tusimple_ingest() {
    let dir = tmp("jsonl");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let first = "{\"ts\": 0.0, \"speed_mps\": 10, \"accel_x\": -5, \"time_of_day\": \"night\"}";
    std::fs::write(
        logs.join("d1.jsonl"),
        format!("{first}\n\n{{\"ts\": 0.1, \"speed_mps\": 9.5}}\n"),
    )
    .unwrap();
    std::fs::write(
        logs.join("label_data_0313.json"),
        "{\"lanes\": [[-2, 632, 625], [719, 734, 748]], \"h_samples\": [240, 250, 260], \"raw_file\": \"clips/0313-1/6040/20.jpg\"}\n",
    )
    .unwrap();
    let (frames, lanes) = (dir.join("frames"), dir.join("lanes"));
    std::fs::create_dir_all(&frames).unwrap();
    std::fs::create_dir_all(&lanes).unwrap();
    let cfg = IngestConfig {
        source: None,
        objects: None,
        format: None,
        on_error: None,
        max_unfinished: None,
        ..IngestConfig::default()
    };
    let v = drivetrain_steps::ingest::ingest(
        &cfg,
        &LogSource::Local(logs.clone()),
        &frames,
        None,
        Some(&lanes),
    )
    .unwrap();
    assert_eq!(v["frames"], 2);
    assert_eq!(v["tusimple_rows"], 1);
    rt().block_on(async {
        let ctx = drivetrain_steps::table::session(&[
            ("f", &frames),
            ("l", &lanes.join("tusimple.parquet")),
        ])
        .await
        .unwrap();
        let rows = drivetrain_steps::table::rows(
            &ctx,
            "SELECT drive, ts, speed_mps, source_offset FROM f ORDER BY ts",
        )
        .await
        .unwrap();
        assert_eq!(rows[1]["speed_mps"], 9.5);
        assert_eq!(
            rows[1]["source_offset"],
            first.len() + 2,
            "the second frame's line starts after the blank line"
        );
        assert_eq!(rows[0]["drive"], "d1");
        let lanes = drivetrain_steps::table::rows(&ctx, "SELECT raw_file, lane_count FROM l")
            .await
            .unwrap();
        assert_eq!(lanes[0]["lane_count"], 2);
    });
    std::fs::write(logs.join("d2.jsonl"), "{\"ts\": 0.0}\nnot json\n").unwrap();
    let e = drivetrain_steps::ingest::ingest(
        &cfg,
        &LogSource::Local(logs.clone()),
        &frames,
        None,
        Some(&lanes),
    )
    .unwrap_err();
    assert!(
        format!("{e:#}").contains("d2.jsonl: line 2 (byte offset 12)"),
        "{e:#}"
    );
}

#[test]
fn ranks_train_the_same_model_as_one_process_and_resume_from_checkpoints() {
    let rows: Vec<serde_json::Map<String, serde_json::Value>> = (0..300)
        .map(|i| {
            let risky = i % 3 == 0;
            serde_json::json!({
                "accel_x": if risky { -6.0 - (i % 7) as f64 * 0.1 } else { 0.2 * ((i % 5) as f64 - 2.0) },
                "lane_confidence": 0.9 - (i % 11) as f64 * 0.01,
                "speed_mps": 10.0 + (i % 13) as f64,
                "time_of_day": if i % 4 == 0 { "night" } else { "day" },
                "label": risky,
            })
            .as_object()
            .unwrap()
            .clone()
        })
        .collect();
    let cfg = TrainConfig {
        epochs: Some(4),
        batch_size: Some(33),
        learning_rate: Some(0.2),
        seed: None,
    };
    let (single, _) = drivetrain_steps::train::train(&cfg, &rows, 0, 1, None, None).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let master = format!("127.0.0.1:{port}");
    let ranks: Vec<_> = (0..3u32)
        .map(|r| {
            let (rows, cfg, master) = (rows.clone(), cfg.clone(), master.clone());
            std::thread::spawn(move || {
                drivetrain_steps::train::train(&cfg, &rows, r, 3, Some(&master), None)
                    .unwrap()
                    .0
            })
        })
        .collect();
    let models: Vec<_> = ranks.into_iter().map(|t| t.join().unwrap()).collect();
    for m in &models {
        assert_eq!(
            m.weights, models[0].weights,
            "every rank ends with the same weights"
        );
        for (a, b) in m.weights.iter().zip(&single.weights) {
            assert!(
                (a - b).abs() < 1e-9,
                "3 ranks and 1 process agree: {a} vs {b}"
            );
        }
    }
    let metrics = drivetrain_steps::model::evaluate(&single, &rows);
    assert!(metrics["f1"].as_f64().unwrap() > 0.9, "{metrics}");

    // Checkpoints: 2 epochs, then a run asking for 4 resumes at epoch 2 and ends where
    // an uninterrupted 4-epoch run ends.
    let dir = tmp("ckpt");
    let two = TrainConfig {
        epochs: Some(2),
        ..cfg.clone()
    };
    drivetrain_steps::train::train(&two, &rows, 0, 1, None, Some(&dir)).unwrap();
    assert!(dir.join("epoch-2.json").exists());
    let (resumed, history) =
        drivetrain_steps::train::train(&cfg, &rows, 0, 1, None, Some(&dir)).unwrap();
    assert_eq!(history["resumed_from_epoch"], 2);
    assert_eq!(history["epochs"].as_array().unwrap().len(), 2);
    assert_eq!(resumed.weights, single.weights);
    // The web view's series: the epochs this attempt ran, loss and accuracy per epoch.
    let loss = history["series"]["loss"]["points"].as_array().unwrap();
    let accuracy = history["series"]["accuracy"]["points"].as_array().unwrap();
    assert_eq!((loss.len(), accuracy.len()), (2, 2));
    assert_eq!(loss[0][0], 3, "epochs count from 1: {history}");
    assert_eq!(loss[1][1], history["epochs"][1]["loss"]);
    let acc = accuracy[1][1].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc), "{history}");
}

/// Copies a frame table without the footer key that says it is sorted, with each batch's
/// rows reversed when `reverse`.
fn without_order_claim(from: &Path, to: &Path, reverse: bool) {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use datafusion::parquet::arrow::ArrowWriter;
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            without_order_claim(&path, &target, reverse);
            continue;
        }
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let mut writer = None;
        for batch in reader {
            let mut batch = batch.unwrap();
            if reverse {
                let rows: Vec<u32> = (0..batch.num_rows() as u32).rev().collect();
                batch = datafusion::arrow::compute::take_record_batch(
                    &batch,
                    &datafusion::arrow::array::UInt32Array::from(rows),
                )
                .unwrap();
            }
            writer
                .get_or_insert_with(|| {
                    ArrowWriter::try_new(
                        std::fs::File::create(&target).unwrap(),
                        batch.schema(),
                        None,
                    )
                    .unwrap()
                })
                .write(&batch)
                .unwrap();
        }
        writer.unwrap().close().unwrap();
    }
}

fn read_parquet(path: &Path) -> datafusion::arrow::record_batch::RecordBatch {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let schema = builder.schema().clone();
    let batches: Vec<_> = builder.build().unwrap().map(|b| b.unwrap()).collect();
    datafusion::arrow::compute::concat_batches(&schema, &batches).unwrap()
}

#[test]
fn a_sorted_frame_table_is_mined_without_a_sort_and_the_same() {
    let dir = tmp("mine-sorted");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    sim(&logs, 11, 3);
    let frames = dir.join("frames");
    std::fs::create_dir_all(&frames).unwrap();
    let cfg = IngestConfig {
        source: None,
        objects: None,
        format: None,
        on_error: None,
        max_unfinished: None,
        ..IngestConfig::default()
    };
    drivetrain_steps::ingest::ingest(&cfg, &LogSource::Local(logs.clone()), &frames, None, None)
        .unwrap();
    // Every drive's file says it is sorted, and each row group names its sort columns.
    let mut files = 0;
    for drive in std::fs::read_dir(&frames).unwrap() {
        let file = drive.unwrap().path().join("part-00000.parquet");
        let meta = datafusion::parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&std::fs::File::open(&file).unwrap())
            .unwrap();
        let kv = meta.file_metadata().key_value_metadata().unwrap();
        assert!(
            kv.iter()
                .any(|kv| kv.key == drivetrain_steps::ingest::SORTED_BY
                    && kv.value.as_deref() == Some("drive,ts")),
            "{file:?}: {kv:?}"
        );
        let cols = meta.row_group(0).sorting_columns().unwrap();
        assert_eq!(
            cols.iter().map(|c| c.column_idx).collect::<Vec<_>>(),
            [0, 1]
        );
        files += 1;
    }
    assert_eq!(files, 3);
    // The same rows undeclared (found in order by reading them), and reversed (sorted).
    let (plain, reversed) = (dir.join("plain"), dir.join("reversed"));
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::create_dir_all(&reversed).unwrap();
    without_order_claim(&frames, &plain, false);
    without_order_claim(&frames, &reversed, true);
    let rules: indexmap::IndexMap<String, String> = [
        ("hard_brake", "accel_x < -4"),
        (
            "sharp_steer",
            "abs(steering - lag(steering) OVER (PARTITION BY drive ORDER BY ts)) > 0.05",
        ),
        (
            "slowing",
            "speed_mps < lag(speed_mps, 5) OVER (PARTITION BY drive ORDER BY ts) - 1",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let mut outputs = Vec::new();
    let cap = drivetrain_steps::mine::WINDOW_KEYS_CAP;
    // (table, its order, cap, plan, cores, ordered streams)
    for (table, order, cap, plan, cores, streams) in [
        (&frames, "declared", cap, "ordered", 1, 1),
        // Cut into ranges of drives, one stream each, the parts joined in drive order.
        (&frames, "declared", cap, "ordered", 2, 2),
        (&frames, "declared", cap, "ordered", 3, 3),
        // No more ranges than drives start row groups.
        (&frames, "declared", cap, "ordered", 8, 3),
        (&plain, "checked", cap, "ordered", 2, 2),
        (&reversed, "unsorted", cap, "window keys", 2, 1),
        // More frames match a window rule than may be joined back: the table is sorted.
        (&reversed, "unsorted", 3, "sort", 4, 1),
    ] {
        let out = dir.join(format!("{order}-{plan}-{cores}"));
        std::fs::create_dir_all(&out).unwrap();
        let v = rt()
            .block_on(drivetrain_steps::mine::mine_with(
                &rules, table, &out, cap, cores,
            ))
            .unwrap();
        assert_eq!(
            (&v["input_order"], &v["plan"], &v["streams"]),
            (&order.into(), &plan.into(), &streams.into()),
            "{v}"
        );
        assert!(v["rules"]["sharp_steer"].as_u64().unwrap() > 0, "{v}");
        assert!(v["rules"]["slowing"].as_u64().unwrap() > 0, "{v}");
        let rows = read_parquet(&out.join("corner_cases.parquet"));
        assert_eq!(rows.num_rows() as u64, v["matched"].as_u64().unwrap());
        // Only the one output is left.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
        outputs.push((v["rules"].clone(), rows));
    }
    // The same frames, tagged the same, in the same (drive, ts) order, whichever path.
    for other in &outputs[1..] {
        assert_eq!(&outputs[0], other);
    }
}
