//! ROS 2 `ros2idl` schemas: the OMG IDL that rosidl generates (and rosbag2 concatenates,
//! each section after a line of `=` and `IDL: package/msg/Type`), read into the `.msg`
//! field lines [`super::ros`] resolves, so both kinds of schema decode the same way.
//!
//! Read: nested `module`s (the outermost is the package), `struct`s, `typedef`s (rosidl
//! names fixed arrays so: `typedef double double__9[9];`), the IDL primitives (`boolean`,
//! `octet`, `char`, `short`, `long`, `long long` and their `unsigned` forms, `float`,
//! `double`, `int8`…`uint64`), `string` and `string<N>`, `sequence<T>` and
//! `sequence<T, N>`, arrays (`T name[N]`) and scoped names (`pkg::msg::Type`). Skipped:
//! `#include` and other preprocessor lines, comments, annotations (`@default(value=1)`,
//! `@verbatim(...)`) and `const` declarations. Refused, with a reason: `enum`, `union`,
//! `long double`, `wchar` and arrays of arrays.

use std::collections::HashMap;

use super::MAX_DEPTH;

/// The `.msg` text of every struct of the IDL `text`, by `package/Type`.
pub(super) fn to_msg(text: &str) -> Result<Vec<(String, String)>, String> {
    let tokens = tokens(text)?;
    let mut p = Parser {
        tokens,
        at: 0,
        modules: Vec::new(),
        aliases: HashMap::new(),
        out: Vec::new(),
    };
    p.declarations()?;
    // Declarations stop at a `}` closing nothing: the rest would be skipped unread.
    if let Some(t) = p.peek() {
        return Err(format!("`{t}` closes no module"));
    }
    Ok(p.out)
}

/// Splits IDL into tokens: names (`::` kept inside scoped names), numbers, quoted strings
/// and single punctuation characters; comments and preprocessor lines dropped.
fn tokens(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let len = if c.is_whitespace() {
            c.len_utf8()
        } else if rest.starts_with("//") || (c == '#' && at_line_start(text, rest)) {
            rest.find('\n').unwrap_or(rest.len())
        } else if let Some(body) = rest.strip_prefix("/*") {
            body.find("*/")
                .map(|e| e + 4)
                .ok_or("an unclosed /* comment")?
        } else if c == '"' {
            let end = string_end(rest).ok_or("an unclosed string")?;
            out.push(rest[..end].to_owned());
            end
        } else if c.is_alphanumeric() || c == '_' || c == '.' || c == '-' || c == ':' {
            let end = rest
                .find(|ch: char| !(ch.is_alphanumeric() || "_.-+:".contains(ch)))
                .unwrap_or(rest.len());
            out.push(rest[..end].to_owned());
            end
        } else {
            out.push(c.to_string());
            c.len_utf8()
        };
        rest = &rest[len..];
    }
    Ok(out)
}

/// The length of the quoted string `rest` begins with (quotes included; `\"` escapes).
fn string_end(rest: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, ch) in rest.char_indices().skip(1) {
        match ch {
            '"' if !escaped => return Some(i + 1),
            '\\' => escaped = !escaped,
            _ => escaped = false,
        }
    }
    None
}

/// Whether `rest` (a suffix of `text`) begins a line, spaces aside.
fn at_line_start(text: &str, rest: &str) -> bool {
    let before = &text[..text.len() - rest.len()];
    before
        .rsplit('\n')
        .next()
        .is_none_or(|line| line.trim().is_empty())
}

struct Parser {
    tokens: Vec<String>,
    at: usize,
    /// The modules the parser is in, outermost first.
    modules: Vec<String>,
    /// `typedef`s: a name → the `.msg` type it stands for (with its array suffix).
    aliases: HashMap<String, String>,
    out: Vec<(String, String)>,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn next(&mut self) -> Result<String, String> {
        let t = self
            .tokens
            .get(self.at)
            .cloned()
            .ok_or("the IDL ends early")?;
        self.at += 1;
        Ok(t)
    }

