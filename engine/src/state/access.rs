//! What people leave in the state store: API tokens (stored hashed), the append-only
//! audit log of every mutating action, and approvals (a stage waiting for people, their
//! votes, and the outcome).

use serde::Serialize;
use serde_json::Value;

use super::{RunId, StateError};

/// An API token as stored: never the token itself, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct TokenRecord {
    /// The public handle (`tok_…`): what `token list` shows and `token revoke` takes.
    pub id: String,
    /// Who holds it: the subject audit entries and votes name (`token:NAME`).
    pub name: String,
    /// The project it acts in (`*`: every project).
    pub project: String,
    /// `viewer`, `launcher`, `editor` or `admin`.
    pub role: String,
    /// The approval roles it holds (`safety`): who may decide approvals asking for them.
    pub approves: Vec<String>,
    pub created_at: String,
    /// Who created it.
    pub created_by: String,
    pub revoked_at: Option<String>,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct AuditEntry {
    /// Its place in the log (0 in an entry not appended yet).
    pub seq: i64,
    pub at: String,
    /// Who: `token:NAME`, `oidc:ISSUER#SUB`, `user:NAME@HOST` (a local command).
    pub subject: String,
    pub project: String,
    /// What was asked: `run.submit`, `run.cancel`, `approval.approve`, `alias.move`, …
    pub action: String,
    /// What it was asked of: `run/RUN`, `model/NAME/alias/ALIAS`, `token/ID`, …
    pub resource: String,
    /// `allowed` or `denied`.
    pub decision: String,
    /// Why: the rule that allowed or denied it, or what went wrong.
    pub reason: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// A stage asking people to decide.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ApprovalRequest {
    pub run: RunId,
    pub stage: String,
    pub pipeline: String,
    pub project: String,
    /// The approval role a decider must hold.
    pub role: String,
    /// How many distinct people must approve.
    pub min: u32,
    pub requested_at: String,
    /// When it times out (RFC 3339), if it does.
    pub timeout_at: Option<String>,
    /// What a timeout means: `reject` or `approve`.
    pub on_timeout: String,
    /// What is shown with the request: upstream stages' outputs and values, lineage.
    pub evidence: Value,
}

/// One person's decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Vote {
    pub subject: String,
    /// `approve` or `reject`.
    pub decision: String,
    pub comment: Option<String>,
    pub at: String,
}

/// An approval as recorded: the request, the votes so far and the outcome once decided.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ApprovalRecord {
    #[serde(flatten)]
    pub request: ApprovalRequest,
    /// `approved`, `rejected`, or `None` while it waits.
    pub outcome: Option<String>,
    pub decided_at: Option<String>,
    /// Why it ended: the deciders, or the timeout.
    pub reason: Option<String>,
    pub votes: Vec<Vote>,
}

impl ApprovalRecord {
    /// Who approved it so far, in the order they did.
    pub fn approvers(&self) -> Vec<&str> {
        self.votes
            .iter()
            .filter(|v| v.decision == "approve")
            .map(|v| v.subject.as_str())
            .collect()
    }
}

/// Why a vote was not counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No stage of that run asks for an approval (yet).
    Unknown,
    /// It was decided already (the outcome).
    Decided(String),
    /// This subject voted already.
    Voted,
    /// The run ended without it (cancelled): its phase.
    Ended(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unknown => f.write_str("no approval is asked for there"),
            Refusal::Decided(o) => write!(f, "it was decided already: {o}"),
            Refusal::Voted => f.write_str("you have decided already"),
            Refusal::Ended(p) => write!(f, "the run ended without it: {p}"),
        }
    }
}

/// The outcome of `votes` on an approval needing `min` approvals: one rejection rejects,
/// `min` approvals approve; otherwise it still waits. With the reason.
pub fn tally(min: u32, votes: &[Vote]) -> Option<(&'static str, String)> {
    if let Some(v) = votes.iter().find(|v| v.decision == "reject") {
        return Some(("rejected", format!("rejected by {}", v.subject)));
    }
    let yes: Vec<&str> = votes
        .iter()
        .filter(|v| v.decision == "approve")
        .map(|v| v.subject.as_str())
        .collect();
    (yes.len() as u32 >= min.max(1))
        .then(|| ("approved", format!("approved by {}", yes.join(", "))))
}

/// What a project may hold at once (`None`: no bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Quota {
    /// Runs in flight (the rest wait, `Pending`, in the order they came).
    pub max_runs: Option<u32>,
    /// GPUs claimed by its runs in flight (a run claims the most any of its stages uses).
    pub max_gpus: Option<u32>,
    /// Its share of the home's GPUs when projects' attempts of one priority contend for
    /// them (default 1): the waiter whose project holds the fewest GPUs for its weight
    /// goes first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// What a timeout decides for `a` (`approved` or `rejected`, as its `on_timeout` says),
/// with the reason.
pub(super) fn timed_out(a: &ApprovalRecord) -> (&'static str, String) {
    let outcome = match a.request.on_timeout.as_str() {
        "approve" => "approved",
        _ => "rejected",
    };
    let yes = a.approvers().len();
    let at = a.request.timeout_at.as_deref().unwrap_or("?");
    (
        outcome,
        format!("timed out at {at} ({yes} of {} approvals)", a.request.min),
    )
}

