//! The SQLite writer: one connection, owned by the store, on which every
//! write transaction runs in the caller's own thread.
//!
//! sqlx's SQLite driver runs each statement on a worker thread of its own
//! and hands every row back over a channel: a write transaction of five
//! statements was ten thread hops, each a wake-up of an idle thread at light
//! load and a copy of every column (`sqlite3_value_dup`) under load. Here a
//! transaction holds the connection (a FIFO mutex queues writers, as the
//! one-connection pool did) and steps its statements directly, prepared
//! once and cached. A statement on a local file takes microseconds; the
//! commit's fsync is the only wait, and it happened on a thread before too.
//!
//! A [`WriteTx`] dropped without [`WriteTx::commit`] rolls back, as an sqlx
//! transaction does. Errors are SQLite's own codes wrapped as an sqlx
//! database error ([`WriterError`]), so the store's error table reads them
//! like the driver's.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::decode::Columns;
use crate::sql::{Args, Val};

/// Settings of the writer connection.
#[derive(Debug, Clone)]
pub(crate) struct WriterSettings {
    pub synchronous_full: bool,
    pub busy_timeout: Duration,
    /// Prepared statements kept (every text the store runs).
    pub statements: usize,
}

/// The writer connection; `None` once the store is closed.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    conn: Arc<Mutex<Option<Connection>>>,
}

impl Writer {
    /// Opens the file at `path` (which the migrations created) as the writer.
    pub(crate) fn open(path: &Path, settings: &WriterSettings) -> Result<Self, sqlx::Error> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(to_sqlx)?;
        conn.busy_timeout(settings.busy_timeout).map_err(to_sqlx)?;
        let synchronous = if settings.synchronous_full {
            "FULL"
        } else {
            "NORMAL"
        };
        // The same settings the sqlx connections get (see `SqliteStore::open`
        // for why each): WAL, durability, foreign keys, statement journals in
        // memory, and a 16 MiB page cache.
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; \
             PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; \
             PRAGMA cache_size = -16384;"
        ))
        .map_err(to_sqlx)?;
        conn.set_prepared_statement_cache_capacity(settings.statements);
        Ok(Self {
            conn: Arc::new(Mutex::new(Some(conn))),
        })
    }

    /// Waits for the connection (writers queue in arrival order) and starts
    /// a write transaction with `BEGIN IMMEDIATE`.
    pub(crate) async fn begin(&self) -> Result<WriteTx, sqlx::Error> {
        let guard = Arc::clone(&self.conn).lock_owned().await;
        let Some(conn) = guard.as_ref() else {
            return Err(sqlx::Error::PoolClosed);
        };
        if !conn.is_autocommit() {
            // A transaction a panic left open: never build on it.
            let _ = conn.execute_batch("ROLLBACK");
        }
        conn.execute_batch("BEGIN IMMEDIATE").map_err(to_sqlx)?;
        Ok(WriteTx {
            guard,
            since: Instant::now(),
        })
    }

    /// Runs `f` on the connection outside any transaction (tests).
    #[cfg(test)]
    pub(crate) async fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, sqlx::Error> {
        let guard = self.conn.lock().await;
        let conn = guard.as_ref().ok_or(sqlx::Error::PoolClosed)?;
        f(conn).map_err(to_sqlx)
    }

    /// Closes the connection, once the transaction in progress (if any) has
    /// ended; every later `begin` answers that the store is closed.
    pub(crate) async fn close(&self) {
        let mut guard = self.conn.lock().await;
        if let Some(conn) = guard.take()
            && let Err((_, err)) = conn.close()
        {
            tracing::warn!(error = %err, "closing the SQLite writer");
        }
    }
}

/// A write transaction on the writer connection, held until it ends.
#[derive(Debug)]
pub struct WriteTx {
    guard: OwnedMutexGuard<Option<Connection>>,
    /// When it began: the time a transaction holds the writer is counted
    /// in [`held`].
    since: Instant,
}

