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

/// The statement that gives copy `round` of the seed its ids: the seed's
/// own last 12 hex digits (random, so distinct among the seed's rows)
/// behind a prefix that grows with the round, so each copy lands at the
/// end of every index on the id instead of all over them (random ids made
/// the fill slow down as the table grew).
fn renew_ids(target: &Target, round: u64) -> String {
    let prefix = format!("{:08x}-{:04x}-7000-8000-", round >> 16, round & 0xffff);
    match target {
        Target::Mysql(_) => {
            format!("UPDATE bench_seed SET id = CONCAT('{prefix}', SUBSTR(id, 25))")
        }
        Target::Sqlite(_) | Target::Postgres(_) => {
            format!("UPDATE bench_seed SET id = '{prefix}' || substr(id, 25)")
        }
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
/// `extra` more exist, each copy with new ids; `done` is told the running
/// count after each copy.
pub(super) async fn copy_tasks(
    target: &Target,
    handler: &str,
    extra: u64,
    mut done: impl FnMut(u64),
) -> anyhow::Result<()> {
    // The handler and the ids are the bench's own, not input.
    let seed = format!(
        "CREATE TEMPORARY TABLE bench_seed AS SELECT * FROM tasks WHERE handler = '{handler}'"
    );
    let copy = |n: u64| format!("INSERT INTO tasks SELECT * FROM bench_seed LIMIT {n}");
    on_conn!(target, conn => {
        sqlx::query(sqlx::AssertSqlSafe(seed.as_str())).execute(&mut conn).await?;
        let size: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bench_seed")
            .fetch_one(&mut conn)
            .await?;
        anyhow::ensure!(size > 0, "no seed tasks of {handler} to copy");
        let mut copied = 0u64;
        let mut round = 0u64;
        while copied < extra {
            let n = (extra - copied).min(size as u64);
            round += 1;
            sqlx::query(sqlx::AssertSqlSafe(renew_ids(target, round))).execute(&mut conn).await?;
            sqlx::query(sqlx::AssertSqlSafe(copy(n))).execute(&mut conn).await?;
            copied += n;
            done(copied);
            // SQLite's WAL would otherwise grow by the whole fill (4.6 GB
            // for the first 870,000 copies): fold it into the file as it
            // goes.
            if matches!(target, Target::Sqlite(_)) && round.is_multiple_of(10) {
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").fetch_all(&mut conn).await?;
            }
            // Each renewal leaves the seed's old row versions behind, and
            // autovacuum never visits a temporary table: without this the
            // seed grew by 10^4 dead rows a copy and the fill slowed from
            // ~22,000 to ~9,000 tasks/s over 10^7.
            if matches!(target, Target::Postgres(_)) {
                sqlx::raw_sql("VACUUM bench_seed").execute(&mut conn).await?;
            }
        }
        // The planner's statistics as autovacuum would have them after such
        // growth over time (its own ANALYZE may not have run yet when the
        // bench starts measuring: a plan made for an empty table then scans
        // 10^6 rows).
        if matches!(target, Target::Postgres(_)) {
            sqlx::raw_sql("ANALYZE tasks").execute(&mut conn).await?;
        }
    });
    Ok(())
}

/// How many tasks of the default namespace, where the scenario puts them,
/// are in `state`: one `COUNT(*)` through the namespace-and-state index
/// (paging through 10^7 tasks with `ListTasks` takes minutes).
pub(super) async fn count_state(
    target: &Target,
    state: taskmesh_core::TaskState,
) -> anyhow::Result<u64> {
    // The state's name is the bench's own, not input.
    let sql = format!(
        "SELECT COUNT(*) FROM tasks WHERE namespace = '{}' AND state = '{}'",
        taskmesh_core::validate::DEFAULT_NAMESPACE,
        state.as_str()
    );
    let n: i64 = on_conn!(target, conn => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str())).fetch_one(&mut conn).await?);
    Ok(u64::try_from(n).unwrap_or(0))
}
