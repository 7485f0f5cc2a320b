//! A serde `Deserializer` over the located YAML tree.
//!
//! The spec types are plain serde types (`deny_unknown_fields`, usable from JSON too);
//! this deserializer is what makes their errors good. Each error it returns carries the
//! YAML path and span of the innermost value that failed. Unknown fields are found
//! before the derived visitor sees the mapping, so every unknown field of a mapping is
//! reported (with a "did you mean" hint from the struct's own field list) and the rest
//! of the mapping still deserializes. A type error is fatal for the value being built;
//! callers deserialize independent parts (each stage, each param) separately so one bad
//! stage does not hide the problems of the others.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use crate::diag::{did_you_mean, one_of, Diagnostic, Span};
use crate::yaml::{Entry, Node, Resolved, Value, YamlPath};

/// Deserializes `T` from `node` (found at `path`). Non-fatal problems (unknown fields) and
/// the fatal one, if any, are appended to `diags`; `None` when `T` could not be built.
pub fn from_node<T: de::DeserializeOwned>(
    node: &Node<'_>,
    path: &YamlPath,
    diags: &mut Vec<Diagnostic>,
) -> Option<T> {
    let sink = RefCell::new(Vec::new());
    let root = PathLink {
        parent: None,
        seg: PathSeg::Base(path),
    };
    let result = T::deserialize(NodeDe {
        node,
        path: Some(&root),
        sink: &sink,
    });
    diags.extend(sink.into_inner());
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            diags.push(e.into_diagnostic());
            None
        }
    }
}

/// A path as a chain of borrowed links: building a child path allocates nothing.
#[derive(Debug)]
struct PathLink<'p> {
    parent: Option<&'p PathLink<'p>>,
    seg: PathSeg<'p>,
}

#[derive(Debug, Clone, Copy)]
enum PathSeg<'p> {
    /// The path at which deserialization started.
    Base(&'p YamlPath),
    Key(&'p str),
    Index(usize),
}

impl<'p> PathLink<'p> {
    fn to_path(&self) -> YamlPath {
        let mut segs = Vec::new();
        let mut cur = Some(self);
        while let Some(l) = cur {
            match l.seg {
                PathSeg::Key(k) => segs.push(crate::yaml::Seg::Key(k.to_owned())),
                PathSeg::Index(i) => segs.push(crate::yaml::Seg::Index(i)),
                PathSeg::Base(base) => segs.extend(base.0.iter().rev().cloned()),
            }
            cur = l.parent;
        }
        segs.reverse();
        YamlPath(segs)
    }
}

fn path_of(link: Option<&PathLink<'_>>) -> YamlPath {
    link.map(PathLink::to_path).unwrap_or_default()
}

/// The error type of [`NodeDe`]: a message that gains its location on the way out.
#[derive(Debug)]
pub struct DeError {
    code: &'static str,
    msg: String,
    hint: Option<String>,
    located: Option<(YamlPath, Span)>,
}

impl DeError {
    fn new(code: &'static str, msg: String) -> Self {
        DeError {
            code,
            msg,
            hint: None,
            located: None,
        }
    }

    fn locate(mut self, path: Option<&PathLink<'_>>, span: Span) -> Self {
        if self.located.is_none() {
            self.located = Some((path_of(path), span));
        }
        self
    }

    fn into_diagnostic(self) -> Diagnostic {
        let mut d = Diagnostic::new(self.code, self.msg).maybe_hint(self.hint);
        if let Some((path, span)) = self.located {
            d = d.path(path).at(span);
        }
        d
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::new("invalid-value", msg.to_string())
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        let expected = friendly_expected(&exp.to_string());
        let mut e = DeError::new(
            "invalid-type",
            format!("expected {expected}, found {}", describe(&unexp)),
        );
        if expected == "a list" && matches!(unexp, de::Unexpected::Str(_)) {
            e.hint = Some("write a YAML list: `[a, b]` or one `- item` per line".to_owned());
        }
        e
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        DeError::new(
            "invalid-value",
            format!(
                "invalid value {}, expected {}",
                describe(&unexp),
                friendly_expected(&exp.to_string())
            ),
        )
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        let mut e = DeError::new(
            "unknown-variant",
            format!("unknown value `{variant}`, expected {}", one_of(expected)),
        );
        e.hint = did_you_mean(variant, expected.iter().copied());
        e
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let mut e = DeError::new(
            "unknown-field",
            format!("unknown field `{field}`, expected {}", one_of(expected)),
        );
        e.hint = did_you_mean(field, expected.iter().copied());
        e
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::new("missing-field", format!("missing required field `{field}`"))
    }
}

/// Serde's names for primitive types, in the words of a YAML author.
fn friendly_expected(exp: &str) -> String {
    match exp {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" | "a string" | "a number" => exp.to_owned(),
        "a sequence" => "a list".to_owned(),
        "a map" => "a mapping".to_owned(),
        other => other.to_owned(),
    }
}

fn describe(u: &de::Unexpected<'_>) -> String {
    match u {
        de::Unexpected::Str(s) => format!("string {s:?}"),
        de::Unexpected::Map => "a mapping".to_owned(),
        de::Unexpected::Seq => "a list".to_owned(),
        de::Unexpected::Unit => "null".to_owned(),
        other => other.to_string(),
    }
}

struct NodeDe<'de, 'p> {
    node: &'de Node<'de>,
    path: Option<&'p PathLink<'p>>,
    sink: &'p RefCell<Vec<Diagnostic>>,
}

impl<'de, 'p> NodeDe<'de, 'p> {
    fn loc(&self, e: DeError) -> DeError {
        e.locate(self.path, self.node.span)
    }

    fn any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.value {
            Value::Scalar { text, .. } => match self.node.scalar().unwrap_or(Resolved::Str(text)) {
                Resolved::Null => visitor.visit_unit(),
                Resolved::Bool(b) => visitor.visit_bool(b),
                Resolved::Int(i) => visitor.visit_i64(i),
                Resolved::Float(f) => visitor.visit_f64(f),
                Resolved::Str(_) => visitor.visit_borrowed_str(text),
            },
            Value::Seq(items) => visitor.visit_seq(SeqAcc {
                items: items.iter(),
                idx: 0,
                path: self.path,
                sink: self.sink,
            }),
            Value::Map(entries) => visitor.visit_map(MapAcc {
                entries: entries.iter().collect::<Vec<_>>().into_iter(),
                value: None,
                path: self.path,
                sink: self.sink,
            }),
        };
        r.map_err(|e| self.loc(e))
    }
}

