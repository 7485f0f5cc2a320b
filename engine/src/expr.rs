//! `when:` conditions: a small boolean expression language over references.
//!
//! ```text
//! expr    := or
//! or      := and (("||" | "or") and)*
//! and     := not (("&&" | "and") not)*
//! not     := ("!" | "not") not | cmp
//! cmp     := primary (("==" | "!=" | "<" | "<=" | ">" | ">=") primary)?
//! primary := number | 'string' | "string" | true | false | null | reference | "(" expr ")"
//! ```
//!
//! References are the same as in templates, written without braces
//! (`stages.validate.values.passed == true`). Values never become code: a condition is
//! parsed once from the spec, and run-time values are only compared.

use std::fmt;
use std::ops::Range;

use serde_json::Value;

use crate::template::Ref;

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Lit(Value),
    Ref(Ref, Range<usize>),
    Not(Box<Expr>),
    /// `a && b && c`: a chain is one node, so its length never adds depth.
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
}

/// How deep parentheses and `!` may nest in one condition. The parser, evaluation and
/// drop all recurse on that depth, so it is bounded well below what a thread's stack
/// holds (the async workers of `serve` have 2 MiB).
pub const MAX_DEPTH: usize = 64;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A syntax error with the byte range in the condition string.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprError {
    pub message: String,
    pub range: Range<usize>,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Num(f64),
    Str(String),
    Op(&'static str),
    LParen,
    RParen,
}

fn lex(src: &str) -> Result<Vec<(Tok, Range<usize>)>, ExprError> {
    let b = src.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if src[i..].starts_with("{{") {
            return Err(ExprError {
                message:
                    "`when` is an expression, not a template: write references without `{{ }}`"
                        .into(),
                range: i..(i + 2),
            });
        }
        let two = src.get(i..i + 2).unwrap_or("");
        let op2 = ["==", "!=", "<=", ">=", "&&", "||"]
            .into_iter()
            .find(|o| *o == two);
        if let Some(op) = op2 {
            out.push((Tok::Op(op), i..i + 2));
            i += 2;
            continue;
        }
        match c {
            b'(' => out.push((Tok::LParen, i..i + 1)),
            b')' => out.push((Tok::RParen, i..i + 1)),
            b'<' => out.push((Tok::Op("<"), i..i + 1)),
            b'>' => out.push((Tok::Op(">"), i..i + 1)),
            b'!' => out.push((Tok::Op("!"), i..i + 1)),
            b'=' => {
                return Err(ExprError {
                    message: "`=` is not an operator; compare with `==`".into(),
                    range: i..i + 1,
                })
            }
            b'\'' | b'"' => {
                let q = c;
                let Some(end) = b[i + 1..].iter().position(|&x| x == q) else {
                    return Err(ExprError {
                        message: "unterminated string".into(),
                        range: i..src.len(),
                    });
                };
                out.push((Tok::Str(src[i + 1..i + 1 + end].to_owned()), i..i + end + 2));
                i += end + 2;
                continue;
            }
            b'0'..=b'9' | b'-' | b'.' => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_digit() || matches!(b[j], b'.' | b'e' | b'E')) {
                    j += 1;
                }
                let text = &src[i..j];
                let n: f64 = text.parse().map_err(|_| ExprError {
                    message: format!("`{text}` is not a number"),
                    range: i..j,
                })?;
                out.push((Tok::Num(n), i..j));
                i = j;
                continue;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let mut j = i + 1;
                while j < b.len()
                    && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'_' | b'-' | b'.'))
                {
                    j += 1;
                }
                out.push((Tok::Ident(src[i..j].to_owned()), i..j));
                i = j;
                continue;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(ExprError {
                    message: format!("unexpected character `{ch}`"),
                    range: start..start + ch.len_utf8(),
                });
            }
        }
        i += 1;
    }
    Ok(out)
}

struct P<'a> {
    toks: &'a [(Tok, Range<usize>)],
    pos: usize,
    len: usize,
    /// Open parentheses and `!` around the current position.
    depth: usize,
}

