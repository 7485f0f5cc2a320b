//! A located YAML tree: the first layer between the user's bytes and the spec.
//!
//! The pipeline file is parsed into [`Node`]s that remember where each value and each
//! mapping key came from (byte range, line, column). Everything later (serde
//! deserialization in [`crate::de`], semantic validation in [`crate::validate`]) reports
//! problems through these spans, so a user always sees `file:line:column` and the YAML
//! path. This module knows nothing about pipelines.
//!
//! Scalars keep their source text and whether they were quoted; their type (null, bool,
//! integer, float, string) is resolved lazily with the YAML 1.2 core schema, which lets a
//! string field accept `image: 1.4` without the YAML 1.1 surprises (`on: yes`).
//! Duplicate keys are errors (YAML forbids them; most parsers silently keep the last).
//! Aliases are expanded, bounded by [`MAX_NODES`] and [`MAX_BYTES`] so an alias bomb
//! cannot exhaust memory,
//! and `<<` merge keys are honoured because pipeline authors use them for shared blocks.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, Span as YSpan};

use crate::diag::{Diagnostic, Span};

/// Upper bound on nodes in one document, aliases expanded.
pub const MAX_NODES: usize = 2_000_000;
/// Upper bound on the text of all scalars in one document, aliases expanded. Expanded
/// aliases share the source's bytes in the tree, but everything after it (JSON values,
/// deserialized strings) owns a copy, so this is what bounds memory.
pub const MAX_BYTES: usize = 32 << 20;
/// Upper bound on nesting depth.
pub const MAX_DEPTH: usize = 256;

/// One YAML value with its location.
#[derive(Debug, Clone, PartialEq)]
pub struct Node<'a> {
    pub value: Value<'a>,
    pub span: Span,
}

/// The shape of a YAML value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// A scalar with its source text; `plain` is false for quoted and block scalars,
    /// which are always strings.
    Scalar {
        text: Cow<'a, str>,
        plain: bool,
    },
    Seq(Vec<Node<'a>>),
    Map(Vec<Entry<'a>>),
}

/// A mapping entry: the key's text and location, and the value.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<'a> {
    pub key: Cow<'a, str>,
    pub key_span: Span,
    pub value: Node<'a>,
}

/// A scalar resolved with the YAML 1.2 core schema.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resolved<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
}

impl<'a> Node<'a> {
    /// The resolved scalar, or `None` for sequences and mappings.
    pub fn scalar(&self) -> Option<Resolved<'_>> {
        match &self.value {
            Value::Scalar { text, plain } => Some(if *plain {
                resolve_plain(text)
            } else {
                Resolved::Str(text)
            }),
            _ => None,
        }
    }

    /// The scalar's text, whatever its resolved type.
    pub fn scalar_text(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The node as a string, if it resolves to one.
    pub fn as_str(&self) -> Option<&str> {
        match self.scalar()? {
            Resolved::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[Entry<'a>]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node<'a>]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The entry under `key`, if this is a mapping that has it.
    pub fn entry(&self, key: &str) -> Option<&Entry<'a>> {
        self.as_map()?.iter().find(|e| e.key == key)
    }

    pub fn get(&self, key: &str) -> Option<&Node<'a>> {
        self.entry(key).map(|e| &e.value)
    }

    /// A short description of the node's kind for error messages.
    pub fn kind(&self) -> &'static str {
        match self.scalar() {
            Some(Resolved::Null) => "null",
            Some(Resolved::Bool(_)) => "a boolean",
            Some(Resolved::Int(_)) => "an integer",
            Some(Resolved::Float(_)) => "a number",
            Some(Resolved::Str(_)) => "a string",
            None if matches!(self.value, Value::Seq(_)) => "a list",
            None => "a mapping",
        }
    }

    /// Walks `path` from this node. Returns the deepest node reached and, when the walk
    /// ended on a mapping key, that key's span, so errors about a key point at the key.
    pub fn locate(&self, path: &YamlPath) -> Located<'_, 'a> {
        let mut node = self;
        let mut key_span = None;
        for seg in &path.0 {
            let next = match (seg, &node.value) {
                (Seg::Key(k), Value::Map(entries)) => entries
                    .iter()
                    .find(|e| &e.key == k)
                    .map(|e| (&e.value, Some(e.key_span))),
                (Seg::Index(i), Value::Seq(items)) => items.get(*i).map(|n| (n, None)),
                _ => None,
            };
            match next {
                Some((n, ks)) => {
                    node = n;
                    key_span = ks;
                }
                None => {
                    return Located {
                        node,
                        key_span,
                        exact: false,
                    }
                }
            }
        }
        Located {
            node,
            key_span,
            exact: true,
        }
    }

    /// Converts to JSON with core-schema scalars (for params, `with` blocks and values).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Scalar { text, .. } => match self.scalar().unwrap_or(Resolved::Str(text)) {
                Resolved::Null => J::Null,
                Resolved::Bool(b) => J::Bool(b),
                Resolved::Int(i) => J::from(i),
                Resolved::Float(f) => serde_json::Number::from_f64(f)
                    .map(J::Number)
                    .unwrap_or_else(|| J::String(text.to_string())),
                Resolved::Str(s) => J::String(s.to_owned()),
            },
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|e| (e.key.to_string(), e.value.to_json()))
                    .collect(),
            ),
        }
    }
}

