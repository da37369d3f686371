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
//! Everything else is the one SQL implementation (`crate::sql`); this file
//! opens the database and is its [`Backend`](crate::sql::Backend): the dialect (`?`
//! placeholders, no row locks, planner hints), transactions on the two
//! pools, the process clock, and SQLite's error codes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Sqlite, SqlitePool};
use taskmesh_core::{Clock, SystemClock, UnixMillis};

use crate::decode::Columns;
use crate::error::Kind;
use crate::sql::{Args, BulkForm, Dialect, SqlStore, Statements};
use crate::wake::Channels;
use crate::{Error, Result, ScheduleChange, TaskChange};

#[cfg(test)]
mod tests;
mod writer;

pub use writer::{OwnedRow, WriteTx, WriterError, held as writer_held, wal_syncs};
pub(crate) use writer::{Writer, WriterSettings};

/// The schema, embedded at compile time from `migrations/sqlite`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// SQLite's SQL: `?` placeholders; no row locks (one writer holds the whole
/// file from `BEGIN IMMEDIATE`); planner hints where, without statistics,
/// it would leave the partial index made for a query.
pub(crate) static DIALECT: Dialect = Dialect {
    name: "sqlite",
    numbered: false,
    json_cast: "",
    json_read: "{c}",
    lock: "",
    skip_locked: "",
    false_lit: "0",
    // The unary `+` keeps the planner on `tasks_next_at`.
    due_state: "+state",
    // Without statistics the planner may prefer a full index of the state
    // (`tasks_namespace_state_id_unheld`), which needs a table lookup per row and
    // a sort.
    ready_from: "tasks INDEXED BY tasks_ready_claim",
    concurrency_from: "tasks",
    ended_from: "tasks t INDEXED BY tasks_ended",
    ended_workflows_from: "workflows w INDEXED BY workflows_ended",
    in_flight_from: "tasks INDEXED BY tasks_in_flight",
    unheld: crate::sql::PARTIAL_UNHELD,
    bulk: BulkForm::ValuesNumbered,
    ignore_duplicate: " ON CONFLICT ({k}) DO NOTHING",
};

static SQL: OnceLock<Statements> = OnceLock::new();

/// Name of the database file [`SqliteStore::open_in`] uses.
pub const DEFAULT_FILE_NAME: &str = "taskmesh.db";

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The database file; it and its parent directory are created if missing.
    pub path: PathBuf,
    /// Every commit survives power loss before its caller is answered when
    /// true (the writer's own thread syncs the WAL; `sqlite/writer.rs`);
    /// when false, `synchronous = NORMAL` alone (may lose the last commits
    /// on power loss, never corrupts).
    pub synchronous_full: bool,
    /// Size of the reader pool (at least 1).
    pub max_read_connections: u32,
    /// How long a statement waits for a lock held by another process.
    pub busy_timeout: Duration,
}

impl SqliteOptions {
    /// Options for the file at `path` with the defaults: durability first
    /// (every commit synced before it is answered), 4 readers, 5 s busy
    /// timeout.
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
/// share the pools and the change channels.
pub type SqliteStore = SqlStore<SqliteBackend>;

/// The SQLite [`Backend`](crate::sql::Backend): one writer connection,
/// through which every write transaction goes in its caller's thread
/// (`sqlite/writer.rs`), and a pool of `query_only` readers.
#[derive(Debug)]
pub struct SqliteBackend {
    pub(crate) writer: Writer,
    pub(crate) reader: SqlitePool,
}

impl SqlStore<SqliteBackend> {
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
            .pragma("temp_store", "MEMORY")
            // Every statement stays prepared: with the ladder sizes the
            // store has about 150 texts, over sqlx's default of 100, and a
            // cache that evicts re-parses multi-row statements of thousands
            // of placeholders (measured: 1.1 prepares per task at 1,000
            // tasks/s with 100).
            .statement_cache_capacity(crate::sql::STATEMENT_CACHE);

        // The migrations run on a connection of sqlx's (its migrator), which
        // creates the file and switches it to WAL (a persistent setting)
        // before the writer or any reader opens it.
        let migrations = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(
                base.clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal),
            )
            .await?;
        MIGRATOR.run(&migrations).await?;
        migrations.close().await;

        // The writer keeps a page cache of 16 MiB (the default is 2 MiB):
        // under load the hot pages of the task table and its indexes no
        // longer fall out between transactions, which cost a pread() each
        // time they came back. Not more: every COMMIT scans the cache's hash
        // table (pcache1TruncateUnsafe, 5 % of the CPU at 64 MiB), and
        // 64 MiB drained 21 % fewer tasks/s than 16 MiB (docs/BENCHMARKS.md).
        let writer = Writer::open(
            &opts.path,
            &WriterSettings {
                synchronous_full: opts.synchronous_full,
                busy_timeout: opts.busy_timeout,
                statements: crate::sql::STATEMENT_CACHE,
                before_sync: None,
            },
        )?;

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

