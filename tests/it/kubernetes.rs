//! The kubernetes executor end to end: the manifests `drivetrain plan --manifests`
//! renders (snapshots, and validated against the official Kubernetes schemas and the CRDs
//! in tests/k8s/crds/, vendored from the published CRDs), and a pipeline run by the binary against the Kubernetes API
//! stand-in (`drivetrain_executors::kubernetes::standin`).
//!
//! The stand-in is not a cluster: it is an HTTP server that the real kube-rs client in the
//! binary talks to over loopback, serving the API paths the executor uses, and it runs
//! pods' containers as local processes (the init container installs the real
//! `drivetrain-exec` as the pod's wrapper, or the whole `drivetrain` binary where the pod
//! runs a built-in step, which then moves inputs and outputs through the run's object
//! store). The executor's code path is the one a real cluster sees.
//!
//! Schema validation runs `tests/k8s/validate.py` with the Python of the tests' venv,
//! which has `kubernetes-validate` (`.ci/run` installs it; `DRIVETRAIN_TEST_VENV`, as for
//! every other test, says where it is).

use std::path::{Path, PathBuf};
use std::process::Command;

use drivetrain_executors::kubernetes::standin::{Node, StandIn};

use crate::common;
use common::{assert_ok, run_id, stage, text, Home};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    drivetrain_engine::testing::venv_bin("python")
}

/// Runs the schema check on `files`; its lines and whether every object passed. The CRDs
/// are the vendored ones and the team's (Kueue's, Volcano's) beside the clone.
fn validate(files: &[&Path]) -> (String, bool) {
    let crds = repo().join("tests/k8s/crds");
    let shared = repo().join("../shared/k8s-schemas");
    for dir in [&crds, &shared] {
        assert!(dir.is_dir(), "{} is missing", dir.display());
    }
    let o = Command::new(python())
        .arg(repo().join("tests/k8s/validate.py"))
        .arg(format!("{}:{}", crds.display(), shared.display()))
        .args(files)
        .output()
        .expect("python runs");
    assert!(
        o.status.code().is_some(),
        "validate.py crashed: {}",
        text(&o.stderr)
    );
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));
    (text(&o.stdout), o.status.success())
}

fn manifests(home: &Home, file: &Path, settings: Option<&str>, extra: &[&str]) -> String {
    let mut args = vec![
        "plan",
        file.to_str().unwrap(),
        "--executor",
        "kubernetes",
        "--manifests",
    ];
    args.extend_from_slice(extra);
    let settings_path = settings.map(|s| home.write("k8s.yaml", s));
    let env: Vec<(&str, &str)> = settings_path
        .as_ref()
        .map(|p| vec![("DRIVETRAIN_KUBERNETES", p.to_str().unwrap())])
        .unwrap_or_default();
    let o = home.drivetrain_env(&args, &env);
    assert_ok(&o);
    text(&o.stdout)
}

/// The YAML documents of a multi-document text.
fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

const KUEUE: &str = "namespace: av\ngang: {scheduler: kueue, queue: gpu-team}\n";
/// Every workload to its project's Kueue `LocalQueue` (the shapes in project `perception`).
const PROJECT_QUEUES: &str = "namespace: av\nproject_queues: true\n";
const VOLCANO: &str = "namespace: av\nservice_account: drivetrain-stage\nimage_pull_secrets: [regcred]\nlabels: {team: perception}\nttl_seconds_after_finished: 600\ngang: {scheduler: volcano, queue: training}\n";

