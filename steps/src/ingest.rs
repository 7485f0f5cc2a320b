//! `ingest`: drive logs → Parquet frame tables, partitioned by drive.
//!
//! ## The frame table (`frames/drive=<drive>/part-NNNNN.parquet`)
//!
//! One row per `/vehicle` message, whatever the order of log times in the file (equal
//! times, chunks out of order, several writers); the other channels are sampled and held
//! in log-time order (the latest message at or before the frame's log time, messages
//! sharing it included). A file read in order is streamed; one that is not is read again
//! and its JSON messages put in order in memory (`reordered` in the values):
//!
//! | column | type | from |
//! |---|---|---|
//! | `drive` | string | the file's name without extension |
//! | `ts` | float64 | seconds since the drive's first frame |
//! | `log_time_ns` | int64 | the message's log time |
//! | `speed_mps`, `accel_x`, `accel_y`, `yaw_rate`, `steering`, `brake_pressure`, `lat`, `lon` | float64 | `/vehicle` |
//! | `lateral_offset_m`, `lane_confidence` | float64 | `/lane` |
//! | `object_class` | string | `/objects` `class` |
//! | `object_distance_m`, `object_rel_speed_mps` | float64 | `/objects` |
//! | `weather`, `time_of_day` | string | `/context` |
//! | `gt_hard_brake`, `gt_cut_in`, `gt_pedestrian_close_call`, `gt_low_lane_confidence` | bool | `/ground_truth` (simulated drives) |
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
//! `size`, `offset`, `chunk_offset`, and `json` (the message text where the encoding is
//! JSON). Per-channel counts and time ranges go to `values.json`.
//!
//! ## TuSimple lane labels (`lanes/tusimple.parquet`)
//!
//! `label_data_*.json` files (one JSON object per line: `lanes`, `h_samples`,
//! `raw_file`) become rows `raw_file`, `h_samples` (list of int64), `lanes` (list of list
//! of int64, −2 where a lane is absent at a sample row), `lane_count`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::metadata::{KeyValue, SortingColumn};
use datafusion::parquet::file::properties::WriterProperties;
use serde_json::{json, Value};

use crate::logsource::LogSource;
use crate::mcapio::{self, Message};
use crate::{IngestConfig, LogFormat, OnError};

/// Rows buffered per drive before a row group is written: bounds memory.
const ROWS_PER_BATCH: usize = 65_536;

const F64_COLUMNS: &[&str] = &[
    "speed_mps",
    "accel_x",
    "accel_y",
    "yaw_rate",
    "steering",
    "brake_pressure",
    "lat",
    "lon",
    "lateral_offset_m",
    "lane_confidence",
    "object_distance_m",
    "object_rel_speed_mps",
];
const STR_COLUMNS: &[&str] = &["object_class", "weather", "time_of_day"];
/// The simulator's ground truth, one column per injected event kind.
pub const GT_COLUMNS: &[&str] = &[
    "gt_hard_brake",
    "gt_cut_in",
    "gt_pedestrian_close_call",
    "gt_low_lane_confidence",
];

/// The schema of the frame table.
pub fn frame_schema() -> SchemaRef {
    let mut fields = vec![
        Field::new("drive", DataType::Utf8, false),
        Field::new("ts", DataType::Float64, false),
        Field::new("log_time_ns", DataType::Int64, false),
    ];
    fields.extend(
        F64_COLUMNS
            .iter()
            .map(|c| Field::new(*c, DataType::Float64, true)),
    );
    fields.extend(
        STR_COLUMNS
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, true)),
    );
    fields.extend(
        GT_COLUMNS
            .iter()
            .map(|c| Field::new(*c, DataType::Boolean, true)),
    );
    fields.push(Field::new("source_file", DataType::Utf8, false));
    fields.push(Field::new("source_offset", DataType::Int64, false));
    fields.push(Field::new("source_chunk_offset", DataType::Int64, true));
    Arc::new(Schema::new(fields))
}

