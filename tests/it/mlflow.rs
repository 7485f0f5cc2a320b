//! The driving loop promoting into MLflow: a real `mlflow server` and an S3 server
//! (`moto_server`), both started on loopback, configured only through
//! `DRIVETRAIN_REGISTRY`, `DRIVETRAIN_STORE` and the AWS variables. The second run's
//! candidate is validated against the model the first run promoted, read back from MLflow.

use crate::common;
use common::{assert_ok, env_pairs, run_id, stage, text, Home};
use drivetrain_engine::testing::{http, Mlflow, S3Server};

#[test]
fn the_driving_loop_promotes_into_mlflow() {
    let mlflow = Mlflow::start();
    let s3 = S3Server::start();
    s3.create_bucket("fleet");
    let mut env = s3.env();
    env.insert("DRIVETRAIN_STORE".into(), "s3://fleet/dt".into());
    env.insert(
        "DRIVETRAIN_REGISTRY".into(),
        format!("mlflow+{}", mlflow.url()),
    );
    let env = env_pairs(&env);
    let home = Home::new("mlflow-loop");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/driving-loop.yaml");
    let o = home.drivetrain_env(&["run", file, "--param", "drives=3"], &env);
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("promote: promoted risk-model version 1 to `production`"),
        "{}",
        text(&o.stdout)
    );
    let first = run_id(&o);

    // MLflow has the version, its lineage and the alias.
    let (status, body) = http(
        mlflow.port,
        "GET",
        "/api/2.0/mlflow/registered-models/alias?name=risk-model&alias=production",
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let mv: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mv = &mv["model_version"];
    assert_eq!(mv["version"], "1");
    assert!(
        mv["source"]
            .as_str()
            .unwrap()
            .starts_with("s3://fleet/dt/registry/risk-model/files/"),
        "{mv}"
    );
    assert!(mv["tags"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["key"] == "drivetrain.run" && t["value"] == first.as_str()));

    let o = home.drivetrain_env(
        &["run", file, "--param", "drives=3", "--param", "seed=8"],
        &env,
    );
    assert_ok(&o);
    let second = run_id(&o);
    let st = home.drivetrain_env(&["status", &second, "--output", "json"], &env);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    let validate = &stage(&st, "validate")["values"];
    assert!(
        validate["metrics"]["production"]["f1"].is_number(),
        "the candidate was measured against MLflow's production model: {validate}"
    );

    // The CLI reads the same registry.
    let listed = home.drivetrain_env(&["registry", "list"], &env);
    assert!(
        text(&listed.stdout).contains("risk-model"),
        "{}{}",
        text(&listed.stdout),
        text(&listed.stderr)
    );
    let o = home.drivetrain_env(&["registry", "alias", "risk-model", "candidate", "1"], &env);
    assert_ok(&o);
    let shown = home.drivetrain_env(
        &["registry", "show", "risk-model@candidate", "-o", "json"],
        &env,
    );
    assert!(
        text(&shown.stdout).contains("\"model_digest\": \"sha256:"),
        "{}",
        text(&shown.stdout)
    );
    let history = home.drivetrain_env(
        &["registry", "history", "risk-model", "--output", "json"],
        &env,
    );
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert!(history.as_array().unwrap().len() >= 2, "{history}");
}
