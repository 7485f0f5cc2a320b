//! The kubernetes executor against the Kubernetes API stand-in ([`super::standin`]): the
//! real kube-rs client, watcher and backoff over loopback HTTP. The stand-in is not a
//! cluster: it runs pods' containers as local processes; the executor's code is the one
//! that runs against a real cluster.
//!
//! The pods' wrapper here is a shell stand-in for `drivetrain-exec` and `drivetrain exec`
//! (the binary's tests run the real ones): `--install DIR` and `exec --install DIR` copy
//! it, `-- CMD…` and `exec -- CMD…` run CMD.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drivetrain_engine::executor::{conformance, AttemptOutcome, AttemptSpec, Executor, Placement};

use super::standin::{Node, StandIn};
use super::{KubernetesExecutor, Settings};

struct Fixture {
    dir: PathBuf,
    standin: StandIn,
    executor: KubernetesExecutor,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn fixture(name: &str, node: Node, tweak: impl FnOnce(&mut Settings)) -> Fixture {
    let dir = std::env::temp_dir().join(format!("dt-kube-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let wrapper = dir.join("wrapper.sh");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\ncase \"$1\" in\n--install) mkdir -p \"$2\" && cp \"$0\" \"$2/drivetrain-exec\"; exit $?;;\nexec) if [ \"$2\" = --install ]; then mkdir -p \"$3\" && cp \"$0\" \"$3/drivetrain\"; exit $?; fi; shift 2;;\n--) shift;;\nesac\nexec \"$@\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let standin = StandIn::start(&dir, node).await;
    let mut settings = Settings {
        wrapper_path: wrapper.display().to_string(),
        binary_path: wrapper.display().to_string(),
        ..Settings::default()
    };
    tweak(&mut settings);
    let executor = KubernetesExecutor::with_client(settings, standin.client());
    Fixture {
        dir,
        standin,
        executor,
    }
}

fn spec(dir: &Path, stage: &str, argv: &[&str]) -> AttemptSpec {
    AttemptSpec {
        run_id: "run-1".into(),
        stage: stage.into(),
        attempt: 1,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("FOO".into(), "bar baz".into())],
        workdir: PathBuf::new(),
        log: dir.join(format!("{stage}.log")),
        distributed: None,
        access: Vec::new(),
        mask: Default::default(),
        secret_files: Vec::new(),
        placement: Placement {
            pipeline: "test".into(),
            ..Placement::default()
        },
    }
}

async fn wait(executor: &KubernetesExecutor, spec: AttemptSpec) -> AttemptOutcome {
    let mut a = executor.start(spec).await.expect("starts");
    tokio::time::timeout(Duration::from_secs(60), a.wait())
        .await
        .expect("the attempt ends")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conforms() {
    let f = fixture("conf", Node::default(), |_| {}).await;
    let logs = f.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    conformance::check(&f.executor, &logs).await;
    // Every attempt was one Job; the distributed one an Indexed Job with a Service.
    assert_eq!(f.standin.created("batch/v1/jobs"), 7);
    assert_eq!(f.standin.created("/v1/services"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_reasons_reach_the_attempt() {
    let f = fixture("reasons", Node::default(), |s| {
        s.unschedulable_timeout = Duration::from_millis(1500)
    })
    .await;
    // A container killed by the kernel's OOM killer.
    let outcome = wait(
        &f.executor,
        spec(&f.dir, "oom", &["sh", "-c", "kill -9 $$"]),
    )
    .await;
    match outcome {
        AttemptOutcome::Failed { exit_code, reason } => {
            assert_eq!(exit_code, Some(137));
            assert!(reason.contains("OOMKilled"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // More GPUs than any node has: unschedulable, then failed with that reason, and the
    // Job is deleted rather than left pending.
    let mut s = spec(&f.dir, "gpu", &["true"]);
    s.placement.resources.gpu = Some(2);
    match wait(&f.executor, s).await {
        AttemptOutcome::Failed { reason, .. } => {
            assert!(reason.starts_with("Unschedulable for"), "{reason}");
            assert!(reason.contains("Insufficient nvidia.com/gpu"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        f.standin
            .objects("batch/v1/jobs")
            .iter()
            .all(|j| j["metadata"]["labels"]["drivetrain.dev/stage"] != "gpu"),
        "the unschedulable Job was deleted"
    );
    // An image that cannot be pulled.
    let mut s = spec(&f.dir, "image", &["true"]);
    s.placement.image = Some("registry.invalid/nope:1".into());
    match wait(&f.executor, s).await {
        AttemptOutcome::Failed { reason, .. } => {
            assert!(reason.starts_with("ImagePullBackOff"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A Job past its activeDeadlineSeconds.
    let mut s = spec(&f.dir, "deadline", &["sleep", "30"]);
    s.placement.timeout = Some(Duration::from_secs(1));
    match wait(&f.executor, s).await {
        AttemptOutcome::Failed { reason, .. } => {
            assert!(reason.starts_with("DeadlineExceeded"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_come_from_secret_objects_and_logs_stream() {
    let f = fixture("secrets", Node::default(), |_| {}).await;
    f.standin
        .put_secret("default", "bucket", "key", "s3cr3t-value");
    let mut s = spec(
        &f.dir,
        "secret",
        &[
            "sh",
            "-c",
            "case \"$AWS_SECRET_ACCESS_KEY\" in s3cr3t-*) echo secret-ok;; esac",
        ],
    );
    s.placement.secrets = vec![drivetrain_engine::spec::SecretRef {
        name: "bucket".into(),
        key: Some("key".into()),
        env: Some("AWS_SECRET_ACCESS_KEY".into()),
        mount_path: None,
    }];
    let log = s.log.clone();
    assert_eq!(wait(&f.executor, s).await, AttemptOutcome::Succeeded);
    assert!(std::fs::read_to_string(&log).unwrap().contains("secret-ok"));
    // The value is in no object the engine created.
    let jobs = serde_json::to_string(&f.standin.objects("batch/v1/jobs")).unwrap();
    assert!(!jobs.contains("s3cr3t-value") && jobs.contains("secretKeyRef"));
    // A missing secret fails the attempt with the kubelet's reason.
    let mut s = spec(&f.dir, "nosecret", &["true"]);
    s.placement.secrets = vec![drivetrain_engine::spec::SecretRef {
        name: "absent".into(),
        key: None,
        env: None,
        mount_path: Some("/secrets".into()),
    }];
    match wait(&f.executor, s).await {
        AttemptOutcome::Failed { reason, .. } => {
            assert!(reason.starts_with("CreateContainerConfigError"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_resubmitted_after_a_crash_watches_the_same_job() {
    let f = fixture("dup", Node::default(), |_| {}).await;
    let gate = f.dir.join("gate");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; echo done",
        gate.display()
    );
    let s = spec(&f.dir, "dup", &["sh", "-c", &script]);
    // The first engine starts the attempt and dies without waiting.
    let first = f.executor.start(s.clone()).await.expect("starts");
    let handle = first.handle();
    drop(first);
    // The restarted engine starts the same attempt: AlreadyExists, the same Job.
    let mut again = f.executor.start(s).await.expect("re-attaches");
    assert_eq!(again.handle(), handle);
    std::fs::write(&gate, "").unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(60), again.wait())
            .await
            .unwrap(),
        AttemptOutcome::Succeeded
    );
    assert_eq!(f.standin.created("batch/v1/jobs"), 1, "one Job, never two");
    assert_eq!(f.standin.created("/v1/pods"), 1, "one pod, never two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_expires_relists_and_still_sees_the_end() {
    let f = fixture("gone", Node::default(), |_| {}).await;
    let gate = f.dir.join("gate");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 4",
        gate.display()
    );
    let s = spec(&f.dir, "gone", &["sh", "-c", &script]);
    let mut a = f.executor.start(s).await.expect("starts");
    let waiting = tokio::spawn(async move { a.wait().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Every watch ends and may only resume from a compacted version: 410 Gone.
    f.standin.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&gate, "").unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("ends")
        .unwrap();
    assert_eq!(
        outcome,
        AttemptOutcome::Failed {
            exit_code: Some(4),
            reason: "exit code 4".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_job_is_lost_and_a_queued_gang_times_out() {
    let f = fixture("lost", Node::default(), |s| {
        s.unschedulable_timeout = Duration::from_millis(1500);
        s.gang = Some(super::Gang::Kueue {
            queue: "team".into(),
        });
    })
    .await;
    // Kueue never admits it here (there is no Kueue): the gang stays suspended.
    let mut s = spec(&f.dir, "gang", &["true"]);
    s.distributed = Some(drivetrain_engine::plan::Distributed {
        framework: drivetrain_engine::spec::Framework::Indexed,
        workers: 2,
        slots_per_worker: 1,
    });
    match wait(&f.executor, s).await {
        AttemptOutcome::Failed { reason, .. } => {
            assert!(reason.contains("not admitted by its queue"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A Job deleted behind the engine's back: the attempt is lost (and the run loop
    // retries it).
    let f = fixture("lost2", Node::default(), |_| {}).await;
    let s = spec(&f.dir, "lost", &["sleep", "30"]);
    let mut a = f.executor.start(s).await.expect("starts");
    let handle = a.handle();
    let waiting = tokio::spawn(async move { a.wait().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(f.executor.reap(&handle).await);
    match tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap()
    {
        AttemptOutcome::Failed { reason, .. } => assert!(reason.starts_with("lost:"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(!f.executor.reap(&handle).await, "nothing left to reap");
}

/// A pod the scheduler preempted (its `DisruptionTarget` condition, as kube-scheduler
/// writes it) is a preemption; one evicted for node pressure, or a condition not true,
/// is not.
#[test]
fn a_pod_the_scheduler_preempted_is_a_preemption() {
    let pod = |reason: &str, status: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": status, "reason": reason,
                "message": "kube-scheduler: preempting to accommodate a higher priority pod"}]},
        }))
        .unwrap()
    };
    let seen = |p| super::Seen {
        pods: [("p".to_owned(), p)].into(),
        ..Default::default()
    };
    let why = seen(pod("PreemptionByScheduler", "True")).pod_preempted();
    assert_eq!(
        why.as_deref(),
        Some("pod p: PreemptionByScheduler: kube-scheduler: preempting to accommodate a higher priority pod")
    );
    assert_eq!(
        seen(pod("PreemptionByScheduler", "False")).pod_preempted(),
        None
    );
    assert_eq!(
        seen(pod("TerminationByKubelet", "True")).pod_preempted(),
        None
    );
}
