//! Searches end to end: ASHA over a synthetic objective with a known optimum (both
//! variants), trials that resume from their own checkpoints, the best trial's output
//! handed downstream, `trials -o json`, and a search that survives `kill -9`.

use serde_json::Value;

use crate::common::*;

/// A trainer: `val_loss` is lowest at lr = 0.01, width = 0.5 and falls with the epochs;
/// it resumes from its checkpoint, reports each epoch once, writes the lr it used to its
/// values, and (as trial `HOLD`, once) waits to be killed. Its model says which epochs
/// each of its runs started at.
const TRAIN: &str = r#"
import json, math, os, sys, time
lr, width, budget = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
ck = os.path.join(os.environ["DRIVETRAIN_CHECKPOINTS"], "state.json")
state = json.load(open(ck)) if os.path.exists(ck) else {"epoch": 0, "starts": []}
state["starts"].append(state["epoch"] + 1)
hold = os.path.join(sys.argv[4], "held")
if os.environ["DRIVETRAIN_TRIAL_ID"] == os.environ.get("HOLD") and not os.path.exists(hold):
    open(hold, "w").write(str(os.getpid()))
    time.sleep(300)
for epoch in range(state["epoch"] + 1, budget + 1):
    loss = (math.log10(lr) + 2) ** 2 + (width - 0.5) ** 2 + 1.0 / epoch
    state["epoch"] = epoch
    json.dump(state, open(ck, "w"))
    with open(os.environ["DRIVETRAIN_METRICS"], "a") as m:
        m.write(json.dumps({"step": epoch, "val_loss": loss}) + "\n")
model = dict(state, lr=lr, width=width, trial=os.environ["DRIVETRAIN_TRIAL_ID"])
json.dump(model, open(os.path.join(os.environ["DRIVETRAIN_OUTPUT_MODEL"], "model.json"), "w"))
json.dump({"lr_used": lr, "trials": "a trial's own"}, open(os.environ["DRIVETRAIN_VALUES"], "w"))
"#;

pub(crate) fn pipeline(
    home: &Home,
    variant: &str,
    concurrent: u32,
    hold: &str,
) -> std::path::PathBuf {
    home.write("train.py", TRAIN);
    let d = home.dir.display();
    home.write(
        "search.yaml",
        &format!(
            r#"
version: 1
name: sweep
stages:
  train:
    run:
      workdir: .
      command: [python3, train.py, "{{{{ trial.params.lr }}}}", "{{{{ trial.params.width }}}}", "{{{{ trial.budget }}}}", "{d}"]
    env: {{HOLD: "{hold}"}}
    outputs: [model]
    search:
      method: asha
      variant: {variant}
      metric: val_loss
      max_trials: 27
      max_concurrent: {concurrent}
      budget: {{unit: epochs, min: 1, max: 27}}
      reduction_factor: 3
      seed: 11
      space:
        lr: {{log_uniform: [0.0001, 1]}}
        width: {{uniform: [0, 1]}}
  use:
    inputs: {{model: train.model}}
    run: {{command: [cat, "{{{{ inputs.model }}}}/model.json"]}}
    when: stages.train.values.best.metric < 1
"#
        ),
    )
}

