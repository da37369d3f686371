//! One `Dispatcher.Connect` session: register, heartbeat, serve, drain.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use taskmesh::batch::{BatchSwitch, Batchable, Coalesce};
use taskmesh::v1::dispatcher_client::DispatcherClient;
use taskmesh::v1::{
    ConnectRequest, ConnectResponse, RejectReason, TaskAck, TaskAssignment, TaskCancel,
    TaskComplete, TaskReject, WorkerDraining, WorkerHeartbeat, connect_request, connect_response,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::{debug, info, warn};

use crate::Error;
use crate::exec::{self, Done};
use crate::wire::{context, log_recorded, registration, response_kind, send};
use crate::worker::{Shared, lock};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
const KEEPALIVE: Duration = Duration::from_secs(20);
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a closing worker waits for the server to end its half.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
const OUTBOUND_BUFFER: usize = 1024;

/// How a session ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// Shutdown was requested; the session drained (or never started).
    Shutdown,
    /// The server asked for a drain; the session drained and closed.
    ServerDrain,
    /// The server ended the stream.
    Closed,
}

/// Connects to `server`, registers and serves the session until it ends.
pub(crate) async fn run(
    shared: &Arc<Shared>,
    server: &str,
    shutdown: &CancellationToken,
) -> Result<SessionEnd, Error> {
    let worker_id = shared.opts.worker_id.as_str();
    let endpoint = crate::ClientTls::endpoint(shared.opts.tls.as_ref(), server)?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true);
    debug!(worker_id, server, "connecting");
    let channel = tokio::select! {
        channel = endpoint.connect() => channel?,
        _ = shutdown.cancelled() => return Ok(SessionEnd::Shutdown),
    };
    let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
    // ACKs and results queued while the wire is busy go as one message,
    // once the server has said it reads batches (an older one does not).
    let batches = BatchSwitch::default();
    let outbound = Coalesce::new(rx, Ok, batches.clone()).filter_map(Result::ok);
    send(
        &tx,
        connect_request::Message::Register(registration(shared)),
    )
    .await?;
    let mut client = DispatcherClient::new(channel);
    let open = async {
        let request = crate::wire::request(shared, outbound)?;
        let mut inbound = client.connect(request).await?.into_inner();
        let first = inbound.message().await?;
        Ok::<_, Error>((inbound, first))
    };
    let (inbound, first) = tokio::select! {
        opened = tokio::time::timeout(REGISTER_TIMEOUT, open) => opened
            .map_err(|_| Error::Protocol("no registered answer in time".into()))??,
        _ = shutdown.cancelled() => return Ok(SessionEnd::Shutdown),
    };
    let registered = match first.and_then(|m| m.message) {
        Some(connect_response::Message::Registered(r)) => r,
        Some(other) => {
            return Err(Error::Protocol(format!(
                "expected registered, got {}",
                response_kind(&other)
            )));
        }
        None => return Err(Error::Protocol("stream ended before registered".into())),
    };
    if registered.accepts_batches {
        batches.turn_on();
    }
    let heartbeat = registered
        .heartbeat_interval
        .and_then(|d| Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_HEARTBEAT);
    shared
        .state
        .sessions
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    shared.state.connected.send_replace(true);
    info!(
        worker_id,
        server,
        session_id = registered.session_id,
        heartbeat_ms = heartbeat.as_millis() as u64,
        "registered"
    );
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let session = Session {
        shared,
        tx,
        inflight: HashMap::new(),
        done_tx,
        drain_deadline: None,
        end: SessionEnd::Closed,
    };
    session.serve(inbound, done_rx, shutdown, heartbeat).await
}

/// An assignment this session acked and has not reported yet.
struct Inflight {
    task_id: String,
    attempt: u32,
}

struct Session<'a> {
    shared: &'a Arc<Shared>,
    tx: mpsc::Sender<ConnectRequest>,
    /// By execution id.
    inflight: HashMap<String, Inflight>,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Set once draining; the drain ends at this instant at the latest.
    drain_deadline: Option<Instant>,
    /// What to report when the session ends cleanly.
    end: SessionEnd,
}

