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
//! Transactions that end while other writers are queued share one commit
//! (group commit, see [`Writer`]).
//!
//! A [`WriteTx`] dropped without [`WriteTx::commit`] rolls back, as an sqlx
//! transaction does. Errors are SQLite's own codes wrapped as an sqlx
//! database error ([`WriterError`]), so the store's error table reads them
//! like the driver's.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

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

/// How many transactions one commit may carry at most.
const GROUP_MEMBERS: usize = 64;
/// How long the first transaction of a group may wait for later ones: past
/// this, the transaction that ends next commits the group even when more
/// callers are queued.
const GROUP_AGE: Duration = Duration::from_millis(5);
/// A transaction waiting for its group's commit makes the commit itself
/// when nobody has made it for this long: the caller queued to continue the
/// group went away (a cancelled request) before it got the writer.
const GROUP_ORPHANED: Duration = Duration::from_millis(20);
/// The savepoint each transaction that joins an open group runs in, so it
/// can roll back alone: opened, kept, undone.
const JOIN: &str = "SAVEPOINT taskmesh_member";
const KEEP: &str = "RELEASE taskmesh_member";
const UNDO: &str = "ROLLBACK TO taskmesh_member; RELEASE taskmesh_member";

/// The writer connection and the transaction its finished writers share.
#[derive(Debug)]
struct Inner {
    /// `None` once the store is closed.
    conn: Option<Connection>,
    /// The open transaction that finished writers have left their work in,
    /// waiting for its commit (see [`Writer`]).
    group: Option<Group>,
    /// Commits made on this connection (tests).
    commits: Arc<AtomicU64>,
}

/// Transactions that ended in one open SQLite transaction, and where they
/// learn how its commit went.
#[derive(Debug)]
struct Group {
    members: usize,
    opened: Instant,
    outcome: watch::Sender<Option<Outcome>>,
}

impl Group {
    fn open() -> Self {
        Self {
            members: 0,
            opened: Instant::now(),
            outcome: watch::Sender::new(None),
        }
    }
}

/// How a group's commit went, for each of its members.
type Outcome = Result<(), Failure>;

/// A failed commit, copied to every member of its group.
#[derive(Debug, Clone)]
enum Failure {
    Database(WriterError),
    Other(String),
}

impl Failure {
    fn from_sqlite(err: rusqlite::Error) -> Self {
        match writer_error(err) {
            Ok(err) => Self::Database(err),
            Err(other) => Self::Other(other),
        }
    }

    fn to_sqlx(&self) -> sqlx::Error {
        match self {
            Self::Database(err) => sqlx::Error::Database(Box::new(err.clone())),
            Self::Other(message) => sqlx::Error::Protocol(message.clone()),
        }
    }
}

/// The writer connection: every write transaction of the store, in turn.
///
/// **Group commit.** A commit on a local file costs a WAL sync of a few
/// hundred microseconds, far more than the statements before it. When a
/// transaction ends while other writers are queued for the connection, it
/// does not commit: its work stays in the open SQLite transaction (its
/// savepoint released), the next writer continues in that transaction (in a
/// savepoint of its own, so it can still roll back alone), and the last one
/// to end with nobody queued — or once the group holds [`GROUP_MEMBERS`] or
/// is [`GROUP_AGE`] old — commits them all with one sync. Each member's
/// `commit` resolves only when that commit is durable, with its outcome: a
/// failed group commit fails every member, so nobody is told "written" for
/// work that was not. With nobody queued a transaction commits at once, as
/// before; under load the writer syncs once per group instead of once per
/// transaction. A later member sees the earlier members' writes before they
/// are durable; it can act on them only after its own commit, which is
/// theirs.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    inner: Arc<Mutex<Inner>>,
    /// Callers waiting in [`Writer::begin`]: a transaction that ends while
    /// any are leaves its commit to them.
    queued: Arc<AtomicUsize>,
    /// Commits made (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    commits: Arc<AtomicU64>,
}

