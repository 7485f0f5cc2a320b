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

/// The longest message, hint, note, label or path a diagnostic keeps. A name quoted from
/// the file can be megabytes long; what a person reads is its start and its size.
pub const MAX_TEXT: usize = 512;

/// `text`, or its first [`MAX_TEXT`] bytes (on a character boundary) and how much was
/// left out.
pub fn clip(text: String) -> String {
    if text.len() <= MAX_TEXT {
        return text;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// At most this many diagnostics are kept for one line of the file…
pub const MAX_PER_LINE: usize = 5;
/// …and this many for the whole file.
pub const MAX_PER_FILE: usize = 100;

/// Bounds what a file's diagnostics can cost to keep and render: at most
/// [`MAX_PER_LINE`] per line and [`MAX_PER_FILE`] in all, in source order, then one
/// warning saying how many were left out (`diagnostics-left-out`). Errors are kept before
/// warnings, so a file with errors always shows some.
pub fn bound(diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    if diags.len() <= MAX_PER_LINE {
        return diags;
    }
    let mut per_line: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut kept = Vec::new();
    let mut left_out = 0usize;
    let (errors, warnings): (Vec<_>, Vec<_>) = diags.into_iter().partition(|d| d.is_error());
    for d in errors.into_iter().chain(warnings) {
        let line = d.span.map_or(0, |s| s.line);
        let n = per_line.entry(line).or_default();
        if *n >= MAX_PER_LINE || kept.len() >= MAX_PER_FILE {
            left_out += 1;
            continue;
        }
        *n += 1;
        kept.push(d);
    }
    kept.sort_by_key(|d| d.span.map(|s| (s.start, s.end)).unwrap_or_default());
    if left_out > 0 {
        kept.push(
            Diagnostic::warning(
                "diagnostics-left-out",
                format!(
                    "{left_out} more problem{} not shown (at most {MAX_PER_LINE} per line and \
                 {MAX_PER_FILE} per file are)",
                    if left_out == 1 { " is" } else { "s are" }
                ),
            )
            .hint("fix the problems shown and validate again"),
        );
    }
    kept
}

impl Diagnostic {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: clip(message.into()),
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
        self.path = Some(clip(path.to_string()));
        self
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(clip(label.into()));
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(clip(hint.into()));
        self
    }

    pub fn maybe_hint(mut self, hint: Option<String>) -> Self {
        if hint.is_some() {
            self.hint = hint.map(clip);
        }
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(clip(note.into()));
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
    // No name is this long; a megabyte key is not a typo of one (and would cost seconds).
    if word.len() > 128 {
        return None;
    }
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
    fn long_texts_are_clipped_on_a_char_boundary() {
        let d = Diagnostic::new("x", "ä".repeat(5_000_000)).path("k".repeat(1_000));
        assert!(d.message.len() < MAX_TEXT + 40, "{}", d.message.len());
        assert!(
            d.message.ends_with("… (9999488 more bytes)"),
            "{}",
            &d.message[500..]
        );
        assert!(d.path.unwrap().ends_with("(488 more bytes)"));
        assert_eq!(suggest(&"retries".repeat(100), ["retries"]), None);
    }

    #[test]
    fn many_diagnostics_are_bounded_per_line_and_file() {
        let at = |line: u32, start: usize| Span {
            start,
            end: start + 1,
            line,
            column: 1,
        };
        // 800 errors on line 3, a warning on line 1 and 300 errors on lines of their own.
        let mut diags: Vec<Diagnostic> = (0..800)
            .map(|i| Diagnostic::new("unknown-param", format!("p{i}")).at(at(3, 100 + i)))
            .collect();
        diags.push(Diagnostic::warning("w", "w").at(at(1, 0)));
        diags.extend(
            (0..300usize).map(|i| Diagnostic::new("e", "e").at(at(10 + i as u32, 10_000 + i))),
        );
        let kept = bound(diags);
        assert_eq!(kept.len(), MAX_PER_FILE + 1);
        assert_eq!(
            kept.iter()
                .filter(|d| d.span.is_some_and(|s| s.line == 3))
                .count(),
            5
        );
        // Errors first: the warning is among those left out.
        assert!(kept[..MAX_PER_FILE].iter().all(Diagnostic::is_error));
        let last = kept.last().unwrap();
        assert_eq!(last.code, "diagnostics-left-out");
        assert!(
            last.message.starts_with("1001 more problems are not shown"),
            "{}",
            last.message
        );
        // Source order is kept.
        assert!(kept[..MAX_PER_FILE]
            .windows(2)
            .all(|w| w[0].span.unwrap().start <= w[1].span.unwrap().start));
        // A few are left alone.
        let few = vec![Diagnostic::new("e", "e"); 3];
        assert_eq!(bound(few.clone()), few);
    }

    #[test]
    fn one_of_reads_naturally() {
        assert_eq!(one_of(&["a", "b", "c"]), "`a`, `b` or `c`");
        assert_eq!(one_of(&["a"]), "`a`");
    }
}
