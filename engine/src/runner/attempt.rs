//! Attempts of one stage: the attempt loop (retries with backoff, decided in one place),
//! starting an attempt on the executor with its inputs materialized, waiting for it with
//! its timeout, heartbeat and cancel, and publishing its outputs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::artifacts::{ArtifactRef, AttemptKey};
use crate::executor::{AttemptOutcome, AttemptSpec, PathAccess};
use crate::mask::Mask;
use crate::plan::{Action, Stage, StageId};
use crate::spec::{ErrorClass, IoMode};
use crate::state::Phase;
use crate::step::env_suffix;
use crate::template::{value_text, Ref, Template};

use super::keys::input_artifacts;
use super::{
    backoff, chain, first_line, humanize, lookup_value, retryable, Ctx, LoopEnd, RunError,
    RunEvent, StageResult, Track,
};

/// Attempts of a stage (or of one item of a map stage) until one succeeds, the retry
/// policy gives up, or the run is cancelled; each attempt recorded before it starts.
pub(super) async fn attempt_loop(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    upstream: &BTreeMap<StageId, StageResult>,
    first: u32,
) -> Result<LoopEnd, RunError> {
    let run = &ctx.run.id;
    let mut attempt = first - 1;
    loop {
        attempt += 1;
        let key = AttemptKey {
            run: run.0.clone(),
            stage: match track {
                Track::Stage => stage.name.clone(),
                Track::Item { index, .. } => format!("{}/items/{index}", stage.name),
            },
            attempt,
        };
        // A slot from recording the attempt as started until its process has ended and
        // its log and outputs are stored; the cache lookup before, and recording the end
        // and any backoff after, hold none.
        let slot = ctx.slots.acquire().await.expect("never closed");
        match track {
            Track::Stage => {
                ctx.state.start_attempt(run, &stage.name, attempt)?;
                let _ = ctx.events.send(RunEvent::Started {
                    stage: stage.name.clone(),
                    attempt,
                });
            }
            Track::Item { index, .. } => ctx.state.start_item(run, &stage.name, index, attempt)?,
        }
        let result = run_attempt(ctx, stage, track, &key, upstream).await;
        drop(slot);
        let (phase, exit, reason, class) = match result {
            Ok(AttemptEnd::Succeeded { outputs, values }) => {
                // The stage records its attempt's end with its own (one commit).
                return Ok(LoopEnd {
                    attempt: matches!(track, Track::Stage).then_some(attempt),
                    phase: Phase::Succeeded,
                    exit: Some(0),
                    reason: warnings(&values),
                    outputs,
                    values,
                });
            }
            Ok(AttemptEnd::Failed {
                exit_code,
                reason,
                class,
            }) => (Phase::Failed, exit_code, reason, class),
            Ok(AttemptEnd::Cancelled) => (
                Phase::Cancelled,
                None,
                "cancelled".to_owned(),
                ErrorClass::Error,
            ),
            Err(reason) => (Phase::Error, None, reason, ErrorClass::Error),
        };
        if let Track::Stage = track {
            ctx.state
                .finish_attempt(run, &stage.name, attempt, phase, exit, Some(&reason))?;
        }
        let retry = phase != Phase::Cancelled
            && attempt - first < stage.retries.limit
            && retryable(&stage.retries, class, exit)
            && !*ctx.stop_for(stage).borrow();
        if retry {
            let delay = backoff(&stage.retries, attempt, &key);
            if let Track::Stage = track {
                let _ = ctx.events.send(RunEvent::Retrying {
                    stage: stage.name.clone(),
                    attempt: attempt + 1,
                    delay,
                    reason: first_line(&reason),
                });
            }
            let mut cancel = ctx.stop_for(stage);
            tokio::select! {
                _ = tokio::time::sleep(delay) => continue,
                _ = cancel.changed() => {}
            }
        }
        return Ok(LoopEnd {
            attempt: None,
            phase,
            exit,
            reason: Some(reason),
            outputs: BTreeMap::new(),
            values: Value::Null,
        });
    }
}