        tracing::debug!(path = %opts.path.display(), synchronous_full = opts.synchronous_full, "opened SQLite store");
        Ok(SqlStore::new(
            SqliteBackend { writer, reader },
            Arc::new(Channels::new()),
        ))
    }

    /// Opens `taskmesh.db` inside `dir` with the default options.
    pub async fn open_in(dir: &Path) -> Result<Self> {
        Self::open(SqliteOptions::new(dir.join(DEFAULT_FILE_NAME))).await
    }

    /// Closes both pools, waiting for connections in use to be returned.
    /// Every clone of this store stops working.
    pub async fn close(&self) {
        self.backend().writer.close().await;
        self.backend().reader.close().await;
    }
}

/// SQLite's result codes: BUSY (5), LOCKED (6), FULL (13), CANTOPEN (14)
/// and their extended codes are `Unavailable`; CONSTRAINT_UNIQUE (2067) and
/// CONSTRAINT_PRIMARYKEY (1555) are `AlreadyExists`. `err` is the readers'
/// (sqlx's) or the writer's error.
pub(crate) fn error_kind(err: &dyn DatabaseError) -> Kind {
    match err.code().as_deref() {
        // SQLITE_FULL: the disk (or the file's size limit) is full.
        Some("13") => Kind::StorageFull,
        Some("5" | "6" | "14" | "517" | "261" | "262") => Kind::Unavailable,
        Some("2067" | "1555") => Kind::AlreadyExists,
        _ if err.is_unique_violation() => Kind::AlreadyExists,
        _ => Kind::Internal,
    }
}

/// A transaction: a write on the writer connection, or a snapshot read on
/// the reader pool.
#[derive(Debug)]
pub enum SqliteTx {
    Write(WriteTx),
    Read(sqlx::Transaction<'static, Sqlite>),
}

/// A row from the writer (copied out) or from a reader (sqlx's).
#[derive(Debug)]
pub enum SqliteRecord {
    Written(OwnedRow),
    Read(SqliteRow),
}

/// Each [`Columns`] method of [`SqliteRecord`] asks the row it holds.
macro_rules! delegate_columns {
    ($($name:ident -> $t:ty),* $(,)?) => {
        impl Columns for SqliteRecord {
            $(fn $name(&self, col: &str) -> Result<$t, String> {
                match self {
                    Self::Written(r) => r.$name(col),
                    Self::Read(r) => r.$name(col),
                }
            })*
        }
    };
}

delegate_columns! {
    text -> String,
    opt_text -> Option<String>,
    int -> i64,
    opt_int -> Option<i64>,
    int32 -> i32,
    float -> f64,
    bytes -> Vec<u8>,
    opt_bytes -> Option<Vec<u8>>,
    flag -> bool,
}

fn read_rows(rows: Vec<SqliteRow>) -> Vec<SqliteRecord> {
    rows.into_iter().map(SqliteRecord::Read).collect()
}

#[async_trait::async_trait]
impl crate::sql::Backend for SqliteBackend {
    type Tx = SqliteTx;
    type Row = SqliteRecord;

    fn sql(&self) -> &'static Statements {
        SQL.get_or_init(|| Statements::render(&DIALECT))
    }

    async fn begin_write(&self) -> Result<Self::Tx> {
        // The write lock now: a read inside the transaction can never be
        // invalidated by another process writing the file.
        Ok(SqliteTx::Write(self.writer.begin().await?))
    }

    async fn begin_read(&self) -> Result<Self::Tx> {
        Ok(SqliteTx::Read(self.reader.begin().await?))
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        match tx {
            SqliteTx::Write(tx) => Ok(tx.commit().await?),
            SqliteTx::Read(tx) => Ok(tx.commit().await?),
        }
    }

    async fn exec(&self, tx: &mut Self::Tx, sql: &'static str, args: Args) -> sqlx::Result<u64> {
        match tx {
            SqliteTx::Write(tx) => tx.exec(sql, args),
            SqliteTx::Read(tx) => {
                let q = crate::sql::bind_all(sqlx::query(sql), args);
                Ok(q.execute(&mut **tx).await?.rows_affected())
            }
        }
    }

    async fn fetch(
        &self,
        tx: &mut Self::Tx,
        sql: &'static str,
        args: Args,
    ) -> sqlx::Result<Vec<SqliteRecord>> {
        match tx {
            SqliteTx::Write(tx) => Ok(tx
                .fetch(sql, args)?
                .into_iter()
                .map(SqliteRecord::Written)
                .collect()),
            SqliteTx::Read(tx) => crate::sql::bind_all(sqlx::query(sql), args)
                .fetch_all(&mut **tx)
                .await
                .map(read_rows),
        }
    }

    async fn raw(&self, tx: &mut Self::Tx, sql: &'static str) -> sqlx::Result<()> {
        match tx {
            SqliteTx::Write(tx) => tx.raw(sql),
            SqliteTx::Read(tx) => sqlx::raw_sql(sql).execute(&mut **tx).await.map(|_| ()),
        }
    }

    async fn read(&self, sql: &'static str, args: Args) -> sqlx::Result<Vec<SqliteRecord>> {
        crate::sql::bind_all(sqlx::query(sql), args)
            .fetch_all(&self.reader)
            .await
            .map(read_rows)
    }

    async fn db_now(&self) -> Result<UnixMillis> {
        // One node: the process is the database.
        Ok(SystemClock.now_millis())
    }

    fn announce(&self, _tasks: &[TaskChange], _schedules: &[ScheduleChange]) {
        // One process owns the file: nobody else to tell.
    }
}
