//! The MLflow registry backend against a real `mlflow server` (SQLite backend, started
//! on loopback by the test), through the same `Registry` the steps and the CLI use, with
//! the model files in S3 (`moto_server`): MLflow takes a version's source only from
//! remote storage.

use drivetrain_engine::testing::{http, Mlflow, S3Server};
use drivetrain_steps::registry::Registry;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_aliases_history_and_files_in_mlflow() {
    let mlflow = Mlflow::start();
    let s3 = S3Server::start();
    s3.create_bucket("models");
    let dir = std::env::temp_dir().join(format!("dt-mlflow-reg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let store = "s3://models/dt";
    let registry = format!("mlflow+{}", mlflow.url());
    let local = Registry::open_with(Some(&registry), "file:///tmp/x", s3.env()).unwrap_err();
    assert!(local.to_string().contains("s3://"), "{local}");
    let reg = Registry::open_with(Some(&registry), store, s3.env()).unwrap();
    assert_eq!(reg.kind(), "mlflow");

    std::fs::write(model.join("model.json"), r#"{"w": [1]}"#).unwrap();
    let meta = json!({"source": {"run": "run-1", "pipeline": "loop", "stage": "promote", "model_digest": "sha256:aa"}});
    let v1 = reg.register("risk", &model, meta.clone()).await.unwrap();
    std::fs::write(model.join("model.json"), r#"{"w": [2]}"#).unwrap();
    let v2 = reg.register("risk", &model, meta).await.unwrap();
    assert_eq!((v1, v2), (1, 2));
    assert_eq!(reg.models().await.unwrap(), ["risk"]);
    assert_eq!(reg.versions("risk").await.unwrap().len(), 2);
    assert_eq!(
        reg.file("risk", 1, "model.json").await.unwrap(),
        br#"{"w": [1]}"#
    );
    assert_eq!(
        reg.file("risk", 2, "model.json").await.unwrap(),
        br#"{"w": [2]}"#
    );
    // An alias never set is unset (MLflow's own alias endpoint would answer 400).
    assert!(reg.alias("risk", "production").await.unwrap().is_none());
    assert!(reg.version("risk", 9).await.unwrap().is_none());

    let e = reg
        .move_alias("risk", "production", 1, json!({"gate": "passed"}))
        .await
        .unwrap();
    assert_eq!(
        (e["generation"].as_u64(), &e["from"]),
        (Some(1), &json!(null))
    );
    let e = reg
        .move_alias("risk", "production", 2, json!({"gate": "passed"}))
        .await
        .unwrap();
    assert_eq!((e["generation"].as_u64(), &e["from"]), (Some(2), &json!(1)));
    assert_eq!(
        reg.alias("risk", "production").await.unwrap().unwrap()["version"],
        2
    );
    assert_eq!(reg.resolve("risk@production").await.unwrap()["version"], 2);
    let back = reg.rollback("risk", "production").await.unwrap();
    assert_eq!(back["version"], 1);
    let history = reg.history("risk").await.unwrap();
    assert_eq!(history.len(), 3);
    assert_eq!(history[2]["note"]["rollback_of"], 2);
    assert!(reg
        .move_alias("risk", "production", 7, json!({}))
        .await
        .is_err());

    // What MLflow itself holds: the alias, the source URL of the files, the lineage tags.
    let (status, body) = http(
        mlflow.port,
        "GET",
        "/api/2.0/mlflow/registered-models/alias?name=risk&alias=production",
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let found: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mv = &found["model_version"];
    assert_eq!(mv["version"], "1");
    assert!(
        mv["source"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{store}/registry/risk/files/")),
        "{mv}"
    );
    let tags = mv["tags"].as_array().unwrap();
    assert!(tags
        .iter()
        .any(|t| t["key"] == "drivetrain.run" && t["value"] == "run-1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_registry_url_that_is_not_mlflow_http_is_refused() {
    let err =
        Registry::open_with(Some("mlflow+ftp://x"), "s3://b", Default::default()).unwrap_err();
    assert!(err.to_string().contains("mlflow+http://"), "{err}");
}
