//! TuSimple lane labels (`label_data_*.json`) to `lanes/tusimple.parquet`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Int64Builder, ListBuilder, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use serde_json::Value;

pub(super) fn ingest_tusimple(files: &[PathBuf], out: &Path) -> anyhow::Result<u64> {
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
