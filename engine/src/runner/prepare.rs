//! Preparing one attempt: its directories, its inputs materialized (or, for a pod, the
//! transfer plan that fetches them), its command and environment rendered, and what it
//! may read and write, as the [`AttemptSpec`] an executor starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::artifacts::AttemptKey;
use crate::executor::{AttemptSpec, ExecInput, ExecOutput, PathAccess};
use crate::mask::Mask;
use crate::plan::{Action, Stage, StageId};
use crate::spec::IoMode;
use crate::step::env_suffix;
use crate::template::{value_text, Ref, Template};

use super::end::AttemptEnd;
use super::keys::input_artifacts;
use super::{chain, lookup_value, Ctx, StageResult, Track};

/// Where an attempt's files are: its directory on this machine (its log is always here),
/// and the inputs, outputs and values it sees: in that directory, or under the container
/// root of an executor that runs stages away from this file system (a pod), which gets a
/// transfer plan for `drivetrain exec` instead of materialized inputs.
pub(super) struct Layout {
    pub(super) dir: PathBuf,
    /// The container root, where the attempt runs under one.
    pub(super) remote: Option<PathBuf>,
    pub(super) inputs: PathBuf,
    pub(super) outputs: PathBuf,
    pub(super) values: PathBuf,
}

impl Layout {
    fn new(ctx: &Ctx, key: &AttemptKey) -> Layout {
        let dir = key.work_dir(&ctx.opts.work_dir);
        let remote = ctx.executor.container_root();
        let base = remote.clone().unwrap_or_else(|| dir.clone());
        Layout {
            inputs: base.join("inputs"),
            outputs: base.join("outputs"),
            values: base.join("values.json"),
            dir,
            remote,
        }
    }

    /// Where an attempt away from this machine (a pod) appends its metrics, uploaded with
    /// its values when it ends.
    pub(super) fn metrics(&self) -> PathBuf {
        let base = self.remote.as_ref().unwrap_or(&self.dir);
        base.join("metrics.jsonl")
    }

    /// Kept across the attempts of this stage (and items) in this run: checkpoints. (In a
    /// pod they live as long as the pod: a volume keeps them across attempts there.)
    fn checkpoints(&self, ctx: &Ctx, key: &AttemptKey) -> Result<PathBuf, String> {
        match &self.remote {
            Some(root) => Ok(root.join("checkpoints")),
            None => {
                let c = key.checkpoints_dir(&ctx.opts.work_dir);
                mkdirs(&c)?;
                Ok(c)
            }
        }
    }
}

fn mkdirs(p: &Path) -> Result<(), String> {
    std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
}

/// Makes the attempt's directory afresh: a resumed run may run an attempt number again.
/// One `mkdir` as a rule; the run's first attempt makes the run's directory too.
fn fresh_dir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_dir_all(dir);
            mkdirs(dir)
        }
        Err(_) => mkdirs(dir),
    }
}

/// Where the command finds each input and writes each output (a path, or a URL for
/// `mode: url`; an absent optional input is empty), and what a pod's wrapper moves.
#[derive(Default)]
struct Paths {
    inputs: BTreeMap<String, String>,
    outputs: BTreeMap<String, String>,
    fetch: Vec<ExecInput>,
    upload: Vec<ExecOutput>,
}

