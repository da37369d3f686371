//! Rebuilds this crate when a migration changes: `sqlx::migrate!` embeds the
//! files of `migrations/sqlite`, `migrations/postgres` and `migrations/mysql` at compile time,
//! and stable Rust does not track them on its own.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
    println!("cargo:rerun-if-changed=../../migrations/postgres");
    println!("cargo:rerun-if-changed=../../migrations/mysql");
}
