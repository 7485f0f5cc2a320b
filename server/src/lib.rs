//! `drivetrain serve`: runs the pipelines of a directory on their cron schedules, serves
//! the HTTP API ([`crate::api`]), and `drivetrain schedule …` to list, suspend, resume and
//! trigger schedules from the command line.
//!
//! Every loop decides the due ticks of every schedule against the state store
//! ([`drivetrain_engine::schedule::due_all`]): a tick is claimed together with its run's
//! record, in one transaction, before the run starts, so a server killed at any point and
//! started again neither fires a tick twice nor loses one (within the catch-up policy); a
//! tick queued by `schedule trigger` (claimed without a run) is started by the next loop.
//! Runs execute in this process: on the local executor, or for a rerun or a resumed run on the
//! executor its pipeline (or its first run) named.

pub mod access;
pub mod api;
mod approvals;
mod failing;
mod feed;
pub mod listener;
mod notify;
pub mod oidc;
pub mod query;
mod quota;
pub mod server;
mod triggers;
mod ui;

pub use server::{Auth, Histogram, Loaded, Metrics, Server, STREAM_READS, VALIDATIONS};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use drivetrain_engine::artifacts::ArtifactStore;
use drivetrain_engine::engine::{EngineBuilder, Home};
use drivetrain_engine::state::StateStore;
use drivetrain_engine::Catalog;

use crate::server::load;

/// Builds an engine from the home's state and default store.
pub type MakeEngine =
    Box<dyn FnOnce(Arc<dyn StateStore>, ArtifactStore) -> anyhow::Result<EngineBuilder>>;

/// `drivetrain serve`'s options.
pub struct ServeArgs {
    /// Builds the engine runs execute on from the home's state and default store, on
    /// the local executor: the caller's executors, steps and GPUs.
    pub engine: MakeEngine,
    /// The runtime the server runs on: the binary's one.
    pub runtime: tokio::runtime::Handle,
    /// `None` (`drivetrain ui`): no pipelines to submit by name.
    pub pipelines: Option<PathBuf>,
    /// Keep the schedules: fire their ticks (`serve`), or not (`ui`).
    pub schedules: bool,
    pub bind: String,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub insecure_no_auth: bool,
    pub parallelism: Option<usize>,
    /// `--notify FILE`: sinks for every run, besides each pipeline's.
    pub notify: Option<PathBuf>,
    /// `--oidc FILE`: accept the ID tokens of an OpenID Connect issuer.
    pub oidc: Option<PathBuf>,
    /// `--public-url URL`: the base of the web view's links in notifications.
    pub public_url: Option<String>,
}

/// The token from `--token`, `--token-file` or `DRIVETRAIN_TOKEN`, in that order; a
/// warning for the first, which every process on the machine can read.
fn token(args: &ServeArgs) -> anyhow::Result<Option<String>> {
    if args.token.is_some() {
        eprintln!(
            "warning: --token is in this process's command line, which every user of this \
             machine can read (/proc/PID/cmdline): use --token-file or DRIVETRAIN_TOKEN"
        );
    }
    let from_file = match &args.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", path.display()))?;
            let first = text.lines().next().unwrap_or("").trim().to_owned();
            if first.is_empty() {
                anyhow::bail!("--token-file {}: its first line is empty", path.display());
            }
            Some(first)
        }
        None => None,
    };
    Ok(args
        .token
        .clone()
        .or(from_file)
        .or_else(|| std::env::var("DRIVETRAIN_TOKEN").ok())
        .filter(|t| !t.is_empty()))
}

/// `--bind`: an address, or a host name and port (`localhost:8080`), resolved to its
/// first address.
fn bind_address(bind: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = bind.parse() {
        return Ok(a);
    }
    use std::net::ToSocketAddrs as _;
    bind.to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("--bind {bind}: {e} (give ADDRESS:PORT or HOST:PORT)"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("--bind {bind}: the name has no address"))
}

