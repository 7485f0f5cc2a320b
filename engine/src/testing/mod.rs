//! Real servers for the tests, started on loopback: an S3 server (`moto_server`), MLflow,
//! PostgreSQL and a Slurm cluster ([`SlurmCluster`]). The Python servers come from the venv `.ci/run` installs
//! (`$DRIVETRAIN_TEST_VENV`, default `~/.cache/drivetrain/venv`); PostgreSQL from the
//! Debian packages (`initdb`, `pg_ctl`). A missing server fails the test with what to
//! install: these tests never skip. And an executor that runs no process
//! ([`FakeExecutor`]), for the run loop's own tests.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod fake;
mod slurm;
pub use fake::FakeExecutor;

/// An engine whose runs go to a fresh [`FakeExecutor`] (found for every executor name a
/// pipeline or a run names), with SQLite state and a `file://` store under `dir`.
pub fn fake_engine(dir: &Path) -> (crate::engine::Engine, FakeExecutor) {
    let state = crate::state::SqliteState::open(&dir.join("state.db")).unwrap();
    fake_engine_on(dir, std::sync::Arc::new(state))
}

/// [`fake_engine`] on the state store `state`.
pub fn fake_engine_on(
    dir: &Path,
    state: std::sync::Arc<dyn crate::state::StateStore>,
) -> (crate::engine::Engine, FakeExecutor) {
    let url = format!("file://{}", dir.join("artifacts").display());
    let fake = FakeExecutor::default();
    let found = fake.clone();
    let engine = crate::engine::EngineBuilder::new(
        state,
        crate::artifacts::ArtifactStore::open(&url).unwrap(),
        std::sync::Arc::new(fake.clone()),
        dir.join("work"),
    )
    .executors(move |_| Ok(std::sync::Arc::new(found.clone())))
    .build();
    (engine, fake)
}
pub use slurm::SlurmCluster;

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The tests' Python venv's `bin/NAME`.
pub fn venv_bin(name: &str) -> PathBuf {
    bin_in_venv("DRIVETRAIN_TEST_VENV", "venv", "moto[server] mlflow", name)
}

/// `bin/NAME` of the venv with PyTorch (CPU wheels' CUDA libraries and all) and pyarrow,
/// kept apart from the main one: it is 5 GB.
pub fn torch_venv_bin(name: &str) -> PathBuf {
    bin_in_venv("DRIVETRAIN_TORCH_VENV", "torch-venv", "torch pyarrow", name)
}

/// `bin/NAME` of the venv `$var` names, default `~/.cache/drivetrain/DIR`; a missing one
/// fails the test with what to install.
fn bin_in_venv(var: &str, dir: &str, packages: &str, name: &str) -> PathBuf {
    let venv = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME"))
            .join(".cache/drivetrain")
            .join(dir)
    });
    let bin = venv.join("bin").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run .ci/run once, or `pip install {packages}` into {}",
        bin.display(),
        venv.display()
    );
    bin
}

/// A scratch directory for one server, removed when it stops.
fn scratch(kind: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "dt-{kind}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Sends one HTTP/1.1 request to loopback and answers (status, body).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((status, body.to_owned()))
}

