//! The README's "Try it" commands, run as written (issue 47: documented commands that
//! failed or said something false): each line of its `sh` block in `bash`, in a folder
//! that has the repository's `pipelines/` and `tests/` (what the lines write stays
//! there), `drivetrain` being this build, `RUN` the run the block started, in a home of
//! the test's own. Each must exit 0 but where its line says otherwise; `serve`
//! and `ui` (servers that run until stopped) are started and answer `/healthz` instead.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{self, Home};

/// The commands of the README's "Try it" block, comments dropped.
fn try_it() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = readme
        .split("## Try it")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("a sh block under ## Try it");
    block
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The exit status a line documents where it is not 0: a broken file's validation is 1.
fn expected(line: &str) -> i32 {
    match line {
        l if l.contains("many-errors-at-once") => 1,
        _ => 0,
    }
}

#[test]
fn the_readmes_try_it_commands_run_as_written() {
    let home = Home::new("readme");
    let repo = home.dir.join("clone");
    std::fs::create_dir_all(&repo).unwrap();
    for dir in ["pipelines", "plugins", "tests"] {
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        std::os::unix::fs::symlink(from, repo.join(dir)).unwrap();
    }
    let repo = repo.as_path();
    let lines = try_it();
    assert!(lines.len() > 30, "{lines:?}");
    assert!(lines[0].starts_with("cargo build") && lines[1].starts_with("alias drivetrain="));
    // Graphviz: `.ci/run` installs it; elsewhere its line is skipped where it is missing.
    let has_dot = Command::new("sh")
        .args(["-c", "command -v dot"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_dot || std::env::var("CI").map_or(true, |v| v != "true"),
        "CI installs Graphviz for the README's `dot` line"
    );
    let mut run = String::new();
    let mut failures = Vec::new();
    for line in &lines[2..] {
        if line.contains("| dot ") && !has_dot {
            eprintln!("skipped (no Graphviz here): {line}");
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if matches!(words.get(1), Some(&"serve") | Some(&"ui")) {
            if let Err(e) = answers(&home, repo, line) {
                failures.push(format!("{line}: {e}"));
            }
            continue;
        }
        let command = line.replace(" RUN", &format!(" {run}"));
        let o = bash(&home, repo, &command);
        let out = common::text(&o.stdout);
        if line.contains(" run pipelines/shell-demo.yaml") && run.is_empty() {
            run = common::run_id(&o);
        }
        let code = o.status.code().unwrap_or(-1);
        if code != expected(line) {
            failures.push(format!(
                "{command}: exit {code}\n{out}{}",
                common::text(&o.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `line` in bash from the repository's root, `drivetrain` this build, in `home`.
fn bash(home: &Home, repo: &Path, line: &str) -> std::process::Output {
    Command::new("bash")
        .args([
            "-c",
            &format!("drivetrain() {{ \"$DRIVETRAIN_BIN\" \"$@\"; }}\n{line}"),
        ])
        .current_dir(repo)
        .env("DRIVETRAIN_BIN", env!("CARGO_BIN_EXE_drivetrain"))
        .env("DRIVETRAIN_HOME", home.dir.join(".drivetrain"))
        .env("NO_COLOR", "1")
        .env_remove("DRIVETRAIN_ISOLATION")
        .output()
        .unwrap()
}

/// A server's line (`serve`, `ui`) started on a free port of loopback: it answers
/// `/healthz`, then is stopped.
fn answers(home: &Home, repo: &Path, line: &str) -> Result<(), String> {
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        &format!("drivetrain() {{ exec \"$DRIVETRAIN_BIN\" \"$@\"; }}\n{line} --bind 127.0.0.1:0"),
    ])
    .current_dir(repo)
    .env("DRIVETRAIN_BIN", env!("CARGO_BIN_EXE_drivetrain"))
    .env("DRIVETRAIN_HOME", home.dir.join(".drivetrain"))
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut s = common::http::start_command(cmd);
    let (code, body) = common::http::request(&s, "GET", "/healthz", None, None);
    let _ = s.child.kill();
    match code {
        200 => Ok(()),
        c => Err(format!("/healthz answered {c}: {body}")),
    }
}
