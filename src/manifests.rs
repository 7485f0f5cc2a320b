//! `drivetrain plan FILE --executor kubernetes --manifests`: every object a run would
//! create on a cluster, as YAML documents, for review and `kubectl apply --dry-run`.
//!
//! Each stage is rendered as its first attempt would be, by the same code the executor
//! creates objects with. What only a run knows stays a placeholder: the run id
//! (`--run-id`), and the transfer plan of input artifacts (`DRIVETRAIN_EXEC_PLAN`), which
//! names artifacts that do not exist yet. A map stage renders one item's Job.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use drivetrain_engine::executor::{AttemptSpec, Placement};
use drivetrain_engine::plan::{Action, Pipeline};
use drivetrain_engine::step::env_suffix;
use drivetrain_engine::template::{render_value, value_text, Ref, Template};
use drivetrain_engine::StageId;
use drivetrain_executors::kubernetes::{render, Settings};
use serde_json::Value;

/// Comment lines heading the documents: the artifact store the pods will use and where
/// that comes from, with a warning when pods could not reach it.
pub fn store_header(p: &Pipeline) -> String {
    let from_env = std::env::var("DRIVETRAIN_STORE")
        .ok()
        .filter(|s| !s.is_empty());
    let (url, from) = match (from_env, &p.store) {
        (Some(u), _) => (u, "from DRIVETRAIN_STORE"),
        (None, Some(u)) => (u.clone(), "from the pipeline's `store:`"),
        (None, None) => (
            "file://<home>/artifacts".to_owned(),
            "the engine home's default: no DRIVETRAIN_STORE, no `store:`",
        ),
    };
    // A query string may carry options with credentials: never printed.
    let shown = url.split('?').next().unwrap_or_default();
    let mut out = format!(
        "# The artifact store these pods use: {shown} ({from}).\n\
         # Each pod's wrapper reads it, with the attempt's transfer plan, from\n\
         # DRIVETRAIN_EXEC_PLAN, which the run sets; store credentials come from the pod's\n\
         # service account or the stage's `secrets:`, never from the engine's environment.\n"
    );
    if shown.starts_with("file://") {
        out.push_str(
            "# warning: pods cannot reach a file:// store on the engine's machine: set\n\
             # DRIVETRAIN_STORE or the pipeline's `store:` to an s3://, gs:// or az:// URL.\n",
        );
    }
    out
}

/// The YAML documents of the selected stages, in plan order.
pub fn manifests(
    p: &Pipeline,
    params: &BTreeMap<String, Value>,
    selected: &BTreeSet<StageId>,
    settings: &Settings,
    run_id: &str,
) -> anyhow::Result<String> {
    let mut out = String::new();
    for id in p.order.iter().filter(|id| selected.contains(id)) {
        let stage = p.stage(*id);
        if let Action::Approval { role, min, .. } = &stage.action {
            out.push_str(&format!(
                "---\n# stage {}: an approval ({min} of {role}): no workload, the engine waits for people\n",
                stage.name
            ));
            continue;
        }
        for v in &stage.volumes {
            if let Some(why) = drivetrain_executors::kubernetes::refuses_volume(v) {
                anyhow::bail!(
                    "stage `{}`: volume `{}` cannot be mounted: {why}",
                    stage.name,
                    v.name
                );
            }
        }
        let spec = attempt(p, stage, params, settings, run_id);
        let mut objects: Vec<Value> = render::render(settings, &spec)
            .objects
            .iter()
            .map(|o| o.to_value())
            .collect();
        if let Some(s) = render::snapshot(settings, &spec) {
            objects.push(serde_json::to_value(s)?);
        }
        let note = if stage.map.is_some() {
            " (a map stage: one such workload per item)"
        } else {
            ""
        };
        for o in objects {
            out.push_str(&format!(
                "---\n# stage {}: {} {}{note}\n",
                stage.name,
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            ));
            out.push_str(&serde_yaml_ng::to_string(&o)?);
        }
    }
    Ok(out)
}

