//! Conformance scenarios: workflows, released and cancelled in the
//! transaction that ends a step.

use std::sync::Arc;

use taskmesh_core::id::{new_execution_id, new_task_id};
use taskmesh_core::workflow::{FailurePolicy, StepLink, WorkflowRecord, WorkflowState};
use taskmesh_core::{Event, NewTask, TaskRecord, TaskState};

use super::{StoreFixture, T0, new_task};
use crate::{Claim, Store};

/// A workflow of `steps` (name, parents) of `handler`, as SubmitWorkflow
/// would make it; a step named `on-failure` is the on_failure step, one
/// named `join` runs after its parents end.
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
                on_failure: *name == "on-failure",
                after_parents_end: *name == "join",
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
        parent_task_id: None,
        steps: Vec::new(),
    };
    (record, tasks)
}

/// Creates a workflow of `steps` (as [`workflow`] makes it); its id.
async fn start(
    store: &dyn Store,
    handler: &str,
    policy: FailurePolicy,
    steps: &[(&str, &[&str])],
) -> String {
    let (record, steps) = workflow(handler, policy, steps);
    store
        .create_workflow(record, "fp", steps, T0)
        .await
        .expect("create")
        .workflow
        .id
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
    // Once it has ended, it ages out whole: its steps never one by one.
    let removed = store
        .remove_ended(TaskState::Succeeded, later, 0, 100)
        .await
        .expect("retention");
    assert_eq!(removed, 0, "steps go with their workflow");
    let removed = store
        .remove_ended_workflows(TaskState::Succeeded, later, 0, 100)
        .await
        .expect("workflow retention");
    assert_eq!(removed, (1, 4));
    assert!(store.get_workflow(&id).await.expect("get").is_none());
}

/// Runs a diamond of `handler` to its end (every step succeeds).
async fn run_diamond(store: &dyn Store, handler: &str) -> String {
    let id = start(store, handler, FailurePolicy::CancelRemaining, DIAMOND).await;
    for _ in 0..3 {
        for t in claim(store, handler).await {
            finish(store, &t, true).await;
        }
    }
    assert_eq!(wf(store, &id).await.state, WorkflowState::Succeeded);
    id
}

