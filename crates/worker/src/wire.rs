//! Building and reading contract messages.

use std::time::{Duration, SystemTime};

use taskmesh::v1::{
    ConnectRequest, Payload, ResultRecorded, TaskAssignment, TaskFailure, TaskSuccess,
    WorkerRegistration, connect_request, connect_response, task_complete,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::worker::Shared;
use crate::{Error, HandlerError, Output, TaskContext};

/// A handler's outcome as the contract's `TaskComplete.result`, the same on
/// the stream and in push mode.
pub(crate) fn complete_result(outcome: Result<Output, HandlerError>) -> task_complete::Result {
    match outcome {
        Ok(output) => task_complete::Result::Success(TaskSuccess {
            output: Some(Payload {
                data: output.data,
                content_type: output.content_type,
            }),
        }),
        Err(error) => task_complete::Result::Failure(TaskFailure {
            message: error.message,
            retryable: error.retryable,
        }),
    }
}

pub(crate) async fn send(
    tx: &mpsc::Sender<ConnectRequest>,
    message: connect_request::Message,
) -> Result<(), Error> {
    tx.send(ConnectRequest {
        message: Some(message),
    })
    .await
    .map_err(|_| Error::StreamClosed)
}

pub(crate) fn registration(shared: &Shared) -> WorkerRegistration {
    let opts = &shared.opts;
    WorkerRegistration {
        worker_id: opts.worker_id.clone(),
        name: opts.name.clone(),
        handlers: shared.handlers.keys().cloned().collect(),
        capacity: opts.concurrency,
        labels: opts
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        weight: opts.weight,
        namespace: opts.namespace.clone(),
        accepts_batches: true,
    }
}

/// Puts the worker's token on a request (`authorization: Bearer …`).
pub(crate) fn authorize<T>(shared: &Shared, request: &mut tonic::Request<T>) -> Result<(), Error> {
    bearer(shared.opts.token.as_ref(), request)
}

/// Puts `token`, if any, on a request (`authorization: Bearer …`).
pub(crate) fn bearer<T>(
    token: Option<&crate::Secret>,
    request: &mut tonic::Request<T>,
) -> Result<(), Error> {
    if let Some(token) = token {
        let value = format!("Bearer {}", token.expose())
            .parse()
            .map_err(|_| Error::InvalidOptions("the token is not a valid header value".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(())
}

/// A request carrying the worker's token.
pub(crate) fn request<T>(shared: &Shared, message: T) -> Result<tonic::Request<T>, Error> {
    let mut request = tonic::Request::new(message);
    authorize(shared, &mut request)?;
    Ok(request)
}

pub(crate) fn context(
    a: TaskAssignment,
    cancel: CancellationToken,
    shared: &Shared,
) -> TaskContext {
    let payload = a.payload.unwrap_or_default();
    let log = crate::TaskLog::new(shared.logs.clone(), &a.task_id, &a.execution_id);
    let children = crate::Children::new(a.task_id.clone(), shared.api.clone());
    TaskContext {
        task_id: a.task_id,
        attempt: a.attempt,
        execution_id: a.execution_id,
        handler: a.handler,
        payload: payload.data,
        content_type: payload.content_type,
        deadline: a.deadline.and_then(|t| SystemTime::try_from(t).ok()),
        timeout: a.timeout.and_then(|d| Duration::try_from(d).ok()),
        trace_context: a.trace_context,
        labels: a.labels,
        cancel,
        log,
        children,
        workflow_id: a.workflow_id,
        workflow_step: a.workflow_step,
        shard: (a.shard_total > 0).then_some((a.shard_index, a.shard_total)),
        parent_errors: a.parent_errors,
        parent_outputs: a
            .parent_outputs
            .into_iter()
            .map(|(step, p)| {
                let output = crate::Output {
                    data: p.data,
                    content_type: p.content_type,
                };
                (step, output)
            })
            .collect(),
    }
}

pub(crate) fn log_recorded(worker_id: &str, r: &ResultRecorded) {
    let (task_id, execution_id) = (r.task_id.as_str(), r.execution_id.as_str());
    if r.accepted {
        debug!(worker_id, task_id, execution_id, "report recorded");
    } else {
        warn!(
            worker_id,
            task_id,
            execution_id,
            reason = r.message,
            "report refused as stale"
        );
    }
}

pub(crate) fn response_kind(message: &connect_response::Message) -> &'static str {
    use connect_response::Message;
    match message {
        Message::Registered(_) => "registered",
        Message::Assign(_) => "assign",
        Message::Cancel(_) => "cancel",
        Message::Drain(_) => "drain",
        Message::Recorded(_) => "recorded",
        Message::Batch(_) => "batch",
    }
}
