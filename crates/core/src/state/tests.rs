use proptest::prelude::*;

use super::*;
use crate::task::{NewTask, RetryPolicy};

fn new_task(run_at: UnixMillis, max_attempts: u32) -> TaskRecord {
    NewTask {
        id: "t".into(),
        retry: RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        },
        timeout_ms: 1_000,
        ..NewTask::new("echo", run_at)
    }
    .into_record(100)
}

/// Events as a test script names them; execution ids are resolved against
/// the task so most events hit the current attempt, some a stale one.
#[derive(Debug, Clone)]
enum Step {
    Due,
    Dispatch,
    Ack(bool),
    Succeed(bool),
    Fail(bool, bool),
    Release(u8, bool),
    TimeOut(bool),
    Defer(i64),
    Cancel,
    Rerun,
    Spread(u32),
    ShardsEnded(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Due),
        Just(Step::Dispatch),
        any::<bool>().prop_map(Step::Ack),
        any::<bool>().prop_map(Step::Succeed),
        (any::<bool>(), any::<bool>()).prop_map(|(r, s)| Step::Fail(r, s)),
        (0u8..3, any::<bool>()).prop_map(|(r, s)| Step::Release(r, s)),
        any::<bool>().prop_map(Step::TimeOut),
        (0i64..20_000).prop_map(Step::Defer),
        Just(Step::Cancel),
        Just(Step::Rerun),
        (0u32..3).prop_map(Step::Spread),
        (0u8..4).prop_map(Step::ShardsEnded),
    ]
}

fn to_event(task: &TaskRecord, step: &Step, n: usize) -> Event {
    let exec = |stale: bool| {
        if stale {
            format!("stale-{n}")
        } else {
            task.execution_id.clone().unwrap_or_else(|| "none".into())
        }
    };
    match step {
        Step::Due => Event::Due,
        Step::Dispatch => Event::Dispatch {
            execution_id: format!("e{n}"),
            worker_id: "w".into(),
            ack_deadline: 10_000,
        },
        Step::Ack(s) => Event::Ack {
            execution_id: exec(*s),
            at: None,
        },
        Step::Succeed(s) => Event::Succeed {
            execution_id: exec(*s),
            output: vec![1],
            content_type: String::new(),
        },
        Step::Fail(retryable, s) => Event::Fail {
            execution_id: exec(*s),
            message: "boom".into(),
            retryable: *retryable,
            jitter: 0.5,
        },
        Step::Release(r, s) => Event::Release {
            execution_id: exec(*s),
            reason: [
                ReleaseReason::AckTimeout,
                ReleaseReason::Rejected,
                ReleaseReason::WorkerLost,
            ][*r as usize],
            message: String::new(),
        },
        Step::TimeOut(s) => Event::TimeOut {
            execution_id: exec(*s),
            jitter: 0.5,
        },
        Step::Defer(until) => Event::Defer { until: *until },
        Step::Cancel => Event::Cancel {
            reason: "test".into(),
        },
        Step::Rerun => Event::Rerun,
        Step::Spread(shards) => Event::Spread { shards: *shards },
        Step::ShardsEnded(s) => Event::ShardsEnded {
            state: [
                TaskState::Succeeded,
                TaskState::Failed,
                TaskState::Cancelled,
                TaskState::Ready,
            ][usize::from(*s)],
            message: "shard 1 failed".into(),
            output: b"{}".to_vec(),
        },
    }
}

