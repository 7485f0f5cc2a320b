//! One MCAP log to frames: every message indexed and counted, the messages of the topics
//! that make frames decoded by their channel's schema ([`crate::decode`]) and fed in
//! log-time order to the default layout's builder or a declared mapping's.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::fields::Invalid;
use super::frames::{DriveWriter, FrameBuilder, Held, F64_COLUMNS, ROWS_PER_BATCH};
use super::index::{ChannelStats, IndexWriter};
use super::mapped::{MappedBuilder, Mapping};
use super::spill::{spill_dir, Sorter};
use super::FileResult;
use crate::decode::{Decoder, Dyn};
use crate::mcapio::{self, ChannelInfo, Message};

/// The most reasons counted apart for one topic of one drive; the rest are counted
/// together.
const MAX_REASONS: usize = 20;

/// Messages of frame topics that could not be decoded, by (topic, reason).
pub(super) type Undecodable = BTreeMap<(String, String), u64>;

/// The fields the default layout reads from a topic.
fn default_fields(topic: &str) -> &'static [&'static str] {
    match topic {
        "/vehicle" => F64_COLUMNS,
        "/lane" => &["lateral_offset_m", "lane_confidence"],
        "/objects" => &["distance_m", "rel_speed_mps", "class"],
        "/context" => &["weather", "time_of_day"],
        "/ground_truth" => &[
            "hard_brake",
            "cut_in",
            "pedestrian_close_call",
            "low_lane_confidence",
        ],
        _ => &[],
    }
}

enum Builder {
    Default(FrameBuilder),
    Mapped(MappedBuilder),
}

/// What turns one log's messages into frames.
struct Frames<'m> {
    builder: Builder,
    mapping: Option<&'m Mapping>,
    decoders: HashMap<u16, Result<Decoder, String>>,
    undecodable: Undecodable,
}

impl<'m> Frames<'m> {
    fn new(
        frames: &Path,
        drive: &str,
        rel: &str,
        mapping: Option<&'m Mapping>,
    ) -> anyhow::Result<Self> {
        let writer = DriveWriter::create(frames, drive, rel)?;
        let builder = match mapping {
            Some(m) => Builder::Mapped(MappedBuilder::new(writer, m.clone())),
            None => Builder::Default(FrameBuilder::new(writer)),
        };
        Ok(Frames {
            builder,
            mapping,
            decoders: HashMap::new(),
            undecodable: BTreeMap::new(),
        })
    }

    fn reads(&self, topic: &str) -> bool {
        match self.mapping {
            Some(m) => m.reads(topic),
            None => Held::reads(topic),
        }
    }

    fn count(&mut self, topic: &str, reason: String) {
        let reason = standalone_numbers_as_n(&reason);
        let reasons = self.undecodable.keys().filter(|(t, _)| t == topic).count();
        let key = (topic.to_owned(), reason);
        let key = if reasons >= MAX_REASONS && !self.undecodable.contains_key(&key) {
            (topic.to_owned(), "other reasons".to_owned())
        } else {
            key
        };
        *self.undecodable.entry(key).or_default() += 1;
    }

    /// Decodes one message of a frame topic and feeds it to the builder; one that does
    /// not decode is counted, never the end of the drive.
    fn message(
        &mut self,
        channel: &ChannelInfo,
        log_time: u64,
        offset: u64,
        chunk: Option<u64>,
        data: &[u8],
    ) -> anyhow::Result<()> {
        let first = !self.decoders.contains_key(&channel.id);
        let decoder = self.decoders.entry(channel.id).or_insert_with(|| {
            Decoder::new(
                &channel.message_encoding,
                &channel.schema_name,
                &channel.schema_encoding,
                &channel.schema,
            )
            .map_err(|e| format!("schema: {e}"))
        });
        let topic = channel.topic.as_str();
        let decoder = match decoder {
            Ok(d) => d,
            Err(reason) => {
                let reason = reason.clone();
                self.count(topic, reason);
                return Ok(());
            }
        };
        let json = decoder.is_json();
        if let (Builder::Default(b), true) = (&mut self.builder, json) {
            return b.message(topic, log_time, offset, chunk, data);
        }
        let decoded = match decoder.decode(data) {
            Ok(d) => d,
            Err(reason) => {
                self.count(topic, format!("payload: {reason}"));
                return Ok(());
            }
        };
        match &mut self.builder {
            Builder::Default(b) => {
                if first {
                    fits_default_layout(channel, &decoded)?;
                }
                b.message(topic, log_time, offset, chunk, &decoded.to_json())
            }
            Builder::Mapped(b) => b.message(topic, log_time, offset, chunk, &decoded, !json),
        }
    }