/// Counts a caller waiting for the writer while it waits (a cancelled
/// caller stops counting).
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    fn enter(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Self(n)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
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
        let commits = Arc::new(AtomicU64::new(0));
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                conn: Some(conn),
                group: None,
                commits: Arc::clone(&commits),
            })),
            queued: Arc::new(AtomicUsize::new(0)),
            commits,
        })
    }

    /// Waits for the connection (writers queue in arrival order) and starts
    /// a write transaction: `BEGIN IMMEDIATE`, or a savepoint in the group
    /// that finished writers left open.
    pub(crate) async fn begin(&self) -> Result<WriteTx, sqlx::Error> {
        self.begin_as(true).await
    }

    /// As [`Writer::begin`], but never in an open group: it commits the
    /// group first, so a long transaction (a bulk removal) holds up no
    /// earlier writer's commit. Later ones may still join it.
    pub(crate) async fn begin_alone(&self) -> Result<WriteTx, sqlx::Error> {
        self.begin_as(false).await
    }

    async fn begin_as(&self, join: bool) -> Result<WriteTx, sqlx::Error> {
        let waiting = Queued::enter(&self.queued);
        let mut guard = Arc::clone(&self.inner).lock_owned().await;
        drop(waiting);
        let since = Instant::now();
        let inner = &mut *guard;
        let Some(conn) = inner.conn.as_ref() else {
            return Err(sqlx::Error::PoolClosed);
        };
        let mut joined = false;
        if inner.group.is_some() {
            if join && !conn.is_autocommit() && conn.execute_batch(JOIN).is_ok() {
                joined = true;
            } else {
                // Kept apart, lost or unusable: settling it commits (or
                // fails) its members.
                // Its members learn the outcome; this caller has none to give.
                let _ = settle(inner);
            }
        }
        if !joined {
            let conn = inner.conn.as_ref().expect("checked above");
            if !conn.is_autocommit() {
                // A transaction a panic left open: never build on it.
                let _ = conn.execute_batch("ROLLBACK");
            }
            conn.execute_batch("BEGIN IMMEDIATE").map_err(to_sqlx)?;
        }
        Ok(WriteTx {
            guard: Some(guard),
            since,
            joined,
            queued: Arc::clone(&self.queued),
        })
    }

    /// Runs `f` on the connection outside any transaction (tests).
    #[cfg(test)]
    pub(crate) async fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, sqlx::Error> {
        let mut guard = self.inner.lock().await;
        // Its members learn the outcome; this caller has none to give.
        let _ = settle(&mut guard);
        let conn = guard.conn.as_ref().ok_or(sqlx::Error::PoolClosed)?;
        f(conn).map_err(to_sqlx)
    }

    /// How many callers wait for the connection, and how many commits it
    /// has made (tests).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, u64) {
        (
            self.queued.load(Ordering::Acquire),
            self.commits.load(Ordering::Acquire),
        )
    }

    /// Counts one more caller as queued without one coming (tests: one that
    /// went away before it got the connection).
    #[cfg(test)]
    pub(crate) fn phantom_queued(&self, by: isize) {
        if by >= 0 {
            self.queued.fetch_add(by.unsigned_abs(), Ordering::AcqRel);
        } else {
            self.queued.fetch_sub(by.unsigned_abs(), Ordering::AcqRel);
        }
    }

    /// Closes the connection, once the transaction in progress (if any) has
    /// ended and the open group is committed; every later `begin` answers
    /// that the store is closed.
    pub(crate) async fn close(&self) {
        let mut guard = self.inner.lock().await;
        // Its members learn the outcome; this caller has none to give.
        let _ = settle(&mut guard);
        if let Some(conn) = guard.conn.take()
            && let Err((_, err)) = conn.close()
        {
            tracing::warn!(error = %err, "closing the SQLite writer");
        }
    }
}

/// Commits the open group (if any) and tells its members how it went.
fn settle(inner: &mut Inner) -> Outcome {
    let Some(group) = inner.group.take() else {
        return Ok(());
    };
    let outcome = match inner.conn.as_ref() {
        None => Err(Failure::Other("the SQLite store was closed".into())),
        Some(conn) if conn.is_autocommit() => Err(Failure::Other(
            "the shared write transaction was rolled back before its commit".into(),
        )),
        Some(conn) => {
            COMMITS.fetch_add(1, Ordering::Relaxed);
            inner.commits.fetch_add(1, Ordering::Relaxed);
            commit(conn)
        }
    };
    group.outcome.send_replace(Some(outcome.clone()));
    outcome
}

/// `COMMIT`; on failure rolls back what is left open.
fn commit(conn: &Connection) -> Outcome {
    conn.execute_batch("COMMIT").map_err(|err| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        Failure::from_sqlite(err)
    })
}

/// Whether a transaction that just ended should leave the group's commit to
/// the callers queued behind it.
fn leave_open(group: &Group, queued: &AtomicUsize) -> bool {
    queued.load(Ordering::Acquire) > 0
        && group.members < GROUP_MEMBERS
        && group.opened.elapsed() < GROUP_AGE
}

/// Waits for the commit of a group this transaction left its work in; makes
/// it if nobody has after [`GROUP_ORPHANED`].
async fn await_group(
    mutex: Arc<Mutex<Inner>>,
    mut rx: watch::Receiver<Option<Outcome>>,
) -> Result<(), sqlx::Error> {
    enum Next {
        Done,
        Orphaned,
        Locked(OwnedMutexGuard<Inner>),
    }
    let next = tokio::select! {
        _ = rx.wait_for(Option::is_some) => Next::Done,
        () = tokio::time::sleep(GROUP_ORPHANED) => Next::Orphaned,
    };
    if matches!(next, Next::Orphaned) {
        let next = tokio::select! {
            _ = rx.wait_for(Option::is_some) => Next::Done,
            guard = mutex.lock_owned() => Next::Locked(guard),
        };
        if let Next::Locked(mut guard) = next
            && rx.borrow().is_none()
        {
            // Not settled, so it is the open group, and nobody holds it.
            // Its members learn the outcome; this caller has none to give.
            let _ = settle(&mut guard);
        }
    }
    let outcome = rx
        .wait_for(Option::is_some)
        .await
        .map_err(|_| sqlx::Error::Protocol("the SQLite writer stopped".into()))?;
    match outcome.as_ref().expect("waited for") {
        Ok(()) => Ok(()),
        Err(failure) => Err(failure.to_sqlx()),
    }
}

