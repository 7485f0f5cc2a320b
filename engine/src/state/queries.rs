//! The statements both state stores run, in one text with PostgreSQL's placeholders
//! (`$1`, `$2`, …): [`pg`] holds them as written, [`sqlite`] the same text with `?1`,
//! `?2`, … (SQLite reads `$1` as a named parameter numbered where it first appears, not
//! as the first), made at compile time. What differs between the two dialects beyond
//! that (`instr` against `strpos`, `INSERT OR IGNORE`, `rowid` against `seq`) stays in
//! each store's file.

/// `text` with every `$` turned into `?`, as bytes: PostgreSQL's placeholders as SQLite's.
/// No statement here has a `$` anywhere else.
const fn question_marks<const N: usize>(text: &str) -> [u8; N] {
    let bytes = text.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = if bytes[i] == b'$' { b'?' } else { bytes[i] };
        i += 1;
    }
    out
}

/// Declares each statement once, in both dialects.
macro_rules! statements {
    ($($name:ident = $text:expr;)*) => {
        /// The statements in PostgreSQL's placeholders.
        #[cfg(any(feature = "postgres", test))]
        pub(super) mod pg {
            $(pub(in crate::state) const $name: &str = $text;)*
        }
        /// The same statements in SQLite's numbered placeholders.
        pub(super) mod sqlite {
            $(pub(in crate::state) static $name: &str = {
                static BYTES: [u8; $text.len()] = super::question_marks($text);
                match std::str::from_utf8(&BYTES) {
                    Ok(s) => s,
                    Err(_) => panic!("a statement that is not UTF-8"),
                }
            };)*
            /// Every statement, for the tests.
            #[cfg(test)]
            pub(in crate::state) static ALL: &[&str] = &[$($name),*];
        }
        /// Every statement as written, in the same order as [`sqlite::ALL`].
        #[cfg(test)]
        const ALL: &[&str] = &[$($text),*];
    };
}

