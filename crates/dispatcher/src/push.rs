//! Push mode: a worker that serves the `Worker` service registers its
//! address (`RegisterPushWorker`) instead of holding a stream, and this node
//! calls it.
//!
//! A push session is a registry entry like a stream — same pools, balancer,
//! in-flight accounting, cluster-wide entry — whose queue is read by a
//! *link* task instead of a gRPC response stream. The link turns each
//! queued assignment into a `Worker.Execute` call (accepted = the ACK,
//! refused = a reject, failed = a push that could not be sent), each cancel
//! into `Worker.Cancel`, and probes the worker with `Worker.Probe` every
//! heartbeat interval. Everything after the call goes through the very
//! functions a stream's messages go through, so the two kinds of worker
//! cannot drift apart.
//!
//! Liveness: the worker re-registers every heartbeat interval naming its
//! session (that refreshes it; without the session id it is a new process
//! and replaces the session); three probes failing in a row, or no refresh for
//! three heartbeat intervals (the silence that loses a stream), lose the
//! session exactly like a lost stream ([`crate::lost::lose_session`]).
//!
//! Architecture invariant: a push session is ended (and its attempts taken
//! back) by whoever removes it from the [`PushWorkers`] table, once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskmesh::v1::{self as pb, worker_client::WorkerClient};
use taskmesh_coord::{WorkerEntry, WorkerLoad};
use taskmesh_core::id;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tracing::{Instrument, debug, info, info_span, warn};

mod connect;
mod link;

use crate::auth::Identity;
use crate::convert::duration;
use crate::engine::Shared;
use crate::registry::{Heartbeat, Registration};
use crate::{lost, stream};

/// Probes failing in a row that lose a push worker.
pub(crate) const PROBE_FAILURES: u32 = 3;
/// Bound on opening a connection to a push worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted push address.
const MAX_ADDRESS_LEN: usize = 2048;

/// Shortest and longest secret a push worker may give for the servers to
/// present.
const SERVER_SECRET_LEN: std::ops::RangeInclusive<usize> = 32..=256;

/// Puts the secret the worker gave at registration on every call to it, so
/// its `Worker` service can tell its servers from anybody else who reaches
/// its port.
#[derive(Clone)]
pub(crate) struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// A client of one push worker's `Worker` service.
pub(crate) type PushClient =
    WorkerClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// The push-mode sessions of this node (cheap to clone).
#[derive(Clone, Default)]
pub struct PushWorkers {
    sessions: Arc<Mutex<HashMap<String, PushSession>>>,
    /// Cancelled when the node shuts down: every link ends.
    stop: CancellationToken,
    /// Registrations being resolved and probed now.
    probing: Arc<std::sync::atomic::AtomicUsize>,
}

/// Registrations resolved and probed at once on a node. A probe may wait
/// seconds for a silent address; past this, registrations are refused at
/// once instead of holding request slots that other clients need.
pub(crate) const MAX_PROBING: usize = 64;

/// A registration's place among those being probed, given back on drop.
struct Probing(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Probing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl PushWorkers {
    fn start_probing(&self) -> Result<Probing, Status> {
        use std::sync::atomic::Ordering;
        let n = self.probing.fetch_add(1, Ordering::AcqRel);
        let place = Probing(self.probing.clone());
        if n >= MAX_PROBING {
            return Err(Status::resource_exhausted(format!(
                "{MAX_PROBING} push registrations are being probed on this server; retry with backoff"
            )));
        }
        Ok(place)
    }
}

struct PushSession {
    worker_id: String,
    /// Who registered it: only the same identity refreshes, reports on or
    /// deregisters it.
    owner: String,
    address: String,
    registration: pb::WorkerRegistration,
    /// The last registration (or refresh).
    refreshed: Instant,
    /// Deregistered: ends once nothing is in flight.
    leaving: bool,
    /// Cancelled when the session is removed: its link stops.
    ended: CancellationToken,
    /// The cluster-wide entry, refreshed by registrations and probes.
    entry: WorkerEntry,
}

impl std::fmt::Debug for PushWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushWorkers")
            .field("sessions", &self.lock().len())
            .finish()
    }
}

