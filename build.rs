//! Links the `drivetrain` command as a position-dependent executable on Linux (glibc).
//!
//! The binary holds about 256,000 pointers that a position-independent executable has
//! the dynamic loader relocate at every start, writing to some 1,100 pages: most of the
//! 8.8 ms of a `drivetrain --version`, `status` or `list`. Linked at a fixed address it
//! starts in 3.3 ms (bench/README.md, "The binaries"); Go's toolchain links its programs
//! the same way. Shared libraries, the stack and the heap stay randomized.
//! The small wrapper a pod copies (`drivetrain-exec`) stays position-independent.

fn main() {
    let var = |name| std::env::var(name).unwrap_or_default();
    // glibc's dynamic executables only: a static musl build links as rustc chooses.
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bin=drivetrain=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
