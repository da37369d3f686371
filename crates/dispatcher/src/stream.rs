//! `Dispatcher.Connect`: one bidirectional stream per worker. The first
//! message registers; then heartbeats, ACKs, rejects and results flow in, and
//! assignments, cancels and receipts flow out.
//!
//! A stream that closes, or stays silent for three heartbeat intervals, is
//! a lost worker: its unfinished attempts are taken back at once.

use std::collections::HashSet;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use taskmesh::batch::{
    BatchSwitch, Batchable, Coalesce, MAX_BATCH_ENCODED_BYTES, MAX_BATCH_MESSAGES,
};
use taskmesh::v1::{self as pb, connect_request::Message as In, connect_response::Message as Out};
use taskmesh_coord::{WorkerEntry, WorkerLoad};
use taskmesh_core::{Event, ReleaseReason, id, validate};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, debug_span, info, info_span, warn};

use crate::{
    convert::duration,
    engine::{Shared, outcome_of},
    lost, push,
    registry::{After, Heartbeat, Registration, StreamTx},
};

/// The `Dispatcher` service.
#[derive(Clone)]
pub struct DispatcherService {
    shared: Shared,
}

impl DispatcherService {
    /// Builds the service over the shared state.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }
}

type OutStream = Pin<Box<dyn Stream<Item = Result<pb::ConnectResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::dispatcher_server::Dispatcher for DispatcherService {
    type ConnectStream = OutStream;

    async fn connect(
        &self,
        request: Request<Streaming<pb::ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if self
            .shared
            .shedding
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(Status::unavailable(crate::health::SHED_MESSAGE));
        }
        let who = crate::auth::identity(&request);
        let mut inbound = request.into_inner();
        // The register message is the request's "body": while it has not
        // come the stream holds a concurrency slot, so it gets no longer
        // than a unary request's body does.
        let opts = &self.shared.opts;
        let wait = (opts.heartbeat_interval * 3).min(opts.request_body_timeout);
        let first = tokio::time::timeout(wait, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no register message arrived in time"))??
            .ok_or_else(|| Status::invalid_argument("stream closed before register"))?;
        let Some(In::Register(reg)) = first.message else {
            return Err(Status::invalid_argument(
                "the first message on a Dispatcher stream must be register",
            ));
        };
        validate_registration(&reg)?;
        let namespace = who.namespace_for(&reg.namespace)?;
        self.shared.quotas.admit_worker(
            &namespace,
            reg.handlers.len(),
            self.shared.registry.sessions_in(&namespace),
        )?;
        claim_worker_id(&self.shared, &who, &reg.worker_id).await?;

        let session_id = id::new_session_id();
        let capacity = reg.capacity;
        let (tx, rx) = mpsc::channel(capacity as usize * 2 + 64);
        let now = self.shared.clock.now_millis();
        // Cluster-wide first: the leader re-dispatches the attempts of any
        // session it cannot see, so a stream must not take tasks before its
        // entry is written.
        let entry = WorkerEntry {
            push: false,
            session_id: session_id.clone(),
            worker_id: reg.worker_id.clone(),
            namespace: namespace.clone(),
            owner: who.principal.clone(),
            name: reg.name.clone(),
            node_id: self.shared.coord.node_id().to_string(),
            handlers: reg.handlers.clone(),
            capacity,
            labels: reg.labels.clone().into_iter().collect(),
            weight: reg.weight.max(1),
            load: WorkerLoad::default(),
            last_seen: now,
            draining: false,
        };
        self.shared
            .coord
            .put_worker(entry.clone())
            .await
            .map_err(|err| {
                crate::error::opaque(
                    tonic::Code::Unavailable,
                    "cannot register the worker cluster-wide; retry with backoff",
                    &err,
                )
            })?;
        self.shared.registry.insert(Registration {
            push: false,
            session_id: session_id.clone(),
            worker_id: reg.worker_id.clone(),
            namespace: namespace.clone(),
            owner: who.principal.clone(),
            name: reg.name.clone(),
            handlers: reg.handlers.iter().cloned().collect::<HashSet<_>>(),
            capacity,
            labels: reg.labels.clone().into_iter().collect(),
            weight: reg.weight.max(1),
            tx: tx.clone(),
            now,
        });
        let registered = pb::ConnectResponse {
            message: Some(Out::Registered(pb::WorkerRegistered {
                session_id: session_id.clone(),
                heartbeat_interval: Some(duration(
                    self.shared.opts.heartbeat_interval.as_millis() as i64
                )),
                ack_timeout: Some(duration(self.shared.opts.ack_timeout.as_millis() as i64)),
                // Only a limit that holds the largest batch a worker forms.
                accepts_batches: self.shared.opts.max_message_bytes >= MAX_BATCH_ENCODED_BYTES,
            })),
        };
        // The channel is empty and sized above 1: this cannot fail.
        let _ = tx.try_send(Ok(Box::new(registered)));
        info!(worker_id = %reg.worker_id, session_id = %session_id, handlers = ?reg.handlers, capacity, "worker registered");
        if self.shared.registry.streams_of(&reg.worker_id) == 1 {
            // A worker that reconnects (after its replica died, say) gets a
            // new session: attempts pushed to its earlier streams can never
            // be reported (their results are refused as stale), so take them
            // back now rather than at their execution deadline.
            let shared = self.shared.clone();
            let worker_id = reg.worker_id.clone();
            let namespace = namespace.clone();
            tokio::spawn(async move {
                lost::release_earlier_attempts(&shared, &namespace, &worker_id).await
            });
        }
        self.shared.wake.notify_one();

        let shared = self.shared.clone();
        let worker_id = reg.worker_id.clone();
        let span =
            info_span!("worker_stream", worker_id = %reg.worker_id, session_id = %session_id);
        tokio::spawn(
            async move {
                let reason = read_loop(&shared, &session_id, &tx, inbound, entry).await;
                lost::lose_session(&shared, &session_id, &worker_id, &reason).await;
            }
            .instrument(span),
        );
        // What the engine and the receipts queue goes out as it comes, or
        // gathered into batches for a worker that reads them.
        // (Within this node's own encoding limit, with room for framing.)
        let batches = BatchSwitch::new(reg.accepts_batches);
        let max_bytes = (opts.max_message_bytes / 2).max(1);
        Ok(Response::new(Box::pin(
            Coalesce::new(rx, |m| m.map(|m| *m), batches).with_max_bytes(max_bytes),
        )))
    }

    async fn register_push_worker(
        &self,
        request: Request<pb::RegisterPushWorkerRequest>,
    ) -> Result<Response<pb::RegisterPushWorkerResponse>, Status> {
        let who = crate::auth::identity(&request);
        let registered = push::register(&self.shared, &who, request.into_inner()).await?;
        Ok(Response::new(pb::RegisterPushWorkerResponse {
            registered: Some(registered),
        }))
    }

    async fn report_result(
        &self,
        request: Request<pb::ReportResultRequest>,
    ) -> Result<Response<pb::ReportResultResponse>, Status> {
        let who = crate::auth::identity(&request);
        let recorded = push::report(&self.shared, &who, request.into_inner()).await?;
        Ok(Response::new(pb::ReportResultResponse {
            recorded: Some(recorded),
        }))
    }

    async fn report_logs(
        &self,
        request: Request<pb::ReportLogsRequest>,
    ) -> Result<Response<pb::ReportLogsResponse>, Status> {
        let who = crate::auth::identity(&request);
        push::report_logs(&self.shared, &who, request.into_inner())?;
        Ok(Response::new(pb::ReportLogsResponse {}))
    }

    async fn deregister_push_worker(
        &self,
        request: Request<pb::DeregisterPushWorkerRequest>,
    ) -> Result<Response<pb::DeregisterPushWorkerResponse>, Status> {
        let who = crate::auth::identity(&request);
        push::deregister(&self.shared, &who, request.into_inner()).await?;
        Ok(Response::new(pb::DeregisterPushWorkerResponse {}))
    }
}