/// Retention takes an ended workflow whole — its row and every step, once
/// its end is past its namespace's horizon for its end state (a handler's
/// horizon does not apply), else the server's — and never a step on its
/// own, a running workflow, or one whose step still has a callback to
/// deliver; a workflow larger than the batch goes over several calls, its
/// row last.
pub async fn an_ended_workflow_ages_out_whole(fixture: &dyn StoreFixture) {
    use taskmesh_core::retention::Horizons;
    let store = fixture.open().await;
    let store = store.as_ref();
    let ended = run_diamond(store, "wf-age").await;
    // Another, still running: its first step has ended.
    let running = start(store, "wf-run", FailurePolicy::CancelRemaining, DIAMOND).await;
    finish(store, &claim(store, "wf-run").await[0], true).await;
    let far = T0 + 30 * 86_400_000;
    let remove = |state: TaskState, now: i64, default_ms: i64, limit: usize| async move {
        store
            .remove_ended_workflows(state, now, default_ms, limit)
            .await
            .expect("remove_ended_workflows")
    };

    assert_eq!(
        store
            .remove_ended(TaskState::Succeeded, far, 0, 100)
            .await
            .expect("remove_ended"),
        0,
        "no step goes on its own"
    );
    assert_eq!(
        remove(TaskState::Succeeded, T0 + 502, 1_000, 100).await,
        (0, 0),
        "inside the server's horizon"
    );
    assert_eq!(
        remove(TaskState::Failed, far, 0, 100).await,
        (0, 0),
        "not FAILED"
    );
    assert_eq!(remove(TaskState::TimedOut, far, 0, 100).await, (0, 0));
    assert!(matches!(
        store
            .remove_ended_workflows(TaskState::Running, far, 0, 100)
            .await,
        Err(crate::Error::InvalidArgument(_))
    ));
    // The namespace's horizon decides over the server's; a handler's does not.
    let mut long = Horizons::default();
    long.set(TaskState::Succeeded, Some(40 * 86_400_000));
    store
        .set_retention("default", "", &long)
        .await
        .expect("set");
    let mut quick = Horizons::default();
    quick.set(TaskState::Succeeded, Some(1));
    store
        .set_retention("default", "wf-age", &quick)
        .await
        .expect("set");
    assert_eq!(
        remove(TaskState::Succeeded, far, 0, 100).await,
        (0, 0),
        "the namespace keeps it 40 days"
    );
    store
        .set_retention("default", "", &Horizons::default())
        .await
        .expect("unset");
    store
        .set_retention("default", "wf-age", &Horizons::default())
        .await
        .expect("unset");

    // Past the horizon, in batches of 3 steps: the row goes with the last.
    assert_eq!(remove(TaskState::Succeeded, far, 0, 3).await, (0, 3));
    let left = wf(store, &ended).await;
    assert_eq!(
        left.steps.len(),
        1,
        "the row stays until its last step goes"
    );
    assert_eq!(remove(TaskState::Succeeded, far, 0, 3).await, (1, 1));
    assert!(store.get_workflow(&ended).await.expect("get").is_none());
    let kept = wf(store, &running).await;
    assert_eq!(kept.steps.len(), 4, "a running workflow keeps every step");
    assert_eq!(kept.steps[0].state, TaskState::Succeeded);

    // A step's callback still to deliver holds its whole workflow.
    let (record, mut steps) = workflow("wf-cb", FailurePolicy::CancelRemaining, &[("only", &[])]);
    steps[0].callback_url = "http://127.0.0.1:9/cb".into();
    let with_callback = store
        .create_workflow(record, "fp", steps, T0)
        .await
        .expect("create")
        .workflow
        .id;
    let only = finish(store, &claim(store, "wf-cb").await[0], true).await;
    assert_eq!(remove(TaskState::Succeeded, far, 0, 100).await, (0, 0));
    let entry = store
        .get_task(&only.id)
        .await
        .expect("get")
        .expect("kept")
        .callback
        .expect("a pending callback");
    assert!(
        store
            .finish_callback(
                &entry.delivery_id,
                &taskmesh_core::CallbackOutcome::Delivered,
                T0 + 600
            )
            .await
            .expect("deliver")
    );
    assert_eq!(remove(TaskState::Succeeded, far, 0, 100).await, (1, 1));
    assert!(
        store
            .get_workflow(&with_callback)
            .await
            .expect("get")
            .is_none()
    );
}

/// A failed step under CANCEL_REMAINING cancels every step not ended (the
/// running sibling included) and fails the workflow; under
/// CONTINUE_INDEPENDENT only what depends on it is cancelled and the
/// independent branch runs to its end; RetryWorkflow then re-runs the
/// failed step and the one below it, never a success. CancelWorkflow
/// cancels the rest and names the steps that were in flight.
pub async fn a_failed_step_follows_the_workflow_policy_and_cancel_stops_the_rest(
    fixture: &dyn StoreFixture,
) {
    let store = fixture.open().await;
    let store = store.as_ref();
    for (handler, policy) in [
        ("wf-cr", FailurePolicy::CancelRemaining),
        ("wf-ci", FailurePolicy::ContinueIndependent),
    ] {
        let id = start(store, handler, policy, DIAMOND).await;
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
                // RetryWorkflow: b runs again, d waits for it again; a and
                // c, which succeeded, do not.
                let (retried, n) = store.retry_workflow(&id, T0 + 3).await.expect("retry");
                assert_eq!(n, 2);
                assert_eq!(
                    (retried.state, retried.message.as_str()),
                    (WorkflowState::Running, "")
                );
                assert_eq!(
                    states(&retried),
                    [
                        ("a".into(), TaskState::Succeeded),
                        ("b".into(), TaskState::Ready),
                        ("c".into(), TaskState::Succeeded),
                        ("d".into(), TaskState::Pending),
                    ]
                );
                let b = claim(store, handler).await;
                assert_eq!(b.iter().map(name).collect::<Vec<_>>(), ["b"]);
                finish(store, &b[0], true).await;
                let d = claim(store, handler).await;
                assert_eq!(d.iter().map(name).collect::<Vec<_>>(), ["d"]);
                assert_eq!(d[0].workflow.as_ref().unwrap().parent_outputs.len(), 2);
                finish(store, &d[0], true).await;
                assert_eq!(wf(store, &id).await.state, WorkflowState::Succeeded);
                let (same, n) = store.retry_workflow(&id, T0 + 4).await.expect("again");
                assert_eq!(
                    (same.state, n),
                    (WorkflowState::Succeeded, 0),
                    "nothing to re-run"
                );
            }
        }
    }

    let id = start(store, "wf-cancel", FailurePolicy::CancelRemaining, DIAMOND).await;
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

