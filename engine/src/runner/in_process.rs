//! The run loop in-process: [`Engine::run`] with the [`FakeExecutor`], a SQLite state
//! store and a `file://` artifact store in a scratch directory, in paused time (a backoff
//! or a timeout of minutes takes none). Each test drives one phase transition, or a few,
//! and checks what the state store recorded and which attempts were started.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::artifacts::ArtifactStore;
use crate::engine::{EngineBuilder, RunRequest};
use crate::runner::{Resume, Reused, RunEvent, RunSummary};
use crate::state::{Origin, Phase, Provenance, RunId, SqliteState, StateStore};
use crate::step::Catalog;
use crate::testing::FakeExecutor;

/// A scratch directory, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dt-loop-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One run of `yaml` and what it left.
struct Ran {
    summary: RunSummary,
    state: Arc<dyn StateStore>,
    fake: FakeExecutor,
    events: Vec<RunEvent>,
    _scratch: Scratch,
}

impl Ran {
    fn phase(&self, stage: &str) -> Phase {
        self.summary.stages[stage]
    }

    /// The reason recorded for `stage`.
    fn reason(&self, stage: &str) -> String {
        let stages = self.state.stages(&self.summary.id).unwrap();
        let s = stages.iter().find(|s| s.stage == stage).unwrap();
        s.reason.clone().unwrap_or_default()
    }

    /// The attempt numbers started for `stage`.
    fn attempts(&self, stage: &str) -> Vec<u32> {
        self.fake
            .started()
            .into_iter()
            .filter(|(s, _)| s == stage)
            .map(|(_, a)| a)
            .collect()
    }
}

/// Runs `yaml` to its end; `shape` adjusts the request (fail-fast, a resume, …).
async fn run_with(yaml: &str, shape: impl FnOnce(&mut RunRequest, &dyn StateStore)) -> Ran {
    run_cancelled(yaml, shape, None).await
}

/// [`run_with`], cancelled (as Ctrl-C would) `after` that long when given.
async fn run_cancelled(
    yaml: &str,
    shape: impl FnOnce(&mut RunRequest, &dyn StateStore),
    after: Option<std::time::Duration>,
) -> Ran {
    let scratch = Scratch::new("run");
    let validated = crate::validate(yaml, &Catalog::new(Vec::new(), vec!["local"]));
    let pipeline = validated
        .pipeline
        .unwrap_or_else(|| panic!("{:?}", validated.diagnostics));
    let state: Arc<dyn StateStore> =
        Arc::new(SqliteState::open(&scratch.0.join("state.db")).unwrap());
    let artifacts =
        ArtifactStore::open(&format!("file://{}", scratch.0.join("store").display())).unwrap();
    let fake = FakeExecutor::default();
    let engine = EngineBuilder::new(
        state.clone(),
        artifacts,
        Arc::new(fake.clone()),
        scratch.0.join("work"),
    )
    .parallelism(2)
    .build();
    let params = pipeline.resolve_params(&[]).expect("defaults");
    let mut request = RunRequest::new(
        RunId("r1".into()),
        Arc::new(pipeline),
        "p.yaml".into(),
        "sha256:0".into(),
    );
    request.params = params;
    shape(&mut request, state.as_ref());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (cancel_tx, cancel) = watch::channel(false);
    // The sender lives until the run has ended (in the task that cancels, or here).
    let _uncancelled = match after {
        Some(after) => {
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = cancel_tx.send(true);
                std::future::pending::<()>().await
            });
            None
        }
        None => Some(cancel_tx),
    };
    let summary = engine.run(request, tx, cancel).await.expect("the run ends");
    let mut events = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        events.push(ev);
    }
    Ran {
        summary,
        state,
        fake,
        events,
        _scratch: scratch,
    }
}

async fn run(yaml: &str) -> Ran {
    run_with(yaml, |_, _| {}).await
}

const HEAD: &str = "version: 1\nname: loop\n";

