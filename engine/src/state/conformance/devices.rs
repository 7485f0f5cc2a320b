//! The GPU ledger: all or none, one holder per device, dead engines' claims freed.

use super::super::{Claimed, GpuAsk, Phase, RunId, StateStore};
use super::run_record;

const PAST: &str = "2000-01-01T00:00:00.000Z";
const FUTURE: &str = "2999-01-01T00:00:00.000Z";

fn devices(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

fn ask<'a>(
    run: &'a RunId,
    holder: &'a str,
    count: usize,
    all: &'a [String],
    stale_before: &'a str,
) -> GpuAsk<'a> {
    GpuAsk {
        host: "h1",
        devices: all,
        count,
        cpu_millis: 0,
        memory_bytes: 0,
        capacity: crate::state::Capacity {
            cpu_millis: 4000,
            memory_bytes: 8 << 30,
        },
        run,
        holder,
        queue: "default",
        project: "default",
        priority: 0,
        preemptible: false,
        stale_before,
        waits_stale_before: PAST,
    }
}

fn granted(c: Claimed) -> Vec<String> {
    match c {
        Claimed::Granted(d) => d,
        Claimed::Busy(b) => panic!("busy: {b:?}"),
    }
}

/// Claims, refusals with who holds what, releases, and the claims of runs that ended or
/// whose engine stopped beating freed by the next claim.
pub(super) fn ledger(s: &dyn StateStore) {
    let all = devices(2);
    let (a, b) = (RunId("gpu-a".into()), RunId("gpu-b".into()));
    for r in [&a, &b] {
        s.create_run(&run_record(&r.0)).unwrap();
        s.heartbeat(r).unwrap();
    }
    assert_eq!(
        granted(s.claim_gpus(&ask(&a, "train#1", 2, &all, PAST)).unwrap()),
        all
    );
    match s.claim_gpus(&ask(&b, "eval#1", 1, &all, PAST)).unwrap() {
        Claimed::Busy(at) => {
            assert_eq!(at.held.len(), 2);
            assert!(
                at.held.iter().all(|c| c.run == a && c.holder == "train#1"),
                "{at:?}"
            );
            assert_eq!((at.position, at.waiting), (1, 1));
        }
        other => panic!("{other:?}"),
    }
    // Another machine's devices are its own.
    let mut elsewhere = ask(&b, "eval#1", 1, &all, PAST);
    elsewhere.host = "h2";
    assert_eq!(granted(s.claim_gpus(&elsewhere).unwrap()), ["0"]);
    assert!(
        s.gpu_waits().unwrap().is_empty(),
        "granted: no longer waiting"
    );
    s.release_gpus(&b, Some("eval#1")).unwrap();
    s.release_gpus(&a, Some("train#1")).unwrap();
    assert!(s.gpu_claims().unwrap().is_empty());
    assert_eq!(
        granted(s.claim_gpus(&ask(&b, "eval#2", 1, &all, PAST)).unwrap()),
        ["0"]
    );
    assert_eq!(
        granted(s.claim_gpus(&ask(&a, "train#2", 1, &all, PAST)).unwrap()),
        ["1"]
    );
    // b's engine stops beating: a's next claim, judging heartbeats older than FUTURE
    // dead, frees b's device; a's own claims stay.
    assert!(matches!(
        s.claim_gpus(&ask(&a, "train#3", 1, &all, PAST)).unwrap(),
        Claimed::Busy(_)
    ));
    assert_eq!(
        granted(s.claim_gpus(&ask(&a, "train#3", 1, &all, FUTURE)).unwrap()),
        ["0"]
    );
    let held = s.gpu_claims().unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.iter().all(|c| c.run == a));
    // A run that ended holds nothing; a run's claims go all at once.
    s.release_gpus(&a, None).unwrap();
    assert!(s.gpu_claims().unwrap().is_empty());
    let c = RunId("gpu-c".into());
    s.create_run(&run_record(&c.0)).unwrap();
    s.heartbeat(&c).unwrap();
    assert_eq!(
        granted(s.claim_gpus(&ask(&c, "x#1", 2, &all, PAST)).unwrap()),
        all
    );
    s.finish_run(&c, Phase::Failed, Some("killed")).unwrap();
    assert_eq!(
        granted(s.claim_gpus(&ask(&a, "y#1", 2, &all, PAST)).unwrap()),
        all
    );
    s.release_gpus(&a, None).unwrap();
}

