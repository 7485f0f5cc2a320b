//! The engine with its artifact store on S3: a real S3 protocol server (`moto_server`)
//! started on loopback, configured only through the standard AWS variables and
//! `DRIVETRAIN_STORE`. The whole driving loop runs there; and a store that goes away in
//! the middle of a multipart upload leaves no partial artifact, and the stage's retry
//! succeeds once it is back.

use crate::common;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_ok, env_pairs, run_id, stage, text, walk, Home};
use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::testing::{free_port, S3Server};

fn list(url: &str, env: &BTreeMap<String, String>, prefix: &str) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        ArtifactStore::open_with(url, env)
            .unwrap()
            .list(prefix)
            .await
            .unwrap()
    })
}

#[test]
fn the_driving_loop_runs_with_its_store_on_s3() {
    let s3 = S3Server::start();
    s3.create_bucket("fleet");
    let mut env = s3.env();
    env.insert("DRIVETRAIN_STORE".into(), "s3://fleet/dt".into());
    let home = Home::new("s3-loop");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/driving-loop.yaml");
    let o = home.drivetrain_env(&["run", file, "--param", "drives=3"], &env_pairs(&env));
    assert_ok(&o);
    let out = text(&o.stdout);
    assert!(out.contains("store s3://fleet/dt"), "{out}");
    assert!(
        out.contains("promote: promoted risk-model version 1 to `production`"),
        "{out}"
    );
    let run = run_id(&o);
    let status = home.drivetrain_env(&["status", &run, "--output", "json"], &env_pairs(&env));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(stage(&status, "promote")["phase"], "Succeeded");
    // The artifacts and the registry are in the bucket, none in the home.
    let keys = list("s3://fleet", &env, "dt");
    for prefix in [
        format!("dt/runs/{run}/ingest/1/manifests/"),
        format!("dt/runs/{run}/train/1/"),
        "dt/registry/risk-model/versions/1/version.json".to_owned(),
        "dt/registry/risk-model/aliases/production/".to_owned(),
    ] {
        assert!(
            keys.iter().any(|k| k.starts_with(&prefix)),
            "nothing under {prefix} in {} keys",
            keys.len()
        );
    }
    assert!(!home.dir.join(".drivetrain/artifacts/runs").exists());
    // `--store` instead of the variable.
    let mut aws_only = env.clone();
    aws_only.remove("DRIVETRAIN_STORE");
    let listed = home.drivetrain_env(
        &["registry", "list", "--store", "s3://fleet/dt"],
        &env_pairs(&aws_only),
    );
    assert!(
        text(&listed.stdout).contains("risk-model  1 version(s)  production → 1"),
        "{}{}",
        text(&listed.stdout),
        text(&listed.stderr)
    );
    let logs = home.drivetrain_env(&["logs", &run, "--stage", "train"], &env_pairs(&env));
    assert_ok(&logs);
}