/// Refuses a registration under a worker id that another identity holds
/// (here or on any replica): taking it over would take back that worker's
/// running attempts, so they ran twice.
pub(crate) async fn claim_worker_id(
    shared: &Shared,
    who: &crate::auth::Identity,
    worker_id: &str,
) -> Result<(), Status> {
    let taken = |owner: &str| owner != who.principal;
    let local = shared.registry.owner_of(worker_id);
    let held = match local {
        Some(owner) => taken(&owner),
        None => shared
            .coord
            .list_workers()
            .await
            .map_err(|err| {
                crate::error::opaque(
                    tonic::Code::Unavailable,
                    "cannot read the worker registry; retry with backoff",
                    &err,
                )
            })?
            .iter()
            .any(|e| e.worker_id == worker_id && taken(&e.owner)),
    };
    if held {
        tracing::warn!(worker_id, principal = %who.principal, "refused: worker id held by another identity");
        metrics::counter!(crate::auth::AUTH_REFUSED_TOTAL, "reason" => "worker_id").increment(1);
        return Err(Status::permission_denied(format!(
            "worker id {worker_id:?} is registered by another identity"
        )));
    }
    Ok(())
}

pub(crate) fn validate_registration(reg: &pb::WorkerRegistration) -> Result<(), Status> {
    let bad = |m: String| Err(Status::invalid_argument(m));
    if reg.worker_id.is_empty() {
        return bad("register.worker_id must not be empty".into());
    }
    validate::short_text("register.worker_id", &reg.worker_id).or_else(bad)?;
    validate::short_text("register.name", &reg.name).or_else(bad)?;
    if reg.handlers.is_empty() {
        return bad("register.handlers must name at least one handler".into());
    }
    for h in &reg.handlers {
        validate::handler_name(h)
            .map_err(|m| Status::invalid_argument(format!("register.handlers: {m}")))?;
    }
    if reg.capacity == 0 || reg.capacity > 10_000 {
        return bad(format!(
            "register.capacity must be 1..=10000, got {}",
            reg.capacity
        ));
    }
    validate::labels("register.labels", reg.labels.iter()).or_else(bad)?;
    Ok(())
}