/// Write transactions ended, and the time they held a writer in µs: every
/// SQLite store of the process together.
static HELD: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));

/// How many write transactions have ended (committed or not) on the
/// SQLite writers of this process, and how long they held them in all:
/// the second over wall time is the writer's utilisation, which the
/// latency bench reports per window. One addition per transaction.
pub fn held() -> (u64, Duration) {
    (
        HELD.0.load(Ordering::Relaxed),
        Duration::from_micros(HELD.1.load(Ordering::Relaxed)),
    )
}

impl WriteTx {
    fn conn(&self) -> &Connection {
        self.guard
            .as_ref()
            .expect("a transaction holds an open connection")
    }

    /// Runs a statement; returns the rows it changed.
    pub(crate) fn exec(&mut self, sql: &str, args: Args) -> Result<u64, sqlx::Error> {
        let mut stmt = self.conn().prepare_cached(sql).map_err(to_sqlx)?;
        bind(&mut stmt, args)?;
        let changed = stmt.raw_execute().map_err(to_sqlx)?;
        Ok(changed as u64)
    }

    /// Runs a query and copies out its rows.
    pub(crate) fn fetch(&mut self, sql: &str, args: Args) -> Result<Vec<OwnedRow>, sqlx::Error> {
        let mut stmt = self.conn().prepare_cached(sql).map_err(to_sqlx)?;
        let names: Arc<[String]> = stmt.column_names().into_iter().map(String::from).collect();
        bind(&mut stmt, args)?;
        let width = names.len();
        let mut rows = stmt.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(to_sqlx)? {
            let mut values = Vec::with_capacity(width);
            for i in 0..width {
                let value = row.get_ref(i).map_err(to_sqlx)?;
                values.push(Value::try_from(value).map_err(|e| to_sqlx(e.into()))?);
            }
            out.push(OwnedRow {
                names: Arc::clone(&names),
                values,
            });
        }
        Ok(out)
    }

    /// Runs statements without arguments (savepoints).
    pub(crate) fn raw(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        self.conn().execute_batch(sql).map_err(to_sqlx)
    }

