//! The MySQL / MariaDB backend of [`Store`](crate::Store) (the second
//! seed's database): a cluster of `serve` replicas on MySQL 8.0+ or
//! MariaDB 10.6+, InnoDB.
//!
//! The algorithms are the one SQL implementation (`crate::sql`); this file
//! connects and is its [`Backend`](crate::sql::Backend): `?` placeholders, row locks (`FOR
//! UPDATE`, claims with `SKIP LOCKED`), a bulk compare-and-set without
//! `RETURNING` (`UPDATE … JOIN (SELECT … UNION ALL …)`, whose row count the
//! portable writer checks), the server clock (`SYSDATE(6)` in UTC), and the
//! error numbers. Sessions run READ COMMITTED (no gap locks: a claim's
//! locks never block a submit's insert) with a 5 s lock wait, and UTC.
//!
//! Wake-ups without LISTEN/NOTIFY: each store's outbox appends its batches
//! to the `changes` table and every replica polls it (`poll`), so another
//! replica's commit wakes this one within [`MysqlOptions::poll_interval`]
//! (25 ms by default) plus a query. `scratch` makes throw-away databases
//! for tests.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, MySql, MySqlPool};
use taskmesh_core::UnixMillis;

use crate::error::Kind;
use crate::sql::{BulkForm, Dialect, SqlStore, Statements};
use crate::wake::{Channels, Sink, Transport};
use crate::{Error, Result, ScheduleChange, TaskChange};

mod poll;
pub mod scratch;
#[cfg(test)]
mod tests;

/// The schema, embedded at compile time from `migrations/mysql`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/mysql");

/// MySQL's SQL: `?` placeholders, row locks, duplicates ignored by a no-op
/// update, the bulk compare-and-set as a join.
static DIALECT: Dialect = Dialect {
    name: "mysql",
    numbered: false,
    json_cast: "",
    json_read: "{c}",
    lock: " FOR UPDATE",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    false_lit: "FALSE",
    due_state: "state",
    ready_from: "tasks FORCE INDEX (tasks_ready_claim)",
    concurrency_from: "tasks FORCE INDEX (tasks_concurrency)",
    ended_from: "tasks t FORCE INDEX (tasks_ended)",
    in_flight_from: "tasks FORCE INDEX (tasks_ready_claim)",
    unheld: "",
    ended_workflows_from: "workflows w FORCE INDEX (workflows_ended)",
    bulk: BulkForm::JoinUnion,
    ignore_duplicate: " ON DUPLICATE KEY UPDATE {k0} = {k0}",
};

static SQL: OnceLock<Statements> = OnceLock::new();

/// The server's clock in unix milliseconds: `SYSDATE(6)` is the time of the
/// call; the session's time zone is UTC.
const DB_NOW: &str = "SELECT CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) AS SIGNED) AS v";

/// Every session: READ COMMITTED (locking reads lock only the rows they
/// return, no gaps), and lock waits bounded so a stuck lock is a
/// `Conflict` within seconds, not 50.
const SESSION: [&str; 2] = [
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET SESSION innodb_lock_wait_timeout = 5",
];

/// Every session of the reader pool: REPEATABLE READ, so a read
/// transaction sees one snapshot (`WITH CONSISTENT SNAPSHOT`). A pool of
/// its own rather than a `SET TRANSACTION` before each read: that would be
/// two statements, and sent as one they leave sqlx's protocol state behind
/// (a connection that fails its next check).
const READER_SESSION: [&str; 2] = [
    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "SET SESSION innodb_lock_wait_timeout = 5",
];

/// Connections of the reader pool.
const READERS: u32 = 4;

/// A pool on `connect` whose sessions first run `session`.
async fn open_pool(
    opts: &MysqlOptions,
    connect: MySqlConnectOptions,
    max: u32,
    session: &'static [&'static str],
) -> Result<MySqlPool> {
    MySqlPoolOptions::new()
        .max_connections(max)
        .min_connections(opts.min_connections.min(max))
        .acquire_timeout(opts.acquire_timeout)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                for statement in session {
                    conn.execute(*statement).await?;
                }
                Ok(())
            })
        })
        .connect_with(connect)
        .await
        .map_err(|err| match &err {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("42000") => {
                Error::InvalidArgument(format!(
                    "cannot use the mysql database ({}); create it first \
                     (CREATE DATABASE …) or name another",
                    db.message()
                ))
            }
            _ => Error::from(err),
        })
}

