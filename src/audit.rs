//! The local user, who every command run on this machine's state store acts as, and the
//! audit log's entries of what they did: a leaf the commands that change a home share.

use drivetrain_engine::access::{Grant, Role, Subject};
use drivetrain_engine::state::{AuditEntry, StateStore};

/// The local user: every role and approval role in every project.
pub(crate) fn local_user() -> Subject {
    Subject {
        name: format!("user:{}", drivetrain_engine::step::who()),
        grants: vec![Grant {
            project: "*".into(),
            role: Role::Admin,
            approves: vec!["*".into()],
        }],
    }
}

/// Appends what the local user did to the audit log.
pub(crate) fn audit_local(
    state: &dyn StateStore,
    project: &str,
    action: &str,
    resource: String,
    after: serde_json::Value,
) -> anyhow::Result<()> {
    state.append_audit(&AuditEntry {
        seq: 0,
        at: drivetrain_engine::state::now(),
        subject: local_user().name,
        project: project.into(),
        action: action.into(),
        resource,
        decision: "allowed".into(),
        reason: Some("a command on this machine's state store".into()),
        before: None,
        after: Some(after),
    })?;
    Ok(())
}