/// Work waiting for a batch to commit: the receipt and the slot's release
/// of an ACK or a result.
pub(crate) type AfterCommit = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Reads the worker's messages until the stream ends; returns why it ended.
///
/// ACKs and results are queued on the batcher in the order they arrive and
/// the loop reads on without waiting for their commit; what must follow the
/// commit (the receipt, freeing the slot) runs as each batch lands. So one
/// stream's events share commits instead of taking one each, and a worker
/// still hears "recorded" only once its report is durable.
async fn read_loop(
    shared: &Shared,
    session_id: &str,
    tx: &StreamTx,
    mut inbound: Streaming<pb::ConnectRequest>,
    mut entry: WorkerEntry,
) -> String {
    let silence = shared.opts.heartbeat_interval * 3;
    let mut committing: FuturesUnordered<AfterCommit> = FuturesUnordered::new();
    let mut last_heard = tokio::time::Instant::now();
    let reason = loop {
        let message = tokio::select! {
            biased;
            Some(()) = committing.next(), if !committing.is_empty() => continue,
            _ = tokio::time::sleep_until(last_heard + silence) => {
                break format!(
                    "no message for {} ms (missed heartbeats)",
                    silence.as_millis()
                );
            }
            m = inbound.message() => m,
        };
        let msg = match message {
            Err(status) => break format!("stream error: {}", status.message()),
            Ok(None) => break "stream closed by the worker".into(),
            Ok(Some(m)) => m,
        };
        last_heard = tokio::time::Instant::now();
        let now = shared.clock.now_millis();
        shared.registry.touch(session_id, now);
        // A batch is its messages, each handled as if it came alone; one
        // that breaks the rules is refused whole, before any of it counts.
        let unbatched = msg.unbatch();
        if let Ok(inner) = &unbatched
            && let Err(why) = check_batch(inner)
        {
            warn!(error = %why, "batch refused; closing the stream");
            let _ = tx.try_send(Err(Status::invalid_argument(why.clone())));
            break format!("refused a batch: {why}");
        }
        for msg in taskmesh::batch::messages(unbatched) {
            match msg.message {
                Some(In::Heartbeat(hb)) => {
                    // Refresh the cluster-wide entry (its TTL, the load figures)
                    // off the read path: a slow coordinator must not stall the stream.
                    entry.load = WorkerLoad {
                        active: hb.active,
                        cpu_idle_percent: hb.cpu_idle_percent,
                        avg_cost_ms: hb.avg_cost_ms,
                    };
                    entry.last_seen = now;
                    entry.draining = shared.registry.is_draining(session_id);
                    let coord = shared.coord.clone();
                    let refreshed = entry.clone();
                    tokio::spawn(async move {
                        if let Err(err) = coord.put_worker(refreshed).await {
                            warn!(error = %err, "cannot refresh the worker's cluster-wide entry");
                        }
                    });
                    shared.registry.heartbeat(
                        session_id,
                        Heartbeat {
                            active: hb.active,
                            cpu_idle_percent: hb.cpu_idle_percent,
                            avg_cost_ms: hb.avg_cost_ms,
                        },
                    );
                    shared.wake.notify_one();
                }
                Some(In::Ack(ack)) => {
                    if let Some(after) = on_ack(shared, session_id, tx, ack).await {
                        committing.push(after);
                    }
                }
                Some(In::Reject(rej)) => on_reject(shared, session_id, rej).await,
                Some(In::Complete(done)) => {
                    if let Some(after) = on_complete(shared, session_id, tx, done).await {
                        committing.push(after);
                    }
                }
                Some(In::Logs(logs)) => on_logs(shared, session_id, logs),
                Some(In::Draining(d)) => {
                    info!(reason = %d.reason, "worker draining");
                    shared.registry.set_draining(session_id);
                }
                Some(In::Register(_)) => {
                    warn!("second register on one stream ignored");
                }
                // `check_batch` let none through.
                Some(In::Batch(_)) => {}
                None => debug!("empty message ignored"),
            }
        }
    };
    // Reports already queued still get their receipts (if the stream can
    // take them) and free their slots before the session is dropped.
    while committing.next().await.is_some() {}
    reason
}

