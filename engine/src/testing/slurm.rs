//! A real single-node Slurm for the tests: Debian's slurm-wlm (munge, slurmctld, slurmd,
//! with `accounting` slurmdbd on a MariaDB of its own) on loopback under one directory,
//! started by `tests/slurm/cluster.sh` and stopped by PID when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/slurm/cluster.sh")
}

/// A running cluster; `conf` is its `SLURM_CONF`.
#[derive(Debug)]
pub struct SlurmCluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
}

impl SlurmCluster {
    /// Starts a cluster under `dir` (with `accounting`: slurmdbd, and a controller that
    /// forgets ended jobs after 2 s); fails the test with why if it does not start.
    pub fn start(dir: &Path, accounting: bool) -> SlurmCluster {
        SlurmCluster::start_with(dir, if accounting { &["accounting"] } else { &[] })
    }

    /// Starts a cluster with accounting and QoS preemption: QoS `urgent` preempts QoS
    /// `preemptible` (a job that may not be requeued is cancelled as `PREEMPTED`).
    pub fn start_preempting(dir: &Path) -> SlurmCluster {
        SlurmCluster::start_with(dir, &["accounting", "preemption"])
    }

    fn start_with(dir: &Path, options: &[&str]) -> SlurmCluster {
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir)
            .args(options)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "the Slurm cluster did not start (apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        SlurmCluster {
            dir: dir.to_path_buf(),
            conf: dir.join("slurm.conf"),
        }
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}
