//! Sharding broadcast (XXL-JOB's 分片广播): a task marked `broadcast` runs
//! once on each live worker serving its handler when it falls due. The
//! leader spreads it ([`spread`]): the task goes RUNNING by
//! [`Event::Spread`] and, in the same transaction, one shard per worker is
//! written as a step of a workflow of its own (no dependencies,
//! CANCEL_REMAINING) and a child of the task, carrying its index. The
//! shards are ordinary tasks from then on — each retried by the task's
//! policy, a shard whose worker is lost dispatched again with the same
//! index — and the workflow's end, written with the last shard's end, ends
//! the task ([`ended`]): SUCCEEDED when every shard has, FAILED when one
//! failed for good (the rest are cancelled), CANCELLED with it.

use crate::task::{NewTask, ShardOf, TaskRecord};
use crate::workflow::{FailurePolicy, StepLink, WorkflowRecord, WorkflowState};
use crate::{Event, TaskState, UnixMillis};

/// At most this many shards: a broadcast to more workers than this is
/// spread over the first this many (in worker id order).
pub const MAX_SHARDS: u32 = 1_000;

/// A broadcast's payload is copied into each of its shards, all written in
/// one transaction: at most this many bytes (64 KiB; 64 MiB at the most
/// shards).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// Refuses a broadcast whose payload is too large to copy into its shards.
pub fn check_payload(payload: &[u8]) -> Result<(), String> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "a broadcast's payload is copied into each shard: at most {MAX_PAYLOAD_BYTES} bytes, not {}",
            payload.len()
        ));
    }
    Ok(())
}

/// The step name of shard `index`.
pub fn step_name(index: u32) -> String {
    format!("shard-{index}")
}

/// The workflow `workflow_id` and the `total` shards (ids from `new_id`)
/// that spread broadcast `task` at `now`: each a copy of the task's
/// request (handler, payload, priority, labels, retry policy, timeout,
/// balancer, concurrency key, trace), due now, a child of the task, with
/// no callback or idempotency key of its own (the task has them).
pub fn spread(
    task: &TaskRecord,
    workflow_id: &str,
    total: u32,
    now: UnixMillis,
    mut new_id: impl FnMut() -> String,
) -> (WorkflowRecord, Vec<NewTask>) {
    let total = total.clamp(1, MAX_SHARDS);
    let shards = (0..total)
        .map(|index| NewTask {
            id: new_id(),
            namespace: task.namespace.clone(),
            handler: task.handler.clone(),
            payload: task.payload.clone(),
            content_type: task.content_type.clone(),
            priority: task.priority,
            labels: task.labels.clone(),
            routing_key: task.routing_key.clone(),
            client_request_id: None,
            callback_url: String::new(),
            retry: task.retry.clone(),
            timeout_ms: task.timeout_ms,
            run_at: now,
            traceparent: task.traceparent.clone(),
            balancer: task.balancer,
            schedule_id: None,
            concurrency: task.concurrency.clone(),
            workflow: Some(StepLink {
                workflow_id: workflow_id.to_string(),
                step: step_name(index),
                depends_on: Vec::new(),
                on_failure: false,
                after_parents_end: false,
                parent_outputs: Vec::new(),
            }),
            parent_task_id: Some(task.id.clone()),
            broadcast: false,
            runs_workflow: false,
            shard: Some(ShardOf { index, total }),
        })
        .collect();
    let workflow = WorkflowRecord {
        id: workflow_id.to_string(),
        namespace: task.namespace.clone(),
        client_request_id: None,
        failure_policy: FailurePolicy::CancelRemaining,
        state: WorkflowState::Running,
        message: String::new(),
        step_count: total,
        created_at: now,
        updated_at: now,
        ended_at: None,
        parent_task_id: Some(task.id.clone()),
        steps: Vec::new(),
    };
    (workflow, shards)
}

/// True for the workflow holding a broadcast's shards (its steps are shards).
pub fn holds_shards(steps: &[TaskRecord]) -> bool {
    steps.first().is_some_and(|s| s.shard.is_some())
}