/// Why a worker's batch is refused, if it is: too many messages, or one
/// that may not be in a batch (a register, a batch).
fn check_batch(inner: &[pb::ConnectRequest]) -> Result<(), String> {
    if inner.len() > MAX_BATCH_MESSAGES {
        return Err(format!(
            "batch.messages holds {} messages; at most {MAX_BATCH_MESSAGES}",
            inner.len()
        ));
    }
    let misplaced = inner.iter().enumerate().find_map(|(i, m)| match m.message {
        Some(In::Register(_)) => Some((i, "register")),
        Some(In::Batch(_)) => Some((i, "batch")),
        _ => None,
    });
    match misplaced {
        Some((i, kind)) => Err(format!(
            "batch.messages[{i}] is a {kind}; a batch holds no register and no batch"
        )),
        None => Ok(()),
    }
}

/// Queues a worker's lines of an attempt this session holds; lines of
/// any other attempt are not stored (a worker writes only its own
/// attempts' logs).
pub(crate) fn on_logs(shared: &Shared, session_id: &str, logs: pb::TaskLogs) {
    if !shared.registry.holds(session_id, &logs.execution_id) {
        debug!(task_id = %logs.task_id, execution_id = %logs.execution_id, lines = logs.lines.len(), "log lines of an attempt this stream does not hold");
        metrics::counter!(crate::logs::LOG_LINES_TOTAL, "outcome" => "not_held")
            .increment(logs.lines.len() as u64);
        return;
    }
    let now = shared.clock.now_millis();
    shared.logs.offer(crate::logs::batch_of(logs, now));
}

fn receipt(tx: &StreamTx, task_id: &str, execution_id: &str, result: Result<(), String>) {
    let (accepted, message) = match result {
        Ok(()) => (true, String::new()),
        Err(m) => (false, m),
    };
    let _ = tx.try_send(Ok(Box::new(pb::ConnectResponse {
        message: Some(Out::Recorded(pb::ResultRecorded {
            task_id: task_id.to_string(),
            execution_id: execution_id.to_string(),
            accepted,
            message,
        })),
    })));
}