/// The latest value of every column: what a frame is made of. Fixed slots in column
/// order (cloned once per frame, so strings are shared, not copied).
#[derive(Default, Clone)]
struct Held {
    f64s: [Option<f64>; F64_COLUMNS.len()],
    strs: [Option<Arc<str>>; STR_COLUMNS.len()],
    gts: [Option<bool>; GT_COLUMNS.len()],
}

/// The fields of one channel message drivetrain reads: every channel's, in one struct
/// (serde skips the rest without building them).
#[derive(Default, serde::Deserialize)]
struct Msg<'a> {
    speed_mps: Option<f64>,
    accel_x: Option<f64>,
    accel_y: Option<f64>,
    yaw_rate: Option<f64>,
    steering: Option<f64>,
    brake_pressure: Option<f64>,
    lat: Option<f64>,
    lon: Option<f64>,
    lateral_offset_m: Option<f64>,
    lane_confidence: Option<f64>,
    object_distance_m: Option<f64>,
    object_rel_speed_mps: Option<f64>,
    distance_m: Option<f64>,
    rel_speed_mps: Option<f64>,
    #[serde(borrow)]
    class: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    weather: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    time_of_day: Option<std::borrow::Cow<'a, str>>,
    hard_brake: Option<bool>,
    cut_in: Option<bool>,
    pedestrian_close_call: Option<bool>,
    low_lane_confidence: Option<bool>,
}

fn set<T>(slot: &mut Option<T>, v: Option<T>) {
    if v.is_some() {
        *slot = v;
    }
}

fn shared(s: Option<std::borrow::Cow<'_, str>>) -> Option<Arc<str>> {
    s.map(|c| Arc::from(c.as_ref()))
}

impl Held {
    /// Whether messages of `topic` make frames.
    fn reads(topic: &str) -> bool {
        matches!(
            topic,
            "/vehicle" | "/lane" | "/objects" | "/context" | "/ground_truth"
        )
    }

    /// Takes the fields of one message of `topic`.
    fn take(&mut self, topic: &str, m: Msg<'_>) {
        match topic {
            "/vehicle" | "/lane" => {
                let values = [
                    m.speed_mps,
                    m.accel_x,
                    m.accel_y,
                    m.yaw_rate,
                    m.steering,
                    m.brake_pressure,
                    m.lat,
                    m.lon,
                    m.lateral_offset_m,
                    m.lane_confidence,
                    m.object_distance_m,
                    m.object_rel_speed_mps,
                ];
                for (slot, v) in self.f64s.iter_mut().zip(values) {
                    set(slot, v);
                }
            }
            "/objects" => {
                set(&mut self.f64s[10], m.distance_m);
                set(&mut self.f64s[11], m.rel_speed_mps);
                set(&mut self.strs[0], shared(m.class));
            }
            "/context" => {
                set(&mut self.strs[1], shared(m.weather));
                set(&mut self.strs[2], shared(m.time_of_day));
            }
            "/ground_truth" => {
                let values = [
                    m.hard_brake,
                    m.cut_in,
                    m.pedestrian_close_call,
                    m.low_lane_confidence,
                ];
                for (slot, v) in self.gts.iter_mut().zip(values) {
                    set(slot, v);
                }
            }
            _ => {}
        }
    }

    /// Takes every value `other` has.
    fn overlay(&mut self, other: &Held) {
        for (slot, v) in self.f64s.iter_mut().zip(&other.f64s) {
            set(slot, *v);
        }
        for (slot, v) in self.strs.iter_mut().zip(&other.strs) {
            set(slot, v.clone());
        }
        for (slot, v) in self.gts.iter_mut().zip(&other.gts) {
            set(slot, *v);
        }
    }

    /// Takes every known column of a JSON-lines frame.
    fn take_row(&mut self, v: &Value) {
        for (slot, c) in self.f64s.iter_mut().zip(F64_COLUMNS) {
            set(slot, v.get(*c).and_then(Value::as_f64));
        }
        for (slot, c) in self.strs.iter_mut().zip(STR_COLUMNS) {
            set(slot, v.get(*c).and_then(Value::as_str).map(Arc::from));
        }
        for (slot, c) in self.gts.iter_mut().zip(GT_COLUMNS) {
            set(slot, v.get(*c).and_then(Value::as_bool));
        }
    }
}

