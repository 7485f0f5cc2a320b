//! End-to-end tests of caching, `rerun`, `retry`, `explain`, `lineage`, `forget` and `gc`
//! through the binary: real processes, a `file://` store and SQLite state. Every stage
//! appends its name to a counter file, so the tests see exactly what executed.

use crate::common;
use common::{assert_ok, run_id, stage, text, Home};

/// A 5-stage chain a → b → c → d → e. `b` renders the `seed` param; `c` runs a script
/// from the pipeline's directory; `d` fails while a file `fail-d` exists.
fn chain(home: &Home) -> std::path::PathBuf {
    let dir = home.dir.display().to_string();
    home.write("c.sh", "cat \"$1/x\" > \"$2/x\"\necho c-v1 >> \"$2/x\"\n");
    home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: five
params:
  seed: {{type: string, default: s1}}
stages:
  a:
    run: {{command: [sh, -c, 'echo a >> {dir}/count; echo a > "$0/x"', "{{{{ outputs.o }}}}"]}}
    outputs: [o]
  b:
    inputs: {{i: a.o}}
    run: {{command: [sh, -c, 'echo b >> {dir}/count; cat "$0/x" > "$1/x"; echo "$2" >> "$1/x"', "{{{{ inputs.i }}}}", "{{{{ outputs.o }}}}", "{{{{ params.seed }}}}"]}}
    outputs: [o]
  c:
    inputs: {{i: b.o}}
    run:
      command: [sh, -c, 'echo c >> {dir}/count; sh "$@"', c, c.sh, "{{{{ inputs.i }}}}", "{{{{ outputs.o }}}}"]
      workdir: {dir}
    outputs: [o]
  d:
    inputs: {{i: c.o}}
    run: {{command: [sh, -c, 'echo d >> {dir}/count; test ! -e {dir}/fail-d && cat "$0/x" > "$1/x"', "{{{{ inputs.i }}}}", "{{{{ outputs.o }}}}"]}}
    outputs: [o]
  e:
    inputs: {{i: d.o}}
    run: {{command: [sh, -c, 'echo e >> {dir}/count; cat "$0/x" > "$1/x"', "{{{{ inputs.i }}}}", "{{{{ outputs.o }}}}"]}}
    outputs: [o]
"#
        ),
    )
}

impl Home {
    /// The stages that executed since the last call, in order.
    fn executed(&self) -> Vec<String> {
        let p = self.dir.join("count");
        let t = std::fs::read_to_string(&p).unwrap_or_default();
        let _ = std::fs::remove_file(&p);
        t.lines().map(str::to_owned).collect()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.drivetrain(args);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?}: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        run_id(&o)
    }

    fn origin(&self, run: &str, name: &str) -> (String, String) {
        let st = self.status(run);
        let s = stage(&st, name);
        (
            s["origin"].as_str().unwrap_or_default().to_owned(),
            s["origin_run"].as_str().unwrap_or_default().to_owned(),
        )
    }

    fn output(&self, run: &str, name: &str) -> serde_json::Value {
        stage(&self.status(run), name)["outputs"]["o"].clone()
    }
}

