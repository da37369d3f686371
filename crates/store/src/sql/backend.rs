//! The seam between the store's algorithms (this module's siblings) and a
//! database: [`Backend`] runs statements and transactions, [`Val`] is what
//! a statement binds.
//!
//! Why values of our own rather than code generic over `sqlx::Database`:
//! the algorithms then carry no driver bounds at all (sqlx's per-type
//! `Encode`/`Decode`/`Executor` bounds do not follow from a trait and would
//! be restated on every function), each backend binds the handful of value
//! kinds in one function, and a backend that is not sqlx at all (a
//! dedicated SQLite writer thread, say) fits the same seam.

use std::collections::HashSet;

use async_trait::async_trait;
use taskmesh_core::UnixMillis;

use super::batch::{self, Batch};
use super::statements::Statements;
use crate::decode::Columns;
use crate::{Result, ScheduleChange, TaskChange};

/// A value bound to one placeholder. NULLs carry their type (`Int(None)`),
/// which Postgres needs to type a parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// BIGINT (or INTEGER on SQLite).
    Int(Option<i64>),
    /// INTEGER (the task priority).
    Int32(i32),
    /// DOUBLE.
    Float(f64),
    /// TEXT (JSON too: the statement casts where the column wants it).
    Text(Option<String>),
    /// BLOB / BYTEA.
    Bytes(Option<Vec<u8>>),
    /// BOOLEAN (an INTEGER 0/1 on SQLite).
    Bool(bool),
}

/// The values of one statement, in placeholder order.
pub type Args = Vec<Val>;

/// Builds [`Args`] from anything convertible into [`Val`].
macro_rules! args {
    ($($v:expr),* $(,)?) => { vec![$($crate::sql::Val::from($v)),*] };
}
pub(crate) use args;

macro_rules! from_val {
    ($($t:ty => |$x:ident| $e:expr),* $(,)?) => {
        $(impl From<$t> for Val { fn from($x: $t) -> Self { $e } })*
    };
}
from_val! {
    i64 => |v| Val::Int(Some(v)),
    Option<i64> => |v| Val::Int(v),
    i32 => |v| Val::Int32(v),
    u32 => |v| Val::Int(Some(i64::from(v))),
    f64 => |v| Val::Float(v),
    bool => |v| Val::Bool(v),
    String => |v| Val::Text(Some(v)),
    &String => |v| Val::Text(Some(v.clone())),
    &str => |v| Val::Text(Some(v.to_string())),
    Option<String> => |v| Val::Text(v),
    Option<&str> => |v| Val::Text(v.map(str::to_string)),
    Vec<u8> => |v| Val::Bytes(Some(v)),
    Option<Vec<u8>> => |v| Val::Bytes(v),
}