#[tokio::test(start_paused = true)]
async fn a_chain_succeeds_stage_by_stage() {
    let r = run(&format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [ok]}}\n  b:\n    needs: [a]\n    run: {{command: [ok]}}\n"
    ))
    .await;
    assert_eq!(r.summary.phase, Phase::Succeeded);
    assert_eq!(r.phase("a"), Phase::Succeeded);
    assert_eq!(r.phase("b"), Phase::Succeeded);
    assert_eq!(
        r.fake.started(),
        vec![("a".to_string(), 1), ("b".to_string(), 1)]
    );
    assert!(r.events.iter().any(
        |e| matches!(e, RunEvent::Finished { stage, phase: Phase::Succeeded, .. } if stage == "b")
    ));
}

#[tokio::test(start_paused = true)]
async fn a_failure_omits_its_dependants_and_independent_branches_finish() {
    let r = run(&format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [fail, 3]}}\n  b:\n    needs: [a]\n    run: {{command: [ok]}}\n  c:\n    run: {{command: [sleep, 30]}}\n"
    ))
    .await;
    assert_eq!(r.summary.phase, Phase::Failed);
    assert_eq!(r.phase("a"), Phase::Failed);
    assert_eq!(r.phase("b"), Phase::Omitted);
    assert_eq!(r.phase("c"), Phase::Succeeded);
    assert!(r.attempts("b").is_empty());
    assert!(
        r.reason("a").contains("exited with code 3"),
        "{}",
        r.reason("a")
    );
}

#[tokio::test(start_paused = true)]
async fn a_stage_that_cannot_start_ends_in_error_and_so_does_its_run() {
    let r = run(&format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [no-such-program]}}\n  b:\n    needs: [a]\n    run: {{command: [ok]}}\n  c:\n    run: {{command: [fail, 2]}}\n"
    ))
    .await;
    assert_eq!(r.phase("a"), Phase::Error);
    assert_eq!(r.phase("b"), Phase::Omitted);
    assert_eq!(r.phase("c"), Phase::Failed);
    // An error of the engine's or the machine's outranks a stage's own failure.
    assert_eq!(r.summary.phase, Phase::Error);
    assert!(r.attempts("b").is_empty());
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, RunEvent::Started { stage, attempt: 1 } if stage == "a")));
    assert!(r.events.iter().any(|e| matches!(
        e,
        RunEvent::Finished { stage, phase: Phase::Error, origin: None, .. } if stage == "a"
    )));
    assert!(!r.reason("a").is_empty());
}