/// The result of [`Node::locate`].
#[derive(Debug, Clone, Copy)]
pub struct Located<'n, 'a> {
    pub node: &'n Node<'a>,
    pub key_span: Option<Span>,
    /// False when the path did not exist all the way down (the node is its deepest
    /// existing ancestor).
    pub exact: bool,
}

/// Resolves a plain scalar with the YAML 1.2 core schema.
pub fn resolve_plain(text: &str) -> Resolved<'_> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "true" | "True" | "TRUE" => return Resolved::Bool(true),
        "false" | "False" | "FALSE" => return Resolved::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    let bytes = text.as_bytes();
    let first = bytes[0];
    if !(first.is_ascii_digit() || first == b'-' || first == b'+' || first == b'.') {
        return Resolved::Str(text);
    }
    if let Some(hex) = text.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(hex, 16) {
            return Resolved::Int(i);
        }
    }
    if let Some(oct) = text.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(oct, 8) {
            return Resolved::Int(i);
        }
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = text.parse::<i64>() {
            return Resolved::Int(i);
        }
    }
    // A float per the core schema: [-+]? (\.[0-9]+ | [0-9]+ (\.[0-9]*)?) ([eE][-+]?[0-9]+)?
    let is_float_syntax = {
        let (mantissa, exp) = match digits.find(['e', 'E']) {
            Some(i) => (&digits[..i], Some(&digits[i + 1..])),
            None => (digits, None),
        };
        let mantissa_ok = match mantissa.split_once('.') {
            Some((int, frac)) => {
                (!int.is_empty() || !frac.is_empty())
                    && int.bytes().all(|b| b.is_ascii_digit())
                    && frac.bytes().all(|b| b.is_ascii_digit())
            }
            None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
        };
        let exp_ok = exp.is_none_or(|e| {
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
        });
        mantissa_ok && exp_ok
    };
    if is_float_syntax {
        if let Ok(f) = text.parse::<f64>() {
            return Resolved::Float(f);
        }
    }
    Resolved::Str(text)
}

/// One step of a YAML path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A path into the document, shown as `stages.train.inputs.dataset` or `stages.a.needs[0]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct YamlPath(pub Vec<Seg>);

impl YamlPath {
    pub fn root() -> Self {
        YamlPath(Vec::new())
    }

    /// This path extended by a key.
    pub fn key(&self, k: impl Into<String>) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.into()));
        p
    }

    /// This path extended by an index.
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }

    /// Parses the display form back (`a.b[2].c`); keys with dots use `["a.b"]`.
    pub fn parse(s: &str) -> Self {
        let mut segs = Vec::new();
        for part in s.split('.').filter(|p| !p.is_empty()) {
            let (key, rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !key.is_empty() {
                segs.push(Seg::Key(key.to_owned()));
            }
            for idx in rest.split('[').filter(|x| !x.is_empty()) {
                if let Ok(i) = idx.trim_end_matches(']').parse() {
                    segs.push(Seg::Index(i));
                }
            }
        }
        YamlPath(segs)
    }
}

impl fmt::Display for YamlPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(document)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if is_plain_key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Key(k) => write!(f, "[{k:?}]")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Maps saphyr's character-based markers to byte offsets.
struct LineIndex {
    /// Byte offset of the start of each line.
    starts: Vec<usize>,
    ascii: bool,
}

