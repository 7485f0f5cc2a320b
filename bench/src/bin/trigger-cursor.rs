//! The cost of a trigger's listing cursor over a prefix with many objects (see
//! `bench/triggers.py`, which makes the objects): one whole listing (a rescan), one listing
//! from the cursor with nothing new (a poll), and the inbox writes of a rescan in SQLite,
//! first with every object new and then with every object known (the dedupe that makes
//! a rescan safe).
//!
//!     trigger-cursor SOURCE_URL STATE_DB
//!
//! Prints one JSON object. Cloud sources are configured from the AWS_* variables.

use std::time::Instant;

use drivetrain_engine::events::discover::Source;
use drivetrain_engine::events::{Objects, Trigger, Watch};
use drivetrain_engine::state::{SqliteState, TriggerStore};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, db) = (&args[1], std::path::Path::new(&args[2]));
    let trigger = Trigger {
        name: "bench".into(),
        watch: Watch::Objects(Objects {
            source: url.clone(),
            matcher: Some(
                globset::GlobBuilder::new("**/*.mcap")
                    .literal_separator(true)
                    .build()
                    .unwrap()
                    .compile_matcher(),
            ),
            queue: None,
            poll: std::time::Duration::from_secs(1),
            rescan: std::time::Duration::from_secs(600),
        }),
        min_items: 1,
        max_items: 1000,
        max_wait: None,
        group_by: None,
        params: Default::default(),
        paused: false,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let source = Source::open(url).unwrap();
    let t0 = Instant::now();
    let whole = rt.block_on(source.list(&trigger, None)).unwrap();
    let whole_s = t0.elapsed().as_secs_f64();
    let cursor = whole.last_key.clone();
    let t0 = Instant::now();
    let poll = rt
        .block_on(source.list(&trigger, cursor.as_deref()))
        .unwrap();
    let poll_s = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(db);
    let state = SqliteState::open(db).unwrap();
    state
        .ensure_trigger("bench", "bench", "bench.yaml", false)
        .unwrap();
    let t0 = Instant::now();
    let new = state
        .add_objects("bench", "bench", &whole.objects, cursor.as_deref(), true)
        .unwrap();
    let first_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let again = state
        .add_objects("bench", "bench", &whole.objects, cursor.as_deref(), true)
        .unwrap();
    let known_s = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "listed": whole.listed,
            "matched": whole.objects.len(),
            "whole_listing_s": whole_s,
            "cursor_poll_s": poll_s,
            "cursor_poll_listed": poll.listed,
            "inbox_first_s": first_s,
            "inbox_first_new": new,
            "inbox_known_s": known_s,
            "inbox_known_new": again,
        })
    );
}
