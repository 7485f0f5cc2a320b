//! The first hour of a new user (issue 47): a pipeline beside the user's own scripts.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use crate::common;
use common::{assert_ok, run_id, stage, text, Home};

const SCRIPT: &str = r#"import os, sys
here = os.path.dirname(os.path.abspath(__file__))
print("cwd", os.getcwd())
print("data", open(os.path.join(here, "data.txt")).read().strip(), sys.argv[1])
"#;

const PIPELINE: &str = r#"version: 1
name: beside
stages:
  here:
    run: {workdir: ., command: [python3, train.py, here]}
    outputs: [o]
  beside:
    run: {command: [python3, train.py, beside]}
    outputs: [o]
  named:
    run: {command: [sh, -c, 'cat "$0/data.txt"', "{{ pipeline.dir }}"]}
    outputs: [o]
"#;

/// A project folder: the pipeline, its script and the script's data.
fn project(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("p.yaml"), PIPELINE).unwrap();
    std::fs::write(dir.join("train.py"), SCRIPT).unwrap();
    std::fs::write(dir.join("data.txt"), "rows-17\n").unwrap();
}

/// `workdir: .` is the pipeline's folder, a relative script without `workdir` is the one
/// beside the pipeline, `{{ pipeline.dir }}` names the folder, from any working
/// directory; under a folder closed to others, with every isolation layer, as root or not;
/// a second clone at another path has the same cache keys, and a changed script does not.
#[test]
fn a_script_beside_the_pipeline_runs_from_anywhere() {
    let home = Home::new("first-hour");
    // A folder closed to others on the way (`/root/project`, a `mktemp -d`).
    let closed = home.dir.join("closed");
    std::fs::create_dir_all(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let first = closed.join("proj");
    project(&first);
    let isolation = [("DRIVETRAIN_ISOLATION", "required")];
    let o = home.drivetrain_env(&["run", "closed/proj/p.yaml"], &isolation);
    assert_ok(&o);
    let id = run_id(&o);
    let log =
        |id: &str, stage: &str| text(&home.drivetrain(&["logs", id, "--stage", stage]).stdout);
    let folder = std::fs::canonicalize(&first).unwrap();
    assert_eq!(
        log(&id, "here"),
        format!("cwd {}\ndata rows-17 here\n", folder.display())
    );
    assert!(
        log(&id, "beside").ends_with("data rows-17 beside\n"),
        "{}",
        log(&id, "beside")
    );
    assert_eq!(log(&id, "named"), "rows-17\n");

    // A second clone at another path: every stage is the first clone's, from the cache.
    let second = home.dir.join("clone-2");
    project(&second);
    let o = home.drivetrain_env(
        &["run", second.join("p.yaml").to_str().unwrap()],
        &isolation,
    );
    assert_ok(&o);
    let st = home.status(&run_id(&o));
    for s in ["here", "beside", "named"] {
        assert_eq!(stage(&st, s)["origin"], "cached", "{s}: {st}");
    }
    // A changed script runs again where it is named; what does not name it is reused.
    std::fs::write(second.join("train.py"), format!("{SCRIPT}print('v2')\n")).unwrap();
    let o = home.drivetrain_env(
        &["run", second.join("p.yaml").to_str().unwrap()],
        &isolation,
    );
    assert_ok(&o);
    let id = run_id(&o);
    let st = home.status(&id);
    assert_eq!(stage(&st, "here")["origin"], "ran", "{st}");
    assert_eq!(stage(&st, "beside")["origin"], "ran", "{st}");
    assert_eq!(stage(&st, "named")["origin"], "cached", "{st}");
    assert!(log(&id, "beside").ends_with("v2\n"));
}

/// A run keeps its own graph (issue 47): after its file is edited or deleted, a rerun of
/// a stage runs the pipeline as the run ran it, and says so.
#[test]
fn a_run_keeps_the_pipeline_it_ran() {
    let home = Home::new("keeps-graph");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: kept\nstages:\n  a:\n    run: {command: [echo, first-a]}\n    outputs: [o]\n  b:\n    needs: [a]\n    run: {command: [echo, first-b]}\n",
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let id = run_id(&o);
    // Edited: a stage renamed, another command.
    home.write(
        "p.yaml",
        "version: 1\nname: kept\nstages:\n  z:\n    run: {command: [echo, edited]}\n",
    );
    let o = home.drivetrain(&["rerun", &id, "--stage", "b"]);
    assert_ok(&o);
    assert!(
        text(&o.stderr).contains("as run") && text(&o.stderr).contains("--file"),
        "{}",
        text(&o.stderr)
    );
    let rerun = run_id(&o);
    let st = home.status(&rerun);
    assert_eq!(stage(&st, "a")["origin"], "reused", "{st}");
    assert_eq!(stage(&st, "b")["origin"], "ran", "{st}");
    let log = text(&home.drivetrain(&["logs", &rerun, "--stage", "b"]).stdout);
    assert_eq!(log, "first-b\n");
    // Gone: the same.
    std::fs::remove_file(&file).unwrap();
    // Nothing failed, so nothing to retry: said, from the kept pipeline, not refused.
    let o = home.drivetrain(&["retry", &id]);
    assert_ok(&o);
    assert!(text(&o.stderr).contains("as run"), "{}", text(&o.stderr));
    let o = home.drivetrain(&["rerun", &id, "--stage", "a", "--downstream"]);
    assert_ok(&o);
    let st = home.status(&run_id(&o));
    assert_eq!(stage(&st, "b")["phase"], "Succeeded", "{st}");
}

/// A run is named by its id, a prefix only its id starts with, or `@latest` (issue 47),
/// and a name that fits none says where it looked.
#[test]
fn runs_are_named_by_prefixes_and_latest() {
    let home = Home::new("run-names");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: named\nstages:\n  a:\n    run: {command: [echo, hi]}\n",
    );
    let first = run_id(&home.drivetrain(&["run", file.to_str().unwrap()]));
    let second = run_id(&home.drivetrain(&["run", file.to_str().unwrap()]));
    assert_eq!(home.status("@latest")["run"]["id"], second.as_str());
    let short = &first[..first.len() - 2];
    assert_eq!(home.status(short)["run"]["id"], first.as_str());
    let o = home.drivetrain(&["logs", short, "--stage", "a"]);
    assert_eq!(text(&o.stdout), "hi\n");
    let o = home.drivetrain(&["rerun", short, "--stage", "a"]);
    assert_ok(&o);
    let o = home.drivetrain(&["status", "2"]);
    assert!(!o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("give more of it"),
        "{}",
        text(&o.stderr)
    );
    let o = home.drivetrain(&["status", "nothing-like-it"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains(&home.dir.join(".drivetrain").display().to_string()),
        "{}",
        text(&o.stderr)
    );
}

/// A `when` that reads a value its stage did not report fails the stage and says what
/// the stage has (issue 47: `values.line` for `lines` was silently false, and skipped).
#[test]
fn a_when_reading_an_unreported_value_says_what_there_is() {
    let home = Home::new("when-typo");
    let file = home.write(
        "p.yaml",
        r#"version: 1
name: typo
stages:
  count:
    run: {command: [sh, -c, 'echo "{\"lines\": 3, \"bytes\": 12}" > "$DRIVETRAIN_VALUES"']}
  publish:
    when: "stages.count.values.line > 0"
    run: {command: [echo, published]}
"#,
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    let publish = stage(&st, "publish");
    assert_eq!(publish["phase"], "Failed", "{st}");
    assert_eq!(
        publish["reason"],
        "`when` reads `stages.count.values.line`, and stage `count` reported no `line` (its values: lines, bytes)"
    );
}

/// `{{ item }}` has its item's type (issue 47: a map over numbers could not feed a
/// built-in step's number, "expected a non-negative integer, found string").
#[test]
fn a_map_item_keeps_its_type() {
    let home = Home::new("typed-items");
    let file = home.write(
        "p.yaml",
        "version: 1\nname: items\nstages:\n  sim:\n    uses: fleet-sim\n    map: {items: [1, 2]}\n    with: {drives: \"{{ item }}\", duration: 10s, seed: 3}\n    outputs: [logs]\n",
    );
    assert_ok(&home.drivetrain(&["validate", file.to_str().unwrap()]));
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let st = home.status(&run_id(&o));
    assert_eq!(stage(&st, "sim")["phase"], "Succeeded", "{st}");
}

/// `drivetrain steps NAME` says what a built-in step's `with:` takes (issue 47).
#[test]
fn steps_name_shows_what_a_step_takes() {
    let home = Home::new("steps-name");
    let o = home.drivetrain(&["steps", "mine-corner-cases"]);
    assert_ok(&o);
    let shown = text(&o.stdout);
    assert!(
        shown.starts_with("mine-corner-cases@")
            && shown.contains("  rules ")
            && shown.contains("object, required"),
        "{shown}"
    );
    let o = home.drivetrain(&["steps", "trian"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("did you mean `train`?"),
        "{}",
        text(&o.stderr)
    );
}

/// `volumes:` on this machine, as Docker's `-v`: a host directory bound read-only where
/// the stage looks for it (a root engine's stage, host `nobody`, reaching it through a
/// folder closed to it), scratch space of its own; a host path closed to the stage user,
/// one meeting the engine's home, and a Kubernetes claim are each refused before the
/// stage starts, saying what to change.
#[test]
fn volumes_bind_host_paths_and_refuse_what_cannot_be() {
    let home = Home::new("volumes");
    let d = home.dir.clone();
    // The data sits in a folder closed to every other user, as `/root/data` does.
    let closed = d.join("closed");
    std::fs::create_dir_all(closed.join("data")).unwrap();
    std::fs::write(closed.join("data/frames.txt"), "1200 frames\n").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    for m in ["mnt-data", "mnt-scratch"] {
        std::fs::create_dir_all(d.join(m)).unwrap();
    }
    let file = home.write(
        "volumes.yaml",
        &format!(
            r#"
version: 1
name: volumes
stages:
  read:
    volumes:
      - {{name: data, host_path: "{data}", mount_path: "{mnt}/mnt-data", read_only: true}}
      - {{name: scratch, mount_path: "{mnt}/mnt-scratch", empty_dir: 1Gi}}
    run:
      command: [sh, -c, 'cat "$0/mnt-data/frames.txt"; if touch "$0/mnt-data/new" 2>/dev/null; then echo WROTE; fi; echo kept > "$0/mnt-scratch/x"; cat "$0/mnt-scratch/x"', "{mnt}"]
"#,
            data = closed.join("data").display(),
            mnt = d.display()
        ),
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let id = run_id(&o);
    let log = text(&home.drivetrain(&["logs", &id, "--stage", "read"]).stdout);
    assert_eq!(log, "1200 frames\nkept\n", "read-only: nothing written");
    assert!(!closed.join("data/new").exists());
    assert_eq!(std::fs::read_dir(d.join("mnt-scratch")).unwrap().count(), 0);

    // Refused, each with its reason: a claim (Kubernetes'), a path meeting the home.
    let refused = home.write(
        "refused.yaml",
        &format!(
            r#"
version: 1
name: refused
stages:
  claim:
    volumes: [{{name: ds, mount_path: "{mnt}/mnt-data", claim: tusimple}}]
    run: {{command: ["true"]}}
  home:
    volumes: [{{name: h, host_path: "{home}", mount_path: "{mnt}/mnt-data", read_only: true}}]
    run: {{command: ["true"]}}
"#,
            mnt = d.display(),
            home = d.join(".drivetrain").display()
        ),
    );
    let o = home.drivetrain(&["run", refused.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    let claim = stage(&st, "claim")["reason"].as_str().unwrap().to_owned();
    assert!(
        claim.contains("volume `ds` cannot be mounted: PersistentVolumeClaim `tusimple` is mounted by the kubernetes executor; on this machine give `host_path: DIR`"),
        "{claim}"
    );
    let inside = stage(&st, "home")["reason"].as_str().unwrap().to_owned();
    assert!(
        inside.contains("volume `h`: host_path") && inside.contains("hidden from every stage"),
        "{inside}"
    );

    // A root engine's stage is host `nobody`: a host path closed to it is refused with
    // what to change, not "permission denied" later.
    if !crate::isolation::root_or_skip("a root engine's stage user and a closed host path") {
        return;
    }
    std::fs::set_permissions(closed.join("data"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let st = home.status(&run_id(&o));
    let why = stage(&st, "read")["reason"].as_str().unwrap().to_owned();
    assert!(
        why.contains("volume `data`: host_path")
            && why.contains("is closed to the stage's user")
            && why.contains("chmod o+rx"),
        "{why}"
    );
}

/// A stage failing on a path containment keeps from it says so in its reason, with what
/// to declare: the engine's state (hidden from every stage), and under a root engine a
/// file in a folder closed to host `nobody`, which the volume the reason names then
/// gives it.
#[test]
fn a_path_containment_hides_is_named_in_the_reason() {
    let home = Home::new("unseen");
    let d = home.dir.clone();
    let state = d.join(".drivetrain/state.db");
    let file = home.write(
        "hidden.yaml",
        &format!(
            "version: 1\nname: hidden\nstages:\n  peek:\n    run: {{command: [sh, -c, 'cat {}']}}\n",
            state.display()
        ),
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    // A failed run ends with where to look.
    let id = run_id(&o);
    assert!(
        text(&o.stdout).ends_with(&format!("next: drivetrain status {id} · drivetrain logs {id} --stage peek · drivetrain retry {id} · drivetrain ui (the web view)\n")),
        "{}",
        text(&o.stdout)
    );
    let why = stage(&home.status(&run_id(&o)), "peek")["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        why.contains(&format!("{} is the engine's", state.display()))
            && why.contains("hidden from every stage"),
        "{why}"
    );

    if !crate::isolation::root_or_skip("a root engine's stage user and a closed folder") {
        return;
    }
    let closed = d.join("closed");
    std::fs::create_dir_all(&closed).unwrap();
    let data = closed.join("frames.txt");
    std::fs::write(&data, "1200 frames\n").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let pipeline = |volumes: &str| {
        format!(
            "version: 1\nname: closed\nstages:\n  read:\n{volumes}    run: {{command: [sh, -c, 'cat {}']}}\n",
            data.display()
        )
    };
    let file = home.write("closed.yaml", &pipeline(""));
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let why = stage(&home.status(&run_id(&o)), "read")["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    let volume = format!(
        "{{name: data, host_path: {p}, mount_path: {p}, read_only: true}}",
        p = data.display()
    );
    assert!(
        why.contains(&format!(
            "{} exists on this machine, but {} (mode 700) lets no other user in",
            data.display(),
            closed.display()
        )) && why.contains(&volume),
        "{why}"
    );
    // As the reason says: the file as a volume, and the stage reads it.
    home.write(
        "closed.yaml",
        &pipeline(&format!("    volumes: [{volume}]\n")),
    );
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let log = home.drivetrain(&["logs", &run_id(&o), "--stage", "read"]);
    assert_eq!(text(&log.stdout), "1200 frames\n");
    // A file the command names itself is put in the stage's view without a volume (a
    // file put back into a hidden folder: it was "cannot isolate the attempt").
    let named = home.write(
        "named.yaml",
        &format!(
            "version: 1\nname: named\nstages:\n  read:\n    run: {{command: [cat, {}]}}\n",
            data.display()
        ),
    );
    let o = home.drivetrain(&["run", named.to_str().unwrap()]);
    assert_ok(&o);
}