/// Where people reach the web view: `--public-url` or `DRIVETRAIN_PUBLIC_URL` (without a
/// trailing `/`), else the address listened on (this machine's name for an unspecified
/// address).
fn public_url(given: Option<&str>, bound: SocketAddr) -> String {
    let from_env = std::env::var("DRIVETRAIN_PUBLIC_URL").ok();
    if let Some(url) = given.or(from_env.as_deref()).filter(|u| !u.is_empty()) {
        return url.trim_end_matches('/').to_owned();
    }
    let host = match bound.ip() {
        ip if ip.is_unspecified() => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into()),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{host}:{}", bound.port())
}

/// `drivetrain serve --pipelines DIR --bind ADDR`.
pub fn serve(catalog: Catalog, home: &Path, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let addr = bind_address(&args.bind)?;
    let token = token(&args)?;
    let state: Arc<dyn StateStore> = Home::at(home)?.open_state()?;
    let oidc = args
        .oidc
        .as_deref()
        .map(crate::oidc::Oidc::load)
        .transpose()?;
    let has_tokens = state.tokens()?.iter().any(|t| t.revoked_at.is_none());
    let auth_required = token.is_some() || oidc.is_some() || has_tokens;
    if !addr.ip().is_loopback() && !auth_required {
        eprintln!("error: refusing to serve on {addr} without a token: set --token or DRIVETRAIN_TOKEN, create one with `drivetrain token create`, or bind a loopback address");
        return Ok(ExitCode::from(
            drivetrain_engine::fault::Fault::Request.exit_code(),
        ));
    }
    warn_of_access(addr, auth_required, args.insecure_no_auth);
    let Some(default_sinks) = default_sinks(args.notify.as_deref())? else {
        return Ok(ExitCode::from(
            drivetrain_engine::fault::Fault::Request.exit_code(),
        ));
    };
    let pipelines = match &args.pipelines {
        Some(dir) => load(&catalog, dir, state.as_ref(), args.schedules)?,
        None => BTreeMap::new(),
    };
    if let Some(dir) = args.pipelines.as_ref().filter(|_| pipelines.is_empty()) {
        eprintln!("error: no valid pipeline under {}", dir.display());
        return Ok(ExitCode::from(
            drivetrain_engine::fault::Fault::Request.exit_code(),
        ));
    }
    let limits = crate::listener::Limits::for_files(crate::listener::raise_file_limit());
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let artifacts = ArtifactStore::open(&Home::at(home)?.store_url(None)?)?;
    let engine = (args.engine)(state.clone(), artifacts)?
        .parallelism(args.parallelism.unwrap_or(2))
        .build();
    let home = std::fs::canonicalize(home)?;
    let dir = std::fs::canonicalize(args.pipelines.as_deref().unwrap_or(&home))?;
    let auth = Auth {
        token,
        insecure_no_auth: args.insecure_no_auth && !auth_required,
        auth_required,
        oidc,
    };
    let mut server = Server::new(
        engine,
        catalog,
        (home, dir),
        pipelines,
        auth,
        (bound, limits),
        default_sinks,
    );
    server.public_url = public_url(args.public_url.as_deref(), bound);
    let server = Arc::new(server);
    print_schedules(&server);
    server.engine.home().keep_reserve();
    let schedules = args.schedules;
    args.runtime
        .block_on(serve_on(server, listener, limits, schedules))?;
    Ok(ExitCode::SUCCESS)
}

