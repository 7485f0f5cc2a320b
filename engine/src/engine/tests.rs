//! The run's life the engine owns, in-process on the fake executor: the deadline, a
//! rerun or retry planned from an ended run, a resume of a run whose engine died, and a
//! stage an executor cannot run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::{Engine, Refusal, RerunSource, RerunSpec, RunRequest};
use crate::runner::RunSummary;
use crate::state::{Phase, RunId, RunStore};
use crate::step::Catalog;
use crate::testing::FakeExecutor;

/// An engine on the fake executor in a scratch home, removed when dropped.
struct Bench {
    dir: std::path::PathBuf,
    engine: Engine,
    fake: FakeExecutor,
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bench {
    fn new(name: &str) -> Bench {
        let dir = Bench::scratch(name);
        let (engine, fake) = crate::testing::fake_engine(&dir);
        Bench { dir, engine, fake }
    }

    /// On the state store `state` instead of the home's SQLite.
    fn on(name: &str, state: Arc<dyn crate::state::StateStore>) -> Bench {
        let dir = Bench::scratch(name);
        let (engine, fake) = crate::testing::fake_engine_on(&dir, state);
        Bench { dir, engine, fake }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("dt-engine-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The pipeline of `yaml`, written to `NAME.yaml` in the home: (source, pipeline file).
    fn source(&self, yaml: &str) -> RerunSource {
        let file = self.dir.join("p.yaml");
        std::fs::write(&file, yaml).unwrap();
        let validated = crate::validate(yaml, &catalog());
        RerunSource {
            pipeline: validated.pipeline.expect("valid"),
            file: file.display().to_string(),
            spec_digest: super::home::digest(yaml),
        }
    }

    fn request(&self, id: &str, source: &RerunSource) -> RunRequest {
        RunRequest::new(
            RunId(id.into()),
            Arc::new(source.pipeline.clone()),
            source.file.clone(),
            source.spec_digest.clone(),
        )
    }

    async fn run(&self, request: RunRequest) -> RunSummary {
        let (tx, _rx) = mpsc::unbounded_channel();
        let (_cancel, rx) = watch::channel(false);
        self.engine
            .run(request, tx, rx)
            .await
            .expect("the run ends")
    }
}

fn catalog() -> Catalog {
    Catalog::new(Vec::new(), vec!["local"])
}

const CHAIN: &str = "version: 1\nname: chain\nstages:\n  a:\n    run: {command: [ok]}\n  b:\n    needs: [a]\n    run: {command: [ok]}\n";

#[tokio::test(start_paused = true)]
async fn past_its_deadline_a_run_is_stopped_and_fails_saying_so() {
    let b = Bench::new("deadline");
    let yaml = "version: 1\nname: slow\nstages:\n  s:\n    run: {command: [sleep, 600]}\n";
    let mut request = b.request("r1", &b.source(yaml));
    request.deadline = Some(Duration::from_secs(1));
    let summary = b.run(request).await;
    assert_eq!(summary.phase, Phase::Failed);
    let record = b.engine.state().run(&RunId("r1".into())).unwrap();
    assert_eq!(record.phase, Phase::Failed);
    assert_eq!(
        record.reason.as_deref(),
        Some("run deadline of 1s exceeded")
    );
    assert_eq!(summary.stages["s"], Phase::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn a_rerun_executes_its_selection_and_reuses_the_rest() {
    let b = Bench::new("rerun");
    let source = b.source(CHAIN);
    assert_eq!(
        b.run(b.request("r1", &source)).await.phase,
        Phase::Succeeded
    );
    let spec = RerunSpec::rerun(RunId("r1".into()), vec!["b".into()]);
    let (request, plan) = b
        .engine
        .rerun_request(&spec, source.clone(), RunId("r2".into()))
        .await
        .expect("planned");
    assert_eq!(plan.executes, vec!["b"]);
    assert_eq!(plan.reuses, vec!["a"]);
    assert_eq!(request.parent, Some(RunId("r1".into())));
    assert!(!request.cache.read, "a rerun executes what it selected");
    let summary = b.run(request).await;
    assert_eq!(summary.phase, Phase::Succeeded);
    let started: Vec<_> = b.fake.started().into_iter().map(|(s, _)| s).collect();
    assert_eq!(started, vec!["a", "b", "b"], "r2 executed `b` only");
    // Refusals, each saying why: an unknown stage, nothing to retry, no such run.
    let bad = RerunSpec::rerun(RunId("r2".into()), vec!["bb".into()]);
    let refused = b
        .engine
        .rerun_request(&bad, source.clone(), RunId("r3".into()));
    match refused.await {
        Err(Refusal::Usage(m)) => assert!(m.contains("no stage named `bb`"), "{m}"),
        other => panic!("{other:?}"),
    }
    let retry = RerunSpec::retry(RunId("r2".into()));
    match b
        .engine
        .rerun_request(&retry, source.clone(), RunId("r3".into()))
        .await
    {
        Err(Refusal::Nothing(m)) => assert!(m.contains("nothing to retry"), "{m}"),
        other => panic!("{other:?}"),
    }
    let none = RerunSpec::retry(RunId("nope".into()));
    let refused = b.engine.rerun_request(&none, source, RunId("r3".into()));
    assert!(matches!(refused.await, Err(Refusal::NotFound(_))));
}

#[tokio::test(start_paused = true)]
async fn a_parent_still_running_here_is_not_rerun() {
    let b = Bench::new("busy");
    let source = b.source(CHAIN);
    let mut request = b.request("r1", &source);
    // Recorded by this process and beating: it is running.
    b.engine.admit(&mut request, false).unwrap();
    b.engine.state().heartbeat(&RunId("r1".into())).unwrap();
    let spec = RerunSpec::retry(RunId("r1".into()));
    let refused = b.engine.rerun_request(&spec, source, RunId("r2".into()));
    match refused.await {
        Err(Refusal::Busy(m)) => assert!(m.contains("still running"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_resumed_run_keeps_what_succeeded_and_runs_the_lost_attempt_again() {
    let b = Bench::new("resume");
    let source = b.source(CHAIN);
    let id = RunId("r1".into());
    let mut request = b.request("r1", &source);
    b.engine.admit(&mut request, false).unwrap();
    // An engine that died while `a` ran: its attempt is left `Running`.
    let state = b.engine.state();
    state.start_attempt(&id, "a", 1).unwrap();
    state
        .set_stage(&id, "a", Phase::Running, None, None)
        .unwrap();
    let (request, reaped) = b
        .engine
        .resume_request(&catalog(), &id)
        .await
        .expect("resumable");
    assert_eq!(reaped.lost, 1);
    let summary = b.run(request).await;
    assert_eq!(summary.phase, Phase::Succeeded);
    let attempts = state.attempts(&id).unwrap();
    let of_a: Vec<_> = attempts.iter().filter(|a| a.stage == "a").collect();
    assert_eq!(of_a.len(), 2, "the lost attempt and the one after it");
    assert_eq!(of_a[0].phase, Phase::Error);
    // Resuming a run that succeeded has nothing to do.
    match b.engine.resume_request(&catalog(), &id).await {
        Err(Refusal::Nothing(m)) => assert!(m.contains("already succeeded"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A run of a PostgreSQL home driven by an engine on another machine: its pid means
/// nothing here, and while its heartbeat is fresh a resume here is refused (it took the
/// run over, and two engines drove it); once silent, it is taken over by one resume.
/// (PostgreSQL's client blocks: it is opened and written outside the runtime.)
#[test]
fn a_run_beating_on_another_machine_is_resumed_only_once_silent() {
    let pg = crate::testing::Postgres::start();
    let state = Arc::new(crate::state::PostgresState::open(&pg.url()).unwrap());
    let b = Bench::on("elsewhere", state.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let source = b.source(CHAIN);
    let id = RunId("r1".into());
    b.engine
        .admit(&mut b.request("r1", &source), false)
        .unwrap();
    // Its engine elsewhere: a pid no process here has, beating.
    let elsewhere = 4_194_304 + 7;
    state.reopen_run(&id, elsewhere).unwrap();
    state.heartbeat(&id).unwrap();
    match rt.block_on(b.engine.resume_request(&catalog(), &id)) {
        Err(Refusal::Busy(m)) => assert!(m.contains("heartbeat is fresh"), "{m}"),
        other => panic!("resumed under a live engine: {other:?}"),
    }
    assert_eq!(
        state.run(&id).unwrap().engine_pid,
        Some(i64::from(elsewhere))
    );
    // Silent for longer than three heartbeats: it stopped.
    let mut c = postgres::Client::connect(&pg.url(), postgres::NoTls).unwrap();
    let old = "UPDATE runs SET heartbeat_at = '2000-01-01T00:00:00.000Z' WHERE id = 'r1'";
    c.execute(old, &[]).unwrap();
    let (request, _) = rt
        .block_on(b.engine.resume_request(&catalog(), &id))
        .expect("taken over once silent");
    // Taken: a second resume (another machine's, at once) is refused.
    let again = rt.block_on(b.engine.resume_request(&catalog(), &id));
    assert!(matches!(again, Err(Refusal::Busy(_))), "{again:?}");
    assert_eq!(rt.block_on(b.run(request)).phase, Phase::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn secrets_as_files_are_refused_by_an_executor_that_cannot_mount_them() {
    let b = Bench::new("secrets");
    let yaml = "version: 1\nname: s\nstages:\n  s:\n    run: {command: [ok]}\n    secrets:\n      - {name: creds, mount_path: /secrets}\n";
    let summary = b.run(b.request("r1", &b.source(yaml))).await;
    assert_eq!(summary.stages["s"], Phase::Error);
    let stages = b.engine.state().stages(&RunId("r1".into())).unwrap();
    let reason = stages[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("not supported by the `fake` executor"),
        "{reason}"
    );
    assert!(b.fake.started().is_empty());
}
