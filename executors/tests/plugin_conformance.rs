//! The example executor plugin (`plugins/queue-executor`: attempts as jobs in a queue
//! folder, run by a worker process) passes the executor conformance suite through the
//! plugin protocol, as local, Kubernetes and Slurm do.

use std::path::Path;
use std::process::Child;

use drivetrain_engine::executor::conformance;
use drivetrain_executors::plugin::protocol::Command;
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
        std::process::Command::new("python3")
            .arg(plugin.join("worker.py"))
            .arg(&queue)
            .spawn()
            .expect("the worker starts"),
    );
    let (spec, folder) = load(&plugin).expect("the executor file is valid");
    assert_eq!(spec.name, "queue");
    let executor = PluginExecutor::new(&spec, &folder);
    conformance::check(&executor, &dir).await;
    let jobs = || std::fs::read_dir(queue.join("jobs")).unwrap().count();
    assert_eq!(jobs(), 7, "one job per attempt the suite started");
    // `start` of an attempt already started answers its handle and starts nothing: what a
    // restarted engine re-attaches by.
    let command = Command {
        argv: vec![
            "python3".into(),
            folder.join("executor.py").display().to_string(),
        ],
        dir: folder.clone(),
    };
    let attempt = serde_json::json!({"attempt": {
        "run": "conformance", "stage": "ok", "attempt": 1, "item": null,
        "argv": ["true"], "env": [], "workdir": dir, "log": dir.join("again.log"), "ranks": [[]],
    }});
    let first = command.call("start", attempt.clone()).await.unwrap();
    let again = command.call("start", attempt).await.unwrap();
    assert_eq!(first["handle"], again["handle"]);
    assert_eq!(jobs(), 7, "the suite's `ok` attempt was not started again");
    std::fs::remove_dir_all(&dir).unwrap();
}
