//! Bulk fills for benches that need millions of rows in the store before
//! they measure (`--ended 10000000`): a seed written through the `Store`
//! (so every column is what the server writes), then copied inside the
//! database, `INSERT … SELECT` a copy at a time with fresh ids. Through the
//! store such a fill runs at ~8,000 tasks/s (21 minutes for 10^7); copied in
//! the database it takes a few minutes.
//!
//! The copies go through a connection of the bench's own (a temporary table
//! is per connection), never through the node, which sits idle meanwhile.

use std::path::PathBuf;

use anyhow::Context;
use sqlx::Connection;

/// The database a fill copies in.
pub(super) enum Target {
    /// The SQLite file in this data directory.
    Sqlite(PathBuf),
    /// A Postgres database by URL.
    Postgres(String),
    /// A MySQL / MariaDB database by URL.
    Mysql(String),
}

/// A fresh random id in the form of the server's (a UUID as text), per
/// dialect.
fn new_id(target: &Target) -> &'static str {
    match target {
        Target::Sqlite(_) => {
            "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-' || \
             hex(randomblob(2)) || '-' || hex(randomblob(2)) || '-' || hex(randomblob(6)))"
        }
        Target::Postgres(_) => "gen_random_uuid()::text",
        Target::Mysql(_) => "UUID()",
    }
}

/// Runs `$body` with `$conn` a fresh connection of the bench's own to
/// `$target` (a typed one per backend: the body is written once).
macro_rules! on_conn {
    ($target:expr, $conn:ident => $body:expr) => {
        match $target {
            Target::Sqlite(dir) => {
                let file = dir.join(taskmesh_store::sqlite::DEFAULT_FILE_NAME);
                let opts = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&file)
                    .busy_timeout(std::time::Duration::from_secs(30));
                let mut $conn = sqlx::SqliteConnection::connect_with(&opts)
                    .await
                    .with_context(|| format!("opening {}", file.display()))?;
                let out = $body;
                $conn.close().await?;
                out
            }
            Target::Postgres(url) => {
                let mut $conn = sqlx::PgConnection::connect(url)
                    .await
                    .context("connecting to the bench's database")?;
                let out = $body;
                $conn.close().await?;
                out
            }
            Target::Mysql(url) => {
                let mut $conn = sqlx::MySqlConnection::connect(url)
                    .await
                    .context("connecting to the bench's database")?;
                let out = $body;
                $conn.close().await?;
                out
            }
        }
    };
}

/// Copies the tasks of `handler` (the seed, already in the store) until
/// `extra` more exist, each copy with a new id; `done` is told the running
/// count after each copy.
pub(super) async fn copy_tasks(
    target: &Target,
    handler: &str,
    extra: u64,
    mut done: impl FnMut(u64),
) -> anyhow::Result<()> {
    let id = new_id(target);
    // `{id}` and the handler are the bench's own, not input.
    let seed = format!(
        "CREATE TEMPORARY TABLE bench_seed AS SELECT * FROM tasks WHERE handler = '{handler}'"
    );
    let renew = format!("UPDATE bench_seed SET id = {id}");
    let copy = |n: u64| format!("INSERT INTO tasks SELECT * FROM bench_seed LIMIT {n}");
    on_conn!(target, conn => {
        sqlx::query(sqlx::AssertSqlSafe(seed.as_str())).execute(&mut conn).await?;
        let size: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bench_seed")
            .fetch_one(&mut conn)
            .await?;
        anyhow::ensure!(size > 0, "no seed tasks of {handler} to copy");
        let mut copied = 0u64;
        while copied < extra {
            let n = (extra - copied).min(size as u64);
            sqlx::query(sqlx::AssertSqlSafe(renew.as_str())).execute(&mut conn).await?;
            sqlx::query(sqlx::AssertSqlSafe(copy(n))).execute(&mut conn).await?;
            copied += n;
            done(copied);
        }
    });
    Ok(())
}

/// How many tasks are in `state`: one `COUNT(*)` (paging through 10^7
/// tasks with `ListTasks` takes minutes).
pub(super) async fn count_state(
    target: &Target,
    state: taskmesh_core::TaskState,
) -> anyhow::Result<u64> {
    // The state's name is the bench's own, not input.
    let sql = format!(
        "SELECT COUNT(*) FROM tasks WHERE state = '{}'",
        state.as_str()
    );
    let n: i64 = on_conn!(target, conn => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str())).fetch_one(&mut conn).await?);
    Ok(u64::try_from(n).unwrap_or(0))
}
