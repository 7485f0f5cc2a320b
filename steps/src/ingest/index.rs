//! The message index (`index/messages.parquet`): every message of every log read to the
//! end, and per-channel statistics for the values.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder, UInt64Builder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;

/// One row of the message index: file, topic, schema name and encoding, message
/// encoding, log time, size, offset, chunk offset, JSON text.
pub(super) type IndexRow = (
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
pub(super) struct IndexWriter {
    path: PathBuf,
    writer: ArrowWriter<std::fs::File>,
    pub(super) rows: Vec<IndexRow>,
}

pub(super) fn index_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("topic", DataType::Utf8, false),
        Field::new("schema_name", DataType::Utf8, false),
        Field::new("schema_encoding", DataType::Utf8, false),
        Field::new("message_encoding", DataType::Utf8, false),
        Field::new("log_time_ns", DataType::UInt64, false),
        Field::new("size", DataType::UInt64, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("chunk_offset", DataType::UInt64, true),
        Field::new("json", DataType::Utf8, true),
    ]))
}

impl IndexWriter {
    pub(super) fn create(path: &Path) -> anyhow::Result<IndexWriter> {
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
    pub(super) fn close(mut self) -> anyhow::Result<PathBuf> {
        self.flush()?;
        self.writer.close()?;
        Ok(self.path)
    }

    /// Appends the rows of another index file (one log's, once it was read to the end).
    pub(super) fn append(&mut self, part: &Path) -> anyhow::Result<()> {
        self.flush()?;
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(part)?)?.build()?;
        for batch in reader {
            self.writer.write(&batch?)?;
        }
        Ok(())
    }

    pub(super) fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let mut s: Vec<StringBuilder> = (0..5).map(|_| StringBuilder::new()).collect();
        let mut i: Vec<UInt64Builder> = (0..4).map(|_| UInt64Builder::new()).collect();
        let mut j = StringBuilder::new();
        for (file, topic, sn, se, me, lt, size, off, coff, json) in self.rows.drain(..) {
            for (b, v) in s.iter_mut().zip([file, topic, sn, se, me]) {
                b.append_value(v);
            }
            i[0].append_value(lt);
            i[1].append_value(size);
            i[2].append_value(off);
            i[3].append_option(coff);
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
pub(super) struct ChannelStats {
    pub(super) messages: u64,
    pub(super) bytes: u64,
    pub(super) first_ns: u64,
    pub(super) last_ns: u64,
    pub(super) encoding: String,
    pub(super) schema: String,
}
