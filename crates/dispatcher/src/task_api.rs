//! `TaskApi`: what callers use to submit, inspect, cancel and watch tasks.
//! Every request is validated here before anything is written.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;

use futures::Stream;
use taskmesh::v1 as pb;
use taskmesh_core::{
    Concurrency, Event, NewTask, RetryPolicy, Strategy, TaskRecord, TaskState, UnixMillis, id,
    task, validate,
};
use taskmesh_scheduler::meters;
use taskmesh_store::TaskFilter;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::auth::{self, Identity};
use crate::{
    Error, children,
    convert::{duration_millis, millis_of, state_from_pb, task_to_pb},
    engine::Shared,
    ops_api, schedule_api, workflow_api,
};

/// The `TaskApi` service.
#[derive(Clone)]
pub struct TaskApiService {
    shared: Shared,
}

impl TaskApiService {
    /// Builds the service over the shared state.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// The caller of `request` and the namespace it acts in (the one it names,
/// else its own).
pub(crate) fn scope<T>(
    shared: &Shared,
    request: &Request<T>,
    named: &str,
) -> Result<(Identity, String), Error> {
    let who = auth::identity(request);
    let namespace = who.namespace_for(named)?;
    // Every TaskApi and Admin call takes one from its namespace's bucket.
    shared.quotas.request(&namespace)?;
    Ok((who, namespace))
}

/// The bytes a list page may fill: the message limit less room for the
/// envelope and the page token.
pub(crate) fn page_budget(max_message_bytes: usize) -> usize {
    max_message_bytes.saturating_sub(16 * 1024).max(1)
}

/// Task `id` of `namespace`, or NOT_FOUND — also when it belongs to another
/// namespace, so a caller learns nothing of tasks it may not see.
pub(crate) async fn load_in(
    shared: &Shared,
    namespace: &str,
    id: &str,
) -> Result<TaskRecord, Error> {
    shared
        .store
        .get_task(id)
        .await?
        .filter(|t| t.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("task {id} not found")))
}

/// The wire form of `t` for `who`: a reader sees no execution ids (with one
/// and the assignment's secret a worker could report).
pub(crate) fn shown(who: &Identity, t: &TaskRecord) -> pb::Task {
    let mut task = task_to_pb(t);
    if !who.sees_worker_details() {
        task.execution_id.clear();
        for a in &mut task.attempts {
            a.execution_id.clear();
        }
    }
    task
}

pub(crate) fn task_id_of(text: &str) -> Result<String, Error> {
    if text.is_empty() {
        return Err(invalid("task_id must not be empty"));
    }
    id::parse_task_id(text)
        .ok_or_else(|| invalid(format!("task_id {text:?} is not a valid task id (a UUID)")))
}