pub(super) enum AttemptEnd {
    Succeeded {
        outputs: BTreeMap<String, ArtifactRef>,
        values: Value,
    },
    Failed {
        exit_code: Option<i32>,
        reason: String,
        class: ErrorClass,
    },
    Cancelled,
}

/// One attempt: prepare directories, render, start, wait (with the timeout), publish.
/// `Err` is an infrastructure fault with its reason.
async fn run_attempt(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    key: &AttemptKey,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<AttemptEnd, String> {
    // An executor that runs stages away from this file system (in a pod) gets paths
    // under its root and a transfer plan for `drivetrain exec`.
    let remote = ctx.executor.container_root();
    let (argv, workdir, step_config) = match &stage.action {
        Action::Command { argv, workdir, .. } => (argv.clone(), workdir.clone(), None),
        // A built-in step runs as `drivetrain step NAME`, the same contract as in a
        // container: the rendered config in the environment.
        Action::Step { name, config, .. } => {
            let command = match &remote {
                Some(root) => vec![
                    root.join(crate::executor::REMOTE_BINARY)
                        .display()
                        .to_string(),
                    "step".into(),
                ],
                None => ctx.opts.step_command.clone(),
            };
            let argv: Vec<Template> = command
                .into_iter()
                .chain([name.clone()])
                .map(|a| Template {
                    parts: vec![crate::template::Part::Lit(a)],
                })
                .collect();
            (argv, None, Some(config))
        }
    };
    let dir = key.work_dir(&ctx.opts.work_dir);
    let mk = |p: &Path| {
        std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
    };
    // Made afresh: a resumed run may run an attempt number again. One `mkdir` as a rule;
    // the run's first attempt makes the run's directory too.
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_dir_all(&dir);
            mk(&dir)?;
        }
        Err(_) => mk(&dir)?,
    }
    // `inputs/` and `outputs/` are made by what goes into them (materialized inputs,
    // output directories): a stage without inputs or outputs costs no directory for them.
    let (inputs_dir, outputs_dir) = match &remote {
        Some(root) => (root.join("inputs"), root.join("outputs")),
        None => (dir.join("inputs"), dir.join("outputs")),
    };
    let mut exec_inputs = Vec::new();
    let mut input_paths = BTreeMap::new();
    for input in &stage.inputs {
        let producer = upstream.get(&input.stage);
        match producer.and_then(|r| r.outputs.get(&input.output)) {
            // For data too large to copy, the stage reads the objects where they are.
            Some(art) if input.mode == IoMode::Url => {
                let url =
                    ctx.artifacts.url_of(art).await.map_err(|e| {
                        format!("cannot resolve input `{}`: {}", input.name, chain(&e))
                    })?;
                input_paths.insert(input.name.clone(), url);
            }
            Some(art) => {
                let dest = inputs_dir.join(&input.name);
                if remote.is_some() {
                    exec_inputs.push(crate::executor::ExecInput {
                        name: input.name.clone(),
                        artifact: art.clone(),
                        dest: dest.clone(),
                    });
                } else {
                    // A changed artifact is its producer's fault (or the store's), not
                    // this stage's: name who made it.
                    ctx.artifacts.materialize(art, &dest).await.map_err(|e| {
                        format!(
                            "cannot materialize input `{}` (an artifact of `{}`): {}",
                            input.name,
                            ctx.pipeline.stage(input.stage).name,
                            chain(&e)
                        )
                    })?;
                }
                input_paths.insert(input.name.clone(), dest.display().to_string());
            }
            // An optional input whose producer was skipped is absent; so is any input of
            // a hook whose producer did not succeed.
            None if input.optional || stage.hook.is_some() => {
                input_paths.insert(input.name.clone(), String::new());
            }
            None => return Err(format!("input `{}` has no artifact", input.name)),
        }
    }
    let mut exec_outputs = Vec::new();
    let mut output_paths = BTreeMap::new();
    for o in &stage.outputs {
        if o.mode == IoMode::Url {
            let url = ctx
                .artifacts
                .output_url(key, &o.name)
                .map_err(|e| format!("cannot prepare output `{}`: {}", o.name, chain(&e)))?;
            output_paths.insert(o.name.clone(), url);
            continue;
        }
        let p = outputs_dir.join(&o.name);
        if remote.is_some() {
            exec_outputs.push(crate::executor::ExecOutput {
                name: o.name.clone(),
                dir: p.clone(),
            });
        } else {
            mk(&p)?;
        }
        output_paths.insert(o.name.clone(), p.display().to_string());
    }
    let values_path = match &remote {
        Some(root) => root.join("values.json"),
        None => dir.join("values.json"),
    };
    let (item, item_index) = match track {
        Track::Item { item, index } => (Some(item), Some(index)),
        Track::Stage => (None, None),
    };
    let render = |t: &Template| -> String {
        t.render(|r| match r {
            Ref::Input(n) => input_paths.get(n).cloned(),
            Ref::Output(n) => output_paths.get(n).cloned(),
            Ref::Item(keys) => {
                let mut v = item?;
                for k in keys {
                    v = v.get(k)?;
                }
                Some(value_text(v))
            }
            other => lookup_value(&ctx.pipeline, ctx, upstream, other).map(|v| value_text(&v)),
        })
    };
    let argv: Vec<String> = argv.iter().map(render).collect();
    let step_config = step_config.map(|c| {
        let lookup = |r: &Ref| match r {
            Ref::Input(n) => input_paths.get(n).cloned().map(Value::String),
            Ref::Output(n) => output_paths.get(n).cloned().map(Value::String),
            Ref::Item(keys) => {
                let mut v = item?;
                for k in keys {
                    v = v.get(k)?;
                }
                Some(v.clone())
            }
            other => lookup_value(&ctx.pipeline, ctx, upstream, other),
        };
        crate::template::render_value(c, &lookup)
    });
    let mut env: Vec<(String, String)> = vec![
        ("DRIVETRAIN_RUN_ID".into(), key.run.clone()),
        ("DRIVETRAIN_STAGE".into(), key.stage.clone()),
        ("DRIVETRAIN_ATTEMPT".into(), key.attempt.to_string()),
        ("DRIVETRAIN_PIPELINE".into(), ctx.pipeline.name.clone()),
        (
            "DRIVETRAIN_INPUTS_DIR".into(),
            inputs_dir.display().to_string(),
        ),
        (
            "DRIVETRAIN_OUTPUTS_DIR".into(),
            outputs_dir.display().to_string(),
        ),
        (
            "DRIVETRAIN_VALUES".into(),
            values_path.display().to_string(),
        ),
        (
            "DRIVETRAIN_PARAMS".into(),
            serde_json::to_string(&ctx.params).unwrap_or_default(),
        ),
        ("DRIVETRAIN_STORE".into(), ctx.artifacts.url().to_owned()),
    ];
    // Built-in steps resolve a relative path the user wrote (ingest's `source`) against
    // the pipeline file's folder, as the user reads the file.
    if let Some(dir) = std::fs::canonicalize(&ctx.opts.request.file)
        .ok()
        .and_then(|f| f.parent().map(Path::to_path_buf))
    {
        env.push(("DRIVETRAIN_PIPELINE_DIR".into(), dir.display().to_string()));
    }
    if let Track::Item { index, item } = track {
        env.push(("DRIVETRAIN_ITEM".into(), value_text(item)));
        env.push(("DRIVETRAIN_ITEM_INDEX".into(), index.to_string()));
    }
    for (name, path) in &input_paths {
        env.push((
            format!("DRIVETRAIN_INPUT_{}", env_suffix(name)),
            path.clone(),
        ));
    }
    for (name, art) in input_artifacts(stage, upstream) {
        env.push((
            format!("DRIVETRAIN_INPUT_{}_DIGEST", env_suffix(&name)),
            art.digest,
        ));
    }
    // Kept across the attempts of this stage (and items) in this run: checkpoints. (In a
    // pod they live as long as the pod: a volume keeps them across attempts there.)
    let checkpoints = match &remote {
        Some(root) => root.join("checkpoints"),
        None => {
            let c = key.checkpoints_dir(&ctx.opts.work_dir);
            mk(&c)?;
            c
        }
    };
    env.push((
        "DRIVETRAIN_CHECKPOINTS".into(),
        checkpoints.display().to_string(),
    ));
    for (name, path) in &output_paths {
        env.push((
            format!("DRIVETRAIN_OUTPUT_{}", env_suffix(name)),
            path.clone(),
        ));
    }
    if let Some(c) = &step_config {
        env.push(("DRIVETRAIN_STEP_CONFIG".into(), c.to_string()));
        // A built-in step on this machine reaches the store (and the registry) as the
        // engine does; in a pod, credentials come from the pod's own secrets.
        if remote.is_none() {
            env.extend(store_config_env());
        }
    }
    for (k, t) in &stage.env {
        env.push((k.clone(), render(t)));
    }
    // On a cluster secrets come from Secret objects the executor references; here from
    // the engine's environment.
    for s in stage.secrets.iter().filter(|_| remote.is_none()) {
        if let (Some(var), Some(k)) = (&s.env, &s.key) {
            let source = format!(
                "DRIVETRAIN_SECRET_{}_{}",
                env_suffix(&s.name),
                env_suffix(k)
            );
            match std::env::var(&source) {
                Ok(v) => env.push((var.clone(), v)),
                Err(_) => {
                    return Ok(AttemptEnd::Failed {
                        exit_code: None,
                        reason: format!("secret `{}` key `{k}` is not set: the local executor reads it from `{source}`", s.name),
                        class: ErrorClass::Error,
                    })
                }
            }
        }
    }
    if remote.is_some() {
        let plan = crate::executor::ExecPlan {
            store: ctx.artifacts.url().to_owned(),
            run: key.run.clone(),
            stage: key.stage.clone(),
            attempt: key.attempt,
            inputs: exec_inputs,
            outputs: exec_outputs,
            values: values_path.clone(),
        };
        env.push((
            "DRIVETRAIN_EXEC_PLAN".into(),
            serde_json::to_string(&plan).unwrap_or_default(),
        ));
    }
    // In a pod, no `workdir` means the image's own.
    let cwd = match (&workdir, &remote) {
        (Some(w), _) => PathBuf::from(render(w)),
        (None, Some(_)) => PathBuf::new(),
        (None, None) => dir.clone(),
    };
    let log = dir.join("log.txt");
    // The engine's home and the store are read-only for the stage; its own directory and
    // `mode: url` outputs are writable, and its inputs read-only again.
    let mut access = Vec::new();
    let ro = |path: &Path| PathAccess {
        path: path.to_path_buf(),
        ..Default::default()
    };
    let home = ctx.opts.work_dir.parent().unwrap_or(&ctx.opts.work_dir);
    access.push(ro(home));
    if let Some(root) = ctx.artifacts.local_root() {
        if !root.starts_with(home) {
            access.push(ro(root));
        }
    }
    // A stage sees its own attempt only: not the state database, not other attempts'
    // directories (their live logs are not masked until they end).
    let hide = |path: PathBuf| PathAccess {
        path,
        hidden: true,
        ..Default::default()
    };
    access.push(hide(ctx.opts.work_dir.clone()));
    for db in ["state.db", "state.db-wal", "state.db-shm"] {
        if home.join(db).is_file() {
            access.push(hide(home.join(db)));
        }
    }
    access.push(PathAccess {
        path: dir.clone(),
        writable: true,
        ..Default::default()
    });
    access.push(PathAccess {
        path: checkpoints.clone(),
        writable: true,
        ..Default::default()
    });
    if let (Action::Step { registry: true, .. }, Some(root)) =
        (&stage.action, ctx.artifacts.local_root())
    {
        let registry = root.join("registry");
        mk(&registry)?;
        access.push(PathAccess {
            path: registry,
            writable: true,
            shared: true,
            ..Default::default()
        });
    }
    for o in stage.outputs.iter().filter(|o| o.mode == IoMode::Url) {
        if let Some(p) = ctx.artifacts.output_dir(key, &o.name) {
            access.push(PathAccess {
                path: p,
                writable: true,
                ..Default::default()
            });
        }
    }
    if !stage.inputs.is_empty() && inputs_dir.exists() {
        access.push(ro(&inputs_dir));
    }
    let mut placement = crate::executor::Placement::of(
        &ctx.pipeline.name,
        stage,
        stage.image.as_ref().map(render),
        item_index,
    );
    // `from_snapshot` may name a snapshot an upstream stage recorded in its values: a
    // rerun that reuses that stage mounts exactly the data of the original run.
    for v in &mut placement.volumes {
        if let Some(Ok(t)) = v.from_snapshot.as_deref().map(Template::parse) {
            v.from_snapshot = Some(render(&t));
        }
    }
    // The values of the stage's secrets, which nothing the engine keeps may show.
    let mask = Mask::new(
        env.iter()
            .filter(|(k, _)| stage.secrets.iter().any(|s| s.env.as_deref() == Some(k)))
            .map(|(_, v)| v.clone()),
    );
    let spec = AttemptSpec {
        run_id: key.run.clone(),
        stage: key.stage.clone(),
        attempt: key.attempt,
        argv,
        env,
        workdir: cwd,
        log: log.clone(),
        distributed: stage.distributed.clone(),
        access,
        placement,
        mask,
    };
    let mut result = start_and_wait(ctx, stage, key, spec, &log, &values_path, &outputs_dir).await;
    // Inputs are hard links into the store: a stage that wrote to one changed an
    // artifact. Say so, and fail the stage, rather than let it pass unnoticed.
    for input in &stage.inputs {
        let Some(art) = upstream
            .get(&input.stage)
            .and_then(|r| r.outputs.get(&input.output))
        else {
            continue;
        };
        if let Err(e) = ctx.artifacts.verify(art).await {
            result = Ok(AttemptEnd::Failed {
                exit_code: None,
                reason: format!(
                    "the stage wrote to its input `{}` (an artifact of `{}`): {e}; artifacts are immutable, write to an output instead",
                    input.name,
                    ctx.pipeline.stage(input.stage).name
                ),
                class: ErrorClass::Failed,
            });
            break;
        }
    }
    // Inputs are hard links to upstream artifacts: nothing of a finished attempt may keep
    // a writable name for them. (In a pod they were copies, gone with the pod.)
    if remote.is_none() && !stage.inputs.is_empty() {
        let _ = std::fs::remove_dir_all(&inputs_dir);
    }
    result
}

