//! The SQLite writer: one connection, owned by the store, on which every
//! write transaction runs in the caller's own thread.
//!
//! sqlx's SQLite driver runs each statement on a worker thread of its own
//! and hands every row back over a channel: a write transaction of five
//! statements was ten thread hops, each a wake-up of an idle thread at light
//! load and a copy of every column (`sqlite3_value_dup`) under load. Here a
//! transaction holds the connection (a FIFO mutex queues writers, as the
//! one-connection pool did) and steps its statements directly, prepared
//! once and cached. A statement on a local file takes microseconds.
//!
//! The commit's sync, the one wait, is not done while the writer is held
//! (nor on a runtime thread). With
//! `synchronous_full` the connection runs `synchronous = NORMAL` (SQLite
//! writes a commit's WAL frames without syncing them) and a thread of the
//! writer's own, [`WalSync`], syncs the WAL file; [`WriteTx::commit`]
//! releases the writer once the frames are written and answers its caller
//! only after a sync that began after them has ended. So every commit a
//! caller is told of survives power loss, as with `synchronous = FULL`, but
//! the next transaction runs while the disk syncs, and one sync covers every
//! commit written before it began (group commit, with no caller waiting for
//! company). What changes: another connection can read a commit during the
//! sync, before it is durable (at most one sync, ~0.4 ms on this project's
//! machines); after a power loss at that moment, what it read may be gone,
//! as the caller who made it was never told it was done.
//!
//! A [`WriteTx`] dropped without [`WriteTx::commit`] rolls back, as an sqlx
//! transaction does. Errors are SQLite's own codes wrapped as an sqlx
//! database error ([`WriterError`]), so the store's error table reads them
//! like the driver's.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::decode::Columns;
use crate::sql::{Args, Val};

/// Settings of the writer connection.
#[derive(Debug, Clone)]
pub(crate) struct WriterSettings {
    /// Every commit durable before its caller is answered (the WAL synced
    /// by [`WalSync`]); when false, commits are answered once written and
    /// may be lost to a power loss (`synchronous = NORMAL` alone).
    pub synchronous_full: bool,
    pub busy_timeout: Duration,
    /// Prepared statements kept (every text the store runs).
    pub statements: usize,
    /// Run before each sync of the WAL: tests hold a sync back with it,
    /// or fail it; `None` otherwise.
    pub before_sync: Option<BeforeSync>,
}

/// The writer connection; `None` once the store is closed.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    conn: Arc<Mutex<Option<Connection>>>,
    /// The WAL's syncs, with `synchronous_full`; the thread ends when the
    /// last clone of the writer goes.
    sync: Option<Arc<SyncThread>>,
}

