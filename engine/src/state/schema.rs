//! The state stores' schema: one text for SQLite and PostgreSQL.
//!
//! [`SCHEMA`] is the schema both backends reached together (SQLite's version 12,
//! PostgreSQL's version 6), written once in PostgreSQL's types; [`Dialect::schema`] gives
//! SQLite's form of it, which differs in two places only (SQLite orders rows by `rowid`,
//! not a `seq` column, and stores booleans as integers). Every change since is a
//! [`MIGRATIONS`] entry, applied to both backends the same way.
//!
//! A new database gets [`SCHEMA`] and then every migration in one transaction. A database
//! made before this text existed still has its backend's own history to catch up on
//! (`sqlite/migrations.rs`, `postgres.rs`), frozen: the tests check that it ends where a
//! new database starts (`sqlite/tests.rs`, `postgres.rs`).

/// The schema both backends reached together.
pub(super) const SCHEMA: &str = r#"
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
    reason TEXT,
    engine_pid BIGINT,
    overrides TEXT NOT NULL DEFAULT '{}',
    selection TEXT,
    scheduled_time TEXT,
    executor TEXT,
    heartbeat_at TEXT
);
CREATE INDEX runs_by_time ON runs(created_at);
CREATE INDEX runs_by_pipeline ON runs(pipeline, phase);
CREATE INDEX runs_by_time_id ON runs(created_at, id);
CREATE INDEX runs_by_pipeline_time ON runs(pipeline, created_at, id);
CREATE INDEX runs_by_phase_time ON runs(phase, created_at, id);
CREATE INDEX runs_by_trigger_time ON runs(trigger, created_at, id);
CREATE TABLE stages (
    seq BIGSERIAL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    started_at TEXT,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    vals TEXT NOT NULL DEFAULT '{}',
    origin TEXT NOT NULL DEFAULT 'ran',
    origin_run TEXT,
    cache_key TEXT,
    provenance TEXT NOT NULL DEFAULT '{}',
    inputs TEXT NOT NULL DEFAULT '{}',
    usage TEXT,
    PRIMARY KEY (run_id, stage)
);
CREATE TABLE attempts (
    seq BIGSERIAL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    phase TEXT NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    exit_code INTEGER,
    reason TEXT,
    handle TEXT,
    usage TEXT,
    PRIMARY KEY (run_id, stage, attempt)
);
CREATE TABLE map_items (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    idx BIGINT NOT NULL,
    item TEXT NOT NULL,
    phase TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    handle TEXT,
    usage TEXT,
    PRIMARY KEY (run_id, stage, idx)
);
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
CREATE TABLE schedules (
    pipeline TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    suspended BOOLEAN NOT NULL DEFAULT FALSE,
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
CREATE INDEX ticks_by_record ON schedule_ticks(recorded_at);
"#;

/// The changes since [`SCHEMA`], in order, one text each for both backends (through
/// [`Dialect::text`]). Append only.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: triggers (the inbox of discovered objects, each trigger's cursor and pause) and
    // the notifications outbox; runs note the phase they were last weighed in for
    // notifications (runs made before are taken as weighed: no flood on upgrade).
    r#"
CREATE TABLE trigger_inbox (
    pipeline TEXT NOT NULL,
    trigger_name TEXT NOT NULL,
    url TEXT NOT NULL,
    etag TEXT NOT NULL,
    size BIGINT,
    modified TEXT,
    grp TEXT NOT NULL,
    discovered_at TEXT NOT NULL,
    state TEXT NOT NULL,
    run_id TEXT,
    payload TEXT,
    PRIMARY KEY (pipeline, trigger_name, url, etag)
);
CREATE INDEX inbox_waiting ON trigger_inbox(pipeline, trigger_name, state, grp, discovered_at);
CREATE INDEX inbox_by_run ON trigger_inbox(run_id);
CREATE INDEX inbox_by_url ON trigger_inbox(url);
CREATE TABLE triggers (
    pipeline TEXT NOT NULL,
    trigger_name TEXT NOT NULL,
    file TEXT NOT NULL,
    cursor_key TEXT,
    paused BOOLEAN NOT NULL DEFAULT FALSE,
    paused_at TEXT,
    rescanned_at TEXT,
    evaluated_at TEXT,
    last_reason TEXT,
    PRIMARY KEY (pipeline, trigger_name)
);
CREATE TABLE outbox (
    id TEXT PRIMARY KEY,
    pipeline TEXT NOT NULL,
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    sink TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_at TEXT NOT NULL,
    last_error TEXT,
    created_at TEXT NOT NULL,
    delivered_at TEXT
);
CREATE INDEX outbox_due ON outbox(state, next_at);
ALTER TABLE runs ADD COLUMN notified TEXT;
UPDATE runs SET notified = phase;
CREATE INDEX runs_by_notified ON runs(notified);
"#,
    // 2: people: API tokens (hashed), the append-only audit log, approvals (a stage
    // waiting for people) with their votes, the registry aliases only an approval role
    // moves, the project of each run (runs made before are in `default`) and each
    // project's quota.
    r#"
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    project TEXT NOT NULL,
    role TEXT NOT NULL,
    approves TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at TEXT
);
CREATE TABLE audit (
    seq BIGSERIAL,
    at TEXT NOT NULL,
    subject TEXT NOT NULL,
    project TEXT NOT NULL,
    action TEXT NOT NULL,
    resource TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    before_value TEXT,
    after_value TEXT
);
CREATE INDEX audit_by_time ON audit(at);
CREATE TABLE approvals (
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    project TEXT NOT NULL,
    role TEXT NOT NULL,
    min_approvals BIGINT NOT NULL,
    requested_at TEXT NOT NULL,
    timeout_at TEXT,
    on_timeout TEXT NOT NULL,
    evidence TEXT NOT NULL,
    outcome TEXT,
    decided_at TEXT,
    reason TEXT,
    PRIMARY KEY (run_id, stage)
);
CREATE INDEX approvals_waiting ON approvals(outcome, timeout_at);
ALTER TABLE runs ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
CREATE INDEX runs_by_project_time ON runs(project, created_at, id);
CREATE TABLE project_quotas (
    project TEXT PRIMARY KEY,
    max_runs BIGINT,
    max_gpus BIGINT,
    set_at TEXT NOT NULL,
    set_by TEXT NOT NULL
);
CREATE TABLE protected_aliases (
    alias TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    set_at TEXT NOT NULL,
    set_by TEXT NOT NULL
);
CREATE TABLE approval_votes (
    run_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    subject TEXT NOT NULL,
    decision TEXT NOT NULL,
    comment TEXT,
    at TEXT NOT NULL,
    PRIMARY KEY (run_id, stage, subject)
);
"#,
    // 3: when each map item's last attempt started and ended (the web view's timeline).
    r#"