/// Two replicas end the parents of the same workflows at once, each in one
/// batch that also ACKs a step of the workflows the other replica is
/// ending: every child whose parents both succeeded is released exactly
/// once (its one transition after creation), every failed workflow has its
/// other steps cancelled, and neither batch fails (no deadlock: a step
/// another transaction holds is cancelled after the commit).
pub async fn two_replicas_ending_parents_at_once_release_each_child_once(
    fixture: &dyn StoreFixture,
) {
    const N: usize = 12;
    let (one, two) = (fixture.open().await, fixture.open().await);
    let shape: &[(&str, &[&str])] = &[("x", &[]), ("y", &[]), ("z", &["x", "y"])];
    for round in 0..3 {
        // Round 0: everything succeeds; rounds 1 and 2: the x steps fail.
        let fail = round > 0;
        let handler = format!("wf-race-{round}");
        let mut ids = Vec::new();
        for i in 0..N {
            let store = if i % 2 == 0 { &one } else { &two };
            let (record, steps) = workflow(&handler, FailurePolicy::CancelRemaining, shape);
            let created = store
                .create_workflow(record, "fp", steps, T0)
                .await
                .expect("create");
            ids.push(created.workflow.id);
        }
        let claimed = claim(one.as_ref(), &handler).await;
        assert_eq!(claimed.len(), 2 * N);
        let of = |wf: &str, step: &str| {
            claimed
                .iter()
                .find(|t| {
                    t.workflow
                        .as_ref()
                        .is_some_and(|w| w.workflow_id == wf && w.step == step)
                })
                .expect("claimed")
                .clone()
        };
        let end = |t: &TaskRecord, ok: bool| {
            let execution_id = t.execution_id.clone().expect("claimed");
            let event = if ok {
                Event::Succeed {
                    execution_id,
                    output: b"1".to_vec(),
                    content_type: String::new(),
                }
            } else {
                Event::Fail {
                    execution_id,
                    message: "x broke".into(),
                    retryable: false,
                    jitter: 0.0,
                }
            };
            (t.id.clone(), event)
        };
        let ack = |t: &TaskRecord| {
            let execution_id = t.execution_id.clone().expect("claimed");
            (
                t.id.clone(),
                Event::Ack {
                    execution_id,
                    at: None,
                },
            )
        };
        // Replica one: x of the even workflows ends, y of the odd ones is
        // ACKed; replica two the other way round; then the rest.
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for (i, id) in ids.iter().enumerate() {
            let (x, y) = (of(id, "x"), of(id, "y"));
            if i % 2 == 0 {
                first.push(end(&x, !fail));
                second.push(ack(&y));
            } else {
                second.push(end(&x, !fail));
                first.push(ack(&y));
            }
        }
        let run = |store: Arc<dyn Store>, events: Vec<(String, Event)>| {
            tokio::spawn(async move { store.transition_many(&events, T0 + 2, None).await })
        };
        let (a, b) = (run(Arc::clone(&one), first), run(Arc::clone(&two), second));
        for (side, done) in [("one", a.await), ("two", b.await)] {
            let results = done
                .expect("joined")
                .unwrap_or_else(|e| panic!("replica {side}: {e}"));
            for r in results {
                if !fail {
                    r.unwrap_or_else(|e| panic!("replica {side}: {e}"));
                }
            }
        }
        if !fail {
            // Now every y ends, half on each replica at once.
            let (mut first, mut second) = (Vec::new(), Vec::new());
            for (i, id) in ids.iter().enumerate() {
                let y = get_task(two.as_ref(), &of(id, "y").id).await;
                let e = end(&y, true);
                if i % 2 == 0 {
                    first.push(e)
                } else {
                    second.push(e)
                }
            }
            let (a, b) = (run(Arc::clone(&one), first), run(Arc::clone(&two), second));
            a.await.expect("joined").expect("replica one");
            b.await.expect("joined").expect("replica two");
        }
        for id in &ids {
            let w = wf(one.as_ref(), id).await;
            let z = &w.steps[2];
            if fail {
                assert_eq!(w.state, WorkflowState::Failed, "round {round}: {w:?}");
                assert!(
                    w.steps.iter().all(|t| t.state.is_terminal()),
                    "round {round}: every step ended: {:?}",
                    states(&w)
                );
                assert_eq!(z.state, TaskState::Cancelled);
            } else {
                assert_eq!(z.state, TaskState::Ready, "round {round}: {:?}", states(&w));
                assert_eq!(z.version, 2, "z was released by exactly one transition");
            }
        }
    }
}

