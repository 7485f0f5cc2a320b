//! What a stage reads from outside its inputs is part of its cache key: `cache.key`
//! entries (templated, added to the exact key) and `registry:MODEL@ALIAS` references,
//! resolved against the registry when the stage is about to run. A stage that writes the
//! registry is never a cache hit. Through the binary, on the embedded store.

use crate::common;
use common::{assert_ok, run_id, stage, Home};

const PIPELINE: &str = r#"
version: 1
name: keyed
params:
  day: {type: string, default: "2026-11-22"}
  version: {type: string, default: "a"}
stages:
  make:
    run: {command: [sh, -c, 'echo "{\"v\": \"$V\"}" > "$DRIVETRAIN_OUTPUT_MODEL/model.json"']}
    env: {V: "{{ params.version }}"}
    outputs: [model]
  promote:
    uses: promote
    inputs: {model: make.model}
    with: {model: lane, alias: production}
    outputs: [registration]
  eval:
    needs: [promote]
    run: {command: [sh, -c, 'echo evaluated > "$DRIVETRAIN_OUTPUT_REPORT/r.txt"']}
    cache:
      key: ["{{ params.day }}", "registry:lane@production"]
    outputs: [report]
"#;

fn origins(home: &Home, run: &str) -> (String, String, String) {
    let st = home.status(run);
    let o = |s: &str| {
        stage(&st, s)["origin"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (o("make"), o("promote"), o("eval"))
}

fn run(home: &Home, file: &str, params: &[&str]) -> String {
    let mut args = vec!["run", file];
    for p in params {
        args.extend(["--param", p]);
    }
    let o = home.drivetrain(&args);
    assert_ok(&o);
    run_id(&o)
}

#[test]
fn registry_references_and_key_entries_decide_cache_hits() {
    let home = Home::new("cache-keys");
    let file = home.write("p.yaml", PIPELINE);
    let file = file.to_str().unwrap();
    let first = run(&home, file, &[]);
    assert_eq!(
        origins(&home, &first),
        ("ran".into(), "ran".into(), "ran".into())
    );
    // Same everything: make is a hit; promote runs again (it moves an alias, which is
    // the point of running it), finds the same model bytes as version 1 and moves
    // production to it, registering no copy; eval's key names production, still 1: a hit.
    let second = run(&home, file, &[]);
    assert_eq!(
        origins(&home, &second),
        ("cached".into(), "ran".into(), "cached".into())
    );
    let st = home.status(&second);
    assert_eq!(stage(&st, "promote")["values"]["version"], 1, "{st}");
    assert_eq!(stage(&st, "promote")["values"]["registered"], false, "{st}");
    // A new model: version 2, production moves, and eval's key with it: a miss.
    let third = run(&home, file, &["version=b"]);
    assert_eq!(
        origins(&home, &third),
        ("ran".into(), "ran".into(), "ran".into())
    );
    let explain = home.drivetrain(&["explain", &third, "eval"]);
    let text = common::text(&explain.stdout);
    assert!(
        text.contains("`registry:lane@production` changed: 1 → 2"),
        "{text}"
    );
    let explain = home.drivetrain(&["explain", &second, "promote"]);
    assert!(
        common::text(&explain.stdout).contains("writes the model registry: it runs every time"),
        "{}",
        common::text(&explain.stdout)
    );
    // A key entry: the day is not in eval's command, yet a new day is a miss.
    let without_promote = PIPELINE.replace("registry:lane@production", "fixed");
    let file2 = home.write("q.yaml", &without_promote);
    let file2 = file2.to_str().unwrap();
    let a = run(&home, file2, &[]);
    let b = run(&home, file2, &[]);
    let c = run(&home, file2, &["day=2026-11-23"]);
    assert_eq!(origins(&home, &a).2, "ran");
    assert_eq!(origins(&home, &b).2, "cached");
    assert_eq!(origins(&home, &c).2, "ran");
    let explain = common::text(&home.drivetrain(&["explain", &c, "eval"]).stdout);
    assert!(
        explain.contains("`key[0]` changed: 2026-11-22 → 2026-11-23"),
        "{explain}"
    );
}

#[test]
fn a_bad_cache_key_template_is_a_located_error() {
    let home = Home::new("cache-keys-bad");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: bad\nstages:\n  a:\n    run: {command: [\"true\"]}\n    cache: {key: [\"{{ params.nope }}\"]}\n    outputs: [o]\n",
    );
    let o = home.drivetrain(&["validate", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = common::text(&o.stdout) + &common::text(&o.stderr);
    assert!(err.contains("stages.a.cache.key[0]"), "{err}");
    assert!(err.contains("p.yaml:6:"), "{err}");
}