    fn finish(self) -> anyhow::Result<(u64, Invalid, Undecodable)> {
        let (frames, invalid) = match self.builder {
            Builder::Default(b) => b.finish()?,
            Builder::Mapped(b) => b.finish()?,
        };
        Ok((frames, invalid, self.undecodable))
    }
}

/// `reason` with its standalone numbers (`at byte 724`) as `N`, so the messages cut the
/// same way are counted together (`float64[9]` and `int32` stay).
fn standalone_numbers_as_n(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    for (i, word) in reason.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let digits = word.trim_end_matches([',', ':', ';', ')']);
        if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) {
            out.push('N');
            out.push_str(&word[digits.len()..]);
        } else {
            out.push_str(word);
        }
    }
    out
}

/// A schema'd channel read by the default layout must have some of its fields: one that
/// has none is another layout, which would be frames of nulls.
fn fits_default_layout(channel: &ChannelInfo, decoded: &Dyn) -> anyhow::Result<()> {
    let wanted = default_fields(&channel.topic);
    let has = |f: &&str| {
        decoded
            .at(&[crate::decode::Seg::Field((*f).into())])
            .is_ok()
    };
    if wanted.iter().any(has) {
        return Ok(());
    }
    anyhow::bail!(
        "`{}` ({} `{}`) has none of the fields the default frame layout reads ({}); it has {}: declare `frames:` to map its fields to frame columns",
        channel.topic,
        channel.message_encoding,
        channel.schema_name,
        wanted.join(", "),
        decoded.describe()
    )
}

/// Counts `m` in its channel's statistics and writes its index row.
fn account(
    m: &Message<'_>,
    rel: &str,
    channels: &mut BTreeMap<String, ChannelStats>,
    index: Option<&mut IndexWriter>,
) -> anyhow::Result<()> {
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
    if let Some(ix) = index {
        let json = crate::decode::is_json_encoding(&m.channel.message_encoding);
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
    Ok(())
}

/// How logs are read into frames: by a declared mapping or the default layout, and how
/// many bytes of messages a log read out of order may hold in memory.
pub(super) struct Reading {
    pub mapping: Option<Mapping>,
    pub reorder_bytes: usize,
}

pub(super) fn ingest_mcap(
    file: &Path,
    rel: &str,
    drive: &str,
    frames: &Path,
    how: &Reading,
    mut index: Option<&mut IndexWriter>,
    channels: &mut BTreeMap<String, ChannelStats>,
) -> anyhow::Result<FileResult> {
    // Frames are built as the file is read while the messages that make them come in
    // log-time order; past the first that does not, the file is read again and put in
    // order. Other topics are indexed and counted, never decoded.
    let mapping = how.mapping.as_ref();
    let mut built = Frames::new(frames, drive, rel, mapping)?;
    let mut last: Option<u64> = None;
    let mut in_order = true;
    let end = mcapio::scan(file, &mut |m: Message<'_>| {
        account(&m, rel, channels, index.as_deref_mut())?;
        if !built.reads(&m.channel.topic) || !in_order {
            return Ok(());
        }
        if last.is_some_and(|t| m.log_time < t) {
            in_order = false;
            return Ok(());
        }
        last = Some(m.log_time);
        built.message(m.channel, m.log_time, m.offset, m.chunk_offset, m.data)
    })?;
    let (unfinished, cut) = (!end.complete, end.cut);
    let reordered = !in_order;
    let mut spilled = 0;
    if reordered {
        // Out of order: the messages that make frames put in order (in memory up to a
        // bound, beyond it in sorted runs on disk merged back), then built as above. A
        // new writer replaces the partial file.
        drop(built);
        built = Frames::new(frames, drive, rel, mapping)?;
        let mut sorter = Sorter::new(spill_dir(frames, drive), how.reorder_bytes);
        let mut infos: HashMap<u16, ChannelInfo> = HashMap::new();
        mcapio::scan(file, &mut |m: Message<'_>| {
            if built.reads(&m.channel.topic) {
                infos
                    .entry(m.channel.id)
                    .or_insert_with(|| m.channel.clone());
                sorter.push(m.log_time, m.channel.id, m.offset, m.chunk_offset, m.data)?;
            }
            Ok(())
        })?;
        spilled = sorter.drain(|k| {
            built.message(
                &infos[&k.channel],
                k.log_time,
                k.offset,
                k.chunk_offset,
                &k.data,
            )
        })?;
    }
    let (frames, invalid, undecodable) = built.finish()?;
    Ok(FileResult {
        frames,
        reordered,
        spilled,
        unfinished,
        cut,
        invalid,
        undecodable,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reasons_count_together_whatever_the_offsets() {
        assert_eq!(
            super::standalone_numbers_as_n(
                "the payload ends at byte 724 where 8 more byte(s), float64[9] int32 1e5"
            ),
            "the payload ends at byte N where N more byte(s), float64[9] int32 1e5"
        );
    }
}
