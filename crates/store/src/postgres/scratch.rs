//! Throw-away schemas on a real Postgres server, for tests: each test gets
//! a schema of its own (so tests run in parallel on one database), created
//! fresh and dropped at the end.
//!
//! Tests use the machine's server (`make services` starts it) unless
//! `TASKMESH_TEST_DATABASE_URL` names another. A server that cannot be
//! reached is an error saying so — a test never passes silently without
//! its database.

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use super::PostgresOptions;
use crate::urls::{clean_up_on_drop, redact, with_database};
use crate::{Error, Result};

/// The environment variable naming the test database.
pub const TEST_DATABASE_URL_ENV: &str = "TASKMESH_TEST_DATABASE_URL";

/// The machine's Postgres as `scripts/ensure-services.sh` provides it.
pub const DEFAULT_TEST_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The database tests use: `TASKMESH_TEST_DATABASE_URL`, or the default.
pub fn test_database_url() -> String {
    std::env::var(TEST_DATABASE_URL_ENV)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_TEST_DATABASE_URL.to_string())
}

/// A schema made for one test and dropped (with everything in it) when
/// this value is dropped or [`ScratchSchema::drop_now`] is called.
#[derive(Debug)]
pub struct ScratchSchema {
    url: String,
    name: String,
    dropped: bool,
}

impl ScratchSchema {
    /// Creates a uniquely named empty schema on the test database.
    pub async fn create() -> Result<Self> {
        Self::create_on(&test_database_url()).await
    }

    /// Creates a uniquely named empty schema on the database at `url`.
    pub async fn create_on(url: &str) -> Result<Self> {
        let id = taskmesh_core::id::new_session_id().replace('-', "");
        let name = format!("tm_test_{}", &id[..16]);
        let mut conn = connect(url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok(Self {
            url: url.to_string(),
            name,
            dropped: false,
        })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Store options for this schema: a small pool (tests run in parallel
    /// on one server), notifications on.
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions {
            max_connections: 6,
            ..PostgresOptions::new(self.url.clone()).with_schema(self.name.clone())
        }
    }

    /// Drops the schema now, reporting failure.
    pub async fn drop_now(mut self) -> Result<()> {
        self.dropped = true;
        drop_schema(&self.url, &self.name).await
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (url, name) = (self.url.clone(), self.name.clone());
        clean_up_on_drop(format!("test schema {name}"), move || async move {
            drop_schema(&url, &name).await
        });
    }
}

async fn drop_schema(url: &str, name: &str) -> Result<()> {
    let mut conn = connect(url).await?;
    // A connection left inside a transaction (a test that panicked) would
    // block the drop forever; give up after a while and leave the schema.
    sqlx::query("SET lock_timeout = '10s'")
        .execute(&mut conn)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {name} CASCADE"
    )))
    .execute(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(())
}

async fn connect(url: &str) -> Result<PgConnection> {
    PgConnection::connect(url).await.map_err(|err| {
        Error::Unavailable(format!(
            "cannot reach the test Postgres at {} ({err}); start it with `make services` \
             or name another with {TEST_DATABASE_URL_ENV}",
            redact(url)
        ))
    })
}

/// A database of its own for one run (`taskmesh bench` on Postgres):
/// created empty on the server of `admin_url`, dropped by
/// [`ScratchDatabase::drop_now`]. Also reports the server's durability
/// settings, so a measurement can say what it measured.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Creates a uniquely named empty database next to the one `admin_url`
    /// names (which must allow `CREATE DATABASE`).
    pub async fn create_on(admin_url: &str) -> Result<Self> {
        let id = taskmesh_core::id::new_session_id().replace('-', "");
        let name = format!("tm_bench_{}", &id[..16]);
        let url = with_database(admin_url, &name)
            .ok_or_else(|| Error::Internal(format!("{} names no database", redact(admin_url))))?;
        let mut conn = connect(admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok(Self {
            admin_url: admin_url.to_string(),
            name,
            url,
        })
    }

    /// The new database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `fsync` and `synchronous_commit` as the server runs them.
    pub async fn durability(&self) -> Result<(String, String)> {
        let mut conn = connect(&self.url).await?;
        let fsync: String = sqlx::query_scalar("SHOW fsync")
            .fetch_one(&mut conn)
            .await?;
        let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok((fsync, sync))
    }

    /// Drops the database (closing connections still open to it).
    pub async fn drop_now(self) -> Result<()> {
        let mut conn = connect(&self.admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok(())
    }
}
