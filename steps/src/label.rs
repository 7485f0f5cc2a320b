//! `label-export` and `label-import`: corner cases out to labeling, labels back in as a
//! dataset split by drive.
//!
//! Export writes to `tasks/`: `label-studio.json` (Label Studio tasks: `data` holds the
//! frame), `coco.json` (COCO `images` per frame, `categories`, no annotations yet) and
//! `frames.parquet` (the selected frames with `task_id` and `rules`). Selection: rules
//! take turns, each frame at most once; at most `max_per_drive_per_rule` per drive and
//! rule; frames of one drive closer than `dedup_window` to a selected one are skipped; a
//! `background` share of the budget is drawn from all frames (the negatives a classifier
//! needs), deterministically.
//!
//! Export names itself: `export.json` beside the tasks and `data.export_id` in every task
//! (the run and stage), since task ids restart at 1 in every export.
//!
//! Import reads completed Label Studio tasks (`labels` input or `source`, Label Studio's
//! `JSON` or `JSON_MIN` export), each matched to the frame it was made from by
//! `data.task_id` (Label Studio renumbers the tasks it imports), `data.export_id`, drive
//! and log time; anything else is foreign, counted, and fails the stage past
//! `max_foreign` (default 0). Of each task's annotations, cancelled ones are skipped and
//! the newest (by parsed RFC 3339 time; or the majority, `policy`) decides, by the
//! `choices` result of the `risk` control (`from_name`; when the annotation has no `risk`
//! result, the one that chose a mapped value). Choices mean what `choices:` maps them to;
//! a value it does not name fails the stage with the counts. Fewer labeled tasks than
//! `min_labeled` (default 90 %) fail the stage with the counts. Or, for the demo,
//! labels from the simulator's ground truth (`label_source` = `auto:ground-truth`), and
//! writes `dataset/{train,val,test}.parquet`: whole drives go to one split, never across.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use datafusion::arrow::datatypes::DataType;
use serde_json::{json, Map, Value};

use crate::table::{frame_columns, rows, session, write_rows};

/// The selected frames and what was written.
pub async fn export(
    cfg: &LabelExportConfig,
    corner_cases: &Path,
    frames: Option<&Path>,
    out: &Path,
    export_id: &str,
) -> anyhow::Result<Value> {
    let window = match &cfg.dedup_window {
        Some(w) => drivetrain_engine::units::parse_duration(w)
            .map_err(|e| anyhow::anyhow!("dedup_window: {e}"))?
            .as_secs_f64(),
        None => 0.0,
    };
    let per = cfg
        .max_per_drive_per_rule
        .map(|n| n as usize)
        .unwrap_or(usize::MAX);
    let budget = cfg.budget as usize;
    let background_share = match (cfg.background, frames) {
        (Some(b), _) if !(0.0..=1.0).contains(&b) => {
            anyhow::bail!("background must be between 0 and 1")
        }
        (Some(b), Some(_)) => b,
        (None, Some(_)) => 0.25,
        (_, None) => 0.0,
    };
    let mut tables = vec![("corner_cases", corner_cases)];
    if let Some(f) = frames {
        tables.push(("frames", f));
    }
    let ctx = session(&tables).await?;
    let candidates = rows(&ctx, "SELECT * FROM corner_cases ORDER BY drive, ts").await?;
    let target = budget - (budget as f64 * background_share).round() as usize;
    let (chosen, skipped_dup) = pick(&candidates, target, per, window);
    let mut selected: Vec<Map<String, Value>> =
        chosen.iter().map(|i| candidates[*i].clone()).collect();
    let background = match frames {
        Some(_) => add_background(&ctx, &mut selected, budget).await?,
        None => 0,
    };
    selected.sort_by(|a, b| {
        let k = |r: &Map<String, Value>| {
            (
                r["drive"].as_str().unwrap_or_default().to_owned(),
                r["log_time_ns"].as_i64().unwrap_or_default(),
            )
        };
        k(a).cmp(&k(b))
    });
    for (i, r) in selected.iter_mut().enumerate() {
        r.insert("task_id".into(), Value::from(i as i64 + 1));
    }
    // Which export a labeled task came from: task ids restart at 1 in every export.
    std::fs::write(
        out.join(EXPORT_FILE),
        serde_json::to_vec_pretty(&json!({"export_id": export_id}))?,
    )?;
    if selected.is_empty() {
        eprintln!("warning: nothing selected for labeling (no corner cases, or a zero budget)");
    }
    write_formats(cfg, out, &selected, export_id)?;
    let cols = frame_columns(&[("rules", DataType::Utf8), ("task_id", DataType::Int64)]);
    write_rows(&out.join("frames.parquet"), &cols, &selected)?;
    let per_rule = per_rule(&selected);
    Ok(json!({
        "export_id": export_id,
        "selected": selected.len(),
        "corner_cases": selected.len() - background,
        "background": background,
        "candidates": candidates.len(),
        "skipped_as_duplicates": skipped_dup,
        "rules": per_rule,
    }))
}

