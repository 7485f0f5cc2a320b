//! Plugin steps end to end: one step file used by path, by `NAME@VERSION` through
//! `DRIVETRAIN_PLUGIN_PATH` and from a git repository pinned by commit, with the same
//! outputs; `with:` refused where it breaks the step's params, located in the pipeline;
//! the step's identity in keys (`explain`), `status` and lineage; `drivetrain.lock` and
//! `run --locked`; paths that leave a step's folder refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::*;

const STEP: &str = r#"kind: step
name: greet
version: 1.0.0
summary: Writes a greeting some times
params:
  who: {type: string, pattern: "[a-z ]+"}
  times: {type: integer, minimum: 1, maximum: 10, default: 1}
  tone: {type: string, enum: [plain, loud], default: plain}
inputs: {frames: {required: false}}
outputs: [greeting]
run:
  command: [sh, greet.sh, "{{ with.who }}", "{{ with.times }}", "{{ with.tone }}"]
  env: {GREETING_STEP: "{{ with.tone }}"}
resources: {cpu: 1}
"#;

const SCRIPT: &str = r#"for i in $(seq "$2"); do
  if [ "$3" = loud ]; then echo "HELLO $1"; else echo "hello $1"; fi
done > "$DRIVETRAIN_OUTPUT_GREETING/g.txt"
echo "$GREETING_STEP" > "$DRIVETRAIN_OUTPUT_GREETING/tone.txt"
"#;

/// A plugin folder `greet` under `parent`.
fn write_plugin(parent: &Path) -> PathBuf {
    let dir = parent.join("greet");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("step.yaml"), STEP).unwrap();
    std::fs::write(dir.join("greet.sh"), SCRIPT).unwrap();
    dir
}

fn git(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(o.status.success(), "git {args:?}: {}", text(&o.stderr));
    text(&o.stdout).trim().to_owned()
}

/// A git repository holding the plugin at `plugins/greet`, tagged `v1`: its folder and
/// the commit.
fn repository(home: &Home) -> (PathBuf, String) {
    let repo = home.dir.join("repo");
    std::fs::create_dir_all(repo.join("plugins")).unwrap();
    write_plugin(&repo.join("plugins"));
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "greet 1.0.0"]);
    git(&repo, &["tag", "v1"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    (repo, commit)
}

fn json(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&o.stdout), text(&o.stderr)))
}

#[test]
fn one_step_by_path_by_name_and_from_git_makes_the_same_outputs() {
    let home = Home::new("plugin-three-ways");
    write_plugin(&home.dir.join("steps"));
    let elsewhere = home.dir.join("shared-steps");
    write_plugin(&elsewhere);
    let (repo, commit) = repository(&home);
    home.write(
        "p.yaml",
        &format!(
            r#"version: 1
name: three-ways
params:
  who: {{default: world}}
stages:
  by-path:
    uses: ./steps/greet
    with: {{who: "{{{{ params.who }}}}", times: 3}}
  by-name:
    uses: greet@1.0.0
    with: {{who: world, times: 3}}
  from-git:
    uses: git+file://{}//plugins/greet@{commit}
    with: {{who: world, times: 3}}
"#,
            repo.display()
        ),
    );
    // `greet@1.0.0` is found through the plugin path: the pipeline has no `plugins/`.
    let path = elsewhere.display().to_string();
    let env = [("DRIVETRAIN_PLUGIN_PATH", path.as_str())];
    let o = home.drivetrain_env(&["validate", "p.yaml"], &env);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a git plugin is not fetched by validation"
    );
    assert!(
        text(&o.stderr).contains("plugins fetch"),
        "{}",
        text(&o.stderr)
    );
    let o = home.drivetrain_env(&["run", "p.yaml"], &env);
    assert_ok(&o);
    let status = home.status(&run_id(&o));
    let published = walk(&home.dir.join(".drivetrain/artifacts"));
    for s in ["by-path", "by-name", "from-git"] {
        let read = |file: &str| {
            let end = format!("{s}/1/greeting/{file}");
            let p = published.iter().find(|p| p.ends_with(&end));
            std::fs::read_to_string(p.unwrap_or_else(|| panic!("{end}: {published:?}"))).unwrap()
        };
        assert_eq!(read("g.txt"), "hello world\n".repeat(3), "{s}");
        assert_eq!(
            read("tone.txt"),
            "plain\n",
            "{s}: the step's env, its default"
        );
    }
    // Each stage names the plugin that made its outputs.
    for (s, uses_start) in [
        ("by-path", "./steps"),
        ("by-name", "greet@"),
        ("from-git", "git+file"),
    ] {
        let p = &stage(&status, s)["provenance"]["plugin"];
        assert_eq!(p["name"], "greet", "{s}: {p}");
        assert_eq!(p["version"], "1.0.0");
        assert!(p["digest"].as_str().unwrap().starts_with("sha256:"));
        assert!(p["uses"].as_str().unwrap().starts_with(uses_start), "{p}");
    }
    let git_plugin = &stage(&status, "from-git")["provenance"]["plugin"];
    assert_eq!(git_plugin["commit"], commit.as_str());
    // The same files: the same digest, wherever the plugin was found.
    let same = |s: &str| stage(&status, s)["provenance"]["plugin"]["digest"].clone();
    assert_eq!(same("by-path"), same("from-git"));
    assert_eq!(same("by-path"), same("by-name"));
    // Lineage names the exact plugin that made the artifact.
    let o = home.drivetrain(&["lineage", &format!("{}/from-git", run_id(&o))]);
    assert_ok(&o);
    let lineage = text(&o.stdout);
    assert!(
        lineage.contains(&format!(
            "plugin=greet@1.0.0 {}",
            same("from-git").as_str().unwrap()
        )) && lineage.contains(&format!("commit={commit}")),
        "{lineage}"
    );
}

