//! Field paths through nested messages and arrays: `twist.twist.linear.x`,
//! `position_covariance[4]`, `objects[0].class`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Field(Arc<str>),
    Index(usize),
}

/// A parsed field path (at least one field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub segs: Vec<Seg>,
}

/// The most segments a path may have.
const MAX_SEGS: usize = super::MAX_DEPTH;

impl FromStr for Path {
    type Err = String;

    fn from_str(s: &str) -> Result<Path, String> {
        let mut segs = Vec::new();
        for part in s.split('.') {
            let (name, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            let ok = |c: char| c.is_ascii_alphanumeric() || c == '_';
            if name.is_empty() || !name.chars().all(ok) {
                return Err(format!(
                    "`{s}`: `{part}` is not a field name (letters, digits and `_`, then `[N]` indexes)"
                ));
            }
            segs.push(Seg::Field(Arc::from(name)));
            while !rest.is_empty() {
                let close = rest.find(']').filter(|_| rest.starts_with('['));
                let n = close.and_then(|c| rest[1..c].parse::<usize>().ok());
                match (close, n) {
                    (Some(c), Some(n)) => {
                        segs.push(Seg::Index(n));
                        rest = &rest[c + 1..];
                    }
                    _ => return Err(format!("`{s}`: `{rest}` is not an index like `[0]`")),
                }
            }
        }
        if segs.len() > MAX_SEGS {
            return Err(format!("`{s}` is deeper than {MAX_SEGS} fields"));
        }
        Ok(Path { segs })
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.segs.iter().enumerate() {
            match seg {
                Seg::Field(name) if i == 0 => write!(f, "{name}")?,
                Seg::Field(name) => write!(f, ".{name}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

impl Path {
    /// The path up to (not including) segment `n`, for an error saying where it stopped.
    pub fn upto(&self, n: usize) -> String {
        Path {
            segs: self.segs[..n].to_vec(),
        }
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_fields_and_indexes_and_refuse_the_rest() {
        let p: Path = "pose.covariance[4].x".parse().unwrap();
        assert_eq!(
            p.segs,
            [
                Seg::Field("pose".into()),
                Seg::Field("covariance".into()),
                Seg::Index(4),
                Seg::Field("x".into())
            ]
        );
        assert_eq!(p.to_string(), "pose.covariance[4].x");
        assert_eq!(p.upto(2), "pose.covariance");
        for bad in ["", "a..b", "a[x]", "a[1", "a b", "[0]"] {
            assert!(bad.parse::<Path>().is_err(), "{bad}");
        }
        assert!(vec!["a"; 65].join(".").parse::<Path>().is_err());
    }
}
