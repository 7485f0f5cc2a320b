//! Events in and out of the engine: triggers that start runs when objects land under a
//! store prefix, and notifications of how runs went.
//!
//! - [`Trigger`]: a validated `triggers:` entry. [`discover`] finds objects (a listing
//!   from a durable cursor, and an SQS queue of bucket notifications, [`sqs`]);
//!   [`batch`] decides when waiting objects become a run. The inbox that makes each
//!   object be consumed by exactly one run is in the state store
//!   ([`crate::state::TriggerStore`]).
//! - [`Sink`]: a validated `notify:` entry; [`notify`] renders events (CloudEvents 1.0)
//!   and delivers them from the state store's outbox ([`crate::state::OutboxStore`]).

use std::collections::BTreeMap;
use std::time::Duration;

pub mod batch;
pub mod discover;
mod error;
pub mod notify;
pub mod sigv4;
pub mod sqs;

pub use crate::spec::NotifyEvent;
pub use error::EventError;

/// A validated trigger.
#[derive(Debug, Clone)]
pub struct Trigger {
    pub name: String,
    /// What it watches.
    pub watch: Watch,
    pub min_items: usize,
    pub max_items: usize,
    pub max_wait: Option<Duration>,
    pub group_by: Option<Text>,
    /// Param name → its template over `trigger.*`.
    pub params: BTreeMap<String, Text>,
    pub paused: bool,
}

/// What a trigger watches.
#[derive(Debug, Clone)]
pub enum Watch {
    Objects(Objects),
    After(After),
    Webhook(Hook),
}

/// Signed calls to `serve`'s API. Each idempotency key is an inbox object of its own:
/// URL `webhook://PIPELINE/TRIGGER/KEY`, the call's body as its payload.
#[derive(Debug, Clone)]
pub struct Hook {
    pub secret: Secret,
}

impl Hook {
    /// The inbox URL of a call.
    pub fn url(pipeline: &str, trigger: &str, key: &str) -> String {
        format!("webhook://{pipeline}/{trigger}/{key}")
    }
}

/// Objects under a store prefix.
#[derive(Debug, Clone)]
pub struct Objects {
    /// The store prefix, as written (`s3://fleet/incoming/`); a folder's path (relative
    /// to the pipeline's folder, or absolute) until [`Objects::in_folder`] makes it a
    /// `file://` URL.
    pub source: String,
    /// The glob over keys below the prefix (`match:`).
    pub matcher: Option<globset::GlobMatcher>,
    pub queue: Option<String>,
    pub poll: Duration,
    pub rescan: Duration,
}

impl Objects {
    /// Whether `source` is a folder's path rather than a URL.
    pub fn is_path(source: &str) -> bool {
        !source.contains("://")
    }

    /// `source` as a URL: a relative folder's path under `folder` (the pipeline's), an
    /// absolute one as it is, both `file://`; a URL unchanged.
    pub fn in_folder(&mut self, folder: &std::path::Path) {
        if Objects::is_path(&self.source) {
            // `..` taken away as written: the folder need not exist yet.
            let mut dir = std::path::PathBuf::new();
            for part in folder.join(&self.source).components() {
                match part {
                    std::path::Component::ParentDir => {
                        dir.pop();
                    }
                    std::path::Component::CurDir => {}
                    other => dir.push(other),
                }
            }
            let text = dir.display().to_string();
            let slash = if text.ends_with('/') { "" } else { "/" };
            self.source = format!("file://{text}{slash}");
        }
    }
}

/// Runs of another pipeline ending in one of `phases`. Each is an inbox object of its
/// own: URL `run://PIPELINE/RUN`, ETag its phase.
#[derive(Debug, Clone)]
pub struct After {
    pub pipeline: String,
    pub phases: Vec<crate::phase::Phase>,
}

impl After {
    /// The inbox URL of an upstream run.
    pub fn url(&self, run: &str) -> String {
        format!("run://{}/{run}", self.pipeline)
    }
}

/// The run an `after` trigger's inbox URL names.
pub fn upstream_run(url: &str) -> Option<&str> {
    url.strip_prefix("run://")?
        .rsplit_once('/')
        .map(|(_, run)| run)
}

impl Trigger {
    /// Whether a key below the prefix is one this trigger takes.
    pub fn matches(&self, key: &str) -> bool {
        match &self.watch {
            Watch::Objects(o) => o.matcher.as_ref().is_none_or(|m| m.is_match(key)),
            Watch::After(_) | Watch::Webhook(_) => true,
        }
    }

    /// The group of an object (`""` without `group_by`).
    pub fn group(&self, key: &str) -> String {
        let Some(t) = &self.group_by else {
            return String::new();
        };
        let (dir, name) = match key.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", key),
        };
        t.render(|v| match v {
            "object.key" => Some(key.to_owned()),
            "object.dir" => Some(dir.to_owned()),
            "object.name" => Some(name.to_owned()),
            _ => None,
        })
    }
}

/// The names a trigger's `params` can use.
pub const TRIGGER_VALUES: &[&str] = &[
    "trigger.manifest",
    "trigger.run",
    "trigger.body",
    "trigger.name",
    "trigger.count",
    "trigger.group",
    "trigger.urls",
];
/// The names a `group_by` can use.
pub const OBJECT_VALUES: &[&str] = &["object.key", "object.dir", "object.name"];

