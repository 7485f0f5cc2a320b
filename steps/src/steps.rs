//! What each built-in step does with its context: read the inputs, call the module that
//! does the work, write the outputs, return the values.

use std::path::PathBuf;

use serde_json::{json, Value};
use tokio::task::block_in_place;

use drivetrain_engine::step::StepContext;

use crate::model::{evaluate, Model};
use crate::registry::Registry;
use crate::table::{rows, session};
use crate::{
    FleetSimConfig, IngestConfig, LabelExportConfig, LabelImportConfig, MineConfig, PromoteConfig,
    TrainConfig, ValidateConfig,
};

fn err(e: String) -> anyhow::Error {
    anyhow::anyhow!(e)
}

pub async fn fleet_sim(c: FleetSimConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let out = cx.output("logs").map_err(err)?.clone();
    let s = block_in_place(|| crate::sim::simulate(&c, &out))?;
    println!(
        "simulated {} drives, {} frames, events {:?}",
        s.drives, s.frames, s.events
    );
    Ok(json!({"drives": s.drives, "frames": s.frames, "events": s.events}))
}

pub async fn ingest(c: IngestConfig, cx: &StepContext) -> anyhow::Result<Value> {
    // Fetched logs go beside the attempt's values, in its own directory: nothing of
    // them outlives the attempt's work directory, even when the stage is killed.
    let scratch = cx
        .values
        .parent()
        .map(|d| d.join("fetched"))
        .unwrap_or_else(|| PathBuf::from("fetched"));
    let source = match (&c.source, cx.inputs.get("logs")) {
        (Some(s), _) => crate::logsource::LogSource::open(s, &scratch, cx.pipeline_dir.as_deref())?,
        (None, Some(dir)) => crate::logsource::LogSource::Local(dir.clone()),
        (None, None) => anyhow::bail!("no logs: connect the `logs` input or set `source`"),
    };
    let frames = cx.output("frames").map_err(err)?.clone();
    let index = cx.outputs.get("index").cloned();
    let lanes = cx.outputs.get("lanes").cloned();
    let v = block_in_place(|| {
        crate::ingest::ingest(&c, &source, &frames, index.as_deref(), lanes.as_deref())
    })?;
    println!(
        "ingested {} file(s), {} frames from {} drive(s)",
        v["files"],
        v["frames"],
        v["drives"].as_object().map(|d| d.len()).unwrap_or(0)
    );
    Ok(v)
}

pub async fn mine(c: MineConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let frames = cx.input("frames").map_err(err)?;
    let out = cx.output("corner_cases").map_err(err)?;
    let v = crate::mine::mine(&c.rules, frames, out).await?;
    println!(
        "{} of {} frames matched: {}",
        v["matched"], v["frames"], v["rules"]
    );
    Ok(v)
}

