//! schemathesis (an OpenAPI fuzzer nobody here wrote, from the tests' venv) against the
//! real `drivetrain serve` on loopback, every check on every operation of
//! `docs/openapi.json`: responses match the document (SSE events too), what the schema
//! refuses is refused, and what it accepts is accepted. Four operations take a program
//! (YAML, stage or pipeline names) that only the server can judge; the allowance for them
//! is in `tests/schemathesis/schemathesis.toml`, with why.

use std::process::Command;

use crate::common;
use common::http::{start, TOKEN};
use common::{assert_ok, text, Home};

#[test]
fn schemathesis_finds_no_mismatch_with_the_document() {
    let home = Home::new("schemathesis");
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    let hello = home.write(
        "served/hello.yaml",
        "version: 1\nname: hello\nstages:\n  a:\n    run: {command: [\"true\"]}\n",
    );
    // A run for the routes of one run to find.
    assert_ok(&home.drivetrain(&["run", hello.to_str().unwrap()]));
    let s = start(&home, &["--token", TOKEN]);
    let repo = env!("CARGO_MANIFEST_DIR");
    let o = Command::new(drivetrain_engine::testing::venv_bin("schemathesis"))
        .arg("--config-file")
        .arg(format!("{repo}/tests/schemathesis/schemathesis.toml"))
        .args(["run", &format!("{repo}/docs/openapi.json")])
        .args(["--url", &format!("http://{}", s.addr)])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args([
            "--checks",
            "all",
            "--max-examples",
            "20",
            // One worker: with two, the order in which the coverage phase draws its
            // cases varies, and once in a few runs its generator found an empty
            // strategy for `POST /api/v1/runs` (a runtime error of schemathesis's own).
            "--workers",
            "1",
            "--seed",
            "1",
        ])
        .env("NO_COLOR", "1")
        .current_dir(&home.dir)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(out.contains(" passed"), "{out}");
}
