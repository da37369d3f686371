//! Schedules in tests: one firing every second, and how often one fired.

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use tonic::transport::Channel;

use crate::db::{Arg, Db};

/// A cron schedule firing every second (UTC) a task of `handler`; change
/// fields with struct update syntax (`pb::Schedule { time_zone: …,
/// ..every_second("echo") }`).
pub fn every_second(handler: &str) -> pb::Schedule {
    pb::Schedule {
        kind: pb::ScheduleKind::Cron as i32,
        cron_expression: "* * * * * *".into(),
        time_zone: "UTC".into(),
        template: Some(pb::TaskTemplate {
            handler: handler.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// [`every_second`] whose tasks retry up to 25 times
/// ([`crate::cluster::retry_policy`]): the schedule of the chaos and fault
/// tests, whose fire tasks a fault may interrupt.
pub fn every_second_retrying(handler: &str) -> pb::Schedule {
    pb::Schedule {
        template: Some(pb::TaskTemplate {
            handler: handler.into(),
            retry_policy: Some(crate::cluster::retry_policy()),
            ..Default::default()
        }),
        ..every_second(handler)
    }
}

/// Creates `schedule`; returns its id.
pub async fn create_schedule(api: &mut TaskApiClient<Channel>, schedule: pb::Schedule) -> String {
    api.create_schedule(pb::CreateScheduleRequest {
        schedule: Some(schedule),
        ..Default::default()
    })
    .await
    .expect("create the schedule")
    .into_inner()
    .schedule
    .expect("the created schedule")
    .schedule_id
}

/// Pauses a schedule.
pub async fn pause_schedule(api: &mut TaskApiClient<Channel>, schedule_id: &str) {
    api.pause_schedule(pb::PauseScheduleRequest {
        schedule_id: schedule_id.into(),
        ..Default::default()
    })
    .await
    .expect("pause the schedule");
}

/// How many fires of `schedule` the store recorded.
pub async fn fires(db: &Db, schedule: &str) -> i64 {
    db.int(
        "SELECT COUNT(*) FROM schedule_fires WHERE schedule_id = $1",
        &[Arg::Text(schedule)],
    )
    .await
    .expect("count the fires")
    .unwrap_or(0)
}
