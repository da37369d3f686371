//! The names of taskmesh's task metrics and the helpers that record them,
//! through the `metrics` facade (the binary installs the Prometheus
//! exporter; without one, recording costs next to nothing). Kept here, the
//! lowest crate that records them, so the scheduler and the dispatcher count
//! the same way under the same names.

use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, RwLock};

use taskmesh_core::{TaskRecord, TaskState, UnixMillis};

/// Most distinct (namespace, handler) label pairs the task metrics carry.
/// Handler names (and, without authentication, namespaces) are chosen by
/// clients; past this many, a pair not seen before is counted under
/// `namespace="other", handler="other"`, so `/metrics` stays bounded.
pub const MAX_HANDLER_LABELS: usize = 500;

/// How many pairs are labelled, and the handlers labelled per namespace.
type Labelled = (usize, HashMap<String, HashSet<String>>);

/// The pairs labelled so far: read by every count, written once per pair.
static LABELLED: LazyLock<RwLock<Labelled>> = LazyLock::new(|| RwLock::new((0, HashMap::new())));

fn is_labelled(seen: &Labelled, namespace: &str, handler: &str) -> bool {
    seen.1.get(namespace).is_some_and(|h| h.contains(handler))
}

/// The labels (namespace, handler) to record under: the pair itself while
/// fewer than [`MAX_HANDLER_LABELS`] pairs have been seen, else `other`.
pub fn labels(namespace: &str, handler: &str) -> (String, String) {
    let labelled = |seen: &Labelled| {
        if is_labelled(seen, namespace, handler) {
            Some((namespace.to_string(), handler.to_string()))
        } else if seen.0 >= MAX_HANDLER_LABELS {
            Some(("other".into(), "other".into()))
        } else {
            None
        }
    };
    if let Some(known) = labelled(&LABELLED.read().unwrap_or_else(|e| e.into_inner())) {
        return known;
    }
    let mut guard = LABELLED.write().unwrap_or_else(|e| e.into_inner());
    // Another caller may have labelled it, or filled the cap, meanwhile.
    if let Some(known) = labelled(&guard) {
        return known;
    }
    let (count, seen) = &mut *guard;
    seen.entry(namespace.to_string())
        .or_default()
        .insert(handler.to_string());
    *count += 1;
    (namespace.to_string(), handler.to_string())
}

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
/// Gauge: tasks in flight on this node's workers, per namespace (worker ids
/// are not labels: clients choose them, and they come and go).
pub const WORKER_ACTIVE: &str = "taskmesh_worker_active_tasks";
/// Gauge: worker streams connected to this node.
pub const WORKERS_CONNECTED: &str = "taskmesh_workers_connected";
/// Gauge: 1 while this node holds the leader lease, else 0.
pub const LEADER: &str = "taskmesh_leader";
/// Counter: leader writes the store refused because they carried a fencing
/// token older than the newest it has seen (this node was deposed while it
/// was still writing), per write.
pub const FENCED_WRITES: &str = "taskmesh_fenced_writes_total";
/// Rows retention removed (`kind`: `tasks`, with their attempts and
/// callbacks, `state` their terminal state; `workflows`, the workflow
/// rows, and `workflow_steps`, their steps (any end), `state` the
/// workflow's end; `fires`, schedule fire records).
pub const RETENTION_REMOVED: &str = "taskmesh_retention_removed_total";

/// The namespace label of a figure about the namespace as a whole: the
/// namespace once one of its handlers has a label of its own, else `other`.
pub fn namespace_label(namespace: &str) -> String {
    let guard = LABELLED.read().unwrap_or_else(|e| e.into_inner());
    if guard.1.contains_key(namespace) {
        namespace.to_string()
    } else {
        "other".into()
    }
}

/// Records `n` new tasks of `handler` in `namespace`.
pub fn submitted(namespace: &str, handler: &str, n: u64) {
    let (namespace, handler) = labels(namespace, handler);
    metrics::counter!(SUBMITTED, "namespace" => namespace, "handler" => handler).increment(n);
}

/// Records the push of `task` at `now`.
pub fn dispatched(task: &TaskRecord, now: UnixMillis) {
    let (namespace, handler) = labels(&task.namespace, &task.handler);
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
    let (namespace, handler) = labels(&task.namespace, &task.handler);
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

#[cfg(test)]
mod label_tests {
    use super::*;

    #[test]
    fn handler_labels_stop_growing_at_the_cap() {
        let kept: Vec<bool> = (0..MAX_HANDLER_LABELS + 100)
            .map(|i| labels("label-cap-test", &format!("h{i}")).1 != "other")
            .collect();
        let labelled = kept.iter().filter(|k| **k).count();
        assert!(labelled <= MAX_HANDLER_LABELS, "{labelled} pairs labelled");
        assert!(!kept[kept.len() - 1], "a pair past the cap counts as other");
        // A pair labelled before keeps its own labels.
        if let Some(first) = kept.iter().position(|k| *k) {
            let (ns, h) = labels("label-cap-test", &format!("h{first}"));
            assert_eq!(
                (ns.as_str(), h.as_str()),
                ("label-cap-test", format!("h{first}").as_str())
            );
            assert_eq!(namespace_label("label-cap-test"), "label-cap-test");
        }
        assert_eq!(namespace_label("never-seen-namespace"), "other");
        assert_eq!(
            labels("never-seen-namespace", "x"),
            ("other".into(), "other".into())
        );
    }
}