fn attempt(
    p: &Pipeline,
    stage: &drivetrain_engine::plan::Stage,
    params: &BTreeMap<String, Value>,
    settings: &Settings,
    run_id: &str,
) -> AttemptSpec {
    let root = &settings.root;
    let inputs: BTreeMap<&str, String> = stage
        .inputs
        .iter()
        .map(|i| {
            (
                i.name.as_str(),
                root.join("inputs").join(&i.name).display().to_string(),
            )
        })
        .collect();
    let outputs: BTreeMap<&str, String> = stage
        .outputs
        .iter()
        .map(|o| {
            (
                o.name.as_str(),
                root.join("outputs").join(&o.name).display().to_string(),
            )
        })
        .collect();
    let lookup = |r: &Ref| -> Option<Value> {
        match r {
            Ref::Param(n) => params.get(n).cloned(),
            Ref::RunId => Some(Value::String(run_id.to_owned())),
            Ref::PipelineName => Some(Value::String(p.name.clone())),
            Ref::Input(n) => inputs.get(n.as_str()).cloned().map(Value::String),
            Ref::Output(n) => outputs.get(n.as_str()).cloned().map(Value::String),
            _ => None,
        }
    };
    let render = |t: &Template| t.render(|r| lookup(r).map(|v| value_text(&v)));
    let mut env: Vec<(String, String)> = vec![
        ("DRIVETRAIN_RUN_ID".into(), run_id.to_owned()),
        ("DRIVETRAIN_STAGE".into(), stage.name.to_string()),
        ("DRIVETRAIN_ATTEMPT".into(), "1".into()),
        ("DRIVETRAIN_PIPELINE".into(), p.name.clone()),
        (
            "DRIVETRAIN_INPUTS_DIR".into(),
            root.join("inputs").display().to_string(),
        ),
        (
            "DRIVETRAIN_OUTPUTS_DIR".into(),
            root.join("outputs").display().to_string(),
        ),
        (
            "DRIVETRAIN_VALUES".into(),
            root.join("values.json").display().to_string(),
        ),
        (
            "DRIVETRAIN_PARAMS".into(),
            serde_json::to_string(params).unwrap_or_default(),
        ),
    ];
    for (name, path) in &inputs {
        env.push((
            format!("DRIVETRAIN_INPUT_{}", env_suffix(name)),
            path.clone(),
        ));
    }
    for (name, path) in &outputs {
        env.push((
            format!("DRIVETRAIN_OUTPUT_{}", env_suffix(name)),
            path.clone(),
        ));
    }
    let (argv, workdir) = match &stage.action {
        Action::Command { argv, workdir, .. } => (
            argv.iter().map(render).collect(),
            workdir.as_ref().map(|w| PathBuf::from(render(w))),
        ),
        Action::Approval { .. } => (Vec::new(), None),
        Action::Step { name, config, .. } => {
            env.push((
                "DRIVETRAIN_STEP_CONFIG".into(),
                render_value(config, &lookup).to_string(),
            ));
            (
                vec![
                    root.join(drivetrain_engine::executor::REMOTE_BINARY)
                        .display()
                        .to_string(),
                    "step".into(),
                    name.clone(),
                ],
                None,
            )
        }
    };
    for (k, t) in &stage.env {
        env.push((k.clone(), render(t)));
    }
    AttemptSpec {
        run_id: run_id.to_owned(),
        stage: stage.name.to_string(),
        attempt: 1,
        argv,
        env,
        workdir: workdir.unwrap_or_default(),
        log: PathBuf::new(),
        distributed: stage.distributed.clone(),
        access: Vec::new(),
        mask: Default::default(),
        secret_files: Vec::new(),
        placement: Placement::of(
            p,
            stage,
            stage.image.as_ref().map(render),
            stage.map.as_ref().map(|_| 0),
        ),
    }
}