/// The shape every stored task must have, whatever happened to it.
fn check_invariants(t: &TaskRecord) {
    if t.broadcast {
        // Never an attempt of its own: its shards run; never READY.
        assert!(t.execution_id.is_none() && t.worker_id.is_none(), "{t:?}");
        assert!(t.attempt == 0 && t.run_count == 0, "{t:?}");
        assert!(
            !matches!(
                t.state,
                TaskState::Ready | TaskState::Dispatching | TaskState::Retrying
            ),
            "{t:?}"
        );
        match t.state {
            TaskState::Pending => assert!(t.next_at.is_some(), "{t:?}"),
            _ => assert!(t.next_at.is_none(), "{t:?}"),
        }
        return;
    }
    assert_eq!(
        t.execution_id.is_some(),
        t.state.is_in_flight(),
        "execution id present iff in flight: {t:?}"
    );
    assert_eq!(t.worker_id.is_some(), t.state.is_in_flight());
    match t.state {
        TaskState::Pending | TaskState::Retrying | TaskState::Dispatching | TaskState::Running => {
            assert!(t.next_at.is_some(), "{} needs next_at: {t:?}", t.state)
        }
        _ => assert!(t.next_at.is_none(), "{} has no next_at: {t:?}", t.state),
    }
    assert!(t.run_count <= t.attempt, "runs never exceed pushes: {t:?}");
    assert!(
        t.run_count <= t.retry.max_attempts,
        "runs never exceed max_attempts: {t:?}"
    );
    if t.state.is_terminal() {
        assert!(t.times.end.is_some());
    }
    if t.state == TaskState::Succeeded {
        assert!(t.output.is_some());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn no_sequence_reaches_an_illegal_state(
        delayed in any::<bool>(),
        broadcast in any::<bool>(),
        max_attempts in 1u32..4,
        steps in proptest::collection::vec(step(), 0..40),
    ) {
        let mut task = new_task(if delayed { 500 } else { 0 }, max_attempts);
        if broadcast {
            task = NewTask {
                id: "b".into(),
                broadcast: true,
                ..NewTask::new("echo", if delayed { 500 } else { 0 })
            }
            .into_record(100);
        }
        check_invariants(&task);
        let mut now = 100;
        for (n, s) in steps.iter().enumerate() {
            now += 10;
            let event = to_event(&task, s, n);
            let before = task.clone();
            match apply(&task, &event, now) {
                Ok(tr) => {
                    // Only a rerun moves an ended task, and only one that did not succeed.
                    prop_assert_eq!(tr.reopened, before.state.is_terminal());
                    if tr.reopened {
                        prop_assert!(matches!(event, Event::Rerun));
                        prop_assert_ne!(before.state, TaskState::Succeeded);
                        let reopened_in = if broadcast { TaskState::Pending } else { TaskState::Ready };
                        prop_assert_eq!(tr.task.state, reopened_in);
                        prop_assert_eq!(tr.task.attempt, before.attempt, "attempt numbers go on");
                    }
                    prop_assert_eq!(tr.task.version, before.version + 1);
                    task = tr.task;
                    check_invariants(&task);
                }
                Err(TransitionError::StaleExecution { .. }) => {
                    prop_assert!(before.state.is_in_flight());
                }
                Err(TransitionError::IllegalState { state, .. }) => {
                    prop_assert_eq!(state, before.state);
                }
            }
        }
    }
}

fn run(task: &TaskRecord, event: Event) -> TaskRecord {
    apply(task, &event, 200).expect("legal").task
}

fn dispatch(t: &TaskRecord, exec: &str) -> TaskRecord {
    run(
        t,
        Event::Dispatch {
            execution_id: exec.into(),
            worker_id: "w".into(),
            ack_deadline: 300,
        },
    )
}

#[test]
fn happy_path_records_each_state_time() {
    let t = new_task(0, 3);
    assert_eq!(t.state, TaskState::Ready);
    let t = dispatch(&t, "e1");
    assert_eq!(
        (t.state, t.attempt, t.next_at),
        (TaskState::Dispatching, 1, Some(300))
    );
    let t = run(
        &t,
        Event::Ack {
            execution_id: "e1".into(),
            at: None,
        },
    );
    assert_eq!(
        (t.state, t.run_count, t.next_at),
        (TaskState::Running, 1, Some(1_200))
    );
    let t = run(
        &t,
        Event::Succeed {
            execution_id: "e1".into(),
            output: b"ok".to_vec(),
            content_type: "text/plain".into(),
        },
    );
    assert_eq!(t.state, TaskState::Succeeded);
    assert_eq!(t.times.end, Some(200));
    assert_eq!(t.output.as_deref(), Some(&b"ok"[..]));
}

#[test]
fn stale_results_are_refused() {
    let t = dispatch(&new_task(0, 3), "e1");
    let err = apply(
        &t,
        &Event::Succeed {
            execution_id: "old".into(),
            output: vec![],
            content_type: String::new(),
        },
        200,
    )
    .unwrap_err();
    assert!(
        matches!(err, TransitionError::StaleExecution { .. }),
        "{err}"
    );
}

#[test]
fn failures_retry_until_attempts_run_out() {
    let mut t = new_task(0, 2);
    for (n, expect) in [(1, TaskState::Retrying), (2, TaskState::Failed)] {
        if t.state == TaskState::Retrying {
            t = run(&t, Event::Due);
        }
        let exec = format!("e{n}");
        t = dispatch(&t, &exec);
        t = run(
            &t,
            Event::Ack {
                execution_id: exec.clone(),
                at: None,
            },
        );
        t = run(
            &t,
            Event::Fail {
                execution_id: exec,
                message: "boom".into(),
                retryable: true,
                jitter: 1.0,
            },
        );
        assert_eq!(t.state, expect);
    }
    assert_eq!(t.error_message, "boom");
}

#[test]
fn a_non_retryable_failure_ends_at_once() {
    let t = dispatch(&new_task(0, 5), "e");
    let t = run(
        &t,
        Event::Fail {
            execution_id: "e".into(),
            message: "bad input".into(),
            retryable: false,
            jitter: 0.0,
        },
    );
    assert_eq!((t.state, t.run_count), (TaskState::Failed, 1));
}

#[test]
fn an_ack_timeout_returns_the_task_without_spending_a_run() {
    let t = dispatch(&new_task(0, 1), "e");
    let tr = apply(
        &t,
        &Event::Release {
            execution_id: "e".into(),
            reason: ReleaseReason::AckTimeout,
            message: "no ack".into(),
        },
        400,
    )
    .unwrap();
    assert_eq!((tr.task.state, tr.task.run_count), (TaskState::Ready, 0));
    assert!(matches!(
        tr.attempt,
        AttemptChange::Close {
            outcome: AttemptOutcome::AckTimeout,
            ..
        }
    ));
}

#[test]
fn a_rerun_opens_a_failed_task_with_a_fresh_round_and_never_a_succeeded_one() {
    let t = dispatch(&new_task(0, 1), "e1");
    let failed = run(
        &t,
        Event::Fail {
            execution_id: "e1".into(),
            message: "boom".into(),
            retryable: true,
            jitter: 0.0,
        },
    );
    assert_eq!((failed.state, failed.run_count), (TaskState::Failed, 1));
    let tr = apply(&failed, &Event::Rerun, 300).expect("a failed task reruns");
    assert!(tr.reopened);
    let again = tr.task;
    assert_eq!(
        (again.state, again.run_count, again.attempt, again.times.end),
        (TaskState::Ready, 0, 1, None)
    );
    assert!(again.error_message.is_empty());
    // Its next push is attempt 2, and the round allows max_attempts runs.
    let t2 = dispatch(&again, "e2");
    assert_eq!(t2.attempt, 2);
    // A live task is refused (the API answers it unchanged), as is a success.
    assert!(apply(&again, &Event::Rerun, 300).is_err());
    let ok = run(
        &t2,
        Event::Succeed {
            execution_id: "e2".into(),
            output: vec![],
            content_type: String::new(),
        },
    );
    assert!(matches!(
        apply(&ok, &Event::Rerun, 400),
        Err(TransitionError::IllegalState {
            state: TaskState::Succeeded,
            ..
        })
    ));
}
