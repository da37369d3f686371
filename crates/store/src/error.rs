//! The store's one error type, and the one place sqlx errors are converted:
//! driver-level failures here, database errors by the error-code table of
//! the backend that raised them.

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
    /// Lost the compare-and-set too many times in a row, or the database
    /// aborted the transaction for a concurrent one (deadlock, serialization
    /// failure). Nothing was written; the caller may retry.
    #[error("{0} changed concurrently; try again")]
    Conflict(String),
    /// Bad options or input, refused before anything was written.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The database cannot be reached or is shutting down.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The database is out of disk space (SQLite's `SQLITE_FULL`, Postgres's
    /// `disk_full`, MySQL's disk or table full). Nothing was written; the
    /// same write succeeds once space returns.
    #[error("store out of disk space: {0}")]
    StorageFull(String),
    /// The request is well formed but what it names is not in a state
    /// that allows it (a workflow with a callback still to deliver, or
    /// steps retention removed).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Anything else: corrupt rows, bugs.
    #[error("store error: {0}")]
    Internal(String),
}

impl Error {
    /// The same error again (kind and message), for answering every
    /// caller of a batch that failed as a whole.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::AlreadyExists(m) => Error::AlreadyExists(m.clone()),
            Error::Transition(t) => Error::Transition(t.clone()),
            Error::Fenced(m) => Error::Fenced(m.clone()),
            Error::Conflict(m) => Error::Conflict(m.clone()),
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::Unavailable(m) => Error::Unavailable(m.clone()),
            Error::StorageFull(m) => Error::StorageFull(m.clone()),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(m.clone()),
            Error::Internal(m) => Error::Internal(m.clone()),
        }
    }

    /// True when nothing was written and the same write may succeed later:
    /// the store was unreachable, out of space, or a concurrent transaction
    /// won.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::StorageFull(_) | Error::Conflict(_)
        )
    }

    /// The transport-independent code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::AlreadyExists(_) => ErrorCode::AlreadyExists,
            Error::Transition(_) => ErrorCode::FailedPrecondition,
            Error::Conflict(_) => ErrorCode::Aborted,
            Error::Fenced(_) => ErrorCode::FailedPrecondition,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::StorageFull(_) => ErrorCode::ResourceExhausted,
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// How a sqlx error is reported; see [`kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Unavailable,
    StorageFull,
    Conflict,
    AlreadyExists,
    InvalidArgument,
    Internal,
}

impl Kind {
    /// True for a statement the database refused because of one of its
    /// rows (a constraint, bad data): written again row by row, only that
    /// row fails. A lost connection or a conflict would fail the same way.
    pub(crate) fn is_row_refusal(self) -> bool {
        matches!(self, Kind::Internal | Kind::AlreadyExists)
    }
}

/// Classifies a sqlx error: by its variant for what every driver shares
/// (pool, I/O, TLS), and for a database error by the table of the backend
/// that raised it (`sqlite::error_kind`, `postgres::error_kind`,
/// `mysql::error_kind`).
pub(crate) fn kind(err: &sqlx::Error) -> Kind {
    match err {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => Kind::Unavailable,
        sqlx::Error::Configuration(_) => Kind::InvalidArgument,
        sqlx::Error::Database(db) => {
            if let Some(e) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
                crate::sqlite::error_kind(e)
            } else if let Some(e) = db.try_downcast_ref::<crate::sqlite::WriterError>() {
                crate::sqlite::error_kind(e)
            } else if let Some(e) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                crate::postgres::error_kind(e.code())
            } else if let Some(e) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                crate::mysql::error_kind(e.number())
            } else {
                Kind::Internal
            }
        }
        _ => Kind::Internal,
    }
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        match kind(&err) {
            Kind::Unavailable => Error::Unavailable(err.to_string()),
            Kind::StorageFull => Error::StorageFull(err.to_string()),
            Kind::Conflict => {
                let message = match &err {
                    sqlx::Error::Database(db) => {
                        let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                        format!("(code {code}: {})", db.message())
                    }
                    _ => err.to_string(),
                };
                Error::Conflict(format!("the data {message}"))
            }
            Kind::AlreadyExists => Error::AlreadyExists(err.to_string()),
            Kind::InvalidArgument => Error::InvalidArgument(err.to_string()),
            Kind::Internal => Error::Internal(err.to_string()),
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

/// True when `err` is a unique-constraint violation (a racing create of one
/// `client_request_id`, a taken id), by the raising backend's table.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    kind(err) == Kind::AlreadyExists
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_one_vocabulary() {
        assert_eq!(kind(&sqlx::Error::PoolTimedOut), Kind::Unavailable);
        assert_eq!(
            kind(&sqlx::Error::Configuration("bad url".into())),
            Kind::InvalidArgument
        );
        assert_eq!(kind(&sqlx::Error::RowNotFound), Kind::Internal);
        // A full disk, on each backend, is its own kind (RESOURCE_EXHAUSTED).
        assert_eq!(crate::postgres::error_kind("53100"), Kind::StorageFull);
        assert_eq!(crate::postgres::error_kind("53300"), Kind::Unavailable);
        assert_eq!(crate::mysql::error_kind(1021), Kind::StorageFull);
        assert_eq!(crate::mysql::error_kind(1114), Kind::StorageFull);
        let unavailable = Error::from(sqlx::Error::PoolClosed);
        assert_eq!(unavailable.code(), ErrorCode::Unavailable);
        assert_eq!(
            Error::InvalidArgument("x".into()).code(),
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn a_duplicate_keeps_kind_and_message_and_only_nothing_written_errors_are_transient() {
        let all = [
            Error::NotFound("a".into()),
            Error::AlreadyExists("b".into()),
            Error::Fenced("c".into()),
            Error::Conflict("d".into()),
            Error::InvalidArgument("e".into()),
            Error::Unavailable("f".into()),
            Error::Internal("g".into()),
            Error::StorageFull("h".into()),
        ];
        for err in &all {
            let copy = err.duplicate();
            assert_eq!(copy.code(), err.code(), "{err}");
            assert_eq!(copy.to_string(), err.to_string());
        }
        let transient: Vec<bool> = all.iter().map(Error::is_transient).collect();
        assert_eq!(
            transient,
            [false, false, false, true, false, true, false, true]
        );
        assert_eq!(
            Error::StorageFull("h".into()).code(),
            ErrorCode::ResourceExhausted
        );
    }
}
