//! The one explicit list of steps and executors this binary knows.

use drivetrain_engine::Catalog;

/// Every built-in step and executor.
pub(crate) fn catalog() -> Catalog {
    Catalog::new(
        drivetrain_steps::all(),
        drivetrain_executors::EXECUTORS.to_vec(),
    )
}
