//! Damaged drive logs, made from files nobody here wrote (the Python `mcap` writer, with
//! zstd, lz4 and uncompressed chunks, its default CRCs and summary): every single-bit
//! flip and every truncation of them, read by the MCAP scanner `ingest` uses.
//!
//! The promise: no silent loss and no crash. A flipped file reads either exactly as the
//! original (the flip hit bytes nothing reads: an index, a timestamp range) or fails
//! with an error naming the file and the byte offset. A truncated file reads a prefix
//! of the original's messages and says it is unfinished (or it is an error). Before
//! round 2, a chunk opcode turned into a Footer's dropped the rest of the drive, an
//! unknown opcode skipped a chunk, and a corrupt lz4 size aborted the process.

use crate::common;
use common::{python_mcap, tmp};

use std::path::Path;

use drivetrain_steps::mcapio::{scan, ScanEnd, ScanError};
use serde_json::{json, Value};

/// Topic, log time and bytes of every message, in file order.
type Messages = Vec<(String, u64, Vec<u8>)>;

fn read(path: &Path) -> Result<(Messages, ScanEnd), ScanError> {
    let mut out = Vec::new();
    let end = scan(path, &mut |m| {
        out.push((m.channel.topic.clone(), m.log_time, m.data.to_vec()));
        Ok(())
    })?;
    Ok((out, end))
}

/// Ten seconds of a drive at 10 Hz on two channels, in chunks of a few messages.
fn drive(path: &Path, compression: &str) {
    let mut messages = Vec::new();
    for i in 0..100u64 {
        let t = i * 100_000_000;
        messages.push(json!({"topic": "/vehicle", "encoding": "json", "log_time": t,
            "data": json!({"speed_mps": 10.0 + i as f64 / 10.0, "accel_x": -(i as f64) / 50.0}).to_string()}));
        if i % 2 == 0 {
            messages.push(json!({"topic": "/lane", "encoding": "json", "log_time": t,
                "data": json!({"lane_confidence": 0.5 + i as f64 / 400.0}).to_string()}));
        }
    }
    python_mcap(path, "", 600, compression, &messages);
}

/// The offsets of the records of opcode `op` in the data section.
fn records(bytes: &[u8], op: u8) -> Vec<usize> {
    let (mut at, mut out) = (8, Vec::new());
    while bytes[at] != 0x0F {
        if bytes[at] == op {
            out.push(at);
        }
        at += 9 + u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) as usize;
    }
    out
}

fn first_record(bytes: &[u8], op: u8) -> usize {
    records(bytes, op)[0]
}

fn named(e: &ScanError, file: &Path) -> bool {
    let text = e.to_string();
    text.contains(&file.display().to_string()) && text.contains("at byte offset")
}