async fn start_and_wait(
    ctx: &Ctx,
    stage: &Stage,
    key: &AttemptKey,
    spec: AttemptSpec,
    log: &Path,
    values_path: &Path,
    outputs_dir: &Path,
) -> Result<AttemptEnd, String> {
    let mut spec = spec;
    let gpus = match stage.gpus() {
        0 => Vec::new(),
        n => ctx.gpus.acquire(n).await,
    };
    if !gpus.is_empty() {
        // The pool hands out positions; the stage gets the devices' own names.
        let list = gpus
            .iter()
            .map(|&g| ctx.opts.gpus[g].clone())
            .collect::<Vec<_>>()
            .join(",");
        spec.env.push(("CUDA_VISIBLE_DEVICES".into(), list.clone()));
        spec.env.push(("NVIDIA_VISIBLE_DEVICES".into(), list));
    }
    let result = wait_attempt(ctx, stage, key, spec, log, values_path, outputs_dir).await;
    ctx.gpus.release(&gpus);
    result
}

async fn wait_attempt(
    ctx: &Ctx,
    stage: &Stage,
    key: &AttemptKey,
    spec: AttemptSpec,
    log: &Path,
    values_path: &Path,
    outputs_dir: &Path,
) -> Result<AttemptEnd, String> {
    let mask = spec.mask.clone();
    let mut running = ctx.executor.start(spec).await.map_err(|e| e.to_string())?;
    let recorded = match key.stage.split_once("/items/") {
        Some((_, index)) => ctx.state.set_item_handle(
            &ctx.run.id,
            &stage.name,
            index.parse().unwrap_or_default(),
            &running.handle(),
        ),
        None => {
            ctx.state
                .set_attempt_handle(&ctx.run.id, &stage.name, key.attempt, &running.handle())
        }
    };
    recorded.map_err(|e| e.to_string())?;
    let mut cancel = ctx.stop_for(stage);
    let timeout = stage.timeout.unwrap_or(Duration::MAX);
    let outcome = tokio::select! {
        o = running.wait() => Some(o),
        _ = tokio::time::sleep(timeout) => None,
        _ = cancel.changed() => { running.cancel().await; Some(AttemptOutcome::Cancelled) }
    };
    let outcome = match outcome {
        Some(o) => o,
        None => {
            running.cancel().await;
            mask.file(log);
            let _ = ctx.artifacts.put_log(key, log).await;
            return Ok(AttemptEnd::Failed {
                exit_code: None,
                reason: format!(
                    "timed out after {}; the process group was killed{}",
                    humanize(timeout),
                    log_tail(log)
                ),
                class: ErrorClass::Timeout,
            });
        }
    };
    if let Some(usage) = running.usage() {
        record_usage(ctx, key, usage);
    }
    mask.file(log);
    mask.file(values_path);
    ctx.artifacts
        .put_log(key, log)
        .await
        .map_err(|e| format!("cannot store the log: {}", chain(&e)))?;
    match outcome {
        AttemptOutcome::Succeeded => {}
        AttemptOutcome::Cancelled => return Ok(AttemptEnd::Cancelled),
        AttemptOutcome::OutOfMemory { reason } => {
            return Ok(AttemptEnd::Failed {
                exit_code: Some(137),
                reason: mask.text(&format!("{reason}{}", log_tail(log))),
                class: ErrorClass::Oom,
            })
        }
        AttemptOutcome::Failed { exit_code, reason } => {
            return Ok(AttemptEnd::Failed {
                exit_code,
                reason: mask.text(&format!("{reason}{}", log_tail(log))),
                class: ErrorClass::Failed,
            })
        }
    }
    let remote = ctx.executor.container_root().is_some();
    let stored = if remote {
        ctx.artifacts
            .values(key, MAX_VALUES)
            .await
            .map_err(|e| format!("cannot read values.json: {}", chain(&e)))?
    } else {
        match std::fs::metadata(values_path) {
            Ok(m) if m.len() > MAX_VALUES => Err(m.len()),
            Ok(_) => Ok(std::fs::read(values_path).ok()),
            Err(_) => Ok(None),
        }
    };
    let stored = match stored {
        Ok(s) => s,
        Err(size) => {
            return Ok(AttemptEnd::Failed {
                exit_code: Some(0),
                reason: format!(
                    "values.json is {size} bytes, over the {MAX_VALUES}-byte bound on a stage's values: \
                     put data in an output, and in values only what a later stage's template or `when` reads"
                ),
                class: ErrorClass::Failed,
            })
        }
    };
    let values = match stored {
        Some(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Ok(AttemptEnd::Failed {
                    exit_code: Some(0),
                    reason: "values.json is not a JSON object".into(),
                    class: ErrorClass::Failed,
                })
            }
        },
        None => Value::Object(Default::default()),
    };
    let mut values = values;
    if let (Value::Object(v), Some(Value::Object(made))) = (&mut values, running.made()) {
        v.extend(made);
    }
    mask.json(&mut values);
    let mut outputs = BTreeMap::new();
    for o in &stage.outputs {
        // `drivetrain exec` uploaded a pod's outputs where `mode: url` ones go.
        let art = if remote || o.mode == IoMode::Url {
            ctx.artifacts.publish_listing(key, &o.name).await
        } else {
            ctx.artifacts
                .publish_dir(key, &o.name, &outputs_dir.join(&o.name))
                .await
        };
        match art {
            Ok(a) => {
                outputs.insert(o.name.clone(), a);
            }
            Err(
                e @ (crate::artifacts::ArtifactError::InvalidKey { .. }
                | crate::artifacts::ArtifactError::Symlink { .. }),
            ) => {
                return Ok(AttemptEnd::Failed {
                    exit_code: Some(0),
                    reason: e.to_string(),
                    class: ErrorClass::Failed,
                })
            }
            Err(e) => return Err(format!("cannot publish output `{}`: {}", o.name, chain(&e))),
        }
    }
    // The published files are hard links: drop the attempt's own names for them so
    // nothing left of the attempt can write to an artifact.
    if !remote && !stage.outputs.is_empty() {
        let _ = std::fs::remove_dir_all(outputs_dir);
    }
    Ok(AttemptEnd::Succeeded { outputs, values })
}