/// The event that ends a broadcast whose shards' workflow ended as
/// `workflow` says (`shards`; else a workflow run whose workflow did);
/// `None` while it runs. Its output names the workflow and how many
/// shards (or steps) it had.
pub fn ended(workflow: &WorkflowRecord, shards: bool) -> Option<Event> {
    let state = match workflow.state {
        WorkflowState::Running => return None,
        WorkflowState::Succeeded => TaskState::Succeeded,
        WorkflowState::Failed => TaskState::Failed,
        WorkflowState::Cancelled => TaskState::Cancelled,
    };
    Some(Event::ShardsEnded {
        state,
        message: workflow.message.clone(),
        output: format!(
            "{{\"{}\":{},\"workflowId\":\"{}\"}}",
            if shards { "shards" } else { "steps" },
            workflow.step_count,
            workflow.id
        )
        .into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply;

    fn broadcast() -> TaskRecord {
        NewTask {
            id: "b".into(),
            broadcast: true,
            timeout_ms: 5_000,
            ..NewTask::new("report", 100)
        }
        .into_record(100)
    }

    #[test]
    fn a_broadcast_is_stored_pending_spread_then_ended_by_its_shards() {
        let b = broadcast();
        assert_eq!(b.state, TaskState::Pending, "never READY, even when due");
        assert_eq!(b.next_at, Some(100));
        assert!(
            apply(&b, &Event::Due, 200).is_err(),
            "Due never makes it READY"
        );
        let mut n = 0;
        let (wf, shards) = spread(&b, "w", 3, 200, || {
            n += 1;
            format!("s{n}")
        });
        assert_eq!(wf.step_count, 3);
        assert_eq!(wf.parent_task_id.as_deref(), Some("b"));
        let idx: Vec<(u32, u32)> = shards
            .iter()
            .map(|s| s.shard.map(|x| (x.index, x.total)).unwrap())
            .collect();
        assert_eq!(idx, vec![(0, 3), (1, 3), (2, 3)]);
        assert!(
            shards
                .iter()
                .all(|s| s.parent_task_id.as_deref() == Some("b")
                    && !s.broadcast
                    && s.workflow.as_ref().is_some_and(|w| w.depends_on.is_empty())
                    && s.timeout_ms == 5_000)
        );
        let shard = shards[1].clone().into_record(200);
        assert_eq!(shard.state, TaskState::Ready, "a shard is due at once");
        assert!(holds_shards(&[shard]));

        let running = apply(&b, &Event::Spread { shards: 3 }, 200).unwrap().task;
        assert_eq!(running.state, TaskState::Running);
        assert_eq!(
            (running.execution_id.as_ref(), running.next_at),
            (None, None)
        );
        assert!(
            apply(&running, &Event::Spread { shards: 3 }, 201).is_err(),
            "spread once"
        );

        let mut done = wf.clone();
        assert!(ended(&done, true).is_none());
        done.state = WorkflowState::Succeeded;
        let ok = apply(&running, &ended(&done, true).unwrap(), 300)
            .unwrap()
            .task;
        assert_eq!(ok.state, TaskState::Succeeded);
        assert!(String::from_utf8_lossy(ok.output.as_deref().unwrap()).contains("\"shards\":3"));

        done.state = WorkflowState::Failed;
        done.message = "step \"shard-1\" failed: boom".into();
        let failed = apply(&running, &ended(&done, true).unwrap(), 300)
            .unwrap()
            .task;
        assert_eq!(failed.state, TaskState::Failed);
        assert!(failed.error_message.contains("shard-1"));
        // RetryTask spreads it again: PENDING, due now, not READY.
        let again = apply(&failed, &Event::Rerun, 400).unwrap().task;
        assert_eq!(
            (again.state, again.next_at),
            (TaskState::Pending, Some(400))
        );

        let cancelled = apply(
            &running,
            &Event::Cancel {
                reason: "stop".into(),
            },
            300,
        )
        .unwrap();
        assert_eq!(cancelled.task.state, TaskState::Cancelled);
        assert_eq!(
            cancelled.attempt,
            crate::AttemptChange::None,
            "no attempt to close"
        );
    }

    #[test]
    fn spread_is_bounded() {
        let b = broadcast();
        let (wf, shards) = spread(&b, "w", 5_000, 200, String::new);
        assert_eq!(
            (wf.step_count, shards.len()),
            (MAX_SHARDS, MAX_SHARDS as usize)
        );
        let (_, one) = spread(&b, "w", 0, 200, String::new);
        assert_eq!(one.len(), 1);
    }
}