impl Session<'_> {
    fn worker_id(&self) -> &str {
        &self.shared.opts.worker_id
    }

    async fn serve(
        mut self,
        mut inbound: Streaming<ConnectResponse>,
        mut done_rx: mpsc::UnboundedReceiver<Done>,
        shutdown: &CancellationToken,
        heartbeat: Duration,
    ) -> Result<SessionEnd, Error> {
        let mut ticker = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut shutdown_seen = false;
        let mut flush = tokio::time::interval(crate::logs::FLUSH_EVERY);
        flush.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let shared = self.shared;
        loop {
            if self.drain_deadline.is_some() && self.inflight.is_empty() {
                break;
            }
            let deadline = self.drain_deadline.unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                Some(done) = done_rx.recv() => self.on_done(done).await?,
                message = inbound.message() => match message? {
                    Some(message) => {
                        for message in message.into_messages() {
                            self.on_message(message).await?;
                        }
                    }
                    None => return Ok(SessionEnd::Closed),
                },
                _ = shutdown.cancelled(), if !shutdown_seen => {
                    shutdown_seen = true;
                    self.end = SessionEnd::Shutdown;
                    let deadline = self.shared.shutdown_deadline();
                    self.start_drain("shutdown", deadline).await?;
                }
                _ = tokio::time::sleep_until(deadline), if self.drain_deadline.is_some() => {
                    warn!(
                        worker_id = self.worker_id(),
                        running = self.inflight.len(),
                        "drain timed out; cancelling running handlers"
                    );
                    for (execution_id, task) in &self.inflight {
                        debug!(
                            worker_id = self.worker_id(),
                            task_id = task.task_id,
                            attempt = task.attempt,
                            execution_id,
                            "cancelling task after drain timeout"
                        );
                        self.cancel_execution(execution_id);
                    }
                    break;
                }
                _ = ticker.tick() => self.heartbeat().await?,
                _ = flush.tick() => self.send_logs().await?,
                () = shared.logs.ready.notified() => self.send_logs().await?,
            }
        }
        let end = self.end;
        let worker_id = self.shared.opts.worker_id.clone();
        drop(self); // closes the outbound half
        debug!(worker_id, "drained; closing the stream");
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while let Ok(Some(message)) = inbound.message().await {
                for message in message.into_messages() {
                    if let Some(connect_response::Message::Recorded(r)) = message.message {
                        log_recorded(&worker_id, &r);
                    }
                }
            }
        })
        .await;
        Ok(end)
    }

    async fn send(&self, message: connect_request::Message) -> Result<(), Error> {
        send(&self.tx, message).await
    }

    async fn on_message(&mut self, message: ConnectResponse) -> Result<(), Error> {
        use connect_response::Message;
        match message.message {
            Some(Message::Assign(a)) => self.on_assign(a).await,
            Some(Message::Cancel(c)) => {
                self.on_cancel(c);
                Ok(())
            }
            Some(Message::Drain(d)) => {
                if self.end != SessionEnd::Shutdown {
                    self.end = SessionEnd::ServerDrain;
                }
                info!(
                    worker_id = self.worker_id(),
                    reason = d.reason,
                    "server asked to drain"
                );
                let deadline = Instant::now() + self.shared.opts.drain_timeout;
                self.start_drain(&d.reason, deadline).await
            }
            Some(Message::Recorded(r)) => {
                log_recorded(self.worker_id(), &r);
                if !r.accepted && self.inflight.contains_key(&r.execution_id) {
                    // The attempt was taken back or cancelled: stop working on it.
                    self.cancel_execution(&r.execution_id);
                }
                Ok(())
            }
            Some(Message::Registered(_)) => {
                warn!(worker_id = self.worker_id(), "ignoring a second registered");
                Ok(())
            }
            Some(Message::Batch(_)) => {
                warn!(
                    worker_id = self.worker_id(),
                    "ignoring a batch inside a batch"
                );
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn on_assign(&mut self, a: TaskAssignment) -> Result<(), Error> {
        let worker_id = self.worker_id();
        let (task_id, attempt, execution_id) =
            (a.task_id.as_str(), a.attempt, a.execution_id.as_str());
        if self.drain_deadline.is_some() {
            debug!(
                worker_id,
                task_id, attempt, execution_id, "rejecting assignment while draining"
            );
            return self
                .reject(&a, RejectReason::Busy, "worker is draining")
                .await;
        }
        if self.inflight.contains_key(execution_id) {
            debug!(
                worker_id,
                task_id, attempt, execution_id, "duplicate assignment; acking again"
            );
            return self.ack(&a).await;
        }
        let Some(handler) = self.shared.handlers.get(&a.handler).cloned() else {
            debug!(
                worker_id,
                task_id,
                attempt,
                execution_id,
                handler = a.handler,
                "unknown handler"
            );
            let message = format!("handler {:?} is not served by this worker", a.handler);
            return self
                .reject(&a, RejectReason::UnknownHandler, &message)
                .await;
        };
        let Ok(permit) = self.shared.state.slots.clone().try_acquire_owned() else {
            debug!(worker_id, task_id, attempt, execution_id, "all slots taken");
            let message = format!("all {} slots are taken", self.shared.opts.concurrency);
            return self.reject(&a, RejectReason::Busy, &message).await;
        };
        self.ack(&a).await?;
        // Per-task lines stay at debug: at thousands of tasks a second an
        // info line each would cost more than running them.
        debug!(
            worker_id,
            task_id,
            attempt,
            execution_id,
            handler = a.handler,
            "task accepted"
        );
        let cancel = CancellationToken::new();
        lock(&self.shared.running).insert(a.execution_id.clone(), cancel.clone());
        self.inflight.insert(
            a.execution_id.clone(),
            Inflight {
                task_id: a.task_id.clone(),
                attempt,
            },
        );
        exec::spawn(
            self.shared,
            handler,
            context(a, cancel, self.shared),
            permit,
            exec::to_session(self.shared.opts.worker_id.clone(), self.done_tx.clone()),
        );
        Ok(())
    }

    fn on_cancel(&self, c: TaskCancel) {
        let worker_id = self.worker_id();
        let (task_id, execution_id) = (c.task_id.as_str(), c.execution_id.as_str());
        match self.inflight.get(execution_id) {
            Some(running) => {
                info!(
                    worker_id,
                    task_id,
                    attempt = running.attempt,
                    execution_id,
                    reason = c.reason,
                    "cancelling task"
                );
                self.cancel_execution(execution_id);
            }
            None => debug!(
                worker_id,
                task_id, execution_id, "cancel for an execution not running here"
            ),
        }
    }

    fn cancel_execution(&self, execution_id: &str) {
        if let Some(token) = lock(&self.shared.running).get(execution_id) {
            token.cancel();
        }
    }

    /// Sends the buffered lines of the attempts this session holds.
    async fn send_logs(&self) -> Result<(), Error> {
        let messages = self.shared.logs.take(
            |e| self.inflight.contains_key(e),
            |e| lock(&self.shared.running).contains_key(e),
        );
        for m in messages {
            self.send(connect_request::Message::Logs(m)).await?;
        }
        Ok(())
    }

    async fn on_done(&mut self, done: Done) -> Result<(), Error> {
        // The attempt's last lines go before its result.
        self.send_logs().await?;
        self.inflight.remove(&done.execution_id);
        let result = crate::wire::complete_result(done.result);
        debug!(
            worker_id = self.worker_id(),
            task_id = done.task_id,
            attempt = done.attempt,
            execution_id = done.execution_id,
            "sending complete"
        );
        self.send(connect_request::Message::Complete(TaskComplete {
            task_id: done.task_id,
            execution_id: done.execution_id,
            result: Some(result),
        }))
        .await
    }

    async fn start_drain(&mut self, reason: &str, deadline: Instant) -> Result<(), Error> {
        if let Some(current) = self.drain_deadline {
            self.drain_deadline = Some(current.min(deadline));
            return Ok(());
        }
        self.drain_deadline = Some(deadline);
        info!(
            worker_id = self.worker_id(),
            reason,
            running = self.inflight.len(),
            "draining"
        );
        self.send(connect_request::Message::Draining(WorkerDraining {
            reason: reason.to_string(),
        }))
        .await
    }

    async fn heartbeat(&self) -> Result<(), Error> {
        let active = self.shared.state.capacity_used();
        let cpu_idle_percent = lock(&self.shared.cpu).sample();
        let avg_cost_ms = lock(&self.shared.stats).average();
        self.send(connect_request::Message::Heartbeat(WorkerHeartbeat {
            active,
            cpu_idle_percent,
            avg_cost_ms,
        }))
        .await
    }

    async fn ack(&self, a: &TaskAssignment) -> Result<(), Error> {
        self.send(connect_request::Message::Ack(TaskAck {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
        }))
        .await
    }

    async fn reject(
        &self,
        a: &TaskAssignment,
        reason: RejectReason,
        message: &str,
    ) -> Result<(), Error> {
        self.send(connect_request::Message::Reject(TaskReject {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
            reason: reason as i32,
            message: message.to_string(),
        }))
        .await
    }
}