/// A small template (`{{ name }}` among text) over a fixed set of names: what trigger
/// params and `group_by` are written in, apart from the stages' templates (whose values a
/// trigger does not have).
#[derive(Debug, Clone, PartialEq)]
pub struct Text {
    parts: Vec<(bool, String)>,
}

impl Text {
    /// Parses `s`, whose references must be among `known`: the first that is not, or
    /// an unclosed `{{`, is the error.
    pub fn parse(s: &str, known: &[&str]) -> Result<Text, EventError> {
        let bad = EventError::Setting;
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push((false, rest[..open].to_owned()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(bad(format!("`{{{{` without `}}}}` in `{s}`")));
            };
            let name = after[..close].trim();
            if !known.contains(&name) {
                return Err(bad(format!(
                    "unknown reference `{name}`; here the references are {}",
                    known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            parts.push((true, name.to_owned()));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push((false, rest.to_owned()));
        }
        Ok(Text { parts })
    }

    /// The text with each reference's value.
    pub fn render(&self, value: impl Fn(&str) -> Option<String>) -> String {
        self.parts
            .iter()
            .map(|(is_ref, t)| match is_ref {
                true => value(t).unwrap_or_default(),
                false => t.clone(),
            })
            .collect()
    }
}

/// A validated notification sink (kept with each notification in the outbox, so a
/// delivery does not depend on the pipeline still being served).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sink {
    /// Its position in `notify:` (`notify[0]`), which names it in the outbox.
    pub name: String,
    pub on: Vec<NotifyEvent>,
    pub to: SinkKind,
}

/// Where a sink delivers. Secrets are named (an environment variable or a file), and
/// read when an event is delivered.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    Webhook {
        url: String,
        secret: Option<Secret>,
    },
    Slack {
        url: Secret,
    },
    Email {
        smtp: String,
        from: String,
        to: Vec<String>,
        auth: Option<Secret>,
    },
}

/// A secret named in a pipeline: its value is never in the pipeline's text.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Secret {
    Env(String),
    File(String),
}

impl Secret {
    /// Its value (a file's first line).
    pub fn read(&self) -> Result<String, EventError> {
        match self {
            Secret::Env(name) => std::env::var(name).map_err(|_| {
                EventError::Setting(format!("the environment variable `{name}` is not set"))
            }),
            Secret::File(path) => std::fs::read_to_string(path)
                .map(|t| t.lines().next().unwrap_or("").trim().to_owned())
                .map_err(|e| EventError::Setting(format!("cannot read {path}: {e}"))),
        }
    }
}

impl NotifyEvent {
    pub const ENDS: [NotifyEvent; 4] = [
        NotifyEvent::Succeeded,
        NotifyEvent::Failed,
        NotifyEvent::Error,
        NotifyEvent::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Started => "started",
            NotifyEvent::Succeeded => "succeeded",
            NotifyEvent::Failed => "failed",
            NotifyEvent::Error => "error",
            NotifyEvent::Cancelled => "cancelled",
            NotifyEvent::Deadline => "deadline",
            NotifyEvent::Waiting => "waiting",
        }
    }

    /// The phase of a run this event is the end of (none for `started`).
    pub fn phase(self) -> Option<crate::phase::Phase> {
        use crate::phase::Phase;
        Some(match self {
            NotifyEvent::Started | NotifyEvent::Deadline => return None,
            NotifyEvent::Waiting => Phase::Waiting,
            NotifyEvent::Succeeded => Phase::Succeeded,
            NotifyEvent::Failed => Phase::Failed,
            NotifyEvent::Error => Phase::Error,
            NotifyEvent::Cancelled => Phase::Cancelled,
        })
    }

    /// The event of a run in `phase` (none for phases that are not an end, but
    /// `Running`, which is its start, and `Waiting`, a wait for people).
    pub fn of_phase(phase: crate::phase::Phase) -> Option<NotifyEvent> {
        use crate::phase::Phase;
        Some(match phase {
            Phase::Running | Phase::Pending => NotifyEvent::Started,
            Phase::Succeeded => NotifyEvent::Succeeded,
            Phase::Failed => NotifyEvent::Failed,
            Phase::Error => NotifyEvent::Error,
            Phase::Cancelled => NotifyEvent::Cancelled,
            Phase::Waiting => NotifyEvent::Waiting,
            Phase::Skipped | Phase::Omitted | Phase::Preempted => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_renders_known_references_and_refuses_others() {
        let t = Text::parse("run-{{ object.dir }}/x", OBJECT_VALUES).unwrap();
        assert_eq!(
            t.render(|v| (v == "object.dir").then(|| "veh7".into())),
            "run-veh7/x"
        );
        let e = Text::parse("{{ params.x }}", OBJECT_VALUES).unwrap_err();
        assert!(
            matches!(&e, EventError::Setting(m) if m.contains("unknown reference `params.x`")),
            "{e}"
        );
        assert!(Text::parse("{{ object.key", OBJECT_VALUES).is_err());
    }
}