/// Whether a run in phase `phase` (as stored) has ended: votes no longer count.
pub(super) fn ended(phase: &str) -> bool {
    super::Phase::parse(phase).is_some_and(|p| p.is_terminal())
}

/// A comma-separated column as its items.
pub(super) fn split(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(str::to_owned)
        .collect()
}

/// API tokens and the audit log.
pub trait AccessStore: Send + Sync {
    /// Stores a new token by the SHA-256 of its secret (hex).
    fn add_token(&self, token: &TokenRecord, hash: &str) -> Result<(), StateError>;
    /// The unrevoked token whose secret hashes to `hash`.
    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StateError>;
    /// Every token, revoked ones too, oldest first.
    fn tokens(&self) -> Result<Vec<TokenRecord>, StateError>;
    /// Revokes the token with this id or name; the token as it was, if there was one.
    fn revoke_token(&self, id_or_name: &str) -> Result<Option<TokenRecord>, StateError>;
    /// Appends to the audit log (its `seq` is ignored); returns the new entry's place.
    fn append_audit(&self, entry: &AuditEntry) -> Result<i64, StateError>;
    /// The log from `since` (RFC 3339, inclusive) in order, at most `limit` entries after
    /// place `after`.
    fn audit(&self, since: &str, after: i64, limit: usize) -> Result<Vec<AuditEntry>, StateError>;
    /// Makes registry alias `alias` movable only by people holding approval role `role`
    /// and by runs whose approval by that role passed (`None`: by anyone again).
    fn protect_alias(&self, alias: &str, role: Option<&str>, by: &str) -> Result<(), StateError>;
    /// Protected alias → its approval role.
    fn protected_aliases(&self) -> Result<std::collections::BTreeMap<String, String>, StateError>;
    /// Sets a project's quota (both bounds `None`: none).
    fn set_quota(&self, project: &str, quota: Quota, by: &str) -> Result<(), StateError>;
    /// Project → its quota.
    fn quotas(&self) -> Result<std::collections::BTreeMap<String, Quota>, StateError>;
}

/// A request named by its caller's `Idempotency-Key`, claimed before it is carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyClaim {
    /// Whose key it is (the caller's subject): keys of different callers never meet.
    pub scope: String,
    pub key: String,
    /// The SHA-256 of what was asked (method, path, body): the same key with another
    /// request is refused.
    pub fingerprint: String,
    /// The run the request starts, if it starts one: chosen before it is carried out, so
    /// that a request whose server died half-way is known by its run.
    pub run: RunId,
    pub claimed_at: String,
}

/// A key's claim as stored, and its answer once the request was carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub fingerprint: String,
    pub run: RunId,
    pub claimed_at: String,
    /// The status and body it was answered with; `None` while it is carried out.
    pub answer: Option<(u16, String)>,
}

/// Requests named by an `Idempotency-Key`: a repeated key gets the first answer and
/// carries out nothing.
pub trait KeyStore: Send + Sync {
    /// Claims the key for `claim`: `None` if this call claimed it, else the claim that
    /// holds it (exactly one of any number of callers racing gets `None`).
    fn claim_key(&self, claim: &KeyClaim) -> Result<Option<KeyRecord>, StateError>;
    /// Stores the answer of a claimed key's request.
    fn answer_key(&self, scope: &str, key: &str, status: u16, body: &str)
        -> Result<(), StateError>;
    /// Gives up the unanswered claim made at `claimed_at` (a request that failed in a
    /// way worth retrying, or whose server died); false if it is not that claim.
    fn release_key(&self, scope: &str, key: &str, claimed_at: &str) -> Result<bool, StateError>;
    /// Forgets keys claimed before `before`; how many.
    fn expire_keys(&self, before: &str) -> Result<usize, StateError>;
}

/// Approvals: requested by a stage, decided by people or a timeout.
pub trait ApprovalStore: Send + Sync {
    /// Records the request unless there is one for that stage already; the record.
    fn request_approval(&self, r: &ApprovalRequest) -> Result<ApprovalRecord, StateError>;
    fn approval(&self, run: &RunId, stage: &str) -> Result<Option<ApprovalRecord>, StateError>;
    /// Approvals newest first, only those still waiting with `waiting`.
    fn approvals(&self, waiting: bool, limit: usize) -> Result<Vec<ApprovalRecord>, StateError>;
    /// Counts one person's vote and decides by [`tally`], in one transaction.
    fn vote(
        &self,
        run: &RunId,
        stage: &str,
        vote: &Vote,
    ) -> Result<Result<ApprovalRecord, Refusal>, StateError>;
    /// Decides every waiting approval whose timeout is before `now` as its `on_timeout`
    /// says; those it decided.
    fn expire_approvals(&self, now: &str) -> Result<Vec<ApprovalRecord>, StateError>;
    /// Runs waiting for people whose every approval is decided: ready to go on.
    fn decided_waiting_runs(&self) -> Result<Vec<RunId>, StateError>;
    /// Takes a waiting run to resume it (phase `Running`, no engine yet, a fresh
    /// heartbeat): false when it is not waiting (another process took it).
    fn claim_waiting(&self, run: &RunId) -> Result<bool, StateError>;
    /// Takes `run` to resume it if it waits and every approval it asked for is decided:
    /// false when it still waits for one, is not waiting, or another process took it.
    fn take_decided(&self, run: &RunId) -> Result<bool, StateError> {
        Ok(self.decided_waiting_runs()?.contains(run) && self.claim_waiting(run)?)
    }
}
