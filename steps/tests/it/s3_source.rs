//! `ingest`'s drive logs from an S3 prefix, against a real S3 protocol server (moto,
//! started on loopback by the test; see `drivetrain_engine::testing::S3Server`): keys
//! with non-ASCII characters, `%` and `#` are fetched as they are listed (they were
//! percent-encoded a second time: `NoSuchKey`), every log is recorded by its exact URL
//! (what `forget` matches), and fetched copies do not outlive their reading.

use crate::common;
use common::{python_mcap, rt, tmp};

use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::testing::S3Server;
use drivetrain_steps::ingest::IngestConfig;
use drivetrain_steps::logsource::LogSource;
use object_store::{ObjectStoreExt, PutPayload};
use serde_json::json;

#[test]
fn keys_are_fetched_as_listed() {
    let dir = tmp("s3-source");
    let s3 = S3Server::start();
    s3.create_bucket("fleet");
    let env = s3.env();
    let log = dir.join("log.mcap");
    let messages: Vec<_> = (0..20u64)
        .map(|i| {
            json!({"topic": "/vehicle", "encoding": "json", "log_time": i * 100_000_000,
                        "data": json!({"speed_mps": i}).to_string()})
        })
        .collect();
    python_mcap(&log, "", 1 << 20, "ZSTD", &messages);
    let bytes = std::fs::read(&log).unwrap();
    let names = ["fahrt-ü.mcap", "tag%20.mcap", "run#2.mcap", "plain.mcap"];
    let store = ArtifactStore::open_with("s3://fleet", &env).unwrap();
    let runtime = rt();
    for name in names {
        let key = object_store::path::Path::parse(format!("incoming/{name}")).unwrap();
        runtime
            .block_on(
                store
                    .object_store()
                    .put(&key, PutPayload::from(bytes.clone())),
            )
            .unwrap();
    }
    let open = || LogSource::Store {
        url: "s3://fleet/incoming/".into(),
        store: ArtifactStore::open_with("s3://fleet/incoming/", &env).unwrap(),
        scratch: dir.join("scratch"),
    };
    let ingest = |cfg: &IngestConfig, out: &str| {
        let frames = dir.join(out);
        std::fs::create_dir_all(&frames).unwrap();
        let source = open();
        let cfg = cfg.clone();
        runtime.block_on(async move {
            tokio::task::spawn_blocking(move || {
                drivetrain_steps::ingest::ingest(&cfg, &source, &frames, None, None)
            })
            .await
            .unwrap()
        })
    };
    let v = ingest(&IngestConfig::default(), "all").unwrap();
    assert_eq!(v["files"], 4, "{v}");
    assert_eq!(v["frames"], 80, "{v}");
    assert!(
        v["sources"]
            .as_array()
            .unwrap()
            .contains(&json!("s3://fleet/incoming/fahrt-ü.mcap")),
        "{v}"
    );
    // Fetched logs are removed once read.
    assert_eq!(std::fs::read_dir(dir.join("scratch")).unwrap().count(), 0);

    let _ = std::fs::remove_dir_all(&dir);
}
