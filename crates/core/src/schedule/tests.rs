use super::*;

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;
/// 2026-01-01T00:00:00Z.
const T0: UnixMillis = 1_767_225_600_000;

fn schedule(kind: ScheduleKind, misfire: MisfirePolicy) -> ScheduleRecord {
    ScheduleRecord {
        id: "s1".into(),
        namespace: crate::validate::DEFAULT_NAMESPACE.into(),
        name: String::new(),
        kind,
        cron_expression: "*/5 * * * *".into(),
        interval_ms: 5 * MIN,
        time_zone: "UTC".into(),
        template: TaskTemplate {
            handler: "echo".into(),
            payload: b"{}".to_vec(),
            content_type: "application/json".into(),
            priority: 3,
            labels: Default::default(),
            routing_key: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: 60_000,
            callback_url: String::new(),
            balancer: None,
            concurrency: None,
            broadcast: false,
        },
        workflow: None,
        misfire,
        max_catch_up: 4,
        overlap: OverlapPolicy::Allow,
        paused: false,
        next_fire_at: Some(T0 + 5 * MIN),
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: T0,
        updated_at: T0,
        version: 1,
    }
}

fn outcomes(plan: &FirePlan) -> Vec<(i64, FireOutcome)> {
    plan.fires
        .iter()
        .map(|f| ((f.fire_at - T0) / MIN, f.outcome))
        .collect()
}

/// The scheduler was down from T0 until T0 + 1 h (plus a little): twelve
/// fire times (5, 10, ..., 60 min) are due at once.
const AFTER_AN_HOUR: UnixMillis = T0 + HOUR + 2_000;
const THRESHOLD: i64 = 5_000;

#[test]
fn on_time_fires_are_created_and_the_next_is_computed() {
    let s = schedule(ScheduleKind::Cron, MisfirePolicy::Skip);
    let plan = plan_fires(&s, T0 + 5 * MIN + 3, THRESHOLD).unwrap();
    assert_eq!(outcomes(&plan), [(5, FireOutcome::Created)]);
    assert_eq!(plan.next_fire_at, Some(T0 + 10 * MIN));
    // Not yet due: nothing, and never early.
    let plan = plan_fires(&s, T0 + 5 * MIN - 1, THRESHOLD).unwrap();
    assert!(plan.fires.is_empty());
    assert_eq!(plan.next_fire_at, Some(T0 + 5 * MIN));
}

#[test]
fn fire_once_now_after_an_hour_of_downtime() {
    let s = schedule(ScheduleKind::Cron, MisfirePolicy::FireOnceNow);
    let plan = plan_fires(&s, AFTER_AN_HOUR, THRESHOLD).unwrap();
    let got = outcomes(&plan);
    assert_eq!(got.len(), 12);
    assert!(
        got[..11]
            .iter()
            .all(|(_, o)| *o == FireOutcome::SkippedMisfire)
    );
    assert_eq!(got[11], (60, FireOutcome::Created));
    assert_eq!(plan.next_fire_at, Some(T0 + 65 * MIN));
}

#[test]
fn skip_after_an_hour_of_downtime() {
    let s = schedule(ScheduleKind::Cron, MisfirePolicy::Skip);
    let plan = plan_fires(&s, AFTER_AN_HOUR, THRESHOLD).unwrap();
    let got = outcomes(&plan);
    // 60 min is only 2 s late: on time, so it still fires; the rest were missed.
    assert_eq!(got.len(), 12);
    assert!(
        got[..11]
            .iter()
            .all(|(_, o)| *o == FireOutcome::SkippedMisfire)
    );
    assert_eq!(got[11], (60, FireOutcome::Created));
    let later = plan_fires(&s, AFTER_AN_HOUR + THRESHOLD, THRESHOLD).unwrap();
    assert!(
        later
            .fires
            .iter()
            .all(|f| f.outcome == FireOutcome::SkippedMisfire),
        "every time is missed once the last is past the threshold: {:?}",
        outcomes(&later)
    );
}

#[test]
fn catch_up_after_an_hour_of_downtime_is_bounded() {
    let s = schedule(ScheduleKind::Cron, MisfirePolicy::CatchUp);
    let plan = plan_fires(&s, AFTER_AN_HOUR, THRESHOLD).unwrap();
    let got = outcomes(&plan);
    assert_eq!(got.len(), 12);
    let created: Vec<i64> = got
        .iter()
        .filter(|(_, o)| *o == FireOutcome::Created)
        .map(|(m, _)| *m)
        .collect();
    assert_eq!(
        created,
        [45, 50, 55, 60],
        "the latest max_catch_up times, oldest first"
    );
    assert_eq!(
        got.iter()
            .filter(|(_, o)| *o == FireOutcome::SkippedMisfire)
            .count(),
        8
    );
}

