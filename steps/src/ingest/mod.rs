//! `ingest`: drive logs → Parquet frame tables, partitioned by drive.
//!
//! ## The frame table (`frames/drive=<drive>/part-NNNNN.parquet`)
//!
//! One row per `/vehicle` message, whatever the order of log times in the file (equal
//! times, chunks out of order, several writers). A frame's own fields are its message's:
//! a field the message lacks, or has as null, is null, never an earlier message's. The
//! other channels are sampled and held in log-time order (the latest message of each at
//! or before the frame's log time, messages sharing it included, as a whole: its missing
//! fields are null too), with that message's age in the channel's `*_age_s` column. A
//! file read in order is streamed; one that is not is read again and its messages of
//! those channels put in order (`reordered` in the values): in memory up to 64 MiB of
//! them, beyond it in sorted runs on disk merged back, so memory stays bounded whatever
//! the log's size. Only those channels
//! are parsed, and each field on its own: a value of the wrong type is null and counted
//! (`invalid_values`, per drive and field), a message that is not a JSON object is left
//! out and counted (`unreadable_messages`, per drive and topic):
//!
//! | column | type | from |
//! |---|---|---|
//! | `drive` | string | the file's name without extension |
//! | `ts` | float64 | seconds since the drive's earliest frame |
//! | `log_time_ns` | int64 | the message's log time |
//! | `speed_mps`, `accel_x`, `accel_y`, `yaw_rate`, `steering`, `brake_pressure`, `lat`, `lon` | float64 | `/vehicle` |
//! | `lateral_offset_m`, `lane_confidence` | float64 | `/lane` |
//! | `object_class` | string | `/objects` `class` |
//! | `object_distance_m`, `object_rel_speed_mps` | float64 | `/objects` |
//! | `weather`, `time_of_day` | string | `/context` |
//! | `gt_hard_brake`, `gt_cut_in`, `gt_pedestrian_close_call`, `gt_low_lane_confidence` | bool | `/ground_truth` (simulated drives) |
//! | `lane_age_s`, `objects_age_s`, `context_age_s`, `ground_truth_age_s` | float64, null | seconds since that channel's held message (null: none yet) |
//! | `source_file` | string | the log the frame came from |
//! | `source_offset` | int64 | byte offset of the `/vehicle` message record, or of the chunk holding it |
//! | `source_chunk_offset` | int64, null | offset of the message inside its decompressed chunk |
//!
//! Rows are in time order within each row group (the footer's `sorting_columns` say
//! `drive, ts`); a file whose row groups are in order too says so under the footer key
//! `drivetrain.sorted_by` (`drive,ts`), which lets mining skip its sort.
//!
//! Missing channels leave their columns null. JSON lines logs (`*.jsonl`) hold one frame
//! object per line with these column names (`source_offset` is the line's byte offset).
//!
//! ## The index (`index/messages.parquet`)
//!
//! Every message of every MCAP file read to the end (a skipped file leaves no rows),
//! whatever its profile (ros1, ros2, protobuf, json):
//! `file`, `topic`, `schema_name`, `schema_encoding`, `message_encoding`, `log_time_ns`,
//! `size`, `offset`, `chunk_offset` (those four unsigned 64-bit, as MCAP writes them: a
//! log time past 2^63 is indexed as it is), and `json` (the message text where the
//! encoding is JSON). Per-channel counts and time ranges go to `values.json`.
//!
//! ## TuSimple lane labels (`lanes/tusimple.parquet`)
//!
//! `label_data_*.json` files (one JSON object per line: `lanes`, `h_samples`,
//! `raw_file`) become rows `raw_file`, `h_samples` (list of int64), `lanes` (list of list
//! of int64, −2 where a lane is absent at a sample row), `lane_count`.
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::logsource::LogSource;