impl Writer {
    /// Opens the file at `path` (which the migrations created) as the writer.
    pub(crate) fn open(path: &Path, settings: &WriterSettings) -> Result<Self, sqlx::Error> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(to_sqlx)?;
        conn.busy_timeout(settings.busy_timeout).map_err(to_sqlx)?;
        // The settings the sqlx connections get (see `SqliteStore::open`
        // for why each): WAL, foreign keys, statement journals in memory, and
        // a 16 MiB page cache. `synchronous = NORMAL` in either case: SQLite
        // still syncs around checkpoints and when the WAL starts over, and
        // with `synchronous_full` the WAL's sync after each commit is
        // [`WalSync`]'s, off the writer.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
             PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; \
             PRAGMA cache_size = -16384;",
        )
        .map_err(to_sqlx)?;
        conn.set_prepared_statement_cache_capacity(settings.statements);
        let sync = if settings.synchronous_full {
            Some(Arc::new(SyncThread::start(
                wal_path(path)?,
                settings.before_sync.clone(),
            )?))
        } else {
            None
        };
        Ok(Self {
            conn: Arc::new(Mutex::new(Some(conn))),
            sync,
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
        if let Some(sync) = &self.sync {
            // A failed sync may have lost commits already answered as
            // written; nothing is built on them.
            sync.shared.check()?;
        }
        conn.execute_batch("BEGIN IMMEDIATE").map_err(to_sqlx)?;
        Ok(WriteTx {
            guard,
            since: Instant::now(),
            sync: self.sync.as_ref().map(|s| Arc::clone(&s.shared)),
        })
    }

    /// Whether commits wait for a sync of the WAL (tests).
    #[cfg(test)]
    pub(crate) fn syncs(&self) -> bool {
        self.sync.is_some()
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
    /// Where a commit waits to be durable (with `synchronous_full`).
    sync: Option<Arc<WalSync>>,
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

    /// Commits, releases the writer, and (with `synchronous_full`) waits
    /// for a sync of the WAL that covers the commit. On failure before the
    /// commit the transaction is rolled back when dropped; a failed sync
    /// is an error here and in every later transaction.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        self.conn().execute_batch("COMMIT").map_err(to_sqlx)?;
        // Numbered while the writer is held: the numbers follow the order
        // of the commits' frames in the WAL.
        let ticket = self.sync.as_ref().map(|s| (Arc::clone(s), s.written()));
        drop(self);
        match ticket {
            Some((sync, n)) => sync.durable(n?).await,
            None => Ok(()),
        }
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

/// Syncs of the WAL made by the SQLite writers of this process, and the
/// commits they covered: the second over the first is the commits a sync.
static SYNCS: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));

/// How many syncs of the WAL the SQLite writers of this process have made,
/// and how many commits those syncs made durable.
pub fn wal_syncs() -> (u64, u64) {
    (
        SYNCS.0.load(Ordering::Relaxed),
        SYNCS.1.load(Ordering::Relaxed),
    )
}

/// A hook run before each sync (tests hold a sync back with it, or fail it).
#[derive(Clone)]
pub(crate) struct BeforeSync(pub Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>);

impl std::fmt::Debug for BeforeSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeSync")
    }
}

/// Where commits wait to be durable: commits are numbered as the writer
/// writes them, and a thread ([`SyncThread`]) syncs the WAL file and
/// publishes the highest number a finished sync covers.
#[derive(Debug)]
pub(crate) struct WalSync {
    written: std::sync::Mutex<Written>,
    wake: Condvar,
    durable: tokio::sync::watch::Sender<Durable>,
}

#[derive(Debug, Default)]
struct Written {
    /// Commits written to the WAL so far.
    count: u64,
    /// The writer is gone: sync what is written, then end.
    closing: bool,
    /// The thread has ended: nothing written now will be synced.
    ended: bool,
}

#[derive(Debug, Clone, Default)]
struct Durable {
    /// Every commit numbered up to this one is synced.
    upto: u64,
    /// A sync failed: what was written since the last good one may be lost.
    failed: Option<Arc<str>>,
}

impl WalSync {
    fn lock(&self) -> std::sync::MutexGuard<'_, Written> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Numbers a commit whose frames are written (the writer is held) and
    /// wakes the thread; an error if the thread has ended (its store is
    /// gone, or a sync failed).
    fn written(&self) -> Result<u64, sqlx::Error> {
        let mut written = self.lock();
        if written.ended {
            drop(written);
            self.check()?;
            return Err(sqlx::Error::PoolClosed);
        }
        written.count += 1;
        let n = written.count;
        drop(written);
        self.wake.notify_one();
        Ok(n)
    }

    /// Waits until commit `n` is durable.
    async fn durable(&self, n: u64) -> Result<(), sqlx::Error> {
        let mut rx = self.durable.subscribe();
        let seen = rx
            .wait_for(|d| d.upto >= n || d.failed.is_some())
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?
            .clone();
        match seen.failed {
            Some(why) if seen.upto < n => Err(sync_failed(&why)),
            _ => Ok(()),
        }
    }

    /// Refuses every transaction once a sync has failed.
    fn check(&self) -> Result<(), sqlx::Error> {
        match &self.durable.borrow().failed {
            Some(why) => Err(sync_failed(why)),
            None => Ok(()),
        }
    }
}

