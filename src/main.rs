//! The `drivetrain` command line: parse, set up logging and the environment, and hand the
//! command to `commands/` (one file per command group).
//!
//! Exit codes mean one thing each: 0 success, 1 the pipeline is invalid (or the run
//! failed), 2 usage (bad arguments, unreadable files), 130 cancelled.

/// `println!` for what a command that runs an engine prints: a closed pipe (`drivetrain
/// run … | head`) loses the rest of the text, never the run (`println!` would panic).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// [`say!`] on standard error (`drivetrain run … 2>&1 | head`).
macro_rules! tell {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod alloc;
mod audit;
mod catalog;
mod cli;
mod client;
mod commands;
mod doctor;
mod exit;
mod experiments;
mod history;
mod inspect;
mod manifests;
mod next;
mod output;
mod people;
mod plan_output;
mod queue;
mod report;
mod rerun;
mod runs;
mod schedules;
mod triggers;

/// mimalloc, but where the process only prints its version or help (`alloc.rs`).
#[global_allocator]
static GLOBAL: alloc::Allocator = alloc::Allocator;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, RunGroup, ServerGroup};

/// Commands that only print (and `logs --follow`) die quietly of a closed pipe, as other
/// command-line tools do (`drivetrain list | head -1`). Rust ignores SIGPIPE, so a write
/// to a closed pipe is an error, which `println!` turns into a panic. Commands that run an
/// engine keep ignoring it: a closed pipe must not kill a run half-way.
fn die_quietly_on_closed_pipes(command: &Command) {
    if matches!(
        command,
        Command::Run(
            RunGroup::Run { .. }
                | RunGroup::Rerun { .. }
                | RunGroup::Retry { .. }
                | RunGroup::Resume { .. }
                | RunGroup::Exec { .. }
        ) | Command::Server(ServerGroup::Serve { .. } | ServerGroup::Ui { .. })
    ) {
        return;
    }
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: restoring the default disposition installs no handler; still one thread.
    #[allow(unsafe_code)]
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn main() -> ExitCode {
    // A prepared sandbox's init is this binary too (executors/src/local/sandbox.rs).
    if let Some(code) = drivetrain_executors::local::serve_if_asked() {
        return code;
    }
    if let Some(version) = cli::version_only(std::env::args_os()) {
        // As clap does: a closed stdout is not an error here.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), version.as_bytes());
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    die_quietly_on_closed_pipes(&cli.command);
    // As the environment would: a detached engine (`--detach`) and built-in
    // steps see the same stores. Still one thread here.
    if let Some(url) = &cli.store {
        std::env::set_var("DRIVETRAIN_STORE", url);
    }
    if let Some(url) = &cli.state {
        std::env::set_var("DRIVETRAIN_STATE", url);
    }
    // Warnings (and more with `DRIVETRAIN_LOG=info|debug|trace`) go to stderr.
    let level = std::env::var("DRIVETRAIN_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::WARN);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
    let home = runs::home(cli.home.as_deref());
    commands::dispatch(cli.command, home)
}

/// The process's one tokio runtime, built here on first use (a command that needs none,
/// such as `validate`, starts no threads) and kept to the end: multi-threaded, with the
/// main thread's stack size (what validates in `drivetrain validate` validates in
/// `serve`), and idle workers giving memory back (`alloc::release_idle`).
pub(crate) fn runtime() -> anyhow::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .on_thread_park(alloc::release_idle)
        .build()?;
    Ok(RUNTIME.get_or_init(|| rt))
}