mod fields;
mod frames;
mod index;
mod mapped;
mod mcap;
mod spill;
mod tusimple;
use fields::Invalid;
pub use frames::{frame_schema, GT_COLUMNS, HELD_CHANNELS, SORTED_BY};
use frames::{DriveWriter, Held};
use index::{ChannelStats, IndexWriter};
use mapped::Mapping;
pub use mapped::{FramesConfig, HoldConfig};
use mcap::{ingest_mcap, Reading, Undecodable};
use tusimple::ingest_tusimple;

/// What one log gave.
struct FileResult {
    frames: u64,
    /// Its messages were not in log-time order (and were put in order).
    reordered: bool,
    /// Sorted runs written to disk to put it in order.
    spilled: u64,
    /// It ended without a footer (a recorder that stopped, a copy cut short): what it
    /// held was read, what it would have held is unknown.
    unfinished: bool,
    /// Cut inside a record at this offset (that record and a chunk's messages in it lost).
    cut: Option<u64>,
    /// Fields and messages the table could not take.
    invalid: Invalid,
    /// Messages of frame topics whose schema or payload could not be decoded.
    undecodable: Undecodable,
}

/// Reads every log of `source` and writes the tables; returns the values.
///
/// Nothing read is dropped without a count: files of no known format are listed under
/// `ignored`, logs without `/vehicle` messages under `without_frames` (they are still
/// indexed), MCAP files without a footer or cut short under `unfinished` (and
/// `unfinished_detail`: where, how many frames), logs skipped by `on_error: skip` under
/// `skipped` (and are absent from every table), fields and messages the table could not
/// take under `invalid_values` and `unreadable_messages`. Whatever of these a succeeded
/// stage has is also in `warnings`, which the engine shows beside its phase. Only a source
/// with no logs at all, or whose every log failed, or more unfinished logs than
/// `max_unfinished`, is an error.
pub fn ingest(
    cfg: &IngestConfig,
    source: &LogSource,
    frames: &Path,
    index: Option<&Path>,
    lanes: Option<&Path>,
) -> anyhow::Result<Value> {
    let files = match cfg.objects.as_deref().filter(|m| !m.is_empty()) {
        Some(manifest) => batch(source, manifest)?,
        None => source.list()?,
    };
    let format = cfg.format.clone().unwrap_or(LogFormat::Auto);
    let how = Reading {
        mapping: cfg.frames.as_ref().map(Mapping::checked).transpose()?,
        reorder_bytes: reorder_bytes(cfg)?,
    };
    let mapping = how.mapping.as_ref();
    let skip = matches!(cfg.on_error, Some(OnError::Skip));
    let mut index_writer = match index {
        Some(dir) => Some(IndexWriter::create(&dir.join("messages.parquet"))?),
        None => None,
    };
    let mut t = Tally {
        clock: mapping
            .as_ref()
            .map_or("/vehicle".to_owned(), |m| m.clock.clone()),
        ..Tally::default()
    };
    let mut drive_files: BTreeMap<String, String> = BTreeMap::new();
    let mut tusimple = Vec::new();
    for rel in &files {
        let name = rel.rsplit('/').next().unwrap_or(rel).to_owned();
        let Some(kind) = kind_of(&format, &name) else {
            t.ignored.push(rel.clone());
            continue;
        };
        t.logs += 1;
        if kind == "tusimple" {
            tusimple.push(source.fetch(rel)?);
            continue;
        }
        let drive = name
            .rsplit_once('.')
            .map(|(s, _)| s)
            .unwrap_or(&name)
            .to_owned();
        // One partition per drive: a second log of the same name would replace the first.
        if let Some(first) = drive_files.insert(drive.clone(), rel.clone()) {
            anyhow::bail!(
                "{first} and {rel} are both drive `{drive}`: a drive is named by its file, so one would replace the other; rename one"
            );
        }
        // A log that cannot be fetched is a log that cannot be read: `on_error` decides.
        let file = match source.fetch(rel) {
            Ok(f) => f,
            Err(e) if skip => {
                t.skip(rel, &e);
                continue;
            }
            Err(e) => return Err(e),
        };
        // Channel statistics and index rows count only the files read to the end. A
        // file that may be skipped is indexed into a part of its own, merged once it was
        // read; otherwise an error ends the stage and rows go straight to the index.
        let mut file_channels = BTreeMap::new();
        let mut file_index = match index {
            Some(dir) if skip => Some(IndexWriter::create(
                &dir.join(format!(".part-{}.parquet", drive_files.len())),
            )?),
            _ => None,
        };
        let result = match kind {
            "mcap" => ingest_mcap(
                &file.path,
                rel,
                &drive,
                frames,
                &how,
                file_index.as_mut().or(index_writer.as_mut()),
                &mut file_channels,
            ),
            _ => ingest_jsonl(&file.path, rel, &drive, frames),
        };
        let file_index = match file_index {
            Some(w) => Some(w.close()?),
            None => None,
        };
        match result {
            Ok(r) => {
                if let (Some(w), Some(part)) = (index_writer.as_mut(), &file_index) {
                    w.append(part)?;
                }
                let size = std::fs::metadata(&file.path).map(|m| m.len()).unwrap_or(0);
                t.read(rel, drive, r, file_channels, size, source.location(rel));
            }
            Err(e) if skip => {
                // A half-written partition of a skipped file is not part of the table.
                let _ = std::fs::remove_dir_all(frames.join(format!("drive={drive}")));
                t.skip(rel, &e);
            }
            Err(e) => return Err(e),
        }
        if let Some(part) = file_index {
            std::fs::remove_file(part)?;
        }
    }
    if let Some(w) = index_writer {
        w.close()?;
    }
    let mut lanes_rows = 0;
    if !tusimple.is_empty() {
        let dir = lanes.ok_or_else(|| {
            anyhow::anyhow!("TuSimple label files found: declare the `lanes` output")
        })?;
        let paths: Vec<PathBuf> = tusimple.iter().map(|f| f.path.clone()).collect();
        lanes_rows = ingest_tusimple(&paths, &dir.join("tusimple.parquet"))?;
    }
    t.check(cfg, source, mapping)?;
    Ok(t.into_values(lanes_rows))
}