/// The served API and the scheduler loop, until SIGTERM or Ctrl-C; then the runs in flight
/// finish (no new ticks or submissions) before it returns.
async fn serve_on(
    server: Arc<Server>,
    listener: std::net::TcpListener,
    limits: crate::listener::Limits,
    schedules: bool,
) -> anyhow::Result<()> {
    // Only `serve` takes over orphaned runs; `ui` is a viewer and executes nothing.
    if schedules {
        let orphans = server.resume_orphans()?;
        for run in &orphans {
            println!("resuming run {run}: its engine is gone");
        }
        server.resume(&orphans).await?;
        server.start_triggers()?;
        tokio::spawn(server.clone().notify_loop());
        tokio::spawn(server.clone().approval_loop());
    }
    let listener = tokio::net::TcpListener::from_std(listener)?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("the web view: http://{}/", listener.local_addr()?);
    let app = crate::api::router(server.clone());
    let (stop_http, stopped) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(async move {
        crate::listener::serve(listener, app, limits, async {
            let _ = stopped.await;
        })
        .await
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut last_check = std::time::Instant::now();
    loop {
        let wait = match schedules {
            true => server.tick(chrono::Utc::now())?,
            false => Duration::from_secs(1),
        };
        if schedules && last_check.elapsed() >= drivetrain_engine::runner::heartbeat_interval() {
            last_check = std::time::Instant::now();
            take_over(&server).await;
            forget_old_keys(&server).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    // Graceful: no new ticks or submissions; the runs in flight finish and are recorded.
    server.stopping.store(true, Ordering::SeqCst);
    println!(
        "stopping: waiting for {} run(s) in flight",
        server.in_flight()
    );
    while server.in_flight() > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_http.send(());
    let _ = http.await;
    Ok(())
}

/// Forgets the `Idempotency-Key`s older than [`crate::api::keys::KEPT`].
async fn forget_old_keys(server: &Arc<Server>) {
    let state = server.engine.state().clone();
    let before = chrono::Utc::now() - crate::api::keys::KEPT;
    let before = before.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let forgotten = tokio::task::spawn_blocking(move || state.expire_keys(&before)).await;
    if let Ok(Err(e)) = forgotten {
        eprintln!("request keys: {e}");
    }
}

/// Takes over the runs whose engine stopped beating and resumes them here.
async fn take_over(server: &Arc<Server>) {
    match server.take_over_stale() {
        Ok(runs) => {
            for run in &runs {
                println!("taking over run {run}: its engine stopped beating");
            }
            if let Err(e) = server.resume(&runs).await {
                eprintln!("cannot resume runs taken over: {e:#}");
            }
        }
        Err(e) => eprintln!("cannot look for runs to take over: {e:#}"),
    }
}

/// Says who may call the API, where it is open to more than its tokens.
fn warn_of_access(addr: SocketAddr, auth_required: bool, insecure_no_auth: bool) {
    if auth_required {
        // Tokens decide; --insecure-no-auth opens nothing.
    } else if insecure_no_auth {
        eprintln!(
            "warning: --insecure-no-auth: anyone who can reach {addr} can start runs, which \
             run commands as this user"
        );
    } else {
        eprintln!(
            "note: no token: the API answers reads only; give --token (or DRIVETRAIN_TOKEN) \
             to start, rerun and cancel runs over it"
        );
    }
}

/// `--notify FILE`'s sinks (none without it); `None` when the file does not validate
/// (its problems printed).
fn default_sinks(
    file: Option<&Path>,
) -> anyhow::Result<Option<Vec<drivetrain_engine::events::Sink>>> {
    let Some(file) = file else {
        return Ok(Some(Vec::new()));
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("--notify {}: {e}", file.display()))?;
    match drivetrain_engine::validate::notify_file(&text) {
        Ok(sinks) => Ok(Some(sinks)),
        Err(diagnostics) => {
            for d in diagnostics {
                eprintln!("{}: {d}", file.display());
            }
            Ok(None)
        }
    }
}

/// Each served schedule and its next tick.
fn print_schedules(server: &Server) {
    for (name, l) in server.loaded().iter() {
        if let (Some(t), Some(s)) = (&l.ticker, &l.pipeline.schedule) {
            let next = t
                .next_after(chrono::Utc::now())
                .map(|t| t.to_rfc3339())
                .unwrap_or_else(|| "never".into());
            println!("schedule {name}: `{}` {} (next {next})", s.cron, s.timezone);
        }
    }
}

impl std::fmt::Debug for ServeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeArgs")
            .field("bind", &self.bind)
            .field("pipelines", &self.pipelines)
            .finish_non_exhaustive()
    }
}
