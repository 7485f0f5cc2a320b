//! Reading a pipeline file as the commands do: its text (UTF-8, or where it is not) and
//! its validated pipeline, with the diagnostics printed.

use std::path::Path;
use std::process::ExitCode;

use drivetrain_engine::plan::Pipeline;
use drivetrain_engine::{Catalog, Validated};

use super::{EXIT_INVALID, EXIT_USAGE};

pub(crate) fn usage_errors(errors: &[String]) -> ExitCode {
    for e in errors {
        eprintln!("error: {e}");
    }
    ExitCode::from(EXIT_USAGE)
}

/// Why a pipeline file gives no text.
pub(super) enum Unread {
    /// Missing, unreadable: a usage error.
    Io,
    /// Read, but not UTF-8: an invalid pipeline, said with where.
    NotText,
}

impl From<Unread> for ExitCode {
    fn from(u: Unread) -> ExitCode {
        ExitCode::from(match u {
            Unread::Io => EXIT_USAGE,
            Unread::NotText => EXIT_INVALID,
        })
    }
}

/// A pipeline file's text; the error is printed: the I/O error, or where the first byte
/// that is not UTF-8 is (line, column and byte offset).
pub(super) fn read_text(file: &Path) -> Result<String, Unread> {
    let bytes = std::fs::read(file).map_err(|e| {
        eprintln!("error: cannot read {}: {e}", file.display());
        Unread::Io
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line_start = bytes[..at]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        let line = bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
        let column = String::from_utf8_lossy(&bytes[line_start..at]).chars().count() + 1;
        eprintln!(
            "error[not-utf8]: a pipeline is UTF-8 text; byte {:#04x} at offset {at} is not\n  ┌─ {}:{line}:{column}",
            bytes[at],
            file.display()
        );
        Unread::NotText
    })
}

pub(crate) fn read(file: &Path) -> Result<String, ExitCode> {
    read_text(file).map_err(ExitCode::from)
}

/// Reads and validates one file; on errors, prints them and returns the exit code.
pub(crate) fn load(catalog: &Catalog, file: &Path) -> Result<Pipeline, ExitCode> {
    let origin = drivetrain_engine::plugin::Origin::of_file(file, catalog.home());
    load_in(catalog, file, origin)
}

/// [`load`], its plugins looked for from `origin`.
pub(crate) fn load_in(
    catalog: &Catalog,
    file: &Path,
    origin: drivetrain_engine::plugin::Origin,
) -> Result<Pipeline, ExitCode> {
    let src = read(file)?;
    let Validated {
        pipeline,
        diagnostics,
    } = drivetrain_engine::validate_in(&src, catalog, origin);
    let name = file.display().to_string();
    if !diagnostics.is_empty() {
        crate::report::emit(&name, &src, &diagnostics);
    }
    match pipeline {
        Some(p) => Ok(p),
        None => {
            eprintln!("{name}: invalid ({})", crate::report::counts(&diagnostics));
            Err(ExitCode::from(EXIT_INVALID))
        }
    }
}
