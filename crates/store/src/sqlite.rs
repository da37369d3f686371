//! The SQLite backend of [`Store`](crate::Store): one file, WAL journal, one
//! writer connection and a small pool of readers.
//!
//! SQLite allows one writer at a time. Funnelling every write transaction
//! through a pool of exactly one connection queues writers in-process
//! instead of letting them collide on the file lock (no `SQLITE_BUSY`
//! storms), and `BEGIN IMMEDIATE` takes the write lock up front so a read
//! inside a write transaction can never be invalidated by another process.
//! Readers run on their own pool and, thanks to WAL, never wait for the
//! writer.
//!
//! Layout: this file opens the database; `rows` maps rows to records,
//! `tx` holds the statements run inside a write transaction, and
//! `store_impl` implements the trait on top of both.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::broadcast;

use crate::{Error, Result, ScheduleChange, TaskChange};

/// The `tasks` columns in the order [`rows::task_from_row`] reads them; a
/// macro so it can be spliced into `concat!`-built static SQL.
macro_rules! task_columns {
    () => {
        "id, handler, payload, content_type, state, priority, labels, routing_key, \
         client_request_id, request_fingerprint, callback_url, max_attempts, \
         initial_backoff_ms, backoff_multiplier, max_backoff_ms, timeout_ms, run_at, \
         created_at, updated_at, pending_at, ready_at, dispatching_at, running_at, \
         retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, \
         output, output_content_type, error_message, version, traceparent, balancer, \
         schedule_id"
    };
}

mod batch;
mod rows;
mod schedules;
mod store_impl;
#[cfg(test)]
mod tests;
mod tx;

/// The schema, embedded at compile time from `migrations/sqlite`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// Capacity of the change channel; a receiver further behind gets `Lagged`.
const CHANGE_CAPACITY: usize = 4096;

/// Name of the database file [`SqliteStore::open_in`] uses.
pub const DEFAULT_FILE_NAME: &str = "taskmesh.db";

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The database file; it and its parent directory are created if missing.
    pub path: PathBuf,
    /// `synchronous = FULL` (survives power loss) when true, `NORMAL` (may
    /// lose the last commits on power loss, never corrupts) when false.
    pub synchronous_full: bool,
    /// Size of the reader pool (at least 1).
    pub max_read_connections: u32,
    /// How long a statement waits for a lock held by another process.
    pub busy_timeout: Duration,
}

impl SqliteOptions {
    /// Options for the file at `path` with the defaults: durability first
    /// (`synchronous = FULL`), 4 readers, 5 s busy timeout.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            synchronous_full: true,
            max_read_connections: 4,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// A [`Store`](crate::Store) in one SQLite file. Cheap to clone: clones
/// share the pools and the change channel.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Exactly one connection: every write transaction goes through it.
    writer: SqlitePool,
    /// Read-only (`query_only`) connections for everything else.
    reader: SqlitePool,
    /// Committed changes, sent after each commit.
    changes: broadcast::Sender<TaskChange>,
    /// Committed schedule changes, sent after each commit.
    schedule_changes: broadcast::Sender<ScheduleChange>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database described by `opts`, applies
    /// pending migrations and returns the store.
    pub async fn open(opts: SqliteOptions) -> Result<Self> {
        if let Some(dir) = opts.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(dir).await.map_err(|e| {
                Error::Unavailable(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        let synchronous = if opts.synchronous_full {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        };
        // Statement journals (the undo log of one statement or savepoint
        // inside a transaction, written for every multi-row write) stay in
        // memory: they are never needed after a crash, and on disk they
        // cost a write() per page.
        let base = SqliteConnectOptions::new()
            .filename(&opts.path)
            .foreign_keys(true)
            .synchronous(synchronous)
            .busy_timeout(opts.busy_timeout)
            .pragma("temp_store", "MEMORY");

        // The writer creates the file and switches it to WAL (a persistent
        // setting) before any reader connects. Its one connection is kept
        // for the life of the store.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(
                base.clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    // A page cache of 64 MiB on the writer (the default is
                    // 2 MiB): under load the hot pages of the task table and
                    // its indexes no longer fall out between transactions,
                    // which cost a pread() each time they came back.
                    .pragma("cache_size", "-65536"),
            )
            .await?;
        MIGRATOR.run(&writer).await?;

        // Readers are read/write at the file level (so they can always map
        // the WAL index) but refuse writes with `query_only`.
        // Every reader opened now and kept (no idle timeout or lifetime):
        // reconnecting to a local file buys nothing, a lazy connect costs
        // the first requests latency, and connects and reaper timers would
        // disturb tests that run on tokio's paused clock.
        let reader = SqlitePoolOptions::new()
            .max_connections(opts.max_read_connections.max(1))
            .min_connections(opts.max_read_connections.max(1))
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(base.pragma("query_only", "ON"))
            .await?;

        let (changes, _) = broadcast::channel(CHANGE_CAPACITY);
        let (schedule_changes, _) = broadcast::channel(CHANGE_CAPACITY);
        tracing::debug!(path = %opts.path.display(), synchronous_full = opts.synchronous_full, "opened SQLite store");
        Ok(Self {
            writer,
            reader,
            changes,
            schedule_changes,
        })
    }

    /// Opens `taskmesh.db` inside `dir` with the default options.
    pub async fn open_in(dir: &Path) -> Result<Self> {
        Self::open(SqliteOptions::new(dir.join(DEFAULT_FILE_NAME))).await
    }

    /// Closes both pools, waiting for connections in use to be returned.
    /// Every clone of this store stops working.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    /// Sends the committed changes; nobody listening is fine.
    fn publish(&self, changes: impl IntoIterator<Item = TaskChange>) {
        for change in changes {
            let _ = self.changes.send(change);
        }
    }
}
