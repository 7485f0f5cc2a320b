//! The artifact store on S3, against a real S3 protocol server (`moto_server`, started on
//! loopback by each test): object_store's own conformance functions run against the store
//! as drivetrain configures it from the standard AWS variables, then drivetrain's artifact
//! suite (the one `memory://` and `file://` pass).

use std::collections::BTreeMap;

use drivetrain_engine::artifacts::{conformance, ArtifactStore};
use drivetrain_engine::cloud;
use drivetrain_engine::testing::S3Server;
use object_store::integration::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_conformance_on_our_s3_configuration() {
    let s3 = S3Server::start();
    s3.create_bucket("conformance");
    let mut env = s3.env();
    // S3 has no `If-None-Match` on copies; a multipart copy completed conditionally is
    // object_store's portable way.
    env.insert("AWS_COPY_IF_NOT_EXISTS".into(), "multipart".into());
    let store = cloud::s3_builder("s3://conformance", &env)
        .unwrap()
        .build()
        .unwrap();
    put_get_delete_list(&store).await;
    list_with_offset_exclusivity(&store).await;
    get_opts(&store).await;
    list_uses_directories_correctly(&store).await;
    list_with_delimiter(&store).await;
    rename_and_copy(&store).await;
    stream_get(&store).await;
    multipart(&store, &store).await;
    multipart_with_opts(&store, &store).await;
    multipart_put_part_out_of_order(&store, &store).await;
    multipart_race_condition(&store, true).await;
    multipart_out_of_order(&store).await;
    list_paginated(&store, &store).await;
    put_opts(&store, true).await;
    copy_if_not_exists(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_artifact_suite_passes_on_s3() {
    let s3 = S3Server::start();
    s3.create_bucket("artifacts");
    let store = ArtifactStore::open_with("s3://artifacts/team/a", &s3.env()).unwrap();
    conformance::check(&store).await;
    // Everything went under the URL's prefix.
    let keys = ArtifactStore::open_with("s3://artifacts", &s3.env())
        .unwrap()
        .list("")
        .await
        .unwrap();
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("team/a/")), "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_endpoint_come_from_a_profile() {
    let s3 = S3Server::start();
    s3.create_bucket("profiled");
    let dir = std::env::temp_dir().join(format!("dt-aws-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("credentials"),
        "[fleet]\naws_access_key_id = testing\naws_secret_access_key = testing\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("config"),
        format!(
            "[profile fleet]\nregion = eu-west-1\nendpoint_url = {}\n",
            s3.endpoint()
        ),
    )
    .unwrap();
    let env: BTreeMap<String, String> = [
        ("AWS_PROFILE", "fleet".to_owned()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("credentials").display().to_string(),
        ),
        ("AWS_CONFIG_FILE", dir.join("config").display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let store = ArtifactStore::open_with("s3://profiled", &env).unwrap();
    conformance::publishes_and_materializes(&store).await;
    std::fs::remove_dir_all(&dir).unwrap();
}