    fn expect(&mut self, want: &str) -> Result<(), String> {
        match self.next()? {
            t if t == want => Ok(()),
            t => Err(format!("expected `{want}`, found `{t}`")),
        }
    }

    /// Declarations until the end of the text or of the module being read.
    fn declarations(&mut self) -> Result<(), String> {
        while let Some(t) = self.peek() {
            match t {
                "}" => return Ok(()),
                ";" => self.at += 1,
                "@" => self.annotation()?,
                "module" => {
                    self.at += 1;
                    let name = self.next()?;
                    if self.modules.len() >= MAX_DEPTH {
                        return Err(format!("modules nest deeper than {MAX_DEPTH}"));
                    }
                    self.expect("{")?;
                    self.modules.push(name);
                    self.declarations()?;
                    self.expect("}")?;
                    self.modules.pop();
                }
                "struct" => self.structure()?,
                "typedef" => {
                    self.at += 1;
                    let ty = self.ty()?;
                    let (name, array) = self.declarator()?;
                    self.expect(";")?;
                    let ty = with_array(&ty, &array)?;
                    self.aliases.insert(name, ty);
                }
                "const" => self.skip_to(";")?,
                other => return Err(format!("`{other}` declarations are not read")),
            }
        }
        Ok(())
    }

    /// `@name` or `@name(...)`: skipped.
    fn annotation(&mut self) -> Result<(), String> {
        self.at += 1;
        self.next()?;
        if self.peek() == Some("(") {
            self.skip_to(")")?;
        }
        Ok(())
    }

    /// Skips past the next `end` outside parentheses (for `)`: the one closing the `(`
    /// the skip starts at).
    fn skip_to(&mut self, end: &str) -> Result<(), String> {
        let mut depth = 0usize;
        loop {
            let t = self.next()?;
            match t.as_str() {
                "(" => depth += 1,
                ")" if end == ")" && depth == 1 => return Ok(()),
                ")" => depth = depth.saturating_sub(1),
                _ if t == end && depth == 0 => return Ok(()),
                _ => {}
            }
        }
    }

    /// `struct Name { members };`, written out as `.msg` lines.
    fn structure(&mut self) -> Result<(), String> {
        self.at += 1;
        let name = self.next()?;
        self.expect("{")?;
        let mut lines = String::new();
        while self.peek() != Some("}") {
            if self.peek() == Some("@") {
                self.annotation()?;
                continue;
            }
            let ty = self.ty()?;
            loop {
                let (field, array) = self.declarator()?;
                lines.push_str(&format!("{} {field}\n", with_array(&ty, &array)?));
                match self.next()?.as_str() {
                    "," => continue,
                    ";" => break,
                    t => return Err(format!("`{name}`.{field}: expected `;`, found `{t}`")),
                }
            }
        }
        self.expect("}")?;
        let pkg = self.modules.first().cloned().unwrap_or_default();
        self.out.push((format!("{pkg}/{name}"), lines));
        Ok(())
    }

    /// A name and its array bound (`name`, `name[3]`), for a member or a typedef.
    fn declarator(&mut self) -> Result<(String, String), String> {
        let name = self.next()?;
        let mut array = String::new();
        while self.peek() == Some("[") {
            self.at += 1;
            let n = self.next()?;
            self.expect("]")?;
            if !array.is_empty() {
                return Err(format!("`{name}`: arrays of arrays are not read"));
            }
            array = format!("[{n}]");
        }
        Ok((name, array))
    }

