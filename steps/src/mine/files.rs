//! The frame table's files as mining reads them: each file's footer summarised, the
//! table's order (declared, checked or neither), and where to cut it into ranges of drives.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::ArrowReaderMetadata;

/// The frame table as mining reads it: what it needs of each file, the schema of them
/// all, and their rows.
pub(super) struct Table {
    pub files: Vec<Summary>,
    pub schema: SchemaRef,
    pub rows: i64,
}

/// What mining needs of a file's footer, kept instead of the footer: memory that does not
/// grow with its columns and statistics (all footers of 10,000 drive partitions held at
/// once were most of mining's memory).
#[derive(Debug)]
pub(super) struct Summary {
    pub path: std::path::PathBuf,
    /// Its footer says it is sorted by drive and time.
    declared: bool,
    pub groups: Vec<Group>,
}

/// A row group, as its statistics say.
#[derive(Debug)]
pub(super) struct Group {
    /// Its smallest and largest drive.
    drives: Option<(String, String)>,
    /// Its earliest and latest time.
    ts: Option<(f64, f64)>,
    rows: i64,
}

/// Reads the footers of the table's files, one at a time (each summarised and dropped),
/// and their schemas merged: every column of any file, each nullable (a file without it
/// gives nulls).
pub(super) fn table(frames: &std::path::Path) -> anyhow::Result<Table> {
    let (mut files, mut schema) = (Vec::new(), Schema::empty());
    for path in parquet_files(frames)? {
        let meta = ArrowReaderMetadata::load(&std::fs::File::open(&path)?, Default::default())
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let own = meta.schema();
        if own
            .fields()
            .iter()
            .any(|f| schema.field_with_name(f.name()).is_err())
        {
            let nullable = own
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true));
            schema = Schema::try_merge([schema, Schema::new(nullable.collect::<Vec<_>>())])
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        files.push(summary(path, &meta));
    }
    if files.is_empty() {
        anyhow::bail!(
            "no Parquet files under {}: the frame table is empty",
            frames.display()
        );
    }
    let rows = files.iter().flat_map(|f| &f.groups).map(|g| g.rows).sum();
    Ok(Table {
        schema: Arc::new(schema),
        files,
        rows,
    })
}

/// What mining keeps of the footer `meta` of the file at `path`.
fn summary(path: std::path::PathBuf, meta: &ArrowReaderMetadata) -> Summary {
    use datafusion::parquet::file::statistics::Statistics;
    let md = meta.metadata();
    let declared = md
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .any(|kv| kv.key == crate::ingest::SORTED_BY && kv.value.as_deref() == Some("drive,ts"));
    let schema = md.file_metadata().schema_descr();
    let column = |name: &str| schema.columns().iter().position(|c| c.name() == name);
    let (d, t) = (column("drive"), column("ts"));
    let groups = md
        .row_groups()
        .iter()
        .map(|rg| {
            let drives = match d.and_then(|d| rg.column(d).statistics()) {
                Some(Statistics::ByteArray(s)) => {
                    let text = |b: Option<&datafusion::parquet::data_type::ByteArray>| {
                        b.and_then(|b| b.as_utf8().ok()).map(str::to_owned)
                    };
                    text(s.min_opt()).zip(text(s.max_opt()))
                }
                _ => None,
            };
            let ts = match t.and_then(|t| rg.column(t).statistics()) {
                Some(Statistics::Double(s)) => s.min_opt().copied().zip(s.max_opt().copied()),
                _ => None,
            };
            Group {
                drives,
                ts,
                rows: rg.num_rows(),
            }
        })
        .collect();
    Summary {
        path,
        declared,
        groups,
    }
}

