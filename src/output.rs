//! The one printer of the binary's commands: what a command found, as text for a person
//! or as JSON for a program (`-o json`, [`Format`]). A command hands over the value and
//! how it reads as text; JSON is always the value itself, pretty-printed, one document.

use serde::Serialize;

pub(crate) use crate::cli::Format;

impl Format {
    /// Whether a program reads the output.
    pub(crate) fn json(self) -> bool {
        self == Format::Json
    }

    /// Prints `value`: as JSON, or as `text` writes it.
    pub(crate) fn print<T: Serialize + ?Sized>(
        self,
        value: &T,
        text: impl FnOnce(&T),
    ) -> anyhow::Result<()> {
        match self {
            Format::Json => print_json(value),
            Format::Text => {
                text(value);
                Ok(())
            }
        }
    }
}

/// `value` as one pretty-printed JSON document on stdout (a closed pipe ends the text,
/// not the command: [`say!`]).
pub(crate) fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    say!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Names, or `-` for none.
pub(crate) fn listed(names: &[String]) -> String {
    match names.is_empty() {
        true => "-".into(),
        false => names.join(", "),
    }
}
