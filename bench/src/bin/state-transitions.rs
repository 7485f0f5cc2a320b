//! The state store benchmark: N stages of one run each go Pending → Running → Succeeded
//! the way the run loop records them (`start_attempt`, `finish_attempt`, `set_stage`),
//! one after another from one thread, as the engine does; prints transitions per second
//! (two per stage) and statements per second (three per stage) as JSON.
//!
//! usage: state-transitions sqlite PATH N | state-transitions postgres URL N

use std::process::ExitCode;
use std::time::Instant;

use drivetrain_engine::state::{Phase, RunId, RunRecord, SqliteState, StateStore};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, kind, target, n] = args.as_slice() else {
        eprintln!("usage: state-transitions sqlite|postgres PATH|URL N");
        return ExitCode::from(2);
    };
    let n: u32 = n.parse().expect("N is a number");
    let store: Box<dyn StateStore> = match kind.as_str() {
        "sqlite" => Box::new(SqliteState::open(std::path::Path::new(target)).expect("sqlite")),
        "postgres" => {
            Box::new(drivetrain_engine::state::PostgresState::open(target).expect("postgres"))
        }
        other => {
            eprintln!("unknown store {other}");
            return ExitCode::from(2);
        }
    };
    let run = RunId(format!("bench-{}-{}", std::process::id(), n));
    store
        .create_run(&RunRecord {
            id: run.clone(),
            pipeline: "bench".into(),
            file: "bench.yaml".into(),
            spec_digest: "sha256:0".into(),
            params: serde_json::json!({}),
            trigger: "cli".into(),
            parent: None,
            phase: Phase::Running,
            created_at: drivetrain_engine::state::now(),
            finished_at: None,
            reason: None,
            engine_pid: Some(i64::from(std::process::id())),
            overrides: serde_json::json!({}),
            selection: None,
            scheduled_time: None,
            executor: Some("local".into()),
            project: "default".into(),
        })
        .expect("create run");
    let t = Instant::now();
    for i in 0..n {
        let stage = format!("s{i}");
        store.start_attempt(&run, &stage, 1).expect("start");
        store
            .finish_attempt(&run, &stage, 1, Phase::Succeeded, Some(0), None)
            .expect("finish");
        store
            .set_stage(&run, &stage, Phase::Succeeded, Some(0), None)
            .expect("stage");
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "stages": n,
            "seconds": secs,
            "transitions_per_s": 2.0 * f64::from(n) / secs,
            "statements_per_s": 3.0 * f64::from(n) / secs,
        })
    );
    ExitCode::SUCCESS
}