impl Paths {
    async fn of(
        ctx: &Ctx,
        stage: &Stage,
        key: &AttemptKey,
        layout: &Layout,
        upstream: &BTreeMap<StageId, StageResult>,
        reattaching: bool,
    ) -> Result<Paths, String> {
        let mut paths = Paths::default();
        for input in &stage.inputs {
            let producer = upstream.get(&input.stage);
            let path = match producer.and_then(|r| r.outputs.get(&input.output)) {
                // For data too large to copy, the stage reads the objects where they are.
                Some(art) if input.mode == IoMode::Url => {
                    ctx.artifacts.url_of(art).await.map_err(|e| {
                        format!("cannot resolve input `{}`: {}", input.name, chain(&e))
                    })?
                }
                Some(art) => {
                    let dest = layout.inputs.join(&input.name);
                    if layout.remote.is_some() {
                        paths.fetch.push(ExecInput {
                            name: input.name.clone(),
                            artifact: art.clone(),
                            dest: dest.clone(),
                        });
                    } else if !reattaching {
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
                    dest.display().to_string()
                }
                // An optional input whose producer was skipped is absent; so is any input
                // of a hook whose producer did not succeed.
                None if input.optional || stage.hook.is_some() => String::new(),
                None => return Err(format!("input `{}` has no artifact", input.name)),
            };
            paths.inputs.insert(input.name.clone(), path);
        }
        for o in &stage.outputs {
            if o.mode == IoMode::Url {
                let url = ctx
                    .artifacts
                    .output_url(key, &o.name)
                    .map_err(|e| format!("cannot prepare output `{}`: {}", o.name, chain(&e)))?;
                paths.outputs.insert(o.name.clone(), url);
                continue;
            }
            let p = layout.outputs.join(&o.name);
            if layout.remote.is_some() {
                paths.upload.push(ExecOutput {
                    name: o.name.clone(),
                    dir: p.clone(),
                });
            } else if !reattaching {
                mkdirs(&p)?;
            }
            paths
                .outputs
                .insert(o.name.clone(), p.display().to_string());
        }
        Ok(paths)
    }
}

/// The attempt's command, working directory and (for a built-in step) config, not yet
/// rendered. A built-in step runs as `drivetrain step NAME`, the same contract as in a
/// container: the rendered config in the environment.
fn command<'s>(
    ctx: &Ctx,
    stage: &'s Stage,
    layout: &Layout,
) -> (Vec<Template>, Option<Template>, Option<&'s Value>) {
    match &stage.action {
        Action::Command { argv, workdir, .. } => (argv.clone(), workdir.clone(), None),
        // Never prepared: an approval runs nothing (see `super::approval`).
        Action::Approval { .. } => (Vec::new(), None, None),
        Action::Step { name, config, .. } => {
            let command = match &layout.remote {
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
    }
}

/// The attempt's argv and working directory. Scripts beside the pipeline: a relative
/// `workdir` is the pipeline's folder's, and where the attempt's own directory is the
/// working one, a relative path naming a file of that folder is that file. In a pod, no
/// `workdir` means the image's own.
fn command_line(
    ctx: &Ctx,
    layout: &Layout,
    (argv, workdir): (&[Template], Option<&Template>),
    step_config: Option<&Value>,
    render: &dyn Fn(&Template) -> String,
) -> Result<(Vec<String>, PathBuf), Unprepared> {
    // A pod has no folder of the engine's machine.
    use crate::template::Ref;
    let names = |dir: &Ref| {
        argv.iter()
            .chain(workdir)
            .any(|t| t.refs().any(|(r, _)| r == dir))
    };
    let remote = layout.remote.is_some();
    if remote && names(&Ref::PipelineDir) {
        return Err(Unprepared(format!(
            "`{}` is the pipeline's folder on the engine's machine, which the stage's pod does not have: put what the stage needs from it into its image, or give it as an input",
            super::folder::SYMBOL
        )));
    }
    if remote && names(&Ref::StepDir) {
        return Err(Unprepared(
            "the plugin step runs files of its folder on the engine's machine, which the stage's pod does not have: give the step an `image` holding them".to_owned(),
        ));
    }
    let mut argv: Vec<String> = argv.iter().map(render).collect();
    if let (None, None, None, Some(folder)) = (workdir, step_config, &layout.remote, &ctx.folder) {
        super::folder::resolve_args(&mut argv, folder);
    }
    let cwd = match (workdir, &layout.remote) {
        (Some(w), None) => super::folder::workdir(&render(w), ctx.folder.as_deref())?,
        (Some(w), Some(_)) => PathBuf::from(render(w)),
        (None, Some(_)) => PathBuf::new(),
        (None, None) => layout.dir.clone(),
    };
    Ok((argv, cwd))
}

/// Why an attempt could not be prepared, where it is the machine's or a store's fault (a
/// directory that could not be made, an input that could not be fetched): the attempt
/// ends in `Error` with this reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Unprepared(String);

impl From<String> for Unprepared {
    fn from(reason: String) -> Unprepared {
        Unprepared(reason)
    }
}

impl From<Unprepared> for String {
    fn from(e: Unprepared) -> String {
        e.0
    }
}

/// The attempt as an executor starts it, and where its files are; or, as the inner
/// `Err`, how it ended before starting (a secret it declares is not set). The outer
/// `Err` is an infrastructure fault with its reason.
pub(super) async fn prepare(
    ctx: &Ctx,
    stage: &Stage,
    track: Track<'_>,
    key: &AttemptKey,
    upstream: &BTreeMap<StageId, StageResult>,
) -> Result<Result<(AttemptSpec, Layout), AttemptEnd>, Unprepared> {
    let layout = Layout::new(ctx, key);
    let (argv, workdir, step_config) = command(ctx, stage, &layout);
    // An attempt a restarted engine watches again keeps its directory where the job
    // reads its inputs and writes its outputs and log there (a shared file system; a pod's
    // are its own, and its log is streamed afresh).
    let reattaching = ctx.reattaches(key) && layout.remote.is_none();
    if !reattaching {
        fresh_dir(&layout.dir)?;
    }
    // `inputs/` and `outputs/` are made by what goes into them (materialized inputs,
    // output directories): a stage without inputs or outputs costs no directory for them.
    let paths = Paths::of(ctx, stage, key, &layout, upstream, reattaching).await?;
    let (item, trial) = match track {
        Track::Item { item, .. } => (Some(item), None),
        Track::Trial { trial, .. } => (None, Some(trial)),
        Track::Stage => (None, None),
    };
    let lookup = |r: &Ref| match r {
        Ref::Input(n) => paths.inputs.get(n).cloned().map(Value::String),
        Ref::Output(n) => paths.outputs.get(n).cloned().map(Value::String),
        Ref::Item(keys) => {
            let mut v = item?;
            for k in keys {
                v = v.get(k)?;
            }
            Some(v.clone())
        }
        Ref::Trial(t) => trial?.value(t),
        // The plugin's folder as kept for this run, never the live one.
        Ref::StepDir => {
            let p = stage.plugin.as_ref()?;
            let kept = ctx.plugins.get(&p.digest)?.as_ref().ok()?;
            Some(Value::String(kept.display().to_string()))
        }
        other => lookup_value(&ctx.pipeline, ctx, upstream, other),
    };
    let render = |t: &Template| -> String { t.render(|r| lookup(r).map(|v| value_text(&v))) };
    let (argv, cwd) = command_line(
        ctx,
        &layout,
        (&argv, workdir.as_ref()),
        step_config,
        &render,
    )?;
    let step_config = step_config.map(|c| crate::template::render_value(c, &lookup));
    let checkpoints = layout.checkpoints(ctx, key)?;
    let env = Env {
        ctx,
        stage,
        key,
        track,
        layout: &layout,
        paths: &paths,
        checkpoints: &checkpoints,
        upstream,
    };
    let mut env = match env.build(step_config.as_ref(), &render) {
        Ok(env) => env,
        Err(end) => return Ok(Err(end)),
    };
    if layout.remote.is_some() {
        env.push(exec_plan(ctx, key, &paths, &layout, trial.is_some()));
    }
    let item_index = match track {
        Track::Item { index, .. } | Track::Trial { index, .. } => Some(index),
        Track::Stage => None,
    };
    let mut placement = crate::executor::Placement::of(
        &ctx.pipeline,
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
    // Secrets as files: mounted by the executor from what the engine read (on a cluster,
    // from the executor's own Secret objects).
    let secret_files = match layout.remote {
        Some(_) => Vec::new(),
        None => match super::secrets::files(home(ctx), stage) {
            Ok(files) => files,
            Err(end) => return Ok(Err(end)),
        },
    };
    // The values of the stage's secrets, which nothing the engine keeps may show.
    let mask = Mask::new(super::secrets::masked(stage, &env, &secret_files));
    let spec = AttemptSpec {
        run_id: key.run.clone(),
        stage: key.stage_key(),
        attempt: key.attempt,
        argv,
        env,
        workdir: cwd,
        log: layout.dir.join("log.txt"),
        distributed: stage.distributed.clone(),
        access: access(ctx, stage, (key, track), &layout, &checkpoints)?,
        placement,
        mask,
        secret_files,
    };
    Ok(Ok((spec, layout)))
}

/// `DRIVETRAIN_EXEC_PLAN`: what `drivetrain exec` fetches and uploads around the command
/// of an attempt away from this machine (a pod).
fn exec_plan(
    ctx: &Ctx,
    key: &AttemptKey,
    paths: &Paths,
    layout: &Layout,
    trial: bool,
) -> (String, String) {
    let plan = crate::executor::ExecPlan {
        store: ctx.artifacts.url().to_owned(),
        run: key.run.clone(),
        stage: key.stage_key(),
        attempt: key.attempt,
        inputs: paths.fetch.clone(),
        outputs: paths.upload.clone(),
        values: layout.values.clone(),
        metrics: trial.then(|| layout.metrics()),
    };
    (
        "DRIVETRAIN_EXEC_PLAN".into(),
        serde_json::to_string(&plan).unwrap_or_default(),
    )
}

/// What an attempt's environment is made of.
struct Env<'a> {
    ctx: &'a Ctx,
    stage: &'a Stage,
    key: &'a AttemptKey,
    track: Track<'a>,
    layout: &'a Layout,
    paths: &'a Paths,
    checkpoints: &'a Path,
    upstream: &'a BTreeMap<StageId, StageResult>,
}

impl Env<'_> {
    /// The attempt's environment, in order: the engine's contract (`DRIVETRAIN_*`), the
    /// stage's `env`, then its secrets. `Err` ends the attempt: a secret is not set.
    fn build(
        &self,
        step_config: Option<&Value>,
        render: &dyn Fn(&Template) -> String,
    ) -> Result<Vec<(String, String)>, AttemptEnd> {
        let (ctx, key, layout) = (self.ctx, self.key, self.layout);
        let path = |p: &Path| p.display().to_string();
        let mut env: Vec<(String, String)> = vec![
            ("DRIVETRAIN_RUN_ID".into(), key.run.clone()),
            ("DRIVETRAIN_STAGE".into(), key.stage_key()),
            ("DRIVETRAIN_ATTEMPT".into(), key.attempt.to_string()),
            ("DRIVETRAIN_PIPELINE".into(), ctx.pipeline.name.clone()),
            ("DRIVETRAIN_INPUTS_DIR".into(), path(&layout.inputs)),
            ("DRIVETRAIN_OUTPUTS_DIR".into(), path(&layout.outputs)),
            ("DRIVETRAIN_VALUES".into(), path(&layout.values)),
            (
                "DRIVETRAIN_PARAMS".into(),
                serde_json::to_string(&ctx.params).unwrap_or_default(),
            ),
            ("DRIVETRAIN_STORE".into(), ctx.artifacts.url().to_owned()),
        ];
        // Built-in steps resolve a relative path the user wrote (ingest's `source`)
        // against the pipeline file's folder, as the user reads the file; the local
        // executor opens the way to it in a root engine's stage's view.
        if let Some(dir) = &ctx.folder {
            env.push(("DRIVETRAIN_PIPELINE_DIR".into(), path(dir)));
        }
        if let Track::Item { index, item } = self.track {
            env.push(("DRIVETRAIN_ITEM".into(), value_text(item)));
            env.push(("DRIVETRAIN_ITEM_INDEX".into(), index.to_string()));
        }
        if let Track::Trial { index, trial } = self.track {
            env.extend(trial.env(index));
            let metrics = match layout.remote {
                Some(_) => layout.metrics(),
                None => trial.metrics.clone(),
            };
            env.push(("DRIVETRAIN_METRICS".into(), path(&metrics)));
        }
        for (name, p) in &self.paths.inputs {
            env.push((format!("DRIVETRAIN_INPUT_{}", env_suffix(name)), p.clone()));
        }
        for (name, art) in input_artifacts(self.stage, self.upstream) {
            env.push((
                format!("DRIVETRAIN_INPUT_{}_DIGEST", env_suffix(&name)),
                art.digest,
            ));
        }
        env.push(("DRIVETRAIN_CHECKPOINTS".into(), path(self.checkpoints)));
        for (name, p) in &self.paths.outputs {
            env.push((format!("DRIVETRAIN_OUTPUT_{}", env_suffix(name)), p.clone()));
        }
        if let Action::Step { registry: true, .. } = &self.stage.action {
            // Why the registry is written: the approvals that passed upstream.
            let passed = super::approval::passed_upstream(ctx, self.stage).unwrap_or_default();
            env.push((
                "DRIVETRAIN_APPROVALS".into(),
                serde_json::to_string(&passed).unwrap_or_default(),
            ));
        }
        if let Some(c) = step_config {
            env.push(("DRIVETRAIN_STEP_CONFIG".into(), c.to_string()));
            // A built-in step on this machine reaches the store (and the registry) as the
            // engine does; in a pod, credentials come from the pod's own secrets.
            if layout.remote.is_none() {
                env.extend(store_config_env(&ctx.run.project));
            }
        }
        for (k, t) in &self.stage.env {
            env.push((k.clone(), render(t)));
        }
        self.secrets(&mut env)?;
        Ok(env)
    }

    /// The stage's secrets as environment values. On a cluster secrets come from Secret
    /// objects the executor references; here from the engine ([`super::secrets`]).
    fn secrets(&self, env: &mut Vec<(String, String)>) -> Result<(), AttemptEnd> {
        if self.layout.remote.is_some() {
            return Ok(());
        }
        super::secrets::env_values(home(self.ctx), self.stage, env)
    }
}

/// The engine's home: where its work directory is.
fn home(ctx: &Ctx) -> &Path {
    ctx.opts.work_dir.parent().unwrap_or(&ctx.opts.work_dir)
}

/// What the attempt may read and write ([`AttemptSpec::access`]): the engine's home and
/// the store read-only, the state database and other attempts hidden, its own
/// directory, checkpoints and `mode: url` outputs writable, its inputs read-only again.
/// What of a local store belongs to other projects than the run's: for a project's run
/// (its store `BASE/projects/NAME`), everything of `BASE` but its own; for the default
/// project's, `BASE/projects`.
fn other_projects(ctx: &Ctx) -> Vec<PathBuf> {
    let Some(root) = ctx.artifacts.local_root() else {
        return Vec::new();
    };
    let project = ctx.run.project.as_str();
    if project == crate::access::DEFAULT_PROJECT {
        let projects = root.join("projects");
        return match projects.is_dir() {
            true => vec![projects],
            false => Vec::new(),
        };
    }
    // A store of its own elsewhere (`DRIVETRAIN_PROJECT_<NAME>_STORE`): nothing to hide.
    let Some(base) = root
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "projects") && root.ends_with(project))
        .and_then(Path::parent)
    else {
        return Vec::new();
    };
    let entries = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    let mut hidden: Vec<PathBuf> = entries(base)
        .into_iter()
        .filter(|p| p.file_name().is_none_or(|n| n != "projects"))
        .collect();
    hidden.extend(
        entries(&base.join("projects"))
            .into_iter()
            .filter(|p| p.as_path() != root),
    );
    hidden
}

