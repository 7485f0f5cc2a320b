//! The SQLite store's tokens, audit log and approvals ([`AccessStore`], [`ApprovalStore`]).

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::super::access::{
    ended, split, tally, timed_out, AccessStore, ApprovalRecord, ApprovalRequest, ApprovalStore,
    AuditEntry, KeyClaim, KeyRecord, KeyStore, Quota, Refusal, TokenRecord, Vote,
};
use super::rows::json_col;
use super::{now, queries, query, sql, ExecuteCached, RunId, SqliteState, StateError};

fn token_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TokenRecord> {
    Ok(TokenRecord {
        id: r.get(0)?,
        name: r.get(1)?,
        project: r.get(2)?,
        role: r.get(3)?,
        approves: split(&r.get::<_, String>(4)?),
        created_at: r.get(5)?,
        created_by: r.get(6)?,
        revoked_at: r.get(7)?,
    })
}

fn request_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRecord> {
    Ok(ApprovalRecord {
        request: ApprovalRequest {
            run: RunId(r.get(0)?),
            stage: r.get(1)?,
            pipeline: r.get(2)?,
            project: r.get(3)?,
            role: r.get(4)?,
            min: r.get::<_, i64>(5)?.clamp(0, u32::MAX as i64) as u32,
            requested_at: r.get(6)?,
            timeout_at: r.get(7)?,
            on_timeout: r.get(8)?,
            evidence: json_col(r.get(9)?),
        },
        outcome: r.get(10)?,
        decided_at: r.get(11)?,
        reason: r.get(12)?,
        votes: Vec::new(),
    })
}

fn immediate(c: &Connection) -> Result<rusqlite::Transaction<'_>, StateError> {
    rusqlite::Transaction::new_unchecked(c, TransactionBehavior::Immediate).map_err(sql("begin"))
}

/// One approval with its votes.
fn read_approval(
    c: &Connection,
    run: &RunId,
    stage: &str,
) -> Result<Option<ApprovalRecord>, StateError> {
    let found = c
        .prepare_cached(queries::sqlite::APPROVAL)
        .and_then(|mut s| {
            s.query_row(params![run.0, stage], request_from_row)
                .optional()
        })
        .map_err(sql("read an approval"))?;
    let Some(mut a) = found else {
        return Ok(None);
    };
    a.votes = votes(c, run, stage)?;
    Ok(Some(a))
}

fn votes(c: &Connection, run: &RunId, stage: &str) -> Result<Vec<Vote>, StateError> {
    query(
        c,
        queries::sqlite::VOTES,
        params![run.0, stage],
        "read votes",
        |r| {
            Ok(Vote {
                subject: r.get(0)?,
                decision: r.get(1)?,
                comment: r.get(2)?,
                at: r.get(3)?,
            })
        },
    )
}

