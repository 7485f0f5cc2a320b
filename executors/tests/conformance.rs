//! The local executor passes the executor conformance suite.

use drivetrain_engine::executor::conformance;
use drivetrain_executors::local::LocalExecutor;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_executor_conforms() {
    let dir = std::env::temp_dir().join(format!("dt-exec-conf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    conformance::check(&LocalExecutor::default(), &dir).await;
    std::fs::remove_dir_all(&dir).unwrap();
}