pub(crate) fn trials(home: &Home, run: &str) -> Value {
    let o = home.drivetrain(&["trials", run, "train", "-o", "json"]);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The model the downstream stage printed.
fn used_model(home: &Home, run: &str) -> Value {
    let o = home.drivetrain(&["logs", run, "--stage", "use"]);
    let log = text(&o.stdout);
    let line = log
        .lines()
        .find(|l| l.contains("\"lr\""))
        .unwrap_or_else(|| panic!("{log}"));
    serde_json::from_str(&line[line.find('{').unwrap()..]).unwrap()
}

/// Epochs each trial trained (its `val_loss` reports), checking none was trained twice.
fn epochs(listed: &Value) -> u64 {
    let mut total = 0;
    for t in listed["trials"].as_array().unwrap() {
        let steps = t["steps"].as_u64().unwrap();
        assert_eq!(steps, t["budget_used"].as_u64().unwrap(), "{t}");
        total += steps;
    }
    total
}

fn search_ends_well(variant: &str) {
    let home = Home::new(&format!("search-{variant}"));
    let file = pipeline(&home, variant, 2, "none");
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let run = run_id(&o);
    let listed = trials(&home, &run);
    let all = listed["trials"].as_array().unwrap();
    assert_eq!(all.len(), 27);
    for t in all {
        for field in [
            "id",
            "params",
            "state",
            "steps",
            "metric",
            "started_at",
            "updated_at",
        ] {
            assert!(!t[field].is_null(), "{field} of {t}");
        }
    }
    let state = |s: &str| all.iter().filter(|t| t["state"] == s).count();
    assert_eq!(state("succeeded") + state("pruned"), 27, "{listed}");
    assert!(state("pruned") >= 18, "{} pruned", state("pruned"));
    // Stopped early: well under half of every trial's 27 epochs.
    let used = epochs(&listed);
    assert!(used < 27 * 27 / 2, "{used} epochs of {}", 27 * 27);
    // The best trial is near the optimum, and its model is what the next stage read.
    let st = home.status(&run);
    let counted = &st["trials"]["train"];
    assert_eq!(
        counted["pruned"].as_u64(),
        Some(state("pruned") as u64),
        "{counted}"
    );
    let best = &stage(&st, "train")["values"]["best"];
    let lr = best["params"]["lr"].as_f64().unwrap();
    let width = best["params"]["width"].as_f64().unwrap();
    assert!(
        (lr.log10() + 2.0).abs() < 0.5 && (width - 0.5).abs() < 0.25,
        "{best}"
    );
    let model = used_model(&home, &run);
    assert_eq!(model["trial"], best["trial"]);
    assert_eq!(model["epoch"], 27);
    // Each rung of the best trial began where its checkpoint ended: each epoch once.
    let starts: Vec<u64> = model["starts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(starts, vec![1, 2, 4, 10], "{model}");
    // Each trial's log (its last rung's attempt) under `logs`.
    let logs = text(&home.drivetrain(&["logs", &run, "--stage", "train"]).stdout);
    let head = format!(
        "── train trial {} (attempt 4, succeeded) ──",
        best["trial"].as_str().unwrap()
    );
    assert!(logs.contains(&head), "{logs}");
    // The model's lineage names the trial and its params.
    let lineage = text(&home.drivetrain(&["lineage", &format!("{run}/use")]).stdout);
    let trial = format!("trial={} trial_params={}", best["trial"], best["params"]);
    assert!(lineage.contains(&trial), "{lineage}");
    let metric = best["metric"].as_f64().unwrap();
    let listed_best = all.iter().find(|t| t["id"] == best["trial"]).unwrap();
    assert_eq!(listed_best["metric"].as_f64(), Some(metric));
    // What the best trial reported is the stage's too, beside the search's own keys.
    let values = &stage(&st, "train")["values"];
    assert_eq!(values["lr_used"], best["params"]["lr"], "{values}");
    assert_eq!(values["trials"], 27, "the search's count wins: {values}");
    if variant == "stop" {
        let reason = all.iter().find(|t| t["state"] == "pruned").unwrap()["reason"].clone();
        assert!(
            reason.as_str().unwrap().contains("below the rung's cut"),
            "{reason}"
        );
    }
}

#[test]
fn asha_promote_stops_the_losers_and_resumes_winners_from_their_checkpoints() {
    search_ends_well("promote");
}

#[test]
fn asha_stop_decides_at_each_rung() {
    search_ends_well("stop");
}

/// The trials of a run, as the search decided them (not when or in how many attempts).
fn decisions(listed: &Value) -> Vec<Value> {
    let keep = [
        "id",
        "params",
        "state",
        "rung",
        "rung_metrics",
        "budget_used",
    ];
    listed["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| keep.iter().map(|k| t[*k].clone()).collect())
        .collect()
}

#[test]
fn a_search_killed_mid_rung_resumes_with_the_same_decisions() {
    // One trial at a time: a search that decides the same way every time.
    let reference = Home::new("search-reference");
    let file = pipeline(&reference, "promote", 1, "none");
    let o = reference.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let expected = decisions(&trials(&reference, &run_id(&o)));

    let home = Home::new("search-kill9");
    let file = pipeline(&home, "promote", 1, "t010");
    let (mut engine, id) = spawn_run(&home, &file);
    wait_for_file(&home.dir.join("held"));
    engine.kill().unwrap(); // SIGKILL
    engine.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(900));
    let before = trials(&home, &id);
    assert_eq!(before["trials"].as_array().unwrap().len(), 11, "{before}");
    assert_eq!(before["trials"][10]["state"], "running");
    let o = home.drivetrain(&["resume", &id]);
    assert_ok(&o);
    let after = trials(&home, &id);
    assert_eq!(decisions(&after), expected);
    // The interrupted trial ran its rung again (one more attempt), nothing else did.
    let attempts: Vec<u64> = after["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["attempts"].as_u64().unwrap())
        .collect();
    let once: Vec<u64> = trials(&reference, "@latest")["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["attempts"].as_u64().unwrap())
        .collect();
    for (i, (a, b)) in attempts.iter().zip(&once).enumerate() {
        assert_eq!(
            *a,
            b + u64::from(i == 10),
            "trial {i}: {attempts:?} against {once:?}"
        );
    }
    let model = used_model(&home, &id);
    assert_eq!(model["epoch"], 27);
}

/// `compare` puts runs side by side, only what differs: the code each ran (its pipeline
/// folder's commit, dirty or not, and the digest of each file a command named), params
/// and the best trial of each search.
#[test]
fn compare_shows_what_differs_between_runs_code_included() {
    let home = Home::new("search-compare");
    let git = |args: &[&str]| {
        let o = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(&home.dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {}", text(&o.stderr));
        text(&o.stdout)
    };
    let file = home.write(
        "grid.yaml",
        r#"
version: 1
name: grid
params:
  offset: {type: integer, default: 0}
stages:
  train:
    run:
      workdir: .
      command: [sh, train.sh, "{{ trial.params.x }}", "{{ params.offset }}"]
    outputs: [model]
    search:
      method: grid
      metric: loss
      space:
        x: {choice: [1, 2]}
"#,
    );
    home.write(
        "train.sh",
        "echo \"{\\\"loss\\\": $(($1 + $2))}\" >> \"$DRIVETRAIN_METRICS\"\n",
    );
    git(&["init", "-q"]);
    git(&["add", "grid.yaml", "train.sh"]);
    git(&["commit", "-qm", "first"]);
    let commit = git(&["rev-parse", "HEAD"]).trim().to_owned();
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let first = run_id(&o);
    // The script changes, uncommitted; the second run also sets a param.
    home.write(
        "train.sh",
        "echo \"{\\\"loss\\\": $((10 - $1 + $2))}\" >> \"$DRIVETRAIN_METRICS\"\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "-p", "offset=1"]);
    assert_ok(&o);
    let second = run_id(&o);
    let o = home.drivetrain(&["compare", &first, &second, "-o", "json"]);
    assert_ok(&o);
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows: std::collections::BTreeMap<String, Value> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"].as_str().unwrap().to_owned(), r["values"].clone()))
        .collect();
    assert_eq!(
        rows["code.dirty"],
        serde_json::json!([false, true]),
        "{doc}"
    );
    assert_eq!(rows["params.offset"], serde_json::json!([0, 1]), "{doc}");
    assert_eq!(
        rows["train.values.best.trial"],
        serde_json::json!(["t000", "t001"]),
        "{doc}"
    );
    assert_eq!(
        rows["train.values.best.metric"],
        serde_json::json!([1.0, 9.0]),
        "{doc}"
    );
    let script = &rows["train.file:{{ pipeline.dir }}/train.sh"];
    assert!(
        script[0] != script[1] && script[0].as_str().unwrap().starts_with("sha256:"),
        "{doc}"
    );
    // Only what differs: the commit is the same, and not a row without `--all`.
    assert!(!rows.contains_key("code.commit"), "{doc}");
    let o = home.drivetrain(&["compare", &first, &second, "--all", "-o", "json"]);
    let all: Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "code.commit")
        .unwrap();
    assert_eq!(row["values"], serde_json::json!([commit, commit]));
    let shown = text(&home.drivetrain(&["compare", &first, &second]).stdout);
    assert!(
        shown.contains("params.offset") && !shown.contains("code.commit"),
        "{shown}"
    );
}

/// A trial that reports nothing for `stale_after` is stopped as `stale`, a failure the
/// search counts; a line that is not a metric is refused and counted, never dropped
/// quietly; past `max_failed_trials` the stage fails.
#[test]
fn a_silent_trial_goes_stale_and_bad_lines_are_counted() {
    let home = Home::new("search-stale");
    let search = |most: u32| {
        format!(
            r#"
version: 1
name: stale
stages:
  train:
    run:
      command: [sh, -c, 'if [ "$0" = 2 ]; then exec sleep 30; fi; echo "loss=1" >> "$DRIVETRAIN_METRICS"; echo "{{\"loss\": $0}}" >> "$DRIVETRAIN_METRICS"', "{{{{ trial.params.x }}}}"]
    outputs: [model]
    search:
      method: grid
      metric: loss
      max_failed_trials: {most}
      stale_after: 1s
      space:
        x: {{choice: [1, 2]}}
"#
        )
    };
    let file = home.write("stale.yaml", &search(1));
    let started = std::time::Instant::now();
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "stopped, not waited for"
    );
    let run = run_id(&o);
    let listed = trials(&home, &run);
    assert_eq!(listed["trials"][0]["state"], "succeeded", "{listed}");
    assert_eq!(listed["trials"][1]["state"], "stale", "{listed}");
    let why = listed["trials"][1]["reason"].as_str().unwrap();
    assert!(
        why.contains("reported no metric for 1") && why.contains("stale_after"),
        "{why}"
    );
    let st = home.status(&run);
    let train = stage(&st, "train");
    assert_eq!(train["values"]["metrics_refused"], 1, "{train}");
    let reason = train["reason"].as_str().unwrap();
    assert!(
        reason.contains("1 trials failed")
            && reason.contains("1 metric lines were refused; the first: not JSON"),
        "{reason}"
    );
    // None may fail: the stale trial fails the stage.
    let file = home.write("stale.yaml", &search(0));
    let o = home.drivetrain(&["run", file.to_str().unwrap(), "--no-cache"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    let reason = stage(&st, "train")["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.contains("1 trials failed, more than max_failed_trials (0)"),
        "{reason}"
    );
}

/// A pipeline of a search whose trials are `sh`: each reports `loss` = its `x` at every
/// step up to its budget and writes `x` as its model; `use` prints the model it got
/// (`best x X`). `defaults` and `search` are YAML lines for their blocks.
pub(crate) fn sh_search(name: &str, defaults: &str, search: &str) -> String {
    format!(
        r#"
version: 1
name: {name}
defaults: {{{defaults}}}
stages:
  train:
    run:
      command: [sh, -c, 'for e in $(seq "$2"); do echo "{{\"step\": $e, \"loss\": $1}}" >> "$DRIVETRAIN_METRICS"; done; echo "$1" > "$DRIVETRAIN_OUTPUT_MODEL/x"', train, "{{{{ trial.params.x }}}}", "{{{{ trial.budget }}}}"]
    outputs: [model]
    search: {{{search}}}
  use:
    inputs: {{model: train.model}}
    run: {{command: [sh, -c, 'echo "best x $(cat "$DRIVETRAIN_INPUT_MODEL/x")"']}}
"#
    )
}

/// The succeeded trial with the least metric of a `trials -o json` listing.
pub(crate) fn best_listed(listed: &Value) -> &Value {
    listed["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "succeeded")
        .min_by(|a, b| {
            a["metric"]
                .as_f64()
                .partial_cmp(&b["metric"].as_f64())
                .unwrap()
        })
        .unwrap()
}

/// A trial's rung is cached on its own: a search of more trials from the same seed (a
/// different search: the stage misses) takes every rung an earlier run's same trial ran
/// to the same budget from the cache, and runs the new trials.
#[test]
fn a_wider_search_takes_the_rungs_it_shares_from_the_cache() {
    let home = Home::new("search-cache");
    let file = pipeline(&home, "promote", 2, "none");
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let wider = std::fs::read_to_string(&file)
        .unwrap()
        .replace("max_trials: 27", "max_trials: 30");
    let o = home.drivetrain(&["run", home.write("wider.yaml", &wider).to_str().unwrap()]);
    assert_ok(&o);
    let run = run_id(&o);
    let st = home.status(&run);
    let train = stage(&st, "train");
    assert_eq!(train["origin"], "ran", "the stage itself missed: {train}");
    let cached = train["values"]["rungs_cached"].as_u64().unwrap();
    assert!(cached >= 27, "{cached} rungs from the cache: {train}");
    // `explain` compares the stage with the stage's entries, not with its trials'.
    let why = text(&home.drivetrain(&["explain", &run, "train"]).stdout);
    assert!(
        why.contains("`search` changed") && !why.contains("trial.params"),
        "{why}"
    );
    let listed = trials(&home, &run);
    let all = listed["trials"].as_array().unwrap();
    assert_eq!(all.len(), 30);
    for t in &all[27..] {
        assert!(t["attempts"].as_u64().unwrap() >= 1, "a new trial ran: {t}");
    }
    // A rung taken from the cache brings its metrics: every trial has its curve.
    for t in all {
        assert!(t["metric"].as_f64().is_some(), "{t}");
    }
    let model = used_model(&home, &run);
    assert_eq!(model["epoch"], 27);
}
