//! Helpers of the Postgres store tests: a private schema per test, stores
//! on it as replicas, waiting on conditions with deadlines.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use taskmesh_core::{NewTask, RetryPolicy};
use taskmesh_store::postgres::scratch::ScratchSchema;
use taskmesh_store::{PostgresStore, TaskChange};
use tokio::sync::broadcast::{self, error::RecvError};

pub const T0: i64 = 1_700_000_000_000;

pub fn task(handler: &str) -> NewTask {
    NewTask {
        id: taskmesh_core::id::new_task_id(),
        handler: handler.into(),
        payload: b"{}".to_vec(),
        content_type: "application/json".into(),
        priority: 0,
        labels: Default::default(),
        routing_key: String::new(),
        client_request_id: None,
        callback_url: String::new(),
        retry: RetryPolicy::default(),
        timeout_ms: 60_000,
        run_at: T0,
        traceparent: String::new(),
        balancer: None,
        schedule_id: None,
    }
}

pub async fn schema() -> ScratchSchema {
    ScratchSchema::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

pub async fn replica(schema: &ScratchSchema) -> Arc<PostgresStore> {
    Arc::new(
        PostgresStore::connect(schema.options())
            .await
            .unwrap_or_else(|err| panic!("connect: {err}")),
    )
}

/// Polls `check` until it returns `Some`, failing the test after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        // Polling interval of a condition with a deadline, not a synchronisation sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next change naming `id`, skipping others (and resync markers).
pub async fn change_of(rx: &mut broadcast::Receiver<TaskChange>, id: &str) -> TaskChange {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await {
                Ok(c) if c.task_id == id => return c,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("change channel closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no change of task {id} within 10 s"))
}

pub async fn sqlx_conn(schema: &ScratchSchema) -> sqlx::PgConnection {
    use sqlx::Connection;
    sqlx::PgConnection::connect(schema.url())
        .await
        .expect("admin connection")
}

pub fn schedule(id: &str) -> taskmesh_core::schedule::ScheduleRecord {
    use taskmesh_core::schedule::{
        MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord, TaskTemplate,
    };
    ScheduleRecord {
        id: id.into(),
        name: id.into(),
        kind: ScheduleKind::FixedRate,
        cron_expression: String::new(),
        interval_ms: 1_000,
        time_zone: String::new(),
        template: TaskTemplate {
            handler: "echo".into(),
            payload: Vec::new(),
            content_type: "application/json".into(),
            priority: 0,
            labels: Default::default(),
            routing_key: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: 1_000,
            callback_url: String::new(),
            balancer: None,
        },
        misfire: MisfirePolicy::CatchUp,
        max_catch_up: 1,
        overlap: OverlapPolicy::Skip,
        paused: false,
        next_fire_at: Some(T0),
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: T0,
        updated_at: T0,
        version: 1,
    }
}
