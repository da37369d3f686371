//! Servers for tests. Private ones — Postgres ([`PrivatePostgres`]),
//! MariaDB ([`PrivateMariadb`]) and Redis ([`PrivateRedis`]) — each on a
//! free loopback port in a temporary directory, stopped and removed when
//! dropped (also when the test panics), for tests that kill, stop or restart
//! them. The machine's shared servers are never stopped: tests use them
//! under a key prefix of their own ([`SharedRedis`], deleted afterwards) or
//! in a database of their own ([`ScratchDb`], dropped afterwards). A
//! missing piece of the environment fails the test with a message saying
//! what is missing; it is never skipped.

mod mariadb;
mod postgres;
mod redis_server;
mod scratch;

pub use mariadb::PrivateMariadb;
pub use postgres::{PrivatePostgres, pg_bin};
pub use redis_server::{PrivateRedis, SharedRedis, connect_redis, delete_prefix};
pub use scratch::ScratchDb;

/// Whether this process runs as root (the database servers need to know).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