/// Corner cases for labeling: the rules take turns, each taking its next candidate in
/// time order, until `target` are chosen or every rule is exhausted; at most `per` of a
/// rule from one drive, none within `window` seconds of one taken from the same drive.
/// The candidates chosen (by position), and how many were passed over as duplicates.
fn pick(
    candidates: &[Map<String, Value>],
    target: usize,
    per: usize,
    window: f64,
) -> (Vec<usize>, u64) {
    // Each rule's candidates in time order.
    let mut by_rule: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in candidates.iter().enumerate() {
        for rule in r
            .get("rules")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .split(',')
        {
            if !rule.is_empty() {
                by_rule.entry(rule.to_owned()).or_default().push(i);
            }
        }
    }
    let mut chosen: Vec<usize> = Vec::new();
    let mut taken: BTreeSet<usize> = BTreeSet::new();
    let mut count: HashMap<(String, String), usize> = HashMap::new();
    let mut times: HashMap<String, Vec<f64>> = HashMap::new();
    let mut cursors: BTreeMap<String, usize> = by_rule.keys().map(|k| (k.clone(), 0)).collect();
    let mut skipped_dup = 0u64;
    // Rules take turns until the budget is spent or every rule is exhausted.
    while chosen.len() < target {
        let mut progressed = false;
        for (rule, list) in &by_rule {
            if chosen.len() >= target {
                break;
            }
            let cur = cursors.get_mut(rule).expect("every rule has a cursor");
            while *cur < list.len() {
                let i = list[*cur];
                *cur += 1;
                let r = &candidates[i];
                let drive = r
                    .get("drive")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let ts = r.get("ts").and_then(Value::as_f64).unwrap_or_default();
                if taken.contains(&i)
                    || count
                        .get(&(drive.clone(), rule.clone()))
                        .copied()
                        .unwrap_or(0)
                        >= per
                {
                    continue;
                }
                if times
                    .get(&drive)
                    .is_some_and(|t| t.iter().any(|x| (x - ts).abs() < window))
                {
                    skipped_dup += 1;
                    continue;
                }
                taken.insert(i);
                chosen.push(i);
                *count.entry((drive.clone(), rule.clone())).or_default() += 1;
                times.entry(drive).or_default().push(ts);
                progressed = true;
                break;
            }
        }
        if !progressed {
            break;
        }
    }
    (chosen, skipped_dup)
}

/// Background frames: a fixed pseudo-random sample of all frames (no rule matched them,
/// or they were not picked), spread over drives, filling `selected` up to `budget`.
async fn add_background(
    ctx: &datafusion::prelude::SessionContext,
    selected: &mut Vec<Map<String, Value>>,
    budget: usize,
) -> anyhow::Result<usize> {
    let mut background = 0usize;
    let want = budget.saturating_sub(selected.len());
    if want > 0 {
        let sample = rows(
            ctx,
            &format!(
                "SELECT *, '' AS rules FROM frames ORDER BY ((log_time_ns % 1000003) * 7919) % 1000003, drive, ts LIMIT {}",
                want * 2
            ),
        )
        .await?;
        let keys: BTreeSet<(String, i64)> = selected
            .iter()
            .map(|r| {
                (
                    r["drive"].as_str().unwrap_or_default().to_owned(),
                    r["log_time_ns"].as_i64().unwrap_or_default(),
                )
            })
            .collect();
        for r in sample {
            if background >= want {
                break;
            }
            let key = (
                r["drive"].as_str().unwrap_or_default().to_owned(),
                r["log_time_ns"].as_i64().unwrap_or_default(),
            );
            if !keys.contains(&key) {
                selected.push(r);
                background += 1;
            }
        }
    }
    Ok(background)
}