/// A frame waiting for the messages that share its log time.
struct Pending {
    log_time: u64,
    offset: u64,
    chunk_offset: Option<u64>,
    /// The frame's own `/vehicle` fields: two frames at one log time keep their own.
    own: Held,
}

/// Turns JSON channel messages, fed in log-time order, into frames: one per `/vehicle`
/// message, each holding the latest value of every column at its log time (messages
/// sharing that log time included, whatever their order in the file).
struct FrameBuilder {
    writer: DriveWriter,
    held: Held,
    /// The `/vehicle` messages at the latest log time, waiting for the rest of it.
    pending: Vec<Pending>,
}

impl FrameBuilder {
    fn new(writer: DriveWriter) -> FrameBuilder {
        FrameBuilder {
            writer,
            held: Held::default(),
            pending: Vec::new(),
        }
    }

    /// Takes one message; `log_time` is never before the last one's.
    fn message(
        &mut self,
        topic: &str,
        log_time: u64,
        offset: u64,
        chunk_offset: Option<u64>,
        data: &[u8],
    ) -> anyhow::Result<()> {
        // The frames of an earlier log time are complete once a later one arrives.
        if self.pending.first().is_some_and(|p| log_time > p.log_time) {
            self.flush_pending()?;
        }
        let msg: Msg<'_> = serde_json::from_slice(data).map_err(|e| {
            anyhow::anyhow!(
                "message on {topic} at log time {log_time} is not a JSON object of the known fields: {e}"
            )
        })?;
        if topic != "/vehicle" {
            self.held.take(topic, msg);
            return Ok(());
        }
        let mut own = Held::default();
        own.take(topic, msg);
        self.held.overlay(&own);
        self.pending.push(Pending {
            log_time,
            offset,
            chunk_offset,
            own,
        });
        Ok(())
    }

    fn flush_pending(&mut self) -> anyhow::Result<()> {
        for p in std::mem::take(&mut self.pending) {
            let mut held = self.held.clone();
            held.overlay(&p.own);
            self.writer
                .push(p.log_time, p.offset, p.chunk_offset, &held)?;
        }
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<u64> {
        self.flush_pending()?;
        self.writer.finish()
    }
}

/// The footer key by which a frame file says it is sorted as a whole, by its value's
/// columns (`drive,ts`): `mine-corner-cases` then needs no sort for its windows.
pub const SORTED_BY: &str = "drivetrain.sorted_by";

/// Builds one drive's frame table, writing a row group every [`ROWS_PER_BATCH`] rows.
/// Each row group is sorted by time (and says so in the standard `sorting_columns`); when
/// the row groups follow each other in time too, the footer says the whole file is sorted
/// ([`SORTED_BY`]).
struct DriveWriter {
    drive: String,
    source: String,
    first_ns: Option<u64>,
    rows: Vec<(u64, u64, Option<u64>, Held)>,
    writer: ArrowWriter<std::fs::File>,
    written: u64,
    /// The last log time written, and whether every row group began at or after it.
    last_ns: Option<u64>,
    in_order: bool,
}

impl DriveWriter {
    fn create(dir: &Path, drive: &str, source: &str) -> anyhow::Result<DriveWriter> {
        let part = dir.join(format!("drive={drive}"));
        std::fs::create_dir_all(&part)?;
        let file = std::fs::File::create(part.join("part-00000.parquet"))?;
        let ascending = |column_idx| SortingColumn {
            column_idx,
            descending: false,
            nulls_first: false,
        };
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_sorting_columns(Some(vec![ascending(0), ascending(1)]))
            .build();
        Ok(DriveWriter {
            drive: drive.to_owned(),
            source: source.to_owned(),
            first_ns: None,
            rows: Vec::new(),
            writer: ArrowWriter::try_new(file, frame_schema(), Some(props))?,
            written: 0,
            last_ns: None,
            in_order: true,
        })
    }

