//! The Postgres backend of [`Store`](crate::Store): the store of a cluster,
//! shared by every `serve` replica.
//!
//! Concurrency is Postgres's: row locks and compare-and-set on `version`,
//! no in-process writer queue. Claims read READY candidates with
//! `SELECT … FOR UPDATE SKIP LOCKED`, so replicas claiming at once each get
//! different tasks without waiting for each other. Batched writes
//! (`transition_many`, claims) lock their rows, apply the events in memory
//! and write the whole batch with one statement of `UNNEST`ed arrays, so a
//! batch costs a handful of round trips whatever its size.
//!
//! After each commit, the [`TaskChange`]s and [`ScheduleChange`]s go to
//! this process's subscribers at once and to the other processes by
//! `pg_notify`, sent in batches by one task (`outbox`: why not inside the
//! writing transaction is explained there). Each store LISTENs on its
//! channel and feeds its broadcast channels with what other processes
//! committed, so a replica wakes up for work another one wrote without
//! polling.
//!
//! Layout: this file connects; `sql` holds the statements, `tx` the
//! per-row statements run inside a transaction, `batch` the one-statement
//! batch writer, `transitions` the batches of events, `claims` the claim,
//! `callbacks` the callback outbox, `outbox` and `notify` the two halves
//! of the notifications, `store_impl` and `schedules` the trait, `scratch`
//! throw-away schemas for tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::broadcast;

use crate::{Error, Result, ScheduleChange, TaskChange};

mod batch;
mod callbacks;
mod claims;
mod create;
mod notify;
mod outbox;
mod schedules;
pub mod scratch;
mod sql;
mod store_impl;
#[cfg(test)]
mod tests;
mod transitions;
mod tx;

/// The schema, embedded at compile time from `migrations/postgres`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// Capacity of the change channels; a receiver further behind gets `Lagged`.
const CHANGE_CAPACITY: usize = 4096;

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
        connect = connect.application_name("taskmesh");
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

/// A [`Store`](crate::Store) in a Postgres database. Cheap to clone: clones
/// share the pool, the change channels and the listener, which stops when
/// the last clone is dropped.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    shared: Arc<Shared>,
}

/// What every clone of a store shares.
#[derive(Debug)]
struct Shared {
    /// Committed task changes, this process's and (relayed) others'.
    changes: broadcast::Sender<TaskChange>,
    /// Committed schedule changes, likewise.
    schedule_changes: broadcast::Sender<ScheduleChange>,
    /// NOTIFY channel of this database and schema, if notifications are on.
    channel: Option<String>,
    /// Sent in every payload so the listener skips this store's own
    /// changes (already published locally, right after the commit).
    origin: String,
    /// Backend process id of the LISTEN connection (0 while there is none).
    listener_pid: AtomicU32,
    /// The listener task, stopped with the store.
    listener: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// Changes for the other processes, if notifications are on.
    outbox: Option<Arc<outbox::Outbox>>,
    /// The task sending the outbox; it sends what is queued and stops once
    /// the outbox is closed.
    sender: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = self.listener.lock().ok().and_then(|mut l| l.take()) {
            task.abort();
        }
        if let Some(outbox) = &self.outbox {
            outbox.close();
        }
    }
}

impl PostgresStore {
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

        let (changes, _) = broadcast::channel(CHANGE_CAPACITY);
        let (schedule_changes, _) = broadcast::channel(CHANGE_CAPACITY);
        let channel = opts
            .notify
            .then(|| notify::channel_name(opts.schema.as_deref()));
        let origin = taskmesh_core::id::new_session_id();
        let outbox = channel.as_ref().map(|_| Arc::new(outbox::Outbox::new()));
        let shared = Arc::new(Shared {
            changes,
            schedule_changes,
            channel: channel.clone(),
            origin: origin.clone(),
            listener_pid: AtomicU32::new(0),
            listener: std::sync::Mutex::new(None),
            outbox: outbox.clone(),
            sender: std::sync::Mutex::new(None),
        });
        if let (Some(channel), Some(outbox)) = (channel, outbox) {
            // Listening before `connect` returns: everything committed
            // after it is relayed to subscribers.
            let task = notify::start_listener(connect, channel.clone(), &shared).await?;
            if let Ok(mut slot) = shared.listener.lock() {
                *slot = Some(task);
            }
            let sender = tokio::spawn(outbox::run(outbox, pool.clone(), channel, origin));
            if let Ok(mut slot) = shared.sender.lock() {
                *slot = Some(sender);
            }
        }
        tracing::debug!(schema = ?opts.schema, notify = opts.notify, "connected Postgres store");
        Ok(Self { pool, shared })
    }

    /// Announces the changes still queued for other processes (waiting up
    /// to 5 s), stops listening and closes the pool, waiting for
    /// connections in use to be returned. Every clone of this store stops
    /// working.
    pub async fn close(&self) {
        if let Some(outbox) = &self.shared.outbox {
            outbox.close();
        }
        let sender = self.shared.sender.lock().ok().and_then(|mut s| s.take());
        if let Some(sender) = sender
            && tokio::time::timeout(Duration::from_secs(5), sender)
                .await
                .is_err()
        {
            tracing::warn!("gave up announcing the last changes to other processes");
        }
        if let Some(task) = self.shared.listener.lock().ok().and_then(|mut l| l.take()) {
            task.abort();
        }
        self.pool.close().await;
    }

    /// The NOTIFY channel this store sends and listens on (`None` with
    /// notifications off).
    pub fn channel(&self) -> Option<&str> {
        self.shared.channel.as_deref()
    }

    /// The server process id of the LISTEN connection, if connected (for
    /// operators and tests: terminating it exercises the reconnect).
    pub fn listener_backend_pid(&self) -> Option<u32> {
        match self.shared.listener_pid.load(Ordering::SeqCst) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// Publishes committed changes to this process's subscribers and
    /// queues them for the other processes.
    fn publish(
        &self,
        tasks: impl IntoIterator<Item = TaskChange>,
        schedules: impl IntoIterator<Item = ScheduleChange>,
    ) {
        let tasks: Vec<TaskChange> = tasks.into_iter().collect();
        let schedules: Vec<ScheduleChange> = schedules.into_iter().collect();
        for change in &tasks {
            let _ = self.shared.changes.send(change.clone());
        }
        for change in &schedules {
            let _ = self.shared.schedule_changes.send(change.clone());
        }
        if let Some(outbox) = &self.shared.outbox {
            outbox.push(tasks, schedules);
        }
    }
}

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
