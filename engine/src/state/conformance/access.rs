//! The conformance checks of tokens, the audit log and approvals.

use super::run_record;
use crate::state::{
    ApprovalRequest, AuditEntry, KeyClaim, Phase, Refusal, RunId, StateStore, TokenRecord, Vote,
};

fn token(id: &str, name: &str) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        name: name.into(),
        project: "perception".into(),
        role: "launcher".into(),
        approves: vec!["safety".into(), "ops".into()],
        created_at: "2026-01-01T00:00:00.000Z".into(),
        created_by: "user:root@host".into(),
        revoked_at: None,
    }
}

/// Tokens are found by hash until revoked; the audit log reads back in order from a time.
pub(super) fn tokens_and_audit(s: &dyn StateStore) {
    s.add_token(&token("tok_a", "alice"), "h1").unwrap();
    s.add_token(&token("tok_b", "bob"), "h2").unwrap();
    // The same secret twice is refused (hashes are unique).
    assert!(s.add_token(&token("tok_c", "carol"), "h1").is_err());
    let found = s.token_by_hash("h1").unwrap().unwrap();
    assert_eq!(found, token("tok_a", "alice"));
    assert_eq!(s.token_by_hash("nope").unwrap(), None);
    assert_eq!(s.revoke_token("bob").unwrap().unwrap().id, "tok_b");
    assert_eq!(s.revoke_token("tok_b").unwrap(), None, "revoked once");
    assert_eq!(s.token_by_hash("h2").unwrap(), None);
    let all = s.tokens().unwrap();
    assert_eq!(all.len(), 2);
    assert!(all[1].revoked_at.is_some());

    let entry = |at: &str, action: &str| AuditEntry {
        seq: 0,
        at: at.into(),
        subject: "token:alice".into(),
        project: "perception".into(),
        action: action.into(),
        resource: "run/r1".into(),
        decision: "allowed".into(),
        reason: None,
        before: Some(serde_json::json!({"v": 1})),
        after: None,
    };
    let a = s
        .append_audit(&entry("2026-01-01T00:00:01.000Z", "run.submit"))
        .unwrap();
    let b = s
        .append_audit(&entry("2026-01-01T00:00:02.000Z", "run.cancel"))
        .unwrap();
    assert!(b > a);
    let log = s.audit("2026-01-01T00:00:00.000Z", 0, 10).unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!((log[0].seq, log[1].seq), (a, b));
    assert_eq!(log[0].before, Some(serde_json::json!({"v": 1})));
    assert_eq!(log[1].action, "run.cancel");
    assert_eq!(s.audit("2026-01-01T00:00:02.000Z", 0, 10).unwrap().len(), 1);
    assert_eq!(
        s.audit("2026-01-01T00:00:00.000Z", a, 10).unwrap()[0].seq,
        b
    );
    assert_eq!(s.audit("2026-01-01T00:00:00.000Z", 0, 1).unwrap().len(), 1);

    s.protect_alias("production", Some("ops"), "user:a")
        .unwrap();
    s.protect_alias("production", Some("safety"), "user:a")
        .unwrap();
    s.protect_alias("staging", Some("ops"), "user:a").unwrap();
    s.protect_alias("staging", None, "user:a").unwrap();
    let p = s.protected_aliases().unwrap();
    assert_eq!(
        p.into_iter().collect::<Vec<_>>(),
        [("production".to_owned(), "safety".to_owned())]
    );

    let q = crate::state::Quota {
        max_runs: Some(2),
        max_gpus: None,
        weight: Some(3),
    };
    s.set_quota("perception", crate::state::Quota::default(), "user:a")
        .unwrap();
    s.set_quota("perception", q, "user:a").unwrap();
    assert_eq!(s.quotas().unwrap().get("perception"), Some(&q));
}

fn request(run: &RunId, stage: &str, min: u32, timeout_at: Option<&str>) -> ApprovalRequest {
    ApprovalRequest {
        run: run.clone(),
        stage: stage.into(),
        pipeline: "p".into(),
        project: "default".into(),
        role: "safety".into(),
        min,
        requested_at: "2026-01-01T00:00:00.000Z".into(),
        timeout_at: timeout_at.map(str::to_owned),
        on_timeout: "reject".into(),
        evidence: serde_json::json!({"accuracy": 0.9}),
    }
}

fn vote(who: &str, decision: &str) -> Vote {
    Vote {
        subject: who.into(),
        decision: decision.into(),
        comment: Some(format!("{who} says {decision}")),
        at: "2026-01-01T00:00:05.000Z".into(),
    }
}

