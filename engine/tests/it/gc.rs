//! Retention never deletes what something refers to: random histories of runs (old and
//! recent, finished and running), stages that ran, were reused from an earlier run or
//! fanned in other runs' artifacts, and cache entries old and young; after `gc --apply`
//! every artifact a kept run or a live cache entry refers to is complete and verifies,
//! and every artifact of an old run that nothing refers to is gone.

use drivetrain_engine::state::prelude::*;
use std::collections::BTreeSet;

use drivetrain_engine::artifacts::{ArtifactRef, ArtifactStore, AttemptKey};
use drivetrain_engine::history::gc;
use drivetrain_engine::state::{
    conformance::run_record, CacheEntry, Origin, Phase, Provenance, SqliteState,
};
use proptest::prelude::*;
use serde_json::json;

const CUTOFF: &str = "2026-06-01T00:00:00.000Z";

/// One stage of a generated run.
#[derive(Debug, Clone)]
enum Op {
    /// Publishes a new artifact, reading the earlier artifact `input` (if any) as input.
    Ran { input: Option<usize> },
    /// Takes an earlier artifact as its output (a rerun's reuse or a cache hit).
    Reused { artifact: usize },
    /// Publishes the fan-in of earlier artifacts (a map stage's collection).
    Collect { items: Vec<usize> },
}

#[derive(Debug, Clone)]
struct RunSpec {
    old: bool,
    running: bool,
    ops: Vec<Op>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => proptest::option::of(0usize..64).prop_map(|input| Op::Ran { input }),
        2 => (0usize..64).prop_map(|artifact| Op::Reused { artifact }),
        1 => proptest::collection::vec(0usize..64, 1..4).prop_map(|items| Op::Collect { items }),
    ]
}

fn run_spec() -> impl Strategy<Value = RunSpec> {
    (
        any::<bool>(),
        prop::bool::weighted(0.15),
        proptest::collection::vec(op(), 1..4),
    )
        .prop_map(|(old, running, ops)| RunSpec { old, running, ops })
}

fn history() -> impl Strategy<Value = (Vec<RunSpec>, Vec<(usize, bool)>)> {
    (
        proptest::collection::vec(run_spec(), 1..7),
        proptest::collection::vec((0usize..64, any::<bool>()), 0..5),
    )
}