/// Waits until `ready` holds, or panics with the server's log.
fn wait_until(what: &str, log: &Path, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > timeout {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} did not start within {timeout:?}:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
struct Process {
    child: Child,
}

impl Process {
    fn spawn(cmd: &mut Command, log: &Path) -> Process {
        let out = std::fs::File::create(log).expect("server log");
        let err = out.try_clone().expect("server log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Process { child }
    }

    fn kill(&mut self) {
        // The whole group: werkzeug and gunicorn fork workers.
        if self.child.try_wait().is_ok_and(|s| s.is_some()) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

use std::os::unix::process::CommandExt;

/// `moto_server`, an S3 protocol server, on a loopback port.
#[derive(Debug)]
pub struct S3Server {
    process: Process,
    pub port: u16,
    dir: PathBuf,
}

impl S3Server {
    pub fn start() -> S3Server {
        let bin = venv_bin("moto_server");
        let dir = scratch("s3");
        let port = free_port();
        let log = dir.join("moto.log");
        let process = Process::spawn(
            Command::new(bin).args(["-H", "127.0.0.1", "-p", &port.to_string()]),
            &log,
        );
        wait_until("moto_server", &log, Duration::from_secs(60), || {
            http(port, "GET", "/", "").is_ok_and(|(s, _)| s == 200)
        });
        S3Server { process, port, dir }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (moto takes unsigned requests).
    pub fn create_bucket(&self, name: &str) {
        let (status, body) =
            http(self.port, "PUT", &format!("/{name}"), "").expect("create bucket");
        assert_eq!(status, 200, "create bucket {name}: {body}");
    }

    /// The standard AWS variables that point a client at this server.
    pub fn env(&self) -> BTreeMap<String, String> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgreSQL cluster of its own (`initdb` + `pg_ctl`) on a loopback port, trust
/// authentication, removed when dropped.
#[derive(Debug)]
pub struct Postgres {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Where `initdb` and `pg_ctl` are: on `PATH`, else Debian's versioned directory.
fn pg_bin() -> PathBuf {
    let on_path = Command::new("sh")
        .args(["-c", "command -v pg_ctl"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if let Some(p) = on_path {
        return PathBuf::from(p)
            .parent()
            .expect("a directory")
            .to_path_buf();
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .filter(|b| b.join("pg_ctl").exists())
        .expect("PostgreSQL is missing: apt-get install postgresql (or run .ci/run)")
}

impl Postgres {
    pub fn start() -> Postgres {
        let bin = pg_bin();
        let dir = scratch("pg");
        let data = dir.join("data");
        // initdb refuses to run as root; run it and the server as `nobody` then.
        let as_user = |cmd: &Path| {
            let mut c = if is_root() {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
                    .arg(cmd);
                c
            } else {
                Command::new(cmd)
            };
            c.env_remove("PGDATA");
            c
        };
        if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "nobody:nogroup"])
                .arg(&dir)
                .status();
        }
        let out = as_user(&bin.join("initdb"))
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&data)
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let log = dir.join("pg.log");
        let out = as_user(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(format!(
                "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' -c fsync=off -c max_connections=200",
                dir.display()
            ))
            .args(["-w", "-t", "60", "start"])
            .output()
            .expect("pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Postgres { port, dir, bin }
    }

    /// A connection URL for database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let mut c = if is_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
                .arg(self.bin.join("pg_ctl"));
            c
        } else {
            Command::new(self.bin.join("pg_ctl"))
        };
        let _ = c
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `mlflow server` with a SQLite backend on a loopback port.
#[derive(Debug)]
pub struct Mlflow {
    process: Process,
    pub port: u16,
    dir: PathBuf,
}

impl Mlflow {
    pub fn start() -> Mlflow {
        let bin = venv_bin("mlflow");
        let dir = scratch("mlflow");
        let port = free_port();
        let log = dir.join("mlflow.log");
        let process = Process::spawn(
            Command::new(bin)
                .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
                .arg("--backend-store-uri")
                .arg(format!("sqlite:///{}/mlflow.db", dir.display()))
                .arg("--default-artifact-root")
                .arg(dir.join("artifacts"))
                .args(["--workers", "1"])
                .current_dir(&dir),
            &log,
        );
        wait_until("mlflow server", &log, Duration::from_secs(120), || {
            http(port, "GET", "/health", "").is_ok_and(|(s, _)| s == 200)
        });
        Mlflow { process, port, dir }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Mlflow {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Label Studio itself (`label-studio start`, SQLite, no browser) on a loopback port,
/// from its own venv (`$DRIVETRAIN_TEST_LABEL_STUDIO_VENV`, default
/// `~/.cache/drivetrain/label-studio-venv`: its pins do not sit with MLflow's), with one
/// user whose API token is [`LabelStudio::TOKEN`] (legacy tokens enabled).
#[derive(Debug)]
pub struct LabelStudio {
    process: Process,
    pub port: u16,
    dir: PathBuf,
}

impl LabelStudio {
    /// The API token (`Authorization: Token …`).
    pub const TOKEN: &'static str = "0123456789abcdef0123456789abcdef01234567";

    /// The venv's `bin/NAME`.
    pub fn bin(name: &str) -> PathBuf {
        bin_in_venv(
            "DRIVETRAIN_TEST_LABEL_STUDIO_VENV",
            "label-studio-venv",
            "label-studio",
            name,
        )
    }

    pub fn start() -> LabelStudio {
        let dir = scratch("label-studio");
        let port = free_port();
        let log = dir.join("label-studio.log");
        let process = Process::spawn(
            Command::new(Self::bin("label-studio"))
                .args(["start", "--no-browser", "--host", "127.0.0.1"])
                .args(["--port", &port.to_string()])
                .args([
                    "--username",
                    "labeler@example.com",
                    "--password",
                    "labeler-pass",
                ])
                .args(["--user-token", Self::TOKEN])
                .env("LABEL_STUDIO_BASE_DATA_DIR", &dir)
                .env("LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN", "true")
                .env("LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK", "true")
                .current_dir(&dir),
            &log,
        );
        // Its first start migrates a new database: a minute or two on two cores.
        wait_until("label-studio", &log, Duration::from_secs(400), || {
            http(port, "GET", "/health", "").is_ok_and(|(s, _)| s == 200)
        });
        LabelStudio { process, port, dir }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for LabelStudio {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