/// `ingest` reads its `source:` from any store URL: `pipelines/nightly-retrain.yaml` as
/// it is, given its fleet bucket on the S3 server (`fleet_logs`), its artifacts in the
/// embedded store.
/// Regression: it validated, then failed with `cannot read s3://fleet-logs/<date>/`.
#[test]
fn the_nightly_retrain_ingests_its_fleet_bucket_on_s3() {
    use object_store::{ObjectStoreExt, PutPayload};
    let s3 = S3Server::start();
    s3.create_bucket("fleet-logs");
    let env = s3.env();
    let home = Home::new("s3-source");
    let logs = home.dir.join("sim");
    std::fs::create_dir_all(&logs).unwrap();
    let sim: drivetrain_steps::sim::FleetSimConfig = serde_json::from_value(serde_json::json!(
        {"drives": 2, "duration": "30s", "rate_hz": 10, "seed": 5,
         "events": {"hard_brake": 4, "low_lane_confidence": 4}}
    ))
    .unwrap();
    let simulated = drivetrain_steps::sim::simulate(&sim, &logs).unwrap();
    // `{{ run.date }}`: today's prefix, and tomorrow's for a test that crosses midnight.
    let today = chrono::Utc::now().date_naive();
    let store = ArtifactStore::open_with("s3://fleet-logs", &env)
        .unwrap()
        .object_store();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for day in [today, today.succ_opt().unwrap()] {
        for f in std::fs::read_dir(&logs).unwrap() {
            let f = f.unwrap().path();
            let key = format!("{day}/{}", f.file_name().unwrap().to_str().unwrap());
            let bytes = std::fs::read(&f).unwrap();
            rt.block_on(store.put(&key.as_str().into(), PutPayload::from(bytes)))
                .unwrap();
        }
    }
    drop(rt);
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/pipelines/nightly-retrain.yaml"
    );
    // `notify` calls the team's `notify-team` with a webhook secret: a stand-in on PATH.
    let bin = home.dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let notified = home.dir.join("notified.txt");
    let script = bin.join("notify-team");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$@\" > {}\n", notified.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut env = env.clone();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    env.insert("PATH".into(), path);
    env.insert(
        "DRIVETRAIN_SECRET_CHAT_WEBHOOK_URL".into(),
        "https://chat.example/hook".into(),
    );
    // Two GPUs declared for `train`'s two ranks (the reference trainer runs on CPU).
    let o = home.drivetrain_env(
        &[
            "run",
            file,
            "--gpus",
            "2",
            "-p",
            "fleet_logs=s3://fleet-logs",
        ],
        &env_pairs(&env),
    );
    assert_ok(&o);
    let run = run_id(&o);
    assert!(
        std::fs::read_to_string(&notified).unwrap().contains(&run),
        "notify-team was called with the run id"
    );
    let status = home.drivetrain_env(&["status", &run, "--output", "json"], &env_pairs(&env));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let ingest = stage(&status, "ingest");
    assert_eq!(ingest["phase"], "Succeeded", "{}", text(&o.stdout));
    assert_eq!(ingest["values"]["frames"], simulated.frames, "{ingest}");
    assert_eq!(ingest["values"]["files"], 2, "{ingest}");
    for s in [
        "mine",
        "label-export",
        "label-import",
        "train",
        "validate",
        "notify",
    ] {
        assert_eq!(stage(&status, s)["phase"], "Succeeded", "{s}: {status}");
    }
    // Fetched logs went into the attempt's own directory (`fetched/`, beside its
    // values), one at a time, and none is left behind.
    let work = walk(&home.dir.join(".drivetrain/work"));
    let in_fetched = |p: &&std::path::PathBuf| p.components().any(|c| c.as_os_str() == "fetched");
    assert!(
        work.iter().any(|p| p.ends_with("fetched") && p.is_dir()),
        "ingest fetched its logs into its attempt's directory: {work:?}"
    );
    let leftovers: Vec<_> = work
        .iter()
        .filter(in_fetched)
        .filter(|p| p.is_file())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A TCP proxy in front of the S3 server that goes away (listener closed, every
/// connection dropped) once `trip_at` request bytes went through, and comes back on the
/// same port `down_for` later: the store dying mid-upload and restarting, while the
/// server's own state survives as a real S3's would.
struct FlakyProxy {
    port: u16,
    tripped: Arc<AtomicBool>,
    _rt: tokio::runtime::Runtime,
}

/// Copies `from` to `to` until either side closes, `kill` fires, or `stop` (told how many
/// bytes were just copied) says so.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut kill: tokio::sync::broadcast::Receiver<()>,
    mut stop: impl FnMut(usize) -> bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 << 10];
    loop {
        tokio::select! {
            _ = kill.recv() => return,
            n = from.read(&mut buf) => {
                let Ok(n @ 1..) = n else { return };
                if to.write_all(&buf[..n]).await.is_err() || stop(n) {
                    return;
                }
            }
        }
    }
}

impl FlakyProxy {
    fn start(upstream: u16, trip_at: u64, down_for: Duration) -> FlakyProxy {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let port = free_port();
        let tripped = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let t = tripped.clone();
        rt.spawn(async move {
            loop {
                let listener = loop {
                    match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                        Ok(l) => break l,
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                };
                let (kill, _) = tokio::sync::broadcast::channel::<()>(1);
                let mut killed = kill.subscribe();
                loop {
                    tokio::select! {
                        _ = killed.recv() => break,
                        accepted = listener.accept() => {
                            let Ok((client, _)) = accepted else { continue };
                            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { continue };
                            let (cr, cw) = client.into_split();
                            let (sr, sw) = server.into_split();
                            let (sent, t, killer) = (sent.clone(), t.clone(), kill.clone());
                            // Upstream: counted, and the store goes away past `trip_at`.
                            tokio::spawn(pump(cr, sw, kill.subscribe(), move |n| {
                                let total = sent.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
                                let trip = total > trip_at && !t.swap(true, Ordering::SeqCst);
                                if trip {
                                    let _ = killer.send(());
                                }
                                trip
                            }));
                            tokio::spawn(pump(sr, cw, kill.subscribe(), |_| false));
                        }
                    }
                }
                drop(listener);
                tokio::time::sleep(down_for).await;
            }
        });
        FlakyProxy {
            port,
            tripped,
            _rt: rt,
        }
    }
}

