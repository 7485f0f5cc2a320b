//! A real `torch.distributed` job through the engine: `pipelines/lane-detection-ddp.yaml`
//! trains a PyTorch lane model on two ranks (DDP over gloo, on the CPU here) on the frames
//! the loop's own `fleet-sim` and `ingest` made. PyTorch comes from PyPI into a venv of
//! its own (`.ci/run`); its `python3` is first on PATH for the stage.

use crate::common;

use common::*;

fn values(home: &Home, run: &str) -> serde_json::Value {
    stage(&home.status(run), "train-lanes")["values"].clone()
}

#[test]
fn ddp_ranks_train_identical_weights_and_a_retry_resumes_from_the_checkpoint() {
    let python = drivetrain_engine::testing::torch_venv_bin("python3");
    let path = format!(
        "{}:{}",
        python.parent().unwrap().display(),
        std::env::var("PATH").unwrap()
    );
    let home = Home::new("ddp");
    let pipeline = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/pipelines/lane-detection-ddp.yaml"
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["run", pipeline];
        args.extend(extra);
        let o = home.drivetrain_env(&args, &[("PATH", &path)]);
        assert_ok(&o);
        run_id(&o)
    };

    // Straight through: both ranks end with the same weights, rank 0 reports them.
    let straight = run(&[]);
    let v = values(&home, &straight);
    assert_eq!(v["world_size"], 2, "{v}");
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["resumed_after_epoch"], serde_json::Value::Null);
    let weights = v["weights_sha256"].as_str().unwrap().to_owned();
    let log = text(
        &home
            .drivetrain(&["logs", &straight, "--stage", "train-lanes"])
            .stdout,
    );
    for rank in 0..2 {
        assert!(
            log.contains(&format!("rank {rank}: weights sha256 {weights}")),
            "{log}"
        );
    }
    // The first attempt fails after epoch 1 (rank 0 exits, the gang is stopped); the retry
    // resumes from the checkpoint epoch 1 wrote and ends with the same weights.
    let resumed = run(&["-p", "fail_after_epoch=1"]);
    let st = home.status(&resumed);
    assert_eq!(stage(&st, "train-lanes")["attempts"], 2, "{st}");
    let v = values(&home, &resumed);
    assert_eq!(v["resumed_after_epoch"], 0, "{v}");
    assert_eq!(v["weights_sha256"], weights.as_str(), "{v}");
    let log = text(
        &home
            .drivetrain(&["logs", &resumed, "--stage", "train-lanes"])
            .stdout,
    );
    assert!(log.contains("rank 1: resuming after epoch 0"), "{log}");
}