impl AccessStore for SqliteState {
    fn add_token(&self, t: &TokenRecord, hash: &str) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::ADD_TOKEN,
                params![
                    t.id,
                    t.name,
                    t.project,
                    t.role,
                    t.approves.join(","),
                    hash,
                    t.created_at,
                    t.created_by
                ],
            )
            .map(|_| ())
            .map_err(sql("store a token"))
        })
    }

    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StateError> {
        self.with(|c| {
            c.prepare_cached(queries::sqlite::TOKEN_BY_HASH)
                .and_then(|mut s| s.query_row(params![hash], token_from_row).optional())
                .map_err(sql("look a token up"))
        })
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::TOKENS,
                [],
                "list tokens",
                token_from_row,
            )
        })
    }

    fn revoke_token(&self, id_or_name: &str) -> Result<Option<TokenRecord>, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let found: Vec<TokenRecord> = query(
                &tx,
                queries::sqlite::TOKEN_BY_ID_OR_NAME,
                params![id_or_name],
                "find a token",
                token_from_row,
            )?;
            let Some(t) = found.into_iter().next() else {
                return Ok(None);
            };
            tx.execute_cached(queries::sqlite::REVOKE_TOKEN, params![t.id, now()])
                .map_err(sql("revoke a token"))?;
            tx.commit().map_err(sql("commit"))?;
            Ok(Some(t))
        })
    }

    fn append_audit(&self, e: &AuditEntry) -> Result<i64, StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::APPEND_AUDIT,
                params![
                    e.at,
                    e.subject,
                    e.project,
                    e.action,
                    e.resource,
                    e.decision,
                    e.reason,
                    e.before.as_ref().map(|v| v.to_string()),
                    e.after.as_ref().map(|v| v.to_string())
                ],
            )
            .map_err(sql("append to the audit log"))?;
            Ok(c.last_insert_rowid())
        })
    }

    fn protect_alias(&self, alias: &str, role: Option<&str>, by: &str) -> Result<(), StateError> {
        self.with(|c| {
            match role {
                Some(role) => c.execute_cached(
                    queries::sqlite::PROTECT_ALIAS,
                    params![alias, role, now(), by],
                ),
                None => c.execute_cached(queries::sqlite::UNPROTECT_ALIAS, params![alias]),
            }
            .map(|_| ())
            .map_err(sql("protect an alias"))
        })
    }

    fn protected_aliases(&self) -> Result<std::collections::BTreeMap<String, String>, StateError> {
        self.with(|c| {
            let rows: Vec<(String, String)> = query(
                c,
                queries::sqlite::PROTECTED_ALIASES,
                [],
                "read protected aliases",
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok(rows.into_iter().collect())
        })
    }

    fn set_quota(&self, project: &str, q: Quota, by: &str) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::SET_QUOTA,
                params![project, q.max_runs, q.max_gpus, now(), by, q.weight],
            )
            .map(|_| ())
            .map_err(sql("set a quota"))
        })
    }

    fn quotas(&self) -> Result<std::collections::BTreeMap<String, Quota>, StateError> {
        self.with(|c| {
            let rows: Vec<(String, Quota)> =
                query(c, queries::sqlite::QUOTAS, [], "read quotas", |r| {
                    Ok((
                        r.get(0)?,
                        Quota {
                            max_runs: r.get(1)?,
                            max_gpus: r.get(2)?,
                            weight: r.get(3)?,
                        },
                    ))
                })?;
            Ok(rows.into_iter().collect())
        })
    }

    fn audit(&self, since: &str, after: i64, limit: usize) -> Result<Vec<AuditEntry>, StateError> {
        self.with(|c| {
            query(
                c,
                "SELECT rowid, at, subject, project, action, resource, decision, reason, \
                 before_value, after_value FROM audit WHERE at >= ?1 AND rowid > ?2 ORDER BY \
                 rowid LIMIT ?3",
                params![since, after, limit as i64],
                "read the audit log",
                |r| {
                    Ok(AuditEntry {
                        seq: r.get(0)?,
                        at: r.get(1)?,
                        subject: r.get(2)?,
                        project: r.get(3)?,
                        action: r.get(4)?,
                        resource: r.get(5)?,
                        decision: r.get(6)?,
                        reason: r.get(7)?,
                        before: r.get::<_, Option<String>>(8)?.map(json_col),
                        after: r.get::<_, Option<String>>(9)?.map(json_col),
                    })
                },
            )
        })
    }
}

