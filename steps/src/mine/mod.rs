//! `mine-corner-cases`: named rules, each a SQL boolean expression over the frame table
//! (window functions included), evaluated by DataFusion.
//!
//! Output `corner_cases/corner_cases.parquet`: every frame that matched at least one
//! rule, ordered by drive and time, with the frame's columns, one boolean column
//! `rule_<name>` per rule and `rules`, the names of the rules it matched joined by commas.
//! `values.json`: `{frames, matched, rules: {name: count}, input_order, plan}`. A frame table
//! whose files are sorted by drive and time (`input_order: declared` when their footers
//! say so, as `ingest` writes them; `checked` when reading the two columns finds them so)
//! is read as one ordered stream with no sort (`plan: ordered`), where its files' statistics
//! show they follow each other (see [`files::chain`]). In any other (`unsorted`, or files
//! that overlap), the rules with window functions are evaluated first over only the
//! columns they name,
//! and the frames they match are joined back in one pass over all columns
//! (`plan: window keys`); past [`WINDOW_KEYS_CAP`] such frames, the whole table is sorted
//! instead (`plan: sort`). Sorts run under a memory limit beyond which they spill to disk,
//! so memory stays bounded as the table grows. The files are read by [`source::FileTable`],
//! one at a time per stream, so memory does not grow with their number either.

use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use indexmap::IndexMap;
use serde_json::{json, Value};

mod files;
mod source;

/// The engine's memory for one mining query; beyond it sorts spill to disk.
pub const MEMORY_LIMIT: usize = 512 << 20;

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !n.starts_with(|c: char| c.is_ascii_digit())
}

/// The query that tags frames with the rules they match. The rules named in `joined` are
/// read from `window_keys` (their windows computed beforehand by [`window_keys`]), joined
/// on the frame's drive and time.
fn query(rules: &IndexMap<String, String>, joined: &[String]) -> String {
    let tagged: Vec<String> = rules
        .iter()
        .map(|(name, sql)| match joined.contains(name) {
            true => format!("coalesce(k.\"w_{name}\", false) AS \"rule_{name}\""),
            false => format!("coalesce(({sql}), false) AS \"rule_{name}\""),
        })
        .collect();
    let any: Vec<String> = rules.keys().map(|n| format!("\"rule_{n}\"")).collect();
    let any = balanced_or(&any);
    let names: Vec<String> = rules
        .keys()
        .map(|n| format!("CASE WHEN \"rule_{n}\" THEN '{n}' END"))
        .collect();
    let from = match joined.is_empty() {
        true => "*, {tagged} FROM frames",
        false => {
            "frames.*, {tagged} FROM frames LEFT JOIN window_keys k \
             ON frames.drive = k.\"__drive\" AND frames.ts = k.\"__ts\""
        }
    }
    .replace("{tagged}", &tagged.join(", "));
    format!(
        "SELECT *, concat_ws(',', {}) AS rules FROM (SELECT {from}) AS tagged WHERE {} ORDER BY drive, ts",
        names.join(", "),
        any
    )
}

/// `terms` joined by `OR` as a balanced tree: its depth grows with the log of their
/// number, where a chain's grows with the number (and the planner recurses on depth).
fn balanced_or(terms: &[String]) -> String {
    match terms {
        [] => "false".to_owned(),
        [one] => one.clone(),
        _ => {
            let (a, b) = terms.split_at(terms.len() / 2);
            format!("({} OR {})", balanced_or(a), balanced_or(b))
        }
    }
}

/// The rules whose SQL holds a window function.
async fn window_rules(
    ctx: &SessionContext,
    rules: &IndexMap<String, String>,
) -> anyhow::Result<Vec<String>> {
    use datafusion::common::tree_node::TreeNode;
    use datafusion::logical_expr::LogicalPlan;
    let mut out = Vec::new();
    for (name, sql) in rules {
        let df = ctx.sql(&format!("SELECT ({sql}) FROM frames")).await?;
        if df
            .logical_plan()
            .exists(|p| Ok(matches!(p, LogicalPlan::Window(_))))?
        {
            out.push(name.clone());
        }
    }
    Ok(out)
}