/// MySQL and MariaDB error numbers: duplicate key (1062, 1586) is
/// `AlreadyExists`; deadlock (1213) and lock wait timeout (1205) `Conflict`
/// (the statement or transaction was rolled back; trying again may
/// succeed); too many connections (1040), server shutdown (1053), disk or
/// table full (1021, 1114), read-only server (1290, 1836), connection
/// killed (1927) and lost (2006, 2013) `Unavailable`.
pub(crate) fn error_kind(number: u16) -> Kind {
    match number {
        1062 | 1586 => Kind::AlreadyExists,
        1205 | 1213 => Kind::Conflict,
        // ER_DISK_FULL, ER_RECORD_FILE_FULL (the table is full).
        1021 | 1114 => Kind::StorageFull,
        1040 | 1053 | 1290 | 1836 | 1927 | 2006 | 2013 => Kind::Unavailable,
        _ => Kind::Internal,
    }
}

/// How to connect a [`MysqlStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MysqlOptions {
    /// `mysql://user:password@host:port/database` (`mariadb://` too). The
    /// database must exist.
    pub url: String,
    /// Size of the connection pool (at least 1; reads of one snapshot have
    /// 4 connections of their own on top); the poller takes one of
    /// them at a time.
    pub max_connections: u32,
    /// Connections opened at once and kept.
    pub min_connections: u32,
    /// How long a call waits for a free connection before it fails with
    /// [`Error::Unavailable`].
    pub acquire_timeout: Duration,
    /// Tell other processes about changes (through the `changes` table)
    /// and poll for theirs. Off, a store sees only its own changes.
    pub notify: bool,
    /// How often the `changes` table is polled: the longest a replica waits
    /// to hear of another's commit.
    pub poll_interval: Duration,
}

impl MysqlOptions {
    /// Options for `url` with the defaults: 16 connections, none kept idle,
    /// 5 s acquire timeout, wake-ups on, polled every 25 ms.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 16,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(5),
            notify: true,
            poll_interval: Duration::from_millis(25),
        }
    }

    fn validate(&self) -> Result<MySqlConnectOptions> {
        if self.max_connections == 0 {
            return Err(Error::InvalidArgument(
                "mysql max_connections must be at least 1".into(),
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::InvalidArgument(
                "mysql poll_interval must be above zero".into(),
            ));
        }
        let url = match self.url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => self.url.clone(),
        };
        let connect = MySqlConnectOptions::from_str(&url)
            .map_err(|e| Error::InvalidArgument(format!("bad mysql url: {e}")))?;
        if connect.get_database().is_none_or(str::is_empty) {
            return Err(Error::InvalidArgument(
                "the mysql url names no database (mysql://user@host:3306/DATABASE)".into(),
            ));
        }
        // Statements compare bound text with utf8mb4_bin columns: the
        // connection's collation must be the same.
        // Every statement stays prepared (as on Postgres and SQLite).
        Ok(connect
            .charset("utf8mb4")
            .collation("utf8mb4_bin")
            .statement_cache_capacity(crate::sql::STATEMENT_CACHE))
    }
}

/// A [`Store`](crate::Store) in a MySQL or MariaDB database. Cheap to
/// clone: clones share the pool, the change channels and the poller.
pub type MysqlStore = SqlStore<MysqlBackend>;

/// The MySQL [`Backend`](crate::sql::Backend).
#[derive(Debug)]
pub struct MysqlBackend {
    pub(crate) pool: MySqlPool,
    /// REPEATABLE READ sessions for reads of one snapshot.
    reader: MySqlPool,
    transport: Option<Transport>,
    /// Polls of the `changes` table that failed since the store connected.
    poll_failures: Arc<AtomicU64>,
}

struct ChangesSink {
    pool: MySqlPool,
}

#[async_trait]
impl Sink for ChangesSink {
    async fn send(&self, payloads: Vec<String>) -> Result<(), sqlx::Error> {
        let marks = vec!["(?)"; payloads.len()].join(", ");
        let sql = format!("INSERT INTO changes (payload) VALUES {marks}");
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for p in payloads {
            q = q.bind(p);
        }
        q.execute(&self.pool).await.map(|_| ())
    }
}

