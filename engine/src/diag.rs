//! Diagnostics: the user-facing form of every problem found in a pipeline file.
//!
//! A [`Diagnostic`] carries a stable machine-readable code, a message, the YAML path
//! and span it is about, and, where one exists, a hint ("did you mean `retries`?").
//! Validation accumulates them instead of stopping at the first; rendering (terminal
//! snippets, JSON) belongs to the binary, which owns the terminal.

use std::fmt;

use serde::Serialize;

/// A region of the source: byte range plus the 1-based line and column of its start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub line: u32,
    pub column: u32,
}

impl Span {
    /// The span from the start of `self` to the end of `other`.
    pub fn to(self, other: Span) -> Span {
        Span {
            end: other.end.max(self.start),
            ..self
        }
    }
}

/// Whose fault the problem is and how bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in a pipeline file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// A stable kebab-case identifier (`unknown-field`, `cycle`), for scripts and docs.
    pub code: &'static str,
    pub message: String,
    /// The YAML path the problem is about, `stages.train.inputs.dataset`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span: Option<Span>,
    /// A label for the span in snippet rendering.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            path: None,
            span: None,
            label: None,
            hint: None,
            notes: Vec::new(),
        }
    }

    pub fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::new(code, message)
        }
    }

    pub fn at(mut self, span: Span) -> Self {
        self.span = Some(span);
        self
    }

    pub fn path(mut self, path: impl fmt::Display) -> Self {
        self.path = Some(path.to_string());
        self
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn maybe_hint(mut self, hint: Option<String>) -> Self {
        if hint.is_some() {
            self.hint = hint;
        }
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(span) = self.span {
            write!(f, "{}:{}: ", span.line, span.column)?;
        }
        write!(f, "{} [{}]", self.message, self.code)?;
        if let Some(p) = &self.path {
            write!(f, " at `{p}`")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; {h}")?;
        }
        Ok(())
    }
}

/// The closest candidate to `word`, for "did you mean" hints.
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for c in candidates {
        let score = strsim::jaro_winkler(word, c);
        // Short names tolerate one edit, longer ones two; Jaro-Winkler catches
        // transpositions and truncations (`retires`, `need`).
        let max_edits = if c.len() <= 4 { 1 } else { 2 };
        let close = score >= 0.85 || strsim::levenshtein(word, c) <= max_edits;
        if close && best.is_none_or(|(_, s)| score > s) {
            best = Some((c, score));
        }
    }
    best.map(|(c, _)| c)
}

/// `did you mean `x`?` for the closest candidate, if any is close.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    suggest(word, candidates).map(|c| format!("did you mean `{c}`?"))
}

/// Joins names as "`a`, `b` or `c`".
pub fn one_of<S: AsRef<str>>(names: &[S]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{}`", n.as_ref())).collect();
    match quoted.len() {
        0 => "nothing".to_owned(),
        1 => quoted[0].clone(),
        n => format!("{} or {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let fields = ["retries", "timeout", "resources", "needs"];
        assert_eq!(suggest("retires", fields), Some("retries"));
        assert_eq!(suggest("need", fields), Some("needs"));
        assert_eq!(suggest("zzz", fields), None);
        assert_eq!(suggest("ftp", ["http", "s3", "gs"]), None);
    }

    #[test]
    fn one_of_reads_naturally() {
        assert_eq!(one_of(&["a", "b", "c"]), "`a`, `b` or `c`");
        assert_eq!(one_of(&["a"]), "`a`");
    }
}
