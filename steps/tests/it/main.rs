//! The steps' tests against real writers, readers and services, one test binary (one
//! link instead of one per file). One file's tests: `cargo test -p drivetrain-steps --test
//! it label_studio::`.

mod common;

mod damaged_logs;
mod fleet_logs;
mod label_studio;
mod mlflow;
mod real_inputs;
mod s3_source;
mod steps;
