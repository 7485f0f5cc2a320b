//! Shared words about names: what a DNS-1123 label is (stage, pipeline, project and
//! plugin names become Kubernetes object names) and what an identifier is (inputs,
//! outputs, params). A leaf: validation and the plugin files read it.

/// Why a name is not a DNS-1123 label (each reads after the name: "`x_y` may hold …").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("is empty")]
    Empty,
    #[error("is {0} characters long; at most 63 fit a Kubernetes name")]
    TooLong(usize),
    #[error("may hold only lowercase letters, digits and `-`")]
    Characters,
    #[error("must start and end with a letter or digit")]
    Ends,
}

/// Checks a DNS-1123 label: what Kubernetes accepts as a name and label value.
pub fn dns1123_label(name: &str) -> Result<(), LabelError> {
    if name.is_empty() {
        return Err(LabelError::Empty);
    }
    if name.len() > 63 {
        return Err(LabelError::TooLong(name.len()));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(LabelError::Characters);
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(LabelError::Ends);
    }
    Ok(())
}

/// An identifier: a letter or `_`, then letters, digits, `_` and `-`.
pub(crate) fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

// Beside `RunId`: it reads as a `str` (it derefs to one, and a map keyed by it is looked
// up with a `&str`).
/// A stage's name as the pipeline writes it: the stage's id within its run.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct StageName(pub String);

impl StageName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StageName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for StageName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for StageName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for StageName {
    fn from(s: &str) -> Self {
        StageName(s.to_owned())
    }
}

impl From<String> for StageName {
    fn from(s: String) -> Self {
        StageName(s)
    }
}

impl From<StageName> for String {
    fn from(s: StageName) -> Self {
        s.0
    }
}

impl PartialEq<str> for StageName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for StageName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for StageName {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<StageName> for String {
    fn eq(&self, other: &StageName) -> bool {
        *self == other.0
    }
}
