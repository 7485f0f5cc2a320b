//! The promotion gate of `validate`: a condition over the metrics of the candidate and of
//! the production model, e.g.
//! `candidate.recall.hard_brake >= production.recall.hard_brake and candidate.f1 >= production.f1 - 0.01`.
//!
//! Grammar: `or` / `||`, `and` / `&&`, `not` / `!`, comparisons (`>= <= > < == !=`),
//! `+ - * /`, numbers, parentheses, and metric paths `candidate.M` / `production.M` where
//! M is `accuracy`, `f1`, `loss`, `frames`, `recall`, `precision` (overall) or
//! `recall.SLICE` / `precision.SLICE` (frames a mining rule matched). A metric that is
//! undefined (a slice without positives) makes its comparison false, and says so.

use serde_json::Value;

const METRICS: &[&str] = &["accuracy", "f1", "loss", "frames", "recall", "precision"];

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(f64),
    Metric { model: String, path: Vec<String> },
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Bin(Box<Expr>, String, Box<Expr>),
}

impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expr::Num(n) => write!(f, "{n}"),
            Expr::Metric { model, path } => write!(f, "{model}.{}", path.join(".")),
            Expr::Neg(x) => write!(f, "-{x}"),
            Expr::Not(x) => write!(f, "not ({x})"),
            Expr::Bin(l, op, r) if op == "and" || op == "or" => write!(f, "({l}) {op} ({r})"),
            Expr::Bin(l, op, r) => write!(f, "{l} {op} {r}"),
        }
    }
}

/// How many tokens a gate may have. A gate is one condition over a few metrics; the
/// bound keeps the left-leaning trees of long chains (`a + a + …`), which evaluation,
/// display and drop recurse on, far from what a thread's stack holds.
const MAX_TOKENS: usize = 1_000;
/// How deep `(`, `not` and unary `-` may nest.
const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    toks: Vec<&'a str>,
    at: usize,
    depth: usize,
}

fn tokenize(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
            while i < b.len()
                && ((b[i] as char).is_ascii_alphanumeric() || matches!(b[i], b'_' | b'.'))
            {
                i += 1;
            }
        } else if s[i..].starts_with(">=")
            || s[i..].starts_with("<=")
            || s[i..].starts_with("==")
            || s[i..].starts_with("!=")
            || s[i..].starts_with("&&")
            || s[i..].starts_with("||")
        {
            i += 2;
        } else if "<>()+-*/!".contains(c) {
            i += 1;
        } else {
            return Err(format!("unexpected `{c}` at column {}", i + 1));
        }
        out.push(&s[start..i]);
    }
    Ok(out)
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.toks.get(self.at).copied()
    }
    fn eat(&mut self, t: &str) -> bool {
        if self.peek() == Some(t) {
            self.at += 1;
            true
        } else {
            false
        }
    }
    /// One level deeper, refused past [`MAX_DEPTH`]; `leave` undoes it.
    fn enter(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!(
                "the gate nests deeper than {MAX_DEPTH} levels of `(`, `not` and `-`"
            ));
        }
        Ok(())
    }
    fn leave<T>(&mut self, v: T) -> T {
        self.depth -= 1;
        v
    }
    fn or(&mut self) -> Result<Expr, String> {
        let mut e = self.and()?;
        while self.eat("or") || self.eat("||") {
            e = Expr::Bin(Box::new(e), "or".into(), Box::new(self.and()?));
        }
        Ok(e)
    }
    fn and(&mut self) -> Result<Expr, String> {
        let mut e = self.not()?;
        while self.eat("and") || self.eat("&&") {
            e = Expr::Bin(Box::new(e), "and".into(), Box::new(self.not()?));
        }
        Ok(e)
    }
    fn not(&mut self) -> Result<Expr, String> {
        if self.eat("not") || self.eat("!") {
            self.enter()?;
            let e = Expr::Not(Box::new(self.not()?));
            return Ok(self.leave(e));
        }
        self.cmp()
    }
    fn cmp(&mut self) -> Result<Expr, String> {
        let l = self.sum()?;
        for op in [">=", "<=", "==", "!=", ">", "<"] {
            if self.eat(op) {
                return Ok(Expr::Bin(Box::new(l), op.into(), Box::new(self.sum()?)));
            }
        }
        Ok(l)
    }
    fn sum(&mut self) -> Result<Expr, String> {
        let mut e = self.term()?;
        loop {
            let op = if self.eat("+") {
                "+"
            } else if self.eat("-") {
                "-"
            } else {
                break;
            };
            e = Expr::Bin(Box::new(e), op.into(), Box::new(self.term()?));
        }
        Ok(e)
    }
    fn term(&mut self) -> Result<Expr, String> {
        let mut e = self.factor()?;
        loop {
            let op = if self.eat("*") {
                "*"
            } else if self.eat("/") {
                "/"
            } else {
                break;
            };
            e = Expr::Bin(Box::new(e), op.into(), Box::new(self.factor()?));
        }
        Ok(e)
    }
    fn factor(&mut self) -> Result<Expr, String> {
        let Some(t) = self.peek() else {
            return Err("the condition ends too early".into());
        };
        self.at += 1;
        if t == "(" {
            self.enter()?;
            let e = self.or()?;
            if !self.eat(")") {
                return Err("a `(` is not closed".into());
            }
            return Ok(self.leave(e));
        }
        if t == "-" {
            self.enter()?;
            let e = Expr::Neg(Box::new(self.factor()?));
            return Ok(self.leave(e));
        }
        if let Ok(n) = t.parse::<f64>() {
            return Ok(Expr::Num(n));
        }
        let mut parts = t.split('.').map(str::to_owned);
        let model = parts.next().unwrap_or_default();
        if model != "candidate" && model != "production" {
            return Err(format!(
                "`{t}`: metrics are `candidate.METRIC` or `production.METRIC`"
            ));
        }
        let path: Vec<String> = parts.collect();
        match path.as_slice() {
            [m] if METRICS.contains(&m.as_str()) => {}
            [m, _] if m == "recall" || m == "precision" => {}
            _ => {
                return Err(format!(
                    "`{t}` is not a metric; metrics: {}, and recall.SLICE / precision.SLICE per mining rule",
                    METRICS.join(", ")
                ))
            }
        }
        Ok(Expr::Metric { model, path })
    }
}

