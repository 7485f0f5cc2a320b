//! The validator never panics: on arbitrary text, on YAML-shaped noise, and on random
//! mutations of the reference pipelines. Every diagnostic it returns points inside the
//! file it was given.

use drivetrain_engine::{validate, Catalog};
use proptest::prelude::*;

fn catalog() -> Catalog {
    Catalog::new(
        drivetrain_steps::all(),
        drivetrain_executors::EXECUTORS.to_vec(),
    )
}

const REFERENCE: &[&str] = &[
    include_str!("../../pipelines/driving-loop.yaml"),
    include_str!("../../pipelines/lane-detection-mpi.yaml"),
    include_str!("../../pipelines/nightly-retrain.yaml"),
];

fn check(src: &str) {
    let v = validate(src, &catalog());
    for d in &v.diagnostics {
        if let Some(span) = d.span {
            assert!(
                span.start <= span.end && span.end <= src.len(),
                "{d:?} outside the source"
            );
            assert!(
                src.is_char_boundary(span.start) && src.is_char_boundary(span.end),
                "{d:?}"
            );
            assert!(span.line >= 1 && span.column >= 1, "{d:?}");
        }
    }
    assert_eq!(v.pipeline.is_some(), !v.has_errors());
}

/// One edit of a pipeline's text.
#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    Indent(usize, usize),
    Insert(usize, String),
    DeleteBytes(usize, usize),
}

fn apply(src: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = src.lines().map(str::to_owned).collect();
    let n = lines.len().max(1);
    match m {
        Mutation::DeleteLine(i) => {
            if !lines.is_empty() {
                lines.remove(i % n);
            }
        }
        Mutation::DuplicateLine(i) => {
            if !lines.is_empty() {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
        }
        Mutation::SwapLines(a, b) => {
            if !lines.is_empty() {
                lines.swap(a % n, b % n);
            }
        }
        Mutation::Indent(i, k) => {
            if !lines.is_empty() {
                lines[i % n] = format!("{}{}", " ".repeat(k % 5), lines[i % n]);
            }
        }
        Mutation::Insert(at, text) => {
            let mut s = src.to_owned();
            let mut at = at % (s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            s.insert_str(at, text);
            return s;
        }
        Mutation::DeleteBytes(at, len) => {
            let mut s = src.to_owned();
            let mut a = at % (s.len() + 1);
            while !s.is_char_boundary(a) {
                a -= 1;
            }
            let mut b = (a + len % 16).min(s.len());
            while !s.is_char_boundary(b) {
                b += 1;
            }
            s.replace_range(a..b, "");
            return s;
        }
    }
    lines.join("\n")
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let token = prop_oneof![
        Just(":".to_owned()),
        Just("{{".to_owned()),
        Just("}}".to_owned()),
        Just("[".to_owned()),
        Just("- ".to_owned()),
        Just("&a ".to_owned()),
        Just("*a".to_owned()),
        Just("\n  x: ".to_owned()),
        Just(" -1".to_owned()),
        Just("0.5".to_owned()),
        Just("\"".to_owned()),
        Just("{{ params.nope }}".to_owned()),
        Just("{{ stages.train.values.x }}".to_owned()),
        Just("ä".to_owned()),
        "[a-z_.{}: -]{0,8}",
    ];
    prop_oneof![
        any::<usize>().prop_map(Mutation::DeleteLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, k)| Mutation::Indent(a, k)),
        (any::<usize>(), token).prop_map(|(a, t)| Mutation::Insert(a, t)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, l)| Mutation::DeleteBytes(a, l)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text(src in "\\PC{0,300}") {
        check(&src);
    }

    #[test]
    fn yaml_shaped_noise(src in "([a-z]{1,6}: (\\[|\\{|[a-z0-9.]{0,5}|\"\\{\\{ [a-z.]{0,12} \\}\\}\")\n( {2,4}- ?)?){0,20}") {
        check(&src);
    }

    #[test]
    fn mutated_reference_pipelines(which in 0..REFERENCE.len(), edits in prop::collection::vec(mutation(), 1..6)) {
        let mut src = REFERENCE[which].to_owned();
        for m in &edits {
            src = apply(&src, m);
        }
        check(&src);
    }
}

#[test]
fn the_unmutated_reference_pipelines_are_valid() {
    for src in REFERENCE {
        let v = validate(src, &catalog());
        assert!(v.diagnostics.is_empty(), "{:?}", v.diagnostics);
    }
}
