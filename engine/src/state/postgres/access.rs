//! The PostgreSQL store's tokens, audit log and approvals ([`AccessStore`],
//! [`ApprovalStore`]): the SQLite store's statements, the approval row locked while a vote
//! is counted.

use postgres::{GenericClient, Row};

use super::super::access::{
    ended, split, tally, timed_out, AccessStore, ApprovalRecord, ApprovalRequest, ApprovalStore,
    AuditEntry, KeyClaim, KeyRecord, KeyStore, Quota, Refusal, TokenRecord, Vote,
};
use super::{exec, json_col, now, queries, row, rows, PostgresState, RunId, StateError};

fn token_from_row(r: &Row) -> TokenRecord {
    TokenRecord {
        id: r.get(0),
        name: r.get(1),
        project: r.get(2),
        role: r.get(3),
        approves: split(&r.get::<_, String>(4)),
        created_at: r.get(5),
        created_by: r.get(6),
        revoked_at: r.get(7),
    }
}

fn request_from_row(r: &Row) -> ApprovalRecord {
    ApprovalRecord {
        request: ApprovalRequest {
            run: RunId(r.get(0)),
            stage: r.get(1),
            pipeline: r.get(2),
            project: r.get(3),
            role: r.get(4),
            min: r.get::<_, i64>(5).clamp(0, u32::MAX as i64) as u32,
            requested_at: r.get(6),
            timeout_at: r.get(7),
            on_timeout: r.get(8),
            evidence: json_col(r.get(9)),
        },
        outcome: r.get(10),
        decided_at: r.get(11),
        reason: r.get(12),
        votes: Vec::new(),
    }
}

/// One approval with its votes (its row locked until the transaction ends with `lock`).
fn read_approval(
    c: &mut impl GenericClient,
    run: &RunId,
    stage: &str,
    lock: bool,
) -> Result<Option<ApprovalRecord>, StateError> {
    let q = match lock {
        true => format!("{} FOR UPDATE", queries::pg::APPROVAL),
        false => queries::pg::APPROVAL.to_owned(),
    };
    let Some(mut a) = row(
        c,
        &q,
        &[&run.0, &stage],
        "read an approval",
        request_from_row,
    )?
    else {
        return Ok(None);
    };
    a.votes = votes(c, run, stage)?;
    Ok(Some(a))
}

fn votes(c: &mut impl GenericClient, run: &RunId, stage: &str) -> Result<Vec<Vote>, StateError> {
    rows(
        c,
        queries::pg::VOTES,
        &[&run.0, &stage],
        "read votes",
        |r| Vote {
            subject: r.get(0),
            decision: r.get(1),
            comment: r.get(2),
            at: r.get(3),
        },
    )
}