#[test]
fn rerun_executes_exactly_the_selected_stages_and_reuses_the_rest() {
    let home = Home::new("rerun");
    let file = chain(&home);
    let f = file.to_str().unwrap();
    let first = home.ok(&["run", f]);
    assert_eq!(home.executed(), ["a", "b", "c", "d", "e"]);

    // The middle stage alone: upstream reused exactly, downstream not run.
    let r1 = home.ok(&["rerun", &first, "--stage", "c"]);
    assert_eq!(home.executed(), ["c"]);
    assert_eq!(home.origin(&r1, "a"), ("reused".into(), first.clone()));
    assert_eq!(home.origin(&r1, "b"), ("reused".into(), first.clone()));
    assert_eq!(home.origin(&r1, "c").0, "ran");
    assert_eq!(home.output(&r1, "b"), home.output(&first, "b"));
    let st = home.status(&r1);
    assert_eq!(stage(&st, "d")["phase"], "Skipped");
    assert_eq!(st["run"]["parent"], first.as_str());
    assert_eq!(st["run"]["trigger"], "rerun");

    // With its dependants.
    let r2 = home.ok(&["rerun", &first, "--stage", "c", "--downstream"]);
    assert_eq!(home.executed(), ["c", "d", "e"]);
    assert_eq!(home.origin(&r2, "e").0, "ran");

    // `--from` is the same selection; `--only` exactly the stages named, each reading
    // what the parent had upstream of it (`d` reads the parent's `c`).
    home.ok(&["rerun", &first, "--from", "d"]);
    assert_eq!(home.executed(), ["d", "e"]);
    let only = home.ok(&["rerun", &first, "--only", "b,d"]);
    let mut both = home.executed();
    both.sort();
    assert_eq!(
        both,
        ["b", "d"],
        "in parallel: d does not wait for the new b"
    );
    assert_eq!(home.origin(&only, "c"), ("reused".into(), first.clone()));
    assert_eq!(stage(&home.status(&only), "e")["phase"], "Skipped");

    // Upstream code changed since: the rerun still takes the parent's artifacts exactly,
    // and a param override reaches the stage it selects.
    std::fs::write(home.dir.join("c.sh"), "exit 9\n").unwrap();
    let r3 = home.ok(&["rerun", &first, "--stage", "d", "--param", "seed=s9"]);
    assert_eq!(home.executed(), ["d"]);
    assert_eq!(home.output(&r3, "c"), home.output(&first, "c"));
    assert_eq!(home.status(&r3)["run"]["overrides"]["params"]["seed"], "s9");

    // A rerun of a run of a rerun points at the run that made the artifact.
    let r4 = home.ok(&["rerun", &r1, "--stage", "d"]);
    assert_eq!(home.origin(&r4, "a"), ("reused".into(), first.clone()));
    assert_eq!(home.origin(&r4, "c"), ("reused".into(), r1.clone()));
    assert_eq!(home.executed(), ["d"]);

    // Unknown stages are usage errors with a hint.
    let o = home.drivetrain(&["rerun", &first, "--stage", "cc"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("no stage named `cc`"),
        "{}",
        text(&o.stderr)
    );
    let o = home.drivetrain(&["rerun", &first]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("say what to rerun"));
}

#[test]
fn an_identical_second_run_executes_nothing_and_changes_invalidate_exactly_the_dependants() {
    let home = Home::new("cache");
    let file = chain(&home);
    let f = file.to_str().unwrap();
    let first = home.ok(&["run", f]);
    assert_eq!(home.executed().len(), 5);

    let second = home.ok(&["run", f]);
    assert!(
        home.executed().is_empty(),
        "an identical run executes nothing"
    );
    for s in ["a", "b", "c", "d", "e"] {
        assert_eq!(
            home.origin(&second, s),
            ("cached".into(), first.clone()),
            "{s}"
        );
    }
    let explain = text(&home.drivetrain(&["explain", &second, "c"]).stdout);
    assert!(
        explain.contains(&format!("hit: outputs taken from run {first}")),
        "{explain}"
    );

    // A param only `b` renders: `a` stays cached, `b` and everything after it execute.
    let third = home.ok(&["run", f, "--param", "seed=s2"]);
    assert_eq!(home.executed(), ["b", "c", "d", "e"]);
    assert_eq!(home.origin(&third, "a").0, "cached");
    let b = text(&home.drivetrain(&["explain", &third, "b"]).stdout);
    assert!(b.contains("`command` changed"), "{b}");
    // Not only two digests: the rendered definition's line that changed, old and new.
    let changed = b
        .lines()
        .skip_while(|l| *l != "in the rendered definition:")
        .nth(1)
        .unwrap_or_else(|| panic!("no definition diff in {b}"));
    assert!(changed.contains("s2") && changed.contains(" → "), "{b}");
    let c = text(&home.drivetrain(&["explain", &third, "c"]).stdout);
    assert!(c.contains("`input:i` changed"), "{c}");
    assert!(!c.contains("`command` changed"), "{c}");

    // The script `c` runs changed: `c` and its dependants execute, `explain` names the file.
    std::fs::write(
        home.dir.join("c.sh"),
        "cat \"$1/x\" > \"$2/x\"\necho c-v2 >> \"$2/x\"\n",
    )
    .unwrap();
    let fourth = home.ok(&["run", f, "--param", "seed=s2"]);
    assert_eq!(home.executed(), ["c", "d", "e"]);
    let c = text(&home.drivetrain(&["explain", &fourth, "c"]).stdout);
    assert!(c.contains("`file:") && c.contains("c.sh` changed"), "{c}");
    let json: serde_json::Value = serde_json::from_slice(
        &home
            .drivetrain(&["explain", &fourth, "c", "--output", "json"])
            .stdout,
    )
    .unwrap();
    assert_eq!(json["origin"], "ran");
    assert!(json["changes"].as_array().unwrap().len() == 1, "{json}");

    // --no-cache executes everything and records nothing; --overwrite-cache executes
    // everything and records it.
    home.ok(&["run", f, "--no-cache"]);
    assert_eq!(home.executed().len(), 5);
    let over = home.ok(&["run", f, "--overwrite-cache"]);
    assert_eq!(home.executed().len(), 5);
    let after = home.ok(&["run", f]);
    assert!(home.executed().is_empty());
    assert_eq!(home.origin(&after, "e"), ("cached".into(), over));
}

#[test]
fn retry_reuses_what_succeeded_and_runs_the_rest() {
    let home = Home::new("retry");
    let file = chain(&home);
    home.write("fail-d", "");
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let failed = run_id(&o);
    assert_eq!(home.executed(), ["a", "b", "c", "d"]);

    // Its failed upstream is why a rerun of `e` alone cannot work.
    let o = home.drivetrain(&["rerun", &failed, "--stage", "e"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("`d` (upstream of `e`) did not succeed"),
        "{}",
        text(&o.stderr)
    );

    std::fs::remove_file(home.dir.join("fail-d")).unwrap();
    let retried = home.ok(&["retry", &failed]);
    assert_eq!(home.executed(), ["d", "e"]);
    let st = home.status(&retried);
    assert_eq!(st["run"]["trigger"], "retry");
    assert_eq!(st["run"]["phase"], "Succeeded");
    assert_eq!(
        home.origin(&retried, "c"),
        ("reused".into(), failed.clone())
    );
    let shown = text(&home.drivetrain(&["status", &retried]).stdout);
    assert!(
        shown.contains(&format!("reused (from run {failed})")),
        "{shown}"
    );
    let again = home.drivetrain(&["retry", &retried]);
    assert_eq!(again.status.code(), Some(0));
    assert!(text(&again.stdout).contains("nothing to retry"));
}

#[test]
fn lineage_walks_to_the_sources_and_forget_finds_everything_derived() {
    let home = Home::new("lineage");
    let file = chain(&home);
    let f = file.to_str().unwrap();
    let first = home.ok(&["run", f, "--param", "seed=drive-42.mcap"]);
    let other = home.ok(&["run", f, "--param", "seed=drive-7.mcap"]);

    let o = home.drivetrain(&["lineage", &format!("{other}/e/o"), "--output", "json"]);
    assert_ok(&o);
    let g: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes = g["nodes"].as_object().unwrap();
    // `a` was a cache hit in the second run: its lineage goes to the run that made it.
    assert!(nodes.contains_key(&format!("{first}/a")), "{g}");
    assert!(nodes.contains_key(&format!("{other}/b")), "{g}");
    assert_eq!(
        nodes[&format!("{other}/b")]["params"]["seed"],
        "drive-7.mcap"
    );
    assert_eq!(
        nodes[&format!("{first}/a")]["definition"]["command"][0],
        "sh"
    );
    assert_eq!(
        nodes.values().filter(|n| n["kind"] == "stage").count(),
        5,
        "e, d, c, b of the second run and a of the first: {g}"
    );

    let down = home.drivetrain(&["lineage", &format!("{first}/a/o"), "--downstream"]);
    let down = text(&down.stdout);
    assert!(down.contains(&format!("{first}/e/o")), "{down}");
    assert!(down.contains(&format!("{other}/e/o")), "{down}");
    for fmt in ["dot", "mermaid"] {
        let o = home.drivetrain(&["lineage", &first, "--output", fmt]);
        assert_eq!(o.status.code(), Some(0));
        assert!(text(&o.stdout).contains(&format!("{first}/a")), "{fmt}");
    }

    // Everything derived from one drive log, and nothing from the other.
    let o = home.drivetrain(&["forget", "drive-42.mcap", "--output", "json"]);
    let g: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<&String> = g["nodes"].as_object().unwrap().keys().collect();
    assert!(ids.iter().any(|i| *i == &format!("{first}/e")), "{ids:?}");
    assert!(!ids.iter().any(|i| i.starts_with(&other)), "{ids:?}");
    assert!(!ids.iter().any(|i| *i == &format!("{first}/a")), "{ids:?}");

    let o = home.drivetrain(&["lineage", "no-such-run"]);
    assert_eq!(o.status.code(), Some(2));
    let o = home.drivetrain(&["lineage", &format!("{first}/b/nope")]);
    assert!(
        text(&o.stderr).contains("has no output `nope`; it has `o`"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn gc_lists_then_deletes_what_nothing_refers_to() {
    let home = Home::new("gc");
    let file = chain(&home);
    let f = file.to_str().unwrap();
    let first = home.ok(&["run", f]);
    home.executed();
    let store = home.dir.join(".drivetrain/artifacts/runs");

    // Everything is recent: nothing to delete.
    let o = home.drivetrain(&["gc", "--output", "json"]);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["unreferenced"].as_object().unwrap().len(), 0);

    // With no day kept, every run is old and every cache entry expired: a dry run lists
    // the objects and deletes none.
    let o = home.drivetrain(&["gc", "--keep-days", "0"]);
    let listed = text(&o.stdout);
    assert!(listed.contains("would delete"), "{listed}");
    assert!(store.join(&first).join("e/1/manifests/o.json").exists());
    let o = home.drivetrain(&["gc", "--keep-days", "0", "--apply"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!store.join(&first).join("e/1/manifests/o.json").exists());
    // The cache entries went with them: the next run executes everything again.
    home.ok(&["run", f]);
    assert_eq!(home.executed().len(), 5);
}

#[test]
fn max_age_expires_cache_entries() {
    let home = Home::new("maxage");
    let dir = home.dir.display().to_string();
    let file = home.write(
        "p.yaml",
        &format!(
            r#"
version: 1
name: aged
stages:
  a:
    run: {{command: [sh, -c, 'echo a >> {dir}/count; echo a > "$0/x"', "{{{{ outputs.o }}}}"]}}
    outputs: [o]
    cache: {{max_age: 1s}}
  b:
    run: {{command: [sh, -c, 'echo b >> {dir}/count; echo b > "$0/x"', "{{{{ outputs.o }}}}"]}}
    outputs: [o]
    cache: {{enabled: false}}
"#
        ),
    );
    let f = file.to_str().unwrap();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    home.ok(&["run", f]);
    assert_eq!(sorted(home.executed()), ["a", "b"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let second = home.ok(&["run", f]);
    assert_eq!(sorted(home.executed()), ["a", "b"]);
    let a = text(&home.drivetrain(&["explain", &second, "a"]).stdout);
    assert!(a.contains("is older than `max_age`"), "{a}");
    let b = text(&home.drivetrain(&["explain", &second, "b"]).stdout);
    assert!(
        b.contains("not cacheable: `cache: {enabled: false}`"),
        "{b}"
    );
}

/// `list` filters by pipeline and phase and stops at `--limit`; an unknown phase is a
/// usage error (exit 2).
#[test]
fn list_filters_by_pipeline_phase_and_limit() {
    let home = Home::new("list-filters");
    let ok = home.write(
        "ok.yaml",
        "version: 1\nname: ok\nstages:\n  a: {run: {command: [\"true\"]}}\n",
    );
    let bad = home.write(
        "bad.yaml",
        "version: 1\nname: bad\nstages:\n  a: {run: {command: [\"false\"]}}\n",
    );
    let mut ids = Vec::new();
    for f in [&ok, &bad, &ok, &bad, &ok] {
        ids.push(run_id(&home.drivetrain(&["run", f.to_str().unwrap()])));
    }
    let listed = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["list", "-o", "json"];
        a.extend(args);
        let o = home.drivetrain(&a);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    // Newest first.
    assert_eq!(
        listed(&[]),
        [
            ids[4].clone(),
            ids[3].clone(),
            ids[2].clone(),
            ids[1].clone(),
            ids[0].clone()
        ]
    );
    assert_eq!(
        listed(&["--pipeline", "bad"]),
        [ids[3].clone(), ids[1].clone()]
    );
    assert_eq!(
        listed(&["--phase", "Failed"]),
        [ids[3].clone(), ids[1].clone()]
    );
    assert_eq!(
        listed(&["--phase", "succeeded", "-n", "2"]),
        [ids[4].clone(), ids[2].clone()]
    );
    assert!(listed(&["--pipeline", "ok", "--phase", "failed"]).is_empty());
    let o = home.drivetrain(&["list", "--phase", "done"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--phase done: not a phase of a run"),
        "{}",
        text(&o.stderr)
    );
}

/// `status --watch` shows the run again until it ends, then exits 0 if it succeeded and
/// 1 if not.
#[test]
fn status_watch_follows_a_run_to_its_end() {
    let home = Home::new("watch");
    for (name, last, code) in [("fine", "true", 0), ("broken", "false", 1)] {
        let file = home.write(
            &format!("{name}.yaml"),
            &format!(
                "version: 1\nname: {name}\nstages:\n  slow: {{run: {{command: [sleep, '2']}}}}\n  last: {{needs: [slow], run: {{command: [\"{last}\"]}}}}\n"
            ),
        );
        let o = home.drivetrain(&["run", file.to_str().unwrap(), "--detach"]);
        assert_ok(&o);
        let id = run_id(&o);
        let w = home.drivetrain(&["status", &id, "--watch"]);
        assert_eq!(w.status.code(), Some(code), "{}", text(&w.stderr));
        let shown = text(&w.stdout);
        let headers: Vec<&str> = shown
            .lines()
            .filter(|l| l.starts_with(&format!("run {id} of {name}")))
            .collect();
        assert!(headers.len() >= 2, "shown once only: {shown}");
        assert!(headers[0].ends_with("Running"), "{shown}");
        let end = if code == 0 { "Succeeded" } else { "Failed" };
        assert!(headers.last().unwrap().contains(end), "{shown}");
    }
}

/// `logs RUN --follow` without a stage: every stage's lines as they are written, each led
/// by its stage (and attempt from the second), until the run ends; the exit status is the
/// run's.
#[test]
fn a_whole_run_is_followed() {
    let home = Home::new("follow-run");
    let file = home.write(
        "p.yaml",
        r#"
version: 1
name: follow
params:
  fail: {type: boolean, default: false}
stages:
  a:
    run: {command: [sh, -c, 'echo one; sleep 0.3; printf "two (no newline)"']}
  b:
    needs: [a]
    retries: {limit: 1, backoff: 0s}
    run: {command: [sh, -c, 'echo "b try $DRIVETRAIN_ATTEMPT"; if [ "$DRIVETRAIN_ATTEMPT" = 1 ] || [ "$0" = true ]; then exit 1; fi', "{{ params.fail }}"]}
"#,
    );
    let f = file.to_str().unwrap();
    let follow = |extra: &[&str]| {
        let mut args = vec!["run", f, "--detach"];
        args.extend_from_slice(extra);
        let o = home.drivetrain(&args);
        assert_ok(&o);
        let id = run_id(&o);
        home.drivetrain(&["logs", &id, "--follow"])
    };
    let o = follow(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    for want in [
        "a | one",
        "a | two (no newline)",
        "b | b try 1",
        "b#2 | b try 2",
    ] {
        assert!(lines.contains(&want), "{want} in {out}");
    }
    let at = |l: &str| lines.iter().position(|x| *x == l).unwrap();
    assert!(at("a | one") < at("a | two (no newline)"), "{out}");
    assert!(at("b | b try 1") < at("b#2 | b try 2"), "{out}");

    let o = follow(&["--param", "fail=true"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a failed run: {}",
        text(&o.stdout)
    );
}

/// One rule for exit codes: 1 a failure, 2 a usage error, naming what does not exist
/// included.
#[test]
fn exit_codes_follow_one_rule() {
    let home = Home::new("exit-codes");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: codes\nstages:\n  s:\n    run: {command: [sh, -c, 'exit 3']}\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "a failed run");
    let id = run_id(&o);
    for (args, why) in [
        (vec!["status", "no-such-run"], "an unknown run"),
        (vec!["logs", "no-such-run"], "an unknown run"),
        (vec!["explain", "no-such-run", "s"], "an unknown run"),
        (vec!["explain", &id, "nope"], "an unknown stage"),
        (vec!["lineage", "no-such-run/s"], "an unknown run"),
        (vec!["status", "--no-such-flag"], "an unknown flag"),
        (vec!["run", "missing.yaml"], "a missing file"),
    ] {
        let o = home.drivetrain(&args);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{why}: {args:?}: {}",
            text(&o.stderr)
        );
    }
    let help = text(&home.drivetrain(&["--help"]).stdout);
    assert!(
        help.contains("Exit status, for every command: 0 success; 1 a failure"),
        "{help}"
    );
}