/// Turns a submit request into a validated [`NewTask`], with the `run_at`
/// the caller asked for (for the idempotency fingerprint).
fn new_task(
    shared: &Shared,
    req: pb::SubmitTaskRequest,
    namespace: String,
    traceparent: String,
    now: UnixMillis,
) -> Result<(NewTask, Option<UnixMillis>), Error> {
    validate::handler_name(&req.handler).map_err(invalid)?;
    let payload = req.payload.unwrap_or_default();
    if payload.data.len() > shared.opts.max_payload_bytes {
        return Err(invalid(format!(
            "payload is {} bytes; the limit is {} bytes",
            payload.data.len(),
            shared.opts.max_payload_bytes
        )));
    }
    if req.broadcast {
        taskmesh_core::broadcast::check_payload(&payload.data).map_err(invalid)?;
    }
    validate::short_text("payload.content_type", &payload.content_type).map_err(invalid)?;
    validate::labels("labels", req.labels.iter()).map_err(invalid)?;
    validate::short_text("routing_key", &req.routing_key).map_err(invalid)?;
    validate::short_text("client_request_id", &req.client_request_id).map_err(invalid)?;
    callback_url(&req.callback_url, &shared.opts.egress)?;
    let concurrency =
        Concurrency::from_parts(&req.concurrency_key, req.concurrency_limit).map_err(invalid)?;

    let retry = retry_policy(req.retry_policy)?;
    let timeout_ms = match &req.timeout {
        None => task::DEFAULT_TIMEOUT_MS,
        Some(d) => match duration_millis(d) {
            Some(ms) if (1..=7 * 24 * 3_600_000).contains(&ms) => ms,
            _ => return Err(invalid("timeout must be between 1 ms and 7 days")),
        },
    };
    let requested_run_at = match (&req.run_at, &req.delay) {
        (Some(_), Some(_)) => return Err(invalid("give run_at or delay, not both")),
        (Some(ts), None) => Some(millis_of(ts).ok_or_else(|| invalid("run_at is out of range"))?),
        (None, Some(d)) => {
            let ms = duration_millis(d).ok_or_else(|| invalid("delay must not be negative"))?;
            Some(now.saturating_add(ms))
        }
        (None, None) => None,
    };
    // A relative delay is resolved on each submit; fingerprint the delay
    // itself, not the instant, so an honest retry of the same request matches.
    let fingerprint_run_at = match (&req.run_at, &req.delay) {
        (None, Some(d)) => duration_millis(d).map(|ms| -ms - 1),
        _ => requested_run_at,
    };
    Ok((
        NewTask {
            id: id::new_task_id(),
            namespace,
            handler: req.handler,
            payload: payload.data,
            content_type: payload.content_type,
            priority: req.priority,
            labels: req.labels.into_iter().collect::<BTreeMap<_, _>>(),
            routing_key: req.routing_key,
            client_request_id: (!req.client_request_id.is_empty()).then_some(req.client_request_id),
            callback_url: req.callback_url,
            retry,
            timeout_ms,
            run_at: requested_run_at.unwrap_or(now),
            traceparent,
            balancer: strategy_from_pb(req.balancer)?,
            schedule_id: None,
            concurrency,
            workflow: None,
            // Set by the caller once checked (`children::parent_of`).
            parent_task_id: None,
            broadcast: req.broadcast,
            runs_workflow: false,
            shard: None,
        },
        fingerprint_run_at,
    ))
}

/// Checks a callback URL: malformed is INVALID_ARGUMENT; a well-formed URL
/// whose address the egress policy refuses is PERMISSION_DENIED (the
/// operator's policy, not the request's shape, says no).
pub(crate) fn callback_url(
    url: &str,
    egress: &taskmesh_core::egress::EgressPolicy,
) -> Result<(), Error> {
    validate::callback_url(url, egress).map_err(|e| match e {
        validate::CallbackUrlError::Refused(message) => Error::PermissionDenied(message),
        validate::CallbackUrlError::Invalid(message) => invalid(message),
    })
}

fn strategy_from_pb(value: i32) -> Result<Option<Strategy>, Error> {
    let b = pb::BalancerStrategy::try_from(value)
        .map_err(|_| invalid(format!("balancer {value} is not a known BalancerStrategy")))?;
    Ok(crate::convert::strategy_from_pb(b))
}

pub(crate) fn retry_policy(p: Option<pb::RetryPolicy>) -> Result<RetryPolicy, Error> {
    let mut out = RetryPolicy::default();
    let Some(p) = p else { return Ok(out) };
    if p.max_attempts > 100 {
        return Err(invalid("retry_policy.max_attempts must be at most 100"));
    }
    if p.max_attempts > 0 {
        out.max_attempts = p.max_attempts;
    }
    if let Some(d) = &p.initial_backoff {
        out.initial_backoff_ms = duration_millis(d)
            .ok_or_else(|| invalid("retry_policy.initial_backoff must not be negative"))?;
    }
    if p.multiplier != 0.0 {
        if !p.multiplier.is_finite() || !(1.0..=100.0).contains(&p.multiplier) {
            return Err(invalid("retry_policy.multiplier must be between 1 and 100"));
        }
        out.multiplier = p.multiplier;
    }
    if let Some(d) = &p.max_backoff {
        out.max_backoff_ms = duration_millis(d)
            .ok_or_else(|| invalid("retry_policy.max_backoff must not be negative"))?;
    }
    // A cap below the first backoff (the caller's or the default) caps
    // nothing: the first backoff is the cap (the contract says so; a JSON
    // schema cannot compare two durations, so it is not refused).
    out.max_backoff_ms = out.max_backoff_ms.max(out.initial_backoff_ms);
    Ok(out)
}