/// Evaluates the window rules `windowed` alone, so DataFusion reads and sorts only the
/// columns they name, and registers as `window_keys` the (drive, ts) of every frame where
/// one holds, with a flag per rule. False (nothing registered) when more than `cap`
/// frames match: their join would not be the cheaper way. Frames are told apart by drive
/// and time: of two frames of one drive at the same time (whose `lag()` order SQL leaves
/// open anyway), both are tagged when a window rule holds for either.
async fn window_keys(
    ctx: &SessionContext,
    rules: &IndexMap<String, String>,
    windowed: &[String],
    cap: usize,
) -> anyhow::Result<bool> {
    let flags: Vec<String> = windowed
        .iter()
        .map(|n| format!("coalesce(({}), false) AS \"w_{n}\"", rules[n]))
        .collect();
    let any: Vec<String> = windowed.iter().map(|n| format!("\"w_{n}\"")).collect();
    let agg: Vec<String> = windowed
        .iter()
        .map(|n| format!("bool_or(\"w_{n}\") AS \"w_{n}\""))
        .collect();
    // Grouped by (drive, ts), so the join never repeats a frame.
    let sql = format!(
        "SELECT drive AS \"__drive\", ts AS \"__ts\", {} FROM \
           (SELECT drive, ts, {} FROM frames) AS w WHERE {} GROUP BY drive, ts",
        agg.join(", "),
        flags.join(", "),
        any.join(" OR ")
    );
    let mut stream = ctx.sql(&sql).await?.execute_stream().await?;
    let schema = stream.schema();
    let (mut batches, mut rows) = (Vec::new(), 0);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        rows += batch.num_rows();
        if rows > cap {
            return Ok(false);
        }
        batches.push(batch);
    }
    ctx.register_table(
        "window_keys",
        Arc::new(MemTable::try_new(schema, vec![batches])?),
    )?;
    Ok(true)
}

/// The longest rule text.
pub const MAX_RULE_BYTES: usize = 16 << 10;
/// The most tokens (names, numbers, operators, parentheses) a rule may have: this bounds
/// the depth of its parsed expression, which the planner walks recursively (a rule of
/// 4,000 `OR` terms overflowed the stack of `validate`, the step and `serve`).
pub const MAX_RULE_TOKENS: usize = 400;
/// The most rules one stage may have.
pub const MAX_RULES: usize = 1_000;
/// The deepest parentheses may nest in a rule.
pub const MAX_RULE_NESTING: usize = 32;

/// Bounds a rule's size and nesting before anything recursive sees it (tokens are
/// counted by a loop), then parses it as one expression to its end: a `UNION`, a second
/// statement or anything after the expression is refused here, not at run time.
fn bounded_expression(sql: &str) -> Result<(), String> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    if sql.len() > MAX_RULE_BYTES {
        return Err(format!(
            "is {} bytes long, more than the {MAX_RULE_BYTES} a rule may have",
            sql.len()
        ));
    }
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize()
        .map_err(|e| e.to_string())?;
    let (mut count, mut depth, mut deepest) = (0usize, 0usize, 0usize);
    for t in &tokens {
        match t {
            Token::Whitespace(_) => continue,
            Token::LParen | Token::LBracket => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            Token::RParen | Token::RBracket => depth = depth.saturating_sub(1),
            Token::SemiColon => {
                return Err("holds `;`: a rule is one boolean expression, not statements".into())
            }
            _ => {}
        }
        count += 1;
    }
    if count > MAX_RULE_TOKENS {
        return Err(format!(
            "has {count} terms, more than the {MAX_RULE_TOKENS} a rule may have: split it into several rules"
        ));
    }
    if deepest > MAX_RULE_NESTING {
        return Err(format!(
            "nests parentheses {deepest} deep, more than {MAX_RULE_NESTING}"
        ));
    }
    let unparsed = |e: datafusion::sql::sqlparser::parser::ParserError| {
        let e = e.to_string();
        format!(
            "does not parse: {}",
            e.strip_prefix("sql parser error: ").unwrap_or(&e)
        )
    };
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(2 * MAX_RULE_NESTING + 8)
        .try_with_sql(sql)
        .map_err(unparsed)?;
    parser.parse_expr().map_err(unparsed)?;
    let next = parser.peek_token();
    if next.token != Token::EOF {
        return Err(format!(
            "has `{}` after its expression (at {}): a rule is one boolean expression, no `UNION`, query or second statement",
            next.token, next.span.start
        ));
    }
    Ok(())
}