fn sync_failed(why: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!(
        "syncing the SQLite WAL failed ({why}): commits since the last good sync \
         may be lost, so this node writes nothing more; restart it"
    )))
}

/// The thread that syncs one writer's WAL; dropping it (with the last
/// clone of the writer) lets the thread sync what is written and end.
#[derive(Debug)]
pub(crate) struct SyncThread {
    shared: Arc<WalSync>,
}

impl SyncThread {
    fn start(wal: PathBuf, before_sync: Option<BeforeSync>) -> Result<Self, sqlx::Error> {
        let shared = Arc::new(WalSync {
            written: std::sync::Mutex::new(Written::default()),
            wake: Condvar::new(),
            durable: tokio::sync::watch::Sender::new(Durable::default()),
        });
        let syncer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("sqlite-wal-sync".into())
            .spawn(move || {
                WalFile {
                    path: wal,
                    open: None,
                    before_sync,
                }
                .run(&syncer);
            })
            .map_err(sqlx::Error::Io)?;
        Ok(Self { shared })
    }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
    }
}

/// The WAL file as the sync thread holds it.
struct WalFile {
    path: PathBuf,
    /// Open, with the inode it was opened as.
    open: Option<(std::fs::File, u64)>,
    before_sync: Option<BeforeSync>,
}

impl WalFile {
    /// Syncs whenever commits are written that no sync covers yet; after a
    /// failed sync, marks every later commit failed and ends.
    fn run(&mut self, shared: &WalSync) {
        let mut synced = 0;
        loop {
            let target = {
                let mut written = shared.lock();
                while written.count == synced && !written.closing {
                    written = shared
                        .wake
                        .wait(written)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if written.count == synced {
                    written.ended = true;
                    return;
                }
                // Every commit numbered so far has its frames written: a
                // sync that begins now covers them all.
                written.count
            };
            if let Err(err) = self.sync() {
                tracing::error!(error = %err, wal = %self.path.display(), "syncing the SQLite WAL failed");
                let why: Arc<str> = err.to_string().into();
                shared.durable.send_modify(|d| d.failed = Some(why));
                shared.lock().ended = true;
                return;
            }
            SYNCS.0.fetch_add(1, Ordering::Relaxed);
            SYNCS.1.fetch_add(target - synced, Ordering::Relaxed);
            synced = target;
            shared.durable.send_modify(|d| d.upto = target);
        }
    }

    /// `fdatasync` of the WAL, as SQLite's own sync. The file is opened
    /// again if it is not the one at the path any more (SQLite deletes the
    /// WAL when its last connection closes; the writer's stays open, so this
    /// is a safeguard), and its directory synced then, so the file's entry
    /// is durable too.
    fn sync(&mut self) -> std::io::Result<()> {
        if let Some(hook) = &self.before_sync {
            (hook.0)()?;
        }
        let inode = inode(&std::fs::metadata(&self.path)?);
        let file = match &self.open {
            Some((file, opened)) if *opened == inode => file,
            _ => {
                let file = std::fs::File::open(&self.path)?;
                let dir = match self.path.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir,
                    _ => Path::new("."),
                };
                std::fs::File::open(dir)?.sync_all()?;
                &self.open.insert((file, inode)).0
            }
        };
        file.sync_data()
    }
}

#[cfg(unix)]
fn inode(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(meta)
}

#[cfg(not(unix))]
fn inode(_meta: &std::fs::Metadata) -> u64 {
    0
}

/// The WAL of the database at `path` (SQLite names it `<file>-wal`), as
/// an absolute path.
fn wal_path(path: &Path) -> Result<PathBuf, sqlx::Error> {
    let mut wal = std::path::absolute(path)
        .map_err(sqlx::Error::Io)?
        .into_os_string();
    wal.push("-wal");
    Ok(PathBuf::from(wal))
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
