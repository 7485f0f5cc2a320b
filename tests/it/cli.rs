//! End-to-end tests of the `drivetrain` binary: validation, graphs, plans, the JSON
//! Schema and exit codes, run as a user would, from the repository root.

use std::path::Path;
use std::process::{Command, Output};

fn drivetrain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

fn reference_pipelines() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("pipelines/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| format!("pipelines/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    files.sort();
    files
}

#[test]
fn every_reference_pipeline_is_valid_without_warnings() {
    let files = reference_pipelines();
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        let o = drivetrain(&["validate", f]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{f} has diagnostics");
        assert!(
            stdout(&o).starts_with(&format!("ok {f}: pipeline")),
            "{}",
            stdout(&o)
        );
    }
}

#[test]
fn the_driving_loop_graph_in_mermaid_and_dot() {
    let o = drivetrain(&["graph", "pipelines/driving-loop.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    insta::assert_snapshot!("driving_loop_mermaid", stdout(&o));
    let o = drivetrain(&["graph", "pipelines/driving-loop.yaml", "--format", "dot"]);
    assert_eq!(o.status.code(), Some(0));
    insta::assert_snapshot!("driving_loop_dot", stdout(&o));
}

#[test]
fn plan_resolves_params_into_commands() {
    let o = drivetrain(&[
        "plan",
        "pipelines/lane-detection-mpi.yaml",
        "--param",
        "epochs=3",
        "-p",
        "tusimple_url=s3://mirror/tusimple.zip",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("--epochs=3 --batch-size=33"), "{out}");
    assert!(
        out.contains("fetch-dataset --source s3://mirror/tusimple.zip"),
        "{out}"
    );
    insta::assert_snapshot!("lane_detection_plan", out);
}

#[test]
fn plan_selects_subgraphs() {
    let o = drivetrain(&[
        "plan",
        "pipelines/driving-loop.yaml",
        "--from",
        "train",
        "--output",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON plan");
    let selected: Vec<&str> = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["selected"] == true)
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(selected, ["train", "validate", "promote"]);
    // Typed substitution: a `with` value that is one param reference keeps its type.
    let fleet = &v["stages"][0];
    assert_eq!(fleet["action"]["with"]["drives"], 8);

    let o = drivetrain(&[
        "plan",
        "pipelines/driving-loop.yaml",
        "--only",
        "mine,ingest",
        "--to",
        "mine",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("2 selected"), "{}", stdout(&o));
}

#[test]
fn plan_rejects_unknown_and_ill_typed_params() {
    let o = drivetrain(&["plan", "pipelines/driving-loop.yaml", "-p", "min_decell=3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown param `min_decell`; did you mean `min_decel`?"),
        "{}",
        stderr(&o)
    );
    let o = drivetrain(&[
        "plan",
        "pipelines/driving-loop.yaml",
        "-p",
        "drives=many",
        "-p",
        "promote_to=prod",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("param `drives`: expected an integer, got `many`"),
        "{err}"
    );
    assert!(
        err.contains("param `promote_to` must be one of `candidate` or `production`"),
        "{err}"
    );
    let o = drivetrain(&["plan", "pipelines/driving-loop.yaml", "--from", "trian"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `train`?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn exit_codes_mean_one_thing_each() {
    assert_eq!(
        drivetrain(&["validate", "pipelines/driving-loop.yaml"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        drivetrain(&["validate", "tests/corpus/cycle.yaml"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        drivetrain(&["validate", "does/not/exist.yaml"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(drivetrain(&["validate"]).status.code(), Some(2));
    assert_eq!(drivetrain(&["no-such-command"]).status.code(), Some(2));
    // Whose fault decides: a run that does not exist, or a store URL nothing knows, is the
    // request's (2), as a wrong flag is.
    let home = std::env::temp_dir().join(format!("dt-cli-fault-{}", std::process::id()));
    let home = home.to_str().unwrap();
    assert_eq!(
        drivetrain(&["--home", home, "status", "no-such-run"])
            .status
            .code(),
        Some(2)
    );
    let o = drivetrain(&["--home", home, "--store", "bogus://x", "gc"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot open artifact store `bogus://x`"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(home);
    // One invalid file among valid ones makes the whole command fail.
    let o = drivetrain(&[
        "validate",
        "pipelines/driving-loop.yaml",
        "tests/corpus/cycle.yaml",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("ok pipelines/driving-loop.yaml"));
    assert_eq!(
        drivetrain(&["graph", "tests/corpus/cycle.yaml"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        drivetrain(&["plan", "tests/corpus/cycle.yaml"])
            .status
            .code(),
        Some(1)
    );
    // A file that is not UTF-8 is an invalid pipeline, said with where (Latin-1 here).
    let latin1 = std::env::temp_dir().join(format!("dt-latin1-{}.yaml", std::process::id()));
    std::fs::write(&latin1, b"version: 1\nname: caf\xe9\nstages: {}\n").unwrap();
    for command in ["validate", "run", "plan"] {
        let o = drivetrain(&[command, latin1.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{command}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("byte 0xe9 at offset 20 is not")
                && stderr(&o).contains(&format!("{}:2:10", latin1.display())),
            "{command}: {}",
            stderr(&o)
        );
    }
    std::fs::remove_file(&latin1).unwrap();
}

#[test]
fn every_subcommand_help_has_an_example() {
    for cmd in [
        "validate", "graph", "plan", "run", "status", "logs", "resume", "cancel", "list", "schema",
        "steps",
    ] {
        let o = drivetrain(&[cmd, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        let help = stdout(&o);
        assert!(help.contains("Example"), "{cmd} --help:\n{help}");
        assert!(
            help.contains(&format!("drivetrain {cmd}")),
            "{cmd} --help:\n{help}"
        );
    }
}

#[test]
fn the_committed_json_schemas_match_the_spec_types_and_the_plugins() {
    // The pipeline schema holds the spec's types and the `with:` of the project's own
    // plugin steps (`plugins/`, where `drivetrain schema` runs here); the step file's
    // schema its types.
    for (file, args) in [
        ("docs/pipeline.schema.json", &["schema"][..]),
        ("docs/step.schema.json", &["schema", "--step"][..]),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let o = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("DRIVETRAIN_PLUGIN_PATH")
            .output()
            .expect("the binary runs");
        let generated = stdout(&o);
        if std::env::var_os("DRIVETRAIN_UPDATE_SCHEMA").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).expect("the schema is committed");
        assert!(
            committed == generated,
            "{file} is out of date: run DRIVETRAIN_UPDATE_SCHEMA=1 cargo test --test it cli::"
        );
    }
    // The spec's own types, and the project's plugin with its params.
    let schema: serde_json::Value =
        serde_json::from_str(&stdout(&drivetrain(&["schema"]))).unwrap();
    let mut base = drivetrain_engine::spec::json_schema();
    base["definitions"]["StageSpec"]["allOf"] = schema["definitions"]["StageSpec"]["allOf"].clone();
    assert_eq!(schema, base);
    let conditions = schema["definitions"]["StageSpec"]["allOf"].to_string();
    assert!(
        conditions.contains("lane-ddp@1.0.0") && conditions.contains("fail_after_epoch"),
        "{conditions}"
    );
}

#[test]
fn the_json_schema_describes_stage_fields() {
    let schema = drivetrain_engine::spec::json_schema();
    let stage = &schema["definitions"]["StageSpec"]["properties"];
    for field in [
        "uses",
        "run",
        "needs",
        "inputs",
        "outputs",
        "map",
        "distributed",
        "secrets",
    ] {
        assert!(
            stage[field].is_object(),
            "StageSpec.{field} missing from the schema"
        );
    }
    assert_eq!(
        schema["definitions"]["StageSpec"]["additionalProperties"],
        false
    );
}

#[test]
fn steps_lists_the_catalog() {
    let o = drivetrain(&["steps", "--output", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "fleet-sim",
            "ingest",
            "mine-corner-cases",
            "label-export",
            "label-import",
            "train",
            "validate",
            "promote"
        ]
    );
    assert_eq!(
        v["executors"],
        serde_json::json!(["local", "kubernetes", "slurm"])
    );
}

/// The JSON Schema editors use accepts every reference pipeline and rejects what
/// validation rejects for shape (unknown fields, wrong types).
#[test]
fn the_json_schema_accepts_the_reference_pipelines() {
    let schema = drivetrain_engine::spec::json_schema();
    let validator = jsonschema::draft7::new(&schema).expect("the generated schema compiles");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in reference_pipelines() {
        let src = std::fs::read_to_string(root.join(&f)).unwrap();
        let doc = drivetrain_engine::yaml::parse(&src).unwrap().to_json();
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{f}: {errors:#?}");
    }
    for (f, expected) in [
        ("tests/corpus/unknown-stage-field.yaml", "retires"),
        ("tests/corpus/invalid-type.yaml", "twice"),
        ("tests/corpus/unknown-variant.yaml", "forbidd"),
    ] {
        let src = std::fs::read_to_string(root.join(f)).unwrap();
        let doc = drivetrain_engine::yaml::parse(&src).unwrap().to_json();
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{f}: {errors:#?}"
        );
    }
}

/// The examples in `--help` of the commands that read only files (and the machine) run
/// as written from the repository root and succeed.
#[test]
fn the_help_examples_of_the_read_only_commands_work() {
    let mut ran = 0;
    for command in ["validate", "graph", "plan", "schema", "steps", "doctor"] {
        let help = stdout(&drivetrain(&[command, "--help"]));
        let examples = help
            .split_once("Examples:")
            .or_else(|| help.split_once("Example:"))
            .map(|(_, e)| e)
            .unwrap_or("");
        for line in examples.lines().map(str::trim) {
            // Pipes, redirections and globs need a shell; the rest is argv.
            let Some(args) = line.strip_prefix("drivetrain ") else {
                continue;
            };
            if args.contains(['|', '>', '*', '#']) {
                continue;
            }
            let argv: Vec<&str> = args.split_whitespace().collect();
            // A file of the user's own (`broken.yaml`) is not in the checkout.
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            if argv
                .iter()
                .any(|a| a.ends_with(".yaml") && !root.join(a).exists())
            {
                continue;
            }
            let o = drivetrain(&argv);
            assert_eq!(o.status.code(), Some(0), "`{line}`: {}", stderr(&o));
            ran += 1;
        }
    }
    assert!(ran >= 6, "only {ran} examples ran");
}

/// The README's first command is `cargo run -- …`: with two binaries in the package,
/// cargo runs it only if the package names which one (`default-run`), and that must be
/// the command. Read from `cargo metadata`, as `cargo run` reads it.
#[test]
fn the_readme_s_cargo_run_picks_the_command() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let first = readme
        .lines()
        .find(|l| l.starts_with("cargo run"))
        .expect("the README starts with a cargo run command");
    assert!(
        first.starts_with("cargo run -- run pipelines/driving-loop.yaml"),
        "{first}"
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let package = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "drivetrain")
        .unwrap();
    let bins = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .count();
    if bins > 1 {
        assert_eq!(package["default_run"], "drivetrain", "{bins} binaries");
    }
}