async fn get_task(store: &dyn Store, id: &str) -> TaskRecord {
    store
        .get_task(id)
        .await
        .expect("get_task")
        .expect("the task")
}

/// A workflow's on_failure step waits with no parents, runs once a step
/// has failed (receiving the failed steps' errors by name), and the
/// workflow ends FAILED after it; RetryWorkflow is refused while it runs
/// and re-arms it; when every other step succeeds it is cancelled as
/// unneeded and the workflow SUCCEEDED.
pub async fn the_on_failure_step_runs_with_the_failed_steps_errors(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let id = start(
        store,
        "wf-of",
        FailurePolicy::CancelRemaining,
        &[("a", &[]), ("b", &["a"]), ("on-failure", &[])],
    )
    .await;
    assert_eq!(
        states(&wf(store, &id).await),
        [
            ("a".into(), TaskState::Ready),
            ("b".into(), TaskState::Pending),
            ("on-failure".into(), TaskState::Pending),
        ]
    );
    let handler = wf(store, &id).await.steps[2].clone();
    assert!(
        handler.workflow.as_ref().unwrap().on_failure,
        "read back as the on_failure step"
    );
    assert!(handler.workflow.as_ref().unwrap().depends_on.is_empty());
    let a = claim(store, "wf-of").await;
    assert_eq!(
        a.iter().map(name).collect::<Vec<_>>(),
        ["a"],
        "on-failure is not released"
    );
    finish(store, &a[0], false).await;
    assert_eq!(
        states(&wf(store, &id).await),
        [
            ("a".into(), TaskState::Failed),
            ("b".into(), TaskState::Cancelled),
            ("on-failure".into(), TaskState::Ready),
        ]
    );
    assert_eq!(wf(store, &id).await.state, WorkflowState::Running);
    let h = claim(store, "wf-of").await;
    assert_eq!(h.iter().map(name).collect::<Vec<_>>(), ["on-failure"]);
    let outs = &h[0].workflow.as_ref().unwrap().parent_outputs;
    assert_eq!(outs.len(), 1, "only a failed; b was cancelled");
    assert_eq!(
        (outs[0].step.as_str(), outs[0].data.as_slice()),
        ("a", &b"a broke"[..])
    );
    assert!(outs[0].content_type.starts_with("text/plain"));
    let refused = store.retry_workflow(&id, T0 + 3).await;
    assert!(
        matches!(&refused, Err(crate::Error::FailedPrecondition(m)) if m.contains("on-failure")),
        "{refused:?}"
    );
    finish(store, &h[0], true).await;
    let failed = wf(store, &id).await;
    assert_eq!(failed.state, WorkflowState::Failed);
    assert!(failed.message.contains("\"a\""), "{}", failed.message);

    // Retried: a runs again, b waits for it, on-failure waits again.
    let (retried, n) = store.retry_workflow(&id, T0 + 4).await.expect("retry");
    assert_eq!(n, 3);
    assert_eq!(
        states(&retried),
        [
            ("a".into(), TaskState::Ready),
            ("b".into(), TaskState::Pending),
            ("on-failure".into(), TaskState::Pending),
        ]
    );
    for _ in 0..2 {
        let got = claim(store, "wf-of").await;
        assert_eq!(got.len(), 1, "one step at a time, never on-failure");
        assert_ne!(name(&got[0]), "on-failure");
        finish(store, &got[0], true).await;
    }
    let done = wf(store, &id).await;
    assert_eq!(done.state, WorkflowState::Succeeded);
    assert_eq!(done.steps[2].state, TaskState::Cancelled);
    assert!(
        done.steps[2].error_message.contains("not needed"),
        "{}",
        done.steps[2].error_message
    );
}