/// Writes the tasks in each format asked for (Label Studio and COCO by default).
fn write_formats(
    cfg: &LabelExportConfig,
    out: &Path,
    selected: &[Map<String, Value>],
    export_id: &str,
) -> anyhow::Result<()> {
    let formats: Vec<&LabelFormat> = if cfg.formats.is_empty() {
        vec![&LabelFormat::LabelStudio, &LabelFormat::Coco]
    } else {
        cfg.formats.iter().collect()
    };
    for f in formats {
        match f {
            LabelFormat::LabelStudio => {
                let tasks: Vec<Value> = selected
                    .iter()
                    .map(|r| {
                        // The task's own key is `data.task_id`: Label Studio gives an
                        // imported task a new top-level `id` and keeps `data` as it is.
                        let mut data = r.clone();
                        data.retain(|k, _| !k.starts_with("gt_") && !k.starts_with("rule_"));
                        data.insert("export_id".into(), Value::from(export_id));
                        json!({"data": data, "meta": {"rules": r["rules"]}})
                    })
                    .collect();
                std::fs::write(
                    out.join("label-studio.json"),
                    serde_json::to_vec_pretty(&tasks)?,
                )?;
                std::fs::write(out.join("label-config.xml"), LABEL_CONFIG)?;
            }
            LabelFormat::Coco => {
                let images: Vec<Value> = selected
                    .iter()
                    .map(|r| {
                        json!({
                            "id": r["task_id"],
                            "file_name": format!("{}/{}.jpg", r["drive"].as_str().unwrap_or_default(), r["log_time_ns"]),
                            "width": 1280, "height": 720,
                            "drive": r["drive"], "ts": r["ts"],
                            "source_file": r["source_file"], "source_offset": r["source_offset"],
                        })
                    })
                    .collect();
                let coco = json!({
                    "info": {"description": "drivetrain label-export", "version": "1.0"},
                    "images": images,
                    "annotations": [],
                    "categories": [{"id": 1, "name": "risky"}, {"id": 2, "name": "normal"}],
                });
                std::fs::write(out.join("coco.json"), serde_json::to_vec_pretty(&coco)?)?;
            }
        }
    }
    Ok(())
}

/// How many of the selected frames each rule matched.
fn per_rule(selected: &[Map<String, Value>]) -> BTreeMap<String, u64> {
    let mut per_rule: BTreeMap<String, u64> = BTreeMap::new();
    for r in selected {
        for rule in r["rules"]
            .as_str()
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
        {
            *per_rule.entry(rule.to_owned()).or_default() += 1;
        }
    }
    per_rule
}

/// A stable hash for assigning drives to splits.
fn fnv(seed: u64, s: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The Label Studio labeling config the tasks are made for: one `choices` control,
/// `risk`, over the frame's fields.
pub const LABEL_CONFIG: &str = r#"<View>
  <Header value="Drive $drive at $ts s (rules: $rules)"/>
  <Text name="frame" value="$source_file"/>
  <Choices name="risk" toName="frame" choice="single" required="true">
    <Choice value="risky"/>
    <Choice value="normal"/>
  </Choices>
</View>
"#;

/// The file beside the exported tasks that names the export (`export_id`).
pub const EXPORT_FILE: &str = "export.json";

/// What an annotation's choices give.
#[derive(Debug, Clone, PartialEq)]
enum Choice {
    Label(bool),
    /// Mapped to `skip`: deliberately no label.
    Skip,
    /// A value the mapping does not name.
    Unknown(String),
}

/// The label config's choice values → classes: `risky` and `normal` unless the stage maps
/// its own (`choices:`). Anything else is refused and counted, never read as a class.
struct Classes(BTreeMap<String, ChoiceClass>);

impl Classes {
    fn new(map: Option<&BTreeMap<String, ChoiceClass>>) -> Classes {
        Classes(map.cloned().unwrap_or_else(|| {
            BTreeMap::from([
                ("risky".to_owned(), ChoiceClass::Risky),
                ("normal".to_owned(), ChoiceClass::Normal),
            ])
        }))
    }

    /// The class of a result's picked values: risky if any is, normal if all that
    /// count are, skip when all are skipped; the first value not mapped is unknown.
    fn of(&self, picked: &[String]) -> Choice {
        let mut classes = Vec::new();
        for p in picked {
            match self.0.get(p) {
                Some(c) => classes.push(*c),
                None => return Choice::Unknown(p.clone()),
            }
        }
        if classes.contains(&ChoiceClass::Risky) {
            Choice::Label(true)
        } else if classes.contains(&ChoiceClass::Normal) {
            Choice::Label(false)
        } else {
            Choice::Skip
        }
    }

    fn knows_any(&self, picked: &[String]) -> bool {
        picked.iter().any(|p| self.0.contains_key(p))
    }
}

/// What a Label Studio export says of the exported tasks.
#[derive(Debug, Default)]
struct StudioLabels {
    /// `data.task_id` → the label the policy chose.
    by_task: HashMap<i64, bool>,
    /// Annotations skipped because they were cancelled.
    cancelled: u64,
    /// Annotations with no result of the label control.
    without_label: u64,
    /// Annotations whose choice is mapped to `skip`.
    skipped_choices: u64,
    /// Choice values the mapping does not name, with their counts.
    unknown_choices: BTreeMap<String, u64>,
    /// Exported items that are not tasks of this export: no `data.task_id`, another
    /// export's id, or another frame (drive and log time) than ours of that id.
    foreign: u64,
    /// A few of them, saying why.
    foreign_examples: Vec<String>,
    /// Tasks whose votes were tied under `policy: majority`, and how many of them the
    /// tie rule left unlabeled.
    ties: u64,
    ties_unlabeled: u64,
}

/// The control of the label config `label-export` writes.
const CONTROL: &str = "risk";

/// The picked values of one annotation's `choices` result: of control `from_name`; when
/// unset, of our `risk` control, else the first that picked a value the mapping knows.
fn picked(results: &[Value], from_name: Option<&str>, classes: &Classes) -> Option<Vec<String>> {
    let choices = |r: &Value, name: Option<&str>| -> Option<Vec<String>> {
        if r.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "choices")
        {
            return None;
        }
        if name.is_some() && r.get("from_name").and_then(Value::as_str) != name {
            return None;
        }
        Some(
            r.pointer("/value/choices")?
                .as_array()?
                .iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect(),
        )
    };
    let named = from_name.or_else(|| {
        results
            .iter()
            .any(|r| r.get("from_name").and_then(Value::as_str) == Some(CONTROL))
            .then_some(CONTROL)
    });
    match named {
        Some(n) => results.iter().find_map(|r| choices(r, Some(n))),
        None => results
            .iter()
            .filter_map(|r| choices(r, None))
            .find(|p| classes.knows_any(p)),
    }
}