impl PushWorkers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PushSession>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends every link (the node is shutting down); their sessions are lost
    /// like streams closed by the shutdown.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Push-mode sessions on this node now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when this node holds no push-mode session.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `RegisterPushWorker`: a new session, or the refresh of the worker's
/// session at the same address on this node.
pub(crate) async fn register(
    shared: &Shared,
    who: &Identity,
    req: pb::RegisterPushWorkerRequest,
) -> Result<pb::WorkerRegistered, Status> {
    let reg = req
        .registration
        .ok_or_else(|| Status::invalid_argument("registration is required"))?;
    stream::validate_registration(&reg)?;
    let (host, port) = validate_address(&req.address)?;
    // Held while the address is resolved and probed (seconds, for a silent
    // one): bounded, so registrations cannot hold every request slot.
    let _probing = shared.push.start_probing()?;
    // The policy first, before anything is dialled: an address it refuses
    // is the caller's mistake (or a probe of this server's network).
    let egress = std::sync::Arc::new(shared.opts.egress.clone());
    match tokio::time::timeout(CONNECT_TIMEOUT, connect::resolve(&egress, &host, port)).await {
        Ok(Ok(_)) => {}
        Ok(Err(connect::ConnectError::Refused(err))) => {
            return Err(Status::invalid_argument(format!(
                "address {:?} {err}",
                req.address
            )));
        }
        Ok(Err(connect::ConnectError::Io(err))) => {
            return Err(crate::error::opaque(
                tonic::Code::FailedPrecondition,
                &format!("cannot resolve the host of address {:?}", req.address),
                &err,
            ));
        }
        Err(_) => {
            return Err(Status::failed_precondition(format!(
                "cannot resolve the host of address {:?} within {} ms",
                req.address,
                CONNECT_TIMEOUT.as_millis()
            )));
        }
    }
    let bearer = server_secret(&req.server_secret)?;
    let namespace = who.namespace_for(&reg.namespace)?;
    // A refresh (naming its session) is the same worker, not one more.
    let sessions = if req.session_id.is_empty() {
        shared.registry.sessions_in(&namespace)
    } else {
        0
    };
    shared
        .quotas
        .admit_worker(&namespace, reg.handlers.len(), sessions)?;
    stream::claim_worker_id(shared, who, &reg.worker_id).await?;
    let answer = |session_id: String| pb::WorkerRegistered {
        session_id,
        heartbeat_interval: Some(duration(shared.opts.heartbeat_interval.as_millis() as i64)),
        ack_timeout: Some(duration(shared.opts.ack_timeout.as_millis() as i64)),
        // Push mode has no stream to batch on.
        accepts_batches: false,
    };
    let now = shared.clock.now_millis();

    // A refresh names its session, which must still be here, not leaving,
    // with the same worker, address and registration. Any other session of
    // this worker at this address is replaced: the worker registering
    // without it is a new process, or it changed what it serves.
    let mut replaced = None;
    let refreshed = {
        let mut sessions = shared.push.lock();
        let found = sessions
            .iter_mut()
            .find(|(_, s)| !s.leaving && s.worker_id == reg.worker_id && s.address == req.address);
        match found {
            Some((id, s)) if *id == req.session_id && s.registration == reg => {
                s.refreshed = Instant::now();
                s.entry.last_seen = now;
                Some((id.clone(), s.entry.clone()))
            }
            Some((id, _)) => {
                replaced = Some(id.clone());
                None
            }
            None => None,
        }
    };
    if let Some((session_id, entry)) = refreshed {
        shared.registry.touch(&session_id, now);
        if let Err(err) = shared.coord.put_worker(entry).await {
            // The probes refresh it again; the session itself is fine.
            warn!(session_id = %session_id, error = %err, "cannot refresh the push worker's cluster-wide entry");
        }
        debug!(worker_id = %reg.worker_id, session_id = %session_id, "push worker refreshed");
        return Ok(answer(session_id));
    }
    if let Some(old) = replaced {
        end_session(
            shared,
            &old,
            "the worker registered anew (restarted, or a new registration)",
        )
        .await;
    }

    let endpoint = Endpoint::from_shared(req.address.clone())
        .map_err(|e| Status::invalid_argument(format!("address {:?}: {e}", req.address)))?;
    let channel = connect::channel(endpoint, egress, CONNECT_TIMEOUT);
    let max = shared.opts.max_message_bytes;
    let client = WorkerClient::with_interceptor(channel, bearer)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);

    // One probe before anything is written: an address the server cannot
    // call (a wrong --push-advertise, a firewall) is a clear error now, not
    // a worker that takes tasks and loses every push.
    let load = first_probe(shared, &client, &reg, &req.address).await?;

    let session_id = id::new_session_id();
    let entry = WorkerEntry {
        push: true,
        session_id: session_id.clone(),
        worker_id: reg.worker_id.clone(),
        namespace: namespace.clone(),
        owner: who.principal.clone(),
        name: reg.name.clone(),
        node_id: shared.coord.node_id().to_string(),
        handlers: reg.handlers.clone(),
        capacity: reg.capacity,
        labels: reg.labels.clone().into_iter().collect(),
        weight: reg.weight.max(1),
        load,
        last_seen: now,
        draining: false,
    };
    // Cluster-wide first, as for a stream: the leader takes back the
    // attempts of sessions it cannot see.
    shared
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
    let (tx, rx) = mpsc::channel(reg.capacity as usize * 2 + 64);
    let ended = CancellationToken::new();
    shared.push.lock().insert(
        session_id.clone(),
        PushSession {
            worker_id: reg.worker_id.clone(),
            owner: who.principal.clone(),
            address: req.address.clone(),
            registration: reg.clone(),
            refreshed: Instant::now(),
            leaving: false,
            ended: ended.clone(),
            entry,
        },
    );
    shared.registry.insert(Registration {
        push: true,
        session_id: session_id.clone(),
        worker_id: reg.worker_id.clone(),
        namespace: namespace.clone(),
        owner: who.principal.clone(),
        name: reg.name.clone(),
        handlers: reg.handlers.iter().cloned().collect::<HashSet<_>>(),
        capacity: reg.capacity,
        labels: reg.labels.clone().into_iter().collect(),
        weight: reg.weight.max(1),
        tx: tx.clone(),
        now,
    });
    info!(worker_id = %reg.worker_id, session_id = %session_id, address = %req.address, handlers = ?reg.handlers, capacity = reg.capacity, "push worker registered");
    if shared.registry.streams_of(&reg.worker_id) == 1 {
        // As for a reconnecting stream: attempts pushed under an earlier
        // session of this worker can never be reported; take them back.
        let (shared, worker_id) = (shared.clone(), reg.worker_id.clone());
        let namespace = namespace.clone();
        tokio::spawn(async move {
            lost::release_earlier_attempts(&shared, &namespace, &worker_id).await
        });
    }
    shared.registry.heartbeat(
        &session_id,
        Heartbeat {
            active: load.active,
            cpu_idle_percent: load.cpu_idle_percent,
            avg_cost_ms: load.avg_cost_ms,
        },
    );
    let link = link::Link {
        shared: shared.clone(),
        session_id: session_id.clone(),
        worker_id: reg.worker_id.clone(),
        client,
        tx,
        ended,
    };
    let span = info_span!("push_worker", worker_id = %reg.worker_id, session_id = %session_id);
    tokio::spawn(link.run(rx).instrument(span));
    shared.wake.notify_one();
    Ok(answer(session_id))
}

