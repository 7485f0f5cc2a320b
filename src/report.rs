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

/// Writes every diagnostic of one file to stderr as an annotated snippet.
pub fn emit(file: &str, src: &str, diags: &[Diagnostic]) {
    let files = SimpleFile::new(file, src);
    let stream = StandardStream::stderr(color_choice());
    let mut out = stream.lock();
    let config = Config::default();
    for d in diags {
        let snippet = to_snippet(d, src);
        if term::emit_to_write_style(&mut out, &config, &files, &snippet).is_err() {
            // Span outside the file (should not happen): fall back to one line.
            let _ = writeln!(out, "{file}: {d}");
        }
    }
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