/// The picked values of a JSON-MIN item (data fields and each control's value at the
/// top level): `"risk": "risky"` or `"risk": {"choices": [...]}`.
fn min_picked(
    item: &Map<String, Value>,
    from_name: Option<&str>,
    classes: &Classes,
) -> Option<Vec<String>> {
    let picked = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::String(c) => Some(vec![c.clone()]),
            Value::Object(o) => Some(
                o.get("choices")?
                    .as_array()?
                    .iter()
                    .filter_map(|c| c.as_str().map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        }
    };
    match from_name.or_else(|| item.contains_key(CONTROL).then_some(CONTROL)) {
        Some(n) => picked(item.get(n)?),
        None => item
            .iter()
            .filter(|(k, _)| !DATA_KEYS.contains(&k.as_str()))
            .filter_map(|(_, v)| picked(v))
            .find(|c| classes.knows_any(c)),
    }
}

/// Fields of a JSON-MIN item that are never a control's value.
const DATA_KEYS: &[&str] = &[
    "drive",
    "source_file",
    "rules",
    "export_id",
    "object_class",
    "weather",
    "time_of_day",
    "annotator",
    "created_at",
    "updated_at",
    "id",
    "annotation_id",
];

/// When an annotation was made (its `updated_at`, else `created_at`), parsed: Label
/// Studio writes RFC 3339 with and without fractions, which do not sort as text.
fn when(a: &Map<String, Value>) -> Option<chrono::DateTime<chrono::Utc>> {
    a.get("updated_at")
        .or_else(|| a.get("created_at"))
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// The tasks of the export being imported: `task_id` → (drive, log time), and the
/// export's id.
struct Exported<'a> {
    frames: HashMap<i64, (&'a str, i64)>,
    export_id: Option<String>,
}

impl Exported<'_> {
    /// The task of ours an exported item is, or why it is not one.
    fn task_of(&self, data: &Map<String, Value>) -> Result<i64, String> {
        let Some(task) = data.get("task_id").and_then(Value::as_i64) else {
            return Err("no `task_id`".into());
        };
        if let Some(ours) = &self.export_id {
            let theirs = data.get("export_id").and_then(Value::as_str);
            if theirs != Some(ours.as_str()) {
                return Err(format!(
                    "task {task} is of export {}, not {ours}",
                    theirs.unwrap_or("(none)")
                ));
            }
        }
        let Some((drive, log_time)) = self.frames.get(&task) else {
            return Err(format!("task {task} was not exported"));
        };
        let theirs = (
            data.get("drive").and_then(Value::as_str),
            data.get("log_time_ns").and_then(Value::as_i64),
        );
        if theirs != (Some(*drive), Some(*log_time)) {
            return Err(format!(
                "task {task} is frame {}@{} ns, ours is {drive}@{log_time} ns",
                theirs.0.unwrap_or("?"),
                theirs.1.map_or("?".to_owned(), |t| t.to_string())
            ));
        }
        Ok(task)
    }
}

