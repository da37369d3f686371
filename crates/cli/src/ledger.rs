//! `taskmesh worker --ledger FILE`: every handler execution appends one
//! line (`task_id attempt execution_id worker_id`) to FILE before it runs,
//! with O_APPEND so several worker processes can share one file. Chaos
//! tests count executions with it; operators can audit duplicates with it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use taskmesh_worker::{Handler, HandlerError, Output, TaskContext};

/// Wraps a handler so each execution is written to the ledger first.
pub struct Ledgered {
    inner: Arc<dyn Handler>,
    file: Arc<Mutex<std::fs::File>>,
    worker_id: String,
}

impl Ledgered {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &PathBuf) -> std::io::Result<Arc<Mutex<std::fs::File>>> {
        Ok(Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        )))
    }

    /// `inner`, recorded into `file` as `worker_id`.
    pub fn new(
        inner: Arc<dyn Handler>,
        file: Arc<Mutex<std::fs::File>>,
        worker_id: String,
    ) -> Self {
        Self {
            inner,
            file,
            worker_id,
        }
    }
}

#[async_trait::async_trait]
impl Handler for Ledgered {
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        let line = format!(
            "{} {} {} {}\n",
            ctx.task_id, ctx.attempt, ctx.execution_id, self.worker_id
        );
        {
            let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
            // One write per line: O_APPEND keeps lines whole across processes.
            if let Err(err) = f.write_all(line.as_bytes()).and_then(|_| f.flush()) {
                return Err(HandlerError::retryable(format!(
                    "cannot write the ledger: {err}"
                )));
            }
        }
        self.inner.run(ctx).await
    }
}

/// Wraps a handler so each execution's start is stamped into a file
/// (`task_id unix_micros`, one `O_APPEND` write per line) as the handler
/// begins: the instant a benchmark counts as "started", seen from the
/// worker (`taskmesh worker --start-stamps`, hidden: a bench tool).
pub struct Stamped {
    inner: Arc<dyn Handler>,
    file: Arc<Mutex<std::fs::File>>,
}

impl Stamped {
    /// `inner`, stamped into `file` (see [`Ledgered::open`]).
    pub fn new(inner: Arc<dyn Handler>, file: Arc<Mutex<std::fs::File>>) -> Self {
        Self { inner, file }
    }
}

/// Microseconds since the Unix epoch, now.
pub fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or_default()
}

#[async_trait::async_trait]
impl Handler for Stamped {
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        let line = format!("{} {}\n", ctx.task_id, unix_micros());
        {
            let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
            // A lost stamp only leaves a task out of one figure.
            let _ = f.write_all(line.as_bytes());
        }
        self.inner.run(ctx).await
    }
}
