//! Hostile pipelines of issue 16, generated at a given size: `tests/hostile.rs` fuzzes
//! `validate` with them, `tests/api.rs` posts them to `serve`.

/// One kind of hostile pipeline, sized by `n`.
#[derive(Debug, Clone)]
pub enum Hostile {
    /// `when:` of `n` nested parentheses.
    Parens(usize),
    /// `when:` of `n` `!`.
    Nots(usize),
    /// `when:` of a chain of `n` `&&`.
    Chain(usize),
    /// A gate of `n` nested parentheses.
    GateParens(usize),
    /// YAML flow sequences nested `n` deep.
    FlowNesting(usize),
    /// Block mappings nested `n` deep.
    BlockNesting(usize),
    /// An `n` KB scalar aliased 20,000 times.
    AliasBytes(usize),
    /// Nine levels of ten aliases each (a billion laughs).
    Laughs(usize),
    /// `n` unknown `{{ params.x }}` on one line.
    ErrorsOnOneLine(usize),
    /// `when:` of `n` unknown params joined by `&&`: `n` problems in one string.
    ErrorsInOneString(usize),
    /// A key of `n` MB.
    HugeKey(usize),
    /// A scalar value of `n` MB.
    HugeScalar(usize),
    /// A mining rule of `n` `OR` terms (4,000 overflowed the stack).
    RuleTerms(usize),
    /// A mining rule of `n` nested parentheses.
    RuleParens(usize),
}

fn rule_stage(rule: &str) -> String {
    format!(
        "version: 1\nname: hostile\nstages:\n  m:\n    uses: mine-corner-cases\n    with:\n      rules:\n        r: \"{rule}\"\n"
    )
}

fn when_stage(when: &str) -> String {
    format!(
        "version: 1\nname: hostile\nparams: {{a: {{type: boolean, default: true}}}}\nstages:\n  s:\n    when: \"{when}\"\n    run: {{command: [true]}}\n"
    )
}

impl Hostile {
    pub fn yaml(&self) -> String {
        match *self {
            Hostile::Parens(n) => when_stage(&format!(
                "{}params.a{}",
                "(".repeat(n),
                ")".repeat(n)
            )),
            Hostile::Nots(n) => when_stage(&format!("{}params.a", "!".repeat(n))),
            Hostile::Chain(n) => when_stage(&vec!["params.a"; n].join(" && ")),
            Hostile::GateParens(n) => format!(
                "version: 1\nname: hostile\nstages:\n  v:\n    step: validate\n    with: {{gate: \"{}candidate.f1{} > 0\"}}\n",
                "(".repeat(n),
                ")".repeat(n)
            ),
            Hostile::FlowNesting(n) => {
                format!("version: 1\nname: {}{}\n", "[".repeat(n), "]".repeat(n))
            }
            Hostile::BlockNesting(n) => {
                let mut s = String::from("version: 1\nname: x\nstages:\n");
                for i in 0..n {
                    s.push_str(&" ".repeat(2 + i));
                    s.push_str("k:\n");
                }
                s
            }
            Hostile::AliasBytes(kb) => {
                let mut s = format!(
                    "version: 1\nname: x\nparams:\n  p: {{default: &a {}}}\nstages:\n  s:\n    run: {{command: [true]}}\nx:\n",
                    "y".repeat(kb << 10)
                );
                for _ in 0..20_000 {
                    s.push_str("  - *a\n");
                }
                s
            }
            Hostile::Laughs(width) => {
                let mut s = format!("version: 1\nname: x\na0: &a0 [{}]\n", vec!["lol"; width].join(", "));
                for i in 1..10 {
                    let refs = vec![format!("*a{}", i - 1); width].join(", ");
                    s.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
                }
                s
            }
            Hostile::ErrorsOnOneLine(n) => {
                let args: Vec<String> = (0..n).map(|i| format!("\"{{{{ params.x{i} }}}}\"")).collect();
                format!(
                    "version: 1\nname: x\nstages:\n  s:\n    run: {{command: [echo, {}]}}\n",
                    args.join(", ")
                )
            }
            Hostile::ErrorsInOneString(n) => when_stage(
                &(0..n)
                    .map(|i| format!("params.x{i}"))
                    .collect::<Vec<_>>()
                    .join(" && "),
            ),
            Hostile::HugeKey(mb) => format!(
                "version: 1\nname: x\n{}: 1\nstages:\n  s:\n    run: {{command: [true]}}\n",
                "k".repeat(mb << 20)
            ),
            Hostile::RuleTerms(n) => rule_stage(&vec!["accel_x < -4"; n].join(" OR ")),
            Hostile::RuleParens(n) => {
                rule_stage(&format!("{}accel_x < -4{}", "(".repeat(n), ")".repeat(n)))
            }
            Hostile::HugeScalar(mb) => format!(
                "version: 1\nname: x\ndescription: {}\nstages:\n  s:\n    run: {{command: [true]}}\n",
                "d".repeat(mb << 20)
            ),
        }
    }
}