#[tokio::test(start_paused = true)]
async fn fail_fast_stops_the_rest_of_the_run() {
    let r = run_with(
        &format!(
            "{HEAD}stages:\n  a:\n    run: {{command: [fail, 1]}}\n  slow:\n    run: {{command: [sleep, 600]}}\n  later:\n    needs: [slow]\n    run: {{command: [ok]}}\n"
        ),
        |req, _| req.fail_fast = true,
    )
    .await;
    assert_eq!(r.summary.phase, Phase::Failed);
    assert_eq!(r.phase("a"), Phase::Failed);
    assert_ne!(r.phase("slow"), Phase::Succeeded, "stopped, not finished");
    assert_eq!(r.phase("later"), Phase::Omitted);
    assert!(r.attempts("later").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_false_condition_skips_the_stage_and_a_skipped_producer_skips_its_consumer() {
    let r = run(&format!(
        "{HEAD}params:\n  go: {{type: boolean, default: false}}\nstages:\n  a:\n    when: params.go\n    run: {{command: [ok]}}\n    outputs: [x]\n  b:\n    inputs: {{x: a.x}}\n    run: {{command: [ok]}}\n  c:\n    run: {{command: [ok]}}\n"
    ))
    .await;
    assert_eq!(r.summary.phase, Phase::Succeeded, "skipped counts as done");
    assert_eq!(r.phase("a"), Phase::Skipped);
    assert!(r.reason("a").contains("was false"), "{}", r.reason("a"));
    assert_eq!(r.phase("b"), Phase::Skipped);
    assert_eq!(r.phase("c"), Phase::Succeeded);
    assert_eq!(r.fake.started(), vec![("c".to_string(), 1)]);
}

#[tokio::test(start_paused = true)]
async fn retries_follow_the_policy_and_backoff_takes_no_real_time() {
    let started = std::time::Instant::now();
    let r = run(&format!(
        "{HEAD}stages:\n  flaky:\n    retries: {{limit: 3, backoff: 10m}}\n    run: {{command: [flaky, 3]}}\n  hopeless:\n    retries: {{limit: 2, on: [oom], backoff: 1s}}\n    run: {{command: [fail, 2]}}\n  hungry:\n    retries: {{limit: 1, on: [oom], backoff: 1s}}\n    run: {{command: [oom]}}\n"
    ))
    .await;
    assert_eq!(r.phase("flaky"), Phase::Succeeded);
    assert_eq!(r.attempts("flaky"), vec![1, 2, 3]);
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, RunEvent::Retrying { stage, attempt: 2, .. } if stage == "flaky")));
    // `on: [oom]` does not retry an ordinary failure, and does retry an OOM kill.
    assert_eq!(r.phase("hopeless"), Phase::Failed);
    assert_eq!(r.attempts("hopeless"), vec![1]);
    assert_eq!(r.phase("hungry"), Phase::Failed);
    assert_eq!(r.attempts("hungry"), vec![1, 2]);
    assert!(
        r.reason("hungry").starts_with("out of memory"),
        "{}",
        r.reason("hungry")
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_cancels_the_attempt_and_fails_the_stage() {
    let r = run(&format!(
        "{HEAD}stages:\n  slow:\n    timeout: 90s\n    run: {{command: [sleep, 3600]}}\n"
    ))
    .await;
    assert_eq!(r.phase("slow"), Phase::Failed);
    assert!(
        r.reason("slow").contains("timed out after"),
        "{}",
        r.reason("slow")
    );
}

#[tokio::test(start_paused = true)]
async fn hooks_run_after_the_rest_finally_always_on_failure_only_on_failure() {
    let ok = run(&format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [ok]}}\n  always:\n    hook: finally\n    run: {{command: [ok]}}\n  alarm:\n    hook: on_failure\n    run: {{command: [ok]}}\n"
    ))
    .await;
    assert_eq!(ok.summary.phase, Phase::Succeeded);
    assert_eq!(ok.phase("always"), Phase::Succeeded);
    assert_eq!(ok.phase("alarm"), Phase::Skipped);
    assert!(
        ok.reason("alarm").contains("on_failure hook"),
        "{}",
        ok.reason("alarm")
    );
    let started = ok.fake.started();
    assert_eq!(started.last().unwrap().0, "always", "{started:?}");

    let failed = run(&format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [fail, 1]}}\n  always:\n    hook: finally\n    run: {{command: [ok]}}\n  alarm:\n    hook: on_failure\n    run: {{command: [ok]}}\n"
    ))
    .await;
    assert_eq!(failed.summary.phase, Phase::Failed);
    assert_eq!(failed.phase("always"), Phase::Succeeded);
    assert_eq!(failed.phase("alarm"), Phase::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_resumed_run_does_not_execute_what_succeeded_before() {
    let yaml = format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [ok]}}\n  b:\n    needs: [a]\n    run: {{command: [ok]}}\n"
    );
    let r = run_with(&yaml, |req, state| {
        // Run r1 was recorded with `a` succeeded, then its engine died.
        let record = crate::state::RunRecord {
            id: req.id.clone(),
            pipeline: "loop".into(),
            file: "p.yaml".into(),
            spec_digest: "sha256:0".into(),
            params: serde_json::json!({}),
            trigger: "cli".into(),
            parent: None,
            phase: Phase::Running,
            created_at: "2026-11-26T00:00:00.000Z".into(),
            finished_at: None,
            reason: None,
            engine_pid: None,
            overrides: serde_json::json!({}),
            selection: None,
            scheduled_time: None,
            executor: Some("fake".into()),
            project: "default".into(),
        };
        state.create_run(&record).unwrap();
        req.resume = Some(Resume {
            record,
            succeeded: BTreeMap::from([("a".into(), (BTreeMap::new(), serde_json::Value::Null))]),
            attempts: BTreeMap::from([("a".into(), 1)]),
            reattached: Default::default(),
        });
    })
    .await;
    assert_eq!(r.summary.phase, Phase::Succeeded);
    assert_eq!(r.fake.started(), vec![("b".to_string(), 1)]);
}

