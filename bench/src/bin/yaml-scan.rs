//! Baseline for the validation benchmark: scan a YAML file with the same parser
//! drivetrain uses (saphyr-parser) and count its events, building nothing. The gap between
//! this and `drivetrain validate` is what drivetrain itself costs.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: yaml-scan FILE");
        return ExitCode::from(2);
    };
    let src = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut events = 0usize;
    for ev in saphyr_parser::Parser::new_from_str(&src) {
        if let Err(e) = ev {
            eprintln!("{path}: {e}");
            return ExitCode::from(1);
        }
        events += 1;
    }
    println!("{events} events");
    ExitCode::SUCCESS
}