pub async fn label_export(c: LabelExportConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let cases = cx.input("corner_cases").map_err(err)?;
    let frames = cx.inputs.get("frames").map(PathBuf::as_path);
    let out = cx.output("tasks").map_err(err)?;
    // Task ids restart at 1 in every export: the run and stage name this one.
    let export_id = match cx.run_id.as_str() {
        "" => "local".to_owned(),
        run => format!("{run}/{}", cx.stage),
    };
    let v = crate::label::export(
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

pub async fn label_import(c: LabelImportConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let tasks = cx.input("tasks").map_err(err)?;
    let labels = cx.inputs.get("labels").map(PathBuf::as_path);
    let out = cx.output("dataset").map_err(err)?;
    let v = crate::label::import(&c, tasks, labels, out).await?;
    println!("dataset: {}", v["splits"]);
    Ok(v)
}

/// The rows of one split of a dataset directory.
async fn split(
    dataset: &std::path::Path,
    name: &str,
) -> anyhow::Result<Vec<serde_json::Map<String, Value>>> {
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

pub async fn train(c: TrainConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let dataset = cx.input("dataset").map_err(err)?;
    let data = split(dataset, "train").await?;
    let (model, history) = block_in_place(|| {
        crate::train::train(
            &c,
            &data,
            cx.rank,
            cx.world,
            cx.master.as_deref(),
            cx.checkpoints.as_deref(),
        )
    })?;
    if cx.rank != 0 {
        return Ok(Value::Null);
    }
    let metrics = evaluate(&model, &data);
    std::fs::write(
        cx.output("model").map_err(err)?.join("model.json"),
        serde_json::to_vec_pretty(&model)?,
    )?;
    if let Some(m) = cx.outputs.get("metrics") {
        std::fs::write(
            m.join("metrics.json"),
            serde_json::to_vec_pretty(&json!({"train": metrics, "history": history}))?,
        )?;
    }
    println!(
        "trained on {} frames over {} rank(s): train f1 {:.3}",
        data.len(),
        cx.world,
        metrics["f1"].as_f64().unwrap_or(0.0)
    );
    Ok(json!({"train": metrics, "history": history}))
}

fn load_model(bytes: &[u8]) -> anyhow::Result<Model> {
    serde_json::from_slice(bytes).map_err(|e| anyhow::anyhow!("not a model: {e}"))
}

pub async fn validate(c: ValidateConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let gate = crate::gate::parse(&c.gate).map_err(|e| anyhow::anyhow!("gate: {e}"))?;
    let candidate = load_model(&std::fs::read(
        cx.input("model").map_err(err)?.join("model.json"),
    )?)?;
    let dataset = cx.input("dataset").map_err(err)?;
    let mut val = split(dataset, "val").await?;
    if val.is_empty() {
        eprintln!("warning: the validation split is empty; validating on the test split");
        val = split(dataset, "test").await?;
    }
    let alias = c.baseline.clone().unwrap_or_else(|| "production".into());
    // Production: a `baseline` input, else the registry's alias.
    let (production, production_ref) = match (cx.inputs.get("baseline"), &c.model) {
        (Some(dir), _) => (
            Some(load_model(&std::fs::read(dir.join("model.json"))?)?),
            json!({"input": "baseline"}),
        ),
        (None, Some(name)) => {
            let reg = Registry::open_for(c.registry.as_deref(), &cx.store)?;
            match reg.alias(name, &alias).await? {
                Some(a) => {
                    let n = a["version"].as_u64().unwrap_or_default();
                    (
                        Some(load_model(&reg.file(name, n, "model.json").await?)?),
                        json!({"model": name, "alias": alias, "version": n}),
                    )
                }
                None => (None, Value::Null),
            }
        }
        (None, None) => (None, Value::Null),
    };
    let cand = evaluate(&candidate, &val);
    let (passed, reasons) = match &production {
        Some(p) => {
            let prod = evaluate(p, &val);
            let (ok, mut why) =
                crate::gate::evaluate(&gate, &json!({"candidate": cand, "production": prod}));
            why.insert(
                0,
                format!("gate `{}` {}", c.gate, if ok { "passed" } else { "failed" }),
            );
            (ok, why)
        }
        None => (
            true,
            vec![format!("no {alias} model yet: the candidate is the first")],
        ),
    };
    let metrics = json!({
        "candidate": cand,
        "production": production.as_ref().map(|p| evaluate(p, &val)),
    });
    let report = json!({
        "passed": passed,
        "reasons": reasons,
        "metrics": metrics,
        "production": production_ref,
        "lineage": {"inputs": cx.input_digests, "run": cx.run_id, "pipeline": cx.pipeline},
    });
    std::fs::write(
        cx.output("report").map_err(err)?.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    println!(
        "{}: {}",
        if passed { "PASSED" } else { "FAILED" },
        reasons.join("; ")
    );
    Ok(json!({"passed": passed, "reasons": reasons, "metrics": metrics}))
}

pub async fn promote(c: PromoteConfig, cx: &StepContext) -> anyhow::Result<Value> {
    let model_dir = cx.input("model").map_err(err)?;
    let report: Value = match cx.inputs.get("report") {
        Some(d) => serde_json::from_slice(&std::fs::read(d.join("report.json"))?)?,
        None => Value::Null,
    };
    let reg = Registry::open_for(c.registry.as_deref(), &cx.store)?;
    let meta = json!({
        "source": {"model_digest": cx.input_digests.get("model"), "run": cx.run_id, "pipeline": cx.pipeline, "stage": cx.stage},
        "lineage": report.get("lineage").cloned().unwrap_or(Value::Null),
        "metrics": report.pointer("/metrics/candidate").cloned().unwrap_or(Value::Null),
    });
    let (version, registered) = reg.register_once(&c.model, model_dir, meta).await?;
    let entry = reg
        .move_alias(&c.model, &c.alias, version, json!({"run": cx.run_id, "gate": {"passed": report.get("passed"), "reasons": report.get("reasons")}}))
        .await?;
    let out = json!({"model": c.model, "version": version, "registered": registered, "alias": c.alias, "from": entry["from"], "generation": entry["generation"]});
    std::fs::write(
        cx.output("registration")
            .map_err(err)?
            .join("registration.json"),
        serde_json::to_vec_pretty(&out)?,
    )?;
    let why = report
        .get("reasons")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    println!(
        "promoted {} version {version} to `{}` (was {}): {why}",
        c.model,
        c.alias,
        entry["from"]
            .as_u64()
            .map(|v| format!("version {v}"))
            .unwrap_or_else(|| "unset".into())
    );
    Ok(out)
}
