//! The Postgres backend of [`Store`](crate::Store): the store of a cluster,
//! shared by every `serve` replica.
//!
//! The algorithms are the one SQL implementation (`crate::sql`); this file
//! connects and is its [`Backend`](crate::sql::Backend): `$n` placeholders, `jsonb` columns,
//! row locks (`FOR UPDATE`, claims with `SKIP LOCKED`), the server's
//! `clock_timestamp()`, SQLSTATEs, and its wake-up transport. `unnest`
//! writes a whole batch in one statement of `UNNEST`ed arrays (the portable
//! form takes four round trips).
//!
//! Wake-ups: after each commit the changes go to this process's
//! subscribers at once and, through the outbox (`crate::wake`), to the
//! other processes by `pg_notify` in batches; `listen` relays theirs.
//! `scratch` makes throw-away schemas and databases for tests.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres};
use taskmesh_core::UnixMillis;

use crate::error::Kind;
use crate::sql::{Batch, BulkForm, Dialect, SqlStore, Statements};
use crate::wake::{Channels, Sink, Transport};
use crate::{Error, Result, ScheduleChange, TaskChange};

mod listen;
pub mod scratch;
#[cfg(test)]
mod tests;
mod unnest;

/// The schema, embedded at compile time from `migrations/postgres`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// Postgres's SQL: numbered placeholders, `jsonb` columns read as text,
/// row locks.
pub(crate) static DIALECT: Dialect = Dialect {
    name: "postgres",
    numbered: true,
    json_cast: "::jsonb",
    json_read: "{c}::text AS {c}",
    lock: " FOR UPDATE",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    false_lit: "FALSE",
    due_state: "state",
    ready_from: "tasks",
    concurrency_from: "tasks",
    ended_from: "tasks t",
    in_flight_from: "tasks",
    unheld: crate::sql::PARTIAL_UNHELD,
    ended_workflows_from: "workflows w",
    bulk: BulkForm::ValuesAliased,
    ignore_duplicate: " ON CONFLICT ({k}) DO NOTHING",
};

static SQL: OnceLock<Statements> = OnceLock::new();

/// The database's clock in unix milliseconds: `clock_timestamp()` is the
/// time of the call, not of the transaction's start.
const DB_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Sends notification payloads (on their own, after the commits).
const NOTIFY: &str = "SELECT pg_notify($1, p) FROM UNNEST($2::text[]) AS p";

/// Postgres SQLSTATEs: class 08 (connection exception), 57P01..03 (admin
/// shutdown, crash shutdown, cannot connect now) and class 53
/// (insufficient resources: disk full, too many connections) are
/// `Unavailable`; serialization failure and deadlock (the transaction was
/// rolled back; trying again may succeed) `Conflict`; unique violation
/// `AlreadyExists`.
pub(crate) fn error_kind(code: &str) -> Kind {
    match code {
        // disk_full; the rest of class 53 (out of memory, too many
        // connections) is the server's trouble, not lasting.
        "53100" => Kind::StorageFull,
        c if c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") => {
            Kind::Unavailable
        }
        "40001" | "40P01" => Kind::Conflict,
        "23505" => Kind::AlreadyExists,
        _ => Kind::Internal,
    }
}

/// Longest schema name accepted: the notification channel is derived from
/// it and Postgres identifiers stop at 63 bytes.
const MAX_SCHEMA_LEN: usize = 48;

/// How to connect a [`PostgresStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// `postgres://user:password@host:port/database?…`.
    pub url: String,
    /// Size of the connection pool (at least 1). The LISTEN connection
    /// comes on top.
    pub max_connections: u32,
    /// Connections opened at once and kept.
    pub min_connections: u32,
    /// How long a call waits for a free connection before it fails with
    /// [`Error::Unavailable`].
    pub acquire_timeout: Duration,
    /// The schema holding taskmesh's tables, created if missing and set as
    /// every connection's `search_path`; `None` uses the server's default
    /// (usually `public`). Lower-case letters, digits and `_`, at most 48
    /// bytes. Two stores on one database with different schemas are fully
    /// separate, notifications included.
    pub schema: Option<String>,
    /// Send changes to other processes with NOTIFY and listen for theirs.
    /// Off, a store sees only its own changes (one process per database).
    pub notify: bool,
}

impl PostgresOptions {
    /// Options for `url` with the defaults: 16 connections, none kept idle,
    /// 5 s acquire timeout, the default schema, notifications on.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 16,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(5),
            schema: None,
            notify: true,
        }
    }

    /// These options with `schema`.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Checks the options; returns the parsed connect options.
    fn validate(&self) -> Result<PgConnectOptions> {
        if self.max_connections == 0 {
            return Err(Error::InvalidArgument(
                "postgres max_connections must be at least 1".into(),
            ));
        }
        if let Some(schema) = &self.schema {
            validate_schema(schema)?;
        }
        let mut connect: PgConnectOptions = self
            .url
            .parse()
            .map_err(|e| Error::InvalidArgument(format!("bad postgres url: {e}")))?;
        // Every statement stays prepared (about 150 texts with the ladder
        // sizes; sqlx keeps 100 by default and re-prepares what it evicts).
        connect = connect
            .application_name("taskmesh")
            .statement_cache_capacity(crate::sql::STATEMENT_CACHE);
        if let Some(schema) = &self.schema {
            connect = connect.options([("search_path", schema.as_str())]);
        }
        Ok(connect)
    }
}