/// Checks every rule against the frame table's schema: it parses, names known columns,
/// and is boolean. Returns (`rules.NAME`, message) for each that does not.
pub fn check_rules(rules: &IndexMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if rules.len() > MAX_RULES {
        out.push((
            "rules".to_owned(),
            format!(
                "{} rules, more than the {MAX_RULES} one stage may have",
                rules.len()
            ),
        ));
        return out;
    }
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
        if let Err(e) = bounded_expression(sql) {
            out.push((at, format!("rule `{name}` {e}")));
            continue;
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
    mine_with_cap(rules, frames, out, WINDOW_KEYS_CAP).await
}

/// At most this many frames matching a window rule are joined back to an unsorted table;
/// beyond it the whole table is sorted instead.
pub const WINDOW_KEYS_CAP: usize = 1_000_000;

/// [`mine`], joining back at most `cap` frames matched by window rules.
pub async fn mine_with_cap(
    rules: &IndexMap<String, String>,
    frames: &std::path::Path,
    out: &std::path::Path,
    cap: usize,
) -> anyhow::Result<Value> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    mine_with(rules, frames, out, cap, cores).await
}

/// [`mine_with_cap`] on `cores` streams or partitions.
pub async fn mine_with(
    rules: &IndexMap<String, String>,
    frames: &std::path::Path,
    out: &std::path::Path,
    cap: usize,
    cores: usize,
) -> anyhow::Result<Value> {
    if let Some((at, m)) = check_rules(rules).into_iter().next() {
        anyhow::bail!("{at}: {m}");
    }
    match mine_checked(rules, frames, out, cap, cores).await {
        Ok(v) => Ok(v),
        Err(e) => Err(blame(rules, frames, e).await),
    }
}

/// A mining error as the rule that makes it: each rule evaluated alone over the frames,
/// the first that fails named with its text (a division by zero plans and fails only
/// on data). `e` as it is when no rule fails alone.
async fn blame(
    rules: &IndexMap<String, String>,
    frames: &std::path::Path,
    e: anyhow::Error,
) -> anyhow::Error {
    // The frames read as mining read them (no listing of every file, the same schema).
    let Ok(table) = files::table(frames) else {
        return e;
    };
    let parts = files::spread(&table.files, 2);
    let ctx = SessionContext::new();
    let frames = source::FileTable::new(table.schema, parts, false);
    if ctx.register_table("frames", Arc::new(frames)).is_err() {
        return e;
    }
    for (name, sql) in rules {
        let alone = format!("SELECT count(*) FROM frames WHERE coalesce(({sql}), false)");
        let failed = match ctx.sql(&alone).await {
            Ok(df) => df.collect().await.err(),
            Err(err) => Some(err),
        };
        if let Some(err) = failed {
            let first = err.to_string();
            let first = first.lines().next().unwrap_or_default().to_owned();
            return anyhow::anyhow!(
                "rules.{name}: rule `{name}` (`{sql}`) failed on the frames: {first}"
            );
        }
    }
    e
}