/// A broadcast: stored PENDING (never READY, never claimed), spread into
/// 3 shards (the task RUNNING, the shards READY children with indexes 0-2
/// in a workflow of their own); the task SUCCEEDED in the transaction that
/// ends the last shard, and not before. A second broadcast whose shard
/// fails for good FAILED with the failure named, its other shards
/// cancelled; RetryWorkflow of a shards' workflow is refused, RetryTask
/// of the broadcast makes it PENDING and due to be spread again.
pub async fn a_broadcast_is_spread_into_shards_and_ends_with_them(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let broadcast = |handler: &str| NewTask {
        broadcast: true,
        ..new_task(handler)
    };
    let b = store
        .create_task(broadcast("bc-ok"), "fp-b", T0)
        .await
        .expect("create")
        .task;
    assert_eq!((b.state, b.next_at), (TaskState::Pending, Some(T0)));
    assert!(b.broadcast);
    assert!(
        claim(store, "bc-ok").await.is_empty(),
        "a broadcast is never claimed"
    );
    let (running, w) = store
        .spread_broadcast(&b.id, 3, T0 + 1, None)
        .await
        .expect("spread");
    assert_eq!(running.state, TaskState::Running);
    assert_eq!(running.execution_id, None);
    assert_eq!(w.parent_task_id.as_deref(), Some(b.id.as_str()));
    assert!(
        store
            .spread_broadcast(&b.id, 3, T0 + 1, None)
            .await
            .is_err(),
        "a running broadcast is not spread twice"
    );
    let shards = claim(store, "bc-ok").await;
    let mut idx: Vec<(u32, u32)> = shards
        .iter()
        .map(|s| s.shard.map(|x| (x.index, x.total)).expect("a shard"))
        .collect();
    idx.sort_unstable();
    assert_eq!(idx, vec![(0, 3), (1, 3), (2, 3)]);
    assert!(
        shards
            .iter()
            .all(|s| s.parent_task_id.as_deref() == Some(b.id.as_str()) && !s.broadcast)
    );
    for s in &shards[..2] {
        finish(store, s, true).await;
    }
    let now = store.get_task(&b.id).await.expect("get").expect("there");
    assert_eq!(now.state, TaskState::Running, "one shard still runs");
    finish(store, &shards[2], true).await;
    let done = store.get_task(&b.id).await.expect("get").expect("there");
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(wf(store, &w.id).await.state, WorkflowState::Succeeded);

    let f = store
        .create_task(broadcast("bc-fail"), "fp-f", T0)
        .await
        .expect("create")
        .task;
    let (_, w) = store
        .spread_broadcast(&f.id, 2, T0 + 1, None)
        .await
        .expect("spread");
    let shards = claim(store, "bc-fail").await;
    assert_eq!(shards.len(), 2);
    finish(store, &shards[0], false).await;
    let failed = store.get_task(&f.id).await.expect("get").expect("there");
    assert_eq!(failed.state, TaskState::Failed);
    assert!(
        failed.error_message.contains("broke"),
        "{}",
        failed.error_message
    );
    let w = wf(store, &w.id).await;
    assert_eq!(w.state, WorkflowState::Failed);
    assert!(w.steps.iter().any(|s| s.state == TaskState::Cancelled));
    assert!(matches!(
        store.retry_workflow(&w.id, T0 + 3).await,
        Err(crate::Error::FailedPrecondition(_))
    ));
    let again = store
        .transition(&f.id, &Event::Rerun, T0 + 4)
        .await
        .expect("rerun");
    assert_eq!(
        (again.state, again.next_at),
        (TaskState::Pending, Some(T0 + 4))
    );
    let due = store.due_tasks(T0 + 4, 100).await.expect("due");
    assert!(due.iter().any(|t| t.id == f.id), "due to be spread again");

    // Spread again, its first spread's shards still live (cancelled
    // without a sweep): their end does not end it, its new shards' does.
    let r = store
        .create_task(broadcast("bc-again"), "fp-r", T0)
        .await
        .expect("create")
        .task;
    store
        .spread_broadcast(&r.id, 1, T0 + 1, None)
        .await
        .expect("spread");
    let old = claim(store, "bc-again").await;
    let cancel = Event::Cancel {
        reason: "stop".into(),
    };
    store
        .transition(&r.id, &cancel, T0 + 2)
        .await
        .expect("cancel");
    store
        .transition(&r.id, &Event::Rerun, T0 + 3)
        .await
        .expect("rerun");
    store
        .spread_broadcast(&r.id, 1, T0 + 4, None)
        .await
        .expect("spread again");
    finish(store, &old[0], true).await;
    let r_now = store.get_task(&r.id).await.expect("get").expect("there");
    assert_eq!(
        r_now.state,
        TaskState::Running,
        "an old shard's end is not its end"
    );
    let new = claim(store, "bc-again").await;
    assert_eq!(new.len(), 1);
    finish(store, &new[0], true).await;
    let r_now = store.get_task(&r.id).await.expect("get").expect("there");
    assert_eq!(r_now.state, TaskState::Succeeded);

    // A concurrency key counts the shards, not the running broadcast.
    let keyed = store
        .create_task(
            NewTask {
                concurrency: Some(taskmesh_core::Concurrency {
                    key: "bc-key".into(),
                    limit: 1,
                }),
                ..broadcast("bc-keyed")
            },
            "fp-k",
            T0,
        )
        .await
        .expect("create")
        .task;
    store
        .spread_broadcast(&keyed.id, 2, T0 + 1, None)
        .await
        .expect("spread");
    assert_eq!(
        claim(store, "bc-keyed").await.len(),
        1,
        "one shard at a time, not none"
    );
}