    /// Commits; on failure the transaction is rolled back when dropped.
    pub(crate) fn commit(self) -> Result<(), sqlx::Error> {
        self.conn().execute_batch("COMMIT").map_err(to_sqlx)
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        HELD.0.fetch_add(1, Ordering::Relaxed);
        HELD.1.fetch_add(
            u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if let Some(conn) = self.guard.as_ref()
            && !conn.is_autocommit()
            && let Err(err) = conn.execute_batch("ROLLBACK")
        {
            tracing::warn!(error = %err, "rolling back an unfinished SQLite write");
        }
    }
}

fn bind(stmt: &mut rusqlite::CachedStatement<'_>, args: Args) -> Result<(), sqlx::Error> {
    let expected = stmt.parameter_count();
    if args.len() != expected {
        return Err(sqlx::Error::Protocol(format!(
            "statement has {expected} placeholders, {} values given",
            args.len()
        )));
    }
    for (i, v) in args.into_iter().enumerate() {
        let value = match v {
            Val::Int(v) => v.map_or(Value::Null, Value::Integer),
            Val::Int32(v) => Value::Integer(i64::from(v)),
            Val::Float(v) => Value::Real(v),
            Val::Text(v) => v.map_or(Value::Null, Value::Text),
            Val::Bytes(v) => v.map_or(Value::Null, Value::Blob),
            Val::Bool(v) => Value::Integer(i64::from(v)),
        };
        stmt.raw_bind_parameter(i + 1, value).map_err(to_sqlx)?;
    }
    Ok(())
}

/// A row read on the writer, its values copied out of SQLite.
#[derive(Debug, Clone)]
pub struct OwnedRow {
    names: Arc<[String]>,
    values: Vec<Value>,
}

impl OwnedRow {
    fn get(&self, col: &str) -> Result<&Value, String> {
        self.names
            .iter()
            .position(|n| n == col)
            .map(|i| &self.values[i])
            .ok_or_else(|| format!("no column named {col:?}"))
    }
}

fn mismatch(col: &str, want: &str, got: &Value) -> String {
    let got = match ValueRef::from(got) {
        ValueRef::Null => "NULL",
        ValueRef::Integer(_) => "INTEGER",
        ValueRef::Real(_) => "REAL",
        ValueRef::Text(_) => "TEXT",
        ValueRef::Blob(_) => "BLOB",
    };
    format!("column {col:?}: expected {want}, found {got}")
}

impl Columns for OwnedRow {
    fn text(&self, col: &str) -> Result<String, String> {
        self.opt_text(col)?
            .ok_or_else(|| mismatch(col, "TEXT", &Value::Null))
    }
    fn opt_text(&self, col: &str) -> Result<Option<String>, String> {
        match self.get(col)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            other => Err(mismatch(col, "TEXT", other)),
        }
    }
    fn int(&self, col: &str) -> Result<i64, String> {
        self.opt_int(col)?
            .ok_or_else(|| mismatch(col, "INTEGER", &Value::Null))
    }
    fn opt_int(&self, col: &str) -> Result<Option<i64>, String> {
        match self.get(col)? {
            Value::Null => Ok(None),
            Value::Integer(v) => Ok(Some(*v)),
            other => Err(mismatch(col, "INTEGER", other)),
        }
    }
    fn int32(&self, col: &str) -> Result<i32, String> {
        let v = self.int(col)?;
        i32::try_from(v).map_err(|_| format!("column {col:?}: {v} is out of range for INT"))
    }
    fn float(&self, col: &str) -> Result<f64, String> {
        match self.get(col)? {
            Value::Real(v) => Ok(*v),
            Value::Integer(v) => Ok(*v as f64),
            other => Err(mismatch(col, "REAL", other)),
        }
    }
    fn bytes(&self, col: &str) -> Result<Vec<u8>, String> {
        self.opt_bytes(col)?
            .ok_or_else(|| mismatch(col, "BLOB", &Value::Null))
    }
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, String> {
        match self.get(col)? {
            Value::Null => Ok(None),
            Value::Blob(b) => Ok(Some(b.clone())),
            Value::Text(s) => Ok(Some(s.clone().into_bytes())),
            other => Err(mismatch(col, "BLOB", other)),
        }
    }
    fn flag(&self, col: &str) -> Result<bool, String> {
        Ok(self.int(col)? != 0)
    }
}

/// An error SQLite returned on the writer: its extended result code and
/// message, as an sqlx database error.
#[derive(Debug)]
pub struct WriterError {
    code: String,
    extended: i32,
    message: String,
}

impl WriterError {
    /// SQLite's extended result code.
    pub fn extended_code(&self) -> i32 {
        self.extended
    }
}

impl std::fmt::Display for WriterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(code: {}) {}", self.code, self.message)
    }
}

impl std::error::Error for WriterError {}

impl sqlx::error::DatabaseError for WriterError {
    fn message(&self) -> &str {
        &self.message
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.code))
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.extended {
            2067 | 1555 => ErrorKind::UniqueViolation,
            787 => ErrorKind::ForeignKeyViolation,
            1299 => ErrorKind::NotNullViolation,
            275 => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// SQLite's failures become database errors with their codes; anything
/// else rusqlite reports (a type it cannot convert, a misuse) is a protocol
/// error, which the store counts as internal.
pub(crate) fn to_sqlx(err: rusqlite::Error) -> sqlx::Error {
    match err {
        rusqlite::Error::SqliteFailure(e, message) => {
            let message = message.unwrap_or_else(|| e.to_string());
            sqlx::Error::Database(Box::new(WriterError {
                code: e.extended_code.to_string(),
                extended: e.extended_code,
                message,
            }))
        }
        other => sqlx::Error::Protocol(other.to_string()),
    }
}
