//! Slurm's command-line tools (`sbatch`, `squeue`, `sacct`, `scancel`, `sinfo`), run as
//! processes with the cluster's `SLURM_CONF`: the interface every Slurm site has.

use std::path::PathBuf;
use std::process::Stdio;

/// How to call the tools.
#[derive(Debug, Clone, Default)]
pub struct Cli {
    /// Where the tools are; default: `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for every call; default: the engine's own environment.
    pub conf: Option<PathBuf>,
}

impl Cli {
    fn program(&self, tool: &str) -> PathBuf {
        match &self.bin_dir {
            Some(d) => d.join(tool),
            None => PathBuf::from(tool),
        }
    }

    /// A command for `tool` with `args`.
    pub fn command(&self, tool: &str, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(self.program(tool));
        c.args(args).stdin(Stdio::null()).kill_on_drop(true);
        if let Some(conf) = &self.conf {
            c.env("SLURM_CONF", conf);
        }
        c
    }

    /// Runs `tool` and returns its standard output, or why it failed (its stderr).
    pub async fn run(&self, tool: &str, args: &[&str]) -> Result<String, String> {
        output(self.command(tool, args), tool).await
    }
}

/// Runs `command` to its end: its stdout, or an error with its stderr.
pub async fn output(mut command: tokio::process::Command, tool: &str) -> Result<String, String> {
    let out = command
        .output()
        .await
        .map_err(|e| format!("cannot run `{tool}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{tool}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