/// Parses a gate condition.
pub fn parse(s: &str) -> Result<Expr, String> {
    let toks = tokenize(s)?;
    if toks.len() > MAX_TOKENS {
        return Err(format!(
            "the gate has {} tokens; at most {MAX_TOKENS} are allowed",
            toks.len()
        ));
    }
    let mut p = Parser {
        toks,
        at: 0,
        depth: 0,
    };
    let e = p.or()?;
    if let Some(t) = p.peek() {
        return Err(format!("unexpected `{t}`"));
    }
    Ok(e)
}

/// A value during evaluation: a number, a truth value, or undefined (with why).
#[derive(Debug, Clone)]
enum V {
    N(f64),
    B(bool),
    Undefined(String),
}

fn lookup(metrics: &Value, model: &str, path: &[String]) -> V {
    let mut v = metrics.get(model);
    let mut path: Vec<&str> = path.iter().map(String::as_str).collect();
    if path.len() == 1 && (path[0] == "recall" || path[0] == "precision") {
        path.push("all");
    }
    for p in &path {
        v = v.and_then(|x| x.get(*p));
    }
    let name = format!("{model}.{}", path.join("."));
    match v {
        Some(Value::Number(n)) => V::N(n.as_f64().unwrap_or(f64::NAN)),
        Some(Value::Null) => V::Undefined(format!(
            "{name} is undefined (no positive frames in that slice)"
        )),
        _ => V::Undefined(format!("{name} does not exist in the metrics")),
    }
}

fn eval(e: &Expr, m: &Value, why: &mut Vec<String>) -> V {
    match e {
        Expr::Num(n) => V::N(*n),
        Expr::Metric { model, path } => lookup(m, model, path),
        Expr::Neg(x) => match eval(x, m, why) {
            V::N(n) => V::N(-n),
            other => other,
        },
        Expr::Not(x) => match eval(x, m, why) {
            V::B(b) => V::B(!b),
            V::Undefined(w) => {
                why.push(w);
                V::B(false)
            }
            V::N(_) => V::B(false),
        },
        Expr::Bin(l, op, r) => {
            let (a, b) = (eval(l, m, why), eval(r, m, why));
            match op.as_str() {
                "and" | "or" => {
                    let t = |v: V, why: &mut Vec<String>| match v {
                        V::B(b) => b,
                        V::Undefined(w) => {
                            why.push(w);
                            false
                        }
                        V::N(n) => n != 0.0,
                    };
                    let (x, y) = (t(a, why), t(b, why));
                    V::B(if op == "and" { x && y } else { x || y })
                }
                _ => match (a, b) {
                    (V::N(x), V::N(y)) => {
                        let holds = match op.as_str() {
                            "+" => return V::N(x + y),
                            "-" => return V::N(x - y),
                            "*" => return V::N(x * y),
                            "/" => return V::N(x / y),
                            ">=" => x >= y,
                            "<=" => x <= y,
                            ">" => x > y,
                            "<" => x < y,
                            "==" => (x - y).abs() < 1e-12,
                            _ => (x - y).abs() >= 1e-12,
                        };
                        if !holds {
                            why.push(format!("{l} {op} {r} does not hold: {x:.4} vs {y:.4}"));
                        }
                        V::B(holds)
                    }
                    (V::Undefined(w), _) | (_, V::Undefined(w)) => V::Undefined(w),
                    _ => V::Undefined(format!("`{op}` needs numbers")),
                },
            }
        }
    }
}