/// An approval is requested once, needs `min` distinct approvers, is rejected by one
/// rejection, times out once, and a waiting run is taken to resume by one process.
pub(super) fn approvals(s: &dyn StateStore) {
    let mut run = run_record("ap1");
    run.phase = Phase::Waiting;
    run.project = "perception".into();
    s.create_run(&run).unwrap();
    let id = run.id.clone();
    assert_eq!(s.run(&id).unwrap().project, "perception");
    let of = |projects: &[&str]| {
        let filter = crate::state::RunFilter {
            projects: Some(projects.iter().map(|p| p.to_string()).collect()),
            ..Default::default()
        };
        let found = s.find_runs(&filter, 100).unwrap();
        found.into_iter().map(|r| r.id.0).collect::<Vec<_>>()
    };
    assert_eq!(of(&["perception", "planning"]), std::slice::from_ref(&id.0));
    assert!(of(&[]).is_empty());
    assert!(!of(&["default"]).contains(&id.0));
    let first = s.request_approval(&request(&id, "gate", 2, None)).unwrap();
    assert_eq!(first.outcome, None);
    // Asked again (a resumed run reaching the stage again): the first request stands.
    let again = s.request_approval(&request(&id, "gate", 5, None)).unwrap();
    assert_eq!(again.request.min, 2);
    assert_eq!(
        s.vote(&id, "other", &vote("a", "approve")).unwrap(),
        Err(Refusal::Unknown)
    );
    let one = s.vote(&id, "gate", &vote("a", "approve")).unwrap().unwrap();
    assert_eq!((one.outcome.as_deref(), one.votes.len()), (None, 1));
    assert_eq!(
        s.vote(&id, "gate", &vote("a", "approve")).unwrap(),
        Err(Refusal::Voted)
    );
    assert!(s.decided_waiting_runs().unwrap().is_empty());
    assert_eq!(s.approvals(true, 10).unwrap().len(), 1);
    let two = s.vote(&id, "gate", &vote("b", "approve")).unwrap().unwrap();
    assert_eq!(two.outcome.as_deref(), Some("approved"));
    assert_eq!(two.reason.as_deref(), Some("approved by a, b"));
    assert_eq!(
        s.vote(&id, "gate", &vote("c", "reject")).unwrap(),
        Err(Refusal::Decided("approved".into()))
    );
    assert!(s.approvals(true, 10).unwrap().is_empty());
    assert_eq!(s.approvals(false, 10).unwrap().len(), 1);
    assert_eq!(s.decided_waiting_runs().unwrap(), vec![id.clone()]);
    assert!(s.claim_waiting(&id).unwrap());
    assert!(!s.claim_waiting(&id).unwrap(), "taken once");
    assert_eq!(s.run(&id).unwrap().phase, Phase::Running);

    // A run that ended (cancelled while waiting) takes no votes.
    let mut run = run_record("ap4");
    run.phase = Phase::Waiting;
    s.create_run(&run).unwrap();
    s.request_approval(&request(&run.id, "gate", 1, None))
        .unwrap();
    s.finish_run(&run.id, Phase::Cancelled, None).unwrap();
    assert_eq!(
        s.vote(&run.id, "gate", &vote("a", "approve")).unwrap(),
        Err(Refusal::Ended("Cancelled".into()))
    );

    // One rejection rejects.
    let mut run = run_record("ap2");
    run.phase = Phase::Waiting;
    s.create_run(&run).unwrap();
    s.request_approval(&request(&run.id, "gate", 2, None))
        .unwrap();
    let no = s
        .vote(&run.id, "gate", &vote("a", "reject"))
        .unwrap()
        .unwrap();
    assert_eq!(no.outcome.as_deref(), Some("rejected"));

    // A timeout decides as `on_timeout` says, once.
    let mut run = run_record("ap3");
    run.phase = Phase::Waiting;
    s.create_run(&run).unwrap();
    let at = "2026-01-01T01:00:00.000Z";
    s.request_approval(&request(&run.id, "gate", 1, Some(at)))
        .unwrap();
    assert!(s
        .expire_approvals("2026-01-01T00:59:59.000Z")
        .unwrap()
        .is_empty());
    let expired = s.expire_approvals("2026-01-01T01:00:01.000Z").unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].outcome.as_deref(), Some("rejected"));
    assert!(expired[0]
        .reason
        .as_deref()
        .unwrap()
        .starts_with("timed out"));
    assert!(s
        .expire_approvals("2026-01-01T02:00:00.000Z")
        .unwrap()
        .is_empty());
}

/// A key is claimed once per caller; its answer reads back; an unanswered claim is given
/// up only by the claim that made it; old keys expire.
pub(super) fn request_keys(s: &dyn StateStore) {
    let claim = |scope: &str, fingerprint: &str, run: &str, at: &str| KeyClaim {
        scope: scope.into(),
        key: "k-1".into(),
        fingerprint: fingerprint.into(),
        run: RunId(run.into()),
        claimed_at: at.into(),
    };
    let first = claim("token:alice", "f1", "run-1", "2026-01-01T00:00:00.000Z");
    assert_eq!(s.claim_key(&first).unwrap(), None, "claimed");
    let again = s
        .claim_key(&claim(
            "token:alice",
            "f2",
            "run-2",
            "2026-01-01T00:00:01.000Z",
        ))
        .unwrap()
        .expect("held by the first");
    assert_eq!(
        (again.fingerprint.as_str(), again.run.0.as_str()),
        ("f1", "run-1")
    );
    assert_eq!(again.answer, None, "not answered yet");
    let other = claim("token:bob", "f1", "run-3", "2026-01-01T00:00:00.000Z");
    assert_eq!(
        s.claim_key(&other).unwrap(),
        None,
        "another caller's key of the same name"
    );
    assert!(!s
        .release_key("token:alice", "k-1", "2026-01-01T00:00:09.000Z")
        .unwrap());
    s.answer_key("token:alice", "k-1", 201, "{\"run\":\"run-1\"}")
        .unwrap();
    let answered = s.claim_key(&first).unwrap().unwrap();
    assert_eq!(
        answered.answer,
        Some((201, "{\"run\":\"run-1\"}".to_owned()))
    );
    assert!(
        !s.release_key("token:alice", "k-1", &first.claimed_at)
            .unwrap(),
        "an answered key stays"
    );
    assert!(s
        .release_key("token:bob", "k-1", &other.claimed_at)
        .unwrap());
    assert_eq!(
        s.claim_key(&other).unwrap(),
        None,
        "released: claimed again"
    );
    assert_eq!(s.expire_keys("2026-01-01T00:00:00.500Z").unwrap(), 2);
    assert_eq!(s.claim_key(&first).unwrap(), None, "expired: claimed again");
}
