//! What the steps' test binaries share: a fresh scratch directory and a runtime.
#![allow(dead_code)] // each test binary uses its own share of these

use std::path::PathBuf;

/// An empty directory of its own for one test of this process.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dt-steps-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A runtime for the async step functions.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
