use super::*;
use crate::{Event, NewTask, apply};

fn def(name: &str, deps: &[&str]) -> StepDef {
    StepDef {
        name: name.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        on_failure: false,
        after_parents_end: false,
    }
}

fn handler(name: &str) -> StepDef {
    StepDef {
        on_failure: true,
        ..def(name, &[])
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
    steps_of(
        &[
            ("a", vec![]),
            ("b", vec!["a"]),
            ("c", vec!["a"]),
            ("d", vec!["b", "c"]),
        ],
        now,
    )
}

/// The diamond with an on_failure step `f` (last).
fn diamond_with_handler(now: UnixMillis) -> Vec<TaskRecord> {
    steps_of(
        &[
            ("a", vec![]),
            ("b", vec!["a"]),
            ("c", vec!["a"]),
            ("d", vec!["b", "c"]),
            ("f", vec![]),
        ],
        now,
    )
}

/// Steps (name, parents) as stored; one named `f` is the on_failure step,
/// one named `join` runs after its parents end.
fn steps_of(defs: &[(&str, Vec<&str>)], now: UnixMillis) -> Vec<TaskRecord> {
    defs.iter()
        .cloned()
        .map(|(name, deps)| {
            NewTask {
                workflow: Some(StepLink {
                    workflow_id: "w".into(),
                    step: name.into(),
                    on_failure: name == "f",
                    after_parents_end: name == "join",
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

#[test]
fn an_on_failure_step_is_checked() {
    let ok = [def("a", &[]), def("b", &["a"]), handler("f")];
    assert_eq!(check_steps(&ok, 10), Ok(()));
    let err = |steps: &[StepDef]| check_steps(steps, 10).unwrap_err();
    assert!(err(&[handler("f")]).contains("besides its on_failure step"));
    assert!(err(&[def("a", &[]), handler("f"), handler("g")]).contains("at most one"));
    let with_deps = StepDef {
        on_failure: true,
        ..def("f", &["a"])
    };
    assert!(err(&[def("a", &[]), with_deps]).contains("depends on none"));
    assert!(err(&[def("a", &["f"]), handler("f")]).contains("the on_failure step; no step may"));
    assert!(
        check_steps(&ok, 2).unwrap_err().contains("limit is 2"),
        "it counts"
    );
    // Its digest differs from the same steps without it; one without
    // keeps the digest it had before on_failure existed.
    let t = crate::schedule::TaskTemplate {
        handler: "echo".into(),
        payload: Vec::new(),
        content_type: String::new(),
        priority: 0,
        labels: Default::default(),
        routing_key: String::new(),
        retry: crate::RetryPolicy::default(),
        timeout_ms: 60_000,
        callback_url: String::new(),
        balancer: None,
        concurrency: None,
        broadcast: false,
    };
    let plain = [def("a", &[]), def("f", &[])];
    let fp_under = |d: &[StepDef], parent: Option<&str>| {
        let spec = WorkflowSpec {
            failure_policy: FailurePolicy::CancelRemaining,
            steps: d
                .iter()
                .map(|d| SpecStep {
                    name: d.name.clone(),
                    depends_on: d.depends_on.clone(),
                    on_failure: d.on_failure,
                    after_parents_end: false,
                    template: t.clone(),
                })
                .collect(),
        };
        fingerprint(&spec, parent)
    };
    let fp = |d: &[StepDef]| fp_under(d, None);
    assert_ne!(fp(&plain), fp(&[def("a", &[]), handler("f")]));
    // The same steps under a parent (or another parent) are another request.
    let p1 = "0190b0b0-0000-7000-8000-000000000001";
    let p2 = "0190b0b0-0000-7000-8000-000000000002";
    assert_ne!(fp(&plain), fp_under(&plain, Some(p1)));
    assert_ne!(fp_under(&plain, Some(p1)), fp_under(&plain, Some(p2)));
    assert_eq!(fp_under(&plain, Some(p1)), fp_under(&plain, Some(p1)));
}

#[test]
fn the_on_failure_step_runs_only_after_a_failure() {
    // Everything succeeds: f is cancelled as unneeded, the workflow SUCCEEDED.
    let mut steps = diamond_with_handler(1000);
    assert!(is_waiting(&steps[4]), "f waits from the start");
    assert!(
        advance(&steps, FailurePolicy::CancelRemaining, false)
            .release
            .is_empty(),
        "f has no parents yet is not released"
    );
    run(&mut steps[0], true, 1001);
    for i in [1, 2] {
        steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
        run(&mut steps[i], true, 1003);
    }
    steps[3] = apply(&steps[3], &Event::Unblock, 1004).unwrap().task;
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.state, WorkflowState::Running);
    assert!(a.cancel.is_empty());
    run(&mut steps[3], true, 1005);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.cancel.len(), 1);
    assert_eq!(a.cancel[0].0, steps[4].id);
    assert!(a.cancel[0].1.contains("not needed"), "{}", a.cancel[0].1);
    assert_eq!(a.state, WorkflowState::Succeeded);
    assert!(retry(&steps).is_empty(), "nothing to re-run, f stays");
}

#[test]
fn a_failure_releases_the_on_failure_step_and_the_workflow_ends_after_it() {
    // b fails while c runs.
    let setup = || {
        let mut steps = diamond_with_handler(1000);
        run(&mut steps[0], true, 1001);
        for i in [1, 2] {
            steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
        }
        run(&mut steps[1], false, 1003);
        steps
    };
    // CANCEL_REMAINING: c and d are cancelled, f released at once.
    let mut steps = setup();
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    let cancelled: Vec<&str> = a.cancel.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(cancelled, vec![steps[2].id.as_str(), steps[3].id.as_str()]);
    assert_eq!(a.release, vec![steps[4].id.clone()]);
    assert_eq!(a.state, WorkflowState::Running, "f has yet to run");
    for i in [2, 3] {
        steps[i] = apply(&steps[i], &Event::Cancel { reason: "x".into() }, 1004)
            .unwrap()
            .task;
    }
    steps[4] = apply(&steps[4], &Event::Unblock, 1004).unwrap().task;
    assert!(
        retry_blocked(&steps).is_some_and(|m| m.contains("\"f\"")),
        "no retry while f runs"
    );
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert!(
        a.cancel.is_empty(),
        "a failure never cancels f: {:?}",
        a.cancel
    );
    assert_eq!(a.state, WorkflowState::Running);
    run(&mut steps[4], true, 1005);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.state, WorkflowState::Failed);
    assert!(a.message.contains("\"b\""), "{}", a.message);
    assert!(retry_blocked(&steps).is_none());
    // RetryWorkflow re-runs b, c and d (c was cancelled), and f, which
    // succeeded, waits for the next failure.
    let events = retry(&steps);
    assert_eq!(events.len(), 4);
    assert_eq!(
        events.last(),
        Some(&(steps[4].id.clone(), Event::RerunAfterParents))
    );
    let f = apply(&steps[4], &Event::RerunAfterParents, 1006)
        .unwrap()
        .task;
    assert!(is_waiting(&f), "f waits again");

    // CONTINUE_INDEPENDENT: f waits for c to end, then runs; its own
    // failure is told in the workflow's message.
    let mut steps = setup();
    let a = advance(&steps, FailurePolicy::ContinueIndependent, false);
    let cancelled: Vec<&str> = a.cancel.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(cancelled, vec![steps[3].id.as_str()]);
    assert!(a.release.is_empty(), "c still runs");
    steps[3] = apply(&steps[3], &Event::Cancel { reason: "x".into() }, 1004)
        .unwrap()
        .task;
    run(&mut steps[2], true, 1005);
    let a = advance(&steps, FailurePolicy::ContinueIndependent, false);
    assert_eq!(a.release, vec![steps[4].id.clone()]);
    assert_eq!(a.state, WorkflowState::Running);
    steps[4] = apply(&steps[4], &Event::Unblock, 1006).unwrap().task;
    run(&mut steps[4], false, 1007);
    let a = advance(&steps, FailurePolicy::ContinueIndependent, false);
    assert_eq!(a.state, WorkflowState::Failed);
    assert!(
        a.message.contains("\"b\"") && a.message.contains("on_failure step \"f\" ended FAILED"),
        "{}",
        a.message
    );

    // Cancelled by a caller: f is cancelled with the rest, never run.
    let steps = setup();
    let a = advance(&steps, FailurePolicy::CancelRemaining, true);
    assert!(a.cancel.iter().any(|(id, _)| *id == steps[4].id));
    assert!(a.release.is_empty());
    assert_eq!(a.state, WorkflowState::Cancelled);
}

#[test]
fn a_step_whose_parents_outputs_are_too_large_is_cancelled_not_released() {
    let mut steps = diamond(1000);
    run(&mut steps[0], true, 1001);
    for i in [1, 2] {
        steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
        run(&mut steps[i], true, 1003);
    }
    // b's and c's outputs together pass the bound, each alone does not.
    let half = MAX_ASSIGNMENT_INPUT_BYTES / 2 + 1;
    steps[1].output = Some(vec![b'x'; half]);
    steps[2].output = Some(vec![b'y'; half]);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert!(a.release.is_empty(), "d is not sent");
    assert_eq!(a.cancel.len(), 1);
    assert_eq!(a.cancel[0].0, steps[3].id);
    assert!(
        a.cancel[0].1.contains("a step's assignment may carry"),
        "{}",
        a.cancel[0].1
    );
    assert_eq!(a.state, WorkflowState::Failed);
    steps[2].output = Some(b"small".to_vec());
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(
        a.release,
        vec![steps[3].id.clone()],
        "within the bound it goes"
    );
}

#[test]
fn a_step_too_large_to_send_fails_the_workflow_and_releases_its_on_failure_step() {
    let mut steps = diamond_with_handler(1000);
    run(&mut steps[0], true, 1001);
    for i in [1, 2] {
        steps[i] = apply(&steps[i], &Event::Unblock, 1002).unwrap().task;
        run(&mut steps[i], true, 1003);
    }
    steps[1].output = Some(vec![b'x'; MAX_ASSIGNMENT_INPUT_BYTES]);
    let a = advance(&steps, FailurePolicy::CancelRemaining, false);
    assert_eq!(a.cancel.len(), 1, "d: {:?}", a.cancel);
    assert_eq!(a.release, vec![steps[4].id.clone()], "f runs for it");
    assert_eq!(a.state, WorkflowState::Running);
    assert!(a.message.contains("\"d\" was cancelled"), "{}", a.message);
    // RetryWorkflow sends d back to waiting, never to READY: the advance
    // after it cancels d again.
    steps[3] = apply(
        &steps[3],
        &Event::Cancel {
            reason: "big".into(),
        },
        1004,
    )
    .unwrap()
    .task;
    steps[4] = apply(&steps[4], &Event::Unblock, 1004).unwrap().task;
    run(&mut steps[4], true, 1005);
    assert_eq!(
        advance(&steps, FailurePolicy::CancelRemaining, false).state,
        WorkflowState::Failed
    );
    let events = retry(&steps);
    assert!(
        events.contains(&(steps[3].id.clone(), Event::RerunAfterParents)),
        "{events:?}"
    );
}

/// Writes `plan` as the store does (releases, then cancels) and plans
/// again while a step run after its parents end waits, as
/// `advance_one` does; returns the last plan.
fn settle(steps: &mut [TaskRecord], policy: FailurePolicy, now: UnixMillis) -> Advance {
    loop {
        let plan = advance(steps, policy, false);
        let mut written = 0;
        for t in steps.iter_mut() {
            if plan.release.contains(&t.id) {
                *t = apply(t, &Event::Unblock, now).unwrap().task;
                written += 1;
            } else if let Some((_, reason)) = plan.cancel.iter().find(|(id, _)| *id == t.id) {
                let reason = reason.clone();
                *t = apply(t, &Event::Cancel { reason }, now).unwrap().task;
                written += 1;
            }
        }
        let joins_wait = steps.iter().any(|t| after_end(t) && is_waiting(t));
        if written == 0 || !joins_wait {
            return plan;
        }
    }
}

#[test]
fn a_join_after_its_parents_end_runs_after_a_failure_under_either_policy() {
    // a, b, c are children; join runs once all three have ended; d needs
    // the join to succeed.
    let defs = || {
        vec![
            ("a", vec![]),
            ("b", vec![]),
            ("c", vec![]),
            ("join", vec!["a", "b", "c"]),
            ("d", vec!["join"]),
        ]
    };
    for policy in [
        FailurePolicy::CancelRemaining,
        FailurePolicy::ContinueIndependent,
    ] {
        let mut steps = steps_of(&defs(), 1000);
        assert!(is_waiting(&steps[3]) && after_end(&steps[3]));
        run(&mut steps[0], true, 1001);
        run(&mut steps[1], false, 1002);
        // c has not ended: under CANCEL_REMAINING it is cancelled, which
        // ends the join's last parent; under CONTINUE_INDEPENDENT it goes on.
        assert_eq!(steps[2].state, TaskState::Ready);
        let plan = settle(&mut steps, policy, 1003);
        if policy == FailurePolicy::ContinueIndependent {
            assert!(is_waiting(&steps[3]), "c has not ended: {plan:?}");
            assert_eq!(plan.state, WorkflowState::Running);
            run(&mut steps[2], true, 1004);
            settle(&mut steps, policy, 1005);
        } else {
            assert_eq!(steps[2].state, TaskState::Cancelled);
        }
        assert_eq!(
            steps[3].state,
            TaskState::Ready,
            "{policy:?}: the join runs once every parent has ended"
        );
        assert!(
            retry_blocked(&steps).is_some_and(|m| m.contains("\"join\"")),
            "no parent re-runs under a released join"
        );
        if policy == FailurePolicy::ContinueIndependent {
            assert!(is_waiting(&steps[4]), "d waits for the join");
        } else {
            assert_eq!(
                steps[4].state,
                TaskState::Cancelled,
                "d, like c, is cancelled"
            );
        }
        run(&mut steps[3], true, 1006);
        let plan = settle(&mut steps, policy, 1007);
        // d depends on the join, which succeeded: it is released under
        // CONTINUE_INDEPENDENT; CANCEL_REMAINING cancelled it at b's
        // failure already.
        let d_ok = policy == FailurePolicy::ContinueIndependent;
        assert_eq!(
            steps[4].state,
            if d_ok {
                TaskState::Ready
            } else {
                TaskState::Cancelled
            },
            "{policy:?}"
        );
        if d_ok {
            run(&mut steps[4], true, 1008);
        }
        let plan = if d_ok {
            settle(&mut steps, policy, 1009)
        } else {
            plan
        };
        assert_eq!(plan.state, WorkflowState::Failed, "{policy:?}: b failed");
        assert!(plan.message.contains("\"b\""), "{}", plan.message);
    }
    // A caller's cancel cancels the join too.
    let steps = steps_of(&defs(), 1000);
    let plan = advance(&steps, FailurePolicy::CancelRemaining, true);
    assert!(plan.cancel.iter().any(|(id, _)| *id == steps[3].id));
    assert!(plan.release.is_empty());
}

#[test]
fn a_step_after_its_parents_end_is_checked() {
    let join = |deps: &[&str]| StepDef {
        after_parents_end: true,
        ..def("j", deps)
    };
    assert!(check_steps(&[def("a", &[]), join(&["a"])], 10).is_ok());
    assert!(
        check_steps(&[def("a", &[]), join(&[])], 10)
            .unwrap_err()
            .contains("no depends_on")
    );
    let both = StepDef {
        on_failure: true,
        ..join(&[])
    };
    assert!(
        check_steps(&[def("a", &[]), both], 10)
            .unwrap_err()
            .contains("cannot be after_parents_end")
    );
}