/// Engines racing for 2 devices, each through its own connection (`open`), each claiming
/// all or part of them again and again: no device is ever held by two at once.
pub fn exclusive_gpus(open: &(dyn Fn() -> Box<dyn StateStore> + Sync)) {
    let all = devices(2);
    let held = std::sync::Mutex::new(std::collections::BTreeSet::<String>::new());
    let setup = open();
    for i in 0..4 {
        let r = run_record(&format!("gpu-race-{i}"));
        setup.create_run(&r).unwrap();
        setup.heartbeat(&r.id).unwrap();
    }
    let grants = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for i in 0..4 {
            let (all, held, grants) = (&all, &held, &grants);
            sc.spawn(move || {
                let s = open();
                let run = RunId(format!("gpu-race-{i}"));
                for round in 0..30 {
                    let holder = format!("s#{round}");
                    let want = 1 + (i + round) % 2;
                    match s.claim_gpus(&ask(&run, &holder, want, all, PAST)).unwrap() {
                        Claimed::Granted(got) => {
                            assert_eq!(got.len(), want);
                            {
                                let mut h = held.lock().unwrap();
                                for d in &got {
                                    assert!(h.insert(d.clone()), "device {d} held twice");
                                }
                            }
                            grants.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            let mut h = held.lock().unwrap();
                            for d in &got {
                                h.remove(d);
                            }
                            drop(h);
                            s.release_gpus(&run, Some(&holder)).unwrap();
                        }
                        Claimed::Busy(_) => {
                            // This racer gives up its wait (a cancel); it asks anew.
                            s.give_up_gpus(&run, &holder).unwrap();
                            std::thread::yield_now()
                        }
                    }
                }
            });
        }
    });
    assert!(grants.into_inner() > 10, "the racers got devices");
    assert!(setup.gpu_claims().unwrap().is_empty());
}