/// What a stage that succeeded still says about its result (`warnings` in its values:
/// logs read only in part, values it could not take), kept as the stage's reason so
/// `run`, `status`, the API and the web view show it beside the phase: a partial result
/// is never a plain success.
pub(super) fn warnings(values: &Value) -> Option<String> {
    let list: Vec<&str> = values
        .get("warnings")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    (!list.is_empty()).then(|| crate::diag::clip(format!("warning: {}", list.join("\nwarning: "))))
}

/// Stops a background task when the run ends, however it ends.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The engine's store and registry configuration (`AWS_*`, `GOOGLE_*`, `AZURE_*`,
/// `DRIVETRAIN_STORE_RETRY_TIMEOUT`, `DRIVETRAIN_REGISTRY`, `MLFLOW_*`), handed to built-in
/// steps, which open the store themselves. User commands get only what their stage
/// declares. Also `DRIVETRAIN_USER`: who runs the engine ([`crate::step::who`]), which
/// the registry records with an alias move.
pub(super) fn store_config_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            ["AWS_", "GOOGLE_", "AZURE_", "MLFLOW_"]
                .iter()
                .any(|p| k.starts_with(p))
                || matches!(
                    k.as_str(),
                    "DRIVETRAIN_STORE_RETRY_TIMEOUT" | "DRIVETRAIN_REGISTRY"
                )
        })
        .collect();
    env.push(("DRIVETRAIN_USER".into(), crate::step::who()));
    env
}