/// `reorder_memory` in bytes (default [`spill::BUFFER_BYTES`]).
fn reorder_bytes(cfg: &IngestConfig) -> anyhow::Result<usize> {
    let Some(q) = &cfg.reorder_memory else {
        return Ok(spill::BUFFER_BYTES);
    };
    let bytes = drivetrain_engine::units::parse_quantity(q)
        .map_err(|e| anyhow::anyhow!("reorder_memory: {e}"))?
        .value;
    if bytes < 1024.0 {
        anyhow::bail!("reorder_memory: `{q}` is less than 1Ki");
    }
    Ok(bytes.min(usize::MAX as f64) as usize)
}

/// How a file is read, by `format` and its name; `None` for a file that is not a log.
fn kind_of(format: &LogFormat, name: &str) -> Option<&'static str> {
    Some(match (format, name.rsplit_once('.').map(|(_, e)| e)) {
        (LogFormat::Tusimple, _) => "tusimple",
        (LogFormat::Auto, Some("json")) if name.starts_with("label_data") => "tusimple",
        (LogFormat::Mcap, _) | (LogFormat::Auto, Some("mcap")) => "mcap",
        (LogFormat::Jsonl, _) | (LogFormat::Auto, Some("jsonl")) => "jsonl",
        _ => return None,
    })
}