    fn push(
        &mut self,
        log_time: u64,
        offset: u64,
        chunk: Option<u64>,
        held: &Held,
    ) -> anyhow::Result<()> {
        self.first_ns.get_or_insert(log_time);
        self.rows.push((log_time, offset, chunk, held.clone()));
        if self.rows.len() >= ROWS_PER_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let first = self.first_ns.unwrap_or(0);
        let n = self.rows.len();
        // Messages of a recording can be out of time order (chunks written out of
        // order): each row group is put in order, and the file is in order if each
        // group starts where the last one ended.
        self.rows.sort_by_key(|r| r.0);
        if self.last_ns.is_some_and(|last| self.rows[0].0 < last) {
            self.in_order = false;
        }
        self.last_ns = self.rows.last().map(|r| r.0);
        let mut drive = StringBuilder::new();
        let mut ts = Float64Builder::with_capacity(n);
        let mut lt = Int64Builder::with_capacity(n);
        let mut f64s: Vec<Float64Builder> = F64_COLUMNS
            .iter()
            .map(|_| Float64Builder::with_capacity(n))
            .collect();
        let mut strs: Vec<StringBuilder> =
            STR_COLUMNS.iter().map(|_| StringBuilder::new()).collect();
        let mut gts: Vec<BooleanBuilder> =
            GT_COLUMNS.iter().map(|_| BooleanBuilder::new()).collect();
        let mut src = StringBuilder::new();
        let mut off = Int64Builder::with_capacity(n);
        let mut coff = Int64Builder::with_capacity(n);
        for (log_time, offset, chunk, held) in self.rows.drain(..) {
            drive.append_value(&self.drive);
            ts.append_value((log_time.saturating_sub(first)) as f64 / 1e9);
            lt.append_value(log_time as i64);
            for (b, v) in f64s.iter_mut().zip(held.f64s) {
                b.append_option(v);
            }
            for (b, v) in strs.iter_mut().zip(&held.strs) {
                b.append_option(v.as_deref());
            }
            for (b, v) in gts.iter_mut().zip(held.gts) {
                b.append_option(v);
            }
            src.append_value(&self.source);
            off.append_value(offset as i64);
            coff.append_option(chunk.map(|c| c as i64));
        }
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(drive.finish()),
            Arc::new(ts.finish()),
            Arc::new(lt.finish()),
        ];
        cols.extend(f64s.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        cols.extend(strs.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        cols.extend(gts.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        cols.push(Arc::new(src.finish()));
        cols.push(Arc::new(off.finish()));
        cols.push(Arc::new(coff.finish()));
        self.writer
            .write(&RecordBatch::try_new(frame_schema(), cols)?)?;
        // Its own row group (the writer would otherwise join batches up to a million
        // rows): each row group holds what was put in order here.
        self.writer.flush()?;
        self.written += n as u64;
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<u64> {
        self.flush()?;
        if self.in_order {
            self.writer
                .append_key_value_metadata(KeyValue::new(SORTED_BY.into(), "drive,ts".to_owned()));
        }
        self.writer.close()?;
        Ok(self.written)
    }
}

/// One row of the message index: file, topic, schema name and encoding, message
/// encoding, log time, size, offset, chunk offset, JSON text.
type IndexRow = (
    String,
    String,
    String,
    String,
    String,
    u64,
    u64,
    u64,
    Option<u64>,
    Option<String>,
);

/// The message index of every MCAP file, written as it is read.
struct IndexWriter {
    path: PathBuf,
    writer: ArrowWriter<std::fs::File>,
    rows: Vec<IndexRow>,
}

fn index_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("topic", DataType::Utf8, false),
        Field::new("schema_name", DataType::Utf8, false),
        Field::new("schema_encoding", DataType::Utf8, false),
        Field::new("message_encoding", DataType::Utf8, false),
        Field::new("log_time_ns", DataType::Int64, false),
        Field::new("size", DataType::Int64, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("chunk_offset", DataType::Int64, true),
        Field::new("json", DataType::Utf8, true),
    ]))
}