/// How the frame table of `files` is ordered: `declared` when every file says in its
/// footer that it is sorted by drive and time as a whole ([`crate::ingest::SORTED_BY`], as
/// `ingest` writes them), `checked` when reading every file's `drive` and `ts` columns
/// found each file in that order, else `unsorted`. The summaries come back for the caller.
pub(super) async fn table_order(
    files: Vec<Summary>,
) -> anyhow::Result<(&'static str, Vec<Summary>)> {
    if files.is_empty() {
        return Ok(("unsorted", files));
    }
    if files.iter().all(|f| f.declared) {
        return Ok(("declared", files));
    }
    let (checked, files) =
        tokio::task::spawn_blocking(move || files_in_order(&files).map(|ok| (ok, files))).await??;
    Ok((if checked { "checked" } else { "unsorted" }, files))
}

/// Puts files, each sorted by (drive, ts), in the order that makes the whole table so:
/// by their first drive (then their path, for the parts of one drive). False when the
/// statistics of the row groups where they meet do not show that each file ends before
/// the next begins (a drive in two files whose times overlap, files of interleaved
/// drives, no statistics): then only a sort orders the table.
pub(super) fn chain(files: &mut [Summary]) -> bool {
    files.sort_by_cached_key(|f| (ends(f).map(|e| e.0 .0.to_owned()), f.path.clone()));
    let ends: Option<Vec<Ends>> = (files.iter())
        .filter(|f| f.groups.iter().any(|g| g.rows > 0))
        .map(ends)
        .collect();
    let Some(ends) = ends else {
        return false;
    };
    ends.windows(2).all(|w| {
        let ((_, (last, end)), ((first, start), _)) = (w[0], w[1]);
        last < first || (last == first && end <= start)
    })
}

/// Where a file's rows begin and end: its first row group's smallest drive and earliest
/// time, its last row group's largest drive and latest time (bounds of its first and last
/// rows, the file being sorted).
type Ends<'a> = ((&'a str, f64), (&'a str, f64));

/// The [`Ends`] of `f` (its row groups with rows), from their statistics; None where one
/// has none.
fn ends(f: &Summary) -> Option<Ends<'_>> {
    let mut groups = f.groups.iter().filter(|g| g.rows > 0);
    let head = groups.next()?;
    let tail = groups.next_back().unwrap_or(head);
    let ((first, _), (start, _)) = (head.drives.as_ref()?, head.ts?);
    let ((_, last), (_, end)) = (tail.drives.as_ref()?, tail.ts?);
    Some(((first.as_str(), start), (last.as_str(), end)))
}

/// A range of drives, `[from, to)`, open where `None`.
pub(super) type Range = (Option<String>, Option<String>);

/// The `[from, to)` drive ranges `cuts` make, in order; one open range without cuts.
pub(super) fn ranges(cuts: &[String]) -> Vec<Range> {
    let mut bounds: Vec<Option<String>> = vec![None];
    bounds.extend(cuts.iter().cloned().map(Some));
    bounds.push(None);
    bounds
        .windows(2)
        .map(|w| (w[0].clone(), w[1].clone()))
        .collect()
}

/// Drive names that cut a table sorted by drive into up to `parts` ranges of about equal
/// rows, from the row groups' statistics (the first drive of the row group each range
/// starts at). Any cut is correct (each range reads every row group holding its drives,
/// and keeps only their rows); the statistics only balance the ranges.
pub(super) fn drive_cuts(files: &[Summary], parts: usize) -> Vec<String> {
    if parts < 2 {
        return Vec::new();
    }
    let mut groups: Vec<(&str, i64)> = Vec::new();
    for g in files.iter().flat_map(|f| &f.groups) {
        let Some((min, _)) = &g.drives else {
            return Vec::new();
        };
        groups.push((min, g.rows));
    }
    groups.sort();
    let total: i64 = groups.iter().map(|g| g.1).sum();
    let first = groups.first().map(|g| g.0);
    let mut cuts: Vec<String> = Vec::new();
    let mut seen = 0i64;
    for &(min, rows) in &groups {
        let due = total * (cuts.len() as i64 + 1) / parts as i64;
        if seen >= due
            && cuts.len() + 1 < parts
            && Some(min) != first
            && cuts.last().map(String::as_str) != Some(min)
        {
            cuts.push(min.to_owned());
        }
        seen += rows;
    }
    cuts
}