/// Reads a Label Studio export, `JSON` (tasks with `annotations`) or `JSON_MIN` (one flat
/// item per annotation), matching each item to the exported frame it was made from.
fn studio_labels(
    path: &Path,
    cfg: &LabelImportConfig,
    exported: &Exported<'_>,
) -> anyhow::Result<StudioLabels> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read labels {}: {e}", path.display()))?;
    let items: Vec<Map<String, Value>> = serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a Label Studio export (a JSON list of tasks): {e}",
            path.display()
        )
    })?;
    let from_name = cfg.from_name.as_deref();
    let classes = Classes::new(cfg.choices.as_ref());
    let mut out = StudioLabels::default();
    // Task → its valid annotations: (when, annotation id, label).
    type Vote = (Option<chrono::DateTime<chrono::Utc>>, i64, bool);
    let mut votes: HashMap<i64, Vec<Vote>> = HashMap::new();
    let id = |a: &Map<String, Value>| {
        a.get("annotation_id")
            .or_else(|| a.get("id"))
            .and_then(Value::as_i64)
            .unwrap_or_default()
    };
    let mut count =
        |out: &mut StudioLabels, task: i64, a: &Map<String, Value>, picked: Option<Vec<String>>| {
            match picked.map(|p| classes.of(&p)) {
                Some(Choice::Label(label)) => {
                    votes.entry(task).or_default().push((when(a), id(a), label))
                }
                Some(Choice::Skip) => out.skipped_choices += 1,
                Some(Choice::Unknown(v)) => *out.unknown_choices.entry(v).or_default() += 1,
                None => out.without_label += 1,
            }
        };
    for item in &items {
        // JSON has the frame under `data`; JSON_MIN has it at the top level.
        let data = item.get("data").and_then(Value::as_object).unwrap_or(item);
        let task = match exported.task_of(data) {
            Ok(t) => t,
            Err(why) => {
                out.foreign += 1;
                if out.foreign_examples.len() < 3 {
                    out.foreign_examples.push(why);
                }
                continue;
            }
        };
        match item.get("annotations").and_then(Value::as_array) {
            Some(annotations) => {
                for a in annotations.iter().filter_map(Value::as_object) {
                    if a.get("was_cancelled").and_then(Value::as_bool) == Some(true) {
                        out.cancelled += 1;
                        continue;
                    }
                    let results = a.get("result").and_then(Value::as_array);
                    let p = results.and_then(|r| picked(r, from_name, &classes));
                    count(&mut out, task, a, p);
                }
            }
            // A JSON_MIN item of a task nobody annotated has no annotator: unlabeled,
            // not an annotation without a choice.
            None if !item.contains_key("annotator") && !item.contains_key("annotation_id") => {}
            None => {
                let p = min_picked(item, from_name, &classes);
                count(&mut out, task, item, p);
            }
        }
    }
    for (task, mut v) in votes {
        // Newest last: by time, then by annotation id.
        v.sort();
        let newest = v.last().map(|x| x.2).unwrap_or_default();
        let label = match cfg.policy.unwrap_or(LabelPolicy::Newest) {
            LabelPolicy::Newest => Some(newest),
            LabelPolicy::Majority => {
                let yes = v.iter().filter(|x| x.2).count();
                let no = v.len() - yes;
                if yes == no {
                    out.ties += 1;
                    match cfg.tie.unwrap_or(TieRule::Newest) {
                        TieRule::Newest => Some(newest),
                        TieRule::Oldest => v.first().map(|x| x.2),
                        TieRule::Unlabeled => {
                            out.ties_unlabeled += 1;
                            None
                        }
                    }
                } else {
                    Some(yes > no)
                }
            }
        };
        if let Some(label) = label {
            out.by_task.insert(task, label);
        }
    }
    Ok(out)
}