/// One database, as the algorithms see it. A backend supplies its SQL
/// ([`Backend::sql`]), transactions, statement execution with bound
/// [`Val`]s, the database clock, its wake-up transport, and optionally a
/// faster bulk write than the portable one.
///
/// Transactions end by [`Backend::commit`]; a transaction dropped without
/// it rolls back. Savepoints are plain statements (`SAVEPOINT name`), the
/// same text on every supported database.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// An open transaction.
    type Tx: Send;
    /// A result row.
    type Row: Columns + Send + Sync + 'static;

    /// The backend's statements, rendered once for its dialect.
    fn sql(&self) -> &'static Statements;

    /// Starts a write transaction. Writes that must not interleave are made
    /// exclusive by the backend (SQLite: one writer, `BEGIN IMMEDIATE`) or
    /// by the row locks the statements take (`{lock}` in the SQL).
    async fn begin_write(&self) -> Result<Self::Tx>;

    /// Starts a read-only transaction that reads one snapshot.
    async fn begin_read(&self) -> Result<Self::Tx>;

    /// Commits `tx`.
    async fn commit(&self, tx: Self::Tx) -> Result<()>;

    /// Rolls `tx` back now, releasing its locks before this returns
    /// (dropping it leaves the rollback to the connection's next use). A
    /// failure is not reported: the connection is then closed, which rolls
    /// back too.
    async fn rollback(&self, tx: Self::Tx) {
        drop(tx);
    }

    /// Runs a statement in `tx`; returns the rows it changed.
    async fn exec(&self, tx: &mut Self::Tx, sql: &'static str, args: Args) -> sqlx::Result<u64>;

    /// Runs a query in `tx`.
    async fn fetch(
        &self,
        tx: &mut Self::Tx,
        sql: &'static str,
        args: Args,
    ) -> sqlx::Result<Vec<Self::Row>>;

    /// Runs an unprepared statement without arguments in `tx` (savepoints).
    async fn raw(&self, tx: &mut Self::Tx, sql: &'static str) -> sqlx::Result<()>;

    /// Runs a query outside any transaction (on SQLite's reader pool).
    async fn read(&self, sql: &'static str, args: Args) -> sqlx::Result<Vec<Self::Row>>;

    /// The database's clock (see `Store::db_now`).
    async fn db_now(&self) -> Result<UnixMillis>;

    /// Tells the other processes sharing the database about committed
    /// changes (this process's subscribers already have them).
    fn announce(&self, tasks: &[TaskChange], schedules: &[ScheduleChange]);

    /// Writes a batch of transitions with a compare-and-set per task and
    /// returns the ids whose compare-and-set missed (nothing of theirs was
    /// written). The portable form is a few multi-row statements
    /// ([`batch::write_portable`]); a backend may do better (Postgres: one
    /// statement of `UNNEST`ed arrays). An error leaves the transaction to
    /// be rolled back.
    async fn write_batch(&self, tx: &mut Self::Tx, batch: &Batch) -> Result<HashSet<String>> {
        batch::write_portable(self, tx, batch).await
    }
}

/// Runs `SAVEPOINT`, then `work`, then `RELEASE` on success or
/// `ROLLBACK TO` on failure, so a failing step leaves nothing and the
/// transaction goes on.
macro_rules! in_savepoint {
    ($b:expr, $tx:expr, $name:literal, $work:expr) => {{
        $b.raw($tx, concat!("SAVEPOINT ", $name)).await?;
        let result = $work;
        if result.is_ok() {
            $b.raw($tx, concat!("RELEASE SAVEPOINT ", $name)).await?;
        } else {
            $b.raw($tx, concat!("ROLLBACK TO SAVEPOINT ", $name))
                .await?;
            $b.raw($tx, concat!("RELEASE SAVEPOINT ", $name)).await?;
        }
        result
    }};
}
pub(crate) use in_savepoint;

/// Binds `args` to `q` for any sqlx driver that encodes the value kinds of
/// [`Val`] (all three do).
pub(crate) fn bind_all<'q, DB: sqlx::Database>(
    mut q: sqlx::query::Query<'q, DB, DB::Arguments>,
    args: Args,
) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    for<'t> Option<i64>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> i32: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> f64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<String>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<Vec<u8>>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> bool: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    for v in args {
        q = match v {
            Val::Int(v) => q.bind(v),
            Val::Int32(v) => q.bind(v),
            Val::Float(v) => q.bind(v),
            Val::Text(v) => q.bind(v),
            Val::Bytes(v) => q.bind(v),
            Val::Bool(v) => q.bind(v),
        };
    }
    q
}

/// `impl Backend` for a backend on an sqlx driver: the parts every such
/// backend runs the same way (commit, statements with bound values, savepoint
/// statements, reads on the pool named `$reads`), then the backend's own
/// items (`sql`, `begin_write`, `begin_read`, `db_now`, `announce`, and
/// optionally `write_batch`).
macro_rules! sqlx_backend {
    ($backend:ty, $db:ty, $row:ty, reads: $reads:ident, { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::sql::Backend for $backend {
            type Tx = sqlx::Transaction<'static, $db>;
            type Row = $row;

            async fn commit(&self, tx: Self::Tx) -> $crate::Result<()> {
                Ok(tx.commit().await?)
            }

            async fn rollback(&self, tx: Self::Tx) {
                if let Err(err) = tx.rollback().await {
                    tracing::debug!(error = %err, "rollback failed; the connection is closed");
                }
            }

            async fn exec(
                &self,
                tx: &mut Self::Tx,
                sql: &'static str,
                args: $crate::sql::Args,
            ) -> sqlx::Result<u64> {
                let q = $crate::sql::bind_all(sqlx::query(sql), args);
                Ok(q.execute(&mut **tx).await?.rows_affected())
            }

            async fn fetch(
                &self,
                tx: &mut Self::Tx,
                sql: &'static str,
                args: $crate::sql::Args,
            ) -> sqlx::Result<Vec<$row>> {
                $crate::sql::bind_all(sqlx::query(sql), args)
                    .fetch_all(&mut **tx)
                    .await
            }

            async fn raw(&self, tx: &mut Self::Tx, sql: &'static str) -> sqlx::Result<()> {
                sqlx::raw_sql(sql).execute(&mut **tx).await.map(|_| ())
            }

            async fn read(
                &self,
                sql: &'static str,
                args: $crate::sql::Args,
            ) -> sqlx::Result<Vec<$row>> {
                $crate::sql::bind_all(sqlx::query(sql), args)
                    .fetch_all(&self.$reads)
                    .await
            }

            $($own)*
        }
    };
}
pub(crate) use sqlx_backend;
