//! The names of taskmesh's task metrics and the helpers that record them,
//! through the `metrics` facade (the binary installs the Prometheus
//! exporter; without one, recording costs next to nothing). Kept here, the
//! lowest crate that records them, so the scheduler and the dispatcher count
//! the same way under the same names.

use taskmesh_core::{TaskRecord, TaskState, UnixMillis};

/// Counter: tasks accepted by `SubmitTask`/`SubmitTasks` (new ones only), per namespace and handler.
pub const SUBMITTED: &str = "taskmesh_tasks_submitted_total";
/// Counter: tasks pushed to a worker (one per attempt), per namespace and handler.
pub const DISPATCHED: &str = "taskmesh_tasks_dispatched_total";
/// Counter: tasks that ended SUCCEEDED, per namespace and handler.
pub const COMPLETED: &str = "taskmesh_tasks_completed_total";
/// Counter: tasks that ended FAILED or TIMED_OUT, per namespace and handler.
pub const FAILED: &str = "taskmesh_tasks_failed_total";
/// Counter: attempts that failed or timed out with attempts left (the task
/// went RETRYING), per namespace and handler.
pub const RETRIED: &str = "taskmesh_tasks_retried_total";
/// Histogram: READY → pushed to a worker, per namespace and handler.
pub const DISPATCH_LATENCY: &str = "taskmesh_dispatch_latency_seconds";
/// Histogram: created → ended (SUCCEEDED, FAILED, TIMED_OUT), per namespace and handler.
pub const END_TO_END_LATENCY: &str = "taskmesh_task_end_to_end_latency_seconds";
/// Gauge: READY tasks per namespace and handler (what an autoscaler scales workers on).
pub const QUEUE_DEPTH: &str = "taskmesh_queue_depth";
/// Gauge: tasks in flight per worker on this node.
pub const WORKER_ACTIVE: &str = "taskmesh_worker_active_tasks";
/// Gauge: worker streams connected to this node.
pub const WORKERS_CONNECTED: &str = "taskmesh_workers_connected";
/// Gauge: 1 while this node holds the leader lease, else 0.
pub const LEADER: &str = "taskmesh_leader";
/// Counter: leader writes the store refused because they carried a fencing
/// token older than the newest it has seen (this node was deposed while it
/// was still writing), per write.
pub const FENCED_WRITES: &str = "taskmesh_fenced_writes_total";

/// Records `n` new tasks of `handler` in `namespace`.
pub fn submitted(namespace: &str, handler: &str, n: u64) {
    metrics::counter!(SUBMITTED, "namespace" => namespace.to_string(), "handler" => handler.to_string())
        .increment(n);
}

/// Records the push of `task` at `now`.
pub fn dispatched(task: &TaskRecord, now: UnixMillis) {
    let (namespace, handler) = (task.namespace.clone(), task.handler.clone());
    metrics::counter!(DISPATCHED, "namespace" => namespace.clone(), "handler" => handler.clone())
        .increment(1);
    if let Some(ready) = task.times.ready {
        metrics::histogram!(DISPATCH_LATENCY, "namespace" => namespace, "handler" => handler)
            .record(seconds(now - ready));
    }
}

/// Records what an attempt's end left `task` as, at `now`.
pub fn attempt_ended(task: &TaskRecord, now: UnixMillis) {
    let name = match task.state {
        TaskState::Succeeded => COMPLETED,
        TaskState::Failed | TaskState::TimedOut => FAILED,
        TaskState::Retrying => RETRIED,
        _ => return,
    };
    let (namespace, handler) = (task.namespace.clone(), task.handler.clone());
    metrics::counter!(name, "namespace" => namespace.clone(), "handler" => handler.clone())
        .increment(1);
    if task.state.is_terminal() {
        metrics::histogram!(END_TO_END_LATENCY, "namespace" => namespace, "handler" => handler)
            .record(seconds(now - task.created_at));
    }
}

/// Records a leader write the store refused by its fencing token.
pub fn fenced_write(write: &'static str) {
    metrics::counter!(FENCED_WRITES, "write" => write).increment(1);
}

fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1_000.0
}