statements! {
    FREE_DEAD_GPUS =
        "DELETE FROM gpu_claims WHERE run_id <> $1 AND run_id NOT IN (SELECT id FROM runs \
         WHERE phase IN ('Running', 'Pending') AND (heartbeat_at IS NULL OR heartbeat_at >= \
         $2))";
    FREE_DEAD_GPU_WAITS =
        "DELETE FROM gpu_waits WHERE run_id <> $1 AND (seen_at < $3 OR run_id NOT IN (SELECT \
         id FROM runs WHERE phase IN ('Running', 'Pending') AND (heartbeat_at IS NULL OR \
         heartbeat_at >= $2)))";
    GPU_CLAIMS =
        "SELECT host, device, run_id, holder, claimed_at, priority, preemptible, preempted_by, \
         queue, project FROM gpu_claims ORDER BY host, device";
    CLAIM_GPU =
        "INSERT INTO gpu_claims (host, device, run_id, holder, claimed_at, priority, \
         preemptible, queue, project) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
    PREEMPT_GPUS =
        "UPDATE gpu_claims SET preempted_by = $3, preempter_run = $4, preempter_holder = $5 \
         WHERE run_id = $1 AND holder = $2 AND preempted_by IS NULL";
    UNMARK_PREEMPTED_BY =
        "UPDATE gpu_claims SET preempted_by = NULL, preempter_run = NULL, preempter_holder = \
         NULL WHERE preempter_run = $1 AND preempter_holder = $2";
    UNMARK_PREEMPTED_BY_RUN =
        "UPDATE gpu_claims SET preempted_by = NULL, preempter_run = NULL, preempter_holder = \
         NULL WHERE preempter_run = $1";
    GPU_PREEMPTED =
        "SELECT preempted_by FROM gpu_claims WHERE run_id = $1 AND holder = $2 AND \
         preempted_by IS NOT NULL LIMIT 1";
    RELEASE_GPUS =
        "DELETE FROM gpu_claims WHERE run_id = $1 AND holder = $2";
    RELEASE_RUN_GPUS =
        "DELETE FROM gpu_claims WHERE run_id = $1";
    SET_PRIORITY_CLASS =
        "INSERT INTO priority_classes (name, value, set_at) VALUES ($1, $2, $3) ON CONFLICT \
         (name) DO UPDATE SET value = $2, set_at = $3";
    DROP_PRIORITY_CLASS =
        "DELETE FROM priority_classes WHERE name = $1";
    PRIORITY_CLASSES =
        "SELECT name, value FROM priority_classes ORDER BY name";
    GPU_WAITS =
        "SELECT host, run_id, holder, queue, priority, gpus, since, project, cpu_millis, \
         memory_bytes FROM gpu_waits ORDER BY priority DESC, since, run_id, holder";
    CAPACITY_CLAIMS =
        "SELECT host, run_id, holder, cpu_millis, memory_bytes, claimed_at FROM \
         capacity_claims ORDER BY host, claimed_at";
    CLAIM_CAPACITY =
        "INSERT INTO capacity_claims (host, run_id, holder, cpu_millis, memory_bytes, \
         claimed_at) VALUES ($1, $2, $3, $4, $5, $6)";
    FREE_DEAD_CAPACITY =
        "DELETE FROM capacity_claims WHERE run_id <> $1 AND run_id NOT IN (SELECT id FROM runs \
         WHERE phase IN ('Running', 'Pending') AND (heartbeat_at IS NULL OR heartbeat_at >= \
         $2))";
    RELEASE_CAPACITY =
        "DELETE FROM capacity_claims WHERE run_id = $1 AND holder = $2";
    RELEASE_RUN_CAPACITY =
        "DELETE FROM capacity_claims WHERE run_id = $1";
    WAIT_FOR_GPUS =
        "INSERT INTO gpu_waits (host, run_id, holder, queue, priority, gpus, since, seen_at, \
         project, cpu_millis, memory_bytes) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, \
         $10) ON CONFLICT (run_id, holder) DO UPDATE SET seen_at = $7";
    STOP_WAITING =
        "DELETE FROM gpu_waits WHERE run_id = $1 AND holder = $2";
    STOP_RUN_WAITING =
        "DELETE FROM gpu_waits WHERE run_id = $1";
    ENSURE_TRIGGER =
        "INSERT INTO triggers (pipeline, trigger_name, paused, file) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (pipeline, trigger_name) DO UPDATE SET file = $4";
    ADD_OBJECT =
        "INSERT INTO trigger_inbox (pipeline, trigger_name, url, etag, size, modified, grp, \
         discovered_at, state, payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'waiting', \
         $9) ON CONFLICT (pipeline, trigger_name, url, etag) DO NOTHING";
    MOVE_CURSOR =
        "UPDATE triggers SET cursor_key = $3 WHERE pipeline = $1 AND trigger_name = $2 AND \
         (cursor_key IS NULL OR cursor_key < $3)";
    NOTE_RESCAN =
        "UPDATE triggers SET rescanned_at = $3 WHERE pipeline = $1 AND trigger_name = $2";
    WAITING =
        "SELECT grp, COUNT(*), MIN(discovered_at) FROM trigger_inbox WHERE pipeline = $1 AND \
         trigger_name = $2 AND state = 'waiting' GROUP BY grp ORDER BY MIN(discovered_at)";
    CLAIMABLE =
        "SELECT url, etag, size, modified, grp, discovered_at, payload FROM trigger_inbox \
         WHERE pipeline = $1 AND trigger_name = $2 AND grp = $3 AND state = 'waiting' AND NOT \
         EXISTS (SELECT 1 FROM triggers t WHERE t.pipeline = $1 AND t.trigger_name = $2 AND \
         t.paused) ORDER BY discovered_at, url LIMIT $4";
    CONSUME_OBJECT =
        "UPDATE trigger_inbox SET state = 'consumed', run_id = $5 WHERE pipeline = $1 AND \
         trigger_name = $2 AND url = $3 AND etag = $4 AND state = 'waiting'";
    RUN_TRIGGER =
        "SELECT trigger_name, url, etag, size, modified, grp, discovered_at, payload FROM \
         trigger_inbox WHERE run_id = $1 ORDER BY discovered_at, url";
    OBJECT_RUNS =
        "SELECT run_id, trigger_name FROM trigger_inbox WHERE url = $1 AND run_id IS NOT \
         NULL ORDER BY run_id";
    TRIGGERS =
        "SELECT t.pipeline, t.trigger_name, t.cursor_key, t.paused, t.paused_at, \
         t.rescanned_at, t.evaluated_at, t.last_reason, (SELECT COUNT(*) FROM trigger_inbox \
         i WHERE i.pipeline = t.pipeline AND i.trigger_name = t.trigger_name AND i.state = \
         'waiting'), (SELECT MIN(i.discovered_at) FROM trigger_inbox i WHERE i.pipeline = \
         t.pipeline AND i.trigger_name = t.trigger_name AND i.state = 'waiting'), (SELECT \
         COUNT(*) FROM trigger_inbox i WHERE i.pipeline = t.pipeline AND i.trigger_name = \
         t.trigger_name AND i.state = 'consumed'), (SELECT COUNT(*) FROM trigger_inbox i \
         WHERE i.pipeline = t.pipeline AND i.trigger_name = t.trigger_name AND i.state = \
         'skipped'), t.file FROM triggers t ORDER BY t.pipeline, t.trigger_name";
    TRIGGER_STATE =
        "SELECT paused, cursor_key FROM triggers WHERE pipeline = $1 AND trigger_name = $2";
    SET_TRIGGER_PAUSED =
        "UPDATE triggers SET paused = $3, paused_at = $4 WHERE pipeline = $1 AND \
         trigger_name = $2";
    SKIP_WAITING =
        "UPDATE trigger_inbox SET state = 'skipped' WHERE pipeline = $1 AND trigger_name = \
         $2 AND state = 'waiting'";
    NOTE_EVALUATION =
        "UPDATE triggers SET evaluated_at = $3, last_reason = $4 WHERE pipeline = $1 AND \
         trigger_name = $2";
    ENQUEUE_NOTIFICATION =
        "INSERT INTO outbox (id, pipeline, run_id, event, sink, body, state, next_at, \
         created_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $7) ON CONFLICT (id) DO \
         NOTHING";
    MARK_NOTIFIED =
        "UPDATE runs SET notified = $2 WHERE id = $1";
    DUE_NOTIFICATIONS =
        "SELECT id, pipeline, run_id, event, sink, body, state, attempts, next_at, \
         last_error, created_at, delivered_at FROM outbox WHERE state = 'pending' AND \
         next_at <= $1 ORDER BY next_at LIMIT $2";
    NOTIFICATION_SENT =
        "UPDATE outbox SET state = 'delivered', attempts = attempts + 1, delivered_at = $2, \
         last_error = NULL WHERE id = $1";
    NOTIFICATION_RETRY =
        "UPDATE outbox SET attempts = attempts + 1, last_error = $2, next_at = $3 WHERE id = \
         $1 AND state = 'pending'";
    NOTIFICATION_DEAD =
        "UPDATE outbox SET state = 'dead', attempts = attempts + 1, last_error = $2 WHERE id \
         = $1 AND state = 'pending'";
    NOTIFICATIONS =
        "SELECT id, pipeline, run_id, event, sink, body, state, attempts, next_at, \
         last_error, created_at, delivered_at FROM outbox WHERE ($1 = '' OR state = $1) \
         ORDER BY created_at DESC, id LIMIT $2";
    NOTIFICATION_COUNTS =
        "SELECT state, COUNT(*) FROM outbox GROUP BY state";
    FINISH_RUN =
        "UPDATE runs SET phase = $2, finished_at = $3, reason = $4, engine_pid = NULL WHERE \
         id = $1";
    REOPEN_RUN =
        "UPDATE runs SET phase = 'Running', finished_at = NULL, reason = NULL, engine_pid = \
         $2, notified = CASE WHEN notified IS NULL THEN NULL ELSE 'Running' END WHERE id = \
         $1";
    RUN_COUNTS =
        "SELECT phase, COUNT(*) FROM runs GROUP BY phase";
    HEARTBEAT =
        "UPDATE runs SET heartbeat_at = $2 WHERE id = $1";
    ASK_CANCEL =
        "UPDATE runs SET cancel_asked_at = COALESCE(cancel_asked_at, $2) WHERE id = $1 AND \
         phase IN ('Running', 'Pending', 'Waiting')";
    CANCEL_ASKED =
        "SELECT cancel_asked_at FROM runs WHERE id = $1";
    KEEP_SOURCE =
        "INSERT INTO pipeline_sources (digest, source) VALUES ($1, $2) ON CONFLICT (digest) \
         DO NOTHING";
    SOURCE =
        "SELECT source FROM pipeline_sources WHERE digest = $1";
    CLAIM_KEY =
        "INSERT INTO request_keys (scope, request_key, fingerprint, run_id, claimed_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope, request_key) DO NOTHING";
    REQUEST_KEY =
        "SELECT fingerprint, run_id, claimed_at, status, body FROM request_keys WHERE scope = \
         $1 AND request_key = $2";
    ANSWER_KEY =
        "UPDATE request_keys SET status = $3, body = $4 WHERE scope = $1 AND request_key = $2";
    RELEASE_KEY =
        "DELETE FROM request_keys WHERE scope = $1 AND request_key = $2 AND claimed_at = $3 \
         AND status IS NULL";
    EXPIRE_KEYS =
        "DELETE FROM request_keys WHERE claimed_at < $1";
    STALE_RUNS =
        "SELECT id FROM runs WHERE phase = 'Running' AND heartbeat_at < $1 ORDER BY \
         created_at";
    TAKE_OVER =
        "UPDATE runs SET heartbeat_at = $3, engine_pid = NULL WHERE id = $1 AND phase IN \
         ('Running', 'Pending') AND (heartbeat_at IS NULL OR heartbeat_at < $2)";
    RUNNING_RUNS =
        "SELECT id FROM runs WHERE pipeline = $1 AND phase IN ('Running', 'Pending') ORDER \
         BY created_at";
    SET_PROVENANCE =
        "INSERT INTO stages (run_id, stage, phase, origin, origin_run, cache_key, \
         provenance, inputs) VALUES ($1, $2, 'Pending', $3, $4, $5, $6, $7) ON CONFLICT \
         (run_id, stage) DO UPDATE SET origin = $3, origin_run = $4, cache_key = $5, \
         provenance = $6, inputs = $7";
    CLEAR_ARTIFACT_USES =
        "DELETE FROM artifact_uses WHERE run_id = $1 AND stage = $2";
    START_ATTEMPT =
        "INSERT INTO attempts (run_id, stage, attempt, phase, started_at) VALUES ($1, $2, \
         $3, 'Running', $4) ON CONFLICT (run_id, stage, attempt) DO UPDATE SET phase = \
         'Running' WHERE attempts.phase = 'Running'";
    START_STAGE =
        "INSERT INTO stages (run_id, stage, phase, attempts, started_at) VALUES ($1, $2, \
         'Running', $3, $4) ON CONFLICT (run_id, stage) DO UPDATE SET phase = 'Running', \
         attempts = $3, started_at = COALESCE(stages.started_at, $4)";
    SET_ATTEMPT_HANDLE =
        "UPDATE attempts SET handle = $4 WHERE run_id = $1 AND stage = $2 AND attempt = $3";
    SET_ATTEMPT_WAITED =
        "UPDATE attempts SET waited_until = $4, waited_for = $5 WHERE run_id = $1 AND stage = \
         $2 AND attempt = $3";
    SET_ATTEMPT_USAGE =
        "UPDATE attempts SET usage = $4 WHERE run_id = $1 AND stage = $2 AND attempt = $3";
    SET_STAGE_USAGE =
        "UPDATE stages SET usage = $3 WHERE run_id = $1 AND stage = $2";
    SET_ITEM_USAGE =
        "UPDATE map_items SET usage = $4 WHERE run_id = $1 AND stage = $2 AND idx = $3";
    CLEAR_MAP_ITEMS =
        "DELETE FROM map_items WHERE run_id = $1 AND stage = $2";
    START_ITEM =
        "UPDATE map_items SET phase = 'Running', attempts = $4, started_at = $5, finished_at \
         = NULL WHERE run_id = $1 AND stage = $2 AND idx = $3";
    FINISH_ITEM =
        "UPDATE map_items SET phase = $4, reason = $5, outputs = $6, finished_at = $7, \
         item_values = $8 WHERE run_id = $1 AND stage = $2 AND idx = $3";
    SET_ITEM_HANDLE =
        "UPDATE map_items SET handle = $4 WHERE run_id = $1 AND stage = $2 AND idx = $3";
    MAP_ITEMS =
        "SELECT idx, item, phase, attempts, reason, outputs, handle, usage, started_at, \
         finished_at, item_values FROM map_items WHERE run_id = $1 AND stage = $2 ORDER BY idx";
    ITEM_COUNTS =
        "SELECT phase, COUNT(*) FROM map_items WHERE run_id = $1 AND stage = $2 GROUP BY \
         phase";
    PUT_TRIAL =
        "INSERT INTO trials (run_id, stage, idx, trial_id, params, state, rung, metrics, used, \
         attempts, reason, outputs, started_at, updated_at, trial_values) VALUES ($1, $2, $3, \
         $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14) ON CONFLICT (run_id, stage, idx) \
         DO UPDATE SET state = $6, rung = $7, metrics = $8, used = $9, attempts = $10, reason = \
         $11, outputs = $12, started_at = COALESCE(trials.started_at, $13), updated_at = $13, \
         trial_values = $14";
    TRIALS =
        "SELECT idx, trial_id, params, state, rung, metrics, used, attempts, reason, outputs, \
         started_at, updated_at, handle, trial_values FROM trials WHERE run_id = $1 AND stage = $2 ORDER BY \
         idx";
    SET_TRIAL_HANDLE =
        "UPDATE trials SET handle = $4 WHERE run_id = $1 AND stage = $2 AND idx = $3";
    METRICS =
        "SELECT idx, step, name, value, at FROM trial_metrics WHERE run_id = $1 AND stage = $2";
    ARTIFACTS_BETWEEN =
        "SELECT digest FROM artifacts WHERE digest >= $1 AND digest < $2 ORDER BY digest LIMIT $3";
    ARTIFACT =
        "SELECT digest, manifest, run_id, stage, output, created_at FROM artifacts WHERE \
         digest = $1";
    ARTIFACT_USES =
        "SELECT digest, run_id, stage, input FROM artifact_uses WHERE digest = $1 ORDER BY \
         run_id, stage, input";
    EXPIRE_CACHE_ENTRIES =
        "DELETE FROM cache_entries WHERE created_at < $1";
    UPSERT_SCHEDULE =
        "INSERT INTO schedules (pipeline, file, anchor) VALUES ($1, $2, $3) ON CONFLICT \
         (pipeline) DO UPDATE SET file = $2";
    SCHEDULE =
        "SELECT pipeline, file, suspended, anchor FROM schedules WHERE pipeline = $1";
    SCHEDULES =
        "SELECT pipeline, file, suspended, anchor FROM schedules ORDER BY pipeline";
    SET_SUSPENDED =
        "UPDATE schedules SET suspended = $2, anchor = COALESCE($3, anchor) WHERE pipeline \
         = $1";
    TICKS =
        "SELECT id, pipeline, scheduled_time, outcome, run_id, reason FROM schedule_ticks \
         WHERE pipeline = $1 ORDER BY scheduled_time DESC LIMIT $2";
    INSERT_RUN =
        "INSERT INTO runs (id, pipeline, file, spec_digest, params, trigger, parent, phase, \
         created_at, engine_pid, overrides, selection, scheduled_time, executor, project) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";
    WRITE_STAGE =
        "INSERT INTO stages (run_id, stage, phase, started_at, finished_at, exit_code, \
         reason) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_id, stage) DO UPDATE \
         SET phase = $3, started_at = COALESCE(stages.started_at, $4), finished_at = $5, \
         exit_code = $6, reason = $7";
    WRITE_STAGE_RESULTS =
        "UPDATE stages SET outputs = $3, vals = $4 WHERE run_id = $1 AND stage = $2";
    WRITE_ATTEMPT_END =
        "UPDATE attempts SET phase = $4, finished_at = $5, exit_code = $6, reason = $7 \
         WHERE run_id = $1 AND stage = $2 AND attempt = $3";
    ADD_TOKEN =
        "INSERT INTO tokens (id, name, project, role, approves, hash, created_at, \
         created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
    TOKEN_BY_HASH =
        "SELECT id, name, project, role, approves, created_at, created_by, revoked_at FROM \
         tokens WHERE hash = $1 AND revoked_at IS NULL";
    TOKENS =
        "SELECT id, name, project, role, approves, created_at, created_by, revoked_at FROM \
         tokens ORDER BY created_at, id";
    TOKEN_BY_ID_OR_NAME =
        "SELECT id, name, project, role, approves, created_at, created_by, revoked_at FROM \
         tokens WHERE (id = $1 OR name = $1) AND revoked_at IS NULL ORDER BY created_at";
    REVOKE_TOKEN =
        "UPDATE tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL";
    APPEND_AUDIT =
        "INSERT INTO audit (at, subject, project, action, resource, decision, reason, \
         before_value, after_value) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
    REQUEST_APPROVAL =
        "INSERT INTO approvals (run_id, stage, pipeline, project, role, min_approvals, \
         requested_at, timeout_at, on_timeout, evidence) VALUES ($1, $2, $3, $4, $5, $6, \
         $7, $8, $9, $10) ON CONFLICT (run_id, stage) DO NOTHING";
    APPROVAL =
        "SELECT run_id, stage, pipeline, project, role, min_approvals, requested_at, \
         timeout_at, on_timeout, evidence, outcome, decided_at, reason FROM approvals WHERE \
         run_id = $1 AND stage = $2";
    APPROVALS =
        "SELECT run_id, stage, pipeline, project, role, min_approvals, requested_at, \
         timeout_at, on_timeout, evidence, outcome, decided_at, reason FROM approvals WHERE \
         (CAST($1 AS BIGINT) = 0 OR outcome IS NULL) ORDER BY requested_at DESC, run_id, stage LIMIT $2";
    VOTES =
        "SELECT subject, decision, comment, at FROM approval_votes WHERE run_id = $1 AND \
         stage = $2 ORDER BY at, subject";
    ADD_VOTE =
        "INSERT INTO approval_votes (run_id, stage, subject, decision, comment, at) VALUES \
         ($1, $2, $3, $4, $5, $6) ON CONFLICT (run_id, stage, subject) DO NOTHING";
    DECIDE_APPROVAL =
        "UPDATE approvals SET outcome = $3, decided_at = $4, reason = $5 WHERE run_id = $1 \
         AND stage = $2 AND outcome IS NULL";
    EXPIRED_APPROVALS =
        "SELECT run_id, stage FROM approvals WHERE outcome IS NULL AND timeout_at IS NOT \
         NULL AND timeout_at < $1";
    DECIDED_WAITING_RUNS =
        "SELECT id FROM runs WHERE phase = 'Waiting' AND NOT EXISTS (SELECT 1 FROM \
         approvals a WHERE a.run_id = runs.id AND a.outcome IS NULL) ORDER BY created_at";
    PROTECT_ALIAS =
        "INSERT INTO protected_aliases (alias, role, set_at, set_by) VALUES ($1, $2, $3, \
         $4) ON CONFLICT (alias) DO UPDATE SET role = $2, set_at = $3, set_by = $4";
    UNPROTECT_ALIAS =
        "DELETE FROM protected_aliases WHERE alias = $1";
    PROTECTED_ALIASES =
        "SELECT alias, role FROM protected_aliases ORDER BY alias";
    SET_QUOTA =
        "INSERT INTO project_quotas (project, max_runs, max_gpus, set_at, set_by, weight) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (project) DO UPDATE SET max_runs = $2, \
         max_gpus = $3, set_at = $4, set_by = $5, weight = $6";
    QUOTAS =
        "SELECT project, max_runs, max_gpus, weight FROM project_quotas ORDER BY project";
    PROJECT_WEIGHTS =
        "SELECT project, weight FROM project_quotas WHERE weight IS NOT NULL";
    RUN_PHASE =
        "SELECT phase FROM runs WHERE id = $1";
    CLAIM_WAITING =
        "UPDATE runs SET phase = 'Running', engine_pid = NULL, heartbeat_at = $2 WHERE id \
         = $1 AND phase = 'Waiting'";
}

#[cfg(test)]
mod tests {
    /// Every statement prepares on SQLite's schema, and its placeholders are `?1` to `?N`
    /// with none left out (a number skipped would bind the wrong value in both stores).
    #[test]
    fn every_statement_prepares_on_sqlite_with_placeholders_one_to_n() {
        let path = std::env::temp_dir().join(format!("dt-queries-{}.db", std::process::id()));
        drop(crate::state::SqliteState::open(&path).unwrap());
        let c = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(super::sqlite::ALL.len(), super::ALL.len());
        for (sql, &pg) in super::sqlite::ALL.iter().zip(super::ALL) {
            assert_eq!(sql.replace('?', "$"), pg, "the same text in both dialects");
            let stmt = c.prepare(sql).unwrap_or_else(|e| panic!("{e}: {sql}"));
            for k in 1..=stmt.parameter_count() {
                assert_eq!(
                    stmt.parameter_name(k),
                    Some(format!("?{k}").as_str()),
                    "{sql}"
                );
            }
            let highest = (1..=99).rev().find(|k| pg.contains(&format!("${k}")));
            assert_eq!(highest.unwrap_or(0), stmt.parameter_count(), "{sql}");
        }
        drop(c);
        for end in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{end}", path.display()));
        }
    }
}
