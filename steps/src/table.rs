//! Small helpers over Parquet tables shared by the steps: running a query over files,
//! rows as JSON objects, writing rows back.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBuilder, Float64Array, Float64Builder, Int64Array,
    Int64Builder, StringArray, StringBuilder, StringViewArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use serde_json::{Map, Value};

/// A session with `tables` registered (name, file or directory of Parquet files).
pub async fn session(tables: &[(&str, &Path)]) -> anyhow::Result<SessionContext> {
    let config = SessionConfig::new()
        .set_bool(
            "datafusion.execution.listing_table_ignore_subdirectory",
            false,
        )
        .with_target_partitions(2);
    let ctx = SessionContext::new_with_config(config);
    for (name, path) in tables {
        let mut url = path.display().to_string();
        if path.is_dir() {
            url.push('/');
        }
        ctx.register_parquet(*name, &url, ParquetReadOptions::default())
            .await?;
    }
    Ok(ctx)
}

/// Every row of the result of `sql` as a JSON object (strings, numbers, booleans, null).
pub async fn rows(ctx: &SessionContext, sql: &str) -> anyhow::Result<Vec<Map<String, Value>>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut out = Vec::new();
    for b in &batches {
        for r in 0..b.num_rows() {
            let mut row = Map::new();
            for (f, col) in b.schema().fields().iter().zip(b.columns()) {
                row.insert(f.name().clone(), cell(col, r));
            }
            out.push(row);
        }
    }
    Ok(out)
}

fn cell(col: &ArrayRef, r: usize) -> Value {
    if col.is_null(r) {
        return Value::Null;
    }
    let any = col.as_any();
    if let Some(a) = any.downcast_ref::<Float64Array>() {
        return serde_json::Number::from_f64(a.value(r))
            .map(Value::Number)
            .unwrap_or(Value::Null);
    }
    if let Some(a) = any.downcast_ref::<Int64Array>() {
        return Value::from(a.value(r));
    }
    if let Some(a) = any.downcast_ref::<UInt64Array>() {
        return Value::from(a.value(r));
    }
    if let Some(a) = any.downcast_ref::<BooleanArray>() {
        return Value::Bool(a.value(r));
    }
    if let Some(a) = any.downcast_ref::<StringArray>() {
        return Value::String(a.value(r).to_owned());
    }
    if let Some(a) = any.downcast_ref::<StringViewArray>() {
        return Value::String(a.value(r).to_owned());
    }
    // Any other type as Arrow prints it, never a made-up null.
    datafusion::arrow::util::display::array_value_to_string(col, r)
        .map(Value::String)
        .unwrap_or(Value::Null)
}

/// Writes rows (JSON objects) as a Parquet file with `columns` (name, type) in order.
pub fn write_rows<S: AsRef<str>>(
    path: &Path,
    columns: &[(S, DataType)],
    rows: &[Map<String, Value>],
) -> anyhow::Result<()> {
    let schema: SchemaRef = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, t)| Field::new(n.as_ref(), t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (name, t) in columns {
        let get = |r: &Map<String, Value>| r.get(name.as_ref()).cloned().unwrap_or(Value::Null);
        let a: ArrayRef = match t {
            DataType::Float64 => {
                let mut b = Float64Builder::new();
                rows.iter().for_each(|r| b.append_option(get(r).as_f64()));
                Arc::new(b.finish())
            }
            DataType::Int64 => {
                let mut b = Int64Builder::new();
                rows.iter().for_each(|r| b.append_option(get(r).as_i64()));
                Arc::new(b.finish())
            }
            DataType::Boolean => {
                let mut b = BooleanBuilder::new();
                rows.iter().for_each(|r| b.append_option(get(r).as_bool()));
                Arc::new(b.finish())
            }
            _ => {
                let mut b = StringBuilder::new();
                rows.iter()
                    .for_each(|r| b.append_option(get(r).as_str().map(str::to_owned)));
                Arc::new(b.finish())
            }
        };
        arrays.push(a);
    }
    let batch = RecordBatch::try_new(schema.clone(), arrays)?;
    let mut w = ArrowWriter::try_new(std::fs::File::create(path)?, schema, None)?;
    if batch.num_rows() > 0 {
        w.write(&batch)?;
    }
    w.close()?;
    Ok(())
}

/// The (name, type) columns of a frame-shaped row set: the frame table's, plus extras.
pub fn frame_columns(extra: &[(&'static str, DataType)]) -> Vec<(String, DataType)> {
    let mut cols: Vec<(String, DataType)> = crate::ingest::frame_schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    cols.extend(extra.iter().map(|(n, t)| ((*n).to_owned(), t.clone())));
    cols
}

/// The rows of one split of a dataset directory.
pub(crate) async fn split(
    dataset: &std::path::Path,
    name: &str,
) -> anyhow::Result<Vec<serde_json::Map<String, serde_json::Value>>> {
    let file = dataset.join(format!("{name}.parquet"));
    if !file.exists() {
        anyhow::bail!(
            "the dataset has no {name} split ({} is missing)",
            file.display()
        );
    }
    let ctx = session(&[("d", &file)]).await?;
    rows(&ctx, "SELECT * FROM d ORDER BY drive, ts").await
}
