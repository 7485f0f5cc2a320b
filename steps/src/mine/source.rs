//! The frame table as a DataFusion table read one row group after another, in an order
//! mining chose, by a reader of our own.
//!
//! DataFusion's listing table keeps, for the life of a query, statistics of every file it
//! lists and metrics of every file it opens (each with the file's name): mining 10,000
//! drive partitions held 599 MiB, about 44 KB a file, most of it those metrics. Here one
//! file is open at a time per partition and nothing is kept of it once read, so memory
//! does not grow with the number of files. Only the columns a query names are read.

use std::sync::Arc;

use datafusion::arrow::array::{new_null_array, ArrayRef};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{Session, TableProvider};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::col;

use super::files::Units;

/// Rows a batch holds at most.
const BATCH_ROWS: usize = 8_192;

/// A table of Parquet row groups: each partition reads its units in order. `sorted`: each
/// partition's rows are in (drive, ts) order, and DataFusion is told so.
#[derive(Debug)]
pub(super) struct FileTable {
    schema: SchemaRef,
    partitions: Vec<Arc<Units>>,
    sorted: bool,
}

impl FileTable {
    pub fn new(schema: SchemaRef, partitions: Vec<Units>, sorted: bool) -> Self {
        Self {
            schema,
            partitions: partitions.into_iter().map(Arc::new).collect(),
            sorted,
        }
    }

    pub fn sorted(&self) -> bool {
        self.sorted
    }
}

#[async_trait::async_trait]
impl TableProvider for FileTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let streams: Vec<Arc<dyn PartitionStream>> = (self.partitions.iter())
            .map(|units| {
                Arc::new(Reader {
                    schema: schema.clone(),
                    units: units.clone(),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        // The order holds for what the projection keeps of (drive, ts), from the left.
        let order: Vec<_> = ["drive", "ts"]
            .into_iter()
            .take_while(|c| self.sorted && schema.field_with_name(c).is_ok())
            .map(|c| col(c).sort(true, false))
            .collect();
        StreamingTable::try_new(schema, streams)?
            .with_sort_order(order)
            .scan(state, None, filters, limit)
            .await
    }
}

/// One partition: its units' rows, in the columns of `schema`.
#[derive(Debug)]
struct Reader {
    schema: SchemaRef,
    units: Arc<Units>,
}

impl PartitionStream for Reader {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The units are read and decoded on a blocking thread, a few batches ahead of the
    /// query (the async reader's many small reads cost 10–19 % of mining's time on one
    /// large file); the thread stops when the query drops the stream. A file that fails
    /// (or panics the reader) ends the stream with an error naming it.
    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (schema, units) = (self.schema.clone(), self.units.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD);
        tokio::task::spawn_blocking(move || {
            for (path, groups) in units.iter() {
                // A panic of the reader is an error of the stream, never its quiet end.
                let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    read(path, groups, &schema, &tx)
                }))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the Parquet reader panicked")));
                if let Err(e) = read {
                    let e = DataFusionError::Execution(format!("reading {}: {e}", path.display()));
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        let batches = futures::stream::unfold(rx, |mut rx| async {
            rx.recv().await.map(|batch| (batch, rx))
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches))
    }
}

/// Batches read ahead of the query, per partition.
const READ_AHEAD: usize = 2;

/// Sends the rows of row groups `groups` of the file at `path` to `tx`, in the columns of
/// `schema`: those the file has (cast where its type differs), the others null.
fn read(
    path: &std::path::Path,
    groups: &[usize],
    schema: &SchemaRef,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> anyhow::Result<()> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?)?;
    let parquet = builder.parquet_schema();
    let roots = (parquet.root_schema().get_fields().iter().enumerate())
        .filter(|(_, f)| schema.field_with_name(f.name()).is_ok())
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    let mask = ProjectionMask::roots(parquet, roots);
    let reader = builder
        .with_projection(mask)
        .with_row_groups(groups.to_vec())
        .with_batch_size(BATCH_ROWS)
        .build()?;
    for batch in reader {
        if tx.blocking_send(Ok(conform(&batch?, schema)?)).is_err() {
            break; // the query is done with this partition
        }
    }
    Ok(())
}

/// `batch` in the columns of `schema`, by name.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = (schema.fields().iter())
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => Ok(datafusion::arrow::compute::cast(c, f.data_type())?),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    let options = datafusion::arrow::record_batch::RecordBatchOptions::new()
        .with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &options,
    )?)
}