#[test]
fn every_stage_shape_renders_as_its_snapshot_and_passes_the_schemas() {
    let home = Home::new("k8s-shapes");
    let shapes = repo().join("tests/k8s/shapes.yaml");
    let text = std::fs::read_to_string(&shapes).unwrap();
    let in_project = home.write(
        "shapes-perception.yaml",
        &text.replacen("\nname: ", "\nproject: perception\nname: ", 1),
    );
    let mut files = Vec::new();
    for (name, settings, file) in [
        ("default", None, &shapes),
        ("kueue", Some(KUEUE), &shapes),
        ("volcano", Some(VOLCANO), &shapes),
        ("project-queues", Some(PROJECT_QUEUES), &in_project),
    ] {
        let yaml = manifests(&home, file, settings, &[]);
        insta::assert_snapshot!(format!("shapes-{name}"), yaml);
        files.push(home.write(&format!("{name}.yaml"), &yaml));
    }
    let rbac = repo().join("docs/kubernetes/rbac.yaml");
    files.push(rbac.clone());
    // The admin's side of `scheduling:` the docs show: queues and priority classes.
    files.push(repo().join("docs/kubernetes/kueue.yaml"));
    files.push(repo().join("docs/kubernetes/volcano.yaml"));
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (lines, ok) = validate(&refs);
    assert!(ok, "{lines}");
    assert!(lines.contains("ok Role drivetrain"), "{lines}");
    // The Role lets the engine create every kind it renders.
    let role = documents(&std::fs::read_to_string(&rbac).unwrap())
        .into_iter()
        .find(|d| d["kind"] == "Role")
        .expect("a Role");
    let may_create = |group: &str, plural: &str| {
        role["rules"].as_array().unwrap().iter().any(|r| {
            r["apiGroups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g == group)
                && r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == plural)
                && r["verbs"].as_array().unwrap().iter().any(|v| v == "create")
        })
    };
    for (kind, group, plural) in [
        ("Job", "batch", "jobs"),
        ("Service", "", "services"),
        ("PersistentVolumeClaim", "", "persistentvolumeclaims"),
        ("MPIJob", "kubeflow.org", "mpijobs"),
        ("PyTorchJob", "kubeflow.org", "pytorchjobs"),
        ("PodGroup", "scheduling.volcano.sh", "podgroups"),
        (
            "VolumeSnapshot",
            "snapshot.storage.k8s.io",
            "volumesnapshots",
        ),
    ] {
        assert!(
            lines.contains(&format!(" {kind} ")),
            "{kind} was not rendered"
        );
        assert!(may_create(group, plural), "the Role cannot create {kind}");
    }
    // Every object was checked against a schema or CRD.
    for line in lines.lines() {
        assert!(line.starts_with("ok "), "{line}");
    }
    for kind in [
        "PodGroup",
        "WorkloadPriorityClass",
        "ClusterQueue",
        "LocalQueue",
        "Queue",
        "PriorityClass",
        "Job",
        "Service",
        "PersistentVolumeClaim",
        "MPIJob",
        "PyTorchJob",
        "VolumeSnapshot",
    ] {
        assert!(
            lines.contains(&format!("ok {kind} ")),
            "no {kind} checked:\n{lines}"
        );
    }
}

#[test]
fn the_schema_check_rejects_what_a_strict_api_server_would() {
    let home = Home::new("k8s-reject");
    let yaml = manifests(
        &home,
        &repo().join("tests/k8s/shapes.yaml"),
        None,
        &["--only", "mpi,plain"],
    );
    let bad = yaml
        .replacen(
            "  slotsPerWorker: 2\n",
            "  slotsPerWorker: 2\n  slotsPerWorkr: 2\n",
            1,
        )
        .replacen(
            "  backoffLimit: 0\n",
            "  backoffLimit: 0\n  backofLimit: 0\n",
            1,
        );
    assert_ne!(bad, yaml);
    let path = home.write("bad.yaml", &bad);
    let (lines, ok) = validate(&[&path]);
    assert!(!ok, "{lines}");
    assert!(
        lines.contains("FAIL MPIJob") && lines.contains("slotsPerWorkr"),
        "{lines}"
    );
    assert!(lines.contains("FAIL Job"), "{lines}");
}

