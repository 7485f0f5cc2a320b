use super::*;
use crate::search::{Dim, Method};

/// The shared plan, over one dimension `x` with its optimum inside.
fn plan(variant: Variant) -> SearchPlan {
    let mut p = crate::search::tests::plan(Method::Asha);
    p.variant = variant;
    p.seed = 3;
    p.space = vec![(
        "x".into(),
        Dim::Uniform {
            lo: 0.0,
            hi: 1.0,
            count: None,
        },
    )];
    p
}

/// A loss with its optimum at x = 0.3, lower with more budget.
fn loss(t: &Trial, budget: u64) -> f64 {
    let x = t.params["x"].as_f64().unwrap();
    (x - 0.3).powi(2) + 1.0 / budget as f64
}

/// Runs the search to its end, `width` trials at once (ending in the order started);
/// returns the budget used (each trial's budget counted once).
fn drive(search: &mut Search<'_>, width: usize) -> u64 {
    let mut running: VecDeque<usize> = VecDeque::new();
    let mut used = 0;
    loop {
        while running.len() < width {
            let Some(i) = search.decide() else { break };
            search.started(i);
            running.push_back(i);
        }
        let Some(i) = running.pop_front() else { break };
        let t = search.trial(i).clone();
        let budget = search.budget(t.rung);
        used += budget - t.used;
        search.ended(i, Outcome::Reported(loss(&t, budget)));
    }
    search.finish();
    used
}

#[test]
fn promote_runs_every_trial_at_the_first_rung_and_only_the_best_on() {
    let p = plan(Variant::Promote);
    let mut s = Search::new(&p, Vec::new());
    let used = drive(&mut s, 1);
    let trials = s.trials();
    assert_eq!(trials.len(), 27);
    let at = |k: usize| trials.iter().filter(|t| t.metric_at(k).is_some()).count();
    assert_eq!(at(0), 27);
    // Asynchronous: a rung promotes as soon as a third of what it has seen allows.
    assert!((9..=12).contains(&at(1)), "{} at rung 1", at(1));
    assert!((3..=5).contains(&at(2)), "{} at rung 2", at(2));
    assert!(at(3) >= 1);
    assert!(used < 27 * 27 / 4, "{used} epochs");
    let best = s.best().unwrap();
    assert_eq!(best.state, TrialState::Succeeded);
    let xs: Vec<f64> = trials
        .iter()
        .map(|t| t.params["x"].as_f64().unwrap())
        .collect();
    let closest = xs.iter().map(|x| (x - 0.3).abs()).fold(f64::MAX, f64::min);
    let got = (best.params["x"].as_f64().unwrap() - 0.3).abs();
    assert!(
        got <= closest + 0.1,
        "best x is {got} from the optimum, closest {closest}"
    );
    for t in trials {
        assert!(
            matches!(t.state, TrialState::Succeeded | TrialState::Pruned),
            "{t:?}"
        );
    }
}

#[test]
fn stop_decides_at_the_rung_and_never_pauses() {
    let p = plan(Variant::Stop);
    let mut s = Search::new(&p, Vec::new());
    let used = drive(&mut s, 4);
    assert!(used < 27 * 27 / 2, "{used} epochs");
    let trials = s.trials();
    assert_eq!(trials.len(), 27);
    // The first trial at each rung has nothing to lose against: it goes on.
    assert_eq!(trials[0].state, TrialState::Succeeded);
    let pruned: Vec<&Trial> = trials
        .iter()
        .filter(|t| t.state == TrialState::Pruned)
        .collect();
    assert!(pruned.len() > 10, "{} pruned", pruned.len());
    assert!(pruned[0]
        .reason
        .as_ref()
        .unwrap()
        .contains("below the rung's cut"));
    assert!(trials.iter().all(|t| t.state != TrialState::Paused));
}

#[test]
fn a_failed_trial_counts_as_the_worst_and_is_never_promoted() {
    let mut p = plan(Variant::Promote);
    p.trials = 3;
    let mut s = Search::new(&p, Vec::new());
    for i in 0..3 {
        assert_eq!(s.decide(), Some(i));
        s.started(i);
    }
    s.ended(0, Outcome::Failed("exit 1".into()));
    s.ended(1, Outcome::Reported(0.5));
    // Two ended at rung 0: a third of them is none.
    assert_eq!(s.decide(), None);
    s.ended(2, Outcome::Reported(0.9));
    // A third of three may go on: trial 1, not the failed trial 0.
    assert_eq!(s.decide(), Some(1));
    assert_eq!(s.trial(1).state, TrialState::Promoted);
    assert_eq!(s.trial(1).rung, 1);
    assert_eq!(s.failures(), 1);
    assert_eq!(s.ended_at(0), vec![1, 2, 0]);
}

#[test]
fn a_resumed_search_runs_again_what_was_decided_then_decides_as_before() {
    let p = plan(Variant::Promote);
    let mut first = Search::new(&p, Vec::new());
    let mut decided = Vec::new();
    for _ in 0..5 {
        let i = first.decide().unwrap();
        first.started(i);
        decided.push(i);
    }
    for &i in &decided[..4] {
        let t = first.trial(i).clone();
        first.ended(i, Outcome::Reported(loss(&t, 1)));
    }
    // The engine died here: trial 4 was running. The store holds every trial.
    let mut again = Search::new(&p, first.trials().to_vec());
    assert_eq!(again.decide(), Some(4));
    assert_eq!(again.trial(4).rung, 0);
    assert_eq!(again.trial(4).attempts, 1);
    // What comes next is what the first search would have decided.
    let t = first.trial(4).clone();
    first.ended(4, Outcome::Reported(loss(&t, 1)));
    again.started(4);
    again.ended(4, Outcome::Reported(loss(&t, 1)));
    for _ in 0..6 {
        let (a, b) = (first.decide(), again.decide());
        assert_eq!(a, b);
        assert_eq!(first.trial(a.unwrap()), again.trial(b.unwrap()));
    }
}

#[test]
fn states_read_back_as_written() {
    for s in [
        TrialState::Pending,
        TrialState::Running,
        TrialState::Paused,
        TrialState::Promoted,
        TrialState::Pruned,
        TrialState::Failed,
        TrialState::Stale,
        TrialState::Succeeded,
    ] {
        assert_eq!(TrialState::parse(s.as_str()), Some(s));
    }
    assert_eq!(TrialState::parse("zombie"), None);
}
