//! The frame table: its schema, the latest value of every column (`Held`), frames built
//! from messages in log-time order (`FrameBuilder`) and written one drive per file, a row
//! group at a time, in time order (`DriveWriter`).

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::metadata::{KeyValue, SortingColumn};
use datafusion::parquet::file::properties::WriterProperties;
use serde_json::Value;

use super::fields::{self, Invalid, Msg, Taken};

/// Rows buffered per drive before a row group is written: bounds memory.
pub(super) const ROWS_PER_BATCH: usize = 65_536;

/// The number columns, in order: the `/vehicle` message's own first ([`OWN`]).
pub(super) const F64_COLUMNS: &[&str] = &[
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
    fields.extend(
        HELD_CHANNELS
            .iter()
            .map(|(_, c)| Field::new(*c, DataType::Float64, true)),
    );
    fields.push(Field::new("source_file", DataType::Utf8, false));
    fields.push(Field::new("source_offset", DataType::Int64, false));
    fields.push(Field::new("source_chunk_offset", DataType::Int64, true));
    Arc::new(Schema::new(fields))
}

/// The channels held onto a `/vehicle` frame, each with an age column (seconds from that
/// channel's latest message to the frame).
pub const HELD_CHANNELS: &[(&str, &str)] = &[
    ("/lane", "lane_age_s"),
    ("/objects", "objects_age_s"),
    ("/context", "context_age_s"),
    ("/ground_truth", "ground_truth_age_s"),
];

/// The `/vehicle` message's own number columns (the first eight): null in a frame whose
/// message lacks them, never another message's value.
const OWN: usize = 8;

/// What a frame is made of: fixed slots in column order (cloned once per frame, so
/// strings are shared, not copied), and the log time of each held channel's latest
/// message.
#[derive(Default, Clone)]
pub(super) struct Held {
    f64s: [Option<f64>; F64_COLUMNS.len()],
    strs: [Option<Arc<str>>; STR_COLUMNS.len()],
    gts: [Option<bool>; GT_COLUMNS.len()],
    since: [Option<u64>; HELD_CHANNELS.len()],
}

/// Sets `slot` from a field, counting a field of another type.
fn put<T>(slot: &mut Option<T>, taken: Taken<T>, invalid: &mut Invalid, topic: &str, name: &str) {
    if matches!(taken, Taken::Invalid) {
        invalid.field(topic, name);
    }
    *slot = taken.value();
}

impl Held {
    /// Whether messages of `topic` make frames: only these are parsed.
    pub(super) fn reads(topic: &str) -> bool {
        topic == "/vehicle" || HELD_CHANNELS.iter().any(|(t, _)| *t == topic)
    }

    /// Replaces what channel `topic` holds by the message `m` of `log_time`: a field the
    /// message lacks is null, not the channel's earlier value.
    fn take(&mut self, topic: &str, log_time: u64, m: &Msg, invalid: &mut Invalid) {
        let mut f = |slot: usize, raw: &fields::Raw, name: &str, held: &mut Held| {
            put(&mut held.f64s[slot], raw.num(), invalid, topic, name)
        };
        match topic {
            "/vehicle" => {
                let own = [
                    (&m.speed_mps, "speed_mps"),
                    (&m.accel_x, "accel_x"),
                    (&m.accel_y, "accel_y"),
                    (&m.yaw_rate, "yaw_rate"),
                    (&m.steering, "steering"),
                    (&m.brake_pressure, "brake_pressure"),
                    (&m.lat, "lat"),
                    (&m.lon, "lon"),
                    (&m.lateral_offset_m, "lateral_offset_m"),
                    (&m.lane_confidence, "lane_confidence"),
                    (&m.object_distance_m, "object_distance_m"),
                    (&m.object_rel_speed_mps, "object_rel_speed_mps"),
                ];
                for (slot, (raw, name)) in own.into_iter().enumerate() {
                    f(slot, raw, name, self);
                }
                return;
            }
            "/lane" => {
                f(8, &m.lateral_offset_m, "lateral_offset_m", self);
                f(9, &m.lane_confidence, "lane_confidence", self);
            }
            "/objects" => {
                f(10, &m.distance_m, "distance_m", self);
                f(11, &m.rel_speed_mps, "rel_speed_mps", self);
                put(&mut self.strs[0], m.class.text(), invalid, topic, "class");
            }
            "/context" => {
                put(
                    &mut self.strs[1],
                    m.weather.text(),
                    invalid,
                    topic,
                    "weather",
                );
                put(
                    &mut self.strs[2],
                    m.time_of_day.text(),
                    invalid,
                    topic,
                    "time_of_day",
                );
            }
            "/ground_truth" => {
                let flags = [
                    (&m.hard_brake, "hard_brake"),
                    (&m.cut_in, "cut_in"),
                    (&m.pedestrian_close_call, "pedestrian_close_call"),
                    (&m.low_lane_confidence, "low_lane_confidence"),
                ];
                for (slot, (raw, name)) in self.gts.iter_mut().zip(flags) {
                    put(slot, raw.flag(), invalid, topic, name);
                }
            }
            _ => return,
        }
        if let Some(c) = HELD_CHANNELS.iter().position(|(t, _)| *t == topic) {
            self.since[c] = Some(log_time);
        }
    }

