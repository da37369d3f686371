//! What a handler receives, returns and implements.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

/// Everything a handler knows about the attempt it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// Id of the task.
    pub task_id: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// Unique id of this attempt.
    pub execution_id: String,
    /// Name of the handler being run.
    pub handler: String,
    /// The task's input bytes.
    pub payload: Vec<u8>,
    /// Media type of `payload`; empty when unknown.
    pub content_type: String,
    /// The server times the attempt out at this instant, when set.
    pub deadline: Option<SystemTime>,
    /// The task's execution timeout, when set.
    pub timeout: Option<Duration>,
    /// W3C trace context (`traceparent`, `tracestate`) to continue.
    pub trace_context: HashMap<String, String>,
    /// The task's labels.
    pub labels: HashMap<String, String>,
    /// Cancelled when the server cancels this execution (or the attempt was
    /// taken back); handlers should stop early when it fires.
    pub cancel: CancellationToken,
    /// This attempt's log: lines written here are stored with the task
    /// (`GetTaskLogs`). `tracing` events inside the handler land here too
    /// when the subscriber has [`capture_layer`](crate::capture_layer).
    pub log: crate::TaskLog,
    /// Submits child tasks of this task (cancelled with it), and a join
    /// over them ([`Children::fan_out`](crate::Children::fan_out)).
    pub children: crate::Children,
    /// For a workflow step: its workflow and step name (empty otherwise).
    pub workflow_id: String,
    /// The step's name in its workflow.
    pub workflow_step: String,
    /// For a workflow step: each parent's output (bytes and media type)
    /// by step name.
    pub parent_outputs: HashMap<String, Output>,
    /// For a step run after its parents end (`after_parents_end`): each
    /// parent that did not succeed, by step name, as "STATE: message".
    pub parent_errors: HashMap<String, String>,
    /// For a shard of a sharding broadcast: `(index, total)`, the index
    /// from 0 (each live worker of the handler runs one shard when the
    /// broadcast was spread); `None` for any other task.
    pub shard: Option<(u32, u32)>,
}

impl TaskContext {
    /// True once the execution has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the execution is cancelled.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }
}

/// A handler's successful result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// The output bytes.
    pub data: Vec<u8>,
    /// Media type of `data`; empty when unknown.
    pub content_type: String,
}

impl Output {
    /// Output with explicit bytes and media type.
    pub fn new(data: Vec<u8>, content_type: impl Into<String>) -> Self {
        Output {
            data,
            content_type: content_type.into(),
        }
    }

    /// JSON output (`application/json`).
    pub fn json(data: impl Into<Vec<u8>>) -> Self {
        Output::new(data.into(), "application/json")
    }

    /// No output.
    pub fn empty() -> Self {
        Output::default()
    }
}

/// A handler's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    /// What went wrong.
    pub message: String,
    /// False when retrying cannot help; the task then fails at once.
    pub retryable: bool,
}

impl HandlerError {
    /// A failure another attempt may fix.
    pub fn retryable(message: impl Into<String>) -> Self {
        HandlerError {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure retrying cannot fix.
    pub fn fatal(message: impl Into<String>) -> Self {
        HandlerError {
            message: message.into(),
            retryable: false,
        }
    }
}

/// Code that runs tasks of one handler name.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt; should return early when `ctx.cancel` fires.
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError>;
}

/// A [`Handler`] made from a closure; see [`handler_fn`].
#[derive(Clone)]
pub struct FnHandler<F>(F);

impl<F> std::fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnHandler")
    }
}

/// Wraps an async closure as a [`Handler`]:
/// `handler_fn(|ctx| async move { Ok(Output::empty()) })`.
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Output, HandlerError>> + Send + 'static,
{
    FnHandler(f)
}

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Output, HandlerError>> + Send + 'static,
{
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        (self.0)(ctx).await
    }
}