/// Row groups to read, in order: each file with the indexes of its row groups.
pub(super) type Units = Vec<(std::path::PathBuf, Vec<usize>)>;

/// The row groups of chained `files` that may hold a drive of `range` (`[from, to)`, open
/// where `None`), in order.
pub(super) fn units_in(files: &[Summary], range: &Range) -> Units {
    let (from, to) = (range.0.as_deref(), range.1.as_deref());
    files
        .iter()
        .filter_map(|f| {
            let groups: Vec<usize> = (f.groups.iter().enumerate())
                .filter(|(_, g)| match &g.drives {
                    Some((min, max)) => {
                        to.is_none_or(|to| min.as_str() < to)
                            && from.is_none_or(|from| max.as_str() >= from)
                    }
                    None => true,
                })
                .map(|(i, _)| i)
                .collect();
            (!groups.is_empty()).then(|| (f.path.clone(), groups))
        })
        .collect()
}

/// Every row group of `files`, dealt into up to `parts` runs of about equal rows.
pub(super) fn spread(files: &[Summary], parts: usize) -> Vec<Units> {
    let total: i64 = files.iter().flat_map(|f| &f.groups).map(|g| g.rows).sum();
    let mut out: Vec<Units> = vec![Vec::new(); parts.max(1)];
    let mut seen = 0i64;
    for f in files {
        for (i, g) in f.groups.iter().enumerate() {
            let part = match total {
                0 => 0,
                _ => ((seen * out.len() as i64) / total) as usize,
            };
            let units = &mut out[part.min(parts.max(1) - 1)];
            match units.last_mut() {
                Some((path, groups)) if *path == f.path => groups.push(i),
                _ => units.push((f.path.clone(), vec![i])),
            }
            seen += g.rows;
        }
    }
    out.retain(|u| !u.is_empty());
    if out.is_empty() {
        out.push(Vec::new()); // files without row groups: one partition of nothing
    }
    out
}

/// A row's sort key: (drive, ts).
type Key = (String, f64);

/// The first and last key of row group `rg` of `file`, or None when its rows are not in
/// (`drive`, `ts`) order. Reads only those two columns; a missing column, another type,
/// a null or a NaN time counts as not in order.
fn row_group_ends(
    file: &std::path::Path,
    meta: &ArrowReaderMetadata,
    rg: usize,
) -> anyhow::Result<Option<(Key, Key)>> {
    use datafusion::arrow::array::{Array, Float64Array, StringArray};
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use datafusion::parquet::arrow::ProjectionMask;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
        std::fs::File::open(file)?,
        meta.clone(),
    );
    let schema = builder.parquet_schema();
    let column = |name: &str| schema.columns().iter().position(|c| c.name() == name);
    let (Some(d), Some(t)) = (column("drive"), column("ts")) else {
        return Ok(None);
    };
    let mask = ProjectionMask::leaves(schema, [d, t]);
    let reader = builder
        .with_projection(mask)
        .with_row_groups(vec![rg])
        .with_batch_size(65_536)
        .build()?;
    let mut ends: Option<(Key, Key)> = None;
    for batch in reader {
        let batch = batch?;
        let (Some(drive), Some(ts)) = (
            batch
                .column_by_name("drive")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>()),
            batch
                .column_by_name("ts")
                .and_then(|c| c.as_any().downcast_ref::<Float64Array>()),
        ) else {
            return Ok(None);
        };
        let n = batch.num_rows();
        if n == 0 {
            continue;
        }
        if drive.null_count() > 0 || ts.null_count() > 0 {
            return Ok(None);
        }
        let key = |r: usize| (drive.value(r), ts.value(r));
        if let Some((_, last)) = &ends {
            if (last.0.as_str(), last.1) > key(0) {
                return Ok(None);
            }
        }
        for r in 0..n {
            if ts.value(r).is_nan() || (r > 0 && key(r - 1) > key(r)) {
                return Ok(None);
            }
        }
        let last = (drive.value(n - 1).to_owned(), ts.value(n - 1));
        ends = Some(match ends {
            Some((first, _)) => (first, last),
            None => ((drive.value(0).to_owned(), ts.value(0)), last),
        });
    }
    Ok(ends)
}

