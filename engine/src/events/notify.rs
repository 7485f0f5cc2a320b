//! Notifications: a run's start and end as CloudEvents 1.0, put in the state store's
//! outbox in the transaction that notes the run as weighed, then delivered to each sink
//! at least once (retried with backoff, then dead-lettered). Receivers de-duplicate by
//! the CloudEvents `id`, which is the same for every delivery of one event.

use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde_json::{json, Value};

use super::{EventError, NotifyEvent, Sink, SinkKind};
use crate::state::{OutboxItem, RunRecord};

/// Deliveries of one notification before it is dead.
pub const MAX_ATTEMPTS: u32 = 8;

/// How long after its `attempts`-th failed delivery a notification is tried again:
/// 2 s, 4 s, 8 s, … at most 5 minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(attempts.clamp(1, 16)).min(300))
}

/// The CloudEvent of `event` of `run`; `source` names the server (`drivetrain://HOST`).
pub fn cloud_event(run: &RunRecord, event: NotifyEvent, source: &str) -> Value {
    let time = match event {
        NotifyEvent::Started => run.created_at.clone(),
        _ => run.finished_at.clone().unwrap_or_else(crate::state::now),
    };
    json!({
        "specversion": "1.0",
        "id": format!("{}.{}", run.id, event.as_str()),
        "source": format!("{source}/pipelines/{}", run.pipeline),
        "type": format!("dev.drivetrain.run.{}", event.as_str()),
        "subject": run.id.0,
        "time": time,
        "datacontenttype": "application/json",
        "data": {
            "run": run.id.0,
            "pipeline": run.pipeline,
            "phase": run.phase.as_str(),
            "reason": run.reason,
            "trigger": run.trigger,
            "created_at": run.created_at,
            "finished_at": run.finished_at,
        },
    })
}

/// The outbox entries of `events` of `run` for the sinks that want them.
pub fn outbox_items(
    run: &RunRecord,
    events: &[NotifyEvent],
    sinks: &[Sink],
    source: &str,
) -> Vec<OutboxItem> {
    events
        .iter()
        .flat_map(|&event| {
            let body = cloud_event(run, event, source);
            for_sinks(run, event, event.as_str(), &body, sinks)
        })
        .collect()
}

/// The outbox entries of a missed deadline: of the run (`stage` none) or of one stage,
/// `after` its start; one per run (and stage) and sink however often it is asked for.
pub fn deadline_items(
    run: &RunRecord,
    stage: Option<&str>,
    after: Duration,
    sinks: &[Sink],
    source: &str,
) -> Vec<OutboxItem> {
    let mut body = cloud_event(run, NotifyEvent::Deadline, source);
    let what = match stage {
        Some(st) => format!("deadline:{st}"),
        None => "deadline".to_owned(),
    };
    body["id"] = json!(format!("{}.{what}", run.id));
    body["time"] = json!(crate::state::now());
    body["data"]["deadline_seconds"] = json!(after.as_secs());
    body["data"]["stage"] = json!(stage);
    for_sinks(run, NotifyEvent::Deadline, &what, &body, sinks)
}

/// What a notification says beyond the run's record, for the people who read it: where
/// to look (the run, or its stage, in the web view) and each stage that failed with its
/// reason.
#[derive(Debug, Default, Clone)]
pub struct Details {
    pub url: Option<String>,
    /// (stage, reason): the reason's first lines.
    pub failed_stages: Vec<(String, String)>,
}

/// The most of a failed stage's reason a notification carries.
const REASON_CHARS: usize = 600;

impl Details {
    /// A stage's reason as a notification carries it: its first four lines, at most
    /// [`REASON_CHARS`] characters.
    pub fn reason(text: &str) -> String {
        let lines: Vec<&str> = text.lines().take(4).collect();
        let mut r = lines.join("\n");
        if r.chars().count() > REASON_CHARS {
            r = r.chars().take(REASON_CHARS - 1).collect::<String>() + "…";
        }
        r
    }