impl SqlStore<MysqlBackend> {
    /// Connects to the database described by `opts`, applies pending
    /// migrations, starts polling for other processes' changes and returns
    /// the store. Fails with [`Error::Unavailable`] when the server cannot
    /// be reached and [`Error::InvalidArgument`] for bad options or a
    /// database that does not exist.
    pub async fn connect(opts: MysqlOptions) -> Result<Self> {
        let connect = opts.validate()?;
        let pool = open_pool(&opts, connect.clone(), opts.max_connections, &SESSION).await?;
        let reader = open_pool(&opts, connect, READERS, &READER_SESSION).await?;
        migrate(&pool).await?;
        let channels = Arc::new(Channels::new());
        let mut transport = None;
        let poll_failures = Arc::new(AtomicU64::new(0));
        if opts.notify {
            let origin = Transport::new_origin();
            // Polling from the newest row before `connect` returns:
            // everything committed after it is relayed to subscribers.
            let receiver = poll::start(
                pool.clone(),
                origin.clone(),
                Arc::downgrade(&channels),
                opts.poll_interval,
                poll_failures.clone(),
            )
            .await?;
            let sink = ChangesSink { pool: pool.clone() };
            transport = Some(Transport::start(origin, sink, receiver));
        }
        tracing::debug!(notify = opts.notify, "connected MySQL store");
        let backend = MysqlBackend {
            pool,
            reader,
            transport,
            poll_failures,
        };
        Ok(SqlStore::new(backend, channels))
    }

    /// How many polls of the `changes` table have failed since the store
    /// connected (each ends in a resync once polling works again).
    pub fn poll_failures(&self) -> u64 {
        self.backend().poll_failures.load(Ordering::Relaxed)
    }

    /// Announces the changes still queued for other processes (waiting up
    /// to 5 s), stops polling and closes the pool. Every clone of this
    /// store stops working.
    pub async fn close(&self) {
        if let Some(transport) = &self.backend().transport {
            transport.close().await;
        }
        self.backend().pool.close().await;
        self.backend().reader.close().await;
    }
}

/// The name of the lock that serializes migrations of one database.
const MIGRATION_LOCK: &str = "SELECT GET_LOCK(CONCAT('taskmesh-migrate:', DATABASE()), 60) AS got";

/// Applies pending migrations under a lock of our own: sqlx's migrator asks
/// for `GET_LOCK(…, -1)`, which MariaDB answers NULL at once (no infinite
/// wait there) and sqlx ignores, so replicas starting together raced to
/// apply the same migration. The lock is a session's, so the migrations run
/// on the connection that holds it.
async fn migrate(pool: &MySqlPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let got: Option<i64> = sqlx::query_scalar(MIGRATION_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if got != Some(1) {
        return Err(Error::Unavailable(
            "another process has held the migration lock of this database for 60 s".into(),
        ));
    }
    // `run_direct` on the connection itself: `run(&mut *conn)` makes the
    // future not `Send` for every lifetime (sqlx's `Acquire` bound).
    let result = MIGRATOR.run_direct(None, &mut *conn, false).await;
    let released = sqlx::query("SELECT RELEASE_LOCK(CONCAT('taskmesh-migrate:', DATABASE()))")
        .execute(&mut *conn)
        .await;
    result?;
    released?;
    Ok(())
}

crate::sql::sqlx_backend!(MysqlBackend, MySql, MySqlRow, reads: pool, {

    fn sql(&self) -> &'static Statements {
        SQL.get_or_init(|| Statements::render(&DIALECT))
    }

    async fn begin_write(&self) -> Result<Self::Tx> {
        Ok(self.pool.begin().await?)
    }

    async fn begin_read(&self) -> Result<Self::Tx> {
        // One snapshot for the whole read (READ COMMITTED, the writers'
        // level, takes one per statement): a task and its attempts agree.
        Ok(self
            .reader
            .begin_with("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await?)
    }

    async fn db_now(&self) -> Result<UnixMillis> {
        Ok(sqlx::query_scalar(DB_NOW).fetch_one(&self.pool).await?)
    }

    fn announce(&self, tasks: &[TaskChange], schedules: &[ScheduleChange]) {
        if let Some(transport) = &self.transport {
            transport.announce(tasks, schedules);
        }
    }
});
