//! The engine reads what a stage wrote within bounds, whatever the stage wrote: a
//! `values.json` and a log of hundreds of MiB (sparse files, so the test costs no disk),
//! a progress bar's megabytes on one `\r`-joined line. The run ends truthfully, the
//! failure reason stays short, and `drivetrain logs` and the API stream a log instead of
//! holding it. Memory is the kernel's count: the largest resident size of any process
//! this test binary waited for (every test here is bounded, so none hides another).

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use crate::common;
use common::http::{start, TOKEN};
use common::{run_id, stage, text, Home};

/// A stage that writes until the disk is full (and fails), and one after it.
const FILL: &str = r#"version: 1
name: fill
stages:
  fill:
    run: {command: [sh, -c, 'head -c 100000000 /dev/zero > "$0/big"', "{{ outputs.data }}"]}
    outputs: [data]
  after:
    needs: [fill]
    run: {command: [echo, after]}
"#;

/// 256 MiB: far more than the engine may hold, no disk (sparse).
const BIG: &str = "268435456";

/// The largest resident size, in MiB, of the processes this test binary has waited for
/// (and of theirs, which they waited for).
fn children_peak_mib() -> i64 {
    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    usage.max_rss() / 1024
}

#[test]
fn a_huge_values_file_fails_its_stage_unread() {
    let home = Home::new("bounds-values");
    home.write(
        "p.yaml",
        &format!(
            "version: 1\nname: v\nstages:\n  big:\n    run: {{command: [sh, -c, 'truncate -s {BIG} \"$DRIVETRAIN_VALUES\"']}}\n"
        ),
    );
    let o = home.drivetrain(&["run", "p.yaml"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let status = home.status(&run_id(&o));
    assert_eq!(status["run"]["phase"], "Failed", "{status}");
    let big = stage(&status, "big");
    let reason = big["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("values.json is {BIG} bytes, over the")),
        "{reason}"
    );
    assert!(children_peak_mib() < 200, "{} MiB", children_peak_mib());
}

#[test]
fn a_failing_stage_with_a_huge_log_and_one_long_line_has_a_short_reason() {
    let home = Home::new("bounds-log");
    // A progress bar: 12 MB of `\r`-joined updates on one line, then a failure.
    let bar = home.write(
        "bar.py",
        "import sys\nfor i in range(600_000):\n    sys.stdout.write(f'\\r{i:>10} it/s ')\nsys.stdout.write('\\nno GPU memory left\\n')\nsys.exit(3)\n",
    );
    home.write(
        "p.yaml",
        &format!(
            r#"version: 1
name: l
stages:
  sparse:
    run: {{command: [python3, -c, 'import os, sys; print("start", flush=True); os.ftruncate(1, {BIG}); sys.exit(2)']}}
  bar:
    run: {{command: [python3, "{}"]}}
"#,
            bar.display()
        ),
    );
    let o = home.drivetrain(&["run", "p.yaml"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        o.stdout.len() < 64 << 10,
        "run printed {} bytes",
        o.stdout.len()
    );
    let run = run_id(&o);
    let json = home.drivetrain(&["status", &run, "--output", "json"]);
    assert!(
        json.stdout.len() < 64 << 10,
        "status is {} bytes",
        json.stdout.len()
    );
    let status: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let bar = stage(&status, "bar")["reason"].as_str().unwrap();
    assert!(bar.contains("exit") || bar.contains('3'), "{bar}");
    assert!(
        bar.contains("no GPU memory left"),
        "the end of the log is kept: {bar}"
    );
    assert!(bar.len() < 16 << 10, "a {} byte reason", bar.len());
    let sparse = stage(&status, "sparse")["reason"].as_str().unwrap();
    assert!(sparse.len() < 16 << 10, "a {} byte reason", sparse.len());

    // `logs` streams the 256 MiB log to its reader.
    let mut logs = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["logs", &run, "--stage", "sparse"])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut printed = 0u64;
    let mut piece = vec![0u8; 1 << 20];
    let mut out = logs.stdout.take().unwrap();
    loop {
        let n = out.read(&mut piece).unwrap();
        if n == 0 {
            break;
        }
        printed += n as u64;
    }
    assert!(logs.wait().unwrap().success());
    assert!(printed >= 268_435_456, "{printed} bytes");

    // The API sends it as it reads it, from an offset or a `Range`.
    std::fs::create_dir_all(home.dir.join("served")).unwrap();
    home.write(
        "served/p.yaml",
        &std::fs::read_to_string(home.dir.join("p.yaml")).unwrap(),
    );
    let s = start(&home, &["--token", TOKEN]);
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "GET /api/v1/runs/{run}/logs?stage=sparse HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nRange: bytes=268435000-\r\nConnection: close\r\n\r\n",
        s.addr
    )
    .unwrap();
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 206"), "{answer}");
    assert!(
        answer.contains("content-range: bytes 268435000-268435455/268435456"),
        "{answer}"
    );
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    assert_eq!(body.len(), 456, "{answer}");
    let (code, tail) = common::http::request(
        &s,
        "GET",
        &format!("/api/v1/runs/{run}/logs?stage=bar&offset=6000000"),
        Some(TOKEN),
        None,
    );
    assert_eq!(code, 200);
    assert!(
        tail.ends_with("no GPU memory left\n"),
        "{}",
        &tail[tail.len().saturating_sub(100)..]
    );
    drop(s);
    assert!(children_peak_mib() < 200, "{} MiB", children_peak_mib());
}

/// A stage fills the disk the home is on (an 8 MiB tmpfs, mounted in a user and mount
/// namespace of the test's own: `unshare -U -r -m`), so the engine cannot record the
/// attempt's end: it gives up the reserve it keeps beside its state, records the stage's
/// own failure, and the run ends `Failed` with it, not `Running`.
#[test]
fn a_full_disk_keeps_the_stage_s_own_error_and_ends_the_run() {
    let home = Home::new("bounds-full-disk");
    home.write("p.yaml", FILL);
    std::fs::create_dir_all(home.dir.join("small")).unwrap();
    let o = Command::new("unshare")
        .args(["-U", "-r", "-m", "sh", "-c"])
        .arg(
            r#"mount -t tmpfs -o size=8m tmpfs small && cd small && cp ../p.yaml . && "$0" run p.yaml; echo "exit=$?"; "$0" status --output json"#,
        )
        .arg(env!("CARGO_BIN_EXE_drivetrain"))
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert!(out.contains("exit=1"), "{out}{err}");
    assert!(err.contains("disk is full: gave up the reserve"), "{err}");
    let status: serde_json::Value =
        serde_json::from_str(&out[out.find("\n{").expect("the status")..]).unwrap();
    assert_eq!(status["run"]["phase"], "Failed", "{out}{err}");
    assert_eq!(status["orphaned"], false);
    ended_on_the_stage_s_own_error(&status);
}

/// A run of [`FILL`] that ended `Failed` because its stage did, with the stage's own
/// error recorded despite the full disk.
fn ended_on_the_stage_s_own_error(status: &serde_json::Value) {
    assert_eq!(status["run"]["phase"], "Failed", "{status}");
    assert_eq!(status["run"]["reason"], "failed: fill", "{status}");
    let fill = stage(status, "fill");
    assert_eq!(fill["phase"], "Failed", "{fill}");
    assert!(
        fill["reason"]
            .as_str()
            .unwrap()
            .starts_with("exited with code 1"),
        "the stage's own error: {fill}"
    );
    assert_eq!(stage(status, "after")["phase"], "Omitted");
}

/// The same full disk under `drivetrain serve` (its home on an 8 MiB tmpfs in a user and
/// mount namespace of the test's own; the network is the host's, so the test reaches it
/// on loopback): the run posted to it ends `Failed` with the stage's own error.
#[test]
fn a_full_disk_under_serve_ends_the_run_too() {
    let home = Home::new("bounds-full-disk-serve");
    home.write("p.yaml", FILL);
    std::fs::create_dir_all(home.dir.join("small")).unwrap();
    let wrapper = [
        "unshare",
        "-U",
        "-r",
        "-m",
        "sh",
        "-c",
        r#"mount -t tmpfs -o size=8m tmpfs small && cd small && mkdir served && cp ../p.yaml served/ && exec "$0" "$@""#,
    ];
    let s = common::http::start_wrapped(&home, &wrapper, &["--token", TOKEN]);
    let (code, v) = common::http::json(&s, "POST", "/api/v1/runs", Some(r#"{"pipeline": "fill"}"#));
    assert_eq!(code, 201, "{v}");
    let done = common::http::wait_phase(&s, v["run"].as_str().unwrap(), "Failed");
    ended_on_the_stage_s_own_error(&done);
}
