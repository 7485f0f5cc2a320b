//! Executors and registry backends, registered by the binary in one explicit list.
//!
//! The spec names an executor with `defaults.executor`; [`EXECUTORS`] is what validation
//! accepts. Each name is backed by an implementation of the engine's executor trait as
//! it lands (the local process executor, then the Kubernetes Job executor).

/// The executor kinds a pipeline may name, default first.
pub const EXECUTORS: &[&str] = &["local", "kubernetes"];

#[cfg(test)]
mod tests {
    #[test]
    fn local_is_the_default() {
        assert_eq!(super::EXECUTORS[0], "local");
    }
}
