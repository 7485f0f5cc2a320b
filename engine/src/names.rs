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
