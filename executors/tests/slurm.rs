//! The slurm executor passes the executor conformance suite against a real single-node
//! Slurm (Debian's slurm-wlm: munge, slurmctld, slurmd), started by `tests/slurm/cluster.sh`
//! under a temporary directory and stopped by PID.

use std::path::{Path, PathBuf};
use std::process::Command;

use drivetrain_engine::executor::conformance;
use drivetrain_executors::slurm::{Settings, SlurmExecutor};

struct Cluster(PathBuf);

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/slurm/cluster.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(dir)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "the Slurm cluster did not start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster(dir.to_path_buf())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/slurm/cluster.sh");
        let _ = Command::new("bash")
            .arg(script)
            .arg("stop")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_executor_conforms() {
    let dir = std::env::temp_dir().join(format!("dt-slurm-conf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = Cluster::start(&dir.join("cluster"));
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let executor = SlurmExecutor::new(Settings {
        conf: Some(cluster.0.join("slurm.conf")),
        poll_interval: Some("200ms".into()),
        ..Settings::default()
    });
    conformance::check(&executor, &work).await;
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