impl LineIndex {
    fn new(src: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex {
            starts,
            ascii: src.is_ascii(),
        }
    }

    /// Byte offset of (1-based line, 0-based char column).
    fn offset(&self, src: &str, line: usize, col: usize) -> usize {
        let line = line.max(1);
        let Some(&start) = self.starts.get(line - 1) else {
            return src.len();
        };
        if self.ascii {
            return (start + col).min(src.len());
        }
        src[start..]
            .char_indices()
            .nth(col)
            .map(|(i, _)| start + i)
            .unwrap_or(src.len())
    }

    fn span(&self, src: &str, s: YSpan) -> Span {
        let start = self.offset(src, s.start.line(), s.start.col());
        let end = self.offset(src, s.end.line(), s.end.col()).max(start);
        Span {
            start,
            end,
            line: s.start.line().max(1) as u32,
            column: s.start.col() as u32 + 1,
        }
    }
}

enum Frame<'a> {
    Seq {
        span: Span,
        anchor: usize,
        items: Vec<Node<'a>>,
    },
    Map {
        span: Span,
        anchor: usize,
        entries: Vec<Entry<'a>>,
        /// A key read, waiting for its value.
        pending_key: Option<(Cow<'a, str>, Span)>,
        merges: Vec<Node<'a>>,
        /// Key → entry position, built once a mapping is large enough that scanning
        /// for duplicates would be quadratic (a 10,000-stage `stages:` map).
        index: Option<HashMap<String, usize>>,
    },
}

/// Finds `key` among `entries`: a scan for small mappings, a hash index for large ones.
fn find_key(
    entries: &[Entry<'_>],
    index: &mut Option<HashMap<String, usize>>,
    key: &str,
) -> Option<usize> {
    const SCAN_LIMIT: usize = 16;
    if entries.len() < SCAN_LIMIT {
        return entries.iter().position(|e| e.key == key);
    }
    index
        .get_or_insert_with(|| {
            entries
                .iter()
                .enumerate()
                .map(|(i, e)| (e.key.to_string(), i))
                .collect()
        })
        .get(key)
        .copied()
}

/// Parses one YAML document into a located tree. Problems come back as diagnostics:
/// syntax errors (one, where the parser stopped), duplicate keys, non-scalar keys,
/// unknown aliases and documents beyond the size bounds.
pub fn parse(src: &str) -> Result<Node<'_>, Vec<Diagnostic>> {
    let mut parser = Parser::new_from_str(src);
    let mut b = Builder {
        src,
        index: LineIndex::new(src),
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        docs: 0,
        count: 0,
        bytes: 0,
        errors: Vec::new(),
    };
    while let Some(ev) = parser.next_event() {
        let step = match ev {
            Ok((event, yspan)) => b.event(event, yspan),
            Err(e) => Err(b.syntax_error(&e)),
        };
        if step.is_err() {
            return Err(b.errors);
        }
    }
    b.finish()
}

/// Parsing stopped at the last diagnostic in [`Builder::errors`].
struct Stop;

/// The tree being built from the parser's events: the open collections, the anchors
/// seen, and the size so far (aliases expanded).
struct Builder<'a> {
    src: &'a str,
    index: LineIndex,
    stack: Vec<Frame<'a>>,
    /// Each anchor with its weight (values, scalar bytes), counted once.
    anchors: HashMap<usize, (Node<'a>, usize, usize)>,
    root: Option<Node<'a>>,
    docs: usize,
    count: usize,
    bytes: usize,
    errors: Vec<Diagnostic>,
}

