//! The SQLite store's own tests (the conformance suite, opening, migrating, claiming).

use super::*;
use crate::state::conformance;

#[test]
fn sqlite_passes_the_conformance_suite() {
    conformance::check(&SqliteState::in_memory().unwrap());
}

/// A server and a command opening a new database at the same moment both succeed.
#[test]
fn concurrent_first_opens_migrate_once() {
    for round in 0..20 {
        let path =
            std::env::temp_dir().join(format!("dt-state-race-{}-{round}.db", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let openers: Vec<_> = (0..4)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || SqliteState::open(&p).map(|_| ()))
            })
            .collect();
        for o in openers {
            o.join().unwrap().unwrap();
        }
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}

#[test]
fn a_file_database_survives_reopening_and_migrates_once() {
    let dir = std::env::temp_dir().join(format!("dt-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let _ = std::fs::remove_file(&path);
    SqliteState::open(&path)
        .unwrap()
        .create_run(&conformance::run_record("r1"))
        .unwrap();
    let s = SqliteState::open(&path).unwrap();
    assert_eq!(s.list_runs(10).unwrap().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every table's columns (name, type affinity, NOT NULL, default, key) and every index
/// (name, table, columns) of the database behind `c`.
fn describe(c: &Connection) -> std::collections::BTreeSet<String> {
    // SQLite's rules for a declared type's affinity (`BIGINT` and `INTEGER` are one).
    let affinity = |t: &str| {
        let t = t.to_ascii_uppercase();
        match () {
            _ if t.contains("INT") => "INTEGER",
            _ if ["CHAR", "CLOB", "TEXT"].iter().any(|k| t.contains(k)) => "TEXT",
            _ if t.contains("BLOB") || t.is_empty() => "BLOB",
            _ if ["REAL", "FLOA", "DOUB"].iter().any(|k| t.contains(k)) => "REAL",
            _ => "NUMERIC",
        }
    };
    let names = |kind: &str| -> Vec<(String, String)> {
        let mut q = c
            .prepare("SELECT name, tbl_name FROM sqlite_master WHERE type = ?1 AND sql IS NOT NULL")
            .unwrap();
        q.query_map([kind], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let mut out = std::collections::BTreeSet::new();
    for (table, _) in names("table") {
        let mut q = c
            .prepare("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?1)")
            .unwrap();
        let rows = q
            .query_map([&table], |r| {
                Ok(format!(
                    "{table}.{}: {} notnull={} default={:?} pk={}",
                    r.get::<_, String>(0)?,
                    affinity(&r.get::<_, String>(1)?),
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, i64>(4)?
                ))
            })
            .unwrap();
        out.extend(rows.map(Result::unwrap));
    }
    for (index, table) in names("index") {
        let mut q = c
            .prepare("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
            .unwrap();
        let columns: Vec<String> = q
            .query_map([&index], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        out.insert(format!("index {index} on {table}({})", columns.join(", ")));
    }
    out
}

/// A database made before the shared schema, at any version of SQLite's own history,
/// opens to exactly the tables, columns and indexes of a new one.
#[test]
fn a_database_of_the_old_history_opens_to_the_shared_schema() {
    let new = SqliteState::in_memory().unwrap();
    let new = describe(&new.conn.lock().unwrap());
    assert!(
        new.iter().any(|l| l.starts_with("runs.heartbeat_at: TEXT")),
        "{new:#?}"
    );
    assert!(
        new.contains("index runs_by_trigger_time on runs(trigger, created_at, id)"),
        "{new:#?}"
    );
    let dir = std::env::temp_dir().join(format!("dt-state-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for version in [1, 5, HISTORY.len()] {
        let path = dir.join(format!("v{version}.db"));
        let _ = std::fs::remove_file(&path);
        let old = Connection::open(&path).unwrap();
        for (i, m) in HISTORY[..version].iter().enumerate() {
            old.execute_batch(&format!("{m};\nPRAGMA user_version = {};", i + 1))
                .unwrap();
        }
        drop(old);
        let opened = SqliteState::open(&path).unwrap();
        let got = describe(&opened.conn.lock().unwrap());
        let missing: Vec<_> = new.difference(&got).collect();
        let extra: Vec<_> = got.difference(&new).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "from version {version}: missing {missing:#?}, extra {extra:#?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sqlite_connections_claim_ticks_exclusively() {
    let dir = std::env::temp_dir().join(format!("dt-state-claims-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let _ = std::fs::remove_file(&path);
    conformance::exclusive_claims(&|| Box::new(SqliteState::open(&path).unwrap()));
    conformance::exclusive_gpus(&|| Box::new(SqliteState::open(&path).unwrap()));
    conformance::exclusive_batches(&|| Box::new(SqliteState::open(&path).unwrap()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_ids_sort_by_time() {
    let a = RunId::generate(chrono::DateTime::from_timestamp(1_700_000_000, 5).unwrap());
    let b = RunId::generate(chrono::DateTime::from_timestamp(1_700_000_001, 5).unwrap());
    assert!(a < b);
    assert_eq!(a.0.len(), "20231114-221320-00000000".len());
}

#[test]
fn run_ids_of_one_second_never_collide() {
    // 411 in one second collided four times in four with 16 random bits.
    let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let ids: std::collections::HashSet<RunId> =
        (0..200_000).map(|_| RunId::generate(now)).collect();
    assert_eq!(ids.len(), 200_000);
}

/// Random claims (of random priorities, preemptible or not, waits kept or given up),
/// releases, kills and ends of runs over a ledger of 3 devices: a device is never granted
/// while a live run holds it; a claim is granted exactly when the devices free of live
/// holders cover it and every live waiter ahead of it; and only preemptible claims of
/// lower priority than their preempter are ever marked.
#[test]
fn the_gpu_ledger_never_double_assigns_under_random_kills() {
    use proptest::prelude::*;
    let op = prop_oneof![
        4 => (0..4usize, 1..=3usize, 0..3i64, any::<bool>(), any::<bool>())
            .prop_map(|(r, n, p, pre, keep)| Op::Claim(r, n, p, pre, keep)),
        2 => (0..4usize).prop_map(Op::Release),
        1 => (0..4usize).prop_map(Op::Kill),
        1 => (0..4usize).prop_map(Op::End),
    ];
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 24,
        failure_persistence: None,
        ..Default::default()
    });
    runner
        .run(&proptest::collection::vec(op, 1..40), |ops| {
            let mut m = LedgerModel::new();
            for (step, op) in ops.iter().enumerate() {
                match *op {
                    Op::Claim(r, n, p, pre, keep) if m.live[r] => {
                        m.claim(step, r, n, p, pre, keep)?
                    }
                    Op::Release(r) if m.live[r] => {
                        m.s.release_gpus(&m.runs[r], None).unwrap();
                        for h in m.holds.iter_mut().filter(|h| **h == Some(r)) {
                            *h = None;
                        }
                    }
                    Op::Kill(r) => m.live[r] = false,
                    Op::End(r) if m.live[r] => {
                        m.s.finish_run(&m.runs[r], Phase::Failed, None).unwrap();
                        m.live[r] = false;
                    }
                    _ => {}
                }
            }
            Ok(())
        })
        .unwrap();
}

/// What the ledger property test does: claim (run, devices, priority, preemptible, keep
/// waiting if refused), release, kill an engine, end a run.
#[derive(Debug, Clone)]
enum Op {
    Claim(usize, usize, i64, bool, bool),
    Release(usize),
    Kill(usize),
    End(usize),
}

/// A ledger of 3 devices and 4 runs, and what the test knows of it: which live run holds
/// which device, which runs are live, each preempter's priority.
struct LedgerModel {
    s: SqliteState,
    devices: Vec<String>,
    runs: Vec<RunId>,
    live: [bool; 4],
    holds: Vec<Option<usize>>,
    priority: std::collections::HashMap<String, i64>,
}

impl LedgerModel {
    fn new() -> LedgerModel {
        let s = SqliteState::in_memory().unwrap();
        let runs: Vec<RunId> = (0..4).map(|i| RunId(format!("r{i}"))).collect();
        for r in &runs {
            s.create_run(&conformance::run_record(&r.0)).unwrap();
            s.heartbeat(r).unwrap();
        }
        LedgerModel {
            s,
            devices: (0..3).map(|i| i.to_string()).collect(),
            runs,
            live: [true; 4],
            holds: vec![None; 3],
            priority: Default::default(),
        }
    }

    /// Run `r` claims `n` devices at priority `p`; what the ledger answers checked
    /// against the model.
    fn claim(
        &mut self,
        step: usize,
        r: usize,
        n: usize,
        p: i64,
        preemptible: bool,
        keep: bool,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        use crate::state::{Claimed, GpuAsk};
        use proptest::{prop_assert, prop_assert_eq};
        let s = &self.s;
        // The live engines beat after `stale`; the dead ones did before it.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let stale = now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        for (i, run) in self.runs.iter().enumerate() {
            if self.live[i] {
                s.heartbeat(run).unwrap();
            }
        }
        let holder = format!("s#{step}");
        self.priority
            .insert(format!("{holder} of run r{r} (priority {p})"), p);
        let ask = GpuAsk {
            host: "h",
            devices: &self.devices,
            count: n,
            cpu_millis: 0,
            memory_bytes: 0,
            capacity: crate::state::Capacity {
                cpu_millis: 1000,
                memory_bytes: 1 << 30,
            },
            run: &self.runs[r],
            holder: &holder,
            queue: "default",
            project: "default",
            priority: p,
            preemptible,
            stale_before: &stale,
            waits_stale_before: "2000-01-01T00:00:00.000Z",
        };
        let live = self.live;
        let free = self
            .holds
            .iter()
            .filter(|h| h.is_none_or(|o| !live[o]))
            .count();
        // Every live waiter of at least this priority came earlier.
        let ahead: usize = s
            .gpu_waits()
            .unwrap()
            .iter()
            .filter(|w| live[w.run.0[1..].parse::<usize>().unwrap()])
            .filter(|w| w.priority >= p)
            .map(|w| w.count)
            .sum();
        match s.claim_gpus(&ask).unwrap() {
            Claimed::Granted(got) => {
                prop_assert!(
                    free >= n + ahead,
                    "granted {n} with {free} free and {ahead} ahead"
                );
                for d in &got {
                    let i: usize = d.parse().unwrap();
                    if let Some(o) = self.holds[i] {
                        prop_assert!(
                            !live[o],
                            "device {d} granted to r{r} while live r{o} holds it"
                        );
                    }
                    self.holds[i] = Some(r);
                }
            }
            Claimed::Busy(_) => {
                prop_assert!(
                    free < n + ahead,
                    "refused {n} with {free} free and {ahead} ahead"
                );
                if !keep {
                    s.give_up_gpus(&self.runs[r], &holder).unwrap();
                }
            }
        }
        // What the ledger says is what the model says of live runs, and only what may be
        // preempted is marked.
        for c in s.gpu_claims().unwrap() {
            let i: usize = c.device.parse().unwrap();
            let o: usize = c.run.0[1..].parse().unwrap();
            prop_assert_eq!(self.holds[i], Some(o));
            if let Some(by) = &c.preempted_by {
                prop_assert!(c.preemptible, "{c:?}");
                prop_assert!(c.priority < self.priority[by], "{c:?}");
            }
        }
        Ok(())
    }
}