/// Reads the tasks and their labels and writes the split dataset.
pub async fn import(
    cfg: &LabelImportConfig,
    tasks: &Path,
    labels: Option<&Path>,
    out: &Path,
) -> anyhow::Result<Value> {
    let ctx = session(&[("tasks", &tasks.join("frames.parquet"))]).await?;
    let mut frames = rows(&ctx, "SELECT * FROM tasks ORDER BY task_id").await?;
    let labels_file = match (labels, &cfg.source) {
        (Some(dir), _) if dir.is_dir() => Some(dir.join("label-studio.json")),
        (Some(f), _) => Some(f.to_path_buf()),
        (None, Some(s)) => Some(std::path::PathBuf::from(s.trim_start_matches("file://"))),
        (None, None) => None,
    };
    let export_id = match std::fs::read(tasks.join(EXPORT_FILE)) {
        Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("export_id")?.as_str().map(str::to_owned))
            .filter(|id| !id.is_empty()),
        Err(_) => None,
    };
    let exported = Exported {
        frames: frames
            .iter()
            .filter_map(|r| {
                Some((
                    r.get("task_id")?.as_i64()?,
                    (r.get("drive")?.as_str()?, r.get("log_time_ns")?.as_i64()?),
                ))
            })
            .collect(),
        export_id: export_id.clone(),
    };
    let human = match &labels_file {
        Some(f) => Some(studio_labels(f, cfg, &exported)?),
        None => None,
    };
    drop(exported);
    if let Some(h) = &human {
        check_mapping(h, cfg)?;
    }
    let exported = frames.len() as u64;
    let mut unlabeled = 0u64;
    frames.retain_mut(|r| {
        let id = r.get("task_id").and_then(Value::as_i64).unwrap_or_default();
        let (label, source) = match &human {
            Some(h) => match h.by_task.get(&id) {
                Some(l) => (*l, "human"),
                None => {
                    unlabeled += 1;
                    return false;
                }
            },
            // The demo's auto-labeler: the simulator's ground truth.
            None => (
                crate::ingest::GT_COLUMNS
                    .iter()
                    .any(|c| r.get(*c).and_then(Value::as_bool).unwrap_or(false)),
                "auto:ground-truth",
            ),
        };
        r.insert("label".into(), Value::Bool(label));
        r.insert("label_source".into(), Value::String(source.into()));
        true
    });
    if let Some(h) = &human {
        check_labeled(h, cfg, exported, unlabeled)?;
    }
    let split_of = split_drives(cfg, &frames)?;
    let counts = write_splits(out, &frames, &split_of)?;
    Ok(json!({
        "frames": frames.len(),
        "exported": exported,
        "unlabeled": unlabeled,
        "cancelled_annotations": human.as_ref().map(|h| h.cancelled),
        "annotations_without_label": human.as_ref().map(|h| h.without_label),
        "foreign_items": human.as_ref().map(|h| h.foreign),
        "skipped_choices": human.as_ref().map(|h| h.skipped_choices),
        "majority_ties": human.as_ref().map(|h| h.ties),
        "ties_unlabeled": human.as_ref().map(|h| h.ties_unlabeled),
        "tie_rule": cfg.tie.unwrap_or(TieRule::Newest),
        "export_id": export_id,
        "label_source": if human.is_some() { "human" } else { "auto:ground-truth" },
        "splits": counts,
    }))
}