/// Probes a worker that registers: it must answer, as itself.
async fn first_probe(
    shared: &Shared,
    client: &PushClient,
    reg: &pb::WorkerRegistration,
    address: &str,
) -> Result<WorkerLoad, Status> {
    let limit = shared.opts.heartbeat_interval.max(CONNECT_TIMEOUT);
    // What failed stays in the server log: the caller learns that no
    // taskmesh worker answered, not what did (a refused port, an SSH
    // banner, a web server), so registrations cannot scan this network.
    let p = match tokio::time::timeout(limit, client.clone().probe(pb::ProbeRequest {})).await {
        Ok(Ok(p)) => p.into_inner(),
        Ok(Err(status)) => {
            return Err(crate::error::opaque(
                tonic::Code::FailedPrecondition,
                &format!(
                    "no taskmesh worker answered Worker.Probe at {address} (is the address one this server can reach?)"
                ),
                &status,
            ));
        }
        Err(_) => {
            return Err(Status::failed_precondition(format!(
                "no taskmesh worker answered Worker.Probe at {address} within {} ms",
                limit.as_millis()
            )));
        }
    };
    // An empty id is a worker that does not say; another id is a different
    // worker at that address (two workers advertising one address).
    if !p.worker_id.is_empty() && p.worker_id != reg.worker_id {
        return Err(Status::failed_precondition(format!(
            "the worker at {address} says it is {:?}, not {:?}",
            p.worker_id, reg.worker_id
        )));
    }
    Ok(WorkerLoad {
        active: p.active,
        cpu_idle_percent: p.cpu_idle_percent,
        avg_cost_ms: p.avg_cost_ms,
    })
}

