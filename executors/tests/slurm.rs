//! The slurm executor passes the executor conformance suite against a real single-node
//! Slurm (Debian's slurm-wlm: munge, slurmctld, slurmd), started by `tests/slurm/cluster.sh`
//! under a temporary directory and stopped by PID.

use drivetrain_engine::executor::conformance;
use drivetrain_engine::testing::SlurmCluster;
use drivetrain_executors::slurm::{Settings, SlurmExecutor};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_executor_conforms() {
    let dir = std::env::temp_dir().join(format!("dt-slurm-conf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = SlurmCluster::start(&dir.join("cluster"), false);
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let executor = SlurmExecutor::new(Settings {
        conf: Some(cluster.conf.clone()),
        poll_interval: Some("200ms".into()),
        ..Settings::default()
    });
    conformance::check(&executor, &work).await;
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