impl AccessStore for PostgresState {
    fn add_token(&self, t: &TokenRecord, hash: &str) -> Result<(), StateError> {
        let approves = t.approves.join(",");
        self.with(|c| {
            exec(
                c,
                queries::pg::ADD_TOKEN,
                &[
                    &t.id,
                    &t.name,
                    &t.project,
                    &t.role,
                    &approves,
                    &hash,
                    &t.created_at,
                    &t.created_by,
                ],
                "store a token",
            )
            .map(|_| ())
        })
    }

    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StateError> {
        self.with(|c| {
            row(
                c,
                queries::pg::TOKEN_BY_HASH,
                &[&hash],
                "look a token up",
                token_from_row,
            )
        })
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>, StateError> {
        self.with(|c| rows(c, queries::pg::TOKENS, &[], "list tokens", token_from_row))
    }

    fn revoke_token(&self, id_or_name: &str) -> Result<Option<TokenRecord>, StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            let found = rows(
                &mut tx,
                &format!("{} FOR UPDATE", queries::pg::TOKEN_BY_ID_OR_NAME),
                &[&id_or_name],
                "find a token",
                token_from_row,
            )?;
            let Some(t) = found.into_iter().next() else {
                return Ok(None);
            };
            exec(
                &mut tx,
                queries::pg::REVOKE_TOKEN,
                &[&t.id, &now()],
                "revoke a token",
            )?;
            tx.commit().map_err(super::db("commit"))?;
            Ok(Some(t))
        })
    }

    fn append_audit(&self, e: &AuditEntry) -> Result<i64, StateError> {
        let (before, after) = (
            e.before.as_ref().map(|v| v.to_string()),
            e.after.as_ref().map(|v| v.to_string()),
        );
        self.with(|c| {
            let seq = row(
                c,
                &format!("{} RETURNING seq", queries::pg::APPEND_AUDIT),
                &[
                    &e.at,
                    &e.subject,
                    &e.project,
                    &e.action,
                    &e.resource,
                    &e.decision,
                    &e.reason,
                    &before,
                    &after,
                ],
                "append to the audit log",
                |r| r.get::<_, i64>(0),
            )?;
            Ok(seq.unwrap_or(0))
        })
    }

    fn protect_alias(&self, alias: &str, role: Option<&str>, by: &str) -> Result<(), StateError> {
        self.with(|c| {
            match role {
                Some(role) => exec(
                    c,
                    queries::pg::PROTECT_ALIAS,
                    &[&alias, &role, &now(), &by],
                    "protect an alias",
                ),
                None => exec(
                    c,
                    queries::pg::UNPROTECT_ALIAS,
                    &[&alias],
                    "unprotect an alias",
                ),
            }
            .map(|_| ())
        })
    }

    fn protected_aliases(&self) -> Result<std::collections::BTreeMap<String, String>, StateError> {
        self.with(|c| {
            let rows = rows(
                c,
                queries::pg::PROTECTED_ALIASES,
                &[],
                "read protected aliases",
                |r| (r.get::<_, String>(0), r.get::<_, String>(1)),
            )?;
            Ok(rows.into_iter().collect())
        })
    }

    fn set_quota(&self, project: &str, q: Quota, by: &str) -> Result<(), StateError> {
        let (runs, gpus) = (q.max_runs.map(i64::from), q.max_gpus.map(i64::from));
        let weight = q.weight.map(i64::from);
        self.with(|c| {
            exec(
                c,
                queries::pg::SET_QUOTA,
                &[&project, &runs, &gpus, &now(), &by, &weight],
                "set a quota",
            )
            .map(|_| ())
        })
    }

    fn quotas(&self) -> Result<std::collections::BTreeMap<String, Quota>, StateError> {
        let bound = |v: Option<i64>| v.map(|n| n.clamp(0, u32::MAX as i64) as u32);
        self.with(|c| {
            let rows = rows(c, queries::pg::QUOTAS, &[], "read quotas", |r| {
                (
                    r.get::<_, String>(0),
                    Quota {
                        max_runs: bound(r.get(1)),
                        max_gpus: bound(r.get(2)),
                        weight: bound(r.get(3)),
                    },
                )
            })?;
            Ok(rows.into_iter().collect())
        })
    }

    fn audit(&self, since: &str, after: i64, limit: usize) -> Result<Vec<AuditEntry>, StateError> {
        self.with(|c| {
            rows(
                c,
                "SELECT seq, at, subject, project, action, resource, decision, reason, \
                 before_value, after_value FROM audit WHERE at >= $1 AND seq > $2 ORDER BY seq \
                 LIMIT $3",
                &[&since, &after, &(limit as i64)],
                "read the audit log",
                |r| AuditEntry {
                    seq: r.get(0),
                    at: r.get(1),
                    subject: r.get(2),
                    project: r.get(3),
                    action: r.get(4),
                    resource: r.get(5),
                    decision: r.get(6),
                    reason: r.get(7),
                    before: r.get::<_, Option<String>>(8).map(json_col),
                    after: r.get::<_, Option<String>>(9).map(json_col),
                },
            )
        })
    }
}

impl ApprovalStore for PostgresState {
    fn request_approval(&self, r: &ApprovalRequest) -> Result<ApprovalRecord, StateError> {
        let (min, evidence) = (r.min as i64, r.evidence.to_string());
        self.with(|c| {
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            exec(
                &mut tx,
                queries::pg::REQUEST_APPROVAL,
                &[
                    &r.run.0,
                    &r.stage,
                    &r.pipeline,
                    &r.project,
                    &r.role,
                    &min,
                    &r.requested_at,
                    &r.timeout_at,
                    &r.on_timeout,
                    &evidence,
                ],
                "request an approval",
            )?;
            let found = read_approval(&mut tx, &r.run, &r.stage, false)?;
            tx.commit().map_err(super::db("commit"))?;
            found.ok_or_else(|| StateError::UnknownRun(r.run.0.clone()))
        })
    }

    fn approval(&self, run: &RunId, stage: &str) -> Result<Option<ApprovalRecord>, StateError> {
        self.with(|c| read_approval(c, run, stage, false))
    }