impl<'a> Builder<'a> {
    /// One event: a value it completes goes into the collection that holds it.
    fn event(&mut self, event: Event<'a>, yspan: YSpan) -> Result<(), Stop> {
        let span = self.index.span(self.src, yspan);
        let complete = match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart(_) => self.document_start(span)?,
            Event::Scalar(text, style, anchor, tag) => {
                self.count += 1;
                self.bytes += text.len();
                // `!!int 3` and friends resolve as plain scalars; `!!str` and custom tags
                // keep the text as a string.
                let core_non_str = matches!(
                    tag.as_deref(),
                    Some(t) if t.is_yaml_core_schema() && t.suffix != "str"
                );
                let plain = (matches!(style, ScalarStyle::Plain) && tag.is_none()) || core_non_str;
                let value = Value::Scalar {
                    text: tight(text),
                    plain,
                };
                Some((Node { value, span }, anchor))
            }
            Event::Alias(id) => Some((self.alias(id, span)?, 0)),
            Event::SequenceStart(anchor, _) => {
                self.count += 1;
                self.stack.push(Frame::Seq {
                    span,
                    anchor,
                    items: Vec::new(),
                });
                None
            }
            Event::MappingStart(anchor, _) => {
                self.count += 1;
                self.stack.push(Frame::Map {
                    span,
                    anchor,
                    entries: Vec::new(),
                    pending_key: None,
                    merges: Vec::new(),
                    index: None,
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(span),
        };
        self.check_bounds(span)?;
        if let Some((node, anchor)) = complete {
            if anchor != 0 {
                let (nodes, size) = weigh(&node);
                self.anchors.insert(anchor, (node.clone(), nodes, size));
            }
            self.attach(node);
        }
        Ok(())
    }

    fn syntax_error(&mut self, e: &saphyr_parser::ScanError) -> Stop {
        let m = e.marker();
        let off = self.index.offset(self.src, m.line(), m.col());
        let at = Span {
            start: off,
            end: off,
            line: m.line().max(1) as u32,
            column: m.col() as u32 + 1,
        };
        let message = format!("YAML syntax error: {}", e.info());
        self.errors
            .push(Diagnostic::new("yaml-syntax", message).at(at));
        Stop
    }

    fn document_start(&mut self, span: Span) -> Result<Option<(Node<'a>, usize)>, Stop> {
        self.docs += 1;
        if self.docs > 1 {
            self.errors.push(
                Diagnostic::new(
                    "yaml-multiple-documents",
                    "a pipeline file holds exactly one YAML document",
                )
                .at(span)
                .hint("remove the `---` separator or split the file in two"),
            );
            return Err(Stop);
        }
        Ok(None)
    }

    /// The anchored value an alias names, counted again, at the alias's place.
    fn alias(&mut self, id: usize, span: Span) -> Result<Node<'a>, Stop> {
        match self.anchors.get(&id) {
            Some((n, nodes, size)) => {
                self.count += nodes;
                self.bytes += size;
                let mut n = n.clone();
                n.span = span;
                Ok(n)
            }
            None => {
                self.errors
                    .push(Diagnostic::new("yaml-syntax", "unknown alias").at(span));
                Err(Stop)
            }
        }
    }

    /// The collection that ends at `span`, complete (merge keys applied to a mapping).
    fn close(&mut self, span: Span) -> Option<(Node<'a>, usize)> {
        match self.stack.pop()? {
            Frame::Seq {
                span: s,
                anchor,
                mut items,
            } => {
                items.shrink_to_fit();
                let value = Value::Seq(items);
                Some((
                    Node {
                        value,
                        span: s.to(span),
                    },
                    anchor,
                ))
            }
            Frame::Map {
                span: s,
                anchor,
                mut entries,
                merges,
                ..
            } => {
                for m in merges {
                    merge_into(&mut entries, m);
                }
                entries.shrink_to_fit();
                let value = Value::Map(entries);
                Some((
                    Node {
                        value,
                        span: s.to(span),
                    },
                    anchor,
                ))
            }
        }
    }

    /// Stops at a document larger or deeper than the bounds.
    fn check_bounds(&mut self, span: Span) -> Result<(), Stop> {
        let refused = if self.count > MAX_NODES {
            Diagnostic::new(
                "yaml-too-large",
                format!("the document expands to more than {MAX_NODES} values"),
            )
            .hint("aliases are expanded; an alias of an alias multiplies the size")
        } else if self.bytes > MAX_BYTES {
            Diagnostic::new(
                "yaml-too-large",
                format!(
                    "the document holds more than {} MiB of text",
                    MAX_BYTES >> 20
                ),
            )
            .hint("aliases are expanded: each `*alias` counts the anchored value's text again")
        } else if self.stack.len() > MAX_DEPTH {
            Diagnostic::new(
                "yaml-too-deep",
                format!("the document nests deeper than {MAX_DEPTH} levels"),
            )
        } else {
            return Ok(());
        };
        self.errors.push(refused.at(span));
        Err(Stop)
    }

    /// Puts a complete value where it belongs: the root, the next item of a sequence, or
    /// a mapping's key or the value of its pending key.
    fn attach(&mut self, node: Node<'a>) {
        // Where an earlier entry with the same key is, if the value completes an entry.
        let duplicate = match self.stack.last_mut() {
            Some(Frame::Map {
                pending_key: Some((key, _)),
                entries,
                index,
                ..
            }) if key != "<<" => find_key(entries, index, key),
            _ => None,
        };
        let dup_path = duplicate.map(|_| self.path());
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map {
                entries,
                pending_key,
                merges,
                index,
                ..
            }) => match pending_key.take() {
                None => match &node.value {
                    Value::Scalar { text, .. } => {
                        *pending_key = Some((text.clone(), node.span));
                    }
                    _ => {
                        self.errors.push(
                            Diagnostic::new(
                                "yaml-complex-key",
                                format!("mapping keys must be scalars, found {}", node.kind()),
                            )
                            .at(node.span),
                        );
                        *pending_key = Some((Cow::Borrowed(""), node.span));
                    }
                },
                Some((key, key_span)) => {
                    if key == "<<" && matches!(node.value, Value::Map(_) | Value::Seq(_)) {
                        merges.push(node);
                    } else if let Some(first) = duplicate.map(|i| &entries[i]) {
                        self.errors.push(
                            Diagnostic::new("duplicate-key", format!("duplicate key `{key}`"))
                                .at(key_span)
                                .path(dup_path.unwrap_or_default())
                                .note(format!(
                                    "first defined at line {}, column {}",
                                    first.key_span.line, first.key_span.column
                                ))
                                .hint("YAML keys must be unique within a mapping; merge the two entries"),
                        );
                    } else {
                        if let Some(ix) = index {
                            ix.insert(key.to_string(), entries.len());
                        }
                        entries.push(Entry {
                            key,
                            key_span,
                            value: node,
                        });
                    }
                }
            },
        }
    }

    /// The YAML path of the value being completed.
    fn path(&self) -> YamlPath {
        let mut path = YamlPath::root();
        for f in &self.stack {
            match f {
                Frame::Seq { items, .. } => path = path.index(items.len()),
                Frame::Map {
                    pending_key: Some((k, _)),
                    ..
                } => path = path.key(k.clone()),
                Frame::Map { .. } => {}
            }
        }
        path
    }

    fn finish(self) -> Result<Node<'a>, Vec<Diagnostic>> {
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        match self.root {
            Some(node) => Ok(node),
            None => Err(vec![Diagnostic::new("empty-document", "the file is empty")
                .at(Span {
                    start: 0,
                    end: 0,
                    line: 1,
                    column: 1,
                })
                .hint(
                    "a pipeline needs at least `version: 1`, `name` and `stages`",
                )]),
        }
    }
}

