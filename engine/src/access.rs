//! Who may do what: roles per project, the verbs of the API and the CLI, and the decision
//! with its reason. Pure: no I/O, no clock.
//!
//! A subject (a token's holder, an OpenID Connect user, the local user) holds grants: in a
//! project (`*`: every project), one role of the ladder `viewer < launcher < editor <
//! admin`, and any number of approval roles (`safety`): who may decide approvals and move
//! aliases that ask for them. Each verb needs a least role of the ladder; approving needs
//! the named approval role instead.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The project of a pipeline that names none: a laptop user never meets any other.
pub const DEFAULT_PROJECT: &str = "default";

/// The ladder of roles in a project: each can do what the ones below it can.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads runs, logs, lineage, the registry, schedules and triggers.
    Viewer,
    /// Also starts runs of served pipelines, reruns, retries and cancels them.
    Launcher,
    /// Also runs posted YAML (any command), registers, suspends and resumes schedules and
    /// triggers, and moves aliases that ask for no approval role.
    Editor,
    /// Also manages tokens and reads the audit log.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Launcher, Role::Editor, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Launcher => "launcher",
            Role::Editor => "editor",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a request or a command asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Verb {
    /// Read anything of the project.
    Read,
    /// Start a run of a served pipeline, rerun or retry one, fire a schedule now.
    Launch,
    /// Stop a run.
    Cancel,
    /// Run a posted pipeline: any command, as the server's user.
    Author,
    /// Register, suspend and resume schedules; pause and resume triggers.
    Configure,
    /// Move or roll back a registry alias.
    MoveAlias,
    /// Decide an approval (needs its approval role, not a rung of the ladder).
    Approve,
    /// Create, list and revoke tokens.
    ManageTokens,
    /// Read the audit log.
    ReadAudit,
}

impl Verb {
    pub const ALL: [Verb; 9] = [
        Verb::Read,
        Verb::Launch,
        Verb::Cancel,
        Verb::Author,
        Verb::Configure,
        Verb::MoveAlias,
        Verb::Approve,
        Verb::ManageTokens,
        Verb::ReadAudit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Launch => "launch",
            Verb::Cancel => "cancel",
            Verb::Author => "author",
            Verb::Configure => "configure",
            Verb::MoveAlias => "move-alias",
            Verb::Approve => "approve",
            Verb::ManageTokens => "manage-tokens",
            Verb::ReadAudit => "read-audit",
        }
    }

    pub fn parse(s: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The least role of the ladder that may do it. Approving, and moving an alias that
    /// asks for an approval role, need that role instead (see [`decide`]).
    pub fn least(self) -> Role {
        match self {
            Verb::Read | Verb::Approve => Role::Viewer,
            Verb::Launch | Verb::Cancel => Role::Launcher,
            Verb::Author | Verb::Configure | Verb::MoveAlias => Role::Editor,
            Verb::ManageTokens | Verb::ReadAudit => Role::Admin,
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a route of the API asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Nothing: health checks.
    Open,
    /// A signature over the body instead of a bearer token (webhook triggers).
    Signed,
    /// A bearer token whose subject may do this verb.
    Need(Verb),
}

/// A role in a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Grant {
    /// The project (`*`: every project).
    pub project: String,
    pub role: Role,
    /// Approval roles held there (`safety`).
    pub approves: Vec<String>,
}

/// Who asks, and what they hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Subject {
    /// How the audit log and votes name them: `token:NAME`, `oidc:ISSUER#SUB`,
    /// `user:NAME@HOST`.
    pub name: String,
    pub grants: Vec<Grant>,
}

/// A decision, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

impl Subject {
    /// The best role held in `project` (a grant for `*` counts in every project).
    pub fn role_in(&self, project: &str) -> Option<Role> {
        self.grants_in(project).map(|g| g.role).max()
    }

    fn grants_in<'a>(&'a self, project: &'a str) -> impl Iterator<Item = &'a Grant> + 'a {
        self.grants
            .iter()
            .filter(move |g| g.project == "*" || g.project == project)
    }

    /// The projects where the ladder allows `verb` (`None`: every project, through a
    /// grant for `*`).
    pub fn projects_for(&self, verb: Verb) -> Option<std::collections::BTreeSet<String>> {
        let mut out = std::collections::BTreeSet::new();
        for g in self.grants.iter().filter(|g| g.role >= verb.least()) {
            if g.project == "*" {
                return None;
            }
            out.insert(g.project.clone());
        }
        Some(out)
    }

    /// Whether `verb` is allowed in `project` by these grants (`project` in `projects`).
    pub fn may(projects: &Option<std::collections::BTreeSet<String>>, project: &str) -> bool {
        projects.as_ref().is_none_or(|p| p.contains(project))
    }

    /// Whether an approval role `name` is held in `project` (`*`: every one).
    pub fn approves(&self, project: &str, name: &str) -> bool {
        self.grants_in(project)
            .any(|g| g.approves.iter().any(|a| a == name || a == "*"))
    }
}