/// `ReportResult`: the result of an attempt pushed under `session_id`,
/// answered once it is durable (or refused as stale).
pub(crate) async fn report(
    shared: &Shared,
    who: &Identity,
    req: pb::ReportResultRequest,
) -> Result<pb::ResultRecorded, Status> {
    if req.session_id.is_empty() {
        return Err(Status::invalid_argument("session_id must not be empty"));
    }
    let done = req
        .complete
        .ok_or_else(|| Status::invalid_argument("complete is required"))?;
    if done.task_id.is_empty() || done.execution_id.is_empty() {
        return Err(Status::invalid_argument(
            "complete.task_id and complete.execution_id must not be empty",
        ));
    }
    if done.result.is_none() {
        return Err(Status::invalid_argument(
            "complete.result must be a success or a failure",
        ));
    }
    reporter_of(
        shared,
        who,
        &req.session_id,
        &done.execution_id,
        &req.report_secret,
    )?;
    // The recording (its retries while the store is unreachable, and the
    // slot's release once it lands) runs on a task of its own: a caller
    // that gives up, or the request timeout, must not drop it halfway and
    // leave the attempt RUNNING with its slot taken.
    let recording = stream::record_complete(shared, &req.session_id, done).await;
    tokio::spawn(recording).await.map_err(|err| {
        crate::error::opaque(tonic::Code::Internal, "recording the result failed", &err)
    })
}

/// `ReportLogs`: lines of an attempt pushed under `session_id`, queued
/// for the next log write. NOT_FOUND when the session does not hold the
/// attempt (it ended or was taken back).
pub(crate) fn report_logs(
    shared: &Shared,
    who: &Identity,
    req: pb::ReportLogsRequest,
) -> Result<(), Status> {
    let logs = req
        .logs
        .ok_or_else(|| Status::invalid_argument("logs is required"))?;
    if req.session_id.is_empty() || logs.execution_id.is_empty() {
        return Err(Status::invalid_argument(
            "session_id and logs.execution_id must not be empty",
        ));
    }
    reporter_of(
        shared,
        who,
        &req.session_id,
        &logs.execution_id,
        &req.report_secret,
    )?;
    if !shared.registry.holds(&req.session_id, &logs.execution_id) {
        return Err(Status::not_found(format!(
            "session {:?} does not hold execution {:?} (it ended or was taken back)",
            req.session_id, logs.execution_id
        )));
    }
    let now = shared.clock.now_millis();
    shared.logs.offer(crate::logs::batch_of(logs, now));
    Ok(())
}

/// `DeregisterPushWorker`: the session takes nothing new and ends once its
/// running attempts have reported.
pub(crate) async fn deregister(
    shared: &Shared,
    who: &Identity,
    req: pb::DeregisterPushWorkerRequest,
) -> Result<(), Status> {
    if req.session_id.is_empty() {
        return Err(Status::invalid_argument("session_id must not be empty"));
    }
    owned_by(shared, who, &req.session_id)?;
    let entry = {
        let mut sessions = shared.push.lock();
        let s = sessions
            .get_mut(&req.session_id)
            .ok_or_else(|| unknown_session(&req.session_id))?;
        s.leaving = true;
        s.entry.draining = true;
        s.entry.clone()
    };
    shared.registry.set_draining(&req.session_id);
    info!(session_id = %req.session_id, reason = %req.reason, "push worker deregistered");
    if shared.registry.in_flight_of(&req.session_id) == Some(0) {
        end_session(shared, &req.session_id, "deregistered").await;
    } else if let Err(err) = shared.coord.put_worker(entry).await {
        warn!(error = %err, "cannot mark the push worker draining cluster-wide");
    }
    Ok(())
}

