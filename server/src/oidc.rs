//! OpenID Connect bearer tokens: an ID token (a JWT) is verified against its issuer's
//! keys (JWKS, from the issuer's discovery document or `jwks_uri`), its issuer, audience
//! and expiry checked, and its group claim mapped to roles per project
//! (`serve --oidc FILE`):
//!
//! ```yaml
//! issuer: https://login.example.com/realms/fleet
//! audience: drivetrain
//! groups_claim: groups          # default
//! roles:
//!   - {group: perception-eng, project: default, role: editor}
//!   - {group: safety-board, project: default, role: viewer, approves: [safety]}
//! ```
//!
//! Keys are fetched once and again when a token names a key id the set lacks (a rotated
//! key), at most once every [`REFRESH_EVERY`].

use std::time::{Duration, Instant};

use drivetrain_engine::access::{Grant, Role, Subject};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{decode, decode_header, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;

/// The least time between two fetches of the keys for unknown key ids: a flood of
/// tokens with made-up key ids does not become a flood of requests to the issuer.
pub const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// `serve --oidc FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// The `aud` every token must carry (the client id drivetrain was registered as).
    pub audience: String,
    /// Where the keys are; by default the `jwks_uri` of the issuer's discovery document.
    #[serde(default)]
    pub jwks_uri: Option<String>,
    /// The claim holding the user's groups.
    #[serde(default = "groups")]
    pub groups_claim: String,
    /// Roles per group.
    pub roles: Vec<GroupRole>,
}

fn groups() -> String {
    "groups".into()
}

/// What members of a group hold in a project.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRole {
    pub group: String,
    #[serde(default = "default_project")]
    pub project: String,
    pub role: Role,
    #[serde(default)]
    pub approves: Vec<String>,
}

fn default_project() -> String {
    "default".into()
}

/// The verifier: the configuration and the issuer's keys as last fetched.
#[derive(Debug)]
pub struct Oidc {
    config: Config,
    http: reqwest::Client,
    keys: tokio::sync::Mutex<(JwkSet, Option<Instant>)>,
}

/// Whether a bearer token is a JWT (three base64url parts) rather than a drivetrain token.
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && token.starts_with("ey")
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

impl Oidc {
    /// Reads `--oidc FILE`.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Oidc> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--oidc {}: {e}", path.display()))?;
        let config: Config = serde_yaml_ng::from_str(&text)
            .map_err(|e| anyhow::anyhow!("--oidc {}: {e}", path.display()))?;
        Ok(Oidc {
            config,
            http: {
                drivetrain_engine::cloud::install_crypto();
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()?
            },
            keys: tokio::sync::Mutex::new((JwkSet { keys: Vec::new() }, None)),
        })
    }

    async fn fetch_keys(&self) -> anyhow::Result<JwkSet> {
        let uri = match &self.config.jwks_uri {
            Some(u) => u.clone(),
            None => {
                let discovery = format!(
                    "{}/.well-known/openid-configuration",
                    self.config.issuer.trim_end_matches('/')
                );
                let doc: Value = self
                    .http
                    .get(&discovery)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                doc.get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| anyhow::anyhow!("{discovery} names no jwks_uri"))?
                    .to_owned()
            }
        };
        let set: JwkSet = self
            .http
            .get(&uri)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(set)
    }

    /// The key `kid` names, fetching the set again when it lacks it (a rotated key).
    async fn key(&self, kid: Option<&str>) -> anyhow::Result<DecodingKey> {
        let mut keys = self.keys.lock().await;
        let find = |set: &JwkSet| match kid {
            Some(k) => set.find(k).cloned(),
            None => set.keys.first().cloned(),
        };
        if let Some(jwk) = find(&keys.0) {
            return Ok(DecodingKey::from_jwk(&jwk)?);
        }
        if keys.1.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
            anyhow::bail!("no key `{}` at the issuer", kid.unwrap_or("-"));
        }
        let fetched = self.fetch_keys().await;
        keys.1 = Some(Instant::now());
        keys.0 = fetched?;
        let jwk = find(&keys.0)
            .ok_or_else(|| anyhow::anyhow!("no key `{}` at the issuer", kid.unwrap_or("-")))?;
        Ok(DecodingKey::from_jwk(&jwk)?)
    }

    /// The subject of a verified ID token: `oidc:ISSUER#SUB` holding the roles of its
    /// groups.
    pub async fn subject(&self, token: &str) -> anyhow::Result<Subject> {
        let header = decode_header(token)?;
        // Only the issuer's public keys sign: an HMAC "signed" with a public key is not.
        if matches!(
            header.alg,
            jsonwebtoken::Algorithm::HS256
                | jsonwebtoken::Algorithm::HS384
                | jsonwebtoken::Algorithm::HS512
        ) {
            anyhow::bail!("{:?} is not an issuer's signature", header.alg);
        }
        let key = self.key(header.kid.as_deref()).await?;
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.config.issuer]);
        v.set_audience(&[&self.config.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = 30;
        let claims = decode::<Claims>(token, &key, &v)?.claims;
        let groups: Vec<&str> = match claims.rest.get(&self.config.groups_claim) {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            Some(Value::String(s)) => vec![s.as_str()],
            _ => Vec::new(),
        };
        let grants = self
            .config
            .roles
            .iter()
            .filter(|r| groups.contains(&r.group.as_str()))
            .map(|r| Grant {
                project: r.project.clone(),
                role: r.role,
                approves: r.approves.clone(),
            })
            .collect();
        Ok(Subject {
            name: format!("oidc:{}#{}", self.config.issuer, claims.sub),
            grants,
        })
    }
}