    fn approvals(&self, waiting: bool, limit: usize) -> Result<Vec<ApprovalRecord>, StateError> {
        self.with(|c| {
            let mut found = rows(
                c,
                queries::pg::APPROVALS,
                &[&(waiting as i64), &(limit as i64)],
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
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            let Some(a) = read_approval(&mut tx, run, stage, true)? else {
                return Ok(Err(Refusal::Unknown));
            };
            if let Some(o) = a.outcome {
                return Ok(Err(Refusal::Decided(o)));
            }
            let phase = row(
                &mut tx,
                queries::pg::RUN_PHASE,
                &[&run.0],
                "read a run's phase",
                |r| r.get::<_, String>(0),
            )?;
            if let Some(p) = phase.filter(|p| ended(p)) {
                return Ok(Err(Refusal::Ended(p)));
            }
            let added = exec(
                &mut tx,
                queries::pg::ADD_VOTE,
                &[
                    &run.0,
                    &stage,
                    &vote.subject,
                    &vote.decision,
                    &vote.comment,
                    &vote.at,
                ],
                "record a vote",
            )?;
            if added == 0 {
                return Ok(Err(Refusal::Voted));
            }
            let votes = votes(&mut tx, run, stage)?;
            if let Some((outcome, reason)) = tally(a.request.min, &votes) {
                exec(
                    &mut tx,
                    queries::pg::DECIDE_APPROVAL,
                    &[&run.0, &stage, &outcome, &vote.at, &reason],
                    "decide an approval",
                )?;
            }
            let a = read_approval(&mut tx, run, stage, false)?;
            tx.commit().map_err(super::db("commit"))?;
            Ok(a.ok_or(Refusal::Unknown))
        })
    }

    fn expire_approvals(&self, now: &str) -> Result<Vec<ApprovalRecord>, StateError> {
        self.with(|c| {
            let mut tx = c.transaction().map_err(super::db("begin"))?;
            let due = rows(
                &mut tx,
                &format!("{} FOR UPDATE SKIP LOCKED", queries::pg::EXPIRED_APPROVALS),
                &[&now],
                "find timed-out approvals",
                |r| (RunId(r.get(0)), r.get::<_, String>(1)),
            )?;
            let mut decided = Vec::new();
            for (run, stage) in due {
                let Some(a) = read_approval(&mut tx, &run, &stage, false)? else {
                    continue;
                };
                let (outcome, reason) = timed_out(&a);
                exec(
                    &mut tx,
                    queries::pg::DECIDE_APPROVAL,
                    &[&run.0, &stage, &outcome, &now, &reason],
                    "decide an approval",
                )?;
                decided.extend(read_approval(&mut tx, &run, &stage, false)?);
            }
            tx.commit().map_err(super::db("commit"))?;
            Ok(decided)
        })
    }

    fn decided_waiting_runs(&self) -> Result<Vec<RunId>, StateError> {
        self.with(|c| {
            rows(
                c,
                queries::pg::DECIDED_WAITING_RUNS,
                &[],
                "find decided runs",
                |r| RunId(r.get(0)),
            )
        })
    }

    fn claim_waiting(&self, run: &RunId) -> Result<bool, StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::CLAIM_WAITING,
                &[&run.0, &now()],
                "take a waiting run",
            )
            .map(|n| n == 1)
        })
    }
}

impl KeyStore for PostgresState {
    fn claim_key(&self, k: &KeyClaim) -> Result<Option<KeyRecord>, StateError> {
        self.with(|c| {
            // A claim released between the insert and the read is claimed again.
            for _ in 0..3 {
                let args: [&(dyn postgres::types::ToSql + Sync); 5] =
                    [&k.scope, &k.key, &k.fingerprint, &k.run.0, &k.claimed_at];
                if exec(c, queries::pg::CLAIM_KEY, &args, "claim a request key")? == 1 {
                    return Ok(None);
                }
                let held = row(
                    c,
                    queries::pg::REQUEST_KEY,
                    &[&k.scope, &k.key],
                    "read a request key",
                    |r| KeyRecord {
                        fingerprint: r.get(0),
                        run: RunId(r.get(1)),
                        claimed_at: r.get(2),
                        answer: r
                            .get::<_, Option<i64>>(3)
                            .map(|s| (s as u16, r.get::<_, Option<String>>(4).unwrap_or_default())),
                    },
                )?;
                if held.is_some() {
                    return Ok(held);
                }
            }
            Err(StateError::Database {
                what: format!("claim request key `{}`", k.key),
                source: "claimed and released again and again".into(),
            })
        })
    }

    fn answer_key(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> Result<(), StateError> {
        let status = i64::from(status);
        self.with(|c| {
            exec(
                c,
                queries::pg::ANSWER_KEY,
                &[&scope, &key, &status, &body],
                "store a request key's answer",
            )
            .map(|_| ())
        })
    }

    fn release_key(&self, scope: &str, key: &str, claimed_at: &str) -> Result<bool, StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::RELEASE_KEY,
                &[&scope, &key, &claimed_at],
                "release a request key",
            )
            .map(|n| n > 0)
        })
    }

    fn expire_keys(&self, before: &str) -> Result<usize, StateError> {
        self.with(|c| {
            exec(
                c,
                queries::pg::EXPIRE_KEYS,
                &[&before],
                "expire request keys",
            )
            .map(|n| n as usize)
        })
    }
}
