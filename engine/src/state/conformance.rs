//! The conformance suite every [`StateStore`] implementation's tests call, so SQLite
//! and the server databases behave the same. Panics on the first broken guarantee.

use std::collections::BTreeMap;

mod access;
mod devices;
mod events;
mod trials;
pub use devices::exclusive_gpus;
pub use events::exclusive_batches;

use super::{
    now, ArtifactRecord, CacheEntry, Origin, Phase, Provenance, RunFilter, RunId, RunRecord,
    RunStore, StateError, StateStore, Success, TickRecord,
};

/// A run record for tests.
pub fn run_record(id: &str) -> RunRecord {
    RunRecord {
        id: RunId(id.into()),
        pipeline: "p".into(),
        file: "p.yaml".into(),
        spec_digest: "sha256:d".into(),
        params: serde_json::json!({"n": 1}),
        trigger: "cli".into(),
        parent: None,
        phase: Phase::Running,
        created_at: now(),
        finished_at: None,
        reason: None,
        engine_pid: Some(7),
        overrides: serde_json::json!({}),
        selection: None,
        scheduled_time: None,
        executor: Some("local".into()),
        project: "default".into(),
    }
}

/// Runs every check against `store`, which must be empty.
pub fn check(store: &dyn StateStore) {
    heartbeats_and_take_over(store);
    runs_stages_and_attempts(store);
    map_items(store);
    trials::trials_and_metrics(store);
    listing(store);
    filtered_listing(store);
    provenance_and_cache(store);
    artifacts(store);
    success_at_once(store);
    schedules_and_ticks(store);
    ticks_in_batches(store);
    events::inbox(store);
    events::outbox(store);
    access::tokens_and_audit(store);
    access::approvals(store);
    access::request_keys(store);
    pipeline_sources(store);
    devices::ledger(store);
    devices::priorities(store);
    devices::fair_share(store);
    devices::capacity(store);
}

/// A run's pipeline text is kept once per digest and read back whole.
fn pipeline_sources(store: &dyn StateStore) {
    let text = "version: 1\nname: kept\n# ünïcode and 'quotes'\n";
    assert_eq!(store.source("sha256:kept").unwrap(), None);
    store.keep_source("sha256:kept", text).unwrap();
    store.keep_source("sha256:kept", "another text").unwrap();
    assert_eq!(store.source("sha256:kept").unwrap().as_deref(), Some(text));
}

