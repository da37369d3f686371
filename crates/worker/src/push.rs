//! Push mode: the worker serves `taskmesh.v1.Worker` and the dispatcher
//! calls it (`Execute`, `Cancel`, `Probe`) instead of pushing on a stream.
//!
//! The worker registers its address with the first reachable server of its
//! list (`RegisterPushWorker`) and registers again every heartbeat interval
//! — that refresh is what keeps the session alive; when a server does not
//! answer, the next one in the list is tried. Each assignment names the
//! session it was pushed under, and its result goes back
//! (`ReportResult`) to the server that granted that session, retried while
//! the server is unavailable; a session the server no longer knows means
//! the attempt was taken back, so the result is stale and dropped.
//!
//! Handlers run exactly as in stream mode: same slots (BUSY beyond them),
//! same cancellation, same drain.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskmesh::v1::dispatcher_client::DispatcherClient;
use taskmesh::v1::worker_server::WorkerServer;
use taskmesh::v1::{
    DeregisterPushWorkerRequest, RegisterPushWorkerRequest, ReportResultRequest, TaskComplete,
    WorkerRegistered,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};
use tracing::{debug, info, warn};

mod logs;
mod service;

use crate::Error;
use crate::backoff::Backoff;
use crate::exec::Done;
use crate::options::Secret;
use crate::wire::{log_recorded, registration};
use crate::worker::{Shared, lock};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a result is retried while its server is unavailable.
const REPORT_RETRY_FOR: Duration = Duration::from_secs(30);

/// The push-mode state shared by the `Worker` service, the registration
/// loop and the result reports.
struct Push {
    shared: Arc<Shared>,
    /// The URL servers call.
    advertise: String,
    /// Session id → the server that granted it.
    sessions: Mutex<HashMap<String, String>>,
    /// Server → the last session it granted.
    granted: Mutex<HashMap<String, String>>,
    /// Bumped whenever a session is added to `sessions`.
    registered: watch::Sender<u64>,
    /// The session registrations refresh, if any.
    current: Mutex<Option<String>>,
    /// One lazily connected client per server.
    clients: Mutex<HashMap<String, DispatcherClient<Channel>>>,
    draining: AtomicBool,
    /// Running attempts whose log lines this worker sends, by execution id.
    attempts: Mutex<HashMap<String, logs::Held>>,
    /// One sender of log lines at a time (the flush loop or an attempt's
    /// release), so an attempt's lines reach its server in order and
    /// before its result.
    log_send: tokio::sync::Mutex<()>,
    /// Given to the servers at registration; they present it on every
    /// `Worker` call, and the service refuses calls without it.
    server_secret: Secret,
}

/// A fresh secret for the servers to present: 64 hex digits from two
/// random UUIDs (244 random bits).
fn new_server_secret() -> Secret {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    Secret::new(format!("{a}{b}"))
}

impl Push {
    fn client(&self, server: &str) -> Result<DispatcherClient<Channel>, Error> {
        let mut clients = lock(&self.clients);
        if let Some(c) = clients.get(server) {
            return Ok(c.clone());
        }
        let channel = crate::ClientTls::endpoint(self.shared.opts.tls.as_ref(), server)?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        let client = DispatcherClient::new(channel);
        clients.insert(server.to_string(), client.clone());
        Ok(client)
    }

    /// The server that granted `session_id`. A push may overtake the
    /// registration's answer on the way in, so an unknown session is waited
    /// for (until a registration call could have timed out).
    async fn server_of(&self, session_id: &str) -> Option<String> {
        let mut changes = self.registered.subscribe();
        let known = || lock(&self.sessions).get(session_id).cloned();
        if let Some(server) = known() {
            return Some(server);
        }
        let wait = changes.wait_for(|_| lock(&self.sessions).contains_key(session_id));
        let _ = tokio::time::timeout(CALL_TIMEOUT, wait).await;
        known()
    }

    fn worker_id(&self) -> &str {
        &self.shared.opts.worker_id
    }

    /// Registers (or refreshes) with `server`.
    async fn register(&self, server: &str) -> Result<WorkerRegistered, Error> {
        let mut client = self.client(server)?;
        // The session this server granted us last, if any: a refresh.
        let session_id = lock(&self.granted).get(server).cloned().unwrap_or_default();
        let req = crate::wire::request(
            &self.shared,
            RegisterPushWorkerRequest {
                registration: Some(registration(&self.shared)),
                address: self.advertise.clone(),
                session_id,
                server_secret: self.server_secret.expose().to_string(),
            },
        )?;
        let answer = tokio::time::timeout(CALL_TIMEOUT, client.register_push_worker(req))
            .await
            .map_err(|_| Error::Protocol("no answer to RegisterPushWorker in time".into()))??;
        answer
            .into_inner()
            .registered
            .ok_or_else(|| Error::Protocol("RegisterPushWorker answered without a session".into()))
    }

