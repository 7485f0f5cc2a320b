//! Reading MCAP files front to back, one record at a time, with the byte offset of every
//! message: the source offset lineage keeps for each frame.
//!
//! The record framing (opcode, length, body) is read here so offsets are exact and
//! memory stays bounded (one chunk at a time); record bodies are parsed by the `mcap`
//! crate. Chunks compressed with zstd or lz4 are decompressed; files without a summary
//! or footer (unindexed, or cut short at a record boundary) are read up to where they
//! end. A record cut short or a body that does not parse is an error naming the byte
//! offset, and so is a checksum that does not match: every chunk's CRC of its records
//! (`uncompressed_crc`) and the data section's (`DataEnd.data_section_crc`), where the
//! writer set them (0 means none).

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use mcap::records::Record;

const MAGIC: &[u8; 8] = b"\x89MCAP0\r\n";
const OP_FOOTER: u8 = 0x02;
const OP_SCHEMA: u8 = 0x03;
const OP_CHANNEL: u8 = 0x04;
const OP_MESSAGE: u8 = 0x05;
const OP_CHUNK: u8 = 0x06;
const OP_DATA_END: u8 = 0x0F;

/// A channel as its records declared it.
#[derive(Debug, Clone, Default)]
pub struct ChannelInfo {
    pub topic: String,
    pub message_encoding: String,
    pub schema_name: String,
    pub schema_encoding: String,
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
    schemas: HashMap<u16, (String, String)>,
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
            Record::Schema { header, .. } => {
                self.schemas
                    .insert(header.id, (header.name, header.encoding));
            }
            Record::Channel(c) => {
                let (schema_name, schema_encoding) =
                    self.schemas.get(&c.schema_id).cloned().unwrap_or_default();
                self.channels.insert(
                    c.id,
                    ChannelInfo {
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

fn decompress(compression: &str, data: &[u8], size: u64) -> Result<Vec<u8>, String> {
    match compression {
        "" => Ok(data.to_vec()),
        "zstd" => zstd::bulk::decompress(data, size as usize).map_err(|e| format!("zstd: {e}")),
        "lz4" => {
            let mut out = Vec::with_capacity(size as usize);
            lz4::Decoder::new(data)
                .and_then(|mut d| d.read_to_end(&mut out))
                .map_err(|e| format!("lz4: {e}"))?;
            Ok(out)
        }
        other => Err(format!("unsupported chunk compression `{other}`")),
    }
}

/// Reads `path` front to back, calling `on_message` for every message in file order.
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
        match read_full(&mut r, &mut head) {
            Ok(0) => break, // ends at a record boundary: no footer
            Ok(9) => {}
            Ok(_) => return Err(fail(pos, "truncated record header".into())),
            Err(e) => return Err(fail(pos, e.to_string())),
        }
        let op = head[0];
        let len = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        if len > total.saturating_sub(pos + 9) {
            return Err(fail(
                pos,
                format!(
                    "truncated record (opcode 0x{op:02x} needs {len} bytes; the file ends first)"
                ),
            ));
        }
        // Messages never follow the data section: the summary is not needed.
        if op == OP_FOOTER {
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
            break;
        }
        body.resize(len as usize, 0);
        r.read_exact(&mut body)
            .map_err(|e| fail(pos, format!("truncated record: {e}")))?;
        section.update(&head);
        section.update(&body);
        if op == OP_CHUNK {
            let Record::Chunk { header, data } = mcap::parse_record(op, &body)
                .map_err(|e| fail(pos, format!("corrupt chunk: {e}")))?
            else {
                return Err(fail(pos, "corrupt chunk".into()));
            };
            let records = decompress(&header.compression, &data, header.uncompressed_size)
                .map_err(|e| fail(pos, e))?;
            let crc = crc32fast::hash(&records);
            if header.uncompressed_crc != 0 && header.uncompressed_crc != crc {
                return Err(fail(
                    pos,
                    format!(
                        "chunk CRC mismatch (the chunk says {:08x}, its records give {crc:08x}): the file is corrupt",
                        header.uncompressed_crc
                    ),
                ));
            }
            let mut at = 0usize;
            while at < records.len() {
                if records.len() - at < 9 {
                    return Err(fail(
                        pos,
                        format!("corrupt chunk: record header cut at {at}"),
                    ));
                }
                let iop = records[at];
                let ilen = u64::from_le_bytes(records[at + 1..at + 9].try_into().expect("8"));
                let start = at + 9;
                let stop = start
                    .checked_add(ilen as usize)
                    .filter(|s| *s <= records.len())
                    .ok_or_else(|| {
                        fail(pos, format!("corrupt chunk: record at {at} overruns it"))
                    })?;
                state
                    .record(
                        iop,
                        &records[start..stop],
                        pos,
                        Some(at as u64),
                        on_message,
                        &mut end.messages,
                    )
                    .map_err(|e| fail(pos, e))?;
                at = stop;
            }
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