/// Whether each file is sorted by (`drive`, `ts`): every row group in order, on two
/// threads, and each following the one before it.
fn files_in_order(files: &[Summary]) -> anyhow::Result<bool> {
    let units: Vec<(usize, usize)> = files
        .iter()
        .enumerate()
        .flat_map(|(i, f)| (0..f.groups.len()).map(move |rg| (i, rg)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    type Ends = Option<(Key, Key)>;
    let ends: std::sync::Mutex<Vec<Option<Ends>>> = std::sync::Mutex::new(vec![None; units.len()]);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    // The footer of the file this worker reads, loaded once per file.
                    let mut footer: Option<(usize, ArrowReaderMetadata)> = None;
                    loop {
                        let u = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(file, rg)) = units.get(u) else {
                            return Ok(());
                        };
                        let path = &files[file].path;
                        if footer.as_ref().is_none_or(|(f, _)| *f != file) {
                            let f = std::fs::File::open(path)?;
                            footer =
                                Some((file, ArrowReaderMetadata::load(&f, Default::default())?));
                        }
                        let meta = &footer.as_ref().expect("loaded above").1;
                        let r = row_group_ends(path, meta, rg)
                            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
                        ends.lock().unwrap_or_else(|e| e.into_inner())[u] = Some(r);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("the order check panicked"))??;
        }
        Ok(())
    })?;
    let ends = ends.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut last: Option<(usize, Key)> = None;
    for (&(file, _), end) in units.iter().zip(ends) {
        // A row group out of order, or (conservatively) an empty one.
        let Some(Some((first, end))) = end else {
            return Ok(false);
        };
        if let Some((f, prev)) = &last {
            if *f == file && (prev.0.as_str(), prev.1) > (first.0.as_str(), first.1) {
                return Ok(false);
            }
        }
        last = Some((file, end));
    }
    Ok(true)
}