    /// Puts `self` into each item's event: `data.url`, `data.failed_stages`.
    pub fn add_to(&self, items: &mut [OutboxItem]) {
        let failed: Vec<Value> = self
            .failed_stages
            .iter()
            .map(|(stage, reason)| json!({"stage": stage, "reason": reason}))
            .collect();
        for item in items {
            if let Some(url) = &self.url {
                item.body["data"]["url"] = json!(url);
            }
            if !failed.is_empty() {
                item.body["data"]["failed_stages"] = json!(failed);
            }
        }
    }
}

/// `body` for each sink that wants `event`, with the id `RUN/WHAT/SINK`.
fn for_sinks(
    run: &RunRecord,
    event: NotifyEvent,
    what: &str,
    body: &Value,
    sinks: &[Sink],
) -> Vec<OutboxItem> {
    let now = crate::state::now();
    sinks
        .iter()
        .filter(|s| s.on.contains(&event))
        .map(|sink| OutboxItem {
            id: format!("{}/{what}/{}", run.id, sink.name),
            pipeline: run.pipeline.clone(),
            run_id: run.id.0.clone(),
            event: event.as_str().to_owned(),
            sink: serde_json::to_value(sink).unwrap_or(Value::Null),
            body: body.clone(),
            state: "pending".into(),
            attempts: 0,
            next_at: now.clone(),
            last_error: None,
            created_at: now.clone(),
            delivered_at: None,
        })
        .collect()
}

/// `sha256=HEX` of the body under the secret: the `X-Drivetrain-Signature` header.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key length");
    m.update(body);
    format!("sha256={}", hex::encode(m.finalize().into_bytes()))
}

/// Whether `header` (`sha256=HEX`) is the signature of `body` under `secret`, compared
/// in constant time.
pub fn verify(secret: &str, body: &[u8], header: &str) -> bool {
    let Some(sig) = header
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
    else {
        return false;
    };
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key length");
    m.update(body);
    m.verify_slice(&sig).is_ok()
}

/// The event for people, in chat and e-mail: a line saying what happened, each failed
/// stage with its reason, and the link to look at.
fn message(e: &Value) -> String {
    let d = &e["data"];
    let mut text = summary(e);
    for f in d["failed_stages"].as_array().into_iter().flatten() {
        let reason = f["reason"].as_str().unwrap_or("").replace('\n', "\n    ");
        text.push_str(&format!(
            "\n• stage `{}`: {reason}",
            f["stage"].as_str().unwrap_or("?")
        ));
    }
    if let Some(url) = d["url"].as_str() {
        text.push_str(&format!("\n{url}"));
    }
    text
}

/// One line about the event: the subject of a mail, the first line of a chat message.
fn summary(e: &Value) -> String {
    let d = &e["data"];
    let what = e["type"]
        .as_str()
        .unwrap_or("")
        .rsplit('.')
        .next()
        .unwrap_or("");
    let mut s = format!(
        "drivetrain: run {} of {} {what}",
        d["run"].as_str().unwrap_or("?"),
        d["pipeline"].as_str().unwrap_or("?")
    );
    // The run's reason names its failed stages; those listed below say more.
    let listed = d["failed_stages"].as_array().is_some_and(|f| !f.is_empty());
    if let Some(r) = d["reason"].as_str().filter(|_| !listed) {
        s.push_str(&format!(": {r}"));
    }
    if let Some(secs) = d["deadline_seconds"].as_u64() {
        match d["stage"].as_str() {
            Some(st) => s.push_str(&format!(": stage {st} still running after {secs} s")),
            None => s.push_str(&format!(": still running after {secs} s")),
        }
    }
    s
}