/// Records the generated history, runs gc, and checks that everything referenced
/// survives and that an old run's unreferenced artifact does not.
async fn check(runs: Vec<RunSpec>, cache: Vec<(usize, bool)>) {
    let state = SqliteState::in_memory().unwrap();
    let store = ArtifactStore::open("memory://").unwrap();
    let scratch = tempdir();
    let published = record(&state, &store, &scratch, &runs).await;
    put_cache_entries(&state, &published, &cache);
    let referenced = referenced(&state, &runs);
    let report = gc(&state, &store, CUTOFF, true).await.unwrap();
    for a in &referenced {
        store
            .verify(a)
            .await
            .unwrap_or_else(|e| panic!("gc broke referenced artifact {a:?}: {e}\n{report:?}"));
    }
    // Not vacuous: an old run's artifact that nothing refers to, directly or as a member
    // of a referenced collection, is gone.
    let mut member_prefixes = BTreeSet::new();
    for a in &referenced {
        for k in store.object_keys(a).await.unwrap() {
            member_prefixes.insert(k);
        }
    }
    for a in &published {
        let run = a.manifest.split('/').nth(1).unwrap();
        let r: usize = run[1..].parse().unwrap();
        let kept = !runs[r].old || runs[r].running;
        if kept || referenced.contains(a) {
            continue;
        }
        let objects = store.object_keys(a).await;
        let still_needed = objects
            .as_ref()
            .map(|ks| ks.iter().any(|k| member_prefixes.contains(k)))
            .unwrap_or(false);
        if !still_needed {
            assert!(
                store.manifest(a).await.is_err(),
                "unreferenced artifact {a:?} of old run {run} survived gc"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Records `runs` in `state`, publishing what their stages ran into `store`: every
/// artifact published, in order.
async fn record(
    state: &SqliteState,
    store: &ArtifactStore,
    scratch: &std::path::Path,
    runs: &[RunSpec],
) -> Vec<ArtifactRef> {
    // Every artifact published so far, with whether it is a collection.
    let mut published: Vec<ArtifactRef> = Vec::new();
    for (r, spec) in runs.iter().enumerate() {
        let id = format!("r{r}");
        let mut rec = run_record(&id);
        rec.created_at = if spec.old {
            format!("2020-01-01T00:00:{r:02}.000Z")
        } else {
            format!("2030-01-01T00:00:{r:02}.000Z")
        };
        state.create_run(&rec).unwrap();
        for (s, op) in spec.ops.iter().enumerate() {
            let stage = format!("s{s}");
            let key = AttemptKey::of_stage(id.clone(), stage.clone(), 1);
            let pick =
                |i: &usize| (!published.is_empty()).then(|| published[i % published.len()].clone());
            let (origin, inputs, output) = match op {
                Op::Ran { input } => {
                    let dir = scratch.join(format!("{id}-{stage}"));
                    std::fs::create_dir_all(dir.join("sub")).unwrap();
                    std::fs::write(dir.join("f"), format!("{id}/{stage}")).unwrap();
                    std::fs::write(dir.join("sub/g"), "g").unwrap();
                    let art = store.publish_dir(&key, "o", &dir).await.unwrap();
                    let input = input.as_ref().and_then(pick);
                    (
                        Origin::Ran,
                        input.map(|a| json!({"i": a})).unwrap_or(json!({})),
                        art,
                    )
                }
                Op::Reused { artifact } => match pick(artifact) {
                    Some(a) => {
                        let run = a.manifest.split('/').nth(1).unwrap().to_owned();
                        (Origin::Reused { run }, json!({}), a)
                    }
                    None => continue,
                },
                Op::Collect { items } => {
                    let items: Vec<(usize, ArtifactRef)> =
                        items.iter().filter_map(pick).enumerate().collect();
                    if items.is_empty() {
                        continue;
                    }
                    let art = store.publish_collection(&key, "o", &items).await.unwrap();
                    (Origin::Ran, json!({}), art)
                }
            };
            state
                .set_provenance(
                    &rec.id,
                    &stage,
                    &Provenance {
                        origin: origin.clone(),
                        cache_key: None,
                        provenance: json!({}),
                        inputs,
                    },
                )
                .unwrap();
            state
                .set_stage_results(&rec.id, &stage, &json!({"o": output}), &json!({}))
                .unwrap();
            state
                .set_stage(&rec.id, &stage, Phase::Succeeded, Some(0), None)
                .unwrap();
            if origin == Origin::Ran {
                published.push(output);
            }
        }
        if !spec.running {
            state.finish_run(&rec.id, Phase::Succeeded, None).unwrap();
        }
    }
    published
}

/// The cache entries `cache` asks for, each naming one published artifact, young or old.
fn put_cache_entries(state: &SqliteState, published: &[ArtifactRef], cache: &[(usize, bool)]) {
    for (i, (a, young)) in cache.iter().enumerate() {
        if published.is_empty() {
            break;
        }
        let art = &published[a % published.len()];
        state
            .put_cache_entry(&CacheEntry {
                key: format!("k{i}"),
                pipeline: "p".into(),
                stage: "s".into(),
                run_id: art.manifest.split('/').nth(1).unwrap().into(),
                outputs: json!({"o": art}),
                values: json!({}),
                components: json!({}),
                created_at: if *young {
                    "2030-01-01T00:00:00.000Z"
                } else {
                    "2020-01-01T00:00:00.000Z"
                }
                .into(),
            })
            .unwrap();
    }
}

/// What must survive, computed from the generated history rather than by gc.
fn referenced(state: &SqliteState, runs: &[RunSpec]) -> BTreeSet<ArtifactRef> {
    let mut referenced: BTreeSet<ArtifactRef> = BTreeSet::new();
    for (r, spec) in runs.iter().enumerate() {
        if spec.old && !spec.running {
            continue;
        }
        for s in state
            .stages(&drivetrain_engine::state::RunId(format!("r{r}")))
            .unwrap()
        {
            for v in [&s.outputs, &s.how.inputs] {
                if let Some(m) = v.as_object() {
                    for a in m.values() {
                        referenced.insert(serde_json::from_value(a.clone()).unwrap());
                    }
                }
            }
        }
    }
    for e in state.cache_entries().unwrap() {
        if e.created_at.as_str() >= CUTOFF {
            referenced.insert(serde_json::from_value(e.outputs["o"].clone()).unwrap());
        }
    }
    referenced
}

fn tempdir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "dt-gc-prop-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn gc_never_deletes_a_referenced_artifact((runs, cache) in history()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(check(runs, cache));
    }
}