#[test]
fn every_bit_flip_is_an_error_or_changes_nothing() {
    let dir = tmp("flips");
    let mut report = Vec::new();
    for compression in ["ZSTD", "LZ4", "NONE"] {
        let file = dir.join(format!("{compression}.mcap"));
        drive(&file, compression);
        let original = std::fs::read(&file).unwrap();
        let (messages, end) = read(&file).unwrap();
        assert!(
            end.complete && messages.len() == 150,
            "{compression}: {end:?}"
        );
        let flipped = dir.join(format!("{compression}-flipped.mcap"));
        let (mut errors, mut unchanged, mut silent) = (0, 0, Vec::new());
        // Every byte after the leading magic, one bit each (which bit moves along).
        for at in 8..original.len() {
            let mut bytes = original.clone();
            bytes[at] ^= 1 << (at % 8);
            std::fs::write(&flipped, &bytes).unwrap();
            match read(&flipped) {
                Err(e) if named(&e, &flipped) => errors += 1,
                Err(e) => silent.push(format!("byte {at}: an error without file and offset: {e}")),
                Ok((m, end)) if m == messages && end.complete => unchanged += 1,
                Ok((m, end)) => silent.push(format!(
                    "byte {at}: {} of {} messages, complete {}",
                    m.len(),
                    messages.len(),
                    end.complete
                )),
            }
        }
        assert!(
            errors > original.len() / 4,
            "{compression}: {errors} errors"
        );
        report.push(
            json!({"compression": compression, "bytes": original.len(), "errors": errors,
                           "unchanged": unchanged, "silent": silent.len()}),
        );
        assert!(
            silent.is_empty(),
            "{compression}: {:#?}",
            &silent[..silent.len().min(10)]
        );
    }
    eprintln!("{}", Value::from(report));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_truncation_reads_a_prefix_and_says_it_is_unfinished() {
    let dir = tmp("truncations");
    for compression in ["ZSTD", "LZ4", "NONE"] {
        let file = dir.join(format!("{compression}.mcap"));
        drive(&file, compression);
        let original = std::fs::read(&file).unwrap();
        let (messages, _) = read(&file).unwrap();
        let cut = dir.join(format!("{compression}-cut.mcap"));
        let mut recovered_mid_file = 0;
        for len in 0..original.len() {
            std::fs::write(&cut, &original[..len]).unwrap();
            match read(&cut) {
                Err(e) => assert!(named(&e, &cut), "{compression} cut at {len}: {e}"),
                Ok((m, end)) => {
                    assert!(
                        messages.starts_with(&m),
                        "{compression} cut at {len}: not a prefix"
                    );
                    if m.len() < messages.len() {
                        assert!(
                            !end.complete,
                            "{compression} cut at {len}: lost messages, said complete"
                        );
                        if !m.is_empty() {
                            recovered_mid_file += 1;
                        }
                    }
                }
            }
        }
        // A file cut inside a chunk keeps the chunks before it (as `mcap recover` does).
        assert!(
            recovered_mid_file > original.len() / 2,
            "{compression}: {recovered_mid_file}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a corrupt lz4 (or zstd) chunk size was an allocation of that size, and
/// the process aborted (`memory allocation of 140737488356944 bytes failed`), taking the
/// good logs beside it; with `on_error: skip` it is now a skipped log.
#[test]
fn a_corrupt_chunk_size_is_an_error_not_an_abort() {
    let dir = tmp("chunk-size");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    for compression in ["LZ4", "ZSTD"] {
        let file = logs.join(format!("bad-{compression}.mcap"));
        drive(&file, compression);
        let mut bytes = std::fs::read(&file).unwrap();
        let chunk = first_record(&bytes, 0x06);
        // Chunk body: start time, end time, then the uncompressed size.
        bytes[chunk + 25..chunk + 33].copy_from_slice(&140_737_488_356_944u64.to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();
        let e = read(&file).unwrap_err();
        assert!(named(&e, &file) && e.offset == chunk as u64, "{e}");
        // A size a little off is as wrong: the chunk is exactly as long as it says.
        bytes[chunk + 25..chunk + 33].copy_from_slice(&600u64.to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();
        let e = read(&file).unwrap_err();
        assert!(e.to_string().contains("it says it holds 600 bytes"), "{e}");
    }
    drive(&logs.join("good.mcap"), "ZSTD");
    let frames = dir.join("frames");
    std::fs::create_dir_all(&frames).unwrap();
    let cfg = drivetrain_steps::ingest::IngestConfig {
        on_error: Some(drivetrain_steps::ingest::OnError::Skip),
        ..Default::default()
    };
    let v = drivetrain_steps::ingest::ingest(
        &cfg,
        &drivetrain_steps::logsource::LogSource::Local(logs.clone()),
        &frames,
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        (v["frames"].as_u64(), v["skipped_files"].as_u64()),
        (Some(100), Some(2)),
        "{v}"
    );
    assert_eq!(v["warnings"].as_array().unwrap().len(), 1, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a chunk's opcode with one bit flipped (0x06 → 0x02) was taken for the
/// Footer, and the rest of the drive silently dropped; 0x06 → 0x86 (a private record)
/// skipped the chunk. Both are errors now: a Footer only stands at the end, and the
/// summary's message count must match.
#[test]
fn a_flipped_chunk_opcode_is_corruption_not_the_end_of_the_drive() {
    let dir = tmp("opcode");
    let file = dir.join("drive.mcap");
    drive(&file, "ZSTD");
    let original = std::fs::read(&file).unwrap();
    let chunks = records(&original, 0x06);
    assert!(chunks.len() > 3, "{chunks:?}");
    // The last chunk skipped as a private record: only the summary's count tells.
    let last = *chunks.last().unwrap();
    for (chunk, op, why) in [
        (
            chunks[1],
            0x02,
            "a Footer record where the data section goes on",
        ),
        (last, 0x86, "the summary's Statistics say 150 messages"),
        (chunks[1], 0x0B, "cannot stand in the data section"),
    ] {
        let mut bytes = original.clone();
        bytes[chunk] = op;
        std::fs::write(&file, &bytes).unwrap();
        let e = read(&file).unwrap_err();
        assert!(
            named(&e, &file) && e.to_string().contains(why),
            "0x{op:02x}: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
