//! The `Worker` service a push-mode worker serves: `Execute` applies the
//! stream's rules and starts the handler, `Cancel` cancels it, `Probe`
//! reports liveness and load.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use taskmesh::v1::worker_server::Worker as WorkerService;
use taskmesh::v1::{
    CancelRequest, CancelResponse, ExecuteRequest, ExecuteResponse, ProbeRequest, ProbeResponse,
    RejectReason,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{debug, info};

use super::Push;
use crate::Handler;
use crate::exec;
use crate::wire::context;
use crate::worker::lock;

/// The `Worker` service the dispatcher calls.
pub(super) struct PushService(pub(super) Arc<Push>);

fn refuse(reason: RejectReason, message: String) -> Response<ExecuteResponse> {
    Response::new(ExecuteResponse {
        accepted: false,
        reject_reason: reason as i32,
        message,
    })
}

/// Refuses a call that does not present the secret this worker registered
/// with (the servers present it; anybody else who reaches the port does
/// not), in time that does not depend on how much of it matched.
fn check_caller<T>(push: &Push, request: &Request<T>) -> Result<(), Status> {
    let presented = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if same_secret(presented, push.server_secret.expose()) {
        Ok(())
    } else {
        Err(Status::unauthenticated(
            "this worker takes calls only from the servers it registered with",
        ))
    }
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[tonic::async_trait]
impl WorkerService for PushService {
    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        check_caller(&self.0, &request)?;
        let push = &self.0;
        let shared = &push.shared;
        let worker_id = push.worker_id();
        let req = request.into_inner();
        let a = req
            .assignment
            .ok_or_else(|| Status::invalid_argument("assignment is required"))?;
        if a.task_id.is_empty() || a.execution_id.is_empty() {
            return Err(Status::invalid_argument(
                "assignment.task_id and assignment.execution_id must not be empty",
            ));
        }
        // Results go back under the session the assignment names; an
        // assignment from a server that predates the field names none, and
        // goes to the current session.
        let session_id = if req.session_id.is_empty() {
            lock(&push.current).clone().unwrap_or_default()
        } else {
            req.session_id.clone()
        };
        let (task_id, attempt, execution_id) =
            (a.task_id.as_str(), a.attempt, a.execution_id.as_str());
        if push.draining.load(Ordering::SeqCst) {
            debug!(
                worker_id,
                task_id, attempt, execution_id, "refusing an assignment while draining"
            );
            return Ok(refuse(RejectReason::Busy, "worker is draining".into()));
        }
        if lock(&shared.running).contains_key(execution_id) {
            debug!(
                worker_id,
                task_id, attempt, execution_id, "duplicate assignment; accepted again"
            );
            return Ok(Response::new(ExecuteResponse {
                accepted: true,
                ..Default::default()
            }));
        }
        let Some(handler): Option<Arc<dyn Handler>> = shared.handlers.get(&a.handler).cloned()
        else {
            let message = format!("handler {:?} is not served by this worker", a.handler);
            return Ok(refuse(RejectReason::UnknownHandler, message));
        };
        let Ok(permit) = shared.state.slots.clone().try_acquire_owned() else {
            let message = format!("all {} slots are taken", shared.opts.concurrency);
            return Ok(refuse(RejectReason::Busy, message));
        };
        debug!(
            worker_id,
            task_id,
            attempt,
            execution_id,
            handler = a.handler,
            session_id,
            "task accepted"
        );
        let cancel = CancellationToken::new();
        lock(&shared.running).insert(a.execution_id.clone(), cancel.clone());
        let reporter = push.clone();
        let secret = a.report_secret.clone();
        push.hold(&a.execution_id, &session_id, &secret);
        exec::spawn(
            shared,
            handler,
            context(a, cancel, shared),
            permit,
            move |done| async move { reporter.report(session_id, secret, done).await },
        );
        Ok(Response::new(ExecuteResponse {
            accepted: true,
            ..Default::default()
        }))
    }

    async fn cancel(
        &self,
        request: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        check_caller(&self.0, &request)?;
        let c = request.into_inner();
        let push = &self.0;
        let found = match lock(&push.shared.running).get(&c.execution_id) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        };
        // A cancel for an attempt that already ended here is routine (the
        // server's answer to a late ACK): only a real one is worth a line.
        if found {
            info!(
                worker_id = push.worker_id(),
                task_id = c.task_id,
                execution_id = c.execution_id,
                reason = c.reason,
                "cancelling task"
            );
        } else {
            debug!(
                worker_id = push.worker_id(),
                task_id = c.task_id,
                execution_id = c.execution_id,
                "cancel for an execution not running here"
            );
        }
        Ok(Response::new(CancelResponse { found }))
    }

    async fn probe(
        &self,
        request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        check_caller(&self.0, &request)?;
        let shared = &self.0.shared;
        Ok(Response::new(ProbeResponse {
            worker_id: shared.opts.worker_id.clone(),
            active: shared.state.capacity_used(),
            capacity: shared.opts.concurrency,
            draining: self.0.draining.load(Ordering::SeqCst),
            cpu_idle_percent: lock(&shared.cpu).sample(),
            avg_cost_ms: lock(&shared.stats).average(),
        }))
    }
}
