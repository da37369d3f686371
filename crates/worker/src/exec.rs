//! Running one assignment's handler and turning its outcome into a report.

use std::any::Any;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use crate::trace_context;
use crate::worker::{Shared, lock};
use crate::{Handler, HandlerError, Output, TaskContext};

/// A finished handler, sent back to the session that started it.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) task_id: String,
    pub(crate) execution_id: String,
    pub(crate) attempt: u32,
    pub(crate) result: Result<Output, HandlerError>,
}

/// Spawns the handler on the worker's tracker. The slot `permit` is released
/// before the result is handed to `report`, so a slot is free again by the
/// time the server sees the completion. `report` runs inside the tracked
/// task, so a drain waits for the report too, not only for the handler.
pub(crate) fn spawn<F, Fut>(
    shared: &Arc<Shared>,
    handler: Arc<dyn Handler>,
    ctx: TaskContext,
    permit: OwnedSemaphorePermit,
    report: F,
) where
    F: FnOnce(Done) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let shared = shared.clone();
    let tracker = shared.tracker.clone();
    tracker.spawn(async move {
        let worker_id = shared.opts.worker_id.as_str();
        let (task_id, execution_id, attempt) =
            (ctx.task_id.clone(), ctx.execution_id.clone(), ctx.attempt);
        debug!(worker_id, task_id, attempt, execution_id, "handler started");
        // The handler runs in a span continuing the task's trace (the
        // server's dispatch span is its parent).
        let span = info_span!(
            "run",
            otel.name = %ctx.handler,
            otel.kind = "consumer",
            task_id = %ctx.task_id,
            attempt = ctx.attempt,
            execution_id = %ctx.execution_id,
        );
        if let Some(tp) = ctx.trace_context.get("traceparent") {
            trace_context::continue_from(&span, tp);
        }
        let started = Instant::now();
        // A separate task, so a panic surfaces as a JoinError instead of
        // unwinding through the worker.
        let log = ctx.log.clone();
        let result = match tokio::spawn(
            log.scope(async move { handler.run(ctx).await })
                .instrument(span),
        )
        .await
        {
            Ok(result) => result,
            Err(error) if error.is_panic() => {
                let reason = panic_message(error.into_panic());
                warn!(
                    worker_id,
                    task_id, attempt, execution_id, reason, "handler panicked"
                );
                Err(HandlerError::retryable(format!(
                    "handler panicked: {reason}"
                )))
            }
            Err(_) => Err(HandlerError::retryable("handler task was aborted")),
        };
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        lock(&shared.stats).push(elapsed_ms);
        lock(&shared.running).remove(&execution_id);
        drop(permit);
        debug!(
            worker_id,
            task_id,
            attempt,
            execution_id,
            elapsed_ms,
            ok = result.is_ok(),
            "handler finished"
        );
        report(Done {
            task_id,
            execution_id,
            attempt,
            result,
        })
        .await;
    });
}

/// A reporter for [`spawn`] that hands the result to a stream session.
pub(crate) fn to_session(
    worker_id: String,
    done: mpsc::UnboundedSender<Done>,
) -> impl FnOnce(Done) -> std::future::Ready<()> + Send + 'static {
    move |report| {
        if let Err(mpsc::error::SendError(report)) = done.send(report) {
            debug!(
                worker_id,
                task_id = report.task_id,
                attempt = report.attempt,
                execution_id = report.execution_id,
                "session ended; dropping result of its task"
            );
        }
        std::future::ready(())
    }
}

/// The text of a panic payload.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .unwrap_or_else(|| "non-string panic payload".to_string()),
    }
}
