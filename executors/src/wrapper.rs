//! The wrapper around a stage's command where the stage runs away from the engine's file
//! system (a pod): `drivetrain-exec -- CMD…`, a small binary of its own (`src/bin/`),
//! and `drivetrain exec -- CMD…`, the same code in the whole binary.
//!
//! The engine hands the pod a transfer plan (`DRIVETRAIN_EXEC_PLAN`, an
//! [`ExecPlan`]): the wrapper fetches every input artifact from the store into its
//! directory, runs the command (argv as given, never through a shell), and only if it
//! exits 0 uploads the output directories and `values.json` under the attempt's prefix.
//! Nothing it uploads is an artifact until the engine has published the listing, so a
//! failed or killed pod never leaves a partial artifact behind.
//!
//! `--install DIR` copies the running binary into `DIR` (the init container of every
//! pod, so any image can run the wrapper): as `drivetrain-exec`
//! ([`drivetrain_engine::executor::REMOTE_WRAPPER`]) from the small binary, as
//! `drivetrain` ([`drivetrain_engine::executor::REMOTE_BINARY`]) from the whole one,
//! which a pod needs only where its command is the binary (a built-in step).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use drivetrain_engine::artifacts::{ArtifactStore, AttemptKey};
use drivetrain_engine::executor::ExecPlan;
pub use drivetrain_engine::executor::{REMOTE_BINARY, REMOTE_WRAPPER};

const USAGE: &str = "usage: drivetrain-exec -- COMMAND [ARG]...\n       drivetrain-exec --install DIR\n       drivetrain-exec --task FILE\n\nRuns COMMAND between fetching a pod's inputs and uploading its outputs (the transfer\nplan in DRIVETRAIN_EXEC_PLAN), copies this binary into DIR, or runs the task of a Slurm\njob array that FILE describes.";

/// `drivetrain-exec`'s arguments and exit code (1 on an error of its own, 2 on a usage
/// error, else the command's).
pub fn main(args: &[String]) -> ExitCode {
    let result = match args {
        [flag] if flag == "--version" || flag == "-V" => {
            println!("drivetrain-exec {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        [flag, dir] if flag == "--install" => install(Path::new(dir), REMOTE_WRAPPER),
        [flag, file] if flag == "--task" => task(Path::new(file)),
        [dashes, argv @ ..] if dashes == "--" => exec(argv),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(1)
    })
}

/// Copies the running binary into `dir` under the file name of `remote` (one of
/// [`REMOTE_WRAPPER`] and [`REMOTE_BINARY`], the paths the pod's command uses).
pub fn install(dir: &Path, remote: &str) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the running binary")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = Path::new(remote)
        .file_name()
        .context("a remote path names a file")?;
    let dest = dir.join(name);
    let _ = std::fs::remove_file(&dest);
    // A hard link where the image and the volume share a file system, else a copy.
    if std::fs::hard_link(&exe, &dest).is_err() {
        std::fs::copy(&exe, &dest)
            .with_context(|| format!("cannot copy {} to {}", exe.display(), dest.display()))?;
    }
    eprintln!("drivetrain exec: installed {}", dest.display());
    Ok(ExitCode::SUCCESS)
}

/// Runs one task of a Slurm job array (`--task FILE`): the item's attempt the slurm
/// executor wrote into `file` ([`crate::slurm::submit::Task`]), which is read and removed
/// (its environment holds the item's secrets). The task's own environment (Slurm's
/// variables, the GPUs it was given) stays under the item's; its output goes to the item's
/// log; it becomes the item's command (`exec`), so its exit status is the task's.
pub fn task(file: &Path) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    use std::os::unix::process::CommandExt as _;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let _ = std::fs::remove_file(file);
    let t: crate::slurm::submit::Task =
        serde_json::from_slice(&bytes).context("not a task of the slurm executor")?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&t.log)
        .with_context(|| format!("cannot open {}", t.log.display()))?;
    let (program, args) = t.argv.split_first().context("no command to run")?;
    let err = std::process::Command::new(program)
        .args(args)
        .env_remove("DRIVETRAIN_TASKS")
        .env_remove("DRIVETRAIN_EXE")
        .envs(t.env.iter().cloned())
        .current_dir(&t.workdir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .exec();
    if err.kind() == std::io::ErrorKind::NotFound {
        let _ = writeln!(log, "drivetrain: `{program}`: command not found");
        return Ok(ExitCode::from(127));
    }
    Err(err).with_context(|| format!("cannot start `{program}`"))
}

/// Runs `argv` between fetching the inputs and uploading the outputs.
pub fn exec(argv: &[String]) -> anyhow::Result<ExitCode> {
    let text = std::env::var("DRIVETRAIN_EXEC_PLAN").context(
        "DRIVETRAIN_EXEC_PLAN is not set: `drivetrain exec` runs inside a pod an executor started",
    )?;
    let plan: ExecPlan =
        serde_json::from_str(&text).context("DRIVETRAIN_EXEC_PLAN is not a transfer plan")?;
    let (program, args) = argv.split_first().context("no command to run")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let store = ArtifactStore::open(&plan.store)?;
        let key = AttemptKey::from_stage_key(plan.run.clone(), &plan.stage, plan.attempt);
        for input in &plan.inputs {
            store
                .materialize(&input.artifact, &input.dest)
                .await
                .with_context(|| format!("cannot fetch input `{}`", input.name))?;
        }
        for output in &plan.outputs {
            std::fs::create_dir_all(&output.dir)
                .with_context(|| format!("cannot create {}", output.dir.display()))?;
        }
        if let Some(parent) = plan.values.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let mut child = match tokio::process::Command::new(program).args(args).spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("drivetrain exec: `{program}`: command not found");
                return Ok(ExitCode::from(127));
            }
            Err(e) => return Err(e).with_context(|| format!("cannot start `{program}`")),
        };
        // The kubelet stops a pod with SIGTERM to its first process: pass it on.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let status = tokio::select! {
            s = child.wait() => s?,
            _ = term.recv() => {
                if let Some(pid) = child.id() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                child.wait().await?
            }
        };
        if !status.success() {
            use std::os::unix::process::ExitStatusExt as _;
            let code = status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(1);
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        // Ranks of a distributed stage all run this; rank 0's outputs are the stage's.
        if std::env::var("RANK").is_ok_and(|r| r != "0") {
            return Ok(ExitCode::SUCCESS);
        }
        for output in &plan.outputs {
            let n = store
                .upload_dir(&key, &output.name, &output.dir)
                .await
                .with_context(|| format!("cannot upload output `{}`", output.name))?;
            eprintln!(
                "drivetrain exec: uploaded {n} file(s) of output `{}`",
                output.name
            );
        }
        match std::fs::read(&plan.values) {
            Ok(bytes) => store
                .put_values(&key, bytes)
                .await
                .context("cannot upload values.json")?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("cannot read values.json"),
        }
        // A search's trial: the metrics it pushed, for the engine to read when it ends.
        if let Some(path) = &plan.metrics {
            match std::fs::read(path) {
                Ok(bytes) => store
                    .put_attempt_file(&key, "metrics.jsonl", bytes)
                    .await
                    .context("cannot upload metrics.jsonl")?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).context("cannot read the metrics file"),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