/// Whether `subject` may do `verb` in `project`. `approval` is the approval role the
/// resource asks for: an approval's, or a protected alias's (`None`: none asked).
pub fn decide(subject: &Subject, verb: Verb, project: &str, approval: Option<&str>) -> Decision {
    let deny = |reason: String| Decision {
        allowed: false,
        reason,
    };
    let Some(role) = subject.role_in(project) else {
        return deny(format!(
            "{} holds no role in project `{project}`",
            subject.name
        ));
    };
    // An approval, or an alias that asks for an approval role: the role decides, the
    // ladder does not (an admin without it may not; a viewer with it may).
    let wanted = approval.filter(|_| matches!(verb, Verb::Approve | Verb::MoveAlias));
    if let Some(wanted) = wanted {
        return match subject.approves(project, wanted) {
            true => Decision {
                allowed: true,
                reason: format!(
                    "{} holds the approval role `{wanted}` in project `{project}`",
                    subject.name
                ),
            },
            false => deny(format!(
                "{verb} here needs the approval role `{wanted}` in project `{project}`; {} \
                 does not hold it",
                subject.name
            )),
        };
    }
    if verb == Verb::Approve {
        return deny("an approval names the role that decides it".into());
    }
    let reason = format!(
        "{verb} needs {} in project `{project}`; {} is {role} there",
        verb.least(),
        subject.name
    );
    Decision {
        allowed: role >= verb.least(),
        reason,
    }
}

/// Whether `subject` may do `verb` somewhere: for a request whose project its handler
/// decides item by item (a list filtered to what the caller may read, a posted pipeline).
pub fn decide_anywhere(subject: &Subject, verb: Verb) -> Decision {
    let allowed = subject.projects_for(verb).is_none_or(|p| !p.is_empty());
    Decision {
        allowed,
        reason: match allowed {
            true => format!("{verb} is allowed in some project of {}", subject.name),
            false => format!(
                "{verb} needs {} in some project; {} holds it in none",
                verb.least(),
                subject.name
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(project: &str, role: Role, approves: &[&str]) -> Subject {
        Subject {
            name: "token:t".into(),
            grants: vec![Grant {
                project: project.into(),
                role,
                approves: approves.iter().map(|s| s.to_string()).collect(),
            }],
        }
    }

    #[test]
    fn each_rung_may_do_what_the_ones_below_may() {
        for role in Role::ALL {
            let s = subject("p", role, &[]);
            for verb in Verb::ALL.into_iter().filter(|v| *v != Verb::Approve) {
                let d = decide(&s, verb, "p", None);
                assert_eq!(
                    d.allowed,
                    role >= verb.least(),
                    "{role} {verb}: {}",
                    d.reason
                );
                // Another project: nothing.
                assert!(!decide(&s, verb, "q", None).allowed);
            }
        }
        // `*` holds in every project.
        assert!(decide(&subject("*", Role::Viewer, &[]), Verb::Read, "q", None).allowed);
    }

    #[test]
    fn approving_needs_the_named_approval_role_not_a_rung() {
        let admin = subject("p", Role::Admin, &[]);
        let d = decide(&admin, Verb::Approve, "p", Some("safety"));
        assert!(!d.allowed);
        assert!(d.reason.contains("`safety`"), "{}", d.reason);
        let safety = subject("p", Role::Viewer, &["safety"]);
        assert!(decide(&safety, Verb::Approve, "p", Some("safety")).allowed);
        assert!(!decide(&safety, Verb::Approve, "q", Some("safety")).allowed);
        assert!(!decide(&safety, Verb::Approve, "p", Some("ops")).allowed);
        // A protected alias: an editor without the role may not move it, with it may.
        let editor = subject("p", Role::Editor, &[]);
        assert!(decide(&editor, Verb::MoveAlias, "p", None).allowed);
        assert!(!decide(&editor, Verb::MoveAlias, "p", Some("safety")).allowed);
        let both = subject("p", Role::Viewer, &["safety"]);
        assert!(decide(&both, Verb::MoveAlias, "p", Some("safety")).allowed);
    }
}