    /// A type: a primitive, a string, a sequence, or a (scoped) name.
    fn ty(&mut self) -> Result<String, String> {
        let first = self.next()?;
        let ty = match first.as_str() {
            "unsigned" => match (self.next()?.as_str(), self.peek()) {
                ("short", _) => "uint16".to_owned(),
                ("long", Some("long")) => {
                    self.at += 1;
                    "uint64".to_owned()
                }
                ("long", _) => "uint32".to_owned(),
                (t, _) => return Err(format!("`unsigned {t}` is not a type")),
            },
            "long" => match self.peek() {
                Some("long") => {
                    self.at += 1;
                    "int64".to_owned()
                }
                Some("double") => return Err("`long double` fields are not read".into()),
                _ => "int32".to_owned(),
            },
            "short" => "int16".to_owned(),
            "boolean" => "bool".to_owned(),
            "octet" => "byte".to_owned(),
            "char" => "char".to_owned(),
            "float" => "float32".to_owned(),
            "double" => "float64".to_owned(),
            "wchar" => return Err("`wchar` fields are not read".into()),
            "string" | "wstring" => {
                if self.peek() == Some("<") {
                    self.skip_to(">")?;
                }
                first.clone()
            }
            "sequence" => {
                self.expect("<")?;
                let inner = self.ty()?;
                let bound = match self.next()?.as_str() {
                    ">" => String::new(),
                    "," => {
                        let n = self.next()?;
                        self.expect(">")?;
                        format!("<={n}")
                    }
                    t => return Err(format!("`sequence<{inner}`: expected `>`, found `{t}`")),
                };
                return with_array(&inner, &format!("[{bound}]"));
            }
            "enum" | "union" => return Err(format!("`{first}` types are not read")),
            name => match self.aliases.get(name.rsplit("::").next().unwrap_or(name)) {
                Some(alias) => alias.clone(),
                None => name.replace("::", "/"),
            },
        };
        Ok(ty)
    }
}

/// `.msg` type `ty` with the array suffix `array` (`""`, `[3]`, `[]`, `[<=3]`).
fn with_array(ty: &str, array: &str) -> Result<String, String> {
    if ty.ends_with(']') && !array.is_empty() {
        return Err(format!("`{ty}{array}`: arrays of arrays are not read"));
    }
    Ok(format!("{ty}{array}"))
}

#[cfg(test)]
mod tests {
    use super::to_msg;

    #[test]
    fn rosidl_idl_reads_as_msg_lines() {
        let idl = r#"
            // generated from rosidl_adapter/resource/msg.idl.em
            #include "b/msg/N.idl"
            module a {
              module msg {
                typedef double double__3[3];
                module M_Constants { const uint8 X = 1; const string S = "a \" }; x"; };
                @verbatim (language="comment", text="x; (y)")
                struct M {
                  double__3 xs;
                  sequence<b::msg::N, 4> ns;
                  sequence<string<8>> names;
                  @default (value=3)
                  unsigned short u, v;
                  long long l;
                  octet o; /* a byte */
                  float f[2];
                };
              };
            };"#;
        assert_eq!(
            to_msg(idl).unwrap(),
            [(
                "a/M".to_owned(),
                "float64[3] xs\nb/msg/N[<=4] ns\nstring[] names\nuint16 u\nuint16 v\n\
                 int64 l\nbyte o\nfloat32[2] f\n"
                    .to_owned()
            )]
        );
    }

    #[test]
    fn what_is_not_read_says_so() {
        let no = |idl: &str| to_msg(idl).unwrap_err();
        assert!(no("module a { union U { }; };").contains("`union`"));
        assert!(no("module a { struct S { long double x; }; };").contains("long double"));
        assert!(
            no("module a { typedef double d[3]; struct S { d x[2]; }; };")
                .contains("arrays of arrays")
        );
        assert!(no("module a { struct S { double x; ").contains("ends early"));
        assert!(no("module a { /* open").contains("unclosed"));
        assert!(no(r#"module a { const string S = "open; };"#).contains("unclosed string"));
        // Nothing after a stray `}` is skipped unread.
        assert!(no("module a { }; }; module b { struct S { double x; }; };")
            .contains("closes no module"));
        let deep = "module a { ".repeat(100);
        assert!(no(&deep).contains("nest deeper"));
    }
}