/// The Parquet files of a table directory (hidden ones aside, as DataFusion lists them).
fn parquet_files(frames: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
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
            } else if name.ends_with(".parquet") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use datafusion::arrow::datatypes::DataType;
    use datafusion::parquet::arrow::ArrowWriter;

    fn summaries(files: &[&std::path::PathBuf]) -> Vec<Summary> {
        (files.iter())
            .map(|f| {
                let file = std::fs::File::open(f).unwrap();
                summary(
                    f.to_path_buf(),
                    &ArrowReaderMetadata::load(&file, Default::default()).unwrap(),
                )
            })
            .collect()
    }

    /// A Parquet file of (drive, ts) rows, two rows per row group.
    pub(in crate::mine) fn table(
        dir: &std::path::Path,
        name: &str,
        rows: &[(&str, f64)],
    ) -> std::path::PathBuf {
        table_of(dir, name, rows, false)
    }

    /// [`table`], its footer saying it is sorted (as `ingest` writes it) where `declared`.
    pub(in crate::mine) fn table_of(
        dir: &std::path::Path,
        name: &str,
        rows: &[(&str, f64)],
        declared: bool,
    ) -> std::path::PathBuf {
        use datafusion::arrow::array::{Float64Array, StringArray};
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::arrow::record_batch::RecordBatch;
        use datafusion::parquet::file::properties::WriterProperties;
        let schema = Arc::new(Schema::new(vec![
            Field::new("drive", DataType::Utf8, false),
            Field::new("ts", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap();
        let path = dir.join(name);
        let sorted = datafusion::parquet::file::metadata::KeyValue::new(
            crate::ingest::SORTED_BY.to_owned(),
            "drive,ts".to_owned(),
        );
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .set_key_value_metadata(declared.then(|| vec![sorted]))
            .build();
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props))
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    }

    #[test]
    fn order_is_checked_within_and_across_row_groups() {
        let dir = std::env::temp_dir().join(format!("dt-mine-order-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sorted = table(
            &dir,
            "sorted.parquet",
            &[("a", 1.0), ("a", 2.0), ("a", 2.0), ("b", 0.0), ("c", 5.0)],
        );
        // Each row group in order, the second starting before the first ended.
        let across = table(
            &dir,
            "across.parquet",
            &[("a", 1.0), ("a", 2.0), ("a", 1.5), ("a", 3.0)],
        );
        let within = table(&dir, "within.parquet", &[("a", 2.0), ("a", 1.0)]);
        let nan = table(&dir, "nan.parquet", &[("a", 1.0), ("a", f64::NAN)]);
        let in_order = |files: &[&std::path::PathBuf]| files_in_order(&summaries(files)).unwrap();
        assert!(in_order(&[&sorted]));
        assert!(!in_order(&[&across]));
        assert!(!in_order(&[&within]));
        assert!(!in_order(&[&nan]));
        // Files are ordered among themselves by DataFusion: each only needs its own order.
        let other = table(&dir, "other.parquet", &[("0", 9.0), ("0", 10.0)]);
        assert!(in_order(&[&sorted, &other]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_chain_when_each_ends_before_the_next_begins() {
        let dir = std::env::temp_dir().join(format!("dt-mine-chain-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let chained = |files: &[&std::path::PathBuf]| {
            let mut files = summaries(files);
            let ok = chain(&mut files);
            let names: Vec<_> = (files.iter())
                .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            (ok, names.join(" "))
        };
        // Drive partitions, listed in any order: by their drives.
        let b = table(&dir, "1.parquet", &[("b", 0.0), ("b", 1.0), ("b", 2.0)]);
        let a = table(&dir, "2.parquet", &[("a", 5.0), ("a", 6.0)]);
        let c = table(&dir, "0.parquet", &[("c", 0.0)]);
        assert_eq!(
            chained(&[&b, &a, &c]),
            (true, "2.parquet 1.parquet 0.parquet".into())
        );
        // Two parts of one drive, by their times; then one more drive in the later part.
        let early = table(&dir, "p0.parquet", &[("d", 0.0), ("d", 1.0)]);
        let late = table(&dir, "p1.parquet", &[("d", 1.0), ("d", 2.0), ("e", 0.0)]);
        assert!(chained(&[&late, &c, &early]).0);
        // Parts of one drive whose times overlap, and files of interleaved drives, do not.
        let overlap = table(&dir, "p2.parquet", &[("d", 0.5), ("d", 3.0)]);
        assert!(!chained(&[&early, &overlap]).0);
        let ac = table(&dir, "ac.parquet", &[("a", 0.0), ("c", 0.0)]);
        assert!(!chained(&[&ac, &b]).0);
        // Row groups are read where they may hold a drive of a range.
        let files = summaries(&[&a, &b, &late]);
        let range = (Some("b".to_owned()), Some("e".to_owned()));
        let units: Vec<_> = (units_in(&files, &range).into_iter())
            .map(|(p, g)| (p.file_name().unwrap().to_string_lossy().into_owned(), g))
            .collect();
        // (`p1`'s second row group holds only `e`.)
        assert_eq!(
            units,
            [
                ("1.parquet".into(), vec![0, 1]),
                ("p1.parquet".into(), vec![0])
            ]
        );
        // Unsorted, every row group once, in runs of about equal rows.
        let parts = spread(&files, 2);
        let count = |p: &Units| p.iter().map(|u| u.1.len()).sum::<usize>();
        assert_eq!((parts.len(), count(&parts[0]) + count(&parts[1])), (2, 5));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
