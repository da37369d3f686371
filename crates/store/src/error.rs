//! The store's one error type, and the one place sqlx errors are converted.

use taskmesh_core::{ErrorCode, TransitionError};

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such task.
    #[error("task {0} not found")]
    NotFound(String),
    /// The idempotency key is taken by a different request.
    #[error("{0}")]
    AlreadyExists(String),
    /// The event does not apply to the task as it is.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// A leader write carried a fencing token older than the newest one the
    /// store has seen: the writer was deposed.
    #[error("fenced: {0}")]
    Fenced(String),
    /// Lost the compare-and-set too many times in a row.
    #[error("task {0} changed concurrently; try again")]
    Conflict(String),
    /// The database cannot be reached or is shutting down.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Anything else: corrupt rows, bugs.
    #[error("store error: {0}")]
    Internal(String),
}

impl Error {
    /// The transport-independent code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::AlreadyExists(_) => ErrorCode::AlreadyExists,
            Error::Transition(_) => ErrorCode::FailedPrecondition,
            Error::Conflict(_) => ErrorCode::Aborted,
            Error::Fenced(_) => ErrorCode::FailedPrecondition,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
                Error::Unavailable(err.to_string())
            }
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // SQLite: SQLITE_BUSY (5), SQLITE_LOCKED (6), SQLITE_FULL (13),
                // SQLITE_CANTOPEN (14). Postgres: class 08 (connection
                // exception), 57P01..03 (admin shutdown, crash, cannot connect).
                Some("5" | "6" | "13" | "14" | "517" | "261" | "262") => {
                    Error::Unavailable(err.to_string())
                }
                Some(code) if code.starts_with("08") || code.starts_with("57P") => {
                    Error::Unavailable(err.to_string())
                }
                _ => Error::Internal(err.to_string()),
            },
            _ => Error::Internal(err.to_string()),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        match err {
            sqlx::migrate::MigrateError::Execute(inner) => inner.into(),
            other => Error::Internal(format!("migrations: {other}")),
        }
    }
}

/// True when `err` is a unique-constraint violation (SQLite extended codes
/// 2067 SQLITE_CONSTRAINT_UNIQUE and 1555 SQLITE_CONSTRAINT_PRIMARYKEY,
/// Postgres 23505), e.g. two creates racing for one `client_request_id`.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            db.is_unique_violation()
                || matches!(db.code().as_deref(), Some("2067" | "1555" | "23505"))
        }
        _ => false,
    }
}
