//! SQLite's own schema history, frozen: what brings a database made before the shared
//! schema (`state/schema.rs`) to it, one step per version (`user_version` says how many
//! have run). New databases get the shared schema instead; changes go there.

/// The steps to version 12, where the shared schema starts.
pub(super) const HISTORY: &[&str] = &[
    r#"
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    file TEXT NOT NULL,
    spec_digest TEXT NOT NULL,
    params TEXT NOT NULL,
    trigger TEXT NOT NULL,
    parent TEXT,
    phase TEXT NOT NULL,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    reason TEXT
);
CREATE TABLE stages (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at TEXT,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    vals TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, stage)
);
CREATE TABLE attempts (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    phase TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    handle TEXT,
    PRIMARY KEY (run_id, stage, attempt)
);
CREATE INDEX runs_by_time ON runs(created_at);
"#,
    // 2: the process running a run, so `cancel` can reach it and `resume` can tell a
    // dead engine from a live one.
    "ALTER TABLE runs ADD COLUMN engine_pid INTEGER",
    // 3: the items of map stages, one row each, so a map of 100,000 items is not held
    // in the engine's memory.
    r#"
CREATE TABLE map_items (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    idx INTEGER NOT NULL,
    item TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, stage, idx)
);
"#,
    // 4: the executor handle of an item's running attempt, so `resume` can stop it.
    "ALTER TABLE map_items ADD COLUMN handle TEXT",
    // 5: caching, reruns and lineage: how each stage came by its outputs, cache
    // entries, and which stage published and read each artifact.
    r#"
ALTER TABLE runs ADD COLUMN overrides TEXT NOT NULL DEFAULT '{}';
ALTER TABLE runs ADD COLUMN selection TEXT;
ALTER TABLE stages ADD COLUMN origin TEXT NOT NULL DEFAULT 'ran';
ALTER TABLE stages ADD COLUMN origin_run TEXT;
ALTER TABLE stages ADD COLUMN cache_key TEXT;
ALTER TABLE stages ADD COLUMN provenance TEXT NOT NULL DEFAULT '{}';
ALTER TABLE stages ADD COLUMN inputs TEXT NOT NULL DEFAULT '{}';
CREATE TABLE cache_entries (
    key TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    run_id TEXT NOT NULL,
    outputs TEXT NOT NULL,
    vals TEXT NOT NULL,
    components TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX cache_by_stage ON cache_entries(pipeline, stage, created_at);
CREATE TABLE artifacts (
    digest TEXT PRIMARY KEY,
    manifest TEXT NOT NULL,
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    output TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE artifact_uses (
    digest TEXT NOT NULL,
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    input TEXT NOT NULL,
    PRIMARY KEY (digest, run_id, stage, input)
);
CREATE INDEX uses_by_stage ON artifact_uses(run_id, stage);
"#,
    // 6: schedules and their ticks, decided once each.
    r#"
CREATE TABLE schedules (
    pipeline TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    suspended INTEGER NOT NULL DEFAULT 0,
    anchor TEXT NOT NULL
);
CREATE TABLE schedule_ticks (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    scheduled_time TEXT NOT NULL,
    outcome TEXT NOT NULL,
    run_id TEXT,
    reason TEXT,
    recorded_at TEXT NOT NULL
);
CREATE INDEX ticks_by_time ON schedule_ticks(pipeline, scheduled_time);
CREATE INDEX runs_by_pipeline ON runs(pipeline, phase);
ALTER TABLE runs ADD COLUMN scheduled_time TEXT;
"#,
    // 7: the executor a run was started on (`--executor` may differ from the pipeline's),
    // so a resume or a cancel after a crash reaches the same one.
    r#"
ALTER TABLE runs ADD COLUMN executor TEXT;
"#,
    // 8: the heartbeat of the engine running a run, so a replica on another machine can
    // tell a dead engine and take its runs over.
    r#"
ALTER TABLE runs ADD COLUMN heartbeat_at TEXT;
"#,
    // 9: ticks by when they were recorded, so the scheduler finds new unstarted ones (a
    // `schedule trigger`) every loop without reading them all.
    r#"
CREATE INDEX ticks_by_record ON schedule_ticks(recorded_at);
"#,
    // 10: what each attempt used (JSON), and its stage's latest.
    r#"
ALTER TABLE attempts ADD COLUMN usage TEXT;
ALTER TABLE stages ADD COLUMN usage TEXT;
"#,
    // 11: what each map item's last attempt used.
    r#"
ALTER TABLE map_items ADD COLUMN usage TEXT;
"#,
    // 12: the run list's order within each filter, so a filtered list reads only the
    // rows it shows (`StateStore::find_runs`).
    r#"
CREATE INDEX runs_by_time_id ON runs(created_at, id);
CREATE INDEX runs_by_pipeline_time ON runs(pipeline, created_at, id);
CREATE INDEX runs_by_phase_time ON runs(phase, created_at, id);
CREATE INDEX runs_by_trigger_time ON runs(trigger, created_at, id);
"#,
];
