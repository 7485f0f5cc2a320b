//! Messages decoded from the schema records their own files carry: protobuf (the
//! schema's `FileDescriptorSet`, through `prost-reflect`), ROS 2 (`ros2msg` or `ros2idl`
//! definitions, CDR payloads), ROS 1 (`ros1msg` definitions, ROS 1 serialization) and JSON (any
//! spelling of `json`). Every message becomes a [`Dyn`], a tree of named fields that a
//! field path ([`Path`]) reads; a schema that cannot be read or a payload that does not
//! decode is an error with the reason, which ingest counts per drive and topic.
//!
//! Sizes are bounded before anything is allocated: an array may not claim more elements
//! than bytes remain, and nesting stops at [`MAX_DEPTH`].

mod idl;
mod path;
mod proto;
mod ros;

use std::fmt::Write as _;
use std::sync::Arc;

pub use path::{Path, Seg};

/// How deep messages may nest (a schema nesting deeper, or naming itself, is refused).
pub const MAX_DEPTH: usize = 64;

/// A decoded value.
#[derive(Debug, Clone, PartialEq)]
pub enum Dyn {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Text(Arc<str>),
    /// `uint8[]`, `byte[]`, protobuf `bytes`: kept whole, read as unsigned integers.
    Bytes(Arc<[u8]>),
    List(Vec<Dyn>),
    /// A message: its fields in the schema's order.
    Map(Vec<(Arc<str>, Dyn)>),
}

impl Dyn {
    /// The value at `path`, or where it stops: `Err(depth)`, the number of segments
    /// that were found before the missing one.
    pub fn at(&self, path: &[Seg]) -> Result<Dyn, usize> {
        let mut here = self;
        for (i, seg) in path.iter().enumerate() {
            here = match (here, seg) {
                (Dyn::Map(fields), Seg::Field(name)) => {
                    match fields.iter().find(|(n, _)| **n == **name) {
                        Some((_, v)) => v,
                        None => return Err(i),
                    }
                }
                (Dyn::List(items), Seg::Index(n)) => items.get(*n).ok_or(i)?,
                (Dyn::Bytes(b), Seg::Index(n)) if i + 1 == path.len() => {
                    return b.get(*n).map(|v| Dyn::Uint(u64::from(*v))).ok_or(i)
                }
                _ => return Err(i),
            };
        }
        Ok(here.clone())
    }

    /// What is there at this level, for an error naming a missing field: the field
    /// names (nested messages as `name.{a,b,c}`), or what kind of value it is.
    pub fn describe(&self) -> String {
        match self {
            Dyn::Map(fields) if fields.is_empty() => "no fields".to_owned(),
            Dyn::Map(fields) => {
                let mut out = String::new();
                for (i, (name, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(name);
                    match v {
                        Dyn::Map(inner) if !inner.is_empty() => {
                            let names: Vec<&str> = inner.iter().map(|(n, _)| &**n).collect();
                            let _ = write!(out, ".{{{}}}", names.join(","));
                        }
                        Dyn::List(items) => {
                            let _ = write!(out, "[{}]", items.len());
                        }
                        Dyn::Bytes(b) => {
                            let _ = write!(out, "[{}]", b.len());
                        }
                        _ => {}
                    }
                }
                out
            }
            Dyn::List(items) => format!("a list of {} item(s)", items.len()),
            Dyn::Bytes(b) => format!("a list of {} byte(s)", b.len()),
            _ => "a single value".to_owned(),
        }
    }

    /// As JSON text, non-finite floats as the bare words Python's `json` writes (`NaN`,
    /// `Infinity`): the frame builder reads them as invalid values, counted.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        self.write_json(&mut out);
        out
    }

    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Dyn::Null => out.extend_from_slice(b"null"),
            Dyn::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Dyn::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
            Dyn::Uint(n) => out.extend_from_slice(n.to_string().as_bytes()),
            Dyn::Float(f) if f.is_nan() => out.extend_from_slice(b"NaN"),
            Dyn::Float(f) if f.is_infinite() => {
                out.extend_from_slice(if *f > 0.0 { b"Infinity" } else { b"-Infinity" })
            }
            Dyn::Float(f) => out.extend_from_slice(
                serde_json::to_string(f)
                    .unwrap_or_else(|_| "null".into())
                    .as_bytes(),
            ),
            Dyn::Text(s) => out.extend_from_slice(
                serde_json::to_string(&**s)
                    .unwrap_or_else(|_| "null".into())
                    .as_bytes(),
            ),
            Dyn::Bytes(b) => {
                Dyn::List(b.iter().map(|v| Dyn::Uint(u64::from(*v))).collect()).write_json(out)
            }
            Dyn::List(items) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    v.write_json(out);
                }
                out.push(b']');
            }
            Dyn::Map(fields) => {
                out.push(b'{');
                for (i, (name, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    Dyn::Text(name.clone()).write_json(out);
                    out.push(b':');
                    v.write_json(out);
                }
                out.push(b'}');
            }
        }
    }

    /// A JSON value as a `Dyn` (objects keep their key order).
    pub fn from_json(v: &serde_json::Value) -> Dyn {
        use serde_json::Value;
        match v {
            Value::Null => Dyn::Null,
            Value::Bool(b) => Dyn::Bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Dyn::Uint(u),
                (_, Some(i)) => Dyn::Int(i),
                _ => Dyn::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Dyn::Text(Arc::from(s.as_str())),
            Value::Array(a) => Dyn::List(a.iter().map(Dyn::from_json).collect()),
            Value::Object(o) => Dyn::Map(
                o.iter()
                    .map(|(k, v)| (Arc::from(k.as_str()), Dyn::from_json(v)))
                    .collect(),
            ),
        }
    }
}