/// A schedule that starts a workflow: its fire's task is the workflow's
/// run, stored PENDING and never claimed; its spread writes, in one
/// transaction, the run RUNNING and the workflow its schedule defines (the
/// steps children of the run, each released with its parents' outputs);
/// the workflow's end ends the run. Retrying the workflow itself is
/// refused (the run would stay ended), and a run whose schedule is gone is
/// refused at its spread with nothing written.
pub async fn a_workflow_run_starts_its_schedules_workflow_and_ends_with_it(
    fixture: &dyn StoreFixture,
) {
    use taskmesh_core::schedule::{ScheduleRecord, TaskTemplate};
    use taskmesh_core::workflow::{SpecStep, WorkflowSpec};
    let store = fixture.open().await;
    let store = store.as_ref();
    let step = |name: &str, deps: &[&str]| SpecStep {
        name: name.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        on_failure: false,
        after_parents_end: false,
        template: TaskTemplate {
            handler: "run-step".into(),
            ..TaskTemplate::workflow_run()
        },
    };
    let spec = WorkflowSpec {
        failure_policy: FailurePolicy::CancelRemaining,
        steps: vec![step("a", &[]), step("b", &["a"])],
    };
    let s = ScheduleRecord {
        template: TaskTemplate::workflow_run(),
        workflow: Some(spec.clone()),
        ..super::schedules::schedule("s-wf", Some(T0))
    };
    store.create_schedule(&s).await.expect("create schedule");
    let stored = store
        .get_schedule("s-wf")
        .await
        .expect("get")
        .expect("there");
    assert_eq!(
        stored.workflow.as_ref(),
        Some(&spec),
        "kept with the schedule"
    );
    let run = store
        .create_task(s.new_task(new_task_id(), T0, T0), "fp-run", T0)
        .await
        .expect("create")
        .task;
    let run = get_task(store, &run.id).await;
    assert!(run.runs_workflow && !run.broadcast, "read back as a run");
    assert_eq!((run.state, run.next_at), (TaskState::Pending, Some(T0)));
    assert!(
        claim(store, "workflow").await.is_empty(),
        "a run is never claimed"
    );
    let due = store.due_tasks(T0, 100).await.expect("due");
    assert!(due.iter().any(|t| t.id == run.id), "due to be spread");

    let (running, w) = store
        .spread_broadcast(&run.id, 1, T0 + 1, None)
        .await
        .expect("spread");
    assert_eq!(
        (running.state, running.execution_id),
        (TaskState::Running, None)
    );
    assert_eq!(
        (w.step_count, w.parent_task_id.as_deref()),
        (2, Some(run.id.as_str()))
    );
    assert!(matches!(
        store.retry_workflow(&w.id, T0 + 1).await,
        Err(crate::Error::FailedPrecondition(_))
    ));
    let a = claim(store, "run-step").await;
    assert_eq!(a.iter().map(name).collect::<Vec<_>>(), ["a"]);
    assert_eq!(a[0].parent_task_id.as_deref(), Some(run.id.as_str()));
    finish(store, &a[0], true).await;
    assert_eq!(get_task(store, &run.id).await.state, TaskState::Running);
    let b = claim(store, "run-step").await;
    assert_eq!(b.iter().map(name).collect::<Vec<_>>(), ["b"]);
    let outs = &b[0].workflow.as_ref().expect("a step").parent_outputs;
    assert_eq!(
        outs.iter()
            .map(|o| (o.step.as_str(), o.data.as_slice()))
            .collect::<Vec<_>>(),
        [("a", b"out-a".as_slice())]
    );
    finish(store, &b[0], true).await;
    let done = get_task(store, &run.id).await;
    assert_eq!(done.state, TaskState::Succeeded);
    let output = String::from_utf8_lossy(done.output.as_deref().unwrap_or_default()).into_owned();
    assert!(
        output.contains(&w.id) && output.contains("\"steps\":2"),
        "its output names the workflow and its steps: {output}"
    );
    assert_eq!(wf(store, &w.id).await.state, WorkflowState::Succeeded);

    let orphan = store
        .create_task(
            NewTask {
                runs_workflow: true,
                schedule_id: Some("s-gone".into()),
                ..new_task("workflow")
            },
            "fp-orphan",
            T0,
        )
        .await
        .expect("create")
        .task;
    assert!(matches!(
        store.spread_broadcast(&orphan.id, 1, T0 + 1, None).await,
        Err(crate::Error::FailedPrecondition(_))
    ));
    assert_eq!(get_task(store, &orphan.id).await.state, TaskState::Pending);
}

