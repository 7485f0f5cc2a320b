//! Trials and their metrics: written whole, read back as written, metrics in order.

use super::run_record;
use crate::search::rungs::{Trial, TrialState};
use crate::state::{MetricRow, RunId, StateStore};

pub(super) fn trials_and_metrics(s: &dyn StateStore) {
    let id = RunId("conf-trials".into());
    s.create_run(&run_record("conf-trials")).unwrap();
    let mut t = Trial {
        index: 2,
        id: "t002".into(),
        params: serde_json::json!({"lr": 0.01, "depth": 4})
            .as_object()
            .unwrap()
            .clone(),
        state: TrialState::Running,
        rung: 0,
        metrics: Vec::new(),
        used: 0,
        attempts: 1,
        reason: None,
    };
    let none = serde_json::json!({});
    s.put_trial(&id, "train", &t, (&none, &none)).unwrap();
    let first = s.trials(&id, "train").unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].trial, t);
    assert!(first[0].started_at.is_some());
    // A rung ended: written whole again, started_at kept.
    t.state = TrialState::Pruned;
    t.metrics = vec![0.25, 0.125];
    t.rung = 1;
    t.used = 3;
    t.attempts = 3;
    t.reason = Some("below the cut".into());
    let outputs = serde_json::json!({"model": {"digest": "sha256:ab"}});
    let values = serde_json::json!({"series": {"loss": [0.5, 0.25]}});
    s.put_trial(&id, "train", &t, (&outputs, &values)).unwrap();
    let zero = Trial {
        index: 0,
        id: "t000".into(),
        ..t.clone()
    };
    s.put_trial(&id, "train", &zero, (&none, &none)).unwrap();
    s.put_trial(&id, "other", &zero, (&none, &none)).unwrap();
    let read = s.trials(&id, "train").unwrap();
    assert_eq!(read.len(), 2, "{read:?}");
    assert_eq!(read[0].trial.index, 0, "by index");
    assert_eq!(read[1].trial, t);
    assert_eq!((&read[1].outputs, &read[1].values), (&outputs, &values));
    assert_eq!(read[0].values, none);
    assert_eq!(read[1].started_at, first[0].started_at);
    assert_eq!(read[1].handle, None);
    s.set_trial_handle(&id, "train", 2, "pgid:77").unwrap();
    assert_eq!(
        s.trials(&id, "train").unwrap()[1].handle.as_deref(),
        Some("pgid:77")
    );
    let row = |trial, step, name: &str, value| MetricRow {
        trial,
        step,
        name: name.into(),
        value,
        at: "2026-11-28T00:00:00Z".into(),
    };
    let rows = vec![
        row(2, Some(1), "val_loss", 0.5),
        row(0, None, "val_loss", f64::MAX),
        row(2, Some(2), "acc", -1.5e-9),
    ];
    s.add_metrics(&id, "train", &rows[..2]).unwrap();
    s.add_metrics(&id, "train", &rows[2..]).unwrap();
    s.add_metrics(&id, "train", &[]).unwrap();
    s.add_metrics(&id, "other", &rows[..1]).unwrap();
    assert_eq!(s.metrics(&id, "train").unwrap(), rows);
    assert_eq!(s.metrics(&id, "missing").unwrap(), Vec::new());
}
