//! The end-to-end tests of the `drivetrain` binary, one test binary (one link of the
//! engine, DataFusion, kube and object_store instead of one per file). Run one file's
//! tests with its module as the filter: `cargo test --test it corpus::`.

mod common;

mod api;
mod bounds;
mod cache_keys;
mod cli;
mod corpus;
mod driving_loop;
mod first_hour;
mod flood;
mod gpus;
mod history;
mod hostile;
mod in_process;
mod integrity;
mod isolation;
mod kubernetes;
mod mlflow;
mod no_panic;
mod partial_results;
mod people;
mod plugins;
mod postgres;
mod preemption;
mod readme;
mod run;
mod s3;
mod sandbox;
mod schemathesis;
mod search;
mod serve;
mod shape;
mod slurm;
mod training;
mod triggers;
mod ui;
mod ui_first_hour;
mod ui_loop;
mod ui_search;