#[test]
fn fixed_rate_and_fixed_delay() {
    let rate = schedule(ScheduleKind::FixedRate, MisfirePolicy::FireOnceNow);
    let plan = plan_fires(&rate, T0 + 5 * MIN, THRESHOLD).unwrap();
    assert_eq!(outcomes(&plan), [(5, FireOutcome::Created)]);
    assert_eq!(plan.next_fire_at, Some(T0 + 10 * MIN));

    let delay = schedule(ScheduleKind::FixedDelay, MisfirePolicy::FireOnceNow);
    let plan = plan_fires(&delay, T0 + 5 * MIN, THRESHOLD).unwrap();
    assert_eq!(outcomes(&plan), [(5, FireOutcome::Created)]);
    assert_eq!(plan.next_fire_at, None, "waits for the run to end");
    // The run ends 7 minutes later: the next fire is one interval after that.
    let tt = delay.timetable().unwrap();
    assert_eq!(tt.next_after_run(T0 + 12 * MIN), Some(T0 + 17 * MIN));
    assert_eq!(delay.first_fire_after(T0).unwrap(), Some(T0 + 5 * MIN));
}

#[test]
fn paused_schedules_plan_nothing_and_fire_keys_are_deterministic() {
    let mut s = schedule(ScheduleKind::Cron, MisfirePolicy::CatchUp);
    s.paused = true;
    assert!(
        plan_fires(&s, AFTER_AN_HOUR, THRESHOLD)
            .unwrap()
            .fires
            .is_empty()
    );
    assert_eq!(s.fire_key(T0), format!("schedule:s1:{T0}"));
    let t = s.new_task("t".into(), T0, T0 + 7);
    assert_eq!(
        t.client_request_id.as_deref(),
        Some(s.fire_key(T0).as_str())
    );
    assert_eq!((t.run_at, t.priority), (T0 + 7, 3));
    assert_eq!(t.schedule_id.as_deref(), Some("s1"));
}

#[test]
fn invalid_definitions_are_refused() {
    let mut s = schedule(ScheduleKind::FixedRate, MisfirePolicy::Skip);
    s.interval_ms = 10;
    assert!(s.timetable().is_err());
    let mut s = schedule(ScheduleKind::Cron, MisfirePolicy::Skip);
    s.time_zone = "Nowhere/Land".into();
    assert!(s.timetable().is_err());
    for k in ["CRON", "FIXED_RATE", "FIXED_DELAY"] {
        assert_eq!(ScheduleKind::parse(k).unwrap().as_str(), k);
    }
}

#[test]
fn a_workflow_schedule_fires_a_run_that_is_spread_into_the_workflow() {
    use crate::workflow::{FailurePolicy, SpecStep, WorkflowSpec};
    use crate::{Event, TaskState, apply};
    let step = |name: &str, deps: &[&str]| SpecStep {
        name: name.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        on_failure: false,
        after_parents_end: false,
        template: schedule(ScheduleKind::Cron, MisfirePolicy::Skip).template,
    };
    let spec = WorkflowSpec {
        failure_policy: FailurePolicy::ContinueIndependent,
        steps: vec![step("a", &[]), step("b", &["a"])],
    };
    assert!(spec.check(10).is_ok());
    let s = ScheduleRecord {
        template: TaskTemplate::workflow_run(),
        workflow: Some(spec.clone()),
        ..schedule(ScheduleKind::Cron, MisfirePolicy::Skip)
    };
    let run = s.new_task("run".into(), T0, T0).into_record(T0);
    assert!(run.runs_workflow && run.spreads() && !run.broadcast);
    assert_eq!(run.handler, WORKFLOW_RUN_HANDLER);
    assert_eq!((run.state, run.next_at), (TaskState::Pending, Some(T0)));
    assert!(apply(&run, &Event::Due, T0).is_err(), "never made READY");
    let running = apply(&run, &Event::Spread { shards: 2 }, T0 + 1)
        .unwrap()
        .task;
    assert_eq!(running.state, TaskState::Running);

    let mut n = 0;
    let (w, steps) = spec.start("w", &s.namespace, Some("run"), T0 + 1, || {
        n += 1;
        format!("t{n}")
    });
    assert_eq!(
        (w.step_count, w.failure_policy, w.parent_task_id.as_deref()),
        (2, FailurePolicy::ContinueIndependent, Some("run"))
    );
    let records: Vec<_> = steps.into_iter().map(|t| t.into_record(T0 + 1)).collect();
    assert_eq!(
        records.iter().map(|t| t.state).collect::<Vec<_>>(),
        [TaskState::Ready, TaskState::Pending],
        "a runs at once, b waits for it"
    );
    assert!(
        records
            .iter()
            .all(|t| t.parent_task_id.as_deref() == Some("run")
                && t.workflow.as_ref().is_some_and(|l| l.workflow_id == "w")
                && !t.runs_workflow)
    );

    let mut bad = spec.clone();
    bad.steps[0].template.broadcast = true;
    assert!(bad.check(10).unwrap_err().contains("broadcast"));
    assert!(spec.check(1).unwrap_err().contains("limit"));
}
