//! Conformance scenarios: workflows, released and cancelled in the
//! transaction that ends a step.

use taskmesh_core::id::{new_execution_id, new_task_id};
use taskmesh_core::workflow::{FailurePolicy, StepLink, WorkflowRecord, WorkflowState};
use taskmesh_core::{Event, NewTask, TaskRecord, TaskState};

use super::{StoreFixture, T0, new_task};
use crate::{Claim, Store};

/// A workflow of `steps` (name, parents) of `handler`, as SubmitWorkflow
/// would make it.
fn workflow(
    handler: &str,
    policy: FailurePolicy,
    steps: &[(&str, &[&str])],
) -> (WorkflowRecord, Vec<NewTask>) {
    let id = new_task_id();
    let tasks = steps
        .iter()
        .map(|(name, deps)| NewTask {
            workflow: Some(StepLink {
                workflow_id: id.clone(),
                step: name.to_string(),
                depends_on: deps.iter().map(|d| d.to_string()).collect(),
                parent_outputs: Vec::new(),
            }),
            ..new_task(handler)
        })
        .collect::<Vec<_>>();
    let record = WorkflowRecord {
        id,
        namespace: "default".into(),
        client_request_id: None,
        failure_policy: policy,
        state: WorkflowState::Running,
        message: String::new(),
        step_count: steps.len() as u32,
        created_at: T0,
        updated_at: T0,
        ended_at: None,
        steps: Vec::new(),
    };
    (record, tasks)
}

const DIAMOND: &[(&str, &[&str])] = &[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])];

/// Claims every READY task of `handler` (sorted by step name).
async fn claim(store: &dyn Store, handler: &str) -> Vec<TaskRecord> {
    let mut got = store
        .claim_ready("default", handler, 100, T0 + 1, &mut |_: &TaskRecord| {
            Some(Claim {
                execution_id: new_execution_id(),
                worker_id: "w-1".into(),
                ack_deadline: T0 + 60_000,
            })
        })
        .await
        .expect("claim");
    got.sort_by_key(|t| t.workflow.as_ref().map(|w| w.step.clone()));
    got
}

fn name(t: &TaskRecord) -> &str {
    t.workflow.as_ref().map_or("", |w| w.step.as_str())
}

async fn finish(store: &dyn Store, t: &TaskRecord, ok: bool) -> TaskRecord {
    let execution_id = t.execution_id.clone().expect("claimed");
    let event = if ok {
        Event::Succeed {
            execution_id,
            output: format!("out-{}", name(t)).into_bytes(),
            content_type: "text/plain".into(),
        }
    } else {
        Event::Fail {
            execution_id,
            message: format!("{} broke", name(t)),
            retryable: false,
            jitter: 0.0,
        }
    };
    store.transition(&t.id, &event, T0 + 2).await.expect("end")
}

async fn wf(store: &dyn Store, id: &str) -> WorkflowRecord {
    store
        .get_workflow(id)
        .await
        .expect("get_workflow")
        .expect("the workflow exists")
}

fn states(w: &WorkflowRecord) -> Vec<(String, TaskState)> {
    w.steps
        .iter()
        .map(|t| (name(t).to_string(), t.state))
        .collect()
}

/// A diamond a → b, c → d: only a is READY at first; b and c are released
/// by a's success, d only once both have succeeded, and d's claim carries
/// b's and c's outputs (a's is not its parent's); the workflow SUCCEEDED
/// with d. Idempotent on client_request_id.
pub async fn a_diamond_workflow_releases_each_step_once_with_its_parents_outputs(
    fixture: &dyn StoreFixture,
) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let (mut record, steps) = workflow("wf-d", FailurePolicy::CancelRemaining, DIAMOND);
    record.client_request_id = Some("diamond-1".into());
    let created = store
        .create_workflow(record.clone(), "fp-1", steps.clone(), T0)
        .await
        .expect("create_workflow");
    assert!(!created.existing);
    let id = created.workflow.id.clone();
    assert_eq!(
        states(&wf(store, &id).await),
        [
            ("a".into(), TaskState::Ready),
            ("b".into(), TaskState::Pending),
            ("c".into(), TaskState::Pending),
            ("d".into(), TaskState::Pending),
        ]
    );
    // The same key and request: the same workflow; another request: refused.
    let again = store
        .create_workflow(
            WorkflowRecord {
                id: new_task_id(),
                ..record.clone()
            },
            "fp-1",
            steps.clone(),
            T0,
        )
        .await
        .expect("repeat");
    assert!(again.existing);
    assert_eq!(again.workflow.id, id);
    assert_eq!(again.workflow.steps.len(), 4);
    let other = store
        .create_workflow(
            WorkflowRecord {
                id: new_task_id(),
                ..record
            },
            "fp-2",
            steps,
            T0,
        )
        .await;
    assert!(
        matches!(other, Err(crate::Error::AlreadyExists(_))),
        "{other:?}"
    );

    let a = claim(store, "wf-d").await;
    assert_eq!(a.iter().map(name).collect::<Vec<_>>(), ["a"]);
    assert!(a[0].workflow.as_ref().unwrap().parent_outputs.is_empty());
    finish(store, &a[0], true).await;
    // Retention leaves every step of a running workflow: b and c still
    // need a's output.
    let later = T0 + 30 * 86_400_000;
    let removed = store
        .remove_ended(TaskState::Succeeded, later, 0, 100)
        .await
        .expect("retention");
    assert_eq!(removed, 0, "a's workflow is running");
    let bc = claim(store, "wf-d").await;
    assert_eq!(bc.iter().map(name).collect::<Vec<_>>(), ["b", "c"]);
    let outs = &bc[0].workflow.as_ref().unwrap().parent_outputs;
    assert_eq!(outs.len(), 1);
    assert_eq!(
        (outs[0].step.as_str(), outs[0].data.as_slice()),
        ("a", &b"out-a"[..])
    );
    finish(store, &bc[0], true).await;
    assert!(claim(store, "wf-d").await.is_empty(), "d still waits for c");
    assert_eq!(wf(store, &id).await.state, WorkflowState::Running);
    finish(store, &bc[1], true).await;
    let d = claim(store, "wf-d").await;
    assert_eq!(d.iter().map(name).collect::<Vec<_>>(), ["d"]);
    let mut outs: Vec<(String, Vec<u8>)> = d[0]
        .workflow
        .as_ref()
        .unwrap()
        .parent_outputs
        .iter()
        .map(|o| (o.step.clone(), o.data.clone()))
        .collect();
    outs.sort();
    assert_eq!(
        outs,
        [
            ("b".to_string(), b"out-b".to_vec()),
            ("c".to_string(), b"out-c".to_vec())
        ]
    );
    finish(store, &d[0], true).await;
    let done = wf(store, &id).await;
    assert_eq!(done.state, WorkflowState::Succeeded);
    assert!(done.ended_at.is_some());
    assert!(done.steps.iter().all(|t| t.state == TaskState::Succeeded));
    let listed = store
        .list_workflows("default", Some(WorkflowState::Succeeded), None, 10)
        .await
        .expect("list");
    assert!(listed.iter().any(|w| w.id == id));
    // Once it has ended, its steps age out like any task.
    let removed = store
        .remove_ended(TaskState::Succeeded, later, 0, 100)
        .await
        .expect("retention");
    assert_eq!(removed, 4);
    assert!(wf(store, &id).await.steps.is_empty());
}

