//! The binary routes SQLite's allocations to mimalloc before anything else
//! runs (`sqlite_memory::install` in `main`): when SQLite refuses, `main`
//! says so on stderr, so a clean stderr here means it took. Every other
//! test that starts `taskmesh` then runs SQLite on those methods.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");

#[test]
fn sqlite_takes_the_binarys_allocator() {
    let out = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run taskmesh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("allocator"),
        "SQLite refused the allocator: {stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("taskmesh "));
}