    /// Reports one result to the server holding its session.
    async fn report(&self, session_id: String, report_secret: String, done: Done) {
        let worker_id = self.worker_id();
        let (task_id, execution_id) = (done.task_id.clone(), done.execution_id.clone());
        // The attempt's last lines go before its result.
        self.release(&execution_id).await;
        let Some(server) = self.server_of(&session_id).await else {
            warn!(
                worker_id,
                task_id,
                execution_id,
                session_id,
                "no server known for the session; result dropped"
            );
            return;
        };
        let result = crate::wire::complete_result(done.result);
        let req = ReportResultRequest {
            session_id: session_id.clone(),
            complete: Some(TaskComplete {
                task_id: task_id.clone(),
                execution_id: execution_id.clone(),
                result: Some(result),
            }),
            report_secret,
        };
        let opts = &self.shared.opts;
        let mut backoff = Backoff::new(opts.reconnect_initial, opts.reconnect_max);
        let give_up = Instant::now() + REPORT_RETRY_FOR;
        loop {
            let answer = match self.client(&server) {
                Ok(mut client) => {
                    let call = crate::wire::request(&self.shared, req.clone())
                        .map_err(|e| Status::invalid_argument(e.to_string()));
                    let call = async move { client.report_result(call?).await };
                    match tokio::time::timeout(CALL_TIMEOUT, call).await {
                        Ok(r) => r.map(Response::into_inner),
                        Err(_) => Err(Status::unavailable("no answer to ReportResult in time")),
                    }
                }
                Err(err) => Err(Status::invalid_argument(err.to_string())),
            };
            let status = match answer {
                Ok(r) => {
                    match r.recorded {
                        Some(recorded) => log_recorded(worker_id, &recorded),
                        None => warn!(worker_id, task_id, execution_id, "empty answer to a result"),
                    }
                    return;
                }
                Err(status) => status,
            };
            match status.code() {
                Code::NotFound => {
                    warn!(
                        worker_id,
                        task_id,
                        execution_id,
                        session_id,
                        server,
                        "the server no longer holds the session; the attempt was taken back and the result is stale, dropped"
                    );
                    return;
                }
                Code::Unavailable
                | Code::Unknown
                | Code::ResourceExhausted
                | Code::DeadlineExceeded
                | Code::Cancelled => {
                    let delay = backoff.next_delay();
                    if Instant::now() + delay > give_up {
                        warn!(
                            worker_id,
                            task_id,
                            execution_id,
                            server,
                            error = status.message(),
                            "server unavailable too long; result dropped"
                        );
                        return;
                    }
                    debug!(
                        worker_id,
                        task_id,
                        execution_id,
                        server,
                        error = status.message(),
                        "result not delivered yet; retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
                _ => {
                    warn!(worker_id, task_id, execution_id, server, code = ?status.code(), error = status.message(), "result refused");
                    return;
                }
            }
        }
    }
}

/// Serves push mode until `shutdown`, then drains: deregisters, refuses new
/// work with BUSY, waits for running handlers and their reports.
pub(crate) async fn run(
    shared: &Arc<Shared>,
    listen: SocketAddr,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| Error::Listen {
            addr: listen,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| Error::Listen {
        addr: listen,
        source,
    })?;
    let _ = shared.state.push_addr.set(bound);
    let advertise = shared
        .opts
        .push_advertise
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"));
    let push = Arc::new(Push {
        shared: shared.clone(),
        advertise,
        sessions: Mutex::new(HashMap::new()),
        granted: Mutex::new(HashMap::new()),
        registered: watch::Sender::new(0),
        current: Mutex::new(None),
        clients: Mutex::new(HashMap::new()),
        draining: AtomicBool::new(false),
        attempts: Mutex::new(HashMap::new()),
        log_send: tokio::sync::Mutex::new(()),
        server_secret: new_server_secret(),
    });
    let worker_id = shared.opts.worker_id.as_str();
    info!(worker_id, listen = %bound, advertise = push.advertise, "push mode: serving taskmesh.v1.Worker");

    // The service outlives the registrations: during the drain, servers
    // still probe and cancel, and results still flow.
    let stop_serving = CancellationToken::new();
    let server = {
        let service = WorkerServer::new(service::PushService(push.clone()));
        // Nagle off, as on the server: an Execute answer (the ACK) is one
        // small frame that would otherwise wait for the peer's delayed ACK.
        // tonic ignores `Server::tcp_nodelay` with an incoming stream of our own.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |conn| {
                conn.inspect(|tcp| {
                    if let Err(err) = tcp.set_nodelay(true) {
                        warn!(error = %err, "cannot set TCP_NODELAY on a connection");
                    }
                })
            },
        );
        let stop = stop_serving.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await
        })
    };

    let stop_logs = CancellationToken::new();
    let log_flusher = tokio::spawn(logs::flush_loop(push.clone(), stop_logs.clone()));

    register_loop(&push, shutdown).await;

    // Drain: nothing new, tell the server, let running handlers report.
    push.draining.store(true, Ordering::SeqCst);
    shared.state.connected.send_replace(false);
    let current = lock(&push.current).clone();
    if let Some(session_id) = current {
        let server = lock(&push.sessions).get(&session_id).cloned();
        if let Some(server) = server
            && let Ok(mut client) = push.client(&server)
        {
            let req = crate::wire::request(
                shared,
                DeregisterPushWorkerRequest {
                    session_id: session_id.clone(),
                    reason: "shutdown".into(),
                },
            );
            let call = async move {
                match req {
                    Ok(req) => client.deregister_push_worker(req).await,
                    Err(err) => Err(Status::invalid_argument(err.to_string())),
                }
            };
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(_)) => info!(worker_id, session_id, "deregistered"),
                Ok(Err(status)) => {
                    warn!(
                        worker_id,
                        session_id,
                        error = status.message(),
                        "deregistration refused"
                    )
                }
                Err(_) => warn!(worker_id, session_id, "deregistration timed out"),
            }
        }
    }
    crate::worker::finish(shared).await;
    stop_logs.cancel();
    let _ = log_flusher.await;
    stop_serving.cancel();
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => warn!(worker_id, error = %err, "push service ended with an error"),
        Err(err) => warn!(worker_id, error = %err, "push service task failed"),
    }
    Ok(())
}

