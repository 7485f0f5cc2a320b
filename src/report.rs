//! Rendering diagnostics for people (compiler-style snippets) and scripts (JSON).

use std::io::{IsTerminal, Write};

use codespan_reporting::diagnostic::{Diagnostic as Snippet, Label, Severity as SnippetSeverity};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::termcolor::{ColorChoice, StandardStream};
use codespan_reporting::term::{self, Config};
use drivetrain_engine::{Diagnostic, Severity};
use serde_json::json;

/// Whether stderr gets colour: a terminal, and `NO_COLOR` unset.
fn color_choice() -> ColorChoice {
    if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        ColorChoice::Auto
    } else {
        ColorChoice::Never
    }
}

/// Lines longer than this are not quoted whole under a diagnostic: it shows an excerpt
/// around the column instead, so output stays proportional to the number of diagnostics.
const MAX_SNIPPET_LINE: usize = 240;

/// Writes every diagnostic of one file to stderr as an annotated snippet (an excerpt for
/// a long line).
pub fn emit(file: &str, src: &str, diags: &[Diagnostic]) {
    let files = SimpleFile::new(file, src);
    let stream = StandardStream::stderr(color_choice());
    let mut out = stream.lock();
    let config = Config::default();
    for d in diags {
        if let Some(excerpt) = d.span.and_then(|s| long_line_excerpt(src, s.start)) {
            let _ = writeln!(out, "{file}:{d}\n  | {excerpt}\n");
            continue;
        }
        let snippet = to_snippet(d, src);
        if term::emit_to_write_style(&mut out, &config, &files, &snippet).is_err() {
            // Span outside the file (should not happen): fall back to one line.
            let _ = writeln!(out, "{file}: {d}");
        }
    }
}

/// When the line holding byte `at` is longer than [`MAX_SNIPPET_LINE`]: up to 60 bytes
/// either side of `at`, with `…` where the line goes on.
fn long_line_excerpt(src: &str, at: usize) -> Option<String> {
    let at = at.min(src.len());
    let start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = src[at..].find('\n').map_or(src.len(), |i| at + i);
    if end - start <= MAX_SNIPPET_LINE {
        return None;
    }
    let floor = |mut i: usize| {
        while !src.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let from = floor(at.saturating_sub(60).max(start));
    let to = floor((at + 60).min(end));
    Some(format!(
        "{}{}{}",
        if from > start { "…" } else { "" },
        &src[from..to],
        if to < end { "…" } else { "" }
    ))
}

fn to_snippet(d: &Diagnostic, src: &str) -> Snippet<()> {
    let severity = match d.severity {
        Severity::Error => SnippetSeverity::Error,
        Severity::Warning => SnippetSeverity::Warning,
    };
    let mut s = Snippet::new(severity)
        .with_message(&d.message)
        .with_code(d.code);
    if let Some(span) = d.span {
        let start = span.start.min(src.len());
        let end = span.end.clamp(start, src.len());
        let label = match (&d.label, &d.path) {
            (Some(l), _) => l.clone(),
            (None, Some(p)) => format!("at `{p}`"),
            (None, None) => String::new(),
        };
        s = s.with_labels(vec![Label::primary((), start..end).with_message(label)]);
    }
    let mut notes = d.notes.clone();
    if let Some(h) = &d.hint {
        notes.push(format!("help: {h}"));
    }
    s.with_notes(notes)
}

/// One diagnostic as JSON, with the file and a 1-based line and column.
pub fn to_json(file: &str, d: &Diagnostic) -> serde_json::Value {
    json!({
        "file": file,
        "severity": d.severity,
        "code": d.code,
        "message": d.message,
        "path": d.path,
        "line": d.span.map(|s| s.line),
        "column": d.span.map(|s| s.column),
        "hint": d.hint,
        "notes": d.notes,
    })
}

/// "2 errors, 1 warning"
pub fn counts(diags: &[Diagnostic]) -> String {
    let errors = diags.iter().filter(|d| d.is_error()).count();
    let warnings = diags.len() - errors;
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    match warnings {
        0 => plural(errors, "error"),
        _ => format!(
            "{}, {}",
            plural(errors, "error"),
            plural(warnings, "warning")
        ),
    }
}
