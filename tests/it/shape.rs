//! The workspace keeps its shape (issue 45): no circle in the import map between the files
//! of a crate and no non-test function over 120 lines, as `tests/shape/check.py` reads
//! them (it names what breaks either).

#[test]
fn no_circle_of_imports_and_no_function_over_120_lines() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/tests/shape/check.py"))
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("0 problem(s)"), "{said}");
}