/// Schema names are spliced into SQL (`CREATE SCHEMA`) and connection
/// options, so only plain lower-case identifiers are accepted.
fn validate_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= MAX_SCHEMA_LEN
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !schema.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "bad postgres schema {schema:?}: use 1 to {MAX_SCHEMA_LEN} lower-case letters, \
             digits and '_', starting with a letter or '_', not 'pg_'"
        )))
    }
}

/// A [`Store`](crate::Store) in a Postgres database. Cheap to clone:
/// clones share the pool, the change channels and the listener, which
/// stops when the last clone is dropped.
pub type PostgresStore = SqlStore<PostgresBackend>;

/// The Postgres [`Backend`](crate::sql::Backend).
#[derive(Debug)]
pub struct PostgresBackend {
    pub(crate) pool: PgPool,
    /// NOTIFY channel of this database and schema, if notifications are on.
    channel: Option<String>,
    /// Server process id of the LISTEN connection (0 while there is none).
    listener_pid: Arc<AtomicU32>,
    transport: Option<Transport>,
}

struct NotifySink {
    pool: PgPool,
    channel: String,
}

#[async_trait]
impl Sink for NotifySink {
    async fn send(&self, payloads: Vec<String>) -> Result<(), sqlx::Error> {
        sqlx::query(NOTIFY)
            .bind(&self.channel)
            .bind(payloads)
            .execute(&self.pool)
            .await
            .map(|_| ())
    }
}

impl SqlStore<PostgresBackend> {
    /// Connects to the database described by `opts`, creates the schema if
    /// asked, applies pending migrations, starts listening for other
    /// processes' changes and returns the store. Fails with
    /// [`Error::Unavailable`] when the server cannot be reached and
    /// [`Error::InvalidArgument`] for bad options.
    pub async fn connect(opts: PostgresOptions) -> Result<Self> {
        let connect = opts.validate()?;
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .min_connections(opts.min_connections.min(opts.max_connections))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect.clone())
            .await?;
        if let Some(schema) = &opts.schema {
            create_schema(&pool, schema).await?;
        }
        MIGRATOR.run(&pool).await?;
        let channels = Arc::new(Channels::new());
        let listener_pid = Arc::new(AtomicU32::new(0));
        let channel = opts
            .notify
            .then(|| listen::channel_name(opts.schema.as_deref()));
        let mut transport = None;
        if let Some(channel) = &channel {
            let origin = Transport::new_origin();
            // Listening before `connect` returns: everything committed
            // after it is relayed to subscribers.
            let listen = listen::Listen {
                channel: channel.clone(),
                origin: origin.clone(),
                channels: Arc::downgrade(&channels),
                pid: listener_pid.clone(),
            };
            let receiver = listen::start_listener(connect, listen).await?;
            let sink = NotifySink {
                pool: pool.clone(),
                channel: channel.clone(),
            };
            transport = Some(Transport::start(origin, sink, receiver));
        }
        tracing::debug!(schema = ?opts.schema, notify = opts.notify, "connected Postgres store");
        let backend = PostgresBackend {
            pool,
            channel,
            listener_pid,
            transport,
        };
        Ok(SqlStore::new(backend, channels))
    }

    /// Announces the changes still queued for other processes (waiting up
    /// to 5 s), stops listening and closes the pool, waiting for
    /// connections in use to be returned. Every clone of this store stops
    /// working.
    pub async fn close(&self) {
        if let Some(transport) = &self.backend().transport {
            transport.close().await;
        }
        self.backend().pool.close().await;
    }

    /// The NOTIFY channel this store sends and listens on (`None` with
    /// notifications off).
    pub fn channel(&self) -> Option<&str> {
        self.backend().channel.as_deref()
    }

    /// The server process id of the LISTEN connection, if connected (for
    /// operators and tests: terminating it exercises the reconnect).
    pub fn listener_backend_pid(&self) -> Option<u32> {
        match self.backend().listener_pid.load(Ordering::SeqCst) {
            0 => None,
            pid => Some(pid),
        }
    }
}

crate::sql::sqlx_backend!(PostgresBackend, Postgres, PgRow, reads: pool, {

    fn sql(&self) -> &'static Statements {
        SQL.get_or_init(|| Statements::render(&DIALECT))
    }

    async fn begin_write(&self) -> Result<Self::Tx> {
        Ok(self.pool.begin().await?)
    }

    async fn begin_read(&self) -> Result<Self::Tx> {
        // One snapshot for the whole read (READ COMMITTED takes one per
        // statement): a task and its attempts always agree.
        Ok(self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
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

    async fn write_batch(
        &self,
        tx: &mut Self::Tx,
        batch: &Batch,
    ) -> Result<std::collections::HashSet<String>> {
        Ok(unnest::write(batch, tx).await?)
    }
});

/// Creates `schema` unless it exists. Under a transaction-scoped advisory
/// lock, because `CREATE SCHEMA IF NOT EXISTS` run by two replicas starting
/// at once can still collide on the catalog's unique index.
async fn create_schema(pool: &PgPool, schema: &str) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('taskmesh create schema ' || $1))")
        .bind(schema)
        .execute(&mut *tx)
        .await?;
    // `schema` passed `validate_schema`: a plain lower-case identifier.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}"
    )))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
