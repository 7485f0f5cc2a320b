//! `mine-corner-cases`: named rules, each a SQL boolean expression over the frame table
//! (window functions included), evaluated by DataFusion.
//!
//! Output `corner_cases/corner_cases.parquet`: every frame that matched at least one
//! rule, ordered by drive and time, with the frame's columns, one boolean column
//! `rule_<name>` per rule and `rules`, the names of the rules it matched joined by commas.
//! `values.json`: `{frames, matched, rules: {name: count}, sorted_input}`. A frame table
//! whose files say they are sorted by drive and time (as `ingest` writes them) is read as
//! one ordered stream with no sort; any other is sorted, with a memory limit beyond which
//! the sort spills to disk, so memory stays bounded as the table grows.

use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::MemTable;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::metadata::ParquetMetaDataReader;
use datafusion::prelude::{col, ParquetReadOptions, SessionConfig, SessionContext};
use futures::StreamExt;
use indexmap::IndexMap;
use serde_json::{json, Value};

/// The engine's memory for one mining query; beyond it sorts spill to disk.
pub const MEMORY_LIMIT: usize = 512 << 20;

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !n.starts_with(|c: char| c.is_ascii_digit())
}

/// The query that tags frames with the rules they match.
fn query(rules: &IndexMap<String, String>) -> String {
    let tagged: Vec<String> = rules
        .iter()
        .map(|(name, sql)| format!("coalesce(({sql}), false) AS \"rule_{name}\""))
        .collect();
    let any: Vec<String> = rules.keys().map(|n| format!("\"rule_{n}\"")).collect();
    let names: Vec<String> = rules
        .keys()
        .map(|n| format!("CASE WHEN \"rule_{n}\" THEN '{n}' END"))
        .collect();
    format!(
        "SELECT *, concat_ws(',', {}) AS rules FROM (SELECT *, {} FROM frames) AS tagged WHERE {} ORDER BY drive, ts",
        names.join(", "),
        tagged.join(", "),
        any.join(" OR ")
    )
}

/// Checks every rule against the frame table's schema: it parses, names known columns,
/// and is boolean. Returns (`rules.NAME`, message) for each that does not.
pub fn check_rules(rules: &IndexMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let schema = crate::ingest::frame_schema();
    let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let ctx = SessionContext::new();
    let table = MemTable::try_new(schema, vec![vec![]]).expect("an empty table");
    ctx.register_table("frames", Arc::new(table))
        .expect("registers");
    for (name, sql) in rules {
        let at = format!("rules.{name}");
        if !valid_name(name) {
            out.push((
                at,
                format!("rule name `{name}` must be lowercase letters, digits and `_`"),
            ));
            continue;
        }
        if sql.contains("{{") {
            continue; // rendered at run time
        }
        let planned =
            futures::executor::block_on(ctx.sql(&format!("SELECT ({sql}) AS r FROM frames")));
        match planned {
            Err(e) => {
                let mut msg = e.to_string();
                // Positions refer to the wrapping query, not to the rule: drop them.
                if let Some(i) = msg.find(" at Line: ") {
                    let rest = msg[i..]
                        .find('"')
                        .map(|j| msg[i + j..].to_owned())
                        .unwrap_or_default();
                    msg = format!("{}{rest}", &msg[..i]);
                }
                let first = msg.lines().next().unwrap_or_default();
                let detail = if msg.contains("No field named") || msg.contains("not found") {
                    format!(
                        "{first}; the frame table has columns: {}",
                        columns.join(", ")
                    )
                } else {
                    first.to_owned()
                };
                out.push((at, format!("rule `{name}`: {detail}")));
            }
            Ok(df) => {
                let t = df.schema().field(0).data_type().clone();
                if t != DataType::Boolean && t != DataType::Null {
                    out.push((at, format!("rule `{name}` is {t}, not a boolean condition")));
                }
            }
        }
    }
    out
}