impl ApprovalStore for SqliteState {
    fn request_approval(&self, r: &ApprovalRequest) -> Result<ApprovalRecord, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            tx.execute_cached(
                queries::sqlite::REQUEST_APPROVAL,
                params![
                    r.run.0,
                    r.stage,
                    r.pipeline,
                    r.project,
                    r.role,
                    r.min as i64,
                    r.requested_at,
                    r.timeout_at,
                    r.on_timeout,
                    r.evidence.to_string()
                ],
            )
            .map_err(sql("request an approval"))?;
            let found = read_approval(&tx, &r.run, &r.stage)?;
            tx.commit().map_err(sql("commit"))?;
            found.ok_or_else(|| StateError::UnknownRun(r.run.0.clone()))
        })
    }

    fn approval(&self, run: &RunId, stage: &str) -> Result<Option<ApprovalRecord>, StateError> {
        self.with(|c| read_approval(c, run, stage))
    }

    fn approvals(&self, waiting: bool, limit: usize) -> Result<Vec<ApprovalRecord>, StateError> {
        self.with(|c| {
            let mut found: Vec<ApprovalRecord> = query(
                c,
                queries::sqlite::APPROVALS,
                params![waiting as i64, limit as i64],
                "list approvals",
                request_from_row,
            )?;
            for a in &mut found {
                a.votes = votes(c, &a.request.run, &a.request.stage)?;
            }
            Ok(found)
        })
    }

    fn vote(
        &self,
        run: &RunId,
        stage: &str,
        vote: &Vote,
    ) -> Result<Result<ApprovalRecord, Refusal>, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let Some(a) = read_approval(&tx, run, stage)? else {
                return Ok(Err(Refusal::Unknown));
            };
            if let Some(o) = a.outcome {
                return Ok(Err(Refusal::Decided(o)));
            }
            let phase: Option<String> = tx
                .prepare_cached(queries::sqlite::RUN_PHASE)
                .and_then(|mut s| s.query_row(params![run.0], |r| r.get(0)).optional())
                .map_err(sql("read a run's phase"))?;
            if let Some(p) = phase.filter(|p| ended(p)) {
                return Ok(Err(Refusal::Ended(p)));
            }
            let added = tx
                .execute_cached(
                    queries::sqlite::ADD_VOTE,
                    params![
                        run.0,
                        stage,
                        vote.subject,
                        vote.decision,
                        vote.comment,
                        vote.at
                    ],
                )
                .map_err(sql("record a vote"))?;
            if added == 0 {
                return Ok(Err(Refusal::Voted));
            }
            let votes = votes(&tx, run, stage)?;
            if let Some((outcome, reason)) = tally(a.request.min, &votes) {
                tx.execute_cached(
                    queries::sqlite::DECIDE_APPROVAL,
                    params![run.0, stage, outcome, vote.at, reason],
                )
                .map_err(sql("decide an approval"))?;
            }
            let a = read_approval(&tx, run, stage)?;
            tx.commit().map_err(sql("commit"))?;
            Ok(a.ok_or(Refusal::Unknown))
        })
    }

    fn expire_approvals(&self, now: &str) -> Result<Vec<ApprovalRecord>, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let due: Vec<(String, String)> = query(
                &tx,
                queries::sqlite::EXPIRED_APPROVALS,
                params![now],
                "find timed-out approvals",
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let mut decided = Vec::new();
            for (run, stage) in due {
                let run = RunId(run);
                let Some(a) = read_approval(&tx, &run, &stage)? else {
                    continue;
                };
                let (outcome, reason) = timed_out(&a);
                tx.execute_cached(
                    queries::sqlite::DECIDE_APPROVAL,
                    params![run.0, stage, outcome, now, reason],
                )
                .map_err(sql("decide an approval"))?;
                decided.extend(read_approval(&tx, &run, &stage)?);
            }
            tx.commit().map_err(sql("commit"))?;
            Ok(decided)
        })
    }

    fn decided_waiting_runs(&self) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            query(
                c,
                queries::sqlite::DECIDED_WAITING_RUNS,
                [],
                "find decided runs",
                |r| Ok(RunId(r.get(0)?)),
            )
        })
    }

    fn claim_waiting(&self, run: &RunId) -> Result<bool, StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::CLAIM_WAITING, params![run.0, now()])
                .map(|n| n == 1)
                .map_err(sql("take a waiting run"))
        })
    }
}

impl KeyStore for SqliteState {
    fn claim_key(&self, k: &KeyClaim) -> Result<Option<KeyRecord>, StateError> {
        self.with(|c| {
            let tx = immediate(c)?;
            let claimed = tx
                .execute_cached(
                    queries::sqlite::CLAIM_KEY,
                    params![k.scope, k.key, k.fingerprint, k.run.0, k.claimed_at],
                )
                .map_err(sql("claim a request key"))?;
            let held = match claimed {
                1 => None,
                _ => tx
                    .prepare_cached(queries::sqlite::REQUEST_KEY)
                    .and_then(|mut s| {
                        s.query_row(params![k.scope, k.key], |r| {
                            let status: Option<i64> = r.get(3)?;
                            let body: Option<String> = r.get(4)?;
                            Ok(KeyRecord {
                                fingerprint: r.get(0)?,
                                run: RunId(r.get(1)?),
                                claimed_at: r.get(2)?,
                                answer: status.map(|s| (s as u16, body.unwrap_or_default())),
                            })
                        })
                        .optional()
                    })
                    .map_err(sql("read a request key"))?,
            };
            tx.commit().map_err(sql("claim a request key"))?;
            Ok(held)
        })
    }

    fn answer_key(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> Result<(), StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::ANSWER_KEY,
                params![scope, key, status, body],
            )
            .map(|_| ())
            .map_err(sql("store a request key's answer"))
        })
    }

    fn release_key(&self, scope: &str, key: &str, claimed_at: &str) -> Result<bool, StateError> {
        self.with(|c| {
            c.execute_cached(
                queries::sqlite::RELEASE_KEY,
                params![scope, key, claimed_at],
            )
            .map(|n| n > 0)
            .map_err(sql("release a request key"))
        })
    }

    fn expire_keys(&self, before: &str) -> Result<usize, StateError> {
        self.with(|c| {
            c.execute_cached(queries::sqlite::EXPIRE_KEYS, params![before])
                .map_err(sql("expire request keys"))
        })
    }
}
