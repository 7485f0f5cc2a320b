//! `drivetrain-exec`: the wrapper around a stage's own command in a pod
//! ([`drivetrain_executors::wrapper`]), a binary of its own so that what every pod
//! copies holds only the artifact store's code, not the engine's whole binary.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    drivetrain_executors::wrapper::main(&args)
}