/// Drops the spare capacity the scanner left in an owned scalar: a document keeps
/// hundreds of thousands of them alive until validation ends.
fn tight(text: Cow<'_, str>) -> Cow<'_, str> {
    match text {
        Cow::Owned(mut s) => {
            s.shrink_to_fit();
            Cow::Owned(s)
        }
        borrowed => borrowed,
    }
}

/// Values and scalar bytes in `n`, keys included (the parser counts a key as a scalar).
fn weigh(n: &Node<'_>) -> (usize, usize) {
    let add = |(a, b): (usize, usize), (c, d): (usize, usize)| (a + c, b + d);
    match &n.value {
        Value::Scalar { text, .. } => (1, text.len()),
        Value::Seq(items) => items.iter().map(weigh).fold((1, 0), add),
        Value::Map(entries) => entries
            .iter()
            .map(|e| add((1, e.key.len()), weigh(&e.value)))
            .fold((1, 0), add),
    }
}

/// Applies a `<<` merge: keys already present win.
fn merge_into<'a>(entries: &mut Vec<Entry<'a>>, merge: Node<'a>) {
    let sources = match merge.value {
        Value::Map(m) => vec![m],
        Value::Seq(items) => items
            .into_iter()
            .filter_map(|n| match n.value {
                Value::Map(m) => Some(m),
                _ => None,
            })
            .collect(),
        Value::Scalar { .. } => Vec::new(),
    };
    for source in sources {
        for e in source {
            if !entries.iter().any(|x| x.key == e.key) {
                entries.push(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_core_schema_scalars() {
        assert_eq!(resolve_plain("3"), Resolved::Int(3));
        assert_eq!(resolve_plain("-3"), Resolved::Int(-3));
        assert_eq!(resolve_plain("2.5"), Resolved::Float(2.5));
        assert_eq!(resolve_plain("1e3"), Resolved::Float(1000.0));
        assert_eq!(resolve_plain("true"), Resolved::Bool(true));
        assert_eq!(resolve_plain("~"), Resolved::Null);
        assert_eq!(resolve_plain("yes"), Resolved::Str("yes"));
        assert_eq!(resolve_plain("1.4.2"), Resolved::Str("1.4.2"));
        assert_eq!(resolve_plain("4Gi"), Resolved::Str("4Gi"));
        assert_eq!(resolve_plain("0x1f"), Resolved::Int(31));
        assert_eq!(resolve_plain("-"), Resolved::Str("-"));
    }

    #[test]
    fn spans_point_at_keys_and_values() {
        let src = "a: 1\nb:\n  c: [x, \"y\"]\n";
        let root = parse(src).unwrap();
        let loc = root.locate(&YamlPath::parse("b.c[1]"));
        assert!(loc.exact);
        assert_eq!(loc.node.as_str(), Some("y"));
        assert_eq!((loc.node.span.line, loc.node.span.column), (3, 10));
        let loc = root.locate(&YamlPath::parse("b.c"));
        let ks = loc.key_span.unwrap();
        assert_eq!((ks.line, ks.column), (3, 3));
        assert_eq!(&src[ks.start..ks.end], "c");
    }

    #[test]
    fn duplicate_keys_are_reported_with_both_places() {
        let errs = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].code, "duplicate-key");
        assert_eq!(errs[0].span.unwrap().line, 3);
        assert_eq!(errs[0].path.as_deref(), Some("a"));
        let errs = parse("s:\n  - x: 1\n  - y: {k: 1, k: 2}\n").unwrap_err();
        assert_eq!(errs[0].path.as_deref(), Some("s[1].y.k"));
        assert!(errs[0].notes[0].contains("line 3"));
    }

    #[test]
    fn merge_keys_and_aliases() {
        let root = parse("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n").unwrap();
        let d = root.get("d").unwrap();
        assert_eq!(d.get("x").unwrap().scalar(), Some(Resolved::Int(1)));
        assert_eq!(d.get("y").unwrap().scalar(), Some(Resolved::Int(3)));
    }

    #[test]
    fn alias_bombs_are_bounded() {
        let mut src = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            src.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let errs = parse(&src).unwrap_err();
        assert_eq!(errs[0].code, "yaml-too-large");

        // Few values, much text: a 100 KB scalar aliased 20,000 times (2 GB expanded) is
        // refused at the byte bound, at the alias that crosses it.
        let mut src = format!("x: &a {}\nl:\n", "y".repeat(100_000));
        for _ in 0..20_000 {
            src.push_str("  - *a\n");
        }
        let errs = parse(&src).unwrap_err();
        assert_eq!(errs[0].code, "yaml-too-large");
        assert!(errs[0].message.contains("32 MiB"), "{}", errs[0].message);
        let line = errs[0].span.unwrap().line as usize;
        assert_eq!(line, 2 + MAX_BYTES / 100_000, "{}", errs[0]);
    }

    #[test]
    fn syntax_errors_are_located() {
        let errs = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert_eq!(errs[0].code, "yaml-syntax");
        assert!(errs[0].span.unwrap().line >= 1);
    }

    #[test]
    fn non_ascii_columns_map_to_bytes() {
        let src = "ä: \"ö\"\nb: x\n";
        let root = parse(src).unwrap();
        let n = root.get("b").unwrap();
        assert_eq!(&src[n.span.start..n.span.end], "x");
    }

    #[test]
    fn path_display_round_trips() {
        let p = YamlPath::root()
            .key("stages")
            .key("a")
            .key("needs")
            .index(2);
        assert_eq!(p.to_string(), "stages.a.needs[2]");
        assert_eq!(YamlPath::parse(&p.to_string()), p);
    }
}