impl IndexWriter {
    fn create(path: &Path) -> anyhow::Result<IndexWriter> {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .build();
        Ok(IndexWriter {
            path: path.to_path_buf(),
            writer: ArrowWriter::try_new(
                std::fs::File::create(path)?,
                index_schema(),
                Some(props),
            )?,
            rows: Vec::new(),
        })
    }

    /// Writes what is buffered and closes the file; returns its path.
    fn close(mut self) -> anyhow::Result<PathBuf> {
        self.flush()?;
        self.writer.close()?;
        Ok(self.path)
    }

    /// Appends the rows of another index file (one log's, once it was read to the end).
    fn append(&mut self, part: &Path) -> anyhow::Result<()> {
        self.flush()?;
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(part)?)?.build()?;
        for batch in reader {
            self.writer.write(&batch?)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let mut s: Vec<StringBuilder> = (0..5).map(|_| StringBuilder::new()).collect();
        let mut i: Vec<Int64Builder> = (0..4).map(|_| Int64Builder::new()).collect();
        let mut j = StringBuilder::new();
        for (file, topic, sn, se, me, lt, size, off, coff, json) in self.rows.drain(..) {
            for (b, v) in s.iter_mut().zip([file, topic, sn, se, me]) {
                b.append_value(v);
            }
            i[0].append_value(lt as i64);
            i[1].append_value(size as i64);
            i[2].append_value(off as i64);
            i[3].append_option(coff.map(|c| c as i64));
            j.append_option(json);
        }
        let mut cols: Vec<ArrayRef> = s
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef)
            .collect();
        cols.extend(i.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        cols.push(Arc::new(j.finish()));
        self.writer
            .write(&RecordBatch::try_new(index_schema(), cols)?)?;
        Ok(())
    }
}

/// Per-channel statistics for `values.json`.
#[derive(Default)]
struct ChannelStats {
    messages: u64,
    bytes: u64,
    first_ns: u64,
    last_ns: u64,
    encoding: String,
    schema: String,
}

/// What one log gave.
struct FileResult {
    frames: u64,
    /// Its messages were not in log-time order (and were put in order).
    reordered: bool,
    /// It ended without a footer (a recorder that stopped, a copy cut short at a record
    /// boundary): what it held was read, what it would have held is unknown.
    unfinished: bool,
}