/// The trace context to store with a task: the request span's (a child of
/// the caller's `traceparent`, which the REST gateway forwards as gRPC
/// metadata), or the caller's own when this node exports no traces; empty
/// when there is none.
fn traceparent_of(meta: &tonic::metadata::MetadataMap) -> String {
    let given = meta
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 128)
        .unwrap_or_default();
    crate::trace_context::traceparent_of(&tracing::Span::current(), given)
}

/// A refused entry of a batch submit.
fn refused(status: Status) -> pb::SubmitTasksResult {
    pb::SubmitTasksResult {
        accepted: None,
        error_code: status.code() as i32,
        error_message: status.message().to_string(),
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchTaskResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::task_api_server::TaskApi for TaskApiService {
    async fn submit_task(
        &self,
        request: Request<pb::SubmitTaskRequest>,
    ) -> Result<Response<pb::SubmitTaskResponse>, Status> {
        let traceparent = traceparent_of(request.metadata());
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        children::may_submit(&who, &request.get_ref().parent_task_id)?;
        let now = self.shared.clock.now_millis();
        let req = request.into_inner();
        let parent_task_id = req.parent_task_id.clone();
        let (mut task, fp_run_at) = new_task(&self.shared, req, namespace, traceparent, now)?;
        task.parent_task_id =
            children::parent_of(&self.shared, &who, &task.namespace, &parent_task_id).await?;
        let admitted_in = task.namespace.clone();
        self.shared.quotas.admit_tasks(&admitted_in, 1)?;
        let fingerprint = task.request_fingerprint(fp_run_at);
        let created = self.shared.submitter.create(task, fingerprint).await;
        self.shared.quotas.settled(&admitted_in, 1);
        let created = created.map_err(Error::from)?;
        let t = &created.task;
        if let Some(parent) = &t.parent_task_id {
            children::settle(&self.shared, &t.namespace, parent).await;
        }
        if !created.existing {
            debug!(task_id = %t.id, handler = %t.handler, state = %t.state, "task submitted");
            meters::submitted(&t.namespace, &t.handler, 1);
            match t.state {
                TaskState::Ready => self.shared.wake.notify_one(),
                // Claimed at submit: the engine pushes it; nothing waits.
                TaskState::Dispatching => {}
                _ => self.shared.scheduler.wake(),
            }
        }
        Ok(Response::new(pb::SubmitTaskResponse {
            task_id: t.id.clone(),
            task: Some(shown(&who, t)),
            existing: created.existing,
        }))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = task_id_of(&request.get_ref().task_id)?;
        let task = load_in(&self.shared, &namespace, &id).await?;
        Ok(Response::new(pb::GetTaskResponse {
            task: Some(shown(&who, &task)),
        }))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        let state = pb::TaskState::try_from(req.state)
            .map_err(|_| invalid(format!("state {} is not a known TaskState", req.state)))?;
        if !req.handler.is_empty() {
            validate::handler_name(&req.handler).map_err(invalid)?;
        }
        if req.page_size > 1_000 {
            return Err(invalid("page_size must be at most 1000").into());
        }
        let budget = page_budget(self.shared.opts.max_message_bytes);
        let bodies = match pb::TaskView::try_from(req.view) {
            Ok(pb::TaskView::Unspecified | pb::TaskView::Summary) => None,
            // The bodies' bytes, within what the answer may carry.
            Ok(pb::TaskView::Full) => Some(budget),
            Err(_) => {
                return Err(invalid(format!("view {} is not a known TaskView", req.view)).into());
            }
        };
        let parent_task_id = if req.parent_task_id.is_empty() {
            None
        } else {
            Some(id::parse_task_id(&req.parent_task_id).ok_or_else(|| {
                invalid(format!(
                    "parent_task_id {:?} is not a valid task id (a UUID)",
                    req.parent_task_id
                ))
            })?)
        };
        let before_id = if req.page_token.is_empty() {
            None
        } else {
            Some(
                id::parse_task_id(&req.page_token)
                    .ok_or_else(|| invalid("page_token is not valid"))?,
            )
        };
        let page = self
            .shared
            .store
            .list_tasks(&TaskFilter {
                namespace: Some(namespace),
                state: state_from_pb(state),
                handler: (!req.handler.is_empty()).then_some(req.handler),
                limit: if req.page_size == 0 {
                    100
                } else {
                    req.page_size
                },
                before_id,
                bodies,
                label: ops_api::label_filter(&req.label)?,
                created_after: ops_api::instant("created_after", req.created_after.as_ref())?,
                created_before: ops_api::instant("created_before", req.created_before.as_ref())?,
                client_request_id: (!req.client_request_id.is_empty())
                    .then_some(req.client_request_id),
                parent_task_id,
            })
            .await
            .map_err(Error::from)?;
        // A page is bounded in bytes as well as rows: it ends early (with a
        // token to go on from) before its answer would pass the message
        // limit, instead of failing to encode after all the work.
        let mut tasks = Vec::with_capacity(page.tasks.len());
        let mut size = 0;
        let mut next_page_token = page.next_before_id.unwrap_or_default();
        for t in &page.tasks {
            let mut task = shown(&who, t);
            if bodies.is_none() {
                task.payload = None;
                task.output = None;
            }
            let len = prost::Message::encoded_len(&task) + 8;
            if !tasks.is_empty() && size + len > budget {
                next_page_token = tasks
                    .last()
                    .map(|t: &pb::Task| t.task_id.clone())
                    .unwrap_or_default();
                break;
            }
            size += len;
            tasks.push(task);
        }
        Ok(Response::new(pb::ListTasksResponse {
            tasks,
            next_page_token,
        }))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        let id = task_id_of(&req.task_id)?;
        validate::short_text("reason", &req.reason).map_err(invalid)?;
        let before = load_in(&self.shared, &namespace, &id).await?;
        if before.state.is_terminal() {
            // An ended task is answered unchanged, but its live children
            // are cancelled: a parent that spawned them and returned (a
            // fan-out) is cancelled with its work, and cancelling a
            // cancelled task again finishes a sweep cut short (a node lost
            // after the parent's cancel).
            children::cancel_children(&self.shared, &namespace, &id, "parent task cancelled")
                .await?;
            return Ok(Response::new(pb::CancelTaskResponse {
                task: Some(shown(&who, &before)),
            }));
        }
        let reason = if req.reason.is_empty() {
            "cancelled by a caller".to_string()
        } else {
            req.reason
        };
        let task = ops_api::cancel_one(&self.shared, &before, &reason).await?;
        if task.state == TaskState::Cancelled {
            children::cancel_children(&self.shared, &namespace, &id, "parent task cancelled")
                .await?;
        }
        let task = self
            .shared
            .store
            .get_task(&id)
            .await
            .map_err(Error::from)?
            .unwrap_or(task);
        Ok(Response::new(pb::CancelTaskResponse {
            task: Some(shown(&who, &task)),
        }))
    }

    async fn ack_task(
        &self,
        request: Request<pb::AckTaskRequest>,
    ) -> Result<Response<pb::AckTaskResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        let id = task_id_of(&req.task_id)?;
        if req.execution_id.is_empty() {
            return Err(invalid("execution_id must not be empty").into());
        }
        validate::short_text("execution_id", &req.execution_id).map_err(invalid)?;
        // Only the worker that was given the assignment knows its secret:
        // an execution id (which GetTask shows) alone acknowledges nothing.
        if !self
            .shared
            .is_assignment_secret(&req.execution_id, &req.report_secret)
        {
            return Err(Error::PermissionDenied(
                "report_secret is not the secret of this assignment".into(),
            )
            .into());
        }
        load_in(&self.shared, &namespace, &id).await?;
        let now = self.shared.clock.now_millis();
        let event = Event::Ack {
            execution_id: req.execution_id,
            at: None,
        };
        let task = self
            .shared
            .store
            .transition(&id, &event, now)
            .await
            .map_err(Error::from)?;
        self.shared.scheduler.wake();
        Ok(Response::new(pb::AckTaskResponse {
            task: Some(shown(&who, &task)),
        }))
    }

    type WatchTaskStream = WatchStream;
    type WatchTaskLogsStream = crate::log_api::LogStream;

    async fn get_task_logs(
        &self,
        request: Request<pb::GetTaskLogsRequest>,
    ) -> Result<Response<pb::GetTaskLogsResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let page = crate::log_api::get(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(page))
    }

    async fn watch_task_logs(
        &self,
        request: Request<pb::WatchTaskLogsRequest>,
    ) -> Result<Response<Self::WatchTaskLogsStream>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let stream = crate::log_api::watch(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = task_id_of(&request.get_ref().task_id)?;
        // Subscribe before the first read, so no change falls between them.
        let mut changes = self.shared.store.subscribe();
        let store = self.shared.store.clone();
        let first = load_in(&self.shared, &namespace, &id).await?;
        // The watch's place, held as long as its stream runs.
        let slot = self.shared.quotas.watch(&namespace)?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let _slot = slot;
            let mut version = first.version;
            let mut done = first.state.is_terminal();
            let send = |t| pb::WatchTaskResponse {
                task: Some(shown(&who, &t)),
            };
            if tx.send(Ok(send(first))).await.is_err() {
                return;
            }
            while !done {
                let must_read = tokio::select! {
                    _ = tx.closed() => return,
                    change = changes.recv() => match change {
                        Ok(c) => c.task_id == id && c.version > version,
                        Err(broadcast::error::RecvError::Lagged(_)) => true,
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                };
                if !must_read {
                    continue;
                }
                match store.get_task(&id).await {
                    Ok(Some(t)) if t.version > version => {
                        version = t.version;
                        done = t.state.is_terminal();
                        if tx.send(Ok(send(t))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(err) => {
                        warn!(task_id = %id, error = %err, "watch read failed");
                        let _ = tx.send(Err(Status::from(Error::from(err)))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn submit_tasks(
        &self,
        request: Request<pb::SubmitTasksRequest>,
    ) -> Result<Response<pb::SubmitTasksResponse>, Status> {
        let traceparent = traceparent_of(request.metadata());
        let who = auth::identity(&request);
        let req = request.into_inner();
        // A worker's batch is children only, or refused whole.
        match req.tasks.iter().find(|t| t.parent_task_id.is_empty()) {
            Some(t) => children::may_submit(&who, &t.parent_task_id)?,
            None if req.tasks.is_empty() => children::may_submit(&who, "")?,
            None => {}
        }
        if req.tasks.is_empty() || req.tasks.len() > 10_000 {
            return Err(invalid(format!(
                "tasks must hold 1 to 10000 entries, got {}",
                req.tasks.len()
            ))
            .into());
        }
        // Every entry is validated on its own; the valid ones are written
        // together, in one store transaction (one commit for the batch).
        let now = self.shared.clock.now_millis();
        let mut results: Vec<Option<pb::SubmitTasksResult>> = Vec::with_capacity(req.tasks.len());
        let mut valid = Vec::new();
        let mut slots = Vec::new();
        // Each parent is read once however many entries name it.
        let mut parents: HashMap<(String, String), Result<Option<String>, Status>> = HashMap::new();
        for (i, task) in req.tasks.into_iter().enumerate() {
            let parent_task_id = task.parent_task_id.clone();
            let mut entry = who.namespace_for(&task.namespace).and_then(|namespace| {
                new_task(&self.shared, task, namespace, traceparent.clone(), now)
            });
            if let Ok((task, _)) = &mut entry {
                let key = (task.namespace.clone(), parent_task_id);
                let parent = match parents.get(&key) {
                    Some(found) => found.clone(),
                    None => {
                        let found = children::parent_of(&self.shared, &who, &key.0, &key.1)
                            .await
                            .map_err(Status::from);
                        parents.insert(key, found.clone());
                        found
                    }
                };
                match parent {
                    Ok(parent) => task.parent_task_id = parent,
                    Err(status) => {
                        results.push(Some(refused(status)));
                        continue;
                    }
                }
            }
            match entry {
                Ok((task, fp_run_at)) => {
                    let fingerprint = task.request_fingerprint(fp_run_at);
                    valid.push((task, fingerprint));
                    slots.push(i);
                    results.push(None);
                }
                Err(err) => results.push(Some(refused(Status::from(err)))),
            }
        }
        // Quotas per namespace: the batch takes one request from each
        // namespace's bucket and its entries' places in the backlog; the
        // entries of a namespace over either are refused, the others go on.
        let mut per_namespace: HashMap<&str, u64> = HashMap::new();
        for (task, _) in &valid {
            *per_namespace.entry(task.namespace.as_str()).or_default() += 1;
        }
        let mut over: HashMap<String, Status> = HashMap::new();
        let mut admitted: Vec<(String, u64)> = Vec::new();
        for (namespace, n) in per_namespace {
            let quotas = &self.shared.quotas;
            match quotas
                .request(namespace)
                .and_then(|()| quotas.admit_tasks(namespace, n))
            {
                Ok(()) => admitted.push((namespace.to_string(), n)),
                Err(err) => {
                    over.insert(namespace.to_string(), Status::from(err));
                }
            }
        }
        if !over.is_empty() {
            let mut kept = Vec::with_capacity(valid.len());
            let mut kept_slots = Vec::with_capacity(slots.len());
            for (entry, i) in valid.into_iter().zip(slots) {
                match over.get(&entry.0.namespace) {
                    Some(status) => {
                        results[i] = Some(refused(Status::new(status.code(), status.message())))
                    }
                    None => {
                        kept.push(entry);
                        kept_slots.push(i);
                    }
                }
            }
            valid = kept;
            slots = kept_slots;
        }
        if !valid.is_empty() {
            let created = self.shared.submitter.create_many(valid).await;
            for (namespace, n) in &admitted {
                self.shared.quotas.settled(namespace, *n);
            }
            let created = created.map_err(Error::from)?;
            let mut parents_of_new: Vec<(String, String)> = created
                .iter()
                .flatten()
                .filter_map(|c| Some((c.task.namespace.clone(), c.task.parent_task_id.clone()?)))
                .collect();
            parents_of_new.sort_unstable();
            parents_of_new.dedup();
            for (namespace, parent) in &parents_of_new {
                children::settle(&self.shared, namespace, parent).await;
            }
            let (mut ready, mut later) = (false, false);
            let mut per_handler: HashMap<(String, String), u64> = HashMap::new();
            for (i, outcome) in slots.into_iter().zip(created) {
                results[i] = Some(match outcome {
                    Ok(c) => {
                        if !c.existing {
                            debug!(task_id = %c.task.id, handler = %c.task.handler, state = %c.task.state, "task submitted");
                            let key = (c.task.namespace.clone(), c.task.handler.clone());
                            *per_handler.entry(key).or_default() += 1;
                            match c.task.state {
                                TaskState::Ready => ready = true,
                                TaskState::Dispatching => {}
                                _ => later = true,
                            }
                        }
                        pb::SubmitTasksResult {
                            accepted: Some(pb::SubmitTaskResponse {
                                task_id: c.task.id.clone(),
                                task: Some(shown(&who, &c.task)),
                                existing: c.existing,
                            }),
                            error_code: 0,
                            error_message: String::new(),
                        }
                    }
                    Err(err) => refused(Status::from(Error::from(err))),
                });
            }
            for ((namespace, handler), n) in per_handler {
                meters::submitted(&namespace, &handler, n);
            }
            if ready {
                self.shared.wake.notify_one();
            }
            if later {
                self.shared.scheduler.wake();
            }
        }
        let mut answer = pb::SubmitTasksResponse {
            results: results
                .into_iter()
                .map(|r| r.unwrap_or_else(|| refused(Status::internal("entry left unanswered"))))
                .collect(),
        };
        // The tasks are committed: the answer must reach the caller, or a
        // caller retrying without client_request_id makes duplicates. When
        // echoing every task would pass the message limit, the answer
        // carries ids (and codes) only.
        let budget = page_budget(self.shared.opts.max_message_bytes);
        if prost::Message::encoded_len(&answer) > budget {
            for r in &mut answer.results {
                if let Some(accepted) = &mut r.accepted {
                    accepted.task = None;
                }
            }
        }
        Ok(Response::new(answer))
    }

    async fn create_schedule(
        &self,
        request: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::CreateScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let def = request
            .into_inner()
            .schedule
            .ok_or_else(|| invalid("schedule is required"))?;
        let s = schedule_api::create(&self.shared, namespace, def).await?;
        info!(schedule_id = %s.id, kind = s.kind.as_str(), next_fire_at = ?s.next_fire_at, "schedule created");
        Ok(Response::new(pb::CreateScheduleResponse {
            schedule: Some(schedule_api::to_pb(&s)),
        }))
    }

    async fn get_schedule(
        &self,
        request: Request<pb::GetScheduleRequest>,
    ) -> Result<Response<pb::GetScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = schedule_api::schedule_id_of(&request.get_ref().schedule_id)?;
        let s = schedule_api::load(&self.shared, &namespace, &id).await?;
        let fires = self
            .shared
            .store
            .recent_fires(&id, 100)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::GetScheduleResponse {
            schedule: Some(schedule_api::to_pb(&s)),
            recent_fires: fires.iter().map(schedule_api::fire_to_pb).collect(),
        }))
    }

    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        if req.page_size > 1_000 {
            return Err(invalid("page_size must be at most 1000").into());
        }
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(
                id::parse_task_id(&req.page_token)
                    .ok_or_else(|| invalid("page_token is not valid"))?,
            )
        };
        let limit = if req.page_size == 0 {
            100
        } else {
            req.page_size
        };
        let (page, next) = self
            .shared
            .store
            .list_schedules(Some(&namespace), after.as_deref(), limit)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListSchedulesResponse {
            schedules: page.iter().map(schedule_api::to_pb).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn update_schedule(
        &self,
        request: Request<pb::UpdateScheduleRequest>,
    ) -> Result<Response<pb::UpdateScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        let id = schedule_api::schedule_id_of(&req.schedule_id)?;
        let def = req
            .schedule
            .ok_or_else(|| invalid("schedule is required"))?;
        let shared = &self.shared;
        let s = schedule_api::modify(shared, &namespace, &id, |s, now| {
            schedule_api::apply_definition(shared, s, def.clone())?;
            schedule_api::restart_timetable(s, now)
        })
        .await?;
        info!(schedule_id = %id, next_fire_at = ?s.next_fire_at, "schedule updated");
        Ok(Response::new(pb::UpdateScheduleResponse {
            schedule: Some(schedule_api::to_pb(&s)),
        }))
    }

    async fn delete_schedule(
        &self,
        request: Request<pb::DeleteScheduleRequest>,
    ) -> Result<Response<pb::DeleteScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = schedule_api::schedule_id_of(&request.get_ref().schedule_id)?;
        // Another namespace's schedule is NOT_FOUND, as if it did not exist.
        schedule_api::load(&self.shared, &namespace, &id).await?;
        if !self
            .shared
            .store
            .delete_schedule(&id)
            .await
            .map_err(Error::from)?
        {
            return Err(Error::NotFound(format!("schedule {id} not found")).into());
        }
        info!(schedule_id = %id, "schedule deleted");
        Ok(Response::new(pb::DeleteScheduleResponse {}))
    }

    async fn pause_schedule(
        &self,
        request: Request<pb::PauseScheduleRequest>,
    ) -> Result<Response<pb::PauseScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = schedule_api::schedule_id_of(&request.get_ref().schedule_id)?;
        let s = schedule_api::modify(&self.shared, &namespace, &id, |s, _| {
            s.paused = true;
            s.next_fire_at = None;
            Ok(())
        })
        .await?;
        info!(schedule_id = %id, "schedule paused");
        Ok(Response::new(pb::PauseScheduleResponse {
            schedule: Some(schedule_api::to_pb(&s)),
        }))
    }

    async fn resume_schedule(
        &self,
        request: Request<pb::ResumeScheduleRequest>,
    ) -> Result<Response<pb::ResumeScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = schedule_api::schedule_id_of(&request.get_ref().schedule_id)?;
        let s = schedule_api::modify(&self.shared, &namespace, &id, |s, now| {
            if !s.paused {
                return Ok(());
            }
            s.paused = false;
            schedule_api::restart_timetable(s, now)
        })
        .await?;
        info!(schedule_id = %id, next_fire_at = ?s.next_fire_at, "schedule resumed");
        Ok(Response::new(pb::ResumeScheduleResponse {
            schedule: Some(schedule_api::to_pb(&s)),
        }))
    }

    async fn trigger_schedule(
        &self,
        request: Request<pb::TriggerScheduleRequest>,
    ) -> Result<Response<pb::TriggerScheduleResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let id = schedule_api::schedule_id_of(&request.get_ref().schedule_id)?;
        let task = schedule_api::trigger(&self.shared, &namespace, &id).await?;
        info!(schedule_id = %id, task_id = %task.id, "schedule triggered");
        Ok(Response::new(pb::TriggerScheduleResponse {
            task: Some(shown(&who, &task)),
        }))
    }

    async fn list_circuit_breakers(
        &self,
        request: Request<pb::ListCircuitBreakersRequest>,
    ) -> Result<Response<pb::ListCircuitBreakersResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        Ok(Response::new(pb::ListCircuitBreakersResponse {
            breakers: schedule_api::breakers(&self.shared, &namespace),
        }))
    }

    async fn list_workers(
        &self,
        request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let handler = request.into_inner().handler;
        if !handler.is_empty() {
            validate::handler_name(&handler).map_err(invalid)?;
        }
        // This replica's own streams, as it sees them now, plus every other
        // replica's from the cluster-wide registry.
        let mut workers = self
            .shared
            .registry
            .snapshot(self.shared.coord.node_id(), Some(&namespace));
        let local: std::collections::HashSet<String> =
            workers.iter().map(|w| w.session_id.clone()).collect();
        let cluster = self
            .shared
            .coord
            .list_workers()
            .await
            .map_err(Error::from)?;
        for e in cluster
            .into_iter()
            .filter(|e| !local.contains(&e.session_id) && e.namespace == namespace)
        {
            workers.push(pb::WorkerInfo {
                namespace: e.namespace,
                worker_id: e.worker_id,
                name: e.name,
                handlers: e.handlers,
                capacity: e.capacity,
                active: e.load.active,
                labels: e.labels.into_iter().collect(),
                weight: e.weight,
                cpu_idle_percent: e.load.cpu_idle_percent,
                avg_cost_ms: e.load.avg_cost_ms,
                last_seen_time: Some(crate::convert::timestamp(e.last_seen)),
                draining: e.draining,
                session_id: e.session_id,
                node_id: e.node_id,
                mode: crate::registry::worker_mode(e.push).into(),
            });
        }
        if !handler.is_empty() {
            workers.retain(|w| w.handlers.contains(&handler));
        }
        if !who.sees_worker_details() {
            // A session id is what a push worker's results are filed under.
            for w in &mut workers {
                w.session_id.clear();
            }
        }
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }

    async fn retry_task(
        &self,
        request: Request<pb::RetryTaskRequest>,
    ) -> Result<Response<pb::RetryTaskResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let (task, retried) =
            ops_api::retry(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(pb::RetryTaskResponse {
            task: Some(shown(&who, &task)),
            retried,
        }))
    }

    async fn cancel_tasks(
        &self,
        request: Request<pb::CancelTasksRequest>,
    ) -> Result<Response<pb::CancelTasksResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer =
            ops_api::cancel_matching(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn get_stats(
        &self,
        request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = ops_api::stats(&self.shared, &namespace, request.get_ref()).await?;
        Ok(Response::new(answer))
    }

    async fn preview_schedule(
        &self,
        request: Request<pb::PreviewScheduleRequest>,
    ) -> Result<Response<pb::PreviewScheduleResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = ops_api::preview(&self.shared, &namespace, request.into_inner())?;
        Ok(Response::new(answer))
    }

    async fn drain_worker(
        &self,
        request: Request<pb::DrainWorkerRequest>,
    ) -> Result<Response<pb::DrainWorkerResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = ops_api::drain(&self.shared, &who, &namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn submit_workflow(
        &self,
        request: Request<pb::SubmitWorkflowRequest>,
    ) -> Result<Response<pb::SubmitWorkflowResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer =
            workflow_api::submit(&self.shared, &who, namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn get_workflow(
        &self,
        request: Request<pb::GetWorkflowRequest>,
    ) -> Result<Response<pb::GetWorkflowResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = workflow_api::get(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn list_workflows(
        &self,
        request: Request<pb::ListWorkflowsRequest>,
    ) -> Result<Response<pb::ListWorkflowsResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = workflow_api::list(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn cancel_workflow(
        &self,
        request: Request<pb::CancelWorkflowRequest>,
    ) -> Result<Response<pb::CancelWorkflowResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = workflow_api::cancel(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn retry_workflow(
        &self,
        request: Request<pb::RetryWorkflowRequest>,
    ) -> Result<Response<pb::RetryWorkflowResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = workflow_api::retry(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    type WatchWorkflowStream = workflow_api::WatchStream;

    async fn watch_workflow(
        &self,
        request: Request<pb::WatchWorkflowRequest>,
    ) -> Result<Response<Self::WatchWorkflowStream>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let stream = workflow_api::watch(&self.shared, &namespace, request.into_inner()).await?;
        Ok(Response::new(stream))
    }
}