impl<'de, 'p> de::Deserializer<'de> for NodeDe<'de, 'p> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.any(visitor)
    }

    /// Strings accept any scalar's text: `image: 1.4`, `FOO: 1` in env maps.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar { text, .. } if !matches!(self.node.scalar(), Some(Resolved::Null)) => {
                visitor
                    .visit_borrowed_str(text)
                    .map_err(|e: DeError| e.locate(self.path, self.node.span))
            }
            _ => self.any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if matches!(self.node.scalar(), Some(Resolved::Null)) {
            visitor.visit_none()
        } else {
            let (path, span) = (self.path, self.node.span);
            visitor.visit_some(self).map_err(|e| e.locate(path, span))
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let (path, span) = (self.path, self.node.span);
        visitor
            .visit_newtype_struct(self)
            .map_err(|e| e.locate(path, span))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let Value::Map(entries) = &self.node.value else {
            return Err(self.loc(DeError::new(
                "invalid-type",
                format!(
                    "expected a mapping ({}), found {}",
                    readable_struct(fields),
                    self.node.kind()
                ),
            )));
        };
        let mut known = Vec::with_capacity(entries.len());
        for e in entries {
            if fields.contains(&&*e.key) {
                known.push(e);
            } else {
                let field_path = match self.path {
                    Some(p) => p.to_path().key(&*e.key),
                    None => YamlPath::root().key(&*e.key),
                };
                self.sink.borrow_mut().push(
                    Diagnostic::new("unknown-field", format!("unknown field `{}`", e.key))
                        .at(e.key_span)
                        .path(field_path)
                        .note(format!("expected {}", one_of(fields)))
                        .maybe_hint(did_you_mean(&e.key, fields.iter().copied())),
                );
            }
        }
        visitor
            .visit_map(MapAcc {
                entries: known.into_iter(),
                value: None,
                path: self.path,
                sink: self.sink,
            })
            .map_err(|e| self.loc(e))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar { text, .. } => {
                if !variants.contains(&&**text) {
                    return Err(self.loc(de::Error::unknown_variant(text, variants)));
                }
                visitor
                    .visit_enum((&**text).into_deserializer())
                    .map_err(|e: DeError| self.loc(e))
            }
            Value::Map(entries) if entries.len() == 1 => {
                let entry = &entries[0];
                if !variants.contains(&&*entry.key) {
                    return Err(
                        <DeError as de::Error>::unknown_variant(&entry.key, variants)
                            .locate(self.path, entry.key_span),
                    );
                }
                visitor
                    .visit_enum(EnumAcc {
                        entry,
                        path: self.path,
                        sink: self.sink,
                    })
                    .map_err(|e| self.loc(e))
            }
            _ => Err(self.loc(DeError::new(
                "invalid-type",
                format!(
                    "expected one of {}, found {}",
                    one_of(variants),
                    self.node.kind()
                ),
            ))),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char
        bytes byte_buf unit unit_struct seq tuple tuple_struct map
    }
}

fn readable_struct(fields: &[&str]) -> String {
    let shown: Vec<&str> = fields.iter().take(6).copied().collect();
    let more = if fields.len() > shown.len() {
        ", …"
    } else {
        ""
    };
    format!("fields {}{more}", shown.join(", "))
}

struct SeqAcc<'de, 'p> {
    items: std::slice::Iter<'de, Node<'de>>,
    idx: usize,
    path: Option<&'p PathLink<'p>>,
    sink: &'p RefCell<Vec<Diagnostic>>,
}

