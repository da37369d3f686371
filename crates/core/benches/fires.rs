//! What planning one schedule's fire costs, and its parts: parsing the cron
//! expression and the time zone (`ScheduleRecord::timetable`), and finding
//! the next fire time (`Timetable::next_after`), for an every-second cron in
//! UTC and a weekday cron in a zone with DST. The scheduler plans every due
//! schedule of a round before its one commit, so this is on the path from a
//! fire's instant to its task's dispatch (#15 target 5).
//! Run with `cargo bench -p taskmesh-core --bench fires`.

use std::collections::BTreeMap;

use divan::{Bencher, black_box};
use taskmesh_core::schedule::{
    MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord, TaskTemplate, plan_fires,
};
use taskmesh_core::task::RetryPolicy;

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

fn main() {
    divan::main();
}

/// (cron expression, time zone) pairs.
const CRONS: [(&str, &str); 2] = [("* * * * * *", "UTC"), ("30 9 * * 1-5", "Europe/Berlin")];

fn schedule(cron: &str, zone: &str) -> ScheduleRecord {
    ScheduleRecord {
        id: "s1".into(),
        namespace: "default".into(),
        name: String::new(),
        kind: ScheduleKind::Cron,
        cron_expression: cron.into(),
        interval_ms: 0,
        time_zone: zone.into(),
        template: TaskTemplate {
            handler: "echo".into(),
            payload: b"{}".to_vec(),
            content_type: "application/json".into(),
            priority: 3,
            labels: BTreeMap::new(),
            routing_key: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: 60_000,
            callback_url: String::new(),
            balancer: None,
            concurrency: None,
            broadcast: false,
        },
        workflow: None,
        misfire: MisfirePolicy::Skip,
        max_catch_up: 0,
        overlap: OverlapPolicy::Allow,
        paused: false,
        next_fire_at: None,
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: T0,
        updated_at: T0,
        version: 1,
    }
}

/// A due schedule's whole plan: its timetable, its due fire, the next one.
#[divan::bench(args = CRONS)]
fn plan_one_due_fire(bencher: Bencher, (cron, zone): (&str, &str)) {
    let mut s = schedule(cron, zone);
    let tt = s.timetable().expect("valid");
    let first = tt.next_after(T0).expect("fires");
    s.next_fire_at = Some(first);
    bencher.bench_local(|| plan_fires(black_box(&s), black_box(first), 5_000).expect("plans"));
}

/// Parsing the expression and the zone, as each plan does.
#[divan::bench(args = CRONS)]
fn timetable(bencher: Bencher, (cron, zone): (&str, &str)) {
    let s = schedule(cron, zone);
    bencher.bench_local(|| black_box(&s).timetable().expect("valid"));
}

/// The next fire time from a parsed timetable.
#[divan::bench(args = CRONS)]
fn next_after(bencher: Bencher, (cron, zone): (&str, &str)) {
    let tt = schedule(cron, zone).timetable().expect("valid");
    bencher.bench_local(|| black_box(&tt).next_after(black_box(T0)));
}

/// Parsing the expression alone, without the cache.
#[divan::bench(args = CRONS)]
fn parse_cron_uncached(bencher: Bencher, (cron, _zone): (&str, &str)) {
    bencher.bench_local(|| taskmesh_core::timetable::parse_cron(black_box(cron)).expect("valid"));
}
