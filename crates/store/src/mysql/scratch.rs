//! Throw-away databases on a real MySQL or MariaDB server, for tests and
//! benchmarks: each gets a database of its own (so tests run in parallel on
//! one server), created empty and dropped at the end.
//!
//! Tests use the machine's server (`make services` starts it) unless
//! `TASKMESH_TEST_MYSQL_URL` names another. A server that cannot be reached
//! is an error saying so — a test never passes silently without its
//! database.

use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use super::MysqlOptions;
use crate::urls::{clean_up_on_drop, redact, with_database};
use crate::{Error, Result};

/// The environment variable naming the server tests use.
pub const TEST_MYSQL_URL_ENV: &str = "TASKMESH_TEST_MYSQL_URL";

/// The machine's MariaDB as `scripts/ensure-services.sh` provides it.
pub const DEFAULT_TEST_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The server tests use: `TASKMESH_TEST_MYSQL_URL`, or the default.
pub fn test_mysql_url() -> String {
    std::env::var(TEST_MYSQL_URL_ENV)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_TEST_MYSQL_URL.to_string())
}

/// A database made for one test or run, dropped (with everything in it)
/// when this value is dropped or [`ScratchDatabase::drop_now`] is called.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
    dropped: bool,
}

impl ScratchDatabase {
    /// Creates a uniquely named empty database on the test server.
    pub async fn create() -> Result<Self> {
        Self::create_on(&test_mysql_url(), "tm_test").await
    }

    /// Creates a uniquely named empty database, its name starting with
    /// `prefix`, next to the one `admin_url` names (which must allow
    /// `CREATE DATABASE`).
    pub async fn create_on(admin_url: &str, prefix: &str) -> Result<Self> {
        let id = taskmesh_core::id::new_session_id().replace('-', "");
        let name = format!("{prefix}_{}", &id[..16]);
        let url = with_database(admin_url, &name)
            .ok_or_else(|| Error::Internal(format!("{} names no database", redact(admin_url))))?;
        let mut conn = connect(admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )))
        .execute(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok(Self {
            admin_url: admin_url.to_string(),
            name,
            url,
            dropped: false,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The new database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Store options for this database: a small pool (tests run in
    /// parallel on one server), wake-ups on.
    pub fn options(&self) -> MysqlOptions {
        MysqlOptions {
            max_connections: 6,
            ..MysqlOptions::new(self.url.clone())
        }
    }

    /// `innodb_flush_log_at_trx_commit` and `sync_binlog` as the server
    /// runs them, so a measurement can say what it measured.
    pub async fn durability(&self) -> Result<(String, String)> {
        let mut conn = connect(&self.url).await?;
        let flush: String =
            sqlx::query_scalar("SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR)")
                .fetch_one(&mut conn)
                .await?;
        let sync: String = sqlx::query_scalar("SELECT CAST(@@sync_binlog AS CHAR)")
            .fetch_one(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok((flush, sync))
    }

    /// Drops the database now, reporting failure.
    pub async fn drop_now(mut self) -> Result<()> {
        self.dropped = true;
        drop_database(&self.admin_url, &self.name).await
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        clean_up_on_drop(format!("test database {name}"), move || async move {
            drop_database(&url, &name).await
        });
    }
}

async fn drop_database(url: &str, name: &str) -> Result<()> {
    let mut conn = connect(url).await?;
    // A connection left inside a transaction (a test that panicked) would
    // block the drop for ever; give up after a while and leave it.
    sqlx::query("SET SESSION lock_wait_timeout = 10")
        .execute(&mut conn)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}"
    )))
    .execute(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(())
}

async fn connect(url: &str) -> Result<MySqlConnection> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_string(),
    };
    MySqlConnection::connect(&url).await.map_err(|err| {
        Error::Unavailable(format!(
            "cannot reach the test MySQL/MariaDB at {} ({err}); start it with `make services` \
             or name another with {TEST_MYSQL_URL_ENV}",
            redact(&url)
        ))
    })
}