/// The origin each `Finished` event gave, with its stage, in the order they came.
fn origins(r: &Ran) -> Vec<(String, Option<Origin>)> {
    r.events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Finished { stage, origin, .. } => Some((stage.to_string(), origin.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_rerun_reuses_what_it_takes_and_says_so_in_events_and_state() {
    let yaml = format!(
        "{HEAD}stages:\n  a:\n    run: {{command: [ok]}}\n  b:\n    needs: [a]\n    run: {{command: [ok]}}\n  c:\n    needs: [b]\n    run: {{command: [fail]}}\n"
    );
    let r = run_with(&yaml, |req, _| {
        let taken = Provenance {
            origin: Origin::Ran,
            cache_key: None,
            provenance: serde_json::json!({}),
            inputs: serde_json::json!({}),
        };
        req.selection = Some(["b".into(), "c".into()].into());
        req.reuse = BTreeMap::from([(
            "a".into(),
            Reused {
                outputs: BTreeMap::new(),
                values: serde_json::json!({}),
                provenance: Provenance {
                    origin: Origin::Reused { run: "r0".into() },
                    ..taken
                },
            },
        )]);
    })
    .await;
    assert_eq!(
        r.fake.started(),
        vec![("b".to_string(), 1), ("c".to_string(), 1)]
    );
    let reused = Some(Origin::Reused { run: "r0".into() });
    assert_eq!(
        origins(&r),
        vec![
            ("a".to_string(), reused.clone()),
            ("b".to_string(), Some(Origin::Ran)),
            ("c".to_string(), None),
        ]
    );
    let a = r.state.stage(&r.summary.id, "a").unwrap().unwrap();
    assert_eq!(Some(a.how.origin), reused);
}

#[tokio::test(start_paused = true)]
async fn a_map_runs_each_item_and_fails_when_one_does() {
    let r = run(&format!(
        "{HEAD}stages:\n  each:\n    map: {{items: [ok, ok, ok]}}\n    run: {{command: [\"{{{{ item }}}}\"]}}\n  some:\n    map: {{items: [ok, fail, ok]}}\n    run: {{command: [\"{{{{ item }}}}\", \"4\"]}}\n"
    ))
    .await;
    assert_eq!(r.phase("each"), Phase::Succeeded);
    assert_eq!(r.phase("some"), Phase::Failed);
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, RunEvent::Items { stage, total: 3 } if stage == "each")));
    let done = |stage: &str, ok: bool| {
        r.events
            .iter()
            .filter(|e| matches!(e, RunEvent::ItemDone { stage: s, succeeded } if s == stage && *succeeded == ok))
            .count()
    };
    assert_eq!(done("each", true), 3);
    assert_eq!(done("some", false), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_stops_the_running_stage_omits_the_rest_and_still_runs_finally_hooks() {
    let r = run_cancelled(
        &format!(
            "{HEAD}stages:\n  slow:\n    run: {{command: [sleep, 600]}}\n  later:\n    needs: [slow]\n    run: {{command: [ok]}}\n  always:\n    hook: finally\n    run: {{command: [ok]}}\n"
        ),
        |_, _| {},
        Some(std::time::Duration::from_secs(60)),
    )
    .await;
    assert_eq!(r.summary.phase, Phase::Cancelled);
    assert_eq!(r.phase("slow"), Phase::Cancelled);
    assert_eq!(r.phase("later"), Phase::Omitted);
    assert_eq!(
        r.phase("always"),
        Phase::Succeeded,
        "hooks run after a cancel"
    );
    assert!(r.attempts("later").is_empty());
}