impl<'de, 'p> de::SeqAccess<'de> for SeqAcc<'de, 'p> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(node) = self.items.next() else {
            return Ok(None);
        };
        let link = PathLink {
            parent: self.path,
            seg: PathSeg::Index(self.idx),
        };
        self.idx += 1;
        seed.deserialize(NodeDe {
            node,
            path: Some(&link),
            sink: self.sink,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapAcc<'de, 'p> {
    entries: std::vec::IntoIter<&'de Entry<'de>>,
    value: Option<&'de Entry<'de>>,
    path: Option<&'p PathLink<'p>>,
    sink: &'p RefCell<Vec<Diagnostic>>,
}

impl<'de, 'p> de::MapAccess<'de> for MapAcc<'de, 'p> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some(entry) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(entry);
        let link = PathLink {
            parent: self.path,
            seg: PathSeg::Key(&entry.key),
        };
        let key: de::value::BorrowedStrDeserializer<'de, DeError> =
            de::value::BorrowedStrDeserializer::new(&entry.key);
        seed.deserialize(key)
            .map(Some)
            .map_err(|e| e.locate(Some(&link), entry.key_span))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let entry = self
            .value
            .take()
            .ok_or_else(|| DeError::new("internal", "value requested before key".into()))?;
        let link = PathLink {
            parent: self.path,
            seg: PathSeg::Key(&entry.key),
        };
        seed.deserialize(NodeDe {
            node: &entry.value,
            path: Some(&link),
            sink: self.sink,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

struct EnumAcc<'de, 'p> {
    entry: &'de Entry<'de>,
    path: Option<&'p PathLink<'p>>,
    sink: &'p RefCell<Vec<Diagnostic>>,
}

impl<'de, 'p> de::EnumAccess<'de> for EnumAcc<'de, 'p> {
    type Error = DeError;
    type Variant = NodeDe<'de, 'p>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), DeError> {
        let key: de::value::BorrowedStrDeserializer<'de, DeError> =
            de::value::BorrowedStrDeserializer::new(&self.entry.key);
        let v = seed.deserialize(key)?;
        // The variant's content is reported at the key's path.
        Ok((
            v,
            NodeDe {
                node: &self.entry.value,
                path: self.path,
                sink: self.sink,
            },
        ))
    }
}

impl<'de, 'p> de::VariantAccess<'de> for NodeDe<'de, 'p> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Retry {
        limit: u32,
        #[serde(default)]
        backoff: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Stage {
        retries: Option<Retry>,
        #[serde(default)]
        needs: Vec<String>,
        mode: Option<Mode>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Allow,
        Forbid,
    }

    fn de<T: de::DeserializeOwned>(src: &str) -> (Option<T>, Vec<Diagnostic>) {
        let node = crate::yaml::parse(src).unwrap();
        let mut d = Vec::new();
        let v = from_node(&node, &YamlPath::root().key("stages").key("a"), &mut d);
        (v, d)
    }

    #[test]
    fn every_unknown_field_is_reported_and_the_rest_still_parses() {
        let (v, d) = de::<Stage>("retires: 1\nneeds: [x]\ntimout: 3\n");
        assert_eq!(v.unwrap().needs, vec!["x"]);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].path.as_deref(), Some("stages.a.retires"));
        assert_eq!(d[0].hint.as_deref(), Some("did you mean `retries`?"));
        assert_eq!(d[1].span.unwrap().line, 3);
    }

    #[test]
    fn type_errors_name_the_innermost_path() {
        let (v, d) = de::<Stage>("retries:\n  limit: two\n");
        assert!(v.is_none());
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].code, "invalid-type");
        assert_eq!(d[0].path.as_deref(), Some("stages.a.retries.limit"));
        assert_eq!(
            (d[0].span.unwrap().line, d[0].span.unwrap().column),
            (2, 10)
        );
    }

    #[test]
    fn missing_fields_point_at_the_mapping() {
        let (_, d) = de::<Stage>("retries:\n  backoff: 1s\n");
        assert_eq!(d[0].code, "missing-field");
        assert_eq!(d[0].path.as_deref(), Some("stages.a.retries"));
    }

    #[test]
    fn unknown_variants_get_hints() {
        let (_, d) = de::<Stage>("mode: forbidd\n");
        assert_eq!(d[0].code, "unknown-variant");
        assert_eq!(d[0].hint.as_deref(), Some("did you mean `forbid`?"));
        assert_eq!(d[0].path.as_deref(), Some("stages.a.mode"));
    }

    #[test]
    fn sequence_elements_are_indexed() {
        let (_, d) = de::<Stage>("needs: [a, [b]]\n");
        assert_eq!(d[0].path.as_deref(), Some("stages.a.needs[1]"));
    }

    #[test]
    fn scalars_coerce_to_strings() {
        let (v, d) = de::<Retry>("limit: 2\nbackoff: 30\n");
        assert!(d.is_empty());
        assert_eq!(v.unwrap().backoff.as_deref(), Some("30"));
    }
}
