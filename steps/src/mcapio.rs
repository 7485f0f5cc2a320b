//! Reading MCAP files front to back, one record at a time, with the byte offset of every
//! message: the source offset lineage keeps for each frame.
//!
//! The record framing (opcode, length, body) is read here so offsets are exact and
//! memory stays bounded (one chunk at a time, never more than its data gives); record
//! bodies are parsed by the `mcap` crate. Chunks compressed with zstd or lz4 are
//! decompressed. A file cut short (no trailing magic) is read up to its last whole
//! record, as `mcap recover` does, and says where it was cut. Everything else that does
//! not add up is an error naming the byte offset: a record that does not parse, a record
//! kind with no place where it stands, a finished file whose records overrun it or miss
//! its footer, a checksum that does not match (every chunk's CRC of its records,
//! `uncompressed_crc`, and the data section's, `DataEnd.data_section_crc`, where the writer
//! set them: 0 means none), and a message count other than the summary's `Statistics`.

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use mcap::records::Record;

const MAGIC: &[u8; 8] = b"\x89MCAP0\r\n";
const OP_FOOTER: u8 = 0x02;
const OP_SCHEMA: u8 = 0x03;
const OP_CHANNEL: u8 = 0x04;
const OP_MESSAGE: u8 = 0x05;
const OP_CHUNK: u8 = 0x06;
const OP_STATISTICS: u8 = 0x0B;
const OP_DATA_END: u8 = 0x0F;

/// A channel as its records declared it.
#[derive(Debug, Clone, Default)]
pub struct ChannelInfo {
    /// Its id in the file.
    pub id: u16,
    pub topic: String,
    pub message_encoding: String,
    pub schema_name: String,
    pub schema_encoding: String,
    /// The schema record's data (a `.msg` text, a `FileDescriptorSet`, a JSON Schema).
    pub schema: std::sync::Arc<[u8]>,
}

/// One message and where it is.
#[derive(Debug)]
pub struct Message<'a> {
    pub channel: &'a ChannelInfo,
    pub log_time: u64,
    pub data: &'a [u8],
    /// Byte offset in the file of the message record, or of the chunk holding it.
    pub offset: u64,
    /// Offset of the message record inside its decompressed chunk.
    pub chunk_offset: Option<u64>,
}

/// How reading a file ended.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ScanEnd {
    pub messages: u64,
    /// The file had a footer (it was finished properly).
    pub complete: bool,
    pub bytes: u64,
    /// A file cut short inside a record: the offset of that record, where reading
    /// stopped (what followed, a chunk's messages included, is lost).
    pub cut: Option<u64>,
}

/// A file that is not a readable MCAP file, with where it went wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {why} at byte offset {offset}")]
pub struct ScanError {
    pub file: String,
    pub offset: u64,
    pub why: String,
}

struct State {
    schemas: HashMap<u16, (String, String, std::sync::Arc<[u8]>)>,
    channels: HashMap<u16, ChannelInfo>,
}