/// Evaluates the gate over `{candidate: {...}, production: {...}}`: whether it passed and
/// the reasons (which parts failed, which metrics were undefined).
pub fn evaluate(e: &Expr, metrics: &Value) -> (bool, Vec<String>) {
    let mut why = Vec::new();
    let passed = match eval(e, metrics, &mut why) {
        V::B(b) => b,
        V::Undefined(w) => {
            why.push(w);
            false
        }
        V::N(n) => n != 0.0,
    };
    (passed, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hostile_gates_are_refused_not_overflowed() {
        // Deep within the token bound: refused by depth.
        let deep = format!("{}candidate.f1{} > 0", "(".repeat(300), ")".repeat(300));
        assert!(parse(&deep).unwrap_err().contains("nests deeper than 64"));
        let nots = format!("{}candidate.f1 > 0", "not ".repeat(500));
        assert!(parse(&nots).unwrap_err().contains("deeper"));
        let negs = format!("candidate.f1 > {}1", "-".repeat(500));
        assert!(parse(&negs).unwrap_err().contains("deeper"));
        // Deeper still: refused by length before any recursion.
        let deeper = format!("{}candidate.f1{} > 0", "(".repeat(5_000), ")".repeat(5_000));
        assert!(parse(&deeper).unwrap_err().contains("at most 1000"));
        let long = format!("candidate.f1 > 0{}", " + 1".repeat(20_000));
        assert!(parse(&long).unwrap_err().contains("at most 1000"));
        // Within the bounds, nested and long gates still work.
        let ok = format!(
            "{}candidate.f1{} > 0{}",
            "(".repeat(64),
            ")".repeat(64),
            " + 0".repeat(400)
        );
        let m = json!({"candidate": {"f1": 0.5}});
        assert_eq!(evaluate(&parse(&ok).unwrap(), &m), (true, vec![]));
    }

    #[test]
    fn gates_parse_and_evaluate() {
        let g = parse("candidate.recall.hard_brake >= production.recall.hard_brake and candidate.f1 >= production.f1 - 0.01").unwrap();
        let m = json!({
            "candidate": {"f1": 0.80, "recall": {"all": 0.7, "hard_brake": 0.9}},
            "production": {"f1": 0.805, "recall": {"all": 0.7, "hard_brake": 0.85}},
        });
        assert_eq!(evaluate(&g, &m), (true, vec![]));
        let m2 = json!({
            "candidate": {"f1": 0.70, "recall": {"hard_brake": 0.9}},
            "production": {"f1": 0.805, "recall": {"hard_brake": 0.85}},
        });
        let (ok, why) = evaluate(&g, &m2);
        assert!(!ok);
        assert_eq!(
            why,
            ["candidate.f1 >= production.f1 - 0.01 does not hold: 0.7000 vs 0.7950"]
        );
        let m3 = json!({"candidate": {"f1": 0.9, "recall": {"hard_brake": null}}, "production": {"f1": 0.8, "recall": {"hard_brake": 0.5}}});
        let (ok, why) = evaluate(&g, &m3);
        assert!(!ok);
        assert!(
            why[0].contains("candidate.recall.hard_brake is undefined"),
            "{why:?}"
        );
        assert!(
            evaluate(
                &parse("not (candidate.f1 < 0.5) || candidate.recall > 2").unwrap(),
                &m
            )
            .0
        );
        assert!(evaluate(&parse("candidate.recall >= 0.7").unwrap(), &m).0);
    }

    #[test]
    fn broken_gates_say_why() {
        assert!(parse("candidate.iou > 1")
            .unwrap_err()
            .contains("not a metric"));
        assert!(parse("model.f1 > 1")
            .unwrap_err()
            .contains("candidate.METRIC"));
        assert!(parse("candidate.f1 >")
            .unwrap_err()
            .contains("ends too early"));
        assert!(parse("(candidate.f1 > 1")
            .unwrap_err()
            .contains("not closed"));
        assert!(parse("candidate.f1 > 1 $")
            .unwrap_err()
            .contains("unexpected `$`"));
    }
}
