//! Durations (`90s`, `2h`, `1h30m`, `7d`) and Kubernetes quantities (`500m`, `4Gi`).
//!
//! Both are parsed here once, at validation, so the run loop and the executors only see
//! typed values. Quantities follow the Kubernetes grammar (decimal SI suffixes, binary
//! `Ki`…`Ei`, exponents); their original text is kept because Kubernetes objects are
//! rendered with exactly what the user wrote.

use std::fmt;
use std::time::Duration;

/// Why a duration or a quantity was refused: the user's text, in every case.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitError {
    #[error("`{text}` is not a duration ({source}); write e.g. `90s`, `15m`, `2h` or `1h30m`")]
    Duration {
        text: String,
        source: humantime::DurationError,
    },
    #[error("`{text}` is not a Kubernetes quantity; write e.g. `2`, `500m`, `4Gi`{}",
        .hint.as_ref().map(|h| format!(" (did you mean `{h}`?)")).unwrap_or_default())]
    Quantity { text: String, hint: Option<String> },
    #[error("`{text}` is negative; resources are at least 0")]
    Negative { text: String },
}

/// Parses a duration: humantime syntax (`90s`, `15m`, `2h`, `1h30m`, `7d`, `1h 30m`) or a
/// bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(t).map_err(|source| UnitError::Duration {
        text: s.to_owned(),
        source,
    })
}

/// A parsed Kubernetes quantity.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    /// The text as written, normalized only by trimming.
    pub text: String,
    /// The value in base units (cores, bytes, GPUs).
    pub value: f64,
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

const SUFFIXES: &[(&str, f64)] = &[
    ("Ki", 1024.0),
    ("Mi", 1024.0 * 1024.0),
    ("Gi", 1024.0 * 1024.0 * 1024.0),
    ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("Pi", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("Ei", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("n", 1e-9),
    ("u", 1e-6),
    ("m", 1e-3),
    ("k", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
    ("P", 1e15),
    ("E", 1e18),
];

/// Parses a quantity with the Kubernetes grammar.
pub fn parse_quantity(s: &str) -> Result<Quantity, UnitError> {
    let text = s.trim();
    let bad = || UnitError::Quantity {
        text: s.to_owned(),
        hint: lowercase_binary_hint(text),
    };
    let (num, mult) = match SUFFIXES.iter().find(|(suf, _)| text.ends_with(suf)) {
        Some((suf, mult)) => (&text[..text.len() - suf.len()], *mult),
        None => match text.find(['e', 'E']) {
            Some(i) if i > 0 => {
                let exp: i32 = text[i + 1..].parse().map_err(|_| bad())?;
                (&text[..i], 10f64.powi(exp))
            }
            _ => (text, 1.0),
        },
    };
    let digits = num.strip_prefix(['+', '-']).unwrap_or(num);
    let well_formed = !digits.is_empty()
        && digits != "."
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && digits.matches('.').count() <= 1;
    if !well_formed {
        return Err(bad());
    }
    let n: f64 = num.parse().map_err(|_| bad())?;
    if n < 0.0 {
        return Err(UnitError::Negative { text: s.to_owned() });
    }
    Ok(Quantity {
        text: text.to_owned(),
        value: n * mult,
    })
}

fn lowercase_binary_hint(text: &str) -> Option<String> {
    for (wrong, right) in [
        ("gi", "Gi"),
        ("mi", "Mi"),
        ("ki", "Ki"),
        ("GB", "G"),
        ("MB", "M"),
        ("GiB", "Gi"),
        ("MiB", "Mi"),
        ("gb", "G"),
    ] {
        if let Some(n) = text.strip_suffix(wrong) {
            return Some(format!("{n}{right}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert!(parse_duration("2 hours and a bit").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("500m").unwrap().value, 0.5);
        assert_eq!(
            parse_quantity("4Gi").unwrap().value,
            4.0 * 1024.0 * 1024.0 * 1024.0
        );
        assert_eq!(parse_quantity("2").unwrap().value, 2.0);
        assert_eq!(parse_quantity("1.5").unwrap().value, 1.5);
        assert_eq!(parse_quantity("1e3").unwrap().value, 1000.0);
        assert_eq!(parse_quantity("12E").unwrap().value, 12e18);
        let e = parse_quantity("4gb").unwrap_err();
        assert!(e.to_string().contains("did you mean `4G`"), "{e}");
        assert!(parse_quantity("lots").is_err());
        assert!(parse_quantity("1..2").is_err());
        assert!(parse_quantity("-1").is_err());
    }
}