/// Replicas racing for the same ticks, each through its own connection (`open`),
/// claim every tick exactly once.
pub fn exclusive_claims(open: &(dyn Fn() -> Box<dyn StateStore> + Sync)) {
    const TICKS: usize = 40;
    let won: Vec<Vec<usize>> = std::thread::scope(|sc| {
        let racers: Vec<_> = (0..4)
            .map(|_| {
                sc.spawn(|| {
                    let s = open();
                    (0..TICKS)
                        .filter(|i| {
                            s.claim_tick(&TickRecord {
                                id: format!("race@{i}"),
                                pipeline: "race".into(),
                                scheduled_time: format!("2026-03-01T00:{i:02}:00Z"),
                                outcome: "fired".into(),
                                run_id: Some(format!("race-{i}")),
                                reason: None,
                            })
                            .unwrap()
                        })
                        .collect()
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let mut all: Vec<usize> = won.into_iter().flatten().collect();
    all.sort();
    assert_eq!(all, (0..TICKS).collect::<Vec<_>>(), "each tick won once");
}

fn heartbeats_and_take_over(s: &dyn RunStore) {
    let id = RunId("conf-hb".into());
    s.create_run(&run_record("conf-hb")).unwrap();
    let past = "2000-01-01T00:00:00.000Z";
    let future = "2999-01-01T00:00:00.000Z";
    assert!(
        s.stale_runs(future).unwrap().is_empty(),
        "a run that never beat is not judged by heartbeats"
    );
    let silent = RunId("conf-hb-silent".into());
    s.create_run(&run_record("conf-hb-silent")).unwrap();
    assert!(
        s.take_over(&silent, past).unwrap(),
        "one that never beat can be taken"
    );
    assert!(!s.take_over(&silent, past).unwrap(), "once");
    assert!(!s.cancel_asked(&silent).unwrap());
    assert!(s.ask_cancel(&silent).unwrap());
    assert!(
        s.ask_cancel(&silent).unwrap(),
        "asked twice: still to be cancelled"
    );
    assert!(s.cancel_asked(&silent).unwrap());
    s.finish_run(&silent, Phase::Failed, None).unwrap();
    assert!(
        !s.ask_cancel(&silent).unwrap(),
        "an ended run is not cancelled"
    );
    assert!(!s.ask_cancel(&RunId("conf-no-such-run".into())).unwrap());
    s.heartbeat(&id).unwrap();
    assert!(s.stale_runs(past).unwrap().is_empty(), "beating: alive");
    assert_eq!(s.stale_runs(future).unwrap(), std::slice::from_ref(&id));
    assert!(s.take_over(&id, future).unwrap());
    assert_eq!(s.run(&id).unwrap().engine_pid, None);
    assert!(
        !s.take_over(&id, past).unwrap(),
        "taken over: its heartbeat is fresh again"
    );
    s.finish_run(&id, Phase::Failed, Some("x")).unwrap();
    assert!(
        s.stale_runs(future).unwrap().is_empty(),
        "ended runs are not stale"
    );
    assert!(!s.take_over(&id, future).unwrap());
}

/// What the scheduler reads and writes once per loop for all schedules.
fn ticks_in_batches(s: &dyn StateStore) {
    let before = now();
    s.upsert_schedule("batch-a", "a.yaml", "2026-01-01T00:00:00Z")
        .unwrap();
    s.upsert_schedule("batch-b", "b.yaml", "2026-01-01T00:00:00Z")
        .unwrap();
    let tick = |t: &str, run: Option<&str>| TickRecord {
        id: format!("batch-a@{t}"),
        pipeline: "batch-a".into(),
        scheduled_time: t.into(),
        outcome: if run.is_some() { "fired" } else { "skipped" }.into(),
        run_id: run.map(String::from),
        reason: run.is_none().then(|| "missed".into()),
    };
    let run = |id: &str| RunRecord {
        pipeline: "batch-a".into(),
        ..run_record(id)
    };
    let last = |s: &dyn StateStore| -> BTreeMap<String, Option<String>> {
        s.schedules_with_last_tick()
            .unwrap()
            .into_iter()
            .filter(|(e, _)| e.pipeline.starts_with("batch-"))
            .map(|(e, last)| (e.pipeline, last))
            .collect()
    };
    assert_eq!(
        last(s),
        BTreeMap::from([("batch-a".into(), None), ("batch-b".into(), None)])
    );
    let claims = s
        .claim_ticks(&[
            (
                tick("2026-03-01T01:00:00Z", Some("batch-r1")),
                Some(run("batch-r1")),
            ),
            (tick("2026-03-01T02:00:00Z", None), None),
        ])
        .unwrap();
    assert!(claims.iter().all(|c| matches!(c, Ok(true))), "{claims:?}");
    assert_eq!(
        s.run(&RunId("batch-r1".into())).unwrap().pipeline,
        "batch-a"
    );
    // A manual trigger later than every cron tick does not stand for one.
    assert!(s
        .claim_tick(&TickRecord {
            id: "batch-a@2026-03-01T05:00:00Z+manual".into(),
            ..tick("2026-03-01T05:00:00Z", Some("batch-manual"))
        })
        .unwrap());
    assert_eq!(last(s)["batch-a"].as_deref(), Some("2026-03-01T02:00:00Z"));
    assert_eq!(last(s)["batch-b"], None);
    // The queued manual tick has no run: found among ticks recorded since `before`.
    let unstarted: Vec<String> = s
        .unstarted_ticks_since(&before)
        .unwrap()
        .into_iter()
        .filter(|t| t.pipeline == "batch-a")
        .map(|t| t.id)
        .collect();
    assert_eq!(unstarted, ["batch-a@2026-03-01T05:00:00Z+manual"]);
    assert!(s.unstarted_ticks_since("9999").unwrap().is_empty());
    // One transaction, each tick on its own: taken ones and failed runs record nothing.
    let claims = s
        .claim_ticks(&[
            (
                tick("2026-03-01T01:00:00Z", Some("batch-r1b")),
                Some(run("batch-r1b")),
            ),
            (
                tick("2026-03-01T03:00:00Z", Some("batch-r1")),
                Some(run("batch-r1")),
            ),
            (
                tick("2026-03-01T04:00:00Z", Some("batch-r4")),
                Some(run("batch-r4")),
            ),
        ])
        .unwrap();
    assert!(matches!(claims[0], Ok(false)), "claimed before: {claims:?}");
    assert!(claims[1].is_err(), "a run id taken: {claims:?}");
    assert!(matches!(claims[2], Ok(true)), "{claims:?}");
    assert!(s.run(&RunId("batch-r1b".into())).is_err());
    assert!(s.run(&RunId("batch-r4".into())).is_ok());
    let times: Vec<String> = s
        .ticks("batch-a", 10)
        .unwrap()
        .into_iter()
        .map(|t| t.scheduled_time)
        .collect();
    assert_eq!(
        times,
        [
            "2026-03-01T05:00:00Z",
            "2026-03-01T04:00:00Z",
            "2026-03-01T02:00:00Z",
            "2026-03-01T01:00:00Z"
        ],
        "the failed tick is not claimed"
    );
}

fn schedules_and_ticks(s: &dyn StateStore) {
    s.upsert_schedule("nightly", "a.yaml", "2026-01-01T00:00:00Z")
        .unwrap();
    // Registering again updates the file, not the anchor.
    s.upsert_schedule("nightly", "b.yaml", "2026-05-05T00:00:00Z")
        .unwrap();
    let e = s.schedule("nightly").unwrap().unwrap();
    assert_eq!(
        (e.file.as_str(), e.anchor.as_str(), e.suspended),
        ("b.yaml", "2026-01-01T00:00:00Z", false)
    );
    s.set_suspended("nightly", true, None).unwrap();
    assert!(s.schedule("nightly").unwrap().unwrap().suspended);
    s.set_suspended("nightly", false, Some("2026-02-01T00:00:00Z"))
        .unwrap();
    assert_eq!(
        s.schedule("nightly").unwrap().unwrap().anchor,
        "2026-02-01T00:00:00Z"
    );
    assert!(s.set_suspended("nope", true, None).is_err());
    assert_eq!(s.schedules().unwrap().len(), 1);
    let tick = |t: &str| TickRecord {
        id: format!("nightly@{t}"),
        pipeline: "nightly".into(),
        scheduled_time: t.into(),
        outcome: "fired".into(),
        run_id: Some(format!("run-{t}")),
        reason: None,
    };
    assert!(s.claim_tick(&tick("2026-02-02T03:00:00Z")).unwrap());
    assert!(
        !s.claim_tick(&tick("2026-02-02T03:00:00Z")).unwrap(),
        "a tick is claimed once"
    );
    assert!(s.claim_tick(&tick("2026-02-03T03:00:00Z")).unwrap());
    let ticks = s.ticks("nightly", 10).unwrap();
    assert_eq!(
        ticks[0].scheduled_time, "2026-02-03T03:00:00Z",
        "newest first"
    );
    assert_eq!(s.ticks("nightly", 1).unwrap().len(), 1);
    // Claimed, no run yet: both are unstarted, oldest first; a started one is not.
    let unstarted = |s: &dyn StateStore| -> Vec<String> {
        s.unstarted_ticks_since("")
            .unwrap()
            .into_iter()
            .filter(|t| t.pipeline == "nightly")
            .map(|t| t.scheduled_time)
            .collect()
    };
    assert_eq!(
        unstarted(s),
        vec!["2026-02-02T03:00:00Z", "2026-02-03T03:00:00Z"]
    );
    s.create_run(&run_record("run-2026-02-02T03:00:00Z"))
        .unwrap();
    assert_eq!(unstarted(s), vec!["2026-02-03T03:00:00Z"]);
    assert!(s.run_counts().unwrap().get("Running").copied().unwrap_or(0) >= 1);
    assert!(s
        .claim_tick(&TickRecord {
            outcome: "skipped".into(),
            run_id: None,
            ..tick("2026-02-04T03:00:00Z")
        })
        .unwrap());
    assert_eq!(
        unstarted(s),
        vec!["2026-02-03T03:00:00Z"],
        "skipped ticks start nothing"
    );
    let mut r = run_record("conf-sched-run");
    r.pipeline = "nightly".into();
    s.create_run(&r).unwrap();
    assert_eq!(s.running_runs("nightly").unwrap(), [r.id.clone()]);
    s.finish_run(&r.id, Phase::Succeeded, None).unwrap();
    assert!(s.running_runs("nightly").unwrap().is_empty());
}

/// Published artifacts by digest, and short digests made whole.
fn artifacts(s: &dyn StateStore) {
    let a = ArtifactRecord {
        digest: "sha256:aa".into(),
        manifest: "runs/x/a/1/manifests/o.json".into(),
        run_id: "x".into(),
        stage: "a".into(),
        output: "o".into(),
        created_at: now(),
    };
    s.add_artifacts(std::slice::from_ref(&a)).unwrap();
    s.add_artifacts(std::slice::from_ref(&a)).unwrap();
    assert_eq!(s.artifact("sha256:aa").unwrap(), Some(a.clone()));
    assert_eq!(s.artifact("sha256:none").unwrap(), None);
    // Short digests made whole: one, two (ambiguous), none; never one that only sorts
    // near.
    for d in ["sha256:aab1", "sha256:aab2", "sha256:ab"] {
        let more = ArtifactRecord {
            digest: d.into(),
            ..a.clone()
        };
        s.add_artifacts(&[more]).unwrap();
    }
    let starting = |p: &str| s.artifacts_starting(p, 5).unwrap();
    assert_eq!(starting("sha256:aab"), ["sha256:aab1", "sha256:aab2"]);
    assert_eq!(starting("sha256:aab2"), ["sha256:aab2"]);
    assert_eq!(
        starting("sha256:a"),
        ["sha256:aa", "sha256:aab1", "sha256:aab2", "sha256:ab"]
    );
    assert_eq!(s.artifacts_starting("sha256:a", 2).unwrap().len(), 2);
    assert!(starting("sha256:ac").is_empty() && starting("sha256:b").is_empty());
}

fn provenance_and_cache(s: &dyn StateStore) {
    let mut rec = run_record("conf-prov");
    rec.parent = Some(RunId("conf-r1".into()));
    rec.selection = Some(vec!["b".into()]);
    rec.overrides = serde_json::json!({"params": {"n": 2}});
    s.create_run(&rec).unwrap();
    let id = rec.id.clone();
    let back = s.run(&id).unwrap();
    assert_eq!(back.selection, rec.selection);
    assert_eq!(back.overrides, rec.overrides);
    assert_eq!(back.parent, rec.parent);

    // A stage that ran records the artifacts it read; a reused one does not.
    let art = serde_json::json!({"manifest": "runs/x/a/1/manifests/o.json", "digest": "sha256:aa"});
    let ran = Provenance {
        origin: Origin::Ran,
        cache_key: Some("sha256:k1".into()),
        provenance: serde_json::json!({"components": {"input:data": "sha256:aa"}}),
        inputs: serde_json::json!({"data": art}),
    };
    s.set_provenance(&id, "b", &ran).unwrap();
    s.set_stage(&id, "b", Phase::Succeeded, Some(0), None)
        .unwrap();
    let reused = Provenance {
        origin: Origin::Reused {
            run: "conf-r1".into(),
        },
        cache_key: None,
        provenance: serde_json::json!({}),
        inputs: serde_json::json!({"data": art}),
    };
    s.set_provenance(&id, "c", &reused).unwrap();
    let stages = s.stages(&id).unwrap();
    let b = stages.iter().find(|x| x.stage == "b").unwrap();
    assert_eq!(b.phase, Phase::Succeeded, "provenance keeps the phase");
    assert_eq!(
        (&b.how.origin, b.how.cache_key.as_deref()),
        (&Origin::Ran, Some("sha256:k1"))
    );
    assert_eq!(b.how.inputs["data"]["digest"], "sha256:aa");
    assert_eq!(s.stage(&id, "b").unwrap().as_ref(), Some(b));
    assert_eq!(s.stage(&id, "nope").unwrap(), None);
    assert_eq!(
        s.stages_mentioning("input:data").unwrap(),
        [(id.clone(), "b".to_owned())]
    );
    let c = stages.iter().find(|x| x.stage == "c").unwrap();
    assert_eq!(
        c.how.origin,
        Origin::Reused {
            run: "conf-r1".into()
        }
    );
    let uses = s.artifact_uses("sha256:aa").unwrap();
    assert_eq!(uses.len(), 1, "{uses:?}");
    assert_eq!(
        (uses[0].stage.as_str(), uses[0].input.as_str()),
        ("b", "data")
    );

    let entry = |key: &str, at: &str| CacheEntry {
        key: key.into(),
        pipeline: "p".into(),
        stage: "b".into(),
        run_id: id.0.clone(),
        outputs: serde_json::json!({"o": art}),
        values: serde_json::json!({"v": 1}),
        components: serde_json::json!({"definition": "sha256:d"}),
        created_at: at.into(),
    };
    s.put_cache_entry(&entry("sha256:k1", "2026-01-01T00:00:00.000Z"))
        .unwrap();
    s.put_cache_entry(&entry("sha256:k2", "2026-02-01T00:00:00.000Z"))
        .unwrap();
    // Replacing an entry keeps one row per key.
    s.put_cache_entry(&entry("sha256:k1", "2026-01-02T00:00:00.000Z"))
        .unwrap();
    assert_eq!(s.cache_entries().unwrap().len(), 2);
    assert_eq!(
        s.cache_entry("sha256:k1").unwrap().unwrap().created_at,
        "2026-01-02T00:00:00.000Z"
    );
    assert_eq!(s.cache_entry("sha256:nope").unwrap(), None);
    let others = s
        .recent_cache_entries("p", "default", "b", "sha256:k2", 10)
        .unwrap();
    assert_eq!(others.len(), 1);
    assert_eq!(others[0].key, "sha256:k1");
    let all = s.recent_cache_entries("p", "default", "b", "", 10).unwrap();
    let keys: Vec<&str> = all.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["sha256:k2", "sha256:k1"], "newest first");
    let one = s.recent_cache_entries("p", "default", "b", "", 1).unwrap();
    assert_eq!(one.len(), 1);
    // Another project's runs made none of them.
    let elsewhere = s.recent_cache_entries("p", "beta", "b", "", 10).unwrap();
    assert!(elsewhere.is_empty(), "{elsewhere:?}");
    assert_eq!(
        s.expire_cache_entries("2026-01-15T00:00:00.000Z").unwrap(),
        1
    );
    assert_eq!(s.cache_entries().unwrap().len(), 1);
}

/// A succeeded stage recorded at once: its attempt ended, its artifact, outputs, values
/// and cache entry stored, its phase set; a map stage (no attempt of its own) too.
fn success_at_once(s: &dyn StateStore) {
    let rec = run_record("conf-success");
    s.create_run(&rec).unwrap();
    let id = rec.id.clone();
    s.start_attempt(&id, "train", 1).unwrap();
    let art = ArtifactRecord {
        digest: "sha256:5c".into(),
        manifest: "runs/conf-success/train/1/manifests/model.json".into(),
        run_id: id.0.clone(),
        stage: "train".into(),
        output: "model".into(),
        created_at: now(),
    };
    let outputs = serde_json::json!({"model": {"digest": "sha256:5c"}});
    let values = serde_json::json!({"loss": 0.5});
    let entry = CacheEntry {
        key: "sha256:success".into(),
        pipeline: "p".into(),
        stage: "train".into(),
        run_id: id.0.clone(),
        outputs: outputs.clone(),
        values: values.clone(),
        components: serde_json::json!({}),
        created_at: now(),
    };
    s.record_success(&Success {
        run: &id,
        stage: "train",
        attempt: Some(1),
        artifacts: std::slice::from_ref(&art),
        outputs: &outputs,
        values: &values,
        cache: Some(&entry),
        exit_code: Some(0),
        reason: None,
    })
    .unwrap();
    let train = s.stage(&id, "train").unwrap().unwrap();
    assert_eq!(
        (train.phase, train.attempts, train.exit_code),
        (Phase::Succeeded, 1, Some(0))
    );
    assert_eq!(train.outputs, outputs);
    assert_eq!(train.values, values);
    assert!(train.finished_at.is_some());
    let attempt = &s.attempts(&id).unwrap()[0];
    assert_eq!(
        (attempt.phase, attempt.exit_code),
        (Phase::Succeeded, Some(0))
    );
    assert!(attempt.finished_at.is_some());
    assert_eq!(s.artifact("sha256:5c").unwrap(), Some(art));
    assert_eq!(s.cache_entry("sha256:success").unwrap(), Some(entry));

    let empty = serde_json::json!({});
    s.record_success(&Success {
        run: &id,
        stage: "each",
        attempt: None,
        artifacts: &[],
        outputs: &empty,
        values: &serde_json::Value::Null,
        cache: None,
        exit_code: None,
        reason: Some("3 of 3 items succeeded"),
    })
    .unwrap();
    let each = s.stage(&id, "each").unwrap().unwrap();
    assert_eq!(each.phase, Phase::Succeeded);
    assert_eq!(each.reason.as_deref(), Some("3 of 3 items succeeded"));
    assert_eq!(
        s.attempts(&id).unwrap().len(),
        1,
        "a map stage has no attempt row"
    );
}

fn runs_stages_and_attempts(s: &dyn StateStore) {
    let id = RunId("conf-r1".into());
    s.create_run(&run_record("conf-r1")).unwrap();
    assert!(
        s.create_run(&run_record("conf-r1")).is_err(),
        "a run id is unique"
    );
    s.start_attempt(&id, "a", 1).unwrap();
    s.set_attempt_handle(&id, "a", 1, "pgid:42").unwrap();
    s.start_attempt(&id, "a", 1)
        .expect("a running attempt starts again (a restarted engine re-attaches)");
    assert_eq!(
        s.attempts(&id).unwrap()[0].handle.as_deref(),
        Some("pgid:42")
    );
    assert_eq!(s.attempts(&id).unwrap()[0].waited_until, None);
    s.set_attempt_waited(&id, "a", 1, "waiting for 1 GPU(s)")
        .unwrap();
    let waited = s.attempts(&id).unwrap().remove(0);
    assert_eq!(waited.waited_for.as_deref(), Some("waiting for 1 GPU(s)"));
    assert!(waited.waited_until.unwrap() >= waited.started_at);
    s.finish_attempt(&id, "a", 1, Phase::Failed, Some(3), Some("exit 3"))
        .unwrap();
    assert!(
        s.start_attempt(&id, "a", 1).is_err(),
        "an attempt is recorded once"
    );
    s.start_attempt(&id, "a", 2).unwrap();
    s.finish_attempt(&id, "a", 2, Phase::Succeeded, Some(0), None)
        .unwrap();
    s.set_stage(&id, "a", Phase::Succeeded, Some(0), None)
        .unwrap();
    let used = crate::executor::ResourceUsage {
        peak_memory_bytes: Some(64 << 20),
        cpu_seconds: Some(1.5),
        ..Default::default()
    };
    s.set_attempt_usage(&id, "a", 2, &used).unwrap();
    s.set_stage_results(
        &id,
        "a",
        &serde_json::json!({"out": {"digest": "x"}}),
        &serde_json::json!({"ok": true}),
    )
    .unwrap();
    // Values are searched as the rendered definition is (a drive named in `ingest`'s).
    assert_eq!(
        s.stages_mentioning("\"ok\"").unwrap(),
        [(id.clone(), "a".to_owned())]
    );
    s.set_stage(&id, "b", Phase::Skipped, None, Some("when was false"))
        .unwrap();
    assert_eq!(s.run(&id).unwrap().engine_pid, Some(7));
    s.finish_run(&id, Phase::Succeeded, None).unwrap();

    let r = s.run(&id).unwrap();
    assert_eq!(r.phase, Phase::Succeeded);
    assert!(r.finished_at.is_some());
    assert_eq!(r.engine_pid, None, "a finished run has no engine");
    assert_eq!(r.params["n"], 1);
    let stages = s.stages(&id).unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!((stages[0].phase, stages[0].attempts), (Phase::Succeeded, 2));
    assert_eq!(stages[0].values["ok"], true);
    assert_eq!(stages[0].outputs["out"]["digest"], "x");
    assert_eq!(stages[1].reason.as_deref(), Some("when was false"));
    assert_eq!(stages[0].usage, Some(used), "what its last attempt used");
    assert_eq!(stages[1].usage, None);
    let attempts = s.attempts(&id).unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].handle.as_deref(), Some("pgid:42"));
    assert_eq!(attempts[0].exit_code, Some(3));
    assert!(matches!(
        s.run(&RunId("conf-nope".into())),
        Err(StateError::UnknownRun(_))
    ));

    s.reopen_run(&id, 9).unwrap();
    let r = s.run(&id).unwrap();
    assert_eq!(
        (r.phase, r.engine_pid, r.finished_at),
        (Phase::Running, Some(9), None)
    );
    assert!(matches!(
        s.reopen_run(&RunId("conf-nope".into()), 1),
        Err(StateError::UnknownRun(_))
    ));
}

fn map_items(s: &dyn StateStore) {
    let id = RunId("conf-r2".into());
    s.create_run(&run_record("conf-r2")).unwrap();
    let items: Vec<serde_json::Value> =
        (0..1000).map(|i| serde_json::json!({"drive": i})).collect();
    s.add_map_items(&id, "m", &items).unwrap();
    s.start_item(&id, "m", 3, 1).unwrap();
    let running = &s.map_items(&id, "m").unwrap()[3];
    assert!(running.started_at.is_some() && running.finished_at.is_none());
    s.set_item_handle(&id, "m", 3, "pgid:9").unwrap();
    let end = |phase, reason, outputs, values| super::ItemEnd {
        phase,
        reason,
        outputs,
        values,
    };
    let (outputs, values) = (
        serde_json::json!({"o": 1}),
        serde_json::json!({"loss": 0.5}),
    );
    s.finish_item(&id, "m", 3, end(Phase::Succeeded, None, &outputs, &values))
        .unwrap();
    let (none, null) = (serde_json::json!({}), serde_json::Value::Null);
    s.finish_item(
        &id,
        "m",
        4,
        end(Phase::Failed, Some("exit 1"), &none, &null),
    )
    .unwrap();
    let used = crate::executor::ResourceUsage {
        peak_memory_bytes: Some(1 << 20),
        ..Default::default()
    };
    s.set_item_usage(&id, "m", 3, &used).unwrap();
    let listed = s.map_items(&id, "m").unwrap();
    assert_eq!(listed.len(), 1000);
    assert_eq!((listed[3].usage, listed[4].usage), (Some(used), None));
    assert_eq!((listed[3].phase, listed[3].attempts), (Phase::Succeeded, 1));
    assert_eq!(listed[3].handle.as_deref(), Some("pgid:9"));
    // When its attempt ran, in order; an item never started has no start.
    let (from, to) = (&listed[3].started_at, &listed[3].finished_at);
    assert!(
        from.is_some() && to.is_some() && from <= to,
        "{from:?} {to:?}"
    );
    assert_eq!(listed[5].started_at, None);
    assert_eq!(listed[3].item["drive"], 3);
    assert_eq!(listed[3].outputs["o"], 1);
    // The values it reported; none for one that failed or never ran.
    assert_eq!(listed[3].values, values);
    assert_eq!((&listed[4].values, &listed[5].values), (&null, &null));
    let counts = s.item_counts(&id, "m").unwrap();
    assert_eq!(
        (counts["Pending"], counts["Succeeded"], counts["Failed"]),
        (998, 1, 1)
    );
    s.add_map_items(&id, "m", &items[..10]).unwrap();
    assert_eq!(
        s.item_counts(&id, "m").unwrap()["Pending"],
        10,
        "adding again starts over"
    );
}

fn listing(s: &dyn RunStore) {
    let runs = s.list_runs(10).unwrap();
    assert!(runs.len() >= 2);
    assert!(
        runs.windows(2).all(|w| w[0].created_at >= w[1].created_at),
        "newest first"
    );
    assert_eq!(s.list_runs(1).unwrap().len(), 1);
}

/// `find_runs` answers what filtering the whole list would, for every filter alone and
/// together, newest first, within its limit.
fn filtered_listing(s: &dyn RunStore) {
    let phases = [Phase::Succeeded, Phase::Failed, Phase::Running];
    let triggers = ["cli", "api", "schedule"];
    for i in 0..36 {
        let mut r = run_record(&format!("filtered-{i:02}"));
        r.pipeline = ["fa", "fb"][i % 2].into();
        r.phase = phases[i % 3];
        r.trigger = triggers[(i / 3) % 3].into();
        // Far in the future and in order, some sharing a time (the id breaks the tie).
        r.created_at = format!("2090-01-01T00:00:{:02}.000Z", i / 2 * 2);
        s.create_run(&r).unwrap();
    }
    let all = s.list_runs(100_000).unwrap();
    let since = "2090-01-01T00:00:20.000Z".to_owned();
    for pipeline in [None, Some("fa"), Some("nope")] {
        for phase in [None, Some(Phase::Failed), Some(Phase::Running)] {
            for trigger in [None, Some("api")] {
                for since in [None, Some(since.clone())] {
                    let filter = RunFilter {
                        pipeline: pipeline.map(Into::into),
                        phase,
                        trigger: trigger.map(Into::into),
                        since: since.clone(),
                        projects: None,
                    };
                    for limit in [3, 1000] {
                        let expected: Vec<&RunId> = all
                            .iter()
                            .filter(|r| {
                                pipeline.is_none_or(|p| r.pipeline == p)
                                    && phase.is_none_or(|p| r.phase == p)
                                    && trigger.is_none_or(|t| r.trigger == t)
                                    && since.as_ref().is_none_or(|t| r.created_at >= *t)
                            })
                            .map(|r| &r.id)
                            .take(limit)
                            .collect();
                        let got = s.find_runs(&filter, limit).unwrap();
                        let got: Vec<&RunId> = got.iter().map(|r| &r.id).collect();
                        assert_eq!(got, expected, "{filter:?}, limit {limit}");
                    }
                }
            }
        }
    }
    let newest = s.find_runs(&RunFilter::default(), 2).unwrap();
    assert_eq!(newest[0].id.0, "filtered-35");
    assert_eq!(
        newest[1].id.0, "filtered-34",
        "the same time: the greater id first"
    );
}
