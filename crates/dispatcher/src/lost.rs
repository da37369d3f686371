//! Taking back attempts whose worker is gone: a stream that closed or went
//! silent, a push-mode worker whose probes failed or whose registration
//! lapsed, a worker that reconnected under a new session, a node restart.
//! Every one of them ends the attempt WORKER_LOST through the same
//! [`release_lost`], so a lost attempt is retried the same way whatever
//! kind of worker held it.
//!
//! Architecture invariant: the store decides first (one conditional write
//! per attempt, refused when the attempt already ended by another path);
//! registry slots are freed by the caller, never here.

use taskmesh_core::{Event, ReleaseReason, TaskRecord};
use tracing::{debug, info, warn};

use crate::engine::Shared;

/// The message stored with an attempt taken back because its worker
/// registered again under a new session (a stream or a push registration)
/// — typically after the replica holding its old one died.
pub const RECONNECTED: &str = "the worker reconnected; its earlier session is gone";

/// The event that ends `execution_id` as WORKER_LOST.
pub(crate) fn lost_event(execution_id: &str, message: &str) -> Event {
    Event::Release {
        execution_id: execution_id.to_string(),
        reason: ReleaseReason::WorkerLost,
        message: message.to_string(),
    }
}

/// Ends as WORKER_LOST (with `message`) the attempts of `tasks` whose
/// execution id passes `keep`, in one store call. Returns the tasks the
/// store moved (an attempt that already ended is skipped).
pub(crate) async fn release_lost(
    shared: &Shared,
    tasks: Vec<TaskRecord>,
    keep: impl Fn(&str) -> bool,
    message: &str,
) -> Result<Vec<TaskRecord>, taskmesh_store::Error> {
    let events: Vec<(String, Event)> = tasks
        .into_iter()
        .filter_map(|t| {
            let exec = t.execution_id?;
            keep(&exec).then(|| {
                let event = lost_event(&exec, message);
                (t.id, event)
            })
        })
        .collect();
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let now = shared.clock.now_millis();
    let results = shared.store.transition_many(&events, now, None).await?;
    let mut moved = Vec::new();
    for ((task_id, _), r) in events.iter().zip(results) {
        match r {
            Ok(t) => {
                debug!(task_id = %task_id, state = %t.state, "task taken back from a lost worker");
                moved.push(t);
            }
            Err(err) => debug!(task_id = %task_id, error = %err, "lost attempt already ended"),
        }
    }
    if !moved.is_empty() {
        shared.wake.notify_one();
    }
    Ok(moved)
}

/// Takes back the in-flight attempts of `worker_id` in `namespace` that no
/// session of this node holds (they were pushed to a session that is gone).
pub(crate) async fn release_earlier_attempts(shared: &Shared, namespace: &str, worker_id: &str) {
    let tasks = match shared.store.in_flight(Some(worker_id)).await {
        Ok(t) => t.into_iter().filter(|t| t.namespace == namespace).collect(),
        Err(err) => {
            warn!(worker_id, error = %err, "cannot read the earlier attempts of a reconnected worker");
            return;
        }
    };
    let registry = &shared.registry;
    let keep = |exec: &str| registry.sender_of(exec).is_none();
    let why = RECONNECTED;
    match release_lost(shared, tasks, keep, why).await {
        Ok(moved) if moved.is_empty() => {}
        Ok(moved) => info!(
            worker_id,
            released = moved.len(),
            "attempts of a reconnected worker's earlier session taken back"
        ),
        Err(err) => {
            warn!(worker_id, error = %err, "cannot take back a reconnected worker's earlier attempts")
        }
    }
}

/// Removes a lost session (stream or push mode) from this node and the
/// cluster-wide registry and takes back every attempt it held.
pub(crate) async fn lose_session(shared: &Shared, session_id: &str, worker_id: &str, reason: &str) {
    let execs = shared.registry.remove(session_id);
    if let Err(err) = shared.coord.remove_worker(session_id).await {
        // Its entry expires by its TTL instead.
        warn!(error = %err, "cannot remove the worker's cluster-wide entry");
    }
    info!(reason, in_flight = execs.len(), "worker session lost");
    if execs.is_empty() {
        shared.wake.notify_one();
        return;
    }
    // Only this worker's attempts can be this session's: read those, not
    // every task in flight.
    let in_flight = match shared.store.in_flight(Some(worker_id)).await {
        Ok(tasks) => tasks,
        Err(err) => {
            // The ACK and execution reapers will take them back later.
            warn!(error = %err, "could not read in-flight tasks of a lost session");
            return;
        }
    };
    match release_lost(shared, in_flight, |e| execs.iter().any(|x| x == e), reason).await {
        Ok(moved) => {
            for t in &moved {
                info!(task_id = %t.id, state = %t.state, "task taken back from a lost worker");
            }
        }
        Err(err) => warn!(error = %err, "could not take back tasks of a lost session"),
    }
    shared.wake.notify_one();
}
