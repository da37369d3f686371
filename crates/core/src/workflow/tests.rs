use super::*;
use crate::{Event, NewTask, apply};

fn def(name: &str, deps: &[&str]) -> StepDef {
    StepDef {
        name: name.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
    }
}

#[test]
fn a_diamond_passes_and_bad_shapes_are_named() {
    let diamond = [
        def("a", &[]),
        def("b", &["a"]),
        def("c", &["a"]),
        def("d", &["b", "c"]),
    ];
    assert_eq!(check_steps(&diamond, 10), Ok(()));
    let err = |steps: &[StepDef]| check_steps(steps, 10).unwrap_err();
    assert!(err(&[]).contains("at least one step"));
    assert!(check_steps(&diamond, 3).unwrap_err().contains("limit is 3"));
    assert!(err(&[def("a", &[]), def("a", &[])]).contains("\"a\" is used twice"));
    assert!(err(&[def("a", &["z"])]).contains("depends on \"z\", which is not a step"));
    assert!(err(&[def("a", &["a"])]).contains("depends on itself"));
    assert!(err(&[def("a", &[]), def("b", &["a", "a"])]).contains("names \"a\" twice"));
    assert!(err(&[def("bad name", &[])]).contains("step \"bad name\""));
    let cycle = err(&[
        def("a", &[]),
        def("b", &["a", "d"]),
        def("c", &["b"]),
        def("d", &["c"]),
    ]);
    assert!(cycle.contains("cycle"), "{cycle}");
    for n in ["\"b\"", "\"c\"", "\"d\""] {
        assert!(cycle.contains(n), "{cycle} should name {n}");
    }
    assert!(
        !cycle.contains("\"a\""),
        "{cycle} names a step off the cycle"
    );
}

/// The diamond's steps as stored: a READY, the others waiting.
fn diamond(now: UnixMillis) -> Vec<TaskRecord> {
    [
        ("a", vec![]),
        ("b", vec!["a"]),
        ("c", vec!["a"]),
        ("d", vec!["b", "c"]),
    ]
    .into_iter()
    .map(|(name, deps)| {
        NewTask {
            workflow: Some(StepLink {
                workflow_id: "w".into(),
                step: name.into(),
                depends_on: deps.into_iter().map(String::from).collect(),
                parent_outputs: Vec::new(),
            }),
            ..NewTask::new("echo", now)
        }
        .into_record(now)
    })
    .collect()
}

fn run(task: &mut TaskRecord, ok: bool, now: UnixMillis) {
    let exec = format!("x-{}", task.id);
    for event in [
        Event::Due,
        Event::Dispatch {
            execution_id: exec.clone(),
            worker_id: "w1".into(),
            ack_deadline: now + 1000,
        },
        Event::Ack {
            execution_id: exec.clone(),
            at: None,
        },
        if ok {
            Event::Succeed {
                execution_id: exec.clone(),
                output: b"{}".to_vec(),
                content_type: "application/json".into(),
            }
        } else {
            Event::Fail {
                execution_id: exec.clone(),
                message: "boom".into(),
                retryable: false,
                jitter: 0.0,
            }
        },
    ] {
        if event == Event::Due && task.state == TaskState::Ready {
            continue;
        }
        *task = apply(task, &event, now).unwrap().task;
    }
}

#[test]
fn a_diamond_releases_in_order_and_succeeds() {
    let mut steps = diamond(1000);
    assert_eq!(steps[0].state, TaskState::Ready);
    assert!(steps[1..].iter().all(is_waiting));
    // Only its parents release a waiting step: a due-time never does.
    assert!(apply(&steps[1], &Event::Due, 1001).is_err());
    assert!(apply(&steps[1], &Event::Defer { until: 1001 }, 1001).is_err());
    assert!(
        apply(&steps[0], &Event::Unblock, 1001).is_err(),
        "a is not waiting"
    );
    let none = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert!(none.release.is_empty() && none.cancel.is_empty());
    assert_eq!(none.state, WorkflowState::Running);

    run(&mut steps[0], true, 1001);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.release, vec![steps[1].id.clone(), steps[2].id.clone()]);
    for i in [1, 2] {
        steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
    }
    run(&mut steps[1], true, 1003);
    // d waits for c.
    assert!(
        advance(&steps, FailurePolicy::CancelRemaining, false)
            .release
            .is_empty()
    );
    run(&mut steps[2], true, 1004);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.release, vec![steps[3].id.clone()]);
    steps[3] = apply(&steps[3], &Event::Unblock, 1005).unwrap().task;
    run(&mut steps[3], true, 1006);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.state, WorkflowState::Succeeded);
    assert!(a.release.is_empty() && a.cancel.is_empty());
}

#[test]
fn a_failure_cancels_the_rest_or_only_what_depends_on_it() {
    // b fails while c runs.
    let setup = || {
        let mut steps = diamond(1000);
        run(&mut steps[0], true, 1001);
        for i in [1, 2] {
            steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
        }
        run(&mut steps[1], false, 1003);
        steps
    };
    let steps = setup();
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    let cancelled: Vec<&str> = a.cancel.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(cancelled, vec![steps[2].id.as_str(), steps[3].id.as_str()]);
    assert_eq!(a.state, WorkflowState::Failed);
    assert!(
        a.message.contains("\"b\"") && a.message.contains("boom"),
        "{}",
        a.message
    );

    let mut steps = setup();
    let a = advance(&steps, FailurePolicy::ContinueIndependent, false);
    let cancelled: Vec<&str> = a.cancel.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(cancelled, vec![steps[3].id.as_str()], "only d depends on b");
    assert_eq!(a.state, WorkflowState::Running, "c still runs");
    steps[3] = apply(&steps[3], &Event::Cancel { reason: "x".into() }, 1004)
        .unwrap()
        .task;
    run(&mut steps[2], true, 1005);
    let a = advance(&steps, FailurePolicy::ContinueIndependent, false);
    assert_eq!(a.state, WorkflowState::Failed);
    assert!(a.cancel.is_empty());
}

#[test]
fn a_cancelled_workflow_cancels_every_step_not_ended() {
    let mut steps = diamond(1000);
    run(&mut steps[0], true, 1001);
    let a = advance(&steps, FailurePolicy::ContinueIndependent, true);
    assert_eq!(a.cancel.len(), 3);
    assert_eq!(a.state, WorkflowState::Cancelled);
}

#[test]
fn a_retry_reruns_what_did_not_succeed_and_waits_below_it() {
    // a succeeded, b failed, c ran on, d was cancelled (b's child).
    let mut steps = diamond(1000);
    run(&mut steps[0], true, 1001);
    for i in [1, 2] {
        steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
    }
    run(&mut steps[1], false, 1003);
    run(&mut steps[2], true, 1004);
    steps[3] = apply(&steps[3], &Event::Cancel { reason: "x".into() }, 1005)
        .unwrap()
        .task;
    let events = retry(&steps);
    assert_eq!(
        events,
        vec![
            (steps[1].id.clone(), Event::Rerun),
            (steps[3].id.clone(), Event::RerunAfterParents),
        ]
    );
    let b = apply(&steps[1], &events[0].1, 1006).unwrap().task;
    assert_eq!(b.state, TaskState::Ready);
    let d = apply(&steps[3], &events[1].1, 1006).unwrap().task;
    assert!(is_waiting(&d), "d waits for b again");
    assert!(
        apply(&steps[0], &Event::RerunAfterParents, 1006).is_err(),
        "never a success"
    );
    assert!(retry(&diamond(1000)).is_empty(), "nothing to re-run");
}