ALTER TABLE map_items ADD COLUMN started_at TEXT;
ALTER TABLE map_items ADD COLUMN finished_at TEXT;
"#,
    // 4: requests named by an `Idempotency-Key` (the run each starts, and its answer), and
    // a cancel asked of a run, which whichever engine drives it honours.
    r#"
CREATE TABLE request_keys (
    scope TEXT NOT NULL,
    request_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id TEXT NOT NULL,
    claimed_at TEXT NOT NULL,
    status BIGINT,
    body TEXT,
    PRIMARY KEY (scope, request_key)
);
CREATE INDEX request_keys_by_time ON request_keys(claimed_at);
ALTER TABLE runs ADD COLUMN cancel_asked_at TEXT;
"#,
    // 5: the text of each pipeline a run ran, by its digest (`runs.spec_digest`), so a
    // run keeps its graph when its file is edited, moved or gone.
    r#"
CREATE TABLE pipeline_sources (
    digest TEXT PRIMARY KEY,
    source TEXT NOT NULL
);
"#,
    // 6: the values each map item's last attempt reported (the web view's items table).
    r#"
ALTER TABLE map_items ADD COLUMN item_values TEXT;
"#,
    // 7: the home's ledger of GPUs: which attempt of which run holds each device.
    r#"
CREATE TABLE gpu_claims (
    host TEXT NOT NULL,
    device TEXT NOT NULL,
    run_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    claimed_at TEXT NOT NULL,
    PRIMARY KEY (host, device)
);
CREATE INDEX gpu_claims_by_run ON gpu_claims(run_id, holder);
"#,
    // 8: priorities and preemption in the GPU ledger, the CPU and memory stages hold, the
    // attempts waiting there, and how
    // long each attempt waited for its GPUs and why.
    r#"