/// [`mine_with`] of rules already checked.
async fn mine_checked(
    rules: &IndexMap<String, String>,
    frames: &std::path::Path,
    out: &std::path::Path,
    cap: usize,
    cores: usize,
) -> anyhow::Result<Value> {
    // A table sorted by drive and time (as ingest writes and declares it, or found so) is
    // read in that order: the windows (`PARTITION BY drive ORDER BY ts`) and the output
    // order need no sort. It is cut into ranges of drives, one ordered stream per core,
    // each range read whole (a drive's window never spans two) and written to a part;
    // the parts follow each other in drive order. Otherwise (or where its files overlap)
    // the frames are hashed by drive over as many partitions as cores and sorted, the
    // sort spilling to disk beyond the memory limit.
    // Every file's footer, read once and summarised: for the order and for where to cut.
    let table = files::table(frames)?;
    let (schema, total) = (table.schema, table.rows);
    let (order, mut files) = files::table_order(table.files).await?;
    let sorted = order != "unsorted" && files::chain(&mut files);
    // A fair pool, shared by every stream: each spilling operator (the partitions' sorts
    // and their merges) gets its share. The greedy pool let one partition's sort take what
    // the other's merge needed, and the merge cannot spill: 10 M unsorted frames failed
    // with "Resources exhausted".
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(FairSpillPool::new(MEMORY_LIMIT)))
        .build_arc()?;
    let tables: Vec<(source::FileTable, files::Range)> = match sorted {
        true => files::ranges(&files::drive_cuts(&files, cores))
            .into_iter()
            .map(|r| {
                let units = files::units_in(&files, &r);
                (source::FileTable::new(schema.clone(), vec![units], true), r)
            })
            .collect(),
        false => {
            let parts = files::spread(&files, cores.max(2));
            vec![(source::FileTable::new(schema, parts, false), (None, None))]
        }
    };
    drop(files);
    let contexts = futures::future::try_join_all(
        (tables.into_iter()).map(|(table, range)| context(table, cores, runtime.clone(), range)),
    )
    .await?;
    let ctx = &contexts[0];
    // An unsorted table with window rules: the windows over their own few columns first,
    // then one pass over all columns joined with the frames they matched. Sorting every
    // column of every frame for a `lag()` was most of the time.
    let mut joined = Vec::new();
    let plan = if sorted {
        "ordered"
    } else {
        let windowed = window_rules(ctx, rules).await?;
        if !windowed.is_empty() && window_keys(ctx, rules, &windowed, cap).await? {
            joined = windowed;
            "window keys"
        } else {
            "sort"
        }
    };
    let sql = query(rules, &joined);
    let target = out.join("corner_cases.parquet");
    let parts: Vec<std::path::PathBuf> = match contexts.len() {
        1 => vec![target.clone()],
        n => (0..n)
            .map(|i| out.join(format!(".part-{i}.parquet")))
            .collect(),
    };
    let written = futures::future::try_join_all(
        contexts
            .iter()
            .zip(&parts)
            .map(|(ctx, part)| write_matches(ctx, &sql, rules, part)),
    )
    .await?;
    let mut counts: IndexMap<String, u64> = rules.keys().map(|k| (k.clone(), 0)).collect();
    let mut matched = 0u64;
    for (m, c) in &written {
        matched += m;
        for (name, n) in c {
            *counts.entry(name.clone()).or_default() += n;
        }
    }
    if parts.len() > 1 {
        concatenate(&parts, &target)?;
    }
    if matched == 0 {
        eprintln!("warning: no frame matched any rule");
    }
    Ok(json!({
        "frames": total,
        "matched": matched,
        "rules": counts,
        "input_order": order,
        "plan": plan,
        "streams": contexts.len(),
    }))
}