/// Queues an ACK; returns what must run once it is durable.
pub(crate) async fn on_ack(
    shared: &Shared,
    session_id: &str,
    tx: &StreamTx,
    ack: pb::TaskAck,
) -> Option<AfterCommit> {
    if !shared.registry.holds(session_id, &ack.execution_id) {
        receipt(
            tx,
            &ack.task_id,
            &ack.execution_id,
            Err("this stream does not hold that attempt".into()),
        );
        shared.send_cancel(
            Some(tx.clone()),
            &ack.task_id,
            &ack.execution_id,
            "attempt no longer assigned to this worker",
        );
        return None;
    }
    let event = Event::Ack {
        execution_id: ack.execution_id.clone(),
        at: Some(shared.clock.now_millis()),
    };
    // Held, not written at once: it goes in front of the result in the
    // same write, or alone after the hold bound (`batcher` module).
    let pending = shared.batcher.hold_ack(&ack.task_id, event).await;
    let (shared, tx) = (shared.clone(), tx.clone());
    Some(Box::pin(async move {
        match pending.await {
            // Answered once durable, as before it was held: workers count
            // one receipt per ACK, then the result's.
            Ok(task) => {
                debug!(task_id = %ack.task_id, attempt = task.attempt, execution_id = %ack.execution_id, "task running");
                receipt(&tx, &ack.task_id, &ack.execution_id, Ok(()));
            }
            Err(err) => {
                info!(task_id = %ack.task_id, execution_id = %ack.execution_id, error = %err, "ack refused");
                receipt(&tx, &ack.task_id, &ack.execution_id, Err(err.to_string()));
                // Through the registry: its slot is freed, and a worker
                // already told (a cancel that committed while the ACK was
                // held, as the change feed reports) is not told twice.
                shared.take_back_attempt(&ack.task_id, &ack.execution_id, "ack refused");
            }
        }
    }))
}

pub(crate) async fn on_reject(shared: &Shared, session_id: &str, rej: pb::TaskReject) {
    if !shared.registry.holds(session_id, &rej.execution_id) {
        return;
    }
    let busy = rej.reason == pb::RejectReason::Busy as i32;
    info!(task_id = %rej.task_id, execution_id = %rej.execution_id, busy, message = %rej.message, "push rejected");
    let event = Event::Release {
        execution_id: rej.execution_id.clone(),
        reason: ReleaseReason::Rejected,
        message: format!("rejected: {}", rej.message),
    };
    let unknown = rej.reason == pb::RejectReason::UnknownHandler as i32;
    if unknown {
        // The worker said it does not serve this handler after all: stop
        // offering it, before the slot frees, so the task goes to a worker
        // that does.
        if let Ok(Some(task)) = shared.store.get_task(&rej.task_id).await {
            shared.registry.drop_handler(session_id, &task.handler);
        }
    }
    // BUSY marks the stream in the same step that frees the slot: the
    // engine, woken by it, already sees the stream as taken and fails over
    // to the next candidate.
    let after = if busy { After::Busy } else { After::Free };
    let _ = shared
        .end_attempt_with(&rej.task_id, &rej.execution_id, event, after)
        .await;
}

/// Queues a result; returns what must run once it is durable.
async fn on_complete(
    shared: &Shared,
    session_id: &str,
    tx: &StreamTx,
    done: pb::TaskComplete,
) -> Option<AfterCommit> {
    let recorded = record_complete(shared, session_id, done).await;
    let tx = tx.clone();
    Some(Box::pin(async move {
        let r = recorded.await;
        let _ = tx.try_send(Ok(Box::new(pb::ConnectResponse {
            message: Some(Out::Recorded(r)),
        })));
    }))
}

/// First and longest pause between writes of a result the store could
/// not take because it was unreachable.
const RESULT_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
const RESULT_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// What a result's receipt will say, once known.
pub(crate) type Recording = Pin<Box<dyn std::future::Future<Output = pb::ResultRecorded> + Send>>;