/// Refuses labels with a choice the mapping does not name, or with more items of
/// another export than `max_foreign`.
fn check_mapping(h: &StudioLabels, cfg: &LabelImportConfig) -> anyhow::Result<()> {
    if !h.unknown_choices.is_empty() {
        anyhow::bail!(
            "choices the label mapping does not name: {} (map each under `choices:` to risky, normal or skip)",
            h.unknown_choices
                .iter()
                .map(|(v, n)| format!("`{v}` ×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let max = cfg.max_foreign.unwrap_or(0);
    if h.foreign > max {
        anyhow::bail!(
            "{} labeled item(s) are not tasks of this export (max_foreign {max}), e.g. {}: labels of another export must not label these frames",
            h.foreign,
            h.foreign_examples.join("; ")
        );
    }
    Ok(())
}

/// Refuses an import with fewer labeled tasks than `min_labeled` asks for.
fn check_labeled(
    h: &StudioLabels,
    cfg: &LabelImportConfig,
    exported: u64,
    unlabeled: u64,
) -> anyhow::Result<()> {
    let labeled = exported - unlabeled;
    let min = cfg.min_labeled.unwrap_or(0.9);
    if min < 0.0 {
        anyhow::bail!("min_labeled must not be negative (got {min})");
    }
    let need = if min < 1.0 {
        (min * exported as f64).ceil() as u64
    } else {
        min.ceil() as u64
    };
    if labeled < need {
        anyhow::bail!(
            "only {labeled} of {exported} exported tasks came back labeled (min_labeled {min} needs {need}): \
             {unlabeled} without a label, {} cancelled annotation(s) skipped, {} annotation(s) without a `{}` choice, \
             {} item(s) not of this export (tasks are matched by `data.task_id`, `export_id`, drive and log time)",
            h.cancelled,
            h.without_label,
            cfg.from_name.as_deref().unwrap_or("risky/normal"),
            h.foreign
        );
    }
    Ok(())
}

/// Each drive's split (`train`, `val`, `test`): whole drives, in an order the seed
/// fixes, so no drive's frames are on both sides.
fn split_drives(
    cfg: &LabelImportConfig,
    frames: &[Map<String, Value>],
) -> anyhow::Result<HashMap<String, &'static str>> {
    let split = cfg.split.as_ref();
    let (train_f, val_f) = (
        split.map(|s| s.train).unwrap_or(0.8),
        split.map(|s| s.val).unwrap_or(0.1),
    );
    let test_f = split
        .and_then(|s| s.test)
        .unwrap_or((1.0 - train_f - val_f).max(0.0));
    if (train_f + val_f + test_f - 1.0).abs() > 1e-6 || train_f <= 0.0 || val_f <= 0.0 {
        anyhow::bail!("split fractions must be positive for train and val and add up to 1 (got {train_f} / {val_f} / {test_f})");
    }
    let seed = cfg.seed.unwrap_or(0);
    let mut drives: Vec<String> = frames
        .iter()
        .filter_map(|r| r.get("drive").and_then(Value::as_str).map(str::to_owned))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    drives.sort_by_key(|d| fnv(seed, d));
    let n = drives.len();
    let n_val = if n >= 2 {
        ((n as f64 * val_f).round() as usize).max(1)
    } else {
        0
    };
    let n_test = if n >= 3 {
        (n as f64 * test_f).round() as usize
    } else {
        0
    }
    .min(n.saturating_sub(n_val + 1));
    let mut split_of: HashMap<String, &str> = HashMap::new();
    for (i, d) in drives.iter().enumerate() {
        let s = if i < n_val {
            "val"
        } else if i < n_val + n_test {
            "test"
        } else {
            "train"
        };
        split_of.insert(d.clone(), s);
    }
    Ok(split_of)
}

/// Writes `train`, `val` and `test` as Parquet; what each holds.
fn write_splits(
    out: &Path,
    frames: &[Map<String, Value>],
    split_of: &HashMap<String, &'static str>,
) -> anyhow::Result<BTreeMap<&'static str, Value>> {
    let cols = frame_columns(&[
        ("rules", DataType::Utf8),
        ("task_id", DataType::Int64),
        ("label", DataType::Boolean),
        ("label_source", DataType::Utf8),
    ]);
    let mut counts = BTreeMap::new();
    for s in ["train", "val", "test"] {
        let part: Vec<Map<String, Value>> = frames
            .iter()
            .filter(|r| {
                split_of
                    .get(r["drive"].as_str().unwrap_or_default())
                    .copied()
                    == Some(s)
            })
            .cloned()
            .collect();
        let positives = part
            .iter()
            .filter(|r| r["label"] == Value::Bool(true))
            .count();
        counts.insert(s, json!({"frames": part.len(), "positives": positives,
            "drives": split_of.iter().filter(|(_, v)| **v == s).map(|(k, _)| k.clone()).collect::<BTreeSet<_>>()}));
        write_rows(&out.join(format!("{s}.parquet")), &cols, &part)?;
    }
    Ok(counts)
}

// The `label-export` and `label-import` step: its `with:` block, registration and what it does with its context.

/// `label-export`: selection for labeling.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelExportConfig {
    /// The most frames to send to labeling.
    pub budget: u32,
    /// Diversity: at most this many frames per drive per rule.
    #[serde(default)]
    pub max_per_drive_per_rule: Option<u32>,
    /// Frames of one drive closer than this (a duration) count as duplicates.
    #[serde(default)]
    pub dedup_window: Option<String>,
    /// Export formats. Default both.
    #[serde(default)]
    pub formats: Vec<LabelFormat>,
    /// The share of the budget drawn from all frames (negatives for training) when the
    /// `frames` input is connected. Default 0.25.
    #[serde(default)]
    pub background: Option<f64>,
}

/// Labeling task formats.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LabelFormat {
    LabelStudio,
    Coco,
}

