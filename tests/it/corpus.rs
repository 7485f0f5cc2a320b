//! The corpus of broken pipelines: one file per kind of mistake under `tests/corpus/`,
//! each with its expected diagnostic as an insta snapshot of what `drivetrain validate`
//! prints. The JSON form is checked for location on every file.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn validate(rel: &str, json: bool) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drivetrain"));
    cmd.arg("validate").arg(rel);
    if json {
        cmd.args(["--output", "json"]);
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs")
}

#[test]
fn broken_pipelines_report_located_diagnostics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut codes = BTreeSet::new();
    let mut files = 0;
    insta::glob!("..", "corpus/*.yaml", |path| {
        files += 1;
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = validate(&rel, false);
        assert_eq!(text.status.code(), Some(1), "{rel} must be invalid");
        insta::assert_snapshot!(String::from_utf8(text.stderr).unwrap());

        let json = validate(&rel, true);
        assert_eq!(json.status.code(), Some(1));
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let diags = v[0]["diagnostics"].as_array().unwrap();
        assert!(diags.iter().any(|d| d["severity"] == "error"), "{rel}");
        for d in diags {
            assert!(d["line"].as_u64().unwrap() >= 1, "{rel}: {d}");
            assert!(d["column"].as_u64().unwrap() >= 1, "{rel}: {d}");
            assert_eq!(d["file"], rel.as_str());
            let code = d["code"].as_str().unwrap().to_owned();
            let unlocatable = ["yaml-syntax", "empty-document", "yaml-multiple-documents"];
            if !unlocatable.contains(&code.as_str()) {
                assert!(d["path"].is_string(), "{rel}: {d} has no YAML path");
            }
            codes.insert(code);
        }
    });
    assert!(files >= 30, "the corpus has {files} files");
    assert!(
        codes.len() >= 30,
        "only {} distinct codes: {codes:?}",
        codes.len()
    );
}