impl State {
    fn record(
        &mut self,
        op: u8,
        body: &[u8],
        offset: u64,
        chunk_offset: Option<u64>,
        on_message: &mut dyn FnMut(Message<'_>) -> anyhow::Result<()>,
        messages: &mut u64,
    ) -> Result<(), String> {
        match op {
            OP_SCHEMA | OP_CHANNEL | OP_MESSAGE => {}
            _ => return Ok(()),
        }
        match mcap::parse_record(op, body).map_err(|e| format!("corrupt record: {e}"))? {
            Record::Schema { header, data } => {
                self.schemas.insert(
                    header.id,
                    (
                        header.name,
                        header.encoding,
                        std::sync::Arc::from(&data[..]),
                    ),
                );
            }
            Record::Channel(c) => {
                let (schema_name, schema_encoding, schema) =
                    self.schemas.get(&c.schema_id).cloned().unwrap_or_default();
                self.channels.insert(
                    c.id,
                    ChannelInfo {
                        id: c.id,
                        schema,
                        topic: c.topic,
                        message_encoding: c.message_encoding,
                        schema_name,
                        schema_encoding,
                    },
                );
            }
            Record::Message { header, data } => {
                let channel = self
                    .channels
                    .get(&header.channel_id)
                    .ok_or_else(|| format!("message on unknown channel {}", header.channel_id))?;
                *messages += 1;
                on_message(Message {
                    channel,
                    log_time: header.log_time,
                    data: &data,
                    offset,
                    chunk_offset,
                })
                .map_err(|e| format!("{e:#}"))?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The most a chunk may hold uncompressed: a corrupt size must not become an allocation.
const MAX_CHUNK: u64 = 1 << 32;

/// A chunk's records: decompressed as they come (never an allocation of the size the
/// chunk claims), and exactly as long as it claims.
fn decompress(compression: &str, data: &[u8], size: u64) -> Result<Vec<u8>, String> {
    if size > MAX_CHUNK {
        return Err(format!(
            "corrupt chunk: it says it holds {size} bytes uncompressed, more than the {MAX_CHUNK} drivetrain reads per chunk"
        ));
    }
    let mut out = Vec::with_capacity((size as usize).min(data.len().saturating_mul(4) + 4096));
    // One byte past the claim shows a chunk that holds more than it says.
    let limit = size + 1;
    match compression {
        "" => out.extend_from_slice(data),
        "zstd" => {
            zstd::stream::read::Decoder::new(data)
                .and_then(|d| d.take(limit).read_to_end(&mut out))
                .map_err(|e| format!("zstd: {e}"))?;
        }
        "lz4" => {
            lz4::Decoder::new(data)
                .and_then(|d| d.take(limit).read_to_end(&mut out))
                .map_err(|e| format!("lz4: {e}"))?;
        }
        other => return Err(format!("unsupported chunk compression `{other}`")),
    }
    if out.len() as u64 != size {
        return Err(format!(
            "corrupt chunk: it says it holds {size} bytes uncompressed, its data gives {}{}",
            out.len().min(size as usize),
            if out.len() as u64 > size {
                " and more"
            } else {
                ""
            }
        ));
    }
    Ok(out)
}

/// Whether a record of opcode `op` may stand in the data section (the spec's Header,
/// Schema, Channel, Message, Chunk, Message Index, Attachment, Metadata; 0x80 and up
/// are private records a reader skips). Anything else there is corruption: a Footer,
/// Statistics or index record read where data should be means the framing is lost.
fn data_section_record(op: u8) -> bool {
    matches!(op, 0x01 | 0x03..=0x07 | 0x09 | 0x0C) || op >= 0x80
}

/// Reads `path` front to back, calling `on_message` for every message in file order.
///
/// A file cut short (it does not end with the MCAP magic) is read up to its last whole
/// record outside a chunk, as `mcap recover` does: what it held is given, and
/// [`ScanEnd::cut`] says where it stopped. A file that does end with the magic was
/// finished, so a record that overruns it, a Footer anywhere but at its end, or a
/// record kind that has no place in the data section is corruption, an error; so is a
/// message count other than the summary's `Statistics` says.
pub fn scan(
    path: &Path,
    on_message: &mut dyn FnMut(Message<'_>) -> anyhow::Result<()>,
) -> Result<ScanEnd, ScanError> {
    let file_name = path.display().to_string();
    let fail = |offset: u64, why: String| ScanError {
        file: file_name.clone(),
        offset,
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| fail(0, e.to_string()))?;
    let total = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)
        .map_err(|_| fail(0, "too short to be an MCAP file".into()))?;
    if &magic != MAGIC {
        return Err(fail(0, "not an MCAP file (bad magic)".into()));
    }
    let finished = total >= 16 && ends_with_magic(path, total).map_err(|e| fail(0, e))?;
    let mut state = State {
        schemas: HashMap::new(),
        channels: HashMap::new(),
    };
    let mut end = ScanEnd::default();
    let mut pos = 8u64;
    let mut body = Vec::new();
    // The data section's CRC covers every byte from the magic to the DataEnd record.
    let mut section = crc32fast::Hasher::new();
    section.update(&magic);
    loop {
        let mut head = [0u8; 9];
        let got = read_full(&mut r, &mut head).map_err(|e| fail(pos, e.to_string()))?;
        let op = head[0];
        let len = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let overruns = got < 9 || len > total.saturating_sub(pos + 9);
        if got == 0 || overruns {
            if finished {
                return Err(fail(
                    pos,
                    if got == 0 {
                        "the file ends with the MCAP magic (it was finished) but its records do not lead to a footer: corrupt".into()
                    } else {
                        format!("record (opcode 0x{op:02x}, {len} bytes) overruns the file, which ends with the MCAP magic (it was finished): corrupt")
                    },
                ));
            }
            // Cut short: at a record boundary, or inside a record (lost with the rest).
            if got != 0 {
                end.cut = Some(pos);
            }
            break;
        }
        if op == OP_FOOTER {
            if !(finished && len == 20 && pos + 9 + 20 + 8 == total) {
                return Err(fail(
                    pos,
                    "a Footer record where the data section goes on: corrupt".into(),
                ));
            }
            end.complete = true;
            break;
        }
        if op == OP_DATA_END {
            let mut crc = [0u8; 4];
            r.read_exact(&mut crc)
                .map_err(|e| fail(pos, format!("truncated data end record: {e}")))?;
            let expected = u32::from_le_bytes(crc);
            let actual = section.finalize();
            if expected != 0 && expected != actual {
                return Err(fail(
                    pos,
                    format!("data section CRC mismatch (the file says {expected:08x}, its bytes give {actual:08x}): the file is corrupt"),
                ));
            }
            end.complete = true;
            if let Some((at, count)) =
                summary_message_count(path, total, finished).map_err(|e| fail(total, e))?
            {
                if count != end.messages {
                    return Err(fail(
                        at,
                        format!("the summary's Statistics say {count} messages, the data section holds {}: corrupt", end.messages),
                    ));
                }
            }
            break;
        }
        if !data_section_record(op) || (op == 0x01 && pos != 8) {
            return Err(fail(
                pos,
                format!("a record of opcode 0x{op:02x} cannot stand in the data section: corrupt"),
            ));
        }
        body.resize(len as usize, 0);
        r.read_exact(&mut body)
            .map_err(|e| fail(pos, format!("truncated record: {e}")))?;
        section.update(&head);
        section.update(&body);
        if op == OP_CHUNK {
            state
                .chunk(&body, pos, on_message, &mut end.messages)
                .map_err(|e| fail(pos, e))?;
        } else {
            state
                .record(op, &body, pos, None, on_message, &mut end.messages)
                .map_err(|e| fail(pos, e))?;
        }
        pos += 9 + len;
    }
    end.bytes = total;
    Ok(end)
}

impl State {
    /// The records of one chunk: its compression undone, its CRC checked, each record
    /// (schemas, channels, messages) taken in order.
    fn chunk(
        &mut self,
        body: &[u8],
        pos: u64,
        on_message: &mut dyn FnMut(Message<'_>) -> anyhow::Result<()>,
        messages: &mut u64,
    ) -> Result<(), String> {
        let Record::Chunk { header, data } =
            mcap::parse_record(OP_CHUNK, body).map_err(|e| format!("corrupt chunk: {e}"))?
        else {
            return Err("corrupt chunk".into());
        };
        let records = decompress(&header.compression, &data, header.uncompressed_size)?;
        let crc = crc32fast::hash(&records);
        if header.uncompressed_crc != 0 && header.uncompressed_crc != crc {
            return Err(format!(
                "chunk CRC mismatch (the chunk says {:08x}, its records give {crc:08x}): the file is corrupt",
                header.uncompressed_crc
            ));
        }
        let mut at = 0usize;
        while at < records.len() {
            if records.len() - at < 9 {
                return Err(format!("corrupt chunk: record header cut at {at}"));
            }
            let iop = records[at];
            let ilen = u64::from_le_bytes(records[at + 1..at + 9].try_into().expect("8"));
            let start = at + 9;
            let stop = usize::try_from(ilen)
                .ok()
                .and_then(|l| start.checked_add(l))
                .filter(|s| *s <= records.len())
                .ok_or_else(|| format!("corrupt chunk: record at {at} overruns it"))?;
            if !matches!(iop, OP_SCHEMA | OP_CHANNEL | OP_MESSAGE) && iop < 0x80 {
                return Err(format!(
                    "corrupt chunk: a record of opcode 0x{iop:02x} at {at} cannot stand in a chunk"
                ));
            }
            self.record(
                iop,
                &records[start..stop],
                pos,
                Some(at as u64),
                on_message,
                messages,
            )?;
            at = stop;
        }
        Ok(())
    }
}

/// Whether the file's last 8 bytes are the MCAP magic (a writer finished it).
fn ends_with_magic(path: &Path, total: u64) -> Result<bool, String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    f.seek(SeekFrom::Start(total - 8))
        .map_err(|e| e.to_string())?;
    let mut tail = [0u8; 8];
    f.read_exact(&mut tail).map_err(|e| e.to_string())?;
    Ok(&tail == MAGIC)
}

/// The message count of the summary's Statistics record, with its offset, where the
/// file has a footer that points to a summary holding one.
/// `finished`: the file ends with the magic (the scan already looked).
fn summary_message_count(
    path: &Path,
    total: u64,
    finished: bool,
) -> Result<Option<(u64, u64)>, String> {
    // Footer: opcode, length 20, summary start, summary offset start, CRC; then magic.
    if total < 8 + 29 + 8 || !finished {
        return Ok(None);
    }
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let footer_at = total - 8 - 29;
    f.seek(SeekFrom::Start(footer_at))
        .map_err(|e| e.to_string())?;
    let mut footer = [0u8; 29];
    f.read_exact(&mut footer).map_err(|e| e.to_string())?;
    if footer[0] != OP_FOOTER || footer[1..9] != 20u64.to_le_bytes() {
        return Err(format!(
            "no Footer record at byte offset {footer_at}, where a finished file has it: corrupt"
        ));
    }
    let summary_start = u64::from_le_bytes(footer[9..17].try_into().expect("8"));
    let offsets_start = u64::from_le_bytes(footer[17..25].try_into().expect("8"));
    if summary_start == 0 {
        return Ok(None);
    }
    let summary_end = if offsets_start > summary_start {
        offsets_start
    } else {
        footer_at
    };
    if summary_start > summary_end || summary_end > footer_at {
        return Err(format!(
            "the Footer's summary ({summary_start} to {summary_end}) is not between the data and the Footer at {footer_at}: corrupt"
        ));
    }
    let mut summary = vec![0u8; (summary_end - summary_start) as usize];
    f.seek(SeekFrom::Start(summary_start))
        .map_err(|e| e.to_string())?;
    f.read_exact(&mut summary).map_err(|e| e.to_string())?;
    let mut at = 0usize;
    while summary.len() - at >= 9 {
        let op = summary[at];
        let len = u64::from_le_bytes(summary[at + 1..at + 9].try_into().expect("8"));
        let Some(stop) = usize::try_from(len)
            .ok()
            .and_then(|l| (at + 9).checked_add(l))
            .filter(|s| *s <= summary.len())
        else {
            return Err(format!(
                "summary record at byte offset {} overruns the summary: corrupt",
                summary_start + at as u64
            ));
        };
        if op == OP_STATISTICS {
            return match mcap::parse_record(op, &summary[at + 9..stop]) {
                Ok(Record::Statistics(s)) => Ok(Some((summary_start + at as u64, s.message_count))),
                _ => Err(format!(
                    "corrupt Statistics record at byte offset {}",
                    summary_start + at as u64
                )),
            };
        }
        at = stop;
    }
    Ok(None)
}

/// Reads until `buf` is full or the reader ends; returns how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