#[test]
fn lane_detection_renders_an_mpijob_of_three_one_gpu_workers() {
    let home = Home::new("k8s-lane");
    let yaml = manifests(
        &home,
        &repo().join("pipelines/lane-detection-mpi.yaml"),
        None,
        &[],
    );
    insta::assert_snapshot!("lane-detection-mpi", yaml);
    let docs = documents(&yaml);
    let mpi = docs
        .iter()
        .find(|d| d["kind"] == "MPIJob")
        .expect("an MPIJob");
    assert_eq!(mpi["apiVersion"], "kubeflow.org/v2beta1");
    let workers = &mpi["spec"]["mpiReplicaSpecs"]["Worker"];
    assert_eq!(workers["replicas"], 3);
    let worker = &workers["template"]["spec"]["containers"][0];
    assert_eq!(worker["resources"]["limits"]["nvidia.com/gpu"], "1");
    let launcher = &mpi["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0];
    assert!(
        launcher["resources"].is_null(),
        "the launcher claims no GPU"
    );
    let snapshot = docs
        .iter()
        .find(|d| d["kind"] == "VolumeSnapshot")
        .expect("a snapshot");
    assert_eq!(
        snapshot["spec"]["source"]["persistentVolumeClaimName"],
        "tusimple-dataset"
    );
    let path = home.write("lane.yaml", &yaml);
    let (lines, ok) = validate(&[&path]);
    assert!(ok, "{lines}");
    assert!(lines.contains("ok MPIJob "), "{lines}");
}

#[test]
fn the_driving_loop_renders_completely() {
    let home = Home::new("k8s-loop");
    let yaml = manifests(
        &home,
        &repo().join("pipelines/driving-loop.yaml"),
        None,
        &[],
    );
    let path = home.write("loop.yaml", &yaml);
    let (lines, ok) = validate(&[&path]);
    assert!(ok, "{lines}");
    let p = home.drivetrain(&[
        "plan",
        repo().join("pipelines/driving-loop.yaml").to_str().unwrap(),
        "--output",
        "json",
    ]);
    let plan: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    let stages = plan["stages"].as_array().unwrap();
    for s in stages {
        let name = s["name"].as_str().unwrap();
        assert!(
            yaml.contains(&format!("# stage {name}: Job ")),
            "stage {name} has no Job:\n{yaml}"
        );
    }
}

/// Where a test's stand-in cluster keeps its files: beside the binary (the same file
/// system, so the wrapper image's binary and every pod's copy of it are hard links, not
/// gigabyte copies of a debug build), removed when dropped.
struct ClusterDir(PathBuf);

impl Drop for ClusterDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A stand-in cluster and the executor settings that reach it. The pods' root is
/// `/dt-pod` (a path no host directory here contains: the stand-in emulates its mount by
/// rewriting it in argv and env).
async fn cluster(home: &Home) -> (StandIn, PathBuf, ClusterDir) {
    let name = home.dir.file_name().unwrap().to_string_lossy().into_owned();
    let dir = ClusterDir(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let standin = StandIn::start(&dir.0.join("cluster"), Node::default()).await;
    let kubeconfig = home.dir.join("kubeconfig");
    standin.write_kubeconfig(&kubeconfig);
    // The wrapper image: the small wrapper and the whole binary, under names of its own.
    let image = dir.0.join("image-bin");
    std::fs::create_dir_all(&image).unwrap();
    let (wrapper, binary) = (image.join("dt-exec"), image.join("dt"));
    for (from, to) in [
        (env!("CARGO_BIN_EXE_drivetrain-exec"), &wrapper),
        (env!("CARGO_BIN_EXE_drivetrain"), &binary),
    ] {
        if std::fs::hard_link(from, to).is_err() {
            std::fs::copy(from, to).unwrap();
        }
    }
    let settings = home.write(
        "k8s.yaml",
        &format!(
            "kubeconfig: {}\nwrapper_path: {}\nbinary_path: {}\nroot: /dt-pod\nlabels: {{team: perception}}\n",
            kubeconfig.display(),
            wrapper.display(),
            binary.display()
        ),
    );
    (standin, settings, dir)
}

/// The binary with `args` against the stand-in, off the test's runtime: its output.
async fn run_engine(home: &Home, settings: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = engine(home, settings, args);
    tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"))
        .await
        .unwrap()
}

fn engine(home: &Home, settings: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    c.args(args)
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env("NO_COLOR", "1")
        .env("DRIVETRAIN_KUBERNETES", settings);
    c
}

const E2E: &str = r#"
version: 1
name: k8s-e2e
defaults:
  executor: kubernetes
  image: registry.example.com/av/steps:1.4
  retries: {limit: 1, backoff: 1s}
stages:
  sim:
    uses: fleet-sim
    with: {drives: 1, duration: 20s, seed: 3}
    outputs: [logs]
  count:
    inputs: {logs: sim.logs}
    run:
      command: [sh, -c, 'n=$(find "$DRIVETRAIN_INPUT_LOGS" -type f | wc -l); echo "files $n"; printf "{\"files\": %s}" "$n" > "$DRIVETRAIN_VALUES"; echo "$n" > "$DRIVETRAIN_OUTPUT_REPORT/count.txt"']
    outputs: [report]
  flaky:
    needs: [count]
    when: "stages.count.values.files > 0"
    inputs: {report: count.report}
    run:
      command: [sh, -c, 'if [ "$DRIVETRAIN_ATTEMPT" = 1 ]; then echo first attempt fails; exit 7; fi; echo "second attempt read $(cat "$DRIVETRAIN_INPUT_REPORT/count.txt")"']
"#;

/// A pipeline with a built-in step, a command stage reading its artifact and writing
/// values, and a stage that fails once and is retried, run by the binary with
/// `--executor kubernetes` against the stand-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_runs_as_jobs_against_the_api_stand_in() {
    let home = Home::new("k8s-e2e");
    let (standin, settings, _cluster) = cluster(&home).await;
    let pipeline = home.write("e2e.yaml", E2E);
    let run = run_engine(&home, &settings, &["run", pipeline.to_str().unwrap()]).await;
    assert_ok(&run);
    let id = run_id(&run);
    let status = home.status(&id);
    for s in ["sim", "count", "flaky"] {
        assert_eq!(stage(&status, s)["phase"], "Succeeded", "{status}");
    }
    assert_eq!(stage(&status, "flaky")["attempts"], 2, "{status}");
    // One Job per attempt, labelled; the retry was a new Job.
    assert_eq!(standin.created("batch/v1/jobs"), 4);
    let jobs = standin.objects("batch/v1/jobs");
    assert!(jobs.iter().all(
        |j| j["metadata"]["labels"]["drivetrain.dev/run"] == id.as_str()
            && j["metadata"]["labels"]["team"] == "perception"
            && j["spec"]["backoffLimit"] == 0
    ));
    // The built-in step's pod gets the whole binary; a command of the stage's own runs
    // under the small wrapper, the only binary its pod gets.
    for j in &jobs {
        let pod = &j["spec"]["template"]["spec"];
        let init = pod["initContainers"][0]["command"][0].as_str().unwrap();
        let main = pod["containers"][0]["command"][0].as_str().unwrap();
        let (image_bin, pod_bin) = match j["metadata"]["labels"]["drivetrain.dev/stage"] == "sim" {
            true => ("image-bin/dt", "/dt-pod/bin/drivetrain"),
            false => ("image-bin/dt-exec", "/dt-pod/bin/drivetrain-exec"),
        };
        assert!(init.ends_with(image_bin), "{j:#}");
        assert_eq!(main, pod_bin, "{j:#}");
    }
    // The pod's log reached the run's logs; the artifact went through the store.
    let logs = home.drivetrain(&["logs", &id, "--stage", "count"]);
    let logs = text(&logs.stdout);
    let files: u32 = logs
        .lines()
        .find_map(|l| l.strip_prefix("files "))
        .unwrap_or_else(|| panic!("no count in {logs}"))
        .trim()
        .parse()
        .unwrap();
    assert!(files > 0, "{logs}");
    let flaky = text(&home.drivetrain(&["logs", &id, "--stage", "flaky"]).stdout);
    assert!(
        flaky.contains(&format!("second attempt read {files}")),
        "{flaky}"
    );
    // The pipeline's folder is the engine's machine's: a stage naming it is refused
    // before any Job is made, saying what to do instead.
    let folder = home.write(
        "folder.yaml",
        "version: 1\nname: folder\ndefaults: {executor: kubernetes, image: registry.example.com/av/steps:1.4}\nstages:\n  prep:\n    run: {command: [sh, \"{{ pipeline.dir }}/prep.sh\"]}\n",
    );
    let run = run_engine(&home, &settings, &["run", folder.to_str().unwrap()]).await;
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stdout));
    let prep = stage(&home.status(&run_id(&run)), "prep")["reason"].clone();
    assert!(
        prep.as_str().unwrap().contains(
            "`{{ pipeline.dir }}` is the pipeline's folder on the engine's machine, which the stage's pod does not have"
        ),
        "{prep}"
    );
    assert_eq!(standin.created("batch/v1/jobs"), 4, "no Job for it");
    // A plugin step runs in a pod from its image; one that runs files of its folder (the
    // engine machine's) is refused the same way, before any Job.
    let step = |name: &str, run: &str| {
        let dir = home.dir.join("plugins").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("say.sh"), "echo \"$1\"\n").unwrap();
        let params = "params: {word: {type: string}}";
        let file = format!("kind: step\nname: {name}\nversion: 1.0.0\n{params}\nrun: {run}\n");
        std::fs::write(dir.join("step.yaml"), file).unwrap();
    };
    step(
        "say",
        "{image: registry.example.com/av/steps:1.4, command: [echo, \"{{ with.word }}\"]}",
    );
    step("say-local", "{command: [sh, say.sh, \"{{ with.word }}\"]}");
    let plugged = home.write(
        "plugged.yaml",
        "version: 1\nname: plugged\ndefaults: {executor: kubernetes, image: registry.example.com/av/steps:1.4}\nstages:\n  say:\n    uses: say@1.0.0\n    with: {word: pod}\n  local:\n    uses: ./plugins/say-local\n    with: {word: engine}\n",
    );
    let run = run_engine(&home, &settings, &["run", plugged.to_str().unwrap()]).await;
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stdout));
    let st = home.status(&run_id(&run));
    assert_eq!(stage(&st, "say")["phase"], "Succeeded", "{st}");
    let logs = text(
        &home
            .drivetrain(&["logs", &run_id(&run), "--stage", "say"])
            .stdout,
    );
    assert!(logs.contains("pod"), "{logs}");
    let local = stage(&st, "local")["reason"].to_string();
    assert!(
        local.contains("the plugin step runs files of its folder on the engine's machine"),
        "{local}"
    );
    assert_eq!(
        standin.created("batch/v1/jobs"),
        5,
        "a Job for the step in its image only"
    );
}