/// Delivers one notification; the error says why not (with no secret in it).
pub async fn deliver(item: &OutboxItem, http: &reqwest::Client) -> Result<(), EventError> {
    let sink: Sink = serde_json::from_value(item.sink.clone())
        .map_err(|e| EventError::Setting(format!("the sink cannot be read: {e}")))?;
    match sink.to {
        SinkKind::Webhook { url, secret } => {
            let body = item.body.to_string();
            let mut r = http.post(&url).header(
                "content-type",
                "application/cloudevents+json; charset=utf-8",
            );
            if let Some(secret) = secret {
                r = r.header(
                    "x-drivetrain-signature",
                    signature(&secret.read()?, body.as_bytes()),
                );
            }
            answer(r.body(body).send().await, &url)
                .await
                .map_err(EventError::Remote)
        }
        SinkKind::Slack { url } => {
            let url = url.read()?;
            let r = http.post(&url).json(&json!({"text": message(&item.body)}));
            answer(r.send().await, "the Slack webhook")
                .await
                .map_err(EventError::Remote)
        }
        SinkKind::Email {
            smtp,
            from,
            to,
            auth,
        } => {
            let auth = auth.map(|a| a.read()).transpose()?;
            let subject = summary(&item.body);
            let text = format!(
                "{}\n\n{}\n",
                message(&item.body),
                serde_json::to_string_pretty(&item.body["data"]).unwrap_or_default()
            );
            let id = item.id.clone();
            tokio::task::spawn_blocking(move || {
                send_mail(&smtp, &from, &to, auth, &subject, &text, &id)
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|sent| sent)
            .map_err(EventError::Remote)
        }
    }
}

async fn answer(r: Result<reqwest::Response, reqwest::Error>, to: &str) -> Result<(), String> {
    // reqwest's errors name the URL, which may be the secret: say only what failed.
    let r = r.map_err(|e| format!("{to}: {}", e.without_url()))?;
    match r.status().is_success() {
        true => Ok(()),
        false => Err(format!("{to} answered {}", r.status())),
    }
}

fn send_mail(
    smtp: &str,
    from: &str,
    to: &[String],
    auth: Option<String>,
    subject: &str,
    text: &str,
    id: &str,
) -> Result<(), String> {
    use lettre::message::header::ContentType;
    use lettre::Transport;
    let url = url::Url::parse(smtp).map_err(|e| format!("{smtp}: {e}"))?;
    let host = url.host_str().unwrap_or("localhost");
    let mut m = lettre::Message::builder()
        .from(from.parse().map_err(|e| format!("from `{from}`: {e}"))?)
        .subject(subject)
        // One Message-ID per event and sink: a mail store de-duplicates by it.
        .message_id(Some(format!("<{}@drivetrain>", id.replace('/', "."))))
        .header(ContentType::TEXT_PLAIN);
    for t in to {
        m = m.to(t.parse().map_err(|e| format!("to `{t}`: {e}"))?);
    }
    let message = m.body(text.to_owned()).map_err(|e| e.to_string())?;
    let mut transport = lettre::SmtpTransport::builder_dangerous(host)
        .port(url.port().unwrap_or(25))
        .timeout(Some(Duration::from_secs(30)));
    if let Some(a) = auth {
        let (user, pass) = a.split_once(':').unwrap_or((&a, ""));
        transport =
            transport.credentials(lettre::transport::smtp::authentication::Credentials::new(
                user.to_owned(),
                pass.to_owned(),
            ));
    }
    transport
        .build()
        .send(&message)
        .map(|_| ())
        .map_err(|e| format!("{smtp}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_of_the_body() {
        // RFC 4231's test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_signature_verifies_only_for_its_body_and_secret() {
        let sig = signature("k", b"body");
        assert!(verify("k", b"body", &sig));
        assert!(!verify("k", b"bodY", &sig));
        assert!(!verify("K", b"body", &sig));
        assert!(!verify("k", b"body", "sha256=zz"));
    }

    #[test]
    fn backoff_doubles_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(30), Duration::from_secs(300));
    }
}