/// A join run after its parents end: read back as one, released once
/// every parent has ended — a failure, and the cancel of a running sibling
/// it causes, included — in the transaction that ended the last, with the
/// succeeded parents' outputs and the others' errors; the workflow ends
/// FAILED once it has run.
pub async fn a_join_after_its_parents_end_runs_with_outputs_and_errors(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let id = start(
        store,
        "jn",
        FailurePolicy::CancelRemaining,
        &[
            ("a", &[]),
            ("b", &[]),
            ("c", &[]),
            ("join", &["a", "b", "c"]),
        ],
    )
    .await;
    let w = wf(store, &id).await;
    let link = w.steps[3].workflow.as_ref().expect("a step");
    assert!(
        link.after_parents_end && link.depends_on == ["a", "b", "c"],
        "{link:?}"
    );
    let abc = claim(store, "jn").await;
    assert_eq!(abc.iter().map(name).collect::<Vec<_>>(), ["a", "b", "c"]);
    finish(store, &abc[0], true).await;
    // b fails: c (claimed, not ended) is cancelled, which ends the join's
    // last parent: the join is released in the same transaction.
    finish(store, &abc[1], false).await;
    let j = claim(store, "jn").await;
    assert_eq!(j.iter().map(name).collect::<Vec<_>>(), ["join"]);
    let outs = &j[0].workflow.as_ref().expect("a step").parent_outputs;
    let mut got: Vec<(&str, bool, String)> = outs
        .iter()
        .map(|o| {
            (
                o.step.as_str(),
                o.failed,
                String::from_utf8_lossy(&o.data).into_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        (got[0].0, got[0].1, got[0].2.as_str()),
        ("a", false, "out-a")
    );
    assert!(
        got[1].0 == "b" && got[1].1 && got[1].2.starts_with("FAILED: b broke"),
        "{got:?}"
    );
    assert!(
        got[2].0 == "c" && got[2].1 && got[2].2.starts_with("CANCELLED: "),
        "{got:?}"
    );
    assert_eq!(
        wf(store, &id).await.state,
        WorkflowState::Running,
        "the join runs"
    );
    finish(store, &j[0], true).await;
    let done = wf(store, &id).await;
    assert_eq!(done.state, WorkflowState::Failed);
    assert!(done.message.contains("\"b\""), "{}", done.message);
}
