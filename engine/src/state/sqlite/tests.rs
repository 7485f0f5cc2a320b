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

#[test]
fn sqlite_connections_claim_ticks_exclusively() {
    let dir = std::env::temp_dir().join(format!("dt-state-claims-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let _ = std::fs::remove_file(&path);
    conformance::exclusive_claims(&|| Box::new(SqliteState::open(&path).unwrap()));
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