fn access(
    ctx: &Ctx,
    stage: &Stage,
    (key, track): (&AttemptKey, Track<'_>),
    layout: &Layout,
    checkpoints: &Path,
) -> Result<Vec<PathAccess>, String> {
    let ro = |path: &Path| PathAccess {
        path: path.to_path_buf(),
        ..Default::default()
    };
    let writable = |path: PathBuf| PathAccess {
        path,
        writable: true,
        ..Default::default()
    };
    let mut access = Vec::new();
    let home = home(ctx);
    access.push(ro(home));
    // Named even inside the home: a root engine's stage (host `nobody`) cannot search a
    // home (0700), and its view gets back only the entries it is given on the way.
    if let Some(root) = ctx.artifacts.local_root() {
        access.push(ro(root));
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
    // Nor the secrets the engine reads from files: a stage gets only its own, as declared.
    if super::secrets::dir(home).is_dir() {
        access.push(hide(super::secrets::dir(home)));
    }
    // Nor, on a local store, another project's artifacts.
    access.extend(other_projects(ctx).into_iter().map(hide));
    access.push(writable(layout.dir.clone()));
    access.push(writable(checkpoints.to_path_buf()));
    // A trial appends its metrics to a file kept across its attempts.
    if let (Track::Trial { trial, .. }, None) = (track, &layout.remote) {
        if let Some(dir) = trial.metrics.parent() {
            access.push(writable(dir.to_path_buf()));
        }
    }
    if let (Action::Step { registry: true, .. }, Some(root)) =
        (&stage.action, ctx.artifacts.local_root())
    {
        let registry = root.join("registry");
        mkdirs(&registry)?;
        access.push(PathAccess {
            shared: true,
            ..writable(registry)
        });
    }
    for o in stage.outputs.iter().filter(|o| o.mode == IoMode::Url) {
        if let Some(p) = ctx.artifacts.output_dir(key, &o.name) {
            access.push(writable(p));
        }
    }
    if !stage.inputs.is_empty() && layout.inputs.exists() {
        access.push(ro(&layout.inputs));
    }
    Ok(access)
}

/// The engine's store and registry configuration for a run of `project` (its own
/// `DRIVETRAIN_PROJECT_<NAME>_*` over the engine's: `AWS_*`, `GOOGLE_*`, `AZURE_*`,
/// `DRIVETRAIN_STORE_RETRY_TIMEOUT`, `DRIVETRAIN_REGISTRY`, `MLFLOW_*`), handed to built-in
/// steps, which open the store themselves. User commands get only what their stage
/// declares. Also `DRIVETRAIN_USER`: who runs the engine ([`crate::step::who`]), which
/// the registry records with an alias move.
pub(super) fn store_config_env(project: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = crate::cloud::project_env(project)
        .into_iter()
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
