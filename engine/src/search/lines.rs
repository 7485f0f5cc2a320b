//! What a trial pushes: JSON lines `{"step": 3, "val_loss": 0.41, …}` appended to the
//! file named by `$DRIVETRAIN_METRICS` (by the trial itself or `drivetrain report`).
//! Each line's numbers are metrics at its step; a line that is not such an object is
//! refused with why, and counted by the reader (never dropped quietly).

/// The most bytes of one line; a longer one is refused.
pub const MAX_LINE: usize = 64 << 10;

/// What one line says: its step (if any) and its named numbers.
pub type Line = (Option<i64>, Vec<(String, f64)>);

/// Why a line is not one of metrics (counted and the first said by the trial's reader).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LineError {
    #[error("a line of {0} bytes, over {MAX_LINE}")]
    TooLong(usize),
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON object")]
    NotObject,
    #[error("`step` is {0}, not an integer")]
    Step(serde_json::Value),
    /// A trial's loss that blew up: refused, so the reader says so.
    #[error("`{0}` is NaN")]
    NaN(String),
    #[error("`{0}` is {1}, not a finite number")]
    NotANumber(String, serde_json::Value),
    #[error("names no metric")]
    NoMetric,
}

/// One line's step and its named numbers, or why the line is not one.
pub fn parse(line: &str) -> Result<Line, LineError> {
    if line.len() > MAX_LINE {
        return Err(LineError::TooLong(line.len()));
    }
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| LineError::NotJson(e.to_string()))?;
    let serde_json::Value::Object(fields) = value else {
        return Err(LineError::NotObject);
    };
    let mut step = None;
    let mut metrics = Vec::new();
    for (name, v) in fields {
        match (name.as_str(), v.as_f64()) {
            ("step", _) => match v.as_i64() {
                Some(s) => step = Some(s),
                None => return Err(LineError::Step(v)),
            },
            (_, Some(x)) if x.is_finite() => metrics.push((name, x)),
            (_, None) if v.as_str().is_some_and(|s| s.eq_ignore_ascii_case("nan")) => {
                return Err(LineError::NaN(name))
            }
            _ => return Err(LineError::NotANumber(name, v)),
        }
    }
    if metrics.is_empty() {
        return Err(LineError::NoMetric);
    }
    Ok((step, metrics))
}

/// A line `drivetrain report` appends: `step` (if given) and each `NAME=VALUE`.
pub fn line(step: Option<i64>, pairs: &[(String, f64)]) -> String {
    let mut o = serde_json::Map::new();
    if let Some(s) = step {
        o.insert("step".into(), s.into());
    }
    for (k, v) in pairs {
        o.insert(k.clone(), serde_json::Value::from(*v));
    }
    serde_json::Value::Object(o).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_a_step_and_its_numbers_and_nothing_else() {
        assert_eq!(
            parse(r#"{"step": 3, "val_loss": 0.41, "acc": 1}"#).unwrap(),
            (
                Some(3),
                vec![("val_loss".into(), 0.41), ("acc".into(), 1.0)]
            )
        );
        assert_eq!(
            parse(r#"{"loss": 2}"#).unwrap(),
            (None, vec![("loss".into(), 2.0)])
        );
        for (bad, why) in [
            ("val_loss=0.4", "not JSON"),
            ("[1, 2]", "not a JSON object"),
            (r#"{"step": 1.5, "l": 1}"#, "not an integer"),
            (r#"{"step": 1}"#, "names no metric"),
            (r#"{"l": "high"}"#, "not a finite number"),
            (r#"{"l": "NaN"}"#, "is NaN"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(parse(&format!(r#"{{"l": "{}"}}"#, "x".repeat(MAX_LINE))).is_err());
        let written = line(Some(7), &[("val_loss".into(), 0.25)]);
        assert_eq!(
            parse(&written).unwrap(),
            (Some(7), vec![("val_loss".into(), 0.25)])
        );
    }
}