impl P<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn range(&self) -> Range<usize> {
        self.toks
            .get(self.pos)
            .map(|t| t.1.clone())
            .unwrap_or(self.len..self.len)
    }

    /// Whether the next token is the operator `op` or its word form.
    fn at_word(&self, op: &str, word: &str) -> bool {
        match self.peek() {
            Some(Tok::Op(o)) => *o == op,
            Some(Tok::Ident(w)) => w == word,
            _ => false,
        }
    }

    fn eat_word(&mut self, op: &str, word: &str) -> bool {
        let at = self.at_word(op, word);
        self.pos += usize::from(at);
        at
    }

    /// Enters one level of nesting (a parenthesis or a `!`), refusing past [`MAX_DEPTH`].
    fn nest(&mut self, range: Range<usize>) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ExprError {
                message: format!(
                    "the condition nests deeper than {MAX_DEPTH} levels of `(` and `!`"
                ),
                range,
            });
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, ExprError> {
        let first = self.and()?;
        if !self.at_word("||", "or") {
            return Ok(first);
        }
        let mut all = vec![first];
        while self.eat_word("||", "or") {
            all.push(self.and()?);
        }
        Ok(Expr::Or(all))
    }

    fn and(&mut self) -> Result<Expr, ExprError> {
        let first = self.not()?;
        if !self.at_word("&&", "and") {
            return Ok(first);
        }
        let mut all = vec![first];
        while self.eat_word("&&", "and") {
            all.push(self.not()?);
        }
        Ok(Expr::And(all))
    }

    fn not(&mut self) -> Result<Expr, ExprError> {
        let range = self.range();
        if self.eat_word("!", "not") {
            self.nest(range)?;
            let e = self.not()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(e)));
        }
        self.cmp()
    }

    fn cmp(&mut self) -> Result<Expr, ExprError> {
        let l = self.primary()?;
        let op = match self.peek() {
            Some(Tok::Op("==")) => CmpOp::Eq,
            Some(Tok::Op("!=")) => CmpOp::Ne,
            Some(Tok::Op("<")) => CmpOp::Lt,
            Some(Tok::Op("<=")) => CmpOp::Le,
            Some(Tok::Op(">")) => CmpOp::Gt,
            Some(Tok::Op(">=")) => CmpOp::Ge,
            _ => return Ok(l),
        };
        self.pos += 1;
        let r = self.primary()?;
        Ok(Expr::Cmp(op, Box::new(l), Box::new(r)))
    }

    fn primary(&mut self) -> Result<Expr, ExprError> {
        let range = self.range();
        let Some(tok) = self.peek().cloned() else {
            return Err(ExprError {
                message: "the condition ends too early".into(),
                range,
            });
        };
        self.pos += 1;
        match tok {
            Tok::Num(n) => Ok(Expr::Lit(
                serde_json::Number::from_f64(n)
                    .map(Value::Number)
                    .unwrap_or(Value::Null),
            )),
            Tok::Str(s) => Ok(Expr::Lit(Value::String(s))),
            Tok::LParen => {
                self.nest(range)?;
                let e = self.or()?;
                self.depth -= 1;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(ExprError {
                        message: "expected `)`".into(),
                        range: self.range(),
                    });
                }
                self.pos += 1;
                Ok(e)
            }
            Tok::Ident(w) => match w.as_str() {
                "true" => Ok(Expr::Lit(Value::Bool(true))),
                "false" => Ok(Expr::Lit(Value::Bool(false))),
                "null" => Ok(Expr::Lit(Value::Null)),
                _ => Ref::parse(&w)
                    .map(|r| Expr::Ref(r, range.clone()))
                    .map_err(|e| ExprError {
                        message: e.to_string(),
                        range,
                    }),
            },
            Tok::Op(o) => Err(ExprError {
                message: format!("expected a value, found `{o}`"),
                range,
            }),
            Tok::RParen => Err(ExprError {
                message: "expected a value, found `)`".into(),
                range,
            }),
        }
    }
}

impl Expr {
    /// Parses a condition.
    pub fn parse(src: &str) -> Result<Expr, ExprError> {
        let toks = lex(src)?;
        let mut p = P {
            toks: &toks,
            pos: 0,
            len: src.len(),
            depth: 0,
        };
        let e = p.or()?;
        if p.pos < toks.len() {
            return Err(ExprError {
                message: "unexpected text after the condition".into(),
                range: p.range(),
            });
        }
        Ok(e)
    }

