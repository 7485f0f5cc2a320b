//! What the end-to-end tests share: a fresh home directory per test and the binary.

#![allow(dead_code)]

use std::path::PathBuf;

pub mod hostile;
pub mod http;
use std::process::{Command, Output};

pub struct Home {
    pub dir: PathBuf,
}

impl Home {
    pub fn new(name: &str) -> Home {
        let dir = std::env::temp_dir().join(format!("dt-run-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The tests' stages leave marks here (pid files, counters): a root engine's
        // stages are host `nobody`, so the folder is open to them. The engine's home
        // under it (`.drivetrain`) is the engine's and read-only to them all the same.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        Home { dir }
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn drivetrain(&self, args: &[&str]) -> Output {
        self.drivetrain_env(args, &[])
    }

    pub fn drivetrain_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_drivetrain"))
            .args(args)
            .current_dir(&self.dir)
            .env_remove("DRIVETRAIN_HOME")
            .env_remove("DRIVETRAIN_ISOLATION")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .output()
            .expect("the binary runs")
    }

    /// `drivetrain serve` on `scheduled/` of this home, on a free loopback port, its output
    /// in `serve.log` / `serve.err` here.
    pub fn serve(&self, env: &[(&str, &str)]) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_drivetrain"))
            .args(["serve", "--pipelines", "scheduled", "--bind", "127.0.0.1:0"])
            .current_dir(&self.dir)
            .env_remove("DRIVETRAIN_HOME")
            .envs(env.iter().copied())
            .stdout(std::fs::File::create(self.dir.join("serve.log")).unwrap())
            .stderr(std::fs::File::create(self.dir.join("serve.err")).unwrap())
            .spawn()
            .expect("serve starts")
    }

    /// The first schedule's recorded ticks (`schedule list`): (scheduled time, outcome,
    /// run id), oldest first.
    pub fn ticks(&self, env: &[(&str, &str)]) -> Vec<(String, String, Option<String>)> {
        let o = self.drivetrain_env(&["schedule", "list", "--output", "json"], env);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let mut out: Vec<_> = v[0]["recent_ticks"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["scheduled_time"].as_str().unwrap_or_default().to_owned(),
                    t["outcome"].as_str().unwrap_or_default().to_owned(),
                    t["run_id"].as_str().map(str::to_owned),
                )
            })
            .collect();
        out.sort();
        out
    }

    pub fn status(&self, run: &str) -> serde_json::Value {
        let o = self.drivetrain(&["status", run, "--output", "json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether process `pid` is still running: a zombie (ended, not yet reaped by whoever
/// inherited it) is not.
pub fn pid_alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        // The state is the first field after the command's closing parenthesis.
        Ok(stat) => !matches!(
            stat.rsplit(')')
                .next()
                .map(str::trim_start)
                .and_then(|s| s.chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

/// Polls until `path` exists (a stage announcing it started), up to 30 s.
pub fn wait_for_file(path: &std::path::Path) -> String {
    for _ in 0..300 {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.trim().is_empty() {
                return s;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{} never appeared", path.display());
}

/// Polls until process `pid` has ended, up to 5 s: whether it did.
pub fn wait_dead(pid: &str) -> bool {
    for _ in 0..100 {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The run id from the first line of `drivetrain run`.
pub fn run_id(o: &Output) -> String {
    let out = text(&o.stdout);
    let first = out.lines().next().unwrap_or_default();
    first
        .strip_prefix("run ")
        .unwrap_or_else(|| panic!("no run id in {out}"))
        .to_owned()
}

pub fn stage<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {status}"))
}

/// Asserts a command exited 0, showing its output when it did not.
#[track_caller]
pub fn assert_ok(o: &Output) {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

/// Environment pairs as [`Home::drivetrain_env`] takes them, from a map or pairs of owned
/// strings.
pub fn env_pairs<'a, K, V>(env: impl IntoIterator<Item = (&'a K, &'a V)>) -> Vec<(&'a str, &'a str)>
where
    K: AsRef<str> + ?Sized + 'a,
    V: AsRef<str> + ?Sized + 'a,
{
    env.into_iter()
        .map(|(k, v)| (k.as_ref(), v.as_ref()))
        .collect()
}

/// The layer `name` of a `drivetrain doctor -o json` report.
pub fn doctor_layer(doctor: &Output, name: &str) -> serde_json::Value {
    assert_ok(doctor);
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let layers = report["layers"].as_array().expect("layers");
    let found = layers.iter().find(|l| l["layer"] == name);
    found.unwrap_or_else(|| panic!("{name}: {report}")).clone()
}

/// Every file under `dir`, and every empty directory (as itself).
pub fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            let inner = walk(&p);
            if inner.is_empty() {
                out.push(p);
            } else {
                out.extend(inner);
            }
        } else {
            out.push(p);
        }
    }
    out
}

/// `drivetrain run FILE` in the background with a heartbeat every 200 ms (an engine
/// three beats silent is orphaned after 0.6 s): the engine and its run.
pub fn spawn_run(home: &Home, file: &std::path::Path) -> (std::process::Child, String) {
    spawn_run_env(home, file, &[])
}

/// [`spawn_run`] with more of the engine's environment.
pub fn spawn_run_env(
    home: &Home,
    file: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_drivetrain"))
        .args(["run", file.to_str().unwrap()])
        .current_dir(&home.dir)
        .env_remove("DRIVETRAIN_HOME")
        .env("DRIVETRAIN_HEARTBEAT", "200ms")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    let id = first
        .trim()
        .strip_prefix("run ")
        .expect("run id first")
        .to_owned();
    (child, id)
}

/// Erases the recorded handle of `stage`'s attempts in `run` (Python's sqlite3 on the
/// home's state), as an engine killed between starting an attempt and recording its
/// handle leaves it.
pub fn erase_handle(home: &Home, run: &str, stage: &str) {
    let erased = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
             n = c.execute(\"UPDATE attempts SET handle = NULL WHERE run_id = ? AND stage = ?\", (sys.argv[2], sys.argv[3])).rowcount; \
             c.commit(); print(n)",
            home.dir.join(".drivetrain/state.db").to_str().unwrap(),
            run,
            stage,
        ])
        .output()
        .unwrap();
    assert_eq!(text(&erased.stdout).trim(), "1", "{}", text(&erased.stderr));
}
