//! An SQS queue that receives a bucket's event notifications: `ReceiveMessage` and
//! `DeleteMessageBatch` in SQS's JSON protocol, signed with [`super::sigv4`], and the S3
//! event records in each message.
//!
//! A message is deleted only after its objects are committed to the inbox: a server
//! killed in between receives it again, and the inbox knows its objects (by URL and
//! ETag) already. S3 sends `s3:TestEvent` when notifications are configured, may announce
//! an object more than once, and in no particular order; its keys are form-encoded.

use serde_json::{json, Value};

use super::sigv4::{self, Credentials};
use super::EventError;

/// A queue of bucket notifications.
#[derive(Debug)]
pub struct Queue {
    url: url::Url,
    http: reqwest::Client,
    region: String,
}

/// A received message: its receipt (for deleting it) and its body.
#[derive(Debug, Clone)]
pub struct Message {
    pub receipt: String,
    pub body: String,
}

/// An object an S3 event record announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    pub bucket: String,
    /// Decoded.
    pub key: String,
    pub etag: String,
    pub size: Option<i64>,
    pub event_time: Option<String>,
}

impl Announced {
    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }
}

impl Queue {
    pub fn new(url: &str) -> Result<Queue, EventError> {
        crate::cloud::install_crypto();
        let parsed =
            url::Url::parse(url).map_err(|e| EventError::Setting(format!("queue {url}: {e}")))?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        // `sqs.REGION.amazonaws.com`, unless the environment names one.
        let from_host = parsed
            .host_str()
            .and_then(|h| h.strip_prefix("sqs."))
            .and_then(|h| h.split('.').next())
            .map(str::to_owned);
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or(from_host)
            .unwrap_or_else(|| "us-east-1".into());
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| EventError::Setting(format!("queue {url}: {e}")))?;
        Ok(Queue {
            url: parsed,
            http,
            region,
        })
    }

    async fn call(&self, action: &str, body: Value) -> Result<Value, EventError> {
        let creds = Credentials::from_env()?;
        let remote = EventError::Remote;
        let body = body.to_string();
        let host = match self.url.port() {
            Some(p) => format!("{}:{p}", self.url.host_str().unwrap_or_default()),
            None => self.url.host_str().unwrap_or_default().to_owned(),
        };
        let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let target = format!("AmazonSQS.{action}");
        let content_type = "application/x-amz-json-1.0";
        let req = sigv4::Request {
            method: "POST",
            host: &host,
            path: "/",
            query: &[],
            headers: &[("content-type", content_type), ("x-amz-target", &target)],
            body: body.as_bytes(),
        };
        let auth = sigv4::authorization(&req, &creds, &self.region, "sqs", &amz_date);
        let endpoint = format!("{}://{host}/", self.url.scheme());
        let mut r = self
            .http
            .post(endpoint)
            .header("content-type", content_type)
            .header("x-amz-target", &target)
            .header("x-amz-date", &amz_date)
            .header("authorization", auth)
            .body(body);
        if let Some(t) = &creds.token {
            r = r.header("x-amz-security-token", t);
        }
        let resp = r
            .send()
            .await
            .map_err(|e| remote(format!("{action}: {}", chain(&e))))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| remote(format!("{action}: {e}")))?;
        if !status.is_success() {
            return Err(remote(format!(
                "{action}: {status}: {}",
                crate::diag::clip(text.trim().to_owned())
            )));
        }
        serde_json::from_str(&text).map_err(|e| remote(format!("{action}: not JSON: {e}")))
    }

    /// Up to 10 messages, waiting at most `wait_s` seconds for the first (long polling).
    pub async fn receive(&self, wait_s: u32) -> Result<Vec<Message>, EventError> {
        let out = self
            .call(
                "ReceiveMessage",
                json!({
                    "QueueUrl": self.url.as_str(),
                    "MaxNumberOfMessages": 10,
                    "WaitTimeSeconds": wait_s,
                }),
            )
            .await?;
        Ok(out["Messages"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .filter_map(|m| {
                        Some(Message {
                            receipt: m["ReceiptHandle"].as_str()?.to_owned(),
                            body: m["Body"].as_str()?.to_owned(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Deletes received messages (in batches of 10, SQS's most).
    pub async fn delete(&self, receipts: &[String]) -> Result<(), EventError> {
        for chunk in receipts.chunks(10) {
            let entries: Vec<Value> = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| json!({"Id": i.to_string(), "ReceiptHandle": r}))
                .collect();
            let out = self
                .call(
                    "DeleteMessageBatch",
                    json!({"QueueUrl": self.url.as_str(), "Entries": entries}),
                )
                .await?;
            if let Some(failed) = out["Failed"].as_array().filter(|f| !f.is_empty()) {
                return Err(EventError::Remote(format!(
                    "DeleteMessageBatch: {} failed: {}",
                    failed.len(),
                    failed[0]
                )));
            }
        }
        Ok(())
    }
}

/// An error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(&format!(": {c}"));
        cause = c.source();
    }
    out
}

/// The objects a message announces as created: S3 event records (also inside an SNS
/// envelope's `Message`); `s3:TestEvent` and other events announce none. A body that is
/// not an S3 event is an error (the message is left in the queue).
pub fn announced(body: &str) -> Result<Vec<Announced>, EventError> {
    records(body).map_err(EventError::Message)
}

/// [`announced`], the error said.
fn records(body: &str) -> Result<Vec<Announced>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    if let Some(inner) = v.get("Message").and_then(Value::as_str) {
        return records(inner);
    }
    if v.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
        return Ok(Vec::new());
    }
    let Some(records) = v.get("Records").and_then(Value::as_array) else {
        return Err("neither S3 event records nor s3:TestEvent".into());
    };
    let mut out = Vec::new();
    for r in records {
        let name = r["eventName"].as_str().unwrap_or("");
        if !name.starts_with("ObjectCreated:") {
            continue;
        }
        let s3 = &r["s3"];
        let (Some(bucket), Some(key)) =
            (s3["bucket"]["name"].as_str(), s3["object"]["key"].as_str())
        else {
            return Err(format!("an {name} record without bucket or key"));
        };
        out.push(Announced {
            bucket: bucket.to_owned(),
            key: form_decode(key),
            etag: super::discover::etag(s3["object"]["eTag"].as_str()),
            size: s3["object"]["size"].as_i64(),
            event_time: r["eventTime"].as_str().map(str::to_owned),
        });
    }
    Ok(out)
}

/// An S3 event's key: form-encoded (`+` for a space, `%XX` for the rest).
fn form_decode(key: &str) -> String {
    url::form_urlencoded::parse(key.as_bytes())
        .next()
        .map(|(k, v)| match v.is_empty() {
            true => k.into_owned(),
            // A decoded `=`: put it back.
            false => format!("{k}={v}"),
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_decoded_and_test_events_skipped() {
        let body = r#"{"Records":[{"eventName":"ObjectCreated:CompleteMultipartUpload","eventTime":"2026-11-26T10:00:00.000Z",
            "s3":{"bucket":{"name":"fleet"},"object":{"key":"incoming/veh+7/drive%3D1.mcap","size":12,"eTag":"abc-2"}}},
            {"eventName":"ObjectRemoved:Delete","s3":{"bucket":{"name":"fleet"},"object":{"key":"x"}}}]}"#;
        let a = announced(body).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].url(), "s3://fleet/incoming/veh 7/drive=1.mcap");
        assert_eq!(a[0].etag, "abc-2");
        let test = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"fleet"}"#;
        assert!(announced(test).unwrap().is_empty());
        assert!(announced(r#"{"hello":1}"#).is_err());
    }
}