/// A failed step under CANCEL_REMAINING cancels every step not ended (the
/// running sibling included) and fails the workflow; under
/// CONTINUE_INDEPENDENT only what depends on it is cancelled and the
/// independent branch runs to its end. CancelWorkflow cancels the rest and
/// names the steps that were in flight.
pub async fn a_failed_step_follows_the_workflow_policy_and_cancel_stops_the_rest(
    fixture: &dyn StoreFixture,
) {
    let store = fixture.open().await;
    let store = store.as_ref();
    for (handler, policy) in [
        ("wf-cr", FailurePolicy::CancelRemaining),
        ("wf-ci", FailurePolicy::ContinueIndependent),
    ] {
        let (record, steps) = workflow(handler, policy, DIAMOND);
        let id = store
            .create_workflow(record, "fp", steps, T0)
            .await
            .expect("create")
            .workflow
            .id;
        let a = claim(store, handler).await;
        finish(store, &a[0], true).await;
        let bc = claim(store, handler).await;
        finish(store, &bc[0], false).await;
        let after = wf(store, &id).await;
        match policy {
            FailurePolicy::CancelRemaining => {
                assert_eq!(
                    states(&after),
                    [
                        ("a".into(), TaskState::Succeeded),
                        ("b".into(), TaskState::Failed),
                        ("c".into(), TaskState::Cancelled),
                        ("d".into(), TaskState::Cancelled),
                    ]
                );
                assert_eq!(after.state, WorkflowState::Failed);
                assert!(after.message.contains("b broke"), "{}", after.message);
            }
            FailurePolicy::ContinueIndependent => {
                assert_eq!(
                    states(&after),
                    [
                        ("a".into(), TaskState::Succeeded),
                        ("b".into(), TaskState::Failed),
                        ("c".into(), TaskState::Dispatching),
                        ("d".into(), TaskState::Cancelled),
                    ]
                );
                assert_eq!(after.state, WorkflowState::Running, "c still runs");
                finish(store, &bc[1], true).await;
                let ended = wf(store, &id).await;
                assert_eq!(ended.state, WorkflowState::Failed);
                assert_eq!(ended.steps[2].state, TaskState::Succeeded);
            }
        }
    }

    let (record, steps) = workflow("wf-cancel", FailurePolicy::CancelRemaining, DIAMOND);
    let id = store
        .create_workflow(record, "fp", steps, T0)
        .await
        .expect("create")
        .workflow
        .id;
    let a = claim(store, "wf-cancel").await;
    let (cancelled, stopped) = store
        .cancel_workflow(&id, "stop it", T0 + 3)
        .await
        .expect("cancel");
    assert_eq!(cancelled.state, WorkflowState::Cancelled);
    assert_eq!(cancelled.message, "stop it");
    assert!(
        cancelled
            .steps
            .iter()
            .all(|t| t.state == TaskState::Cancelled)
    );
    assert_eq!(stopped.len(), 1, "a was in flight");
    assert_eq!(stopped[0].0.id, a[0].id);
    assert_eq!(Some(&stopped[0].1), a[0].execution_id.as_ref());
    // a's late result is refused; the workflow stays cancelled.
    let late = store
        .transition(
            &a[0].id,
            &Event::Succeed {
                execution_id: a[0].execution_id.clone().unwrap(),
                output: Vec::new(),
                content_type: String::new(),
            },
            T0 + 4,
        )
        .await;
    assert!(late.is_err(), "{late:?}");
    let (again, stopped) = store
        .cancel_workflow(&id, "twice", T0 + 5)
        .await
        .expect("cancel again");
    assert_eq!(
        (again.state, again.message.as_str()),
        (WorkflowState::Cancelled, "stop it")
    );
    assert!(stopped.is_empty());
    assert!(claim(store, "wf-cancel").await.is_empty());
    let missing = store.cancel_workflow(&new_task_id(), "x", T0).await;
    assert!(
        matches!(missing, Err(crate::Error::NotFound(_))),
        "{missing:?}"
    );
}
