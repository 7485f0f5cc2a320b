//! The conformance checks of triggers' inbox and the notifications outbox.

use super::run_record;
use crate::state::{InboxObject, OutboxItem, Phase, RunId, StateStore};

fn object(url: &str, etag: &str, group: &str, at: &str) -> InboxObject {
    InboxObject {
        url: url.into(),
        etag: etag.into(),
        size: Some(3),
        modified: None,
        group: group.into(),
        discovered_at: at.into(),
        payload: None,
    }
}

/// Objects are recorded once by URL and ETag, claimed oldest first by exactly one run,
/// only as many as asked and never fewer than the least; paused triggers claim nothing.
pub(super) fn inbox(s: &dyn StateStore) {
    s.ensure_trigger("tp", "new", "old.yaml", false).unwrap();
    s.ensure_trigger("tp", "new", "tp.yaml", true).unwrap(); // known: keeps its state
    let mut objs = [
        object("file:///in/a", "e1", "", "2026-01-01T00:00:01.000Z"),
        object("file:///in/b", "e1", "", "2026-01-01T00:00:02.000Z"),
        object("file:///in/c", "e1", "", "2026-01-01T00:00:03.000Z"),
    ];
    objs[0].payload = Some(r#"{"recording": 7}"#.into());
    assert_eq!(
        s.add_objects("tp", "new", &objs, Some("c"), true).unwrap(),
        3
    );
    // Announced again (a rescan, a duplicate notification): nothing new; the cursor only
    // moves forward.
    assert_eq!(
        s.add_objects("tp", "new", &objs[..1], Some("a"), false)
            .unwrap(),
        0
    );
    // The same key with a new ETag is a new object.
    let again = [object("file:///in/a", "e2", "", "2026-01-01T00:00:04.000Z")];
    assert_eq!(s.add_objects("tp", "new", &again, None, false).unwrap(), 1);
    let t = &s.triggers().unwrap()[0];
    assert_eq!(
        (t.cursor.as_deref(), t.paused, t.waiting),
        (Some("c"), false, 4)
    );
    assert_eq!(t.file, "tp.yaml");
    assert_eq!(
        s.trigger_state("tp", "new").unwrap(),
        Some((false, Some("c".to_owned())))
    );
    assert_eq!(s.trigger_state("tp", "nope").unwrap(), None);
    assert_eq!(
        t.oldest_waiting.as_deref(),
        Some("2026-01-01T00:00:01.000Z")
    );
    assert!(t.rescanned_at.is_some());
    let w = s.waiting("tp", "new").unwrap();
    assert_eq!((w.len(), w[0].count), (1, 4));

    // Fewer than `min` waiting: no run.
    let r1 = run_record("inbox-r1");
    assert!(s
        .claim_batch("tp", "new", "", 5, 10, &|_| r1.clone())
        .unwrap()
        .is_empty());
    assert!(s.run(&r1.id).is_err(), "no run without its objects");
    let got = s
        .claim_batch("tp", "new", "", 2, 2, &|_| r1.clone())
        .unwrap();
    let urls: Vec<&str> = got.iter().map(|o| o.url.as_str()).collect();
    assert_eq!(
        urls,
        ["file:///in/a", "file:///in/b"],
        "oldest first, at most max"
    );
    assert_eq!(s.run(&r1.id).unwrap().phase, Phase::Running);
    let rt = s.run_trigger(&r1.id).unwrap().unwrap();
    assert_eq!((rt.trigger.as_str(), rt.objects.len()), ("new", 2));
    assert_eq!(
        rt.objects[0].payload.as_deref(),
        Some(r#"{"recording": 7}"#)
    );
    assert_eq!(
        s.object_runs("file:///in/a").unwrap(),
        [(r1.id.clone(), "new".to_owned())]
    );

    // Paused: discovered objects wait, none is claimed; resuming with skip drops them.
    s.set_trigger_paused("tp", "new", true, false).unwrap();
    let r2 = run_record("inbox-r2");
    assert!(s
        .claim_batch("tp", "new", "", 1, 10, &|_| r2.clone())
        .unwrap()
        .is_empty());
    assert_eq!(s.set_trigger_paused("tp", "new", false, true).unwrap(), 2);
    let t = &s.triggers().unwrap()[0];
    assert_eq!(
        (t.paused, t.waiting, t.consumed, t.skipped),
        (false, 0, 2, 2)
    );
    assert!(s.set_trigger_paused("tp", "nope", true, false).is_err());

    // Groups are claimed apart.
    let grouped = [
        object("file:///in/v1/x", "e", "v1", "2026-01-01T00:00:05.000Z"),
        object("file:///in/v2/x", "e", "v2", "2026-01-01T00:00:06.000Z"),
    ];
    s.add_objects("tp", "new", &grouped, None, false).unwrap();
    let got = s
        .claim_batch("tp", "new", "v2", 1, 10, &|_| r2.clone())
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].group, "v2");
    s.note_evaluation("tp", "new", "1 of min_items 2 waiting")
        .unwrap();
    let t = &s.triggers().unwrap()[0];
    assert_eq!(t.last_reason.as_deref(), Some("1 of min_items 2 waiting"));
}