const REATTACH: &str = r#"
version: 1
name: k8s-reattach
defaults:
  executor: kubernetes
  image: registry.example.com/av/steps:1.4
stages:
  wait:
    run:
      command: [sh, -c, 'while [ ! -e "$GATE" ]; do sleep 0.1; done; echo gate opened']
      env: {GATE: "{{ params.gate }}"}
  after:
    needs: [wait]
    run:
      command: [echo, after]
params:
  gate: {type: string}
"#;

/// The engine is killed (SIGKILL) while a stage's Job runs; `drivetrain resume` finds
/// that Job by its deterministic name and watches it again instead of starting another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_reattaches_to_the_job_in_flight() {
    let home = Home::new("k8s-reattach");
    let (standin, settings, _cluster) = cluster(&home).await;
    let pipeline = home.write("reattach.yaml", REATTACH);
    let gate = home.dir.join("gate");
    let gate_param = format!("gate={}", gate.display());
    let mut child = engine(
        &home,
        &settings,
        &["run", pipeline.to_str().unwrap(), "--param", &gate_param],
    )
    // Output to a file: a pipe closed early would kill the engine with EPIPE.
    .stdout(std::fs::File::create(home.dir.join("engine.out")).unwrap())
    .stderr(std::fs::File::create(home.dir.join("engine.err")).unwrap())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let id = loop {
        let out = std::fs::read_to_string(home.dir.join("engine.out")).unwrap_or_default();
        if let Some(id) = out.lines().next().and_then(|l| l.strip_prefix("run ")) {
            break id.trim().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no run id: {out}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // Wait for the stage's pod to run, then kill the engine.
    let running = || {
        standin
            .objects("/v1/pods")
            .iter()
            .any(|p| p["status"]["phase"] == "Running")
    };
    for _ in 0..300 {
        if running() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        running(),
        "the pod runs: engine stderr {:?}, jobs {:?}",
        std::fs::read_to_string(home.dir.join("engine.err")),
        standin.objects("batch/v1/jobs")
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(standin.created("batch/v1/jobs"), 1);

    let mut resume = engine(&home, &settings, &["resume", &id]);
    let resumed = tokio::task::spawn_blocking(move || resume.output().expect("resume runs"));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    std::fs::write(&gate, "").unwrap();
    let out = resumed.await.unwrap();
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("0 attempt(s) lost, 1 re-attached"),
        "{}",
        text(&out.stdout)
    );
    let status = home.status(&id);
    assert_eq!(stage(&status, "wait")["phase"], "Succeeded", "{status}");
    assert_eq!(stage(&status, "wait")["attempts"], 1, "{status}");
    assert_eq!(stage(&status, "after")["phase"], "Succeeded", "{status}");
    // `wait` ran once, in the Job the first engine created; `after` got its own.
    assert_eq!(standin.created("batch/v1/jobs"), 2);
    assert_eq!(standin.created("/v1/pods"), 2);
    let log = text(&home.drivetrain(&["logs", &id, "--stage", "wait"]).stdout);
    assert!(log.contains("gate opened"), "{log}");
}

const SNAPSHOTS: &str = r#"
version: 1
name: k8s-snapshots
defaults:
  executor: kubernetes
  image: registry.example.com/av/steps:1.4
stages:
  prepare:
    run:
      command: [sh, -c, 'echo frames > /data/frames.txt']
    volumes:
      - {name: dataset, mount_path: /data, claim: fleet-data}
    snapshot: {volume: dataset, when: success}
  train:
    run:
      command: [sh, -c, 'echo training on $(ls /data | wc -l) files']
    volumes:
      - {name: dataset, mount_path: /data, from_snapshot: "{{ stages.prepare.values.snapshot.name }}", size: 1Gi, read_only: true}
"#;

/// A stage's volume is snapshotted after it succeeds and the snapshot is recorded in its
/// values; a later stage mounts a claim restored from it, and a rerun of that stage alone
/// restores the snapshot of the original run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_recorded_and_restored_by_reruns() {
    let home = Home::new("k8s-snap");
    let (standin, settings, _cluster) = cluster(&home).await;
    let pipeline = home.write("snap.yaml", SNAPSHOTS);
    let run = run_engine(&home, &settings, &["run", pipeline.to_str().unwrap()]).await;
    assert_ok(&run);
    let id = run_id(&run);
    let status = home.status(&id);
    let recorded = &stage(&status, "prepare")["values"]["snapshot"];
    let name = recorded["name"]
        .as_str()
        .unwrap_or_else(|| panic!("no snapshot in {status}"))
        .to_owned();
    assert_eq!(recorded["claim"], "fleet-data");
    let snapshots = standin.objects("snapshot.storage.k8s.io/v1/volumesnapshots");
    assert_eq!(snapshots.len(), 1);
    assert_eq!(snapshots[0]["metadata"]["name"], name.as_str());
    assert_eq!(
        snapshots[0]["spec"]["source"]["persistentVolumeClaimName"],
        "fleet-data"
    );
    assert_eq!(
        snapshots[0]["metadata"]["labels"]["drivetrain.dev/run"],
        id.as_str()
    );
    let restored_from = |standin: &StandIn| -> Vec<String> {
        standin
            .objects("/v1/persistentvolumeclaims")
            .iter()
            .map(|c| {
                c["spec"]["dataSource"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(restored_from(&standin), vec![name.clone()]);

    // A rerun of `train` alone reuses `prepare` of the original run, values included: it
    // restores the same snapshot.
    let rerun = run_engine(&home, &settings, &["rerun", &id, "--stage", "train"]).await;
    assert_ok(&rerun);
    assert_eq!(restored_from(&standin), vec![name.clone(), name]);
    assert_eq!(
        standin
            .objects("snapshot.storage.k8s.io/v1/volumesnapshots")
            .len(),
        1,
        "the rerun took no new snapshot"
    );
}

/// `plan --manifests` says which artifact store the pods will use, where that came from,
/// and warns when pods could not reach it.
#[test]
fn manifests_name_the_store_the_pods_use() {
    let home = Home::new("k8s-store");
    let demo = repo().join("pipelines/shell-demo.yaml");
    let args = [
        "plan",
        demo.to_str().unwrap(),
        "--executor",
        "kubernetes",
        "--manifests",
    ];
    let o = home.drivetrain_env(
        &args,
        &[("DRIVETRAIN_STORE", "s3://av-artifacts/dt?region=eu-west-1")],
    );
    assert_ok(&o);
    let out = text(&o.stdout);
    assert!(
        out.starts_with(
            "# The artifact store these pods use: s3://av-artifacts/dt (from DRIVETRAIN_STORE)."
        ),
        "{out}"
    );
    assert!(
        !out.contains("region=") && !out.contains("warning"),
        "{out}"
    );
    let o = home.drivetrain(&args);
    let out = text(&o.stdout);
    assert!(out.contains("(the engine home's default"), "{out}");
    assert!(
        out.contains("# warning: pods cannot reach a file:// store"),
        "{out}"
    );
    // Still YAML documents, comments and all.
    assert!(!documents(&out).is_empty());
}

#[test]
fn manifests_need_the_kubernetes_executor_and_valid_settings() {
    let home = Home::new("k8s-errors");
    let demo = repo().join("pipelines/shell-demo.yaml");
    let o = home.drivetrain(&["plan", demo.to_str().unwrap(), "--manifests"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--executor kubernetes"),
        "{}",
        text(&o.stderr)
    );
    let bad = home.write(
        "k8s.yaml",
        "namespace: av\nunschedulable_timeout: soon\ngang: {scheduler: slurm}\n",
    );
    let o = home.drivetrain_env(
        &[
            "plan",
            demo.to_str().unwrap(),
            "--manifests",
            "--executor",
            "kubernetes",
        ],
        &[("DRIVETRAIN_KUBERNETES", bad.to_str().unwrap())],
    );
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("k8s.yaml:")
            && err.contains("unschedulable_timeout: `soon` is not a duration"),
        "{err}"
    );
    // An unknown field is named, with its line.
    let bad = home.write(
        "k8s.yaml",
        "namespace: av
namespce: av
",
    );
    let o = home.drivetrain_env(
        &[
            "plan",
            demo.to_str().unwrap(),
            "--manifests",
            "--executor",
            "kubernetes",
        ],
        &[("DRIVETRAIN_KUBERNETES", bad.to_str().unwrap())],
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("k8s.yaml:2:") && err.contains("unknown field `namespce`"),
        "{err}"
    );
    // A path of the engine's machine is no volume of a pod: refused, with what to give.
    let host = home.write(
        "host.yaml",
        "version: 1\nname: host\nstages:\n  s:\n    volumes: [{name: data, host_path: /srv/data, mount_path: /data}]\n    run: {command: [\"true\"]}\n",
    );
    let o = home.drivetrain(&[
        "plan",
        host.to_str().unwrap(),
        "--manifests",
        "--executor",
        "kubernetes",
    ]);
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("stage `s`: volume `data` cannot be mounted: `host_path` is a path of the engine's machine")
            && err.contains("give `claim`"),
        "{err}"
    );
}

/// `scheduling:` renders per-workload fields only, the cluster's policy left to its admin:
/// on Kueue the queue and `WorkloadPriorityClass` labels (the executor's
/// `preemptible_class` for a preemptible stage naming none) and a pod set's topology;
/// on Volcano the `PodGroup`'s queue, class and network topology, and preemptable pods;
/// with neither, the pods' `priorityClassName`. (The schemas check them in the test above.)
#[test]
fn scheduling_renders_per_workload_fields_for_kueue_and_volcano() {
    let home = Home::new("k8s-scheduling");
    let shapes = repo().join("tests/k8s/shapes.yaml");
    let of = |docs: &[serde_json::Value], kind: &str, stage: &str| -> serde_json::Value {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["labels"]["drivetrain.dev/stage"] == stage)
            .unwrap_or_else(|| panic!("no {kind} of {stage}"))
            .clone()
    };
    let pod = |job: &serde_json::Value| job["spec"]["template"].clone();

    let kueue = documents(&manifests(&home, &shapes, Some(KUEUE), &[]));
    let sweep = of(&kueue, "Job", "sweep");
    let labels = &sweep["metadata"]["labels"];
    assert_eq!(labels["kueue.x-k8s.io/queue-name"], "perception", "{sweep}");
    assert_eq!(labels["kueue.x-k8s.io/priority-class"], "batch", "{sweep}");
    let annotations = &pod(&sweep)["metadata"]["annotations"];
    assert_eq!(
        annotations["kueue.x-k8s.io/podset-required-topology"],
        "cloud.provider.com/topology-rack"
    );
    assert!(
        pod(&sweep)["spec"]["priorityClassName"].is_null(),
        "Kueue reads the label"
    );
    let spot = of(&kueue, "Job", "spot");
    assert_eq!(
        spot["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
        "gpu-team"
    );
    assert_eq!(
        spot["metadata"]["labels"]["kueue.x-k8s.io/priority-class"],
        "preemptible"
    );
    assert_eq!(
        pod(&spot)["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"],
        "cloud.provider.com/topology-block"
    );
    // A stage naming no class and not preemptible has none.
    assert!(
        of(&kueue, "Job", "plain")["metadata"]["labels"]["kueue.x-k8s.io/priority-class"].is_null()
    );

    let volcano = documents(&manifests(&home, &shapes, Some(VOLCANO), &[]));
    let group = of(&volcano, "PodGroup", "sweep");
    assert_eq!(
        group["spec"],
        serde_json::json!({"minMember": 2, "queue": "perception", "priorityClassName": "batch",
            "networkTopology": {"mode": "hard", "highestTierName": "cloud.provider.com/topology-rack"}})
    );
    let sweep = of(&volcano, "Job", "sweep");
    assert_eq!(pod(&sweep)["spec"]["priorityClassName"], "batch");
    assert_eq!(
        pod(&sweep)["metadata"]["annotations"]["volcano.sh/preemptable"],
        "true"
    );
    let group = of(&volcano, "PodGroup", "spot");
    assert_eq!(group["spec"]["queue"], "training");
    assert_eq!(group["spec"]["priorityClassName"], "preemptible");
    assert_eq!(group["spec"]["networkTopology"]["mode"], "soft");

    let plain = documents(&manifests(&home, &shapes, None, &[]));
    assert_eq!(
        pod(&of(&plain, "Job", "sweep"))["spec"]["priorityClassName"],
        "batch"
    );

    // A number orders only the home's queue: said, located, for a Kubernetes stage.
    let numbered = home.write(
        "numbered.yaml",
        "version: 1\nname: n\ndefaults: {executor: kubernetes, image: busybox:1.36}\nstages:\n  a:\n    resources: {gpu: 1}\n    scheduling: {priority: 5}\n    run: {command: [\"true\"]}\n",
    );
    let o = home.drivetrain(&["validate", numbered.to_str().unwrap()]);
    assert_ok(&o);
    let said = text(&o.stderr);
    assert!(
        said.contains("warning[unused-field]: a number orders only this home's queue for GPUs"),
        "{said}"
    );
    assert!(said.contains("at `stages.a.scheduling.priority`"), "{said}");
}

/// A workload its queue evicts to admit one of higher priority (Kueue sets the Job's
/// `suspend` again; the stand-in plays Kueue's part): the attempt ends `Preempted`, not
/// failed and not a retry (the stage has none), its Job is deleted so the queue does not
/// run it again on its own, and the engine submits the stage as a new Job, which
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_its_queue_evicts_is_submitted_again() {
    let home = Home::new("k8s-preempt");
    let (standin, settings, _cluster) = cluster(&home).await;
    let pipeline = home.write(
        "p.yaml",
        "version: 1\nname: k8s-preempt\ndefaults: {executor: kubernetes, image: registry.example.com/av/steps:1.4}\nstages:\n  train:\n    run: {command: [sh, -c, 'if [ \"$DRIVETRAIN_ATTEMPT\" = 1 ]; then sleep 60; fi; echo attempt $DRIVETRAIN_ATTEMPT done']}\n",
    );
    let mut cmd = engine(&home, &settings, &["run", pipeline.to_str().unwrap()]);
    let run = tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"));
    // The first attempt's pod runs; then its queue evicts it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let job = loop {
        let running = standin.objects("/v1/pods").into_iter().find(|p| {
            p["status"]["phase"] == "Running"
                && p["metadata"]["labels"]["drivetrain.dev/attempt"] == "1"
        });
        if let Some(p) = running {
            break p["metadata"]["labels"]["job-name"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            standin.objects("/v1/pods")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(standin.suspend_job("default", &job));
    let run = run.await.unwrap();
    assert_ok(&run);
    let id = run_id(&run);
    let s = stage(&home.status(&id), "train").clone();
    assert_eq!(
        (s["phase"].as_str(), s["attempts"].as_u64()),
        (Some("Succeeded"), Some(2)),
        "{s}"
    );
    let state = drivetrain_engine::state::SqliteState::open(&home.dir.join(".drivetrain/state.db"))
        .unwrap();
    use drivetrain_engine::state::AttemptStore as _;
    let tries = state
        .attempts(&drivetrain_engine::state::RunId(id.clone()))
        .unwrap();
    assert_eq!(tries[0].phase.as_str(), "Preempted", "{tries:?}");
    let why = tries[0].reason.as_deref().unwrap_or_default();
    assert!(
        why.contains(&format!("Job {job} was suspended again by its queue")),
        "{why}"
    );
    // Two Jobs were made; the evicted one is gone.
    assert_eq!(standin.created("batch/v1/jobs"), 2);
    let names: Vec<String> = standin
        .objects("batch/v1/jobs")
        .iter()
        .filter_map(|j| j["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(!names.contains(&job), "{names:?}");
    let log = text(&home.drivetrain(&["logs", &id, "--stage", "train"]).stdout);
    assert!(log.contains("attempt 2 done"), "{log}");
}

/// A search on Kubernetes: each trial's attempt is a Job (passing the schemas), its
/// metrics come back through the store with its values, and the next stage gets the best
/// trial's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_runs_each_trial_as_a_job_against_the_api_stand_in() {
    let home = Home::new("k8s-search");
    let (standin, settings, _cluster) = cluster(&home).await;
    let search = crate::search::sh_search(
        "k8s-search",
        "executor: kubernetes, image: registry.example.com/av/steps:1.4",
        "method: grid, metric: loss, budget: {unit: epochs, min: 1, max: 2}, space: {x: {choice: [3, 1, 2]}}",
    );
    let pipeline = home.write("search.yaml", &search);
    let run = run_engine(&home, &settings, &["run", pipeline.to_str().unwrap()]).await;
    assert_ok(&run);
    let id = run_id(&run);
    assert_eq!(
        standin.created("batch/v1/jobs"),
        4,
        "three trials and `use`"
    );
    let jobs = standin.objects("batch/v1/jobs");
    let dir = home.dir.join("jobs");
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<PathBuf> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let p = dir.join(format!("job-{i}.json"));
            std::fs::write(&p, serde_json::to_vec(j).unwrap()).unwrap();
            p
        })
        .collect();
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (out, ok) = validate(&refs);
    assert!(ok, "{out}");
    let o = home.drivetrain(&["trials", &id, "train", "-o", "json"]);
    assert_ok(&o);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let metric: Vec<f64> = listed["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["metric"].as_f64().unwrap())
        .collect();
    assert_eq!(metric, vec![3.0, 1.0, 2.0], "{listed}");
    let used = text(&home.drivetrain(&["logs", &id, "--stage", "use"]).stdout);
    assert!(used.contains("best x 1"), "{used}");
}