/// A write transaction on the writer connection, held until it ends.
#[derive(Debug)]
pub struct WriteTx {
    /// `None` once it has ended.
    guard: Option<OwnedMutexGuard<Inner>>,
    /// When it began: the time a transaction holds the writer is counted
    /// in [`held`].
    since: Instant,
    /// It runs in a savepoint of an open group (see [`Writer`]).
    joined: bool,
    queued: Arc<AtomicUsize>,
}

/// Write transactions ended, and the time they held a writer in µs: every
/// SQLite store of the process together.
static HELD: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));
/// Commits made (one sync each; a group's transactions share one).
static COMMITS: AtomicU64 = AtomicU64::new(0);

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

/// How many commits the SQLite writers of this process have made: fewer
/// than [`held`]'s transactions when group commit shares them.
pub fn commits() -> u64 {
    COMMITS.load(Ordering::Relaxed)
}

fn count_held(since: Instant) {
    HELD.0.fetch_add(1, Ordering::Relaxed);
    HELD.1.fetch_add(
        u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

impl WriteTx {
    fn conn(&self) -> &Connection {
        self.guard
            .as_ref()
            .and_then(|g| g.conn.as_ref())
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

    /// Commits: resolves once the work is durable (see [`Writer`] for when
    /// that is a commit shared with the transactions queued behind it). On
    /// failure nothing of it stays.
    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        let mut guard = self.guard.take().expect("held until it ends");
        let since = self.since;
        let inner = &mut *guard;
        let conn = inner
            .conn
            .as_ref()
            .expect("a transaction holds an open connection");
        if self.joined
            && let Err(err) = conn.execute_batch(KEEP)
        {
            // Its writes are still apart from the group's: drop them.
            undo_member(inner, &self.queued);
            count_held(since);
            return Err(to_sqlx(err));
        }
        if conn.is_autocommit() {
            // An error rolled the whole transaction back (SQLite does for
            // a full disk, say): the group's earlier work is gone too.
            // Its members learn the outcome; this caller has none to give.
            let _ = settle(inner);
            count_held(since);
            return Err(sqlx::Error::Protocol(
                "the write transaction was rolled back before its commit".into(),
            ));
        }
        let group = inner.group.get_or_insert_with(Group::open);
        group.members += 1;
        if !leave_open(group, &self.queued) {
            let outcome = settle(inner);
            count_held(since);
            return outcome.map_err(|f| f.to_sqlx());
        }
        let rx = group.outcome.subscribe();
        let mutex = Arc::clone(OwnedMutexGuard::mutex(&guard));
        drop(guard);
        count_held(since);
        await_group(mutex, rx).await
    }
}

/// Rolls a joined member's writes back to its savepoint; the group stays
/// open for the callers queued, or is committed now when there are none.
fn undo_member(inner: &mut Inner, queued: &AtomicUsize) {
    let Some(conn) = inner.conn.as_ref() else {
        return;
    };
    let undone = conn.execute_batch(UNDO);
    if let Err(err) = &undone {
        tracing::warn!(error = %err, "rolling back an unfinished SQLite write");
        if !conn.is_autocommit() {
            // Its writes cannot be told apart from the group's any more.
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    let keep = inner
        .group
        .as_ref()
        .is_some_and(|g| undone.is_ok() && leave_open(g, queued));
    if !keep {
        // Its members learn the outcome; this caller has none to give.
        let _ = settle(inner);
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        count_held(self.since);
        let inner = &mut *guard;
        if self.joined {
            undo_member(inner, &self.queued);
        } else if let Some(conn) = inner.conn.as_ref()
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
#[derive(Debug, Clone)]
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
    match writer_error(err) {
        Ok(err) => sqlx::Error::Database(Box::new(err)),
        Err(other) => sqlx::Error::Protocol(other),
    }
}

/// SQLite's own failure with its codes, or the text of anything else.
fn writer_error(err: rusqlite::Error) -> Result<WriterError, String> {
    match err {
        rusqlite::Error::SqliteFailure(e, message) => {
            let message = message.unwrap_or_else(|| e.to_string());
            Ok(WriterError {
                code: e.extended_code.to_string(),
                extended: e.extended_code,
                message,
            })
        }
        other => Err(other.to_string()),
    }
}