/// Refuses a call on a session that does not exist here or that another
/// identity opened.
/// Whether `who` may report on `execution_id` under `session_id`: its own
/// session, and the assignment's secret. The secret travelled only in the
/// Execute call: a session id (ListWorkers) and an execution id (GetTask)
/// alone forge nothing.
fn reporter_of(
    shared: &Shared,
    who: &Identity,
    session_id: &str,
    execution_id: &str,
    report_secret: &str,
) -> Result<(), Status> {
    owned_by(shared, who, session_id)?;
    if !shared.is_assignment_secret(execution_id, report_secret) {
        metrics::counter!(crate::auth::AUTH_REFUSED_TOTAL, "reason" => "report_secret")
            .increment(1);
        warn!(
            session_id,
            execution_id, "refused: a report without its assignment's secret"
        );
        return Err(Status::permission_denied(
            "report_secret is not the secret of this assignment",
        ));
    }
    Ok(())
}

fn owned_by(shared: &Shared, who: &Identity, session_id: &str) -> Result<(), Status> {
    let owner = shared.push.lock().get(session_id).map(|s| s.owner.clone());
    match owner {
        None => Err(unknown_session(session_id)),
        Some(owner) if owner != who.principal => {
            metrics::counter!(crate::auth::AUTH_REFUSED_TOTAL, "reason" => "session").increment(1);
            warn!(session_id, principal = %who.principal, "refused: another identity's push session");
            Err(Status::permission_denied(format!(
                "session {session_id:?} belongs to another identity"
            )))
        }
        Some(_) => Ok(()),
    }
}

/// The interceptor presenting the worker's secret, after checking it.
fn server_secret(secret: &str) -> Result<Bearer, Status> {
    if secret.is_empty() {
        return Ok(Bearer(None));
    }
    if !SERVER_SECRET_LEN.contains(&secret.len()) || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Status::invalid_argument(format!(
            "server_secret must be {} to {} printable ASCII characters",
            SERVER_SECRET_LEN.start(),
            SERVER_SECRET_LEN.end()
        )));
    }
    let value = format!("Bearer {secret}")
        .parse()
        .map_err(|_| Status::invalid_argument("server_secret is not a valid header value"))?;
    Ok(Bearer(Some(value)))
}

fn unknown_session(session_id: &str) -> Status {
    Status::not_found(format!(
        "no push-mode session {session_id:?} on this server (it ended, or another server holds it)"
    ))
}

/// Checks a push address and returns its host and port.
fn validate_address(address: &str) -> Result<(String, u16), Status> {
    let bad = |why: &str| {
        Err(Status::invalid_argument(format!(
            "address must be an http:// URL with a host and port where the worker serves taskmesh.v1.Worker, e.g. \"http://10.0.0.7:7070\"; {address:?} {why}"
        )))
    };
    if address.is_empty() {
        return bad("is empty");
    }
    if address.len() > MAX_ADDRESS_LEN {
        return bad("is too long");
    }
    let Ok(uri) = address.parse::<tonic::codegen::http::Uri>() else {
        return bad("does not parse as a URL");
    };
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return bad("uses https, which this server cannot call yet (no TLS)"),
        _ => return bad("has no http:// scheme"),
    }
    let (host, port) = match uri.authority() {
        Some(a) if a.as_str().contains('@') => return bad("carries credentials"),
        Some(a) if !a.host().is_empty() => match a.port_u16() {
            Some(port) => (a.host().to_string(), port),
            None => return bad("has no port"),
        },
        _ => return bad("has no host and port"),
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return bad("has a path or query");
    }
    Ok((host, port))
}

/// Removes a push session (once) and takes back its attempts.
pub(crate) async fn end_session(shared: &Shared, session_id: &str, reason: &str) {
    let Some(s) = shared.push.lock().remove(session_id) else {
        return;
    };
    s.ended.cancel();
    lost::lose_session(shared, session_id, &s.worker_id, reason).await;
}