/// How many refreshes in a row may fail at the server holding our session
/// before the worker moves to the next one.
const REFRESH_TRIES_BEFORE_FAILOVER: u32 = 2;

/// Registers with the first server that answers, then refreshes there every
/// heartbeat interval, moving to the next server when a first registration
/// fails or [`REFRESH_TRIES_BEFORE_FAILOVER`] refreshes fail in a row;
/// returns on shutdown.
async fn register_loop(push: &Arc<Push>, shutdown: &CancellationToken) {
    let shared = &push.shared;
    let worker_id = shared.opts.worker_id.as_str();
    let servers = &shared.opts.servers;
    let mut backoff = Backoff::new(shared.opts.reconnect_initial, shared.opts.reconnect_max);
    let mut index = 0usize;
    // Refreshes of a session that failed in a row at its server.
    let mut failed_here = 0u32;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let server = servers[index % servers.len()].as_str();
        let wait = match push.register(server).await {
            Ok(registered) => {
                backoff.reset();
                failed_here = 0;
                let session_id = registered.session_id.clone();
                let is_new = lock(&push.sessions)
                    .insert(session_id.clone(), server.to_string())
                    .is_none();
                lock(&push.granted).insert(server.to_string(), session_id.clone());
                *lock(&push.current) = Some(session_id.clone());
                let heartbeat = registered
                    .heartbeat_interval
                    .and_then(|d| Duration::try_from(d).ok())
                    .filter(|d| !d.is_zero())
                    .unwrap_or(DEFAULT_HEARTBEAT);
                if is_new {
                    push.registered.send_modify(|n| *n += 1);
                    shared.state.sessions.fetch_add(1, Ordering::SeqCst);
                    info!(
                        worker_id,
                        server,
                        session_id,
                        heartbeat_ms = heartbeat.as_millis() as u64,
                        "registered (push mode)"
                    );
                } else {
                    debug!(worker_id, server, session_id, "registration refreshed");
                }
                shared.state.connected.send_replace(true);
                heartbeat
            }
            Err(error) => {
                // A refresh of a session held there is tried again before
                // moving on (one shed or lost call must not cost the session
                // and everything it runs: the server keeps it for three
                // heartbeat intervals); a first registration moves at once.
                failed_here += 1;
                let holds_session = lock(&push.granted).contains_key(server);
                if holds_session && failed_here < REFRESH_TRIES_BEFORE_FAILOVER {
                    warn!(worker_id, server, %error, "push refresh failed; trying this server again");
                } else {
                    warn!(worker_id, server, %error, "push registration failed; trying the next server");
                    shared.state.connected.send_replace(false);
                    index = index.wrapping_add(1);
                    failed_here = 0;
                }
                backoff.next_delay()
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