/// What ingest found across the logs, for its values and its checks.
#[derive(Default)]
struct Tally {
    logs: usize,
    bytes: u64,
    channels: BTreeMap<String, ChannelStats>,
    /// Frames by drive.
    drives: BTreeMap<String, u64>,
    sources: Vec<String>,
    skipped: Vec<Value>,
    ignored: Vec<String>,
    without_frames: Vec<String>,
    reordered: Vec<String>,
    reorder_runs: u64,
    unfinished: Vec<String>,
    unfinished_detail: Vec<Value>,
    invalid_values: serde_json::Map<String, Value>,
    unreadable: serde_json::Map<String, Value>,
    invalid_total: u64,
    unreadable_total: u64,
    /// drive → topic → reason → messages.
    undecodable: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
    undecodable_total: u64,
    /// Undecodable messages of the frame clock topic.
    undecodable_clock: u64,
    /// The clock topic: `/vehicle`, or the mapping's.
    clock: String,
}

impl Tally {
    fn skip(&mut self, rel: &str, e: &anyhow::Error) {
        eprintln!("skipping {rel}: {e:#}");
        self.skipped
            .push(json!({"file": rel, "error": format!("{e:#}")}));
    }

    /// A log read to its end (or to where it was cut).
    fn read(
        &mut self,
        rel: &str,
        drive: String,
        r: FileResult,
        file_channels: BTreeMap<String, ChannelStats>,
        size: u64,
        location: String,
    ) {
        for (topic, s) in file_channels {
            let all: &mut ChannelStats = self.channels.entry(topic).or_default();
            if all.messages == 0 {
                all.first_ns = s.first_ns;
                all.encoding = s.encoding;
                all.schema = s.schema;
            }
            all.messages += s.messages;
            all.bytes += s.bytes;
            all.first_ns = all.first_ns.min(s.first_ns);
            all.last_ns = all.last_ns.max(s.last_ns);
        }
        if r.frames == 0 {
            self.without_frames.push(rel.to_owned());
        }
        if r.reordered {
            self.reordered.push(rel.to_owned());
        }
        self.reorder_runs += r.spilled;
        if r.unfinished {
            let how = match r.cut {
                Some(at) => {
                    format!("cut inside the record at byte offset {at}; the records before it read")
                }
                None => "no footer: it may have been cut short".to_owned(),
            };
            eprintln!("warning: {rel}: {how}");
            self.unfinished.push(rel.to_owned());
            self.unfinished_detail
                .push(json!({"file": rel, "frames": r.frames, "cut_at": r.cut, "why": how}));
        }
        if !r.invalid.is_empty() {
            self.invalid_values
                .insert(drive.clone(), json!(r.invalid.fields));
            self.unreadable
                .insert(drive.clone(), json!(r.invalid.messages));
            self.invalid_total += r.invalid.values();
            self.unreadable_total += r.invalid.messages.values().sum::<u64>();
        }
        for ((topic, reason), n) in r.undecodable {
            self.undecodable_total += n;
            if topic == self.clock {
                self.undecodable_clock += n;
            }
            *self
                .undecodable
                .entry(drive.clone())
                .or_default()
                .entry(topic)
                .or_default()
                .entry(reason)
                .or_default() += n;
        }
        self.bytes += size;
        self.sources.push(location);
        self.drives.insert(drive, r.frames);
    }