#[test]
fn a_bad_with_is_refused_with_each_problem_located_in_the_pipeline() {
    let home = Home::new("plugin-bad-with");
    write_plugin(&home.dir.join("plugins"));
    home.write(
        "bad.yaml",
        r#"version: 1
name: bad
stages:
  hello:
    uses: ./plugins/greet
    with:
      who: 3
      times: 11
      tone: shouting
      colour: red
  upper:
    uses: ./plugins/greet
    with: {who: WORLD}
  none:
    uses: ./plugins/greet
  missing:
    uses: greet@9.9.9
  mapped:
    uses: ./plugins/greet
    map: {items: [two, three]}
    with: {who: x, times: "{{ item }}"}
  counted:
    uses: ./plugins/greet
    map: {items: [2, 3]}
    with: {who: x, times: "{{ item }}"}
"#,
    );
    let o = home.drivetrain(&["validate", "bad.yaml", "-o", "json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let v = json(&o);
    let diags = v[0]["diagnostics"].as_array().unwrap().clone();
    let find = |path: &str| {
        diags
            .iter()
            .find(|d| d["path"] == path)
            .unwrap_or_else(|| panic!("nothing at {path}: {diags:#?}"))
            .clone()
    };
    let step_file = home.dir.join("plugins/greet/step.yaml");
    let step_file = std::fs::canonicalize(step_file).unwrap();
    for (path, line, message, declared) in [
        (
            "stages.hello.with.who",
            7,
            "expected a string, found the integer 3",
            6,
        ),
        (
            "stages.hello.with.times",
            8,
            "11 is above the maximum 10",
            7,
        ),
        (
            "stages.hello.with.tone",
            9,
            "\"shouting\" is not one of \"plain\", \"loud\"",
            8,
        ),
        (
            "stages.upper.with.who",
            13,
            "does not match the pattern `[a-z ]+`",
            6,
        ),
    ] {
        let d = find(path);
        assert_eq!(d["line"], line, "{d}");
        assert!(d["message"].as_str().unwrap().contains(message), "{d}");
        let notes = d["notes"].to_string();
        assert!(
            notes.contains(&format!("{}:{declared}", step_file.display())),
            "the declaration it broke: {d}"
        );
    }
    let unknown = find("stages.hello.with.colour");
    assert_eq!(unknown["code"], "unknown-field");
    assert_eq!(
        (unknown["line"].as_u64(), unknown["column"].as_u64()),
        (Some(10), Some(7))
    );
    let missing = find("stages.none.uses");
    assert!(
        missing["message"]
            .as_str()
            .unwrap()
            .contains("needs param `who`"),
        "{missing}"
    );
    let version = find("stages.missing.uses");
    assert!(
        version["notes"]
            .to_string()
            .contains("`greet` is there as 1.0.0"),
        "{version}"
    );
    // A map's items have their type: strings are not the integer `times` takes.
    let mapped = find("stages.mapped.with.times");
    assert!(
        mapped["message"]
            .as_str()
            .unwrap()
            .contains("expected an integer, found the string \"two\""),
        "{mapped}"
    );
    assert!(!diags.iter().any(|d| d["path"]
        .as_str()
        .unwrap_or_default()
        .starts_with("stages.counted")));
    assert_eq!(diags.len(), 8, "{diags:#?}");
}

#[test]
fn a_broken_step_file_is_located_in_that_file() {
    let home = Home::new("plugin-broken-step");
    let dir = write_plugin(&home.dir.join("plugins"));
    let broken = STEP
        .replace(
            "minimum: 1, maximum: 10, default: 1",
            "minimum: 1, default: 0",
        )
        .replace(
            "\"{{ with.tone }}\"]",
            "\"{{ with.mood }}\", ../../escape.sh]",
        );
    std::fs::write(dir.join("step.yaml"), &broken).unwrap();
    let o = home.drivetrain(&["validate", "plugins/greet/step.yaml", "-o", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    let messages: Vec<(u64, String)> = v[0]["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["line"].as_u64().unwrap(),
                d["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let has = |line: u64, part: &str| messages.iter().any(|(l, m)| *l == line && m.contains(part));
    assert!(has(7, "0 is below the minimum 1"), "{messages:?}");
    assert!(has(12, "no param `mood`"), "{messages:?}");
    assert!(has(12, "leaves the step's folder"), "{messages:?}");
    // A pipeline using it is refused at its `uses:`, the step file's problems in notes.
    home.write(
        "p.yaml",
        "version: 1\nname: p\nstages:\n  a:\n    uses: ./plugins/greet\n    with: {who: x}\n",
    );
    let o = home.drivetrain(&["validate", "p.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("p.yaml:5:11"), "{err}");
    assert!(err.contains("step.yaml:7:"), "{err}");
}

#[test]
fn an_unchanged_step_is_a_hit_and_an_edited_one_a_miss_that_explain_names() {
    let home = Home::new("plugin-cache");
    let dir = write_plugin(&home.dir.join("plugins"));
    home.write(
        "p.yaml",
        "version: 1\nname: p\nstages:\n  hello:\n    uses: ./plugins/greet\n    with: {who: cache}\n",
    );
    let first = home.drivetrain(&["run", "p.yaml"]);
    assert_ok(&first);
    let second = home.drivetrain(&["run", "p.yaml"]);
    assert_ok(&second);
    let s = home.status(&run_id(&second));
    assert_eq!(stage(&s, "hello")["origin"], "cached", "{s}");
    // What a run of the step leaves in its folder (Python's bytecode) is not the step's.
    std::fs::create_dir_all(dir.join("__pycache__")).unwrap();
    std::fs::write(dir.join("__pycache__/helper.cpython-311.pyc"), "bytecode").unwrap();
    let again = home.drivetrain(&["run", "p.yaml"]);
    assert_ok(&again);
    let s = home.status(&run_id(&again));
    assert_eq!(stage(&s, "hello")["origin"], "cached", "{s}");
    // The script is the step's too: editing only it is a miss.
    std::fs::write(dir.join("greet.sh"), format!("{SCRIPT}\n# edited\n")).unwrap();
    let third = home.drivetrain(&["run", "p.yaml"]);
    assert_ok(&third);
    let s = home.status(&run_id(&third));
    assert_eq!(stage(&s, "hello")["origin"], "ran", "{s}");
    let o = home.drivetrain(&["explain", &run_id(&third), "hello", "-o", "json"]);
    assert_ok(&o);
    let e = json(&o);
    let changes = e["changes"].to_string();
    assert!(
        changes.contains("`step` changed: greet@1.0.0 sha256:"),
        "{e}"
    );
    assert!(
        !changes.contains("`command`"),
        "the command is the same: {e}"
    );
}

#[test]
fn tags_are_used_only_through_the_lock_file_and_locked_refuses_a_moved_one() {
    let home = Home::new("plugin-lock");
    let (repo, commit) = repository(&home);
    let uses = format!("git+file://{}//plugins/greet@v1", repo.display());
    home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: p\nstages:\n  hello:\n    uses: {uses}\n    with: {{who: tag}}\n"
        ),
    );
    let o = home.drivetrain(&["run", "p.yaml"]);
    assert_eq!(o.status.code(), Some(1), "a tag without a lock entry");
    assert!(
        text(&o.stderr).contains("plugins lock"),
        "{}",
        text(&o.stderr)
    );
    let o = home.drivetrain(&["plugins", "lock", "p.yaml"]);
    assert_ok(&o);
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(home.dir.join("drivetrain.lock")).unwrap())
            .unwrap();
    let entry = &lock["plugins"][&uses];
    assert_eq!(entry["commit"], commit.as_str(), "{lock}");
    assert_eq!(entry["name"], "greet");
    let o = home.drivetrain(&["run", "--locked", "p.yaml"]);
    assert_ok(&o);
    // The tag moves to a commit that changes the script.
    std::fs::write(
        repo.join("plugins/greet/greet.sh"),
        "echo moved > \"$DRIVETRAIN_OUTPUT_GREETING/g.txt\"\n",
    )
    .unwrap();
    git(&repo, &["commit", "-qam", "changed"]);
    git(&repo, &["tag", "-f", "v1"]);
    let moved = git(&repo, &["rev-parse", "HEAD"]);
    let o = home.drivetrain(&["run", "--locked", "p.yaml"]);
    assert_eq!(o.status.code(), Some(1), "--locked refuses a moved tag");
    let err = text(&o.stderr);
    assert!(
        err.contains("moved") && err.contains(&commit) && err.contains(&moved),
        "{err}"
    );
    // Without --locked the lock's commit is what runs: the old script.
    let o = home.drivetrain(&["run", "--no-cache", "p.yaml"]);
    assert_ok(&o);
    let s = home.status(&run_id(&o));
    assert_eq!(
        stage(&s, "hello")["provenance"]["plugin"]["commit"],
        commit.as_str()
    );
    // A lock entry of another digest: an error naming both.
    let real = entry["digest"].as_str().unwrap().to_owned();
    let forged = std::fs::read_to_string(home.dir.join("drivetrain.lock"))
        .unwrap()
        .replace(&real, &format!("sha256:{}", "0".repeat(64)));
    std::fs::write(home.dir.join("drivetrain.lock"), forged).unwrap();
    let o = home.drivetrain(&["validate", "p.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains(&real) && err.contains(&"0".repeat(64)),
        "{err}"
    );
    // `--locked` refuses a plugin the lock does not hold.
    write_plugin(&home.dir.join("plugins"));
    home.write(
        "q.yaml",
        "version: 1\nname: q\nstages:\n  hello:\n    uses: ./plugins/greet\n    with: {who: q}\n",
    );
    let o = home.drivetrain(&["run", "--locked", "q.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("has no entry"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_step_stays_in_its_folder_and_a_pipeline_cannot_read_step_words() {
    let home = Home::new("plugin-safety");
    let dir = write_plugin(&home.dir.join("plugins"));
    home.write("secret.txt", "not the step's");
    std::os::unix::fs::symlink(home.dir.join("secret.txt"), dir.join("peek.txt")).unwrap();
    home.write(
        "p.yaml",
        "version: 1\nname: p\nstages:\n  hello:\n    uses: ./plugins/greet\n    with: {who: x}\n  own:\n    run: {command: [echo, \"{{ step.dir }}\"]}\n",
    );
    let o = home.drivetrain(&["validate", "p.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("leads out of the step's folder"), "{err}");
    assert!(
        err.contains("`step.dir` is read only in a step file"),
        "{err}"
    );
    std::fs::remove_file(dir.join("peek.txt")).unwrap();
    let step = STEP.replace("run:\n", "run:\n  workdir: ../..\n");
    std::fs::write(dir.join("step.yaml"), step).unwrap();
    let o = home.drivetrain(&["validate", "p.yaml"]);
    assert!(
        text(&o.stderr).contains("`workdir: ../..` leaves the step's folder"),
        "{}",
        text(&o.stderr)
    );
    // A repository whose step folder is a link out of it is refused when fetched.
    let outside = home.dir.join("outside");
    write_plugin(&outside);
    let repo = home.dir.join("linked");
    std::fs::create_dir_all(repo.join("plugins")).unwrap();
    std::os::unix::fs::symlink(outside.join("greet"), repo.join("plugins/greet")).unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "a link out"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    home.write(
        "linked.yaml",
        &format!(
            "version: 1\nname: linked\nstages:\n  a:\n    uses: git+file://{}//plugins/greet@{commit}\n    with: {{who: x}}\n",
            repo.display()
        ),
    );
    let o = home.drivetrain(&["plugins", "fetch", "linked.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("leads out of the repository"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn steps_and_the_schema_list_plugin_params() {
    let home = Home::new("plugin-steps");
    let shared = home.dir.join("shared");
    write_plugin(&shared);
    let path = shared.display().to_string();
    let env = [("DRIVETRAIN_PLUGIN_PATH", path.as_str())];
    let o = home.drivetrain_env(&["steps", "-o", "json"], &env);
    assert_ok(&o);
    let v = json(&o);
    let greet = v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "greet")
        .unwrap_or_else(|| panic!("{v}"))
        .clone();
    assert_eq!(greet["version"], "1.0.0");
    assert_eq!(
        greet["config_schema"]["required"],
        serde_json::json!(["who"])
    );
    let o = home.drivetrain_env(&["steps", "greet@1.0.0"], &env);
    assert_ok(&o);
    let one = text(&o.stdout);
    assert!(
        one.contains("times")
            && one.contains("integer, default 1, ≥ 1, ≤ 10")
            && one.contains("step.yaml:7"),
        "{one}"
    );
    let o = home.drivetrain_env(&["schema"], &env);
    assert_ok(&o);
    let schema = json(&o);
    let conditions = schema["definitions"]["StageSpec"]["allOf"].to_string();
    assert!(
        conditions.contains("greet@1.0.0") && conditions.contains("\"times\""),
        "{conditions}"
    );
}

/// A worker of the example executor plugin (`plugins/queue-executor`) on `queue`, killed
/// with the test.
struct Worker(std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pipeline on the example executor plugin runs end to end through its worker; an
/// engine killed with `kill -9` mid-stage leaves the job running, and `resume` re-attaches
/// to it (found by the plugin when the handle was never recorded; no second job);
/// `cancel` reaches the job too.
#[test]
fn a_pipeline_on_an_executor_plugin_survives_kill_9_and_resumes_by_handle() {
    let home = Home::new("plugin-executor");
    let queue = home.dir.join("queue");
    std::fs::create_dir_all(&queue).unwrap();
    let plugins = concat!(env!("CARGO_MANIFEST_DIR"), "/plugins");
    let worker = Command::new("python3")
        .arg(format!("{plugins}/queue-executor/worker.py"))
        .arg(&queue)
        .spawn()
        .expect("the worker starts");
    let _worker = Worker(worker);
    let queue_s = queue.display().to_string();
    let env = [
        ("DRIVETRAIN_PLUGIN_PATH", plugins),
        ("DRIVETRAIN_QUEUE", queue_s.as_str()),
    ];
    let marks = home.dir.display().to_string();
    let file = home.write(
        "queued.yaml",
        &format!(
            r#"version: 1
name: queued
defaults: {{executor: queue}}
stages:
  first:
    run: {{command: [sh, -c, 'echo one > "$0/x"', "{{{{ outputs.out }}}}"]}}
    outputs: [out]
  second:
    inputs: {{a: first.out}}
    run: {{command: [sh, -c, 'echo $$ >> {marks}/started; echo held by the worker; while [ ! -e {marks}/go ]; do sleep 0.05; done; cp "$0/x" "$1/y"; echo "{{\"worker\": \"$PPID\"}}" > "$DRIVETRAIN_VALUES"', "{{{{ inputs.a }}}}", "{{{{ outputs.out }}}}"]}}
    outputs: [out]
"#
        ),
    );
    let o = home.drivetrain_env(&["validate", "queued.yaml"], &env);
    assert_ok(&o);
    // kill -9 while `second` runs under the worker.
    let (mut engine, run) = spawn_run_env(&home, &file, &env);
    wait_for_file(&home.dir.join("started"));
    // Killed once it has copied the job's first line into the attempt's log.
    let log = home
        .dir
        .join(format!(".drivetrain/work/{run}/second.1/log.txt"));
    let copied = (0..500).any(|_| {
        let held = std::fs::read_to_string(&log).unwrap_or_default();
        std::thread::sleep(std::time::Duration::from_millis(20));
        held.contains("held by the worker")
    });
    assert!(
        copied,
        "the engine copies the job's log as it runs: {}",
        log.display()
    );
    engine.kill().unwrap();
    engine.wait().unwrap();
    // As an engine killed between `start` and recording the handle leaves it (the handle
    // erased with Python's sqlite3): `resume` asks the plugin to `find` the attempt.
    erase_handle(&home, &run, "second");
    std::fs::write(home.dir.join("go"), "").unwrap();
    let o = home.drivetrain_env(&["resume", &run], &env);
    assert_ok(&o);
    assert!(
        text(&o.stdout).contains("0 attempt(s) lost, 1 re-attached"),
        "{}",
        text(&o.stdout)
    );
    let st = home.status(&run);
    assert_eq!(st["run"]["phase"], "Succeeded", "{st}");
    assert_eq!(stage(&st, "second")["attempts"], 1, "{st}");
    let started = std::fs::read_to_string(home.dir.join("started")).unwrap();
    assert_eq!(started.lines().count(), 1, "the stage ran once: {started}");
    let y = walk(&home.dir.join(".drivetrain/artifacts"))
        .into_iter()
        .find(|p| p.ends_with("second/1/out/y"))
        .expect("the job's output was published");
    assert_eq!(std::fs::read_to_string(y).unwrap(), "one\n");
    let jobs = std::fs::read_dir(queue.join("jobs")).unwrap().count();
    assert_eq!(jobs, 2, "one job per stage, none submitted again");
    // The stage's log came through the protocol's `logs`, once across the re-attach.
    let o = home.drivetrain(&["logs", &run, "--stage", "second"]);
    assert_ok(&o);
    assert_eq!(
        text(&o.stdout).matches("held by the worker").count(),
        1,
        "{}",
        text(&o.stdout)
    );
    // `cancel` of a run reaches the job the worker runs (a stage of another key: the
    // first is cached now).
    std::fs::remove_file(home.dir.join("go")).unwrap();
    std::fs::remove_file(home.dir.join("started")).unwrap();
    let mut again = std::fs::read_to_string(&file).unwrap();
    again.push_str("    env: {ROUND: two}\n");
    let file = home.write("again.yaml", &again);
    let (mut engine, run) = spawn_run_env(&home, &file, &env);
    wait_for_file(&home.dir.join("started"));
    assert_ok(&home.drivetrain_env(&["cancel", &run], &env));
    assert_eq!(engine.wait().unwrap().code(), Some(130));
    let st = home.status(&run);
    assert_eq!(st["run"]["phase"], "Cancelled", "{st}");
    let cancelled = std::fs::read_dir(queue.join("jobs"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_to_string(e.path().join("status.json"))
                .is_ok_and(|s| s.contains("cancelled"))
        })
        .count();
    assert_eq!(cancelled, 1, "the job was cancelled where it ran");
}

/// A pipeline `serve` runs from its folder uses that folder's plugin steps: the run, its
/// graph in the web view and a rerun through the API are all planned from the run's own
/// folder, not from the server's.
#[test]
fn a_served_pipeline_uses_its_folders_plugins_for_runs_graphs_and_reruns() {
    use crate::common::http::{json, start, wait_phase, TOKEN};
    let home = Home::new("plugin-served");
    write_plugin(&home.dir.join("served/plugins"));
    home.write(
        "served/greeting.yaml",
        "version: 1\nname: greeting\nstages:\n  hello:\n    uses: ./plugins/greet\n    with: {who: served, times: 2}\n  after:\n    needs: [hello]\n    run: {command: [\"true\"]}\n",
    );
    let s = start(&home, &["--token", TOKEN]);
    let (code, v) = json(
        &s,
        "POST",
        "/api/v1/runs",
        Some(r#"{"pipeline": "greeting"}"#),
    );
    assert_eq!(code, 201, "{v}");
    let run = v["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &run, "Succeeded");
    let (code, g) = json(&s, "GET", &format!("/api/v1/runs/{run}/graph"), None);
    assert_eq!(code, 200, "{g}");
    assert!(
        g.get("note").is_none(),
        "drawn from the run's own plan: {g}"
    );
    assert_eq!(g["nodes"][1]["needs"], serde_json::json!(["hello"]), "{g}");
    let (code, r) = json(
        &s,
        "POST",
        &format!("/api/v1/runs/{run}/rerun"),
        Some(r#"{"stages": ["hello"]}"#),
    );
    assert_eq!(code, 201, "{r}");
    let rerun = r["run"].as_str().unwrap().to_owned();
    wait_phase(&s, &rerun, "Succeeded");
    let st = home.status(&rerun);
    assert_eq!(stage(&st, "hello")["origin"], "ran", "{st}");
    assert_eq!(
        stage(&st, "hello")["provenance"]["plugin"]["name"],
        "greet",
        "{st}"
    );
}

/// A run executes the plugin it validated: its folder is kept in the home by digest when
/// the run starts, so an edit of the step's script while the run is going (a template
/// changed during a run, argo-workflows#8276) changes nothing of that run.
#[test]
fn a_step_edited_during_a_run_does_not_change_that_run() {
    let home = Home::new("plugin-snapshot");
    let dir = write_plugin(&home.dir.join("plugins"));
    let marks = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: p\nstages:\n  hold:\n    run: {{command: [sh, -c, 'echo held > {marks}/started; while [ ! -e {marks}/go ]; do sleep 0.05; done']}}\n  hello:\n    needs: [hold]\n    uses: ./plugins/greet\n    with: {{who: kept}}\n"
        ),
    );
    let (mut engine, run) = spawn_run(&home, &file);
    wait_for_file(&home.dir.join("started"));
    std::fs::write(
        dir.join("greet.sh"),
        "echo edited > \"$DRIVETRAIN_OUTPUT_GREETING/g.txt\"\n",
    )
    .unwrap();
    std::fs::write(home.dir.join("go"), "").unwrap();
    assert_eq!(engine.wait().unwrap().code(), Some(0));
    let published = walk(&home.dir.join(".drivetrain/artifacts"));
    let g = published
        .iter()
        .find(|p| p.ends_with(format!("{run}/hello/1/greeting/g.txt")))
        .expect("published");
    assert_eq!(std::fs::read_to_string(g).unwrap(), "hello kept\n");
    let st = home.status(&run);
    let digest = stage(&st, "hello")["provenance"]["plugin"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept = home
        .dir
        .join(".drivetrain/plugins/steps")
        .join(digest.trim_start_matches("sha256:"));
    assert!(kept.join("step.yaml").is_file(), "{}", kept.display());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(kept.join("greet.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o222, 0, "kept read-only: {mode:o}");
    // The next run plans the edited step: another digest, another key.
    std::fs::remove_file(home.dir.join("go")).unwrap();
    std::fs::write(home.dir.join("go"), "").unwrap();
    let o = home.drivetrain(&["run", "p.yaml"]);
    assert_ok(&o);
    let next = home.status(&run_id(&o));
    assert_eq!(stage(&next, "hello")["origin"], "ran", "{next}");
    assert_ne!(
        stage(&next, "hello")["provenance"]["plugin"]["digest"],
        digest.as_str()
    );
}