    /// The frame of a `/vehicle` message whose own fields are `own`: its own number
    /// columns as they are (null included), the others its own where it has them, else
    /// what the channels hold.
    fn frame(&self, own: &Held) -> Held {
        let mut out = self.clone();
        out.f64s[..OWN].copy_from_slice(&own.f64s[..OWN]);
        for (slot, v) in out.f64s[OWN..].iter_mut().zip(&own.f64s[OWN..]) {
            if v.is_some() {
                *slot = *v;
            }
        }
        out
    }

    /// Sets one column from a field, counting a value of another type.
    pub(super) fn set(
        &mut self,
        slot: Slot,
        raw: &fields::Raw,
        invalid: &mut Invalid,
        topic: &str,
        field: &str,
    ) {
        match slot {
            Slot::F64(i) => put(&mut self.f64s[i], raw.num(), invalid, topic, field),
            Slot::Str(i) => put(&mut self.strs[i], raw.text(), invalid, topic, field),
            Slot::Gt(i) => put(&mut self.gts[i], raw.flag(), invalid, topic, field),
        }
    }

    /// Copies one column from `from`.
    pub(super) fn copy(&mut self, from: &Held, slot: Slot) {
        match slot {
            Slot::F64(i) => self.f64s[i] = from.f64s[i],
            Slot::Str(i) => self.strs[i] = from.strs[i].clone(),
            Slot::Gt(i) => self.gts[i] = from.gts[i],
        }
    }

    /// Says that age column `group` comes from a message of `log_time`: the stalest of
    /// those it comes from is kept.
    pub(super) fn aged(&mut self, group: usize, log_time: u64) {
        let since = &mut self.since[group];
        *since = Some(since.map_or(log_time, |s| s.min(log_time)));
    }

    /// Takes every known column of a JSON-lines frame (every field its own).
    pub(super) fn take_row(&mut self, v: &Value, invalid: &mut Invalid) {
        let raw = |c: &str| fields::Raw::of(v.get(c));
        for (slot, c) in self.f64s.iter_mut().zip(F64_COLUMNS) {
            put(slot, raw(c).num(), invalid, "line", c);
        }
        for (slot, c) in self.strs.iter_mut().zip(STR_COLUMNS) {
            put(slot, raw(c).text(), invalid, "line", c);
        }
        for (slot, c) in self.gts.iter_mut().zip(GT_COLUMNS) {
            put(slot, raw(c).flag(), invalid, "line", c);
        }
    }
}

/// A column a declared mapping may fill: its place in [`Held`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    F64(usize),
    Str(usize),
    Gt(usize),
}

impl Slot {
    /// The slot of frame column `column`, if a mapping may fill it.
    pub(super) fn of(column: &str) -> Option<Slot> {
        let at = |cols: &[&str]| cols.iter().position(|c| *c == column);
        at(F64_COLUMNS)
            .map(Slot::F64)
            .or_else(|| at(STR_COLUMNS).map(Slot::Str))
            .or_else(|| at(GT_COLUMNS).map(Slot::Gt))
    }

    /// The columns a mapping may fill.
    pub(super) fn columns() -> Vec<&'static str> {
        [F64_COLUMNS, STR_COLUMNS, GT_COLUMNS].concat()
    }

    /// The age column (an index into [`HELD_CHANNELS`]) this column's group has:
    /// `lane_age_s` for the lane columns and so on; none for the vehicle's own.
    pub(super) fn age_group(self) -> Option<usize> {
        match self {
            Slot::F64(8 | 9) => Some(0),
            Slot::F64(10 | 11) | Slot::Str(0) => Some(1),
            Slot::Str(_) => Some(2),
            Slot::Gt(_) => Some(3),
            Slot::F64(_) => None,
        }
    }
}