/// A session over the frame table: `frames_all` is `table`, `frames` the drives of `range`
/// in it. A sorted table is one ordered stream; an unsorted one has its partitions, and
/// the query as many as `cores`.
async fn context(
    table: source::FileTable,
    cores: usize,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    range: files::Range,
) -> anyhow::Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(match table.sorted() {
        true => 1,
        false => cores.max(2),
    });
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    ctx.register_table("frames_all", Arc::new(table))?;
    let quote = |s: &str| s.replace('\'', "''");
    let mut filter = Vec::new();
    if let Some(from) = &range.0 {
        filter.push(format!("drive >= '{}'", quote(from)));
    }
    if let Some(to) = &range.1 {
        filter.push(format!("drive < '{}'", quote(to)));
    }
    let view = match filter.is_empty() {
        true => "SELECT * FROM frames_all".to_owned(),
        false => format!("SELECT * FROM frames_all WHERE {}", filter.join(" AND ")),
    };
    let frames_view = ctx.sql(&view).await?.into_view();
    ctx.register_table("frames", frames_view)?;
    Ok(ctx)
}

/// Runs the mining query in `ctx` and writes what matched to `path`: the number of
/// frames written and how many each rule matched.
async fn write_matches(
    ctx: &SessionContext,
    sql: &str,
    rules: &IndexMap<String, String>,
    path: &std::path::Path,
) -> anyhow::Result<(u64, IndexMap<String, u64>)> {
    let df = ctx.sql(sql).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let mut stream = df.execute_stream().await?;
    let file = std::fs::File::create(path)?;
    let mut writer = ArrowWriter::try_new(file, schema, None)?;
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
    Ok((matched, counts))
}

/// Writes the rows of `parts`, in order, to `target`, and removes the parts.
fn concatenate(parts: &[std::path::PathBuf], target: &std::path::Path) -> anyhow::Result<()> {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let mut writer: Option<ArrowWriter<std::fs::File>> = None;
    for part in parts {
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(part)?)?;
        let schema = reader.schema().clone();
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(ArrowWriter::try_new(
                std::fs::File::create(target)?,
                schema,
                None,
            )?),
        };
        for batch in reader.build()? {
            w.write(&batch?)?;
        }
    }
    if let Some(w) = writer {
        w.close()?;
    }
    for part in parts {
        std::fs::remove_file(part)?;
    }
    Ok(())
}

// The `mine-corner-cases` step: its `with:` block, registration and what it does with its context.

/// `mine-corner-cases`: named SQL rules.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MineConfig {
    /// Rule name → SQL boolean expression over the frame columns (window functions allowed).
    pub rules: indexmap::IndexMap<String, String>,
}

/// The step, as the catalog lists it.
pub(crate) fn step() -> Box<dyn drivetrain_engine::step::Step> {
    crate::builtin::builtin::<MineConfig>(
        "mine-corner-cases",
        "named SQL rules over the frames to tagged corner-case frames",
        &[("frames", true)],
        &["corner_cases"],
        |c, cx| Box::pin(run_step(c, cx)),
    )
    .checked(|c| check_rules(&c.rules))
    .reporting(&[
        "frames",
        "matched",
        "rules",
        "input_order",
        "plan",
        "streams",
    ])
    .boxed()
}