/// Records what an attempt used (a map item's on the item) and tells the
/// listeners (`serve`'s `/metrics`). A store that cannot record it loses only the figure
/// (and fails the attempt's own record a moment later, which the run reports).
fn record_usage(ctx: &Ctx, key: &AttemptKey, usage: crate::executor::ResourceUsage) {
    let (stage, item) = match key.stage.split_once("/items/") {
        Some((stage, idx)) => (stage, idx.parse::<usize>().ok()),
        None => (key.stage.as_str(), None),
    };
    let _ = match item {
        Some(idx) => ctx.state.set_item_usage(&ctx.run.id, stage, idx, &usage),
        None => ctx
            .state
            .set_attempt_usage(&ctx.run.id, stage, key.attempt, &usage),
    };
    let _ = ctx.events.send(RunEvent::Used {
        stage: stage.to_owned(),
        usage,
    });
}

/// The most of a stage's `values.json` the engine reads; past it the attempt fails.
pub const MAX_VALUES: u64 = 4 << 20;
/// The most of a log's end a failure reason looks at.
const TAIL_BYTES: u64 = 64 << 10;

/// The last 20 lines of a log, for failure reasons: read from its last [`TAIL_BYTES`]
/// only, each line clipped ([`crate::diag::clip`]), whatever the log's size or the
/// length of its lines (a progress bar's `\r`-joined line is one line).
pub(super) fn log_tail(log: &Path) -> String {
    use std::io::{Read as _, Seek as _};
    let Ok(mut f) = std::fs::File::open(log) else {
        return String::new();
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = size.saturating_sub(TAIL_BYTES);
    let mut end = Vec::new();
    if f.seek(std::io::SeekFrom::Start(start)).is_err()
        || f.take(TAIL_BYTES).read_to_end(&mut end).is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&end);
    let mut lines: Vec<&str> = text.lines().collect();
    // A line cut by the start of the tail is not shown as if it were whole.
    if start > 0 && lines.len() > 1 {
        lines.remove(0);
    }
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<String> = lines[lines.len().saturating_sub(20)..]
        .iter()
        .map(|l| crate::diag::clip((*l).to_owned()))
        .collect();
    format!("\nlast {} log lines:\n{}", tail.len(), tail.join("\n"))
}
