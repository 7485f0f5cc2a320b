//! Published artifacts are checked by content where they are used: a rewrite of a stored
//! object that keeps its size and restores its modification time (so the `file://` ETag,
//! inode + mtime + size, is unchanged) is caught when a consumer's inputs are
//! materialized, by the sha256 the manifest holds, and the consumer ends in `Error`
//! naming the producer, rather than succeeding on tampered bytes or being blamed for them.
//! Through the binary, on the embedded store.

use crate::common;
use common::{assert_ok, run_id, stage, text, Home};

const PIPELINE: &str = r#"
version: 1
name: integrity
stages:
  produce:
    run: {command: [sh, -c, 'printf hello > "$DRIVETRAIN_OUTPUT_DATA/a.txt"']}
    outputs: [data]
  consume:
    run: {command: [cat, "{{ inputs.data }}/a.txt"]}
    inputs: {data: produce.data}
"#;

#[test]
fn a_same_size_rewrite_of_a_published_artifact_is_an_error_naming_its_producer() {
    let home = Home::new("integrity");
    let file = home.write("p.yaml", PIPELINE);
    let o = home.drivetrain(&["run", file.to_str().unwrap()]);
    assert_ok(&o);
    let run = run_id(&o);
    let stored = home.dir.join(format!(
        ".drivetrain/artifacts/runs/{run}/produce/1/data/a.txt"
    ));
    let mtime = std::fs::metadata(&stored).unwrap().modified().unwrap();
    let mut perm = std::fs::metadata(&stored).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&stored, perm).unwrap();
    std::fs::write(&stored, b"HELLO").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&stored)
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    let o = home.drivetrain(&["rerun", &run, "--stage", "consume"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stdout));
    let again = run_id(&o);
    let status = home.status(&again);
    let consume = stage(&status, "consume");
    assert_eq!(consume["phase"], "Error", "{consume}");
    let reason = consume["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cannot materialize input `data` (an artifact of `produce`)"),
        "{reason}"
    );
    assert!(reason.contains("sha256"), "{reason}");
    let log = text(
        &home
            .drivetrain(&["logs", &again, "--stage", "consume"])
            .stdout,
    );
    assert!(
        !log.contains("HELLO"),
        "the tampered bytes never reached the stage: {log}"
    );
}