/// Runs the rules over the Parquet frames under `frames` and writes the matches.
pub async fn mine(
    rules: &IndexMap<String, String>,
    frames: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<Value> {
    if let Some((at, m)) = check_rules(rules).into_iter().next() {
        anyhow::bail!("{at}: {m}");
    }
    // A table sorted by drive and time, as ingest writes it, is read in that order by one
    // stream: the windows (`PARTITION BY drive ORDER BY ts`) and the output order need no
    // sort. Otherwise the frames are hashed by drive over two partitions and sorted, with
    // the sort spilling to disk beyond the memory limit.
    let sorted = declared_sorted(frames)?;
    let config = SessionConfig::new()
        .set_bool(
            "datafusion.execution.listing_table_ignore_subdirectory",
            false,
        )
        // Files are ordered among themselves by their statistics, not by their names.
        .set_bool(
            "datafusion.execution.split_file_groups_by_statistics",
            sorted,
        )
        .with_target_partitions(if sorted { 1 } else { 2 });
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(MEMORY_LIMIT, 1.0)
        .build_arc()?;
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    let url = format!("{}/", frames.display());
    let mut options = ParquetReadOptions::default();
    if sorted {
        options = options.file_sort_order(vec![vec![
            col("drive").sort(true, false),
            col("ts").sort(true, false),
        ]]);
    }
    ctx.register_parquet("frames", &url, options).await?;
    let total = ctx
        .sql("SELECT count(*) FROM frames")
        .await?
        .collect()
        .await?;
    let total = total
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .map(|a| a.value(0))
        })
        .unwrap_or(0);
    let df = ctx.sql(&query(rules)).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let mut stream = df.execute_stream().await?;
    let file = std::fs::File::create(out.join("corner_cases.parquet"))?;
    let mut writer = ArrowWriter::try_new(file, schema.clone(), None)?;
    let mut counts: IndexMap<String, u64> = rules.keys().map(|k| (k.clone(), 0)).collect();
    let mut matched = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        matched += batch.num_rows() as u64;
        for (name, n) in counts.iter_mut() {
            if let Some(col) = batch
                .column_by_name(&format!("rule_{name}"))
                .and_then(|c| c.as_any().downcast_ref::<BooleanArray>())
            {
                *n += col.true_count() as u64;
            }
        }
        writer.write(&batch)?;
    }
    writer.close()?;
    if matched == 0 {
        eprintln!("warning: no frame matched any rule");
    }
    Ok(json!({"frames": total, "matched": matched, "rules": counts, "sorted_input": sorted}))
}

/// Whether every Parquet file under `frames` says in its footer that it is sorted by
/// drive and time as a whole ([`crate::ingest::SORTED_BY`]); false for an empty table.
fn declared_sorted(frames: &std::path::Path) -> anyhow::Result<bool> {
    let mut files = 0;
    let mut dirs = vec![frames.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with(['.', '_']) {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if !name.ends_with(".parquet") {
                continue;
            }
            let meta =
                ParquetMetaDataReader::new().parse_and_finish(&std::fs::File::open(&path)?)?;
            let says = meta
                .file_metadata()
                .key_value_metadata()
                .into_iter()
                .flatten()
                .any(|kv| {
                    kv.key == crate::ingest::SORTED_BY && kv.value.as_deref() == Some("drive,ts")
                });
            if !says {
                return Ok(false);
            }
            files += 1;
        }
    }
    Ok(files > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_checked_against_the_frame_columns() {
        let mut rules = IndexMap::new();
        rules.insert("hard_brake".to_owned(), "accel_x < -4".to_owned());
        rules.insert(
            "sharp_steer".to_owned(),
            "abs(steering - lag(steering) OVER (PARTITION BY drive ORDER BY ts)) > 0.3".to_owned(),
        );
        assert!(check_rules(&rules).is_empty(), "{:?}", check_rules(&rules));
        rules.insert("typo".to_owned(), "acel_x < -4".to_owned());
        rules.insert("broken".to_owned(), "accel_x <".to_owned());
        rules.insert("numeric".to_owned(), "accel_x + 1".to_owned());
        rules.insert("Bad-Name".to_owned(), "true".to_owned());
        let errs = check_rules(&rules);
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert_eq!(errs[0].0, "rules.typo");
        assert!(
            errs[0].1.contains("acel_x") && errs[0].1.contains("columns: drive, ts"),
            "{}",
            errs[0].1
        );
        assert!(errs[1].1.starts_with("rule `broken`"), "{}", errs[1].1);
        assert!(errs[2].1.contains("not a boolean"), "{}", errs[2].1);
        assert!(errs[3].1.contains("lowercase"), "{}", errs[3].1);
    }
}