async fn run_step(
    c: MineConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let frames = cx.input("frames")?;
    let out = cx.output("corner_cases")?;
    let v = mine(&c.rules, frames, out).await?;
    println!(
        "{} of {} frames matched: {}",
        v["matched"], v["frames"], v["rules"]
    );
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::files::tests::{table, table_of};
    use super::*;

    /// A fresh folder for test `name`, and an empty `frames` folder in it.
    fn scratch(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("dt-mine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let frames = dir.join("frames");
        std::fs::create_dir_all(&frames).unwrap();
        (dir, frames)
    }

    /// Rules from (name, SQL) pairs.
    fn named(rules: &[(&str, &str)]) -> IndexMap<String, String> {
        (rules.iter())
            .map(|(n, sql)| (n.to_string(), sql.to_string()))
            .collect()
    }

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

    /// Run on a thread with the 8 MiB stack of the binary's main thread and runtime
    /// workers: what `validate`, `serve` and the step check and plan rules on.
    fn on_binary_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn rules_too_long_or_deep_or_smuggling_a_query_are_refused_without_recursing() {
        let one = |sql: String| {
            on_binary_stack(move || {
                let mut rules = IndexMap::new();
                rules.insert("r".to_owned(), sql);
                check_rules(&rules)
            })
        };
        // 4,000 `OR` terms overflowed the stack; now a located refusal.
        let long = vec!["accel_x < -4"; 4_000].join(" OR ");
        let e = one(long);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].1.contains("is 63996 bytes long, more than the 16384"),
            "{e:?}"
        );
        let e = one(vec!["accel_x < -4"; 100].join(" OR "));
        assert!(e[0].1.contains("has 499 terms, more than the 400"), "{e:?}");
        let e = one(format!("{}accel_x < -4{}", "(".repeat(40), ")".repeat(40)));
        assert!(e[0].1.contains("nests parentheses 40 deep"), "{e:?}");
        // The most a rule may have plans on that stack (in a debug build, whose frames are
        // the largest).
        let e = one(vec!["accel_x < -4"; 80].join(" OR "));
        assert!(e.is_empty(), "{e:?}");
        let e = one(format!("{}accel_x < -4{}", "(".repeat(32), ")".repeat(32)));
        assert!(e.is_empty(), "{e:?}");
        // A query smuggled after the expression passed `validate` and failed at run time.
        for smuggled in [
            "true) AS r FROM frames UNION SELECT (true",
            "accel_x < -4; DROP TABLE frames",
            "accel_x < -4 UNION SELECT true",
        ] {
            let e = one(smuggled.to_owned());
            assert_eq!(e.len(), 1, "{smuggled}: {e:?}");
            assert!(
                e[0].1.contains("one boolean expression"),
                "{smuggled}: {e:?}"
            );
        }
    }

    #[test]
    fn rules_at_the_bounds_mine_on_the_binary_stack() {
        let dir = std::env::temp_dir().join(format!("dt-mine-bounds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let frames = dir.join("frames");
        std::fs::create_dir_all(&frames).unwrap();
        table(
            &frames,
            "part.parquet",
            &[("d", 1.0), ("d", 2.0), ("e", 3.0)],
        );
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        // The longest rule (80 terms, 399 tokens) and as many rules as a stage may have.
        let mut rules = IndexMap::new();
        rules.insert("longest".to_owned(), vec!["ts > 2.5"; 80].join(" OR "));
        for i in 1..MAX_RULES {
            rules.insert(format!("r{i}"), format!("ts = {i}"));
        }
        let v = on_binary_stack(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let v = rt.block_on(mine_with(&rules, &frames, &out, WINDOW_KEYS_CAP, 1));
            let _ = std::fs::remove_dir_all(&dir);
            v.unwrap()
        });
        assert_eq!(v["matched"], json!(3), "{v}");
        assert_eq!(v["rules"]["longest"], json!(1), "{v}");
        assert_eq!(v["rules"]["r2"], json!(1), "{v}");
    }

    #[test]
    fn files_each_in_order_but_overlapping_are_sorted_not_chained() {
        let (dir, frames) = scratch("overlap");
        // Each file in (drive, ts) order; drive `a` runs 0, 1, 2, 3 across both.
        table(&frames, "0.parquet", &[("a", 0.0), ("a", 2.0)]);
        table(&frames, "1.parquet", &[("a", 1.0), ("a", 3.0)]);
        let rules = named(&[(
            "steady",
            "ts - lag(ts) OVER (PARTITION BY drive ORDER BY ts) = 1",
        )]);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let v = rt
            .block_on(mine_with(&rules, &frames, &out, WINDOW_KEYS_CAP, 2))
            .unwrap();
        assert_eq!(
            (&v["input_order"], &v["plan"], &v["matched"]),
            (&json!("checked"), &json!("window keys"), &json!(3)),
            "{v}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_whose_pages_do_not_decode_fails_mining_naming_it() {
        let (dir, frames) = scratch("pages");
        // Declared sorted, so only mining's reader reads the pages.
        table_of(&frames, "0.parquet", &[("a", 0.0), ("a", 1.0)], true);
        let bad = table_of(
            &frames,
            "1.parquet",
            &[("b", 0.0), ("b", 1.0), ("b", 2.0)],
            true,
        );
        // The footer stays whole; the first page's header (after the magic) is garbage.
        let mut bytes = std::fs::read(&bad).unwrap();
        bytes[4..24].fill(0xff);
        std::fs::write(&bad, bytes).unwrap();
        let rules = named(&[("any", "ts >= 0")]);
        let rt = tokio::runtime::Runtime::new().unwrap();
        for cores in [1, 2] {
            let out = dir.join(format!("out-{cores}"));
            std::fs::create_dir_all(&out).unwrap();
            let e = rt
                .block_on(mine_with(&rules, &frames, &out, WINDOW_KEYS_CAP, cores))
                .unwrap_err()
                .to_string();
            assert!(e.contains("reading ") && e.contains("1.parquet"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_of_other_columns_are_read_in_the_columns_of_them_all() {
        use datafusion::arrow::array::{Float32Array, Float64Array, StringArray};
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::arrow::record_batch::RecordBatch;
        let (dir, frames) = scratch("columns");
        // Drive `a` has an `accel_x` column, drive `b` none: its frames have it null.
        table(&frames, "b.parquet", &[("b", 0.0), ("b", 1.0)]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("drive", DataType::Utf8, false),
            Field::new("ts", DataType::Float64, false),
            Field::new("accel_x", DataType::Float32, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "a"])),
                Arc::new(Float64Array::from(vec![0.0, 1.0])),
                Arc::new(Float32Array::from(vec![-5.0, 0.0])),
            ],
        )
        .unwrap();
        let file = std::fs::File::create(frames.join("a.parquet")).unwrap();
        let mut w = ArrowWriter::try_new(file, schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let rules = named(&[
            ("hard", "accel_x < -4"),
            ("quiet", "accel_x IS NULL AND ts > 0.5"),
        ]);
        let rt = tokio::runtime::Runtime::new().unwrap();
        for cores in [1, 2] {
            let out = dir.join(format!("out-{cores}"));
            std::fs::create_dir_all(&out).unwrap();
            let v = rt
                .block_on(mine_with(&rules, &frames, &out, WINDOW_KEYS_CAP, cores))
                .unwrap();
            assert_eq!(
                (&v["frames"], &v["rules"]),
                (&json!(4), &json!({"hard": 1, "quiet": 1})),
                "{v}"
            );
        }
        // No file at all is an error, not a table of no frames.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = rt
            .block_on(mine_with(&rules, &empty, &dir, WINDOW_KEYS_CAP, 2))
            .unwrap_err();
        assert!(e.to_string().starts_with("no Parquet files under"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rule_failing_on_the_data_is_named_with_its_text() {
        let (dir, frames) = scratch("blame");
        table(&frames, "part.parquet", &[("d", 1.0), ("d", 2.0)]);
        let mut rules = IndexMap::new();
        rules.insert("fine".to_owned(), "ts > 1".to_owned());
        rules.insert(
            "by_zero".to_owned(),
            "CAST(ts AS BIGINT) / 0 > 1".to_owned(),
        );
        assert!(check_rules_on(&frames, &rules).is_empty());
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let e = rt
            .block_on(mine_with(&rules, &frames, &out, WINDOW_KEYS_CAP, 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "rules.by_zero: rule `by_zero` (`CAST(ts AS BIGINT) / 0 > 1`) failed on the frames"
            ) && e.to_lowercase().contains("divide by zero"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Rules that name only the columns of a (drive, ts) test table plan against it.
    fn check_rules_on(frames: &std::path::Path, rules: &IndexMap<String, String>) -> Vec<String> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let ctx = crate::table::session(&[("frames", frames)]).await.unwrap();
            let mut out = Vec::new();
            for sql in rules.values() {
                if let Err(e) = ctx.sql(&format!("SELECT ({sql}) FROM frames")).await {
                    out.push(e.to_string());
                }
            }
            out
        })
    }
}