/// Queues the result of an attempt held by `session_id` (stream or push
/// mode) on the batcher and returns its receipt, which resolves once the
/// result is durable (or at once when the session does not hold the
/// attempt: a stale result). While the store is unreachable the result is
/// written again until it answers. The slot frees after the commit.
pub(crate) async fn record_complete(
    shared: &Shared,
    session_id: &str,
    done: pb::TaskComplete,
) -> Recording {
    let refused = |done: &pb::TaskComplete, message: String| pb::ResultRecorded {
        task_id: done.task_id.clone(),
        execution_id: done.execution_id.clone(),
        accepted: false,
        message,
    };
    if !shared.registry.holds(session_id, &done.execution_id) {
        let r = refused(
            &done,
            "stale attempt: this worker session does not hold it".into(),
        );
        return Box::pin(std::future::ready(r));
    }
    let event = match done.result {
        Some(pb::task_complete::Result::Success(s)) => {
            let out = s.output.unwrap_or_default();
            let limit = shared.opts.max_payload_bytes;
            if out.data.len() > limit {
                // Stored, it would make the task unreadable (GetTask and
                // WatchTask answer within the message limit): the attempt
                // fails instead, saying why; a retry would only repeat it.
                Event::Fail {
                    execution_id: done.execution_id.clone(),
                    message: format!(
                        "the handler's output of {} bytes is over the limit of {limit} bytes \
                         (--max-payload-bytes); nothing of it was stored",
                        out.data.len()
                    ),
                    retryable: false,
                    jitter: rand::random::<f64>(),
                }
            } else {
                Event::Succeed {
                    execution_id: done.execution_id.clone(),
                    output: out.data,
                    content_type: out.content_type,
                }
            }
        }
        Some(pb::task_complete::Result::Failure(f)) => Event::Fail {
            execution_id: done.execution_id.clone(),
            message: f.message,
            retryable: f.retryable,
            jitter: rand::random::<f64>(),
        },
        None => Event::Fail {
            execution_id: done.execution_id.clone(),
            message: "worker reported a result with neither success nor failure".into(),
            retryable: true,
            jitter: rand::random::<f64>(),
        },
    };
    let outcome = outcome_of(&event);
    // Spans the wait for the durable write; joins the task's trace once the
    // store hands the task (and its trace context) back.
    let span = debug_span!(
        "complete",
        otel.kind = "server",
        task_id = %done.task_id,
        execution_id = %done.execution_id,
    );
    let pending = shared.batcher.enqueue(&done.task_id, event.clone()).await;
    let shared = shared.clone();
    let session_id = session_id.to_string();
    let (task_id, execution_id) = (done.task_id, done.execution_id);
    Box::pin(async move {
        let mut result = pending.await;
        // The store is unreachable, or a concurrent transaction won (the
        // write failed as a whole, nothing written): the worker has run the
        // task and will not report it again, so the result is written again
        // until the store takes it, as long as this session holds the
        // attempt (its slot stays taken meanwhile). Other errors are final. Refusing it
        // instead would leave the task RUNNING until its execution deadline,
        // then run it a second time.
        let mut backoff = RESULT_RETRY_FIRST;
        while result
            .as_ref()
            .is_err_and(taskmesh_store::Error::is_transient)
            && shared.registry.holds(&session_id, &execution_id)
        {
            if backoff == RESULT_RETRY_FIRST
                && let Err(err) = &result
            {
                warn!(task_id = %task_id, execution_id = %execution_id, error = %err, "result waits for the store");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RESULT_RETRY_MAX);
            result = shared.batcher.enqueue(&task_id, event.clone()).await.await;
        }
        if let Ok(task) = &result {
            crate::trace_context::continue_from(&span, &task.traceparent);
        }
        drop(span);
        shared.attempt_ended(&execution_id, outcome, After::Free, &result);
        let (accepted, message) = match result {
            Ok(task) => {
                debug!(task_id = %task.id, attempt = task.attempt, execution_id = %execution_id, state = %task.state, "result recorded");
                (true, String::new())
            }
            Err(err) => {
                info!(task_id = %task_id, execution_id = %execution_id, error = %err, "result refused");
                (false, err.to_string())
            }
        };
        pb::ResultRecorded {
            task_id,
            execution_id,
            accepted,
            message,
        }
    })
}