/// A frame waiting for the messages that share its log time (the default layout's and
/// a declared mapping's).
pub(super) struct Pending {
    pub(super) log_time: u64,
    pub(super) offset: u64,
    pub(super) chunk_offset: Option<u64>,
    /// The frame's own clock-message fields: two frames at one log time keep their own.
    pub(super) own: Held,
}

/// Turns JSON channel messages, fed in log-time order, into frames: one per `/vehicle`
/// message, with its own fields and the latest message of every other channel at its
/// log time (messages sharing that log time included, whatever their order in the file).
pub(super) struct FrameBuilder {
    writer: DriveWriter,
    held: Held,
    /// The `/vehicle` messages at the latest log time, waiting for the rest of it.
    pending: Vec<Pending>,
    /// Fields and messages the table could not take.
    pub(super) invalid: Invalid,
}

impl FrameBuilder {
    pub(super) fn new(writer: DriveWriter) -> FrameBuilder {
        FrameBuilder {
            writer,
            held: Held::default(),
            pending: Vec::new(),
            invalid: Invalid::default(),
        }
    }

    /// Takes one message of a topic that makes frames ([`Held::reads`]); `log_time` is
    /// never before the last one's. A message that is not a JSON object is counted, not
    /// an error: one bad message never costs the drive.
    pub(super) fn message(
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
        let Some(msg) = Msg::parse(data) else {
            self.invalid.message(topic);
            return Ok(());
        };
        if topic != "/vehicle" {
            self.held.take(topic, log_time, &msg, &mut self.invalid);
            return Ok(());
        }
        let mut own = Held::default();
        own.take(topic, log_time, &msg, &mut self.invalid);
        self.pending.push(Pending {
            log_time,
            offset,
            chunk_offset,
            own,
        });
        Ok(())
    }

    pub(super) fn flush_pending(&mut self) -> anyhow::Result<()> {
        for p in std::mem::take(&mut self.pending) {
            let frame = self.held.frame(&p.own);
            self.writer
                .push(p.log_time, p.offset, p.chunk_offset, &frame)?;
        }
        Ok(())
    }

    pub(super) fn finish(mut self) -> anyhow::Result<(u64, Invalid)> {
        self.flush_pending()?;
        Ok((self.writer.finish()?, self.invalid))
    }
}

/// The footer key by which a frame file says it is sorted as a whole, by its value's
/// columns (`drive,ts`): `mine-corner-cases` then needs no sort for its windows.
pub const SORTED_BY: &str = "drivetrain.sorted_by";

/// Builds one drive's frame table, writing a row group every [`ROWS_PER_BATCH`] rows.
/// Each row group is sorted by time (and says so in the standard `sorting_columns`); when
/// the row groups follow each other in time too, the footer says the whole file is sorted
/// ([`SORTED_BY`]).
pub(super) struct DriveWriter {
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
    pub(super) fn create(dir: &Path, drive: &str, source: &str) -> anyhow::Result<DriveWriter> {
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

    /// Measures `ts` from `origin` (the drive's earliest log time) instead of the first
    /// frame pushed: for logs read out of time order.
    pub(super) fn with_origin(mut self, origin: u64) -> DriveWriter {
        self.first_ns = Some(origin);
        self
    }

    pub(super) fn push(
        &mut self,
        log_time: u64,
        offset: u64,
        chunk: Option<u64>,
        held: &Held,
    ) -> anyhow::Result<()> {
        if log_time > i64::MAX as u64 {
            anyhow::bail!(
                "{}: the frame at byte offset {offset} has log time {log_time} ns, past what the table's int64 `log_time_ns` holds (2^63 - 1 ns, the year 2262): a corrupt or foreign clock",
                self.source
            );
        }
        self.first_ns.get_or_insert(log_time);
        self.rows.push((log_time, offset, chunk, held.clone()));
        if self.rows.len() >= ROWS_PER_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    pub(super) fn flush(&mut self) -> anyhow::Result<()> {
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
        let mut ages: Vec<Float64Builder> = HELD_CHANNELS
            .iter()
            .map(|_| Float64Builder::with_capacity(n))
            .collect();
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
            for (b, since) in ages.iter_mut().zip(held.since) {
                b.append_option(since.map(|s| log_time.saturating_sub(s) as f64 / 1e9));
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
        cols.extend(ages.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
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

    pub(super) fn finish(mut self) -> anyhow::Result<u64> {
        self.flush()?;
        if self.in_order {
            self.writer
                .append_key_value_metadata(KeyValue::new(SORTED_BY.into(), "drive,ts".to_owned()));
        }
        self.writer.close()?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

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