    /// Every reference in the condition.
    pub fn refs(&self) -> Vec<(&Ref, &Range<usize>)> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<(&'a Ref, &'a Range<usize>)>) {
        match self {
            Expr::Lit(_) => {}
            Expr::Ref(r, range) => out.push((r, range)),
            Expr::Not(e) => e.collect(out),
            Expr::And(all) | Expr::Or(all) => all.iter().for_each(|e| e.collect(out)),
            Expr::Cmp(_, a, b) => {
                a.collect(out);
                b.collect(out);
            }
        }
    }

    /// Evaluates to a boolean. A missing reference is `null`; truthiness follows JSON
    /// (`null`, `false`, `0`, `""` and empty collections are false).
    pub fn eval(&self, lookup: &dyn Fn(&Ref) -> Option<Value>) -> bool {
        truthy(&self.value(lookup))
    }

    fn value(&self, lookup: &dyn Fn(&Ref) -> Option<Value>) -> Value {
        match self {
            Expr::Lit(v) => v.clone(),
            Expr::Ref(r, _) => lookup(r).unwrap_or(Value::Null),
            Expr::Not(e) => Value::Bool(!e.eval(lookup)),
            Expr::And(all) => Value::Bool(all.iter().all(|e| e.eval(lookup))),
            Expr::Or(all) => Value::Bool(all.iter().any(|e| e.eval(lookup))),
            Expr::Cmp(op, a, b) => Value::Bool(compare(*op, &a.value(lookup), &b.value(lookup))),
        }
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn compare(op: CmpOp, a: &Value, b: &Value) -> bool {
    use std::cmp::Ordering;
    let ord = match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64().partial_cmp(&y.as_f64()),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        // A number written as a string in values.json still compares as a number.
        (Value::String(x), Value::Number(y)) => x
            .parse::<f64>()
            .ok()
            .and_then(|x| x.partial_cmp(&y.as_f64()?)),
        (Value::Number(x), Value::String(y)) => y
            .parse::<f64>()
            .ok()
            .and_then(|y| x.as_f64()?.partial_cmp(&y)),
        (x, y) if x == y => Some(Ordering::Equal),
        _ => None,
    };
    match op {
        CmpOp::Eq => ord == Some(Ordering::Equal),
        CmpOp::Ne => ord != Some(Ordering::Equal),
        CmpOp::Lt => ord == Some(Ordering::Less),
        CmpOp::Le => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
        CmpOp::Gt => ord == Some(Ordering::Greater),
        CmpOp::Ge => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(src: &str, values: Value) -> bool {
        let e = Expr::parse(src).unwrap();
        e.eval(&|r: &Ref| match r {
            Ref::Param(p) => values.get(p).cloned(),
            Ref::StageValue { stage, key } => {
                let mut v = values.get(stage)?;
                for k in key {
                    v = v.get(k)?;
                }
                Some(v.clone())
            }
            _ => None,
        })
    }

    #[test]
    fn evaluates_comparisons_and_logic() {
        let v = json!({"promote": true, "validate": {"passed": true, "iou": 0.71}, "n": 3});
        assert!(eval("stages.validate.values.passed == true", v.clone()));
        assert!(eval(
            "params.promote && stages.validate.values.iou >= 0.7",
            v.clone()
        ));
        assert!(!eval("not params.promote or params.n < 2", v.clone()));
        assert!(eval("(params.n == 3) and !(params.missing)", v.clone()));
        assert!(eval("params.n != 'x'", v));
    }

    #[test]
    fn rejects_templates_and_assignment() {
        assert!(Expr::parse("{{ params.a }} == 1")
            .unwrap_err()
            .message
            .contains("not a template"));
        assert!(Expr::parse("params.a = 1")
            .unwrap_err()
            .message
            .contains("=="));
        assert!(Expr::parse("params.a ==").is_err());
        assert!(Expr::parse("(params.a").is_err());
        assert!(Expr::parse("params.a params.b").is_err());
    }

    #[test]
    fn nesting_is_bounded_and_chains_are_flat() {
        // The inputs that overflowed the stack: each is refused with its position.
        let parens = format!("{}params.a{}", "(".repeat(1800), ")".repeat(1800));
        let e = Expr::parse(&parens).unwrap_err();
        assert!(e.message.contains("nests deeper than 64"), "{}", e.message);
        assert_eq!(e.range, 64..65);
        let nots = format!("{}params.a", "!".repeat(20_000));
        assert!(Expr::parse(&nots).unwrap_err().message.contains("deeper"));
        // Up to the bound is fine.
        let ok = format!("{}params.a{}", "(".repeat(64), ")".repeat(64));
        assert!(eval(&ok, json!({"a": true})));
        // A chain of 20,000 conditions is one node: parsed, evaluated and dropped
        // without recursion on its length.
        let chain = vec!["params.a"; 20_000].join(" && ");
        let e = Expr::parse(&chain).unwrap();
        assert!(matches!(&e, Expr::And(all) if all.len() == 20_000));
        assert!(eval(&chain, json!({"a": true})));
        let mixed = vec!["params.a && params.b"; 5_000].join(" || ");
        assert!(!eval(&mixed, json!({"a": true, "b": false})));
    }

    #[test]
    fn reports_reference_ranges() {
        let e = Expr::parse("params.a && stages.v.values.ok").unwrap();
        let refs = e.refs();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[1].1, &(12..30));
    }
}