/// Whether a channel's message encoding is JSON, however it is spelled.
pub fn is_json_encoding(message_encoding: &str) -> bool {
    message_encoding.eq_ignore_ascii_case("json")
        || message_encoding.eq_ignore_ascii_case("application/json")
}

/// How a channel's messages are decoded.
#[derive(Debug)]
pub enum Decoder {
    Json,
    Protobuf(proto::Proto),
    Ros(ros::Ros),
}

impl Decoder {
    /// The decoder of a channel, from its message encoding and its schema record; the
    /// reason when there is none.
    pub fn new(
        message_encoding: &str,
        schema_name: &str,
        schema_encoding: &str,
        schema: &[u8],
    ) -> Result<Decoder, String> {
        if is_json_encoding(message_encoding) {
            return Ok(Decoder::Json);
        }
        match message_encoding.to_ascii_lowercase().as_str() {
            "protobuf" => {
                proto::Proto::new(schema_name, schema_encoding, schema).map(Decoder::Protobuf)
            }
            "cdr" => ros::Ros::new(ros::Dialect::Ros2, schema_name, schema_encoding, schema)
                .map(Decoder::Ros),
            "ros1" => ros::Ros::new(ros::Dialect::Ros1, schema_name, schema_encoding, schema)
                .map(Decoder::Ros),
            "" => Err("the channel names no message encoding".to_owned()),
            other => Err(format!(
                "message encoding `{other}` is not one ingest decodes (json, protobuf, cdr, ros1)"
            )),
        }
    }

    /// Whether messages are JSON text (read as they are, without a schema).
    pub fn is_json(&self) -> bool {
        matches!(self, Decoder::Json)
    }

    /// One message's payload.
    pub fn decode(&self, data: &[u8]) -> Result<Dyn, String> {
        match self {
            Decoder::Json => json(data),
            Decoder::Protobuf(p) => p.decode(data),
            Decoder::Ros(r) => r.decode(data),
        }
    }
}

/// A JSON message. Python's bare `NaN` and `Infinity` are read as the strings they
/// spell, so a number column counts them invalid, as the default layout does.
fn json(data: &[u8]) -> Result<Dyn, String> {
    match serde_json::from_slice::<serde_json::Value>(data) {
        Ok(v) => Ok(Dyn::from_json(&v)),
        Err(e) => quote_non_finite(data)
            .and_then(|fixed| serde_json::from_slice::<serde_json::Value>(&fixed).ok())
            .map(|v| Dyn::from_json(&v))
            .ok_or_else(|| format!("not JSON: {e}")),
    }
}

/// `data` with the bare words `NaN`, `Infinity` and `-Infinity` outside strings put in
/// quotes, or `None` when it has none.
pub(crate) fn quote_non_finite(data: &[u8]) -> Option<Vec<u8>> {
    const WORDS: [&[u8]; 3] = [b"-Infinity", b"Infinity", b"NaN"];
    let mut out = Vec::with_capacity(data.len() + 8);
    let (mut in_string, mut escaped, mut changed) = (false, false, false);
    let mut i = 0;
    while i < data.len() {
        let b = data[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if let Some(w) = WORDS.iter().find(|w| data[i..].starts_with(w)) {
            out.push(b'"');
            out.extend_from_slice(w);
            out.push(b'"');
            i += w.len();
            changed = true;
            continue;
        }
        out.push(b);
        i += 1;
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_read_whatever_its_spelling_and_with_python_non_finite_words() {
        for enc in ["json", "JSON", "application/json"] {
            assert!(Decoder::new(enc, "", "", b"").unwrap().is_json());
        }
        let d = json(br#"{"a": NaN, "b": {"c": [1, -2, 2.5]}, "s": "x NaN"}"#).unwrap();
        assert_eq!(d.at(&[Seg::Field("a".into())]), Ok(Dyn::Text("NaN".into())));
        let p: Path = "b.c[1]".parse().unwrap();
        assert_eq!(d.at(&p.segs), Ok(Dyn::Int(-2)));
        assert_eq!(
            d.at(&[Seg::Field("s".into())]),
            Ok(Dyn::Text("x NaN".into()))
        );
        let missing: Path = "b.d".parse().unwrap();
        assert_eq!(d.at(&missing.segs), Err(1));
        assert_eq!(d.describe(), "a, b.{c}, s");
    }

    #[test]
    fn unknown_encodings_say_which_are_read() {
        let e = Decoder::new("flatbuffer", "x", "flatbuffer", b"").unwrap_err();
        assert!(
            e.contains("`flatbuffer`") && e.contains("protobuf, cdr, ros1"),
            "{e}"
        );
    }

    #[test]
    fn non_finite_floats_go_out_as_python_words() {
        let d = Dyn::Map(vec![
            ("x".into(), Dyn::Float(f64::NAN)),
            ("y".into(), Dyn::Float(-1.5)),
            ("z".into(), Dyn::Bytes(Arc::from(&[1u8, 2][..]))),
        ]);
        assert_eq!(d.to_json(), br#"{"x":NaN,"y":-1.5,"z":[1,2]}"#);
    }
}