/// `label-import`: labels back into a dataset.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelImportConfig {
    /// A store URL of completed labels; default: the `labels` input, else the demo
    /// ground truth of `tasks`.
    #[serde(default)]
    pub source: Option<String>,
    /// Fractions for train / val / test. Default 0.8 / 0.1 / 0.1.
    #[serde(default)]
    pub split: Option<Split>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// The labeling control whose choices are the label (`from_name` in Label Studio's
    /// results). Default: the `choices` result that chose `risky` or `normal`.
    #[serde(default)]
    pub from_name: Option<String>,
    /// Which annotation of a task counts when it has several (cancelled ones never do):
    /// `newest` (default) or `majority` (the label most annotations chose; a tie is
    /// settled by `tie`).
    #[serde(default)]
    pub policy: Option<LabelPolicy>,
    /// How `policy: majority` settles a task whose votes are tied: `newest` (default:
    /// the newest annotation's label), `oldest`, or `unlabeled` (the task gets no label
    /// and counts against `min_labeled`). Ties are counted in `majority_ties` either way.
    #[serde(default)]
    pub tie: Option<TieRule>,
    /// The fewest exported tasks that must come back labeled: a share of them below 1
    /// (`0.9`, the default) or a count from 1 up (`250`); fewer fails the stage.
    #[serde(default)]
    pub min_labeled: Option<f64>,
    /// The label control's choice values and what each means: `risky`, `normal`, or
    /// `skip` (no label). Default `{risky: risky, normal: normal}`. A value not named
    /// here fails the stage with the values and their counts.
    #[serde(default)]
    pub choices: Option<std::collections::BTreeMap<String, ChoiceClass>>,
    /// The most labeled items that may not be tasks of this export (another export's,
    /// or naming another frame) before the stage fails. Default 0.
    #[serde(default)]
    pub max_foreign: Option<u64>,
}

/// What a labeling choice means to `label-import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChoiceClass {
    Risky,
    Normal,
    Skip,
}

/// Which annotation of a task `label-import` takes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LabelPolicy {
    Newest,
    Majority,
}

/// How `policy: majority` settles a tied task.
#[derive(
    Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum TieRule {
    Newest,
    Oldest,
    Unlabeled,
}

/// Dataset split fractions.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Split {
    pub train: f64,
    pub val: f64,
    #[serde(default)]
    pub test: Option<f64>,
}

/// The steps, as the catalog lists them.
pub(crate) fn steps() -> Vec<Box<dyn drivetrain_engine::step::Step>> {
    vec![
        crate::builtin::builtin::<LabelExportConfig>(
            "label-export",
            "budgeted, de-duplicated frames to Label Studio and COCO tasks",
            &[("corner_cases", true), ("frames", false)],
            &["tasks"],
            |c, cx| Box::pin(run_export(c, cx)),
        )
        .reporting(&[
            "export_id",
            "selected",
            "corner_cases",
            "background",
            "candidates",
            "skipped_as_duplicates",
            "rules",
        ])
        .boxed(),
        crate::builtin::builtin::<LabelImportConfig>(
            "label-import",
            "completed labels to a split training dataset (Parquet)",
            &[("tasks", true), ("labels", false)],
            &["dataset"],
            |c, cx| Box::pin(run_import(c, cx)),
        )
        .reporting(&[
            "frames",
            "exported",
            "unlabeled",
            "cancelled_annotations",
            "annotations_without_label",
            "foreign_items",
            "skipped_choices",
            "majority_ties",
            "ties_unlabeled",
            "tie_rule",
            "export_id",
            "label_source",
            "splits",
        ])
        .boxed(),
    ]
}

async fn run_export(
    c: LabelExportConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let cases = cx.input("corner_cases")?;
    let frames = cx.inputs.get("frames").map(std::path::PathBuf::as_path);
    let out = cx.output("tasks")?;
    // Task ids restart at 1 in every export: the run and stage name this one.
    let export_id = match cx.run_id.as_str() {
        "" => "local".to_owned(),
        run => format!("{run}/{}", cx.stage),
    };
    let v = export(
        &c,
        &cases.join("corner_cases.parquet"),
        frames,
        out,
        &export_id,
    )
    .await?;
    println!(
        "selected {} frames for labeling ({} corner cases, {} background)",
        v["selected"], v["corner_cases"], v["background"]
    );
    Ok(v)
}

async fn run_import(
    c: LabelImportConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let tasks = cx.input("tasks")?;
    let labels = cx.inputs.get("labels").map(std::path::PathBuf::as_path);
    let out = cx.output("dataset")?;
    let v = import(&c, tasks, labels, out).await?;
    println!("dataset: {}", v["splits"]);
    Ok(v)
}
