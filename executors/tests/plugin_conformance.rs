//! The example executor plugin (`plugins/queue-executor`: attempts as jobs in a queue
//! folder, run by a worker process) passes the executor conformance suite through the
//! plugin protocol, as local, Kubernetes and Slurm do.

use std::path::Path;
use std::process::{Child, Command};

use drivetrain_engine::executor::conformance;
use drivetrain_executors::plugin::{load, PluginExecutor};

/// The worker, killed with its test.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_executor_plugin_conforms() {
    let dir = std::env::temp_dir().join(format!("dt-exec-plugin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let queue = dir.join("queue");
    std::fs::create_dir_all(&queue).unwrap();
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/queue-executor");
    // The plugin's command reads the queue from the engine's environment, as it would
    // from a `serve` or `run` started with `DRIVETRAIN_QUEUE` set. This test binary has
    // this one test, so no other thread reads the environment meanwhile.
    std::env::set_var("DRIVETRAIN_QUEUE", &queue);
    let _worker = Worker(
        Command::new("python3")
            .arg(plugin.join("worker.py"))
            .arg(&queue)
            .spawn()
            .expect("the worker starts"),
    );
    let (spec, folder) = load(&plugin).expect("the executor file is valid");
    assert_eq!(spec.name, "queue");
    let executor = PluginExecutor::new(&spec, &folder);
    conformance::check(&executor, &dir).await;
    // Starting an attempt again answers the same handle: a restarted engine re-attaches.
    let handles: Vec<_> = std::fs::read_dir(queue.join("jobs")).unwrap().collect();
    assert_eq!(handles.len(), 7, "one job per attempt the suite started");
    std::fs::remove_dir_all(&dir).unwrap();
}