/// Waiters are admitted by priority, then waiting time, whichever engine asks first; a
/// waiter that cannot be admitted marks preemptible claims of lower priority, which its
/// holder's engine reads; a given-up wait keeps nothing.
pub(super) fn priorities(s: &dyn StateStore) {
    let all = devices(2);
    let (low, mid, high) = (
        RunId("prio-low".into()),
        RunId("prio-mid".into()),
        RunId("prio-high".into()),
    );
    for r in [&low, &mid, &high] {
        s.create_run(&run_record(&r.0)).unwrap();
        s.heartbeat(r).unwrap();
    }
    let mut lo = ask(&low, "train#1", 2, &all, PAST);
    lo.priority = 1;
    lo.preemptible = true;
    assert_eq!(granted(s.claim_gpus(&lo).unwrap()), all);
    // mid (priority 5) waits, and marks low's claim (preemptible, of lower priority).
    let mut m = ask(&mid, "eval#1", 1, &all, PAST);
    m.priority = 5;
    match s.claim_gpus(&m).unwrap() {
        Claimed::Busy(at) => {
            assert_eq!((at.position, at.waiting), (1, 1));
            assert_eq!(at.preempting.len(), 2, "{at:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.gpu_preempted(&low, "train#1").unwrap().as_deref(),
        Some("eval#1 of run prio-mid (priority 5)")
    );
    assert_eq!(s.gpu_preempted(&mid, "eval#1").unwrap(), None);
    // high (priority 9) waits ahead of mid, though it came later.
    let mut h = ask(&high, "serve#1", 2, &all, PAST);
    h.priority = 9;
    match s.claim_gpus(&h).unwrap() {
        Claimed::Busy(at) => assert_eq!((at.position, at.waiting), (1, 2)),
        other => panic!("{other:?}"),
    }
    let order: Vec<String> = s
        .gpu_waits()
        .unwrap()
        .into_iter()
        .map(|w| w.holder)
        .collect();
    assert_eq!(order, ["serve#1", "eval#1"]);
    // low gives its devices back: mid asks first, but high is ahead and needs both.
    s.release_gpus(&low, Some("train#1")).unwrap();
    match s.claim_gpus(&m).unwrap() {
        Claimed::Busy(at) => assert_eq!((at.position, at.waiting), (2, 2)),
        other => panic!("{other:?}"),
    }
    assert_eq!(granted(s.claim_gpus(&h).unwrap()), all);
    // A non-preemptible holder is never marked, whatever the asker's priority.
    let mut top = ask(&low, "urgent#1", 1, &all, PAST);
    top.priority = 1000;
    match s.claim_gpus(&top).unwrap() {
        Claimed::Busy(at) => assert!(at.preempting.is_empty(), "{at:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.gpu_preempted(&high, "serve#1").unwrap(), None);
    // Classes name priorities; a class set again takes its new value; one dropped is gone.
    s.set_priority_class("high", Some(100)).unwrap();
    s.set_priority_class("low", Some(-5)).unwrap();
    s.set_priority_class("high", Some(90)).unwrap();
    assert_eq!(
        s.priority_classes().unwrap(),
        [("high".to_owned(), 90), ("low".to_owned(), -5)]
    );
    s.set_priority_class("low", None).unwrap();
    assert_eq!(s.priority_classes().unwrap(), [("high".to_owned(), 90)]);
    // Giving up a wait leaves nothing in the queue.
    s.give_up_gpus(&low, "urgent#1").unwrap();
    s.release_gpus(&mid, None).unwrap();
    s.release_gpus(&high, None).unwrap();
    // A preempter that gives up its wait unmarks what it marked: nobody is stopped for it.
    let mut again = ask(&low, "train#2", 1, &all, PAST);
    again.priority = 1;
    again.preemptible = true;
    assert_eq!(granted(s.claim_gpus(&again).unwrap()), ["0"]);
    let mut both = ask(&mid, "eval#2", 2, &all, PAST);
    both.priority = 5;
    assert!(matches!(s.claim_gpus(&both).unwrap(), Claimed::Busy(_)));
    assert!(s.gpu_preempted(&low, "train#2").unwrap().is_some());
    s.give_up_gpus(&mid, "eval#2").unwrap();
    assert_eq!(s.gpu_preempted(&low, "train#2").unwrap(), None);
    // A run's end unmarks what any of its waiters marked.
    assert!(matches!(s.claim_gpus(&both).unwrap(), Claimed::Busy(_)));
    assert!(s.gpu_preempted(&low, "train#2").unwrap().is_some());
    s.release_gpus(&mid, None).unwrap();
    assert_eq!(s.gpu_preempted(&low, "train#2").unwrap(), None);
    s.release_gpus(&low, None).unwrap();
    assert!(s.gpu_waits().unwrap().is_empty());
    assert!(s.gpu_claims().unwrap().is_empty());
}

/// Waiters of one priority from projects that contend: the project that holds the fewest
/// GPUs for its weight goes first, whoever came first; without weights, the one holding
/// fewer. (Projects of their own: the store is shared with the other checks.)
pub(super) fn fair_share(s: &dyn StateStore) {
    let all = devices(3);
    let (p, m) = (RunId("share-p".into()), RunId("share-m".into()));
    for r in [&p, &m] {
        s.create_run(&run_record(&r.0)).unwrap();
        s.heartbeat(r).unwrap();
    }
    let claim = |run: &RunId, holder: &str, project: &str| {
        let mut a = ask(run, holder, 1, &all, PAST);
        a.project = project;
        s.claim_gpus(&a).unwrap()
    };
    for maps_weight in [Some(4), None] {
        let quota = crate::state::Quota {
            weight: maps_weight,
            ..Default::default()
        };
        s.set_quota("maps", quota, "user:a").unwrap();
        // vision holds 1 device, maps 2: none is free.
        granted(claim(&p, "p#1", "vision"));
        granted(claim(&m, "m#1", "maps"));
        granted(claim(&m, "m#2", "maps"));
        // vision's waiter comes first, maps's second.
        assert!(matches!(claim(&p, "p#2", "vision"), Claimed::Busy(_)));
        // (Later by the clock: with no weight, the shares tie once maps gives one back.)
        std::thread::sleep(std::time::Duration::from_millis(3));
        let Claimed::Busy(at) = claim(&m, "m#3", "maps") else {
            panic!("granted with no device free")
        };
        // Weight 4: maps holds 2/4 against vision's 1/1 and goes first. No
        // weight: 2/1 against 1/1, it waits behind.
        let place = if maps_weight.is_some() { 1 } else { 2 };
        assert_eq!(at.position, place, "weight {maps_weight:?}: {at:?}");
        // One device comes free: the one first in line gets it, the other still waits.
        s.release_gpus(&m, Some("m#1")).unwrap();
        let (first, second) = match maps_weight {
            Some(_) => ((&m, "m#3", "maps"), (&p, "p#2", "vision")),
            None => ((&p, "p#2", "vision"), (&m, "m#3", "maps")),
        };
        let got = claim(second.0, second.1, second.2);
        assert!(
            matches!(got, Claimed::Busy(_)),
            "weight {maps_weight:?}: {got:?}"
        );
        granted(claim(first.0, first.1, first.2));
        s.release_gpus(&p, None).unwrap();
        s.release_gpus(&m, None).unwrap();
    }
}

/// CPU and memory are held in the ledger too, against the machine's: an ask that does
/// not fit what is held and what waiters ahead ask waits (and says who holds them); an
/// ask of another resource is not held up by it; what is given back is free again.
pub(super) fn capacity(s: &dyn StateStore) {
    let none: Vec<String> = Vec::new();
    let run = RunId("capacity".into());
    s.create_run(&run_record(&run.0)).unwrap();
    s.heartbeat(&run).unwrap();
    let claim = |holder: &str, cpu_millis: u64, memory_bytes: u64| {
        let mut a = ask(&run, holder, 0, &none, PAST);
        a.cpu_millis = cpu_millis;
        a.memory_bytes = memory_bytes;
        s.claim_gpus(&a).unwrap()
    };
    // The machine: 4 CPUs, 8 GiB.
    assert_eq!(granted(claim("a#1", 3000, 0)), Vec::<String>::new());
    match claim("b#1", 2000, 0) {
        Claimed::Busy(at) => {
            assert_eq!(at.capacity.len(), 1, "{at:?}");
            assert_eq!(
                (at.capacity[0].holder.as_str(), at.capacity[0].cpu_millis),
                ("a#1", 3000)
            );
        }
        other => panic!("{other:?}"),
    }
    // Memory only: b's wait for CPU does not hold it up.
    granted(claim("c#1", 0, 1 << 30));
    // One CPU would fit beside a, but b is ahead and asks two.
    assert!(matches!(claim("d#1", 1000, 0), Claimed::Busy(_)));
    s.release_gpus(&run, Some("a#1")).unwrap();
    granted(claim("b#1", 2000, 0));
    granted(claim("d#1", 1000, 0));
    let held: Vec<(String, u64, u64)> = s
        .capacity_claims()
        .unwrap()
        .into_iter()
        .map(|c| (c.holder, c.cpu_millis, c.memory_bytes))
        .collect();
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(held.contains(&("c#1".to_owned(), 0, 1 << 30)), "{held:?}");
    s.release_gpus(&run, None).unwrap();
    assert!(s.capacity_claims().unwrap().is_empty());
    assert!(s.gpu_waits().unwrap().is_empty());
}
