//! AWS Signature Version 4 for the few SQS calls triggers make (object_store signs its own
//! S3 requests and does not export its signer). Checked against AWS's published test
//! vectors here and against botocore's signer in `tests/it/triggers.rs`.

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

/// Credentials as the AWS tools read them from the environment.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Result<Credentials, super::EventError> {
        let get = |k: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| super::EventError::Setting(format!("{k} is not set")))
        };
        Ok(Credentials {
            access_key: get("AWS_ACCESS_KEY_ID")?,
            secret_key: get("AWS_SECRET_ACCESS_KEY")?,
            token: get("AWS_SESSION_TOKEN").ok(),
        })
    }
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut m = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// A request to sign: everything the signature covers.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    pub host: &'a str,
    /// The path, already as it goes on the wire (`/123456789012/queue`).
    pub path: &'a str,
    /// Query pairs, already URI-encoded.
    pub query: &'a [(&'a str, &'a str)],
    /// Headers besides `host` and `x-amz-date` (lowercase names).
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// The `Authorization` header (and `x-amz-security-token`, with a session token) for
/// `req` at `amz_date` (`20150830T123600Z`), in `region` for `service`.
pub fn authorization(
    req: &Request<'_>,
    creds: &Credentials,
    region: &str,
    service: &str,
    amz_date: &str,
) -> String {
    let date = &amz_date[..8];
    let mut headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    headers.push(("host".into(), req.host.to_owned()));
    headers.push(("x-amz-date".into(), amz_date.to_owned()));
    if let Some(t) = &creds.token {
        headers.push(("x-amz-security-token".into(), t.clone()));
    }
    headers.sort();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let mut query: Vec<(&str, &str)> = req.query.to_vec();
    query.sort();
    let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        if req.path.is_empty() { "/" } else { req.path },
        query.join("&"),
        headers
            .iter()
            .map(|(k, v)| format!("{k}:{v}\n"))
            .collect::<String>(),
        signed,
        hex::encode(Sha256::digest(req.body)),
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{}", creds.secret_key).as_bytes(), date);
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part);
    }
    let signature = hex::encode(hmac(&key, &to_sign));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        creds.access_key
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Credentials {
        Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            token: None,
        }
    }

    /// `get-vanilla` of AWS's Signature Version 4 test suite.
    #[test]
    fn get_vanilla_of_the_aws_test_suite() {
        let req = Request {
            method: "GET",
            host: "example.amazonaws.com",
            path: "/",
            query: &[],
            headers: &[],
            body: b"",
        };
        let auth = authorization(&req, &example(), "us-east-1", "service", "20150830T123600Z");
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    /// The IAM `ListUsers` example of AWS's Signature Version 4 documentation.
    #[test]
    fn the_iam_example_of_the_aws_documentation() {
        let req = Request {
            method: "GET",
            host: "iam.amazonaws.com",
            path: "/",
            query: &[("Action", "ListUsers"), ("Version", "2010-05-08")],
            headers: &[(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )],
            body: b"",
        };
        let auth = authorization(&req, &example(), "us-east-1", "iam", "20150830T123600Z");
        assert!(
            auth.ends_with(
                "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
            ),
            "{auth}"
        );
    }
}