/// Reads every log of `source` and writes the tables; returns the values.
///
/// Nothing read is dropped without a count: files of no known format are listed under
/// `ignored`, logs without `/vehicle` messages under `without_frames` (they are still
/// indexed), MCAP files without a footer under `unfinished`, logs skipped by `on_error:
/// skip` under `skipped` (and are absent from every table). Only a source with no logs at all, or whose every log failed, is an error.
pub fn ingest(
    cfg: &IngestConfig,
    source: &LogSource,
    frames: &Path,
    index: Option<&Path>,
    lanes: Option<&Path>,
) -> anyhow::Result<Value> {
    let files = source.list()?;
    let format = cfg.format.clone().unwrap_or(LogFormat::Auto);
    let skip = matches!(cfg.on_error, Some(OnError::Skip));
    let mut index_writer = match index {
        Some(dir) => Some(IndexWriter::create(&dir.join("messages.parquet"))?),
        None => None,
    };
    let mut channels: BTreeMap<String, ChannelStats> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut ignored = Vec::new();
    let mut without_frames = Vec::new();
    let mut reordered = Vec::new();
    let mut unfinished = Vec::new();
    let mut drives: BTreeMap<String, u64> = BTreeMap::new();
    let mut drive_files: BTreeMap<String, String> = BTreeMap::new();
    let mut tusimple = Vec::new();
    let mut logs = 0usize;
    let mut bytes = 0u64;
    for rel in &files {
        let name = rel.rsplit('/').next().unwrap_or(rel).to_owned();
        let kind = match (&format, name.rsplit_once('.').map(|(_, e)| e)) {
            (LogFormat::Tusimple, _) => "tusimple",
            (LogFormat::Auto, Some("json")) if name.starts_with("label_data") => "tusimple",
            (LogFormat::Mcap, _) | (LogFormat::Auto, Some("mcap")) => "mcap",
            (LogFormat::Jsonl, _) | (LogFormat::Auto, Some("jsonl")) => "jsonl",
            _ => {
                ignored.push(rel.clone());
                continue;
            }
        };
        logs += 1;
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
        let file = source.fetch(rel)?;
        // Channel statistics and index rows count only the files read to the end.
        let mut file_channels = BTreeMap::new();
        let mut file_index = match index {
            Some(dir) => Some(IndexWriter::create(
                &dir.join(format!(".part-{}.parquet", drive_files.len())),
            )?),
            None => None,
        };
        let result = match kind {
            "mcap" => ingest_mcap(
                &file.path,
                rel,
                &drive,
                frames,
                file_index.as_mut(),
                &mut file_channels,
            ),
            _ => ingest_jsonl(&file.path, rel, &drive, frames).map(|frames| FileResult {
                frames,
                reordered: false,
                unfinished: false,
            }),
        };
        let file_index = match file_index {
            Some(w) => Some(w.close()?),
            None => None,
        };
        match result {
            Ok(r) => {
                for (topic, s) in file_channels {
                    let all: &mut ChannelStats = channels.entry(topic).or_default();
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
                if let (Some(w), Some(part)) = (index_writer.as_mut(), &file_index) {
                    w.append(part)?;
                }
                if r.frames == 0 {
                    without_frames.push(rel.clone());
                }
                if r.reordered {
                    reordered.push(rel.clone());
                }
                if r.unfinished {
                    eprintln!("warning: {rel} has no footer: it may have been cut short");
                    unfinished.push(rel.clone());
                }
                bytes += std::fs::metadata(&file.path).map(|m| m.len()).unwrap_or(0);
                drives.insert(drive, r.frames);
            }
            Err(e) if skip => {
                // A half-written partition of a skipped file is not part of the table.
                let _ = std::fs::remove_dir_all(frames.join(format!("drive={drive}")));
                eprintln!("skipping {rel}: {e:#}");
                skipped.push(json!({"file": rel, "error": format!("{e:#}")}));
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
    if logs == 0 {
        anyhow::bail!(
            "no drive logs in {} (looked for *.mcap, *.jsonl, label_data_*.json; {} other file(s))",
            source.describe(),
            ignored.len()
        );
    }
    if skipped.len() == logs {
        anyhow::bail!(
            "every one of the {logs} log(s) in {} could not be read: {}",
            source.describe(),
            skipped[0]["error"].as_str().unwrap_or_default()
        );
    }
    let frames_total: u64 = drives.values().sum();
    let channels: serde_json::Map<String, Value> = channels
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
    Ok(json!({
        "files": logs,
        "bytes": bytes,
        "frames": frames_total,
        "drives": drives,
        "channels": channels,
        "tusimple_rows": lanes_rows,
        "skipped": skipped,
        "skipped_files": skipped.len(),
        "ignored": ignored,
        "ignored_files": ignored.len(),
        "without_frames": without_frames,
        "files_without_frames": without_frames.len(),
        "reordered": reordered,
        "unfinished": unfinished,
        "unfinished_files": unfinished.len(),
    }))
}

/// One JSON message kept for putting a log in time order.
struct Kept {
    log_time: u64,
    topic: String,
    offset: u64,
    chunk_offset: Option<u64>,
    data: Vec<u8>,
}

fn ingest_mcap(
    file: &Path,
    rel: &str,
    drive: &str,
    frames: &Path,
    mut index: Option<&mut IndexWriter>,
    channels: &mut BTreeMap<String, ChannelStats>,
) -> anyhow::Result<FileResult> {
    let mut builder = FrameBuilder::new(DriveWriter::create(frames, drive, rel)?);
    // Frames are built as the file is read while its JSON messages come in log-time
    // order; past the first that does not, the file is read again and put in order.
    let mut last_json: Option<u64> = None;
    let mut in_order = true;
    let mut on_message = |m: Message<'_>| -> anyhow::Result<()> {
        let json = m.channel.message_encoding == "json";
        let stats = channels.entry(m.channel.topic.clone()).or_default();
        if stats.messages == 0 {
            stats.first_ns = m.log_time;
            stats.encoding = m.channel.message_encoding.clone();
            stats.schema = m.channel.schema_name.clone();
        }
        stats.messages += 1;
        stats.bytes += m.data.len() as u64;
        stats.first_ns = stats.first_ns.min(m.log_time);
        stats.last_ns = stats.last_ns.max(m.log_time);
        if let Some(ix) = index.as_deref_mut() {
            ix.rows.push((
                rel.to_owned(),
                m.channel.topic.clone(),
                m.channel.schema_name.clone(),
                m.channel.schema_encoding.clone(),
                m.channel.message_encoding.clone(),
                m.log_time,
                m.data.len() as u64,
                m.offset,
                m.chunk_offset,
                json.then(|| String::from_utf8_lossy(m.data).into_owned()),
            ));
            if ix.rows.len() >= ROWS_PER_BATCH {
                ix.flush()?;
            }
        }
        if !json || !in_order {
            return Ok(());
        }
        if last_json.is_some_and(|t| m.log_time < t) {
            in_order = false;
            return Ok(());
        }
        last_json = Some(m.log_time);
        builder.message(
            &m.channel.topic,
            m.log_time,
            m.offset,
            m.chunk_offset,
            m.data,
        )
    };
    let end = mcapio::scan(file, &mut on_message)?;
    let unfinished = !end.complete;
    if in_order {
        return Ok(FileResult {
            frames: builder.finish()?,
            reordered: false,
            unfinished,
        });
    }
    // Out of order: the JSON messages in memory, stably sorted by log time (file order
    // among equal times), then built as above. A new writer replaces the partial file.
    drop(builder);
    let mut kept = Vec::new();
    mcapio::scan(file, &mut |m: Message<'_>| {
        if m.channel.message_encoding == "json" && Held::reads(&m.channel.topic) {
            kept.push(Kept {
                log_time: m.log_time,
                topic: m.channel.topic.clone(),
                offset: m.offset,
                chunk_offset: m.chunk_offset,
                data: m.data.to_vec(),
            });
        }
        Ok(())
    })?;
    kept.sort_by_key(|k| k.log_time);
    let mut builder = FrameBuilder::new(DriveWriter::create(frames, drive, rel)?);
    for k in &kept {
        builder.message(&k.topic, k.log_time, k.offset, k.chunk_offset, &k.data)?;
    }
    Ok(FileResult {
        frames: builder.finish()?,
        reordered: true,
        unfinished,
    })
}

fn ingest_jsonl(file: &Path, rel: &str, drive: &str, frames: &Path) -> anyhow::Result<u64> {
    let mut writer = DriveWriter::create(frames, drive, rel)?;
    let r = std::io::BufReader::new(std::fs::File::open(file)?);
    let mut offset = 0u64;
    for (n, line) in r.lines().enumerate() {
        let line = line?;
        let len = line.len() as u64 + 1;
        if line.trim().is_empty() {
            offset += len;
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            anyhow::anyhow!(
                "{rel}: line {} (byte offset {offset}) is not JSON: {e}",
                n + 1
            )
        })?;
        let mut held = Held::default();
        held.take_row(&v);
        let log_time = v
            .get("log_time_ns")
            .and_then(Value::as_u64)
            .or_else(|| {
                v.get("ts")
                    .and_then(Value::as_f64)
                    .map(|t| (t * 1e9) as u64)
            })
            .ok_or_else(|| {
                anyhow::anyhow!("{rel}: line {} has neither `ts` nor `log_time_ns`", n + 1)
            })?;
        writer.push(log_time, offset, None, &held)?;
        offset += len;
    }
    writer.finish()
}

fn ingest_tusimple(files: &[PathBuf], out: &Path) -> anyhow::Result<u64> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("raw_file", DataType::Utf8, false),
        Field::new(
            "h_samples",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            false,
        ),
        Field::new(
            "lanes",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
                true,
            ))),
            false,
        ),
        Field::new("lane_count", DataType::Int64, false),
    ]));
    let mut raw = StringBuilder::new();
    let mut hs = ListBuilder::new(Int64Builder::new());
    let mut lanes = ListBuilder::new(ListBuilder::new(Int64Builder::new()));
    let mut count = Int64Builder::new();
    let mut rows = 0u64;
    for f in files {
        let r = std::io::BufReader::new(std::fs::File::open(f)?);
        for (n, line) in r.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let at = || format!("{}: line {}", f.display(), n + 1);
            let v: Value =
                serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
            let ints = |x: &Value| -> anyhow::Result<Vec<i64>> {
                x.as_array()
                    .ok_or_else(|| anyhow::anyhow!("{}: expected a list", at()))?
                    .iter()
                    .map(|i| {
                        i.as_i64()
                            .ok_or_else(|| anyhow::anyhow!("{}: expected integers", at()))
                    })
                    .collect()
            };
            let file = v
                .get("raw_file")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow::anyhow!("{}: no `raw_file`", at()))?;
            let h = ints(v.get("h_samples").unwrap_or(&Value::Null))?;
            let ls = v
                .get("lanes")
                .and_then(Value::as_array)
                .ok_or_else(|| anyhow::anyhow!("{}: no `lanes`", at()))?;
            raw.append_value(file);
            hs.values().append_slice(&h);
            hs.append(true);
            for lane in ls {
                let xs = ints(lane)?;
                if xs.len() != h.len() {
                    anyhow::bail!(
                        "{}: a lane has {} points for {} h_samples",
                        at(),
                        xs.len(),
                        h.len()
                    );
                }
                lanes.values().values().append_slice(&xs);
                lanes.values().append(true);
            }
            lanes.append(true);
            count.append_value(ls.len() as i64);
            rows += 1;
        }
    }
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(raw.finish()),
            Arc::new(hs.finish()),
            Arc::new(lanes.finish()),
            Arc::new(count.finish()),
        ],
    )?;
    let mut w = ArrowWriter::try_new(std::fs::File::create(out)?, schema, None)?;
    w.write(&batch)?;
    w.close()?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    /// The footer's order claim and the log times of each row group.
    fn written(path: &Path) -> (bool, Vec<Vec<i64>>) {
        let file = || std::fs::File::open(path).unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file()).unwrap();
        let meta = builder.metadata().clone();
        let claims = meta
            .file_metadata()
            .key_value_metadata()
            .into_iter()
            .flatten()
            .any(|kv| kv.key == SORTED_BY);
        let groups = (0..meta.num_row_groups())
            .map(|rg| {
                let reader = ParquetRecordBatchReaderBuilder::try_new(file())
                    .unwrap()
                    .with_row_groups(vec![rg])
                    .build()
                    .unwrap();
                reader
                    .flat_map(|b| {
                        let b = b.unwrap();
                        let lt = b.column_by_name("log_time_ns").unwrap();
                        let lt = lt.as_any().downcast_ref::<Int64Array>().unwrap();
                        lt.values().to_vec()
                    })
                    .collect()
            })
            .collect();
        (claims, groups)
    }

    #[test]
    fn a_file_says_it_is_sorted_only_when_it_is() {
        let dir = std::env::temp_dir().join(format!("dt-ingest-order-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let held = Held::default();
        let write = |drive: &str, groups: &[&[u64]]| {
            let mut w = DriveWriter::create(&dir, drive, "x.mcap").unwrap();
            for group in groups {
                for &t in *group {
                    w.push(t, t, None, &held).unwrap();
                }
                w.flush().unwrap();
            }
            w.finish().unwrap();
            written(
                &dir.join(format!("drive={drive}"))
                    .join("part-00000.parquet"),
            )
        };
        // Out of order inside a row group: put in order; the groups follow each other.
        assert_eq!(
            write("a", &[&[3, 1, 2], &[4, 5]]),
            (true, vec![vec![1, 2, 3], vec![4, 5]])
        );
        // A row group starting before the last one ended: each in order, the file not.
        assert_eq!(
            write("b", &[&[10, 11], &[5]]),
            (false, vec![vec![10, 11], vec![5]])
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
