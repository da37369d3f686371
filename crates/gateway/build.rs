//! Embeds the web console: lists every file of `console/` into
//! `$OUT_DIR/console_assets.rs` as `(name, include_bytes!(…))` pairs, so a
//! file added to the folder is served without touching the code, and any
//! change in it rebuilds the crate.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("console");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("crates/gateway/console holds the console's files")
        .map(|e| e.expect("a readable console entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            e.file_name()
                .into_string()
                .expect("console file names are UTF-8")
        })
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut out = String::from("&[\n");
    for name in &names {
        let path = dir.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        writeln!(
            out,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .expect("writing to a String");
    }
    out.push_str("]\n");
    let target =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("console_assets.rs");
    std::fs::write(target, out).expect("OUT_DIR is writable");
}