    /// Fails a stage that found no log, could read none, or found more unfinished ones
    /// than `max_unfinished` allows.
    fn check(
        &self,
        cfg: &IngestConfig,
        source: &LogSource,
        mapping: Option<&Mapping>,
    ) -> anyhow::Result<()> {
        let logs = self.logs;
        if logs == 0 {
            anyhow::bail!(
                "no drive logs in {} (looked for *.mcap, *.jsonl, label_data_*.json; {} other file(s))",
                source.describe(),
                self.ignored.len()
            );
        }
        if self.skipped.len() == logs {
            anyhow::bail!(
                "every one of the {logs} log(s) in {} could not be read: {}",
                source.describe(),
                self.skipped[0]["error"].as_str().unwrap_or_default()
            );
        }
        let max = cfg.max_undecodable.unwrap_or(0);
        if self.undecodable_clock > max {
            anyhow::bail!(
                "{} message(s) of the frame clock topic `{}` could not be decoded, more than max_undecodable {max}: {}",
                self.undecodable_clock,
                self.clock,
                self.undecodable_detail(&self.clock)
            );
        }
        if let Some(m) = mapping.filter(|_| self.skipped.len() < logs) {
            let missing: Vec<&str> = m
                .topics()
                .into_iter()
                .filter(|t| !self.channels.contains_key(*t))
                .collect();
            if !missing.is_empty() {
                anyhow::bail!(
                    "frames: topic(s) {} are in none of the {logs} log(s); the logs have: {}",
                    missing.join(", "),
                    self.channels.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        if let Some(max) = cfg.max_unfinished {
            if self.unfinished.len() as u64 > max {
                anyhow::bail!(
                    "{} log(s) unfinished, more than max_unfinished {max}: {}",
                    self.unfinished.len(),
                    self.unfinished_detail
                        .iter()
                        .map(|u| format!(
                            "{} ({})",
                            u["file"].as_str().unwrap_or_default(),
                            u["why"].as_str().unwrap_or_default()
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
            }
        }
        Ok(())
    }

    /// The first few drives and reasons of a topic's undecodable messages.
    fn undecodable_detail(&self, topic: &str) -> String {
        let mut out = Vec::new();
        for (drive, topics) in &self.undecodable {
            for (reason, n) in topics.get(topic).into_iter().flatten() {
                out.push(format!("{drive}: {n} × {reason}"));
            }
        }
        let more = if out.len() > 3 { "; …" } else { "" };
        out.truncate(3);
        out.join("; ") + more
    }

    /// The stage's values.
    fn into_values(self, lanes_rows: u64) -> Value {
        let frames_total: u64 = self.drives.values().sum();
        let warnings = warnings(
            &self.unfinished_detail,
            &self.skipped,
            self.invalid_total,
            self.unreadable_total,
        );
        let mut warnings = warnings;
        if self.undecodable_total > 0 {
            warnings.push(format!(
                "{} message(s) could not be decoded and were left out (`undecodable_messages` per drive, topic and reason)",
                self.undecodable_total
            ));
        }
        let channels: serde_json::Map<String, Value> = self
            .channels
            .into_iter()
            .map(|(topic, s)| {
                (
                    topic,
                    json!({
                        "messages": s.messages, "bytes": s.bytes,
                        "first_log_time_ns": s.first_ns, "last_log_time_ns": s.last_ns,
                        "message_encoding": s.encoding, "schema": s.schema,
                    }),
                )
            })
            .collect();
        json!({
            "files": self.logs,
            "bytes": self.bytes,
            "frames": frames_total,
            "drives": self.drives,
            "sources": self.sources,
            "channels": channels,
            "tusimple_rows": lanes_rows,
            "skipped": self.skipped,
            "skipped_files": self.skipped.len(),
            "ignored": self.ignored,
            "ignored_files": self.ignored.len(),
            "without_frames": self.without_frames,
            "files_without_frames": self.without_frames.len(),
            "reordered": self.reordered,
            "reorder_runs": self.reorder_runs,
            "unfinished": self.unfinished,
            "unfinished_files": self.unfinished.len(),
            "unfinished_detail": self.unfinished_detail,
            "invalid_values": self.invalid_values,
            "invalid_values_total": self.invalid_total,
            "unreadable_messages": self.unreadable,
            "unreadable_messages_total": self.unreadable_total,
            "undecodable_messages": self.undecodable,
            "undecodable_messages_total": self.undecodable_total,
            "warnings": warnings,
        })
    }
}

/// The keys of [`Tally::into_values`]: what `ingest` reports.
const VALUES: &[&str] = &[
    "files",
    "bytes",
    "frames",
    "drives",
    "sources",
    "channels",
    "tusimple_rows",
    "skipped",
    "skipped_files",
    "ignored",
    "ignored_files",
    "without_frames",
    "files_without_frames",
    "reordered",
    "reorder_runs",
    "unfinished",
    "unfinished_files",
    "unfinished_detail",
    "invalid_values",
    "invalid_values_total",
    "unreadable_messages",
    "unreadable_messages_total",
    "undecodable_messages",
    "undecodable_messages_total",
    "warnings",
];

/// What a stage that succeeded must still say: the engine shows these with its phase
/// (`run`, `status`, the web view), so partial results are never a plain success.
fn warnings(unfinished: &[Value], skipped: &[Value], invalid: u64, unreadable: u64) -> Vec<String> {
    let mut out = Vec::new();
    let list = |items: &[Value]| {
        items
            .iter()
            .take(3)
            .map(|u| u["file"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join(", ")
            + if items.len() > 3 { ", …" } else { "" }
    };
    if !unfinished.is_empty() {
        out.push(format!(
            "{} log(s) unfinished, read up to where they end: {} (fail on them with `max_unfinished: 0`)",
            unfinished.len(),
            list(unfinished)
        ));
    }
    if !skipped.is_empty() {
        out.push(format!(
            "{} log(s) skipped as unreadable: {}",
            skipped.len(),
            list(skipped)
        ));
    }
    if invalid > 0 {
        out.push(format!(
            "{invalid} field value(s) of the wrong type left null (`invalid_values` per drive and field)"
        ));
    }
    if unreadable > 0 {
        out.push(format!(
            "{unreadable} message(s) that are not JSON objects left out (`unreadable_messages` per drive and topic)"
        ));
    }
    out
}

/// The two fields of a JSON-lines frame that say when it is (serde skips the rest).
#[derive(serde::Deserialize)]
struct LineTime {
    #[serde(default)]
    log_time_ns: Option<Value>,
    #[serde(default)]
    ts: Option<Value>,
}

impl LineTime {
    /// `log_time_ns` (an integer of ns), else `ts` (seconds, not negative).
    fn ns(&self) -> Option<u64> {
        self.log_time_ns
            .as_ref()
            .and_then(Value::as_u64)
            .or_else(|| {
                self.ts
                    .as_ref()
                    .and_then(Value::as_f64)
                    .filter(|t| t.is_finite() && *t >= 0.0)
                    .map(|t| (t * 1e9).round() as u64)
            })
    }
}

/// Calls `f` with the line number, byte offset, log time and parsed value of every
/// non-empty line of a JSON-lines log; a line that is not JSON or has no time is an
/// error naming it.
fn for_each_line<T: serde::de::DeserializeOwned>(
    file: &Path,
    rel: &str,
    time: impl Fn(&T) -> Option<u64>,
    mut f: impl FnMut(u64, u64, T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut offset = 0u64;
    for (n, line) in std::io::BufReader::new(std::fs::File::open(file)?)
        .lines()
        .enumerate()
    {
        let line = line?;
        let len = line.len() as u64 + 1;
        if !line.trim().is_empty() {
            let at = || format!("{rel}: line {} (byte offset {offset})", n + 1);
            let v: T = serde_json::from_str(&line)
                .map_err(|e| anyhow::anyhow!("{} is not JSON: {e}", at()))?;
            let t = time(&v).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} has no `log_time_ns` (an integer of ns) nor `ts` (seconds, not negative)",
                    at()
                )
            })?;
            f(offset, t, v)?;
        }
        offset += len;
    }
    Ok(())
}

/// A JSON-lines log: one frame per line, in any order. A first pass reads only the
/// times, to find the earliest, so `ts` is measured from it whatever the order of the
/// lines (the writer puts each row group in order and says whether the file is).
fn ingest_jsonl(file: &Path, rel: &str, drive: &str, frames: &Path) -> anyhow::Result<FileResult> {
    let mut origin: Option<u64> = None;
    for_each_line(file, rel, LineTime::ns, |_, t, _| {
        origin = Some(origin.map_or(t, |o| o.min(t)));
        Ok(())
    })?;
    let mut writer = DriveWriter::create(frames, drive, rel)?.with_origin(origin.unwrap_or(0));
    let mut invalid = Invalid::default();
    let time = |v: &Value| {
        LineTime {
            log_time_ns: v.get("log_time_ns").cloned(),
            ts: v.get("ts").cloned(),
        }
        .ns()
    };
    for_each_line(file, rel, time, |offset, t, v: Value| {
        let mut held = Held::default();
        held.take_row(&v, &mut invalid);
        writer.push(t, offset, None, &held)
    })?;
    Ok(FileResult {
        frames: writer.finish()?,
        reordered: false,
        spilled: 0,
        unfinished: false,
        cut: None,
        invalid,
        undecodable: Undecodable::new(),
    })
}

/// The logs of a trigger's batch, as paths under `source`: every object the manifest
/// lists must be there (a batch is never read in part).
fn batch(source: &LogSource, manifest: &str) -> anyhow::Result<Vec<String>> {
    let text = match manifest.rsplit_once('/') {
        Some((dir, name)) if manifest.contains("://") && !manifest.starts_with("file://") => {
            let scratch = std::env::temp_dir();
            let fetched = LogSource::open(dir, &scratch, None)?.fetch(name)?;
            std::fs::read_to_string(&fetched.path)?
        }
        _ => std::fs::read_to_string(manifest.strip_prefix("file://").unwrap_or(manifest))
            .map_err(|e| anyhow::anyhow!("the batch's manifest {manifest}: {e}"))?,
    };
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("the batch's manifest {manifest}: {e}"))?;
    let by_location: BTreeMap<String, String> = source
        .list()?
        .into_iter()
        .map(|rel| (source.location(&rel), rel))
        .collect();
    let mut out = Vec::new();
    for o in v["objects"].as_array().into_iter().flatten() {
        let url = o["url"].as_str().unwrap_or_default();
        let here = url.strip_prefix("file://").unwrap_or(url);
        match by_location.get(here) {
            Some(rel) => out.push(rel.clone()),
            None => anyhow::bail!(
                "{url} of the batch ({manifest}) is not under {}: it was moved or deleted after it landed, or the trigger's `source` is not this stage's",
                source.describe()
            ),
        }
    }
    out.sort();
    Ok(out)
}

// The `ingest` step: its `with:` block, registration and what it does with its context.

/// `ingest`: logs to frame tables.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// A store URL or directory of drive logs; default: the `logs` input.
    #[serde(default)]
    pub source: Option<String>,
    /// A trigger's batch (`{{ params.manifest }}` set from `{{ trigger.manifest }}`):
    /// the JSON file listing the objects a triggered run is for. Only they are read, and
    /// one that is not under `source` fails the stage. Empty or unset: every log.
    #[serde(default)]
    pub objects: Option<String>,
    /// The log format. Default `auto` (by extension: `.mcap`, `.jsonl`,
    /// `label_data_*.json`).
    #[serde(default)]
    pub format: Option<LogFormat>,
    /// A log that cannot be read: `fail` the stage (default) or `skip` it, counted in
    /// `values.json`.
    #[serde(default)]
    pub on_error: Option<OnError>,
    /// The most logs that may end unfinished (cut short, or never closed by their
    /// writer) before the stage fails; they are read up to where they end and listed
    /// under `unfinished` either way. Default: no bound.
    #[serde(default)]
    pub max_unfinished: Option<u64>,
    /// How frames are made from the logs' topics: the clock topic, and where each column
    /// comes from. Default: the JSON layout above (`/vehicle` and its channels).
    #[serde(default)]
    pub frames: Option<FramesConfig>,
    /// The most messages of the frame clock topic that may fail to decode (a schema that
    /// cannot be read, a payload that does not fit it) before the stage fails. Default 0.
    /// Those of other topics are counted and warned of, whatever their number.
    #[serde(default)]
    pub max_undecodable: Option<u64>,
    /// The memory a log read out of time order may take to be put in order (`64Mi`, the
    /// default); past it, sorted runs go to disk beside the frames and are merged back.
    #[serde(default)]
    pub reorder_memory: Option<String>,
}

/// What `ingest` does with a log it cannot read.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    Fail,
    Skip,
}

/// Drive log formats `ingest` reads.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Auto,
    Mcap,
    Jsonl,
    Tusimple,
}

/// The step, as the catalog lists it.
pub(crate) fn step() -> Box<dyn drivetrain_engine::step::Step> {
    crate::builtin::builtin::<IngestConfig>(
        "ingest",
        "drive logs (MCAP, JSON lines, TuSimple labels) to Parquet frame tables",
        &[("logs", false)],
        &["frames", "index", "lanes"],
        |c, cx| Box::pin(run_step(c, cx)),
    )
    .reporting(VALUES)
    .checked(|c: &IngestConfig| {
        let mut faults = match &c.frames {
            Some(f) => Mapping::new(f).err().unwrap_or_default(),
            None => Vec::new(),
        };
        if let Err(e) = reorder_bytes(c) {
            faults.push(("reorder_memory".into(), e.to_string()));
        }
        faults
    })
    .boxed()
}

async fn run_step(
    c: IngestConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    // Fetched logs go beside the attempt's values, in its own directory: nothing of
    // them outlives the attempt's work directory, even when the stage is killed.
    let scratch = cx
        .values
        .parent()
        .map(|d| d.join("fetched"))
        .unwrap_or_else(|| std::path::PathBuf::from("fetched"));
    let source = match (&c.source, cx.inputs.get("logs")) {
        (Some(s), _) => crate::logsource::LogSource::open(s, &scratch, cx.pipeline_dir.as_deref())?,
        (None, Some(dir)) => crate::logsource::LogSource::Local(dir.clone()),
        (None, None) => anyhow::bail!("no logs: connect the `logs` input or set `source`"),
    };
    let frames = cx.output("frames")?.clone();
    let index = cx.outputs.get("index").cloned();
    let lanes = cx.outputs.get("lanes").cloned();
    let v = tokio::task::block_in_place(|| {
        ingest(&c, &source, &frames, index.as_deref(), lanes.as_deref())
    })?;
    println!(
        "ingested {} file(s), {} frames from {} drive(s)",
        v["files"],
        v["frames"],
        v["drives"].as_object().map(|d| d.len()).unwrap_or(0)
    );
    Ok(v)
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    #[test]
    fn a_batch_reads_exactly_its_objects_and_refuses_a_missing_one() {
        let dir = std::env::temp_dir().join(format!("dt-batch-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("veh1")).unwrap();
        for f in ["veh1/a.mcap", "veh1/b.mcap", "c.mcap"] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        let root = std::fs::canonicalize(&dir).unwrap();
        let manifest = dir.join("objects.json");
        let write = |keys: &[&str]| {
            let objects: Vec<Value> = keys
                .iter()
                .map(|k| json!({"url": format!("file://{}/{k}", root.display()), "etag": "e"}))
                .collect();
            std::fs::write(&manifest, json!({"objects": objects}).to_string()).unwrap();
        };
        let source = LogSource::Local(root.clone());
        write(&["c.mcap", "veh1/b.mcap"]);
        let m = manifest.display().to_string();
        assert_eq!(batch(&source, &m).unwrap(), ["c.mcap", "veh1/b.mcap"]);
        write(&["veh1/gone.mcap"]);
        let e = batch(&source, &m).unwrap_err().to_string();
        assert!(
            e.contains("veh1/gone.mcap of the batch") && e.contains("is not under"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
