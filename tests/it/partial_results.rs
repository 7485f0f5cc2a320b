//! A stage that succeeded with less than all of its input says so where people look:
//! `run`'s line for the stage, `status` (its reason), and the values a gate can check;
//! `max_unfinished: 0` turns it into a failure. Through the binary, with a drive log
//! cut short (a recorder that died) beside a whole one, and a relative `source:`,
//! resolved against the pipeline file's folder, not the attempt's directory.

use crate::common;
use common::{assert_ok, run_id, stage, text, Home};

fn pipeline(max_unfinished: &str, source: &str) -> String {
    format!(
        r#"
version: 1
name: partial
stages:
  ingest:
    uses: ingest
    with: {{source: {source}{max_unfinished}}}
    outputs: [frames]
"#
    )
}

#[test]
fn a_partial_ingest_is_a_warning_in_run_and_status_and_can_fail_the_run() {
    let home = Home::new("partial");
    let project = home.dir.join("project");
    let logs = project.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let sim: drivetrain_steps::sim::FleetSimConfig = serde_json::from_value(serde_json::json!(
        {"drives": 2, "duration": "20s", "rate_hz": 10, "seed": 3}
    ))
    .unwrap();
    drivetrain_steps::sim::simulate(&sim, &logs).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let bytes = std::fs::read(&names[1]).unwrap();
    std::fs::write(&names[1], &bytes[..bytes.len() / 2]).unwrap();
    let cut = names[1].file_name().unwrap().to_str().unwrap().to_owned();

    // `source: logs` is the folder beside the pipeline file; the engine runs elsewhere.
    let file = project.join("p.yaml");
    std::fs::write(&file, pipeline("", "logs")).unwrap();
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let out = text(&o.stdout);
    assert!(out.contains("ingest Succeeded"), "{out}");
    assert!(out.contains("warning: 1 log(s) unfinished"), "{out}");
    assert!(out.contains(&cut), "{out}");
    let status = home.status(&run_id(&o));
    let ingest = stage(&status, "ingest");
    assert!(
        ingest["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("unfinished"),
        "{ingest}"
    );
    assert_eq!(ingest["values"]["unfinished_files"], 1, "{ingest}");
    let explain = text(&home.drivetrain(&["explain", &run_id(&o), "ingest"]).stdout);
    assert!(
        explain.contains("warning: 1 log(s) unfinished"),
        "{explain}"
    );
    // A cache hit of it says so too: the same partial result, reused.
    let again = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&again);
    let again_out = text(&again.stdout);
    assert!(again_out.contains("cached (from run"), "{again_out}");
    assert!(
        again_out.contains("warning: 1 log(s) unfinished"),
        "{again_out}"
    );
    let explain = text(
        &home
            .drivetrain(&["explain", &run_id(&again), "ingest"])
            .stdout,
    );
    assert!(
        explain.contains("warning: 1 log(s) unfinished"),
        "{again_out}\n{explain}"
    );

    // The same, bounded: a failed stage naming the log.
    std::fs::write(&file, pipeline(", max_unfinished: 0", "logs")).unwrap();
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let out = text(&o.stdout) + &text(&o.stderr);
    assert!(out.contains("more than max_unfinished 0"), "{out}");

    // A relative source that is not there: the error says where it looked, and why.
    std::fs::write(&file, pipeline("", "no-such-logs")).unwrap();
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let out = text(&o.stdout) + &text(&o.stderr);
    assert!(
        out.contains(&format!(
            "{}/no-such-logs does not exist",
            project.canonicalize().unwrap().display()
        )),
        "{out}"
    );
    assert!(
        out.contains("resolved against the pipeline file's folder"),
        "{out}"
    );
}