#[test]
fn a_store_lost_mid_upload_leaves_no_partial_artifact_and_the_retry_succeeds() {
    let s3 = S3Server::start();
    s3.create_bucket("big");
    // 50 MB: a multipart upload of four parts; the store goes away after ~20 MB.
    let proxy = FlakyProxy::start(s3.port, 20 << 20, Duration::from_millis(1500));
    let mut env = s3.env();
    env.insert(
        "AWS_ENDPOINT_URL".into(),
        format!("http://127.0.0.1:{}", proxy.port),
    );
    env.insert("DRIVETRAIN_STORE".into(), "s3://big/dt".into());
    env.insert("DRIVETRAIN_STORE_RETRY_TIMEOUT".into(), "1s".into());
    let home = Home::new("s3-flaky");
    let file = home.write(
        "big.yaml",
        r#"version: 1
name: big-output
stages:
  make:
    run:
      command: [sh, -c, 'head -c 50000000 /dev/zero | tr "\0" x > "$1/blob.bin"', make, "{{ outputs.data }}"]
    outputs: [data]
    retries: {limit: 3, backoff: 3s, on: [error]}
  check:
    inputs: {data: make.data}
    run:
      command: [sh, -c, 'printf "{\"bytes\": %d}" "$(wc -c < "$1/blob.bin")" > "$DRIVETRAIN_VALUES"', check, "{{ inputs.data }}"]
"#,
    );
    let o = home.drivetrain_env(
        &["run", file.to_str().unwrap(), "--output", "json"],
        &env_pairs(&env),
    );
    assert!(
        proxy.tripped.load(Ordering::SeqCst),
        "the store never went away"
    );
    assert_ok(&o);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let run = summary["run"].as_str().unwrap().to_owned();
    let status = home.drivetrain_env(&["status", &run, "--output", "json"], &env_pairs(&env));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let make = stage(&status, "make");
    let attempts = make["attempts"].as_u64().unwrap();
    assert!(attempts >= 2, "{make}");
    assert_eq!(
        stage(&status, "check")["values"]["bytes"],
        50_000_000,
        "{status}"
    );
    // The failed attempt left nothing visible but its log (in the run's `logs/`): no
    // object under its output, no manifest.
    let direct = s3.env();
    let keys = list("s3://big/dt", &direct, &format!("runs/{run}/make"));
    let first: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with(&format!("runs/{run}/make/1/")))
        .collect();
    assert!(first.is_empty(), "{keys:?}");
    let logs = list("s3://big/dt", &direct, &format!("runs/{run}/logs"));
    assert!(
        logs.contains(&format!("runs/{run}/logs/make.1.txt")),
        "{logs:?}"
    );
    assert!(
        keys.contains(&format!("runs/{run}/make/{attempts}/data/blob.bin")),
        "{keys:?}"
    );
}

/// A project's store of its own (`DRIVETRAIN_PROJECT_<NAME>_STORE`) reached through its
/// own settings (`DRIVETRAIN_PROJECT_<NAME>_AWS_*`): another S3 server than the default
/// store's. The run's outputs, published by the engine, and its promotion, written by the
/// built-in step in a process of its own, land there; nothing of it in the default store.
#[test]
fn a_project_store_of_its_own_is_reached_with_its_own_settings() {
    let (shared, own) = (S3Server::start(), S3Server::start());
    shared.create_bucket("fleet");
    own.create_bucket("perception");
    let mut env = shared.env();
    env.insert("DRIVETRAIN_STORE".into(), "s3://fleet/dt".into());
    env.insert(
        "DRIVETRAIN_PROJECT_PERCEPTION_STORE".into(),
        "s3://perception/dt".into(),
    );
    for (k, v) in own.env() {
        env.insert(format!("DRIVETRAIN_PROJECT_PERCEPTION_{k}"), v);
    }
    let home = Home::new("s3-project");
    home.write(
        "p.yaml",
        r#"version: 1
name: p
project: perception
stages:
  make:
    run: {command: [sh, -c, 'echo "{\"v\": 1}" > "$DRIVETRAIN_OUTPUT_MODEL/model.json"']}
    outputs: [model]
  promote:
    uses: promote
    inputs: {model: make.model}
    with: {model: lane, alias: candidate}
    outputs: [registration]
"#,
    );
    let o = home.drivetrain_env(&["run", "p.yaml"], &env_pairs(&env));
    assert_ok(&o);
    let run = run_id(&o);
    assert!(
        text(&o.stdout).contains("store s3://perception/dt"),
        "{}",
        text(&o.stdout)
    );
    let own_env = own.env();
    let keys = list("s3://perception/dt", &own_env, "");
    assert!(
        keys.iter()
            .any(|k| k.starts_with(&format!("runs/{run}/make/"))),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.contains("lane")),
        "the registry: {keys:?}"
    );
    let shared_keys = list("s3://fleet/dt", &shared.env(), "");
    assert!(
        shared_keys
            .iter()
            .all(|k| !k.contains(&run) && !k.contains("lane")),
        "{shared_keys:?}"
    );
    let o = home.drivetrain_env(
        &["registry", "--project", "perception", "list", "-o", "json"],
        &env_pairs(&env),
    );
    assert_ok(&o);
    assert!(text(&o.stdout).contains("\"lane\""), "{}", text(&o.stdout));
}