/// Replicas claiming batches of one trigger at once, each through its own connection:
/// every object goes to exactly one run.
pub fn exclusive_batches(open: &(dyn Fn() -> Box<dyn StateStore> + Sync)) {
    const OBJECTS: usize = 60;
    let first = open();
    first
        .ensure_trigger("race", "t", "race.yaml", false)
        .unwrap();
    let objs: Vec<InboxObject> = (0..OBJECTS)
        .map(|i| {
            object(
                &format!("s3://b/{i:03}"),
                "e",
                "",
                &format!("2026-01-01T00:00:{i:02}.000Z"),
            )
        })
        .collect();
    first.add_objects("race", "t", &objs, None, false).unwrap();
    let runs: Vec<Vec<RunId>> = std::thread::scope(|sc| {
        let racers: Vec<_> = (0..4)
            .map(|k| {
                sc.spawn(move || {
                    let s = open();
                    let mut mine = Vec::new();
                    for n in 0.. {
                        let r = run_record(&format!("race-{k}-{n}"));
                        if s.claim_batch("race", "t", "", 1, 3, &|_| r.clone())
                            .unwrap()
                            .is_empty()
                        {
                            break;
                        }
                        mine.push(r.id);
                    }
                    mine
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let mut seen = std::collections::BTreeMap::new();
    for run in runs.iter().flatten() {
        for o in first.run_trigger(run).unwrap().unwrap().objects {
            assert!(
                seen.insert(o.url.clone(), run.clone()).is_none(),
                "{} twice",
                o.url
            );
        }
    }
    assert_eq!(seen.len(), OBJECTS, "every object consumed");
}

/// Notifications are enqueued with the note that the run was weighed, once per id;
/// deliveries are retried, then delivered or dead.
pub(super) fn outbox(s: &dyn StateStore) {
    let mut run = run_record("outbox-r1");
    run.created_at = "2000-01-01T00:00:00.000Z".into(); // first among the unnotified
    s.create_run(&run).unwrap();
    let unnotified = s.unnotified_runs(1000).unwrap();
    assert!(
        unnotified.iter().any(|r| r.id == run.id),
        "a new run is to be weighed"
    );
    let item = |event: &str| OutboxItem {
        id: format!("outbox-r1/{event}/notify[0]"),
        pipeline: "p".into(),
        run_id: "outbox-r1".into(),
        event: event.into(),
        sink: serde_json::json!({"name": "notify[0]"}),
        body: serde_json::json!({"id": format!("outbox-r1.{event}")}),
        state: "pending".into(),
        attempts: 0,
        next_at: "2000-01-01T00:00:00.000Z".into(),
        last_error: None,
        created_at: "2000-01-01T00:00:00.000Z".into(),
        delivered_at: None,
    };
    s.enqueue_notifications(&run.id, "Running", &[item("started")])
        .unwrap();
    assert!(
        !s.unnotified_runs(1000)
            .unwrap()
            .iter()
            .any(|r| r.id == run.id),
        "weighed while running"
    );
    s.finish_run(&run.id, Phase::Failed, Some("boom")).unwrap();
    assert!(
        s.unnotified_runs(1000)
            .unwrap()
            .iter()
            .any(|r| r.id == run.id),
        "its end is to be weighed"
    );
    // Enqueued twice (two replicas, a crash between): one row.
    s.enqueue_notifications(&run.id, "Failed", &[item("failed"), item("started")])
        .unwrap();
    s.enqueue_notifications(&run.id, "Failed", &[item("failed")])
        .unwrap();
    assert!(!s
        .unnotified_runs(1000)
        .unwrap()
        .iter()
        .any(|r| r.id == run.id));
    let due = s.due_notifications("2000-01-01T00:00:00.000Z", 10).unwrap();
    assert_eq!(due.len(), 2);
    s.notification_outcome(
        &due[0].id,
        Some("refused"),
        Some("2999-01-01T00:00:00.000Z"),
    )
    .unwrap();
    s.notification_outcome(&due[1].id, None, None).unwrap();
    assert!(
        s.due_notifications("2100-01-01T00:00:00.000Z", 10)
            .unwrap()
            .is_empty(),
        "retry later"
    );
    let again = s.due_notifications("3000-01-01T00:00:00.000Z", 10).unwrap();
    assert_eq!((again.len(), again[0].attempts), (1, 1));
    s.notification_outcome(&again[0].id, Some("refused again"), None)
        .unwrap();
    let dead = s.notifications(Some("dead"), 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_error.as_deref(), Some("refused again"));
    // Resumed and ended again, in another phase: to be weighed again.
    s.reopen_run(&run.id, 9).unwrap();
    assert!(!s
        .unnotified_runs(1000)
        .unwrap()
        .iter()
        .any(|r| r.id == run.id));
    s.finish_run(&run.id, Phase::Succeeded, None).unwrap();
    assert!(s
        .unnotified_runs(1000)
        .unwrap()
        .iter()
        .any(|r| r.id == run.id));
    s.enqueue_notifications(&run.id, "Succeeded", &[]).unwrap();
    assert!(!s
        .unnotified_runs(1000)
        .unwrap()
        .iter()
        .any(|r| r.id == run.id));
    let counts = s.notification_counts().unwrap();
    assert_eq!((counts["dead"], counts["delivered"]), (1, 1));
    assert_eq!(s.notifications(None, 10).unwrap().len(), 2);
    // Of no phase (a missed deadline), asked for again and again: one row.
    let mut late = item("deadline");
    late.id = "outbox-r1/deadline/notify[0]".into();
    for _ in 0..3 {
        s.add_notifications(std::slice::from_ref(&late)).unwrap();
    }
    assert_eq!(s.notifications(Some("pending"), 10).unwrap().len(), 1);
}