ALTER TABLE gpu_claims ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_claims ADD COLUMN preemptible BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE gpu_claims ADD COLUMN preempted_by TEXT;
ALTER TABLE gpu_claims ADD COLUMN preempter_run TEXT;
ALTER TABLE gpu_claims ADD COLUMN preempter_holder TEXT;
ALTER TABLE gpu_claims ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
ALTER TABLE gpu_claims ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
ALTER TABLE project_quotas ADD COLUMN weight BIGINT;
CREATE TABLE gpu_waits (
    host TEXT NOT NULL,
    run_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    queue TEXT NOT NULL,
    project TEXT NOT NULL,
    priority BIGINT NOT NULL,
    gpus BIGINT NOT NULL,
    cpu_millis BIGINT NOT NULL DEFAULT 0,
    memory_bytes BIGINT NOT NULL DEFAULT 0,
    since TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (run_id, holder)
);
CREATE TABLE capacity_claims (
    host TEXT NOT NULL,
    run_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    cpu_millis BIGINT NOT NULL,
    memory_bytes BIGINT NOT NULL,
    claimed_at TEXT NOT NULL,
    PRIMARY KEY (run_id, holder)
);
CREATE TABLE priority_classes (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL,
    set_at TEXT NOT NULL
);
ALTER TABLE attempts ADD COLUMN waited_until TEXT;
ALTER TABLE attempts ADD COLUMN waited_for TEXT;
"#,
    // 9: searches: each trial as the search last decided it, and the metrics trials push.
    r#"
CREATE TABLE trials (
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    idx BIGINT NOT NULL,
    trial_id TEXT NOT NULL,
    params TEXT NOT NULL,
    state TEXT NOT NULL,
    rung BIGINT NOT NULL,
    metrics TEXT NOT NULL,
    used BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    reason TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    trial_values TEXT NOT NULL DEFAULT '{}',
    started_at TEXT,
    updated_at TEXT NOT NULL,
    handle TEXT,
    PRIMARY KEY (run_id, stage, idx)
);
CREATE TABLE trial_metrics (
    seq BIGSERIAL,
    run_id TEXT NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,
    idx BIGINT NOT NULL,
    step BIGINT,
    name TEXT NOT NULL,
    value DOUBLE PRECISION NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX trial_metrics_by_stage ON trial_metrics(run_id, stage);
"#,
];

/// A backend's SQL, where it differs from PostgreSQL's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Sqlite,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
}

impl Dialect {
    /// [`SCHEMA`] in this dialect.
    pub(super) fn schema(self) -> String {
        self.text(SCHEMA)
    }

    /// `sql` in this dialect: SQLite has no `seq` column (it orders by `rowid`) and keeps
    /// booleans as integers.
    pub(super) fn text(self, sql: &str) -> String {
        match self {
            Dialect::Postgres => sql.to_owned(),
            Dialect::Sqlite => sql.replace("    seq BIGSERIAL,\n", "").replace(
                "BOOLEAN NOT NULL DEFAULT FALSE",
                "INTEGER NOT NULL DEFAULT 0",
            ),
        }
    }

    /// The schema version a database of this dialect is at once it has [`SCHEMA`]: the
    /// length of its backend's frozen history.
    pub(super) fn base_version(self) -> usize {
        match self {
            Dialect::Sqlite => 12,
            Dialect::Postgres => 6,
        }
    }

    /// The current schema version of this dialect.
    pub(super) fn version(self) -> usize {
        self.base_version() + MIGRATIONS.len()
    }

    /// What brings a database at `version` to [`Dialect::version`], after its
    /// backend's own history (`history`, the steps to [`Dialect::base_version`]): each
    /// step's SQL with the version it reaches. A new database (`version` 0) gets
    /// [`SCHEMA`] in one step instead of the history.
    pub(super) fn steps(self, version: usize, history: &[&str]) -> Vec<(usize, String)> {
        debug_assert_eq!(history.len(), self.base_version());
        let mut steps = Vec::new();
        if version == 0 {
            steps.push((self.base_version(), self.schema()));
        } else {
            for (i, m) in history.iter().enumerate().skip(version) {
                steps.push((i + 1, (*m).to_owned()));
            }
        }
        let done = version.max(self.base_version()) - self.base_version();
        for (i, m) in MIGRATIONS.iter().enumerate().skip(done) {
            steps.push((self.base_version() + i + 1, self.text(m)));
        }
        steps
    }
}
