//! The behaviour every [`Store`] backend must have, as reusable scenarios.
//!
//! Each `pub async fn` here is one scenario run against a fresh, empty
//! store obtained from a [`StoreFixture`];
//! [`store_conformance_suite!`](crate::store_conformance_suite) expands to
//! one `#[tokio::test]` per scenario. The SQLite backend runs it in
//! `tests/sqlite_conformance.rs`, the Postgres backend in
//! `tests/postgres_conformance.rs` (each test in a schema of its own), the
//! MySQL backend in `tests/mysql_conformance.rs` (a database each); the
//! two cluster backends also run [`cluster_conformance_suite!`].
//!
//! This module is compiled always rather than behind a cargo feature: it
//! adds no dependency (only tokio and core, which the crate uses anyway),
//! costs little to compile, and a backend living in another crate can use it
//! without feature juggling (a crate cannot reliably enable a feature of
//! itself for its own tests). Scenarios panic on failure, as tests do; they
//! are never called by production code.
//!
//! Scenarios never sleep to synchronise: stores publish changes before their
//! write call returns or within a bounded wait, and concurrency is checked by
//! outcome (no task claimed twice), not by timing.

use std::sync::Arc;

use async_trait::async_trait;
use taskmesh_core::{CallbackState, Event, NewTask, TaskRecord, UnixMillis, apply};

use crate::{Store, TaskFilter};

/// Opens the store a scenario runs against.
#[async_trait]
pub trait StoreFixture: Send + Sync {
    /// Opens the fixture's store. The first call gets an empty store; a later
    /// call, after the previous handle was dropped, opens the same data again
    /// (as a restarted process would).
    async fn open(&self) -> Arc<dyn Store>;
}

/// Expands to one `#[tokio::test]` per conformance scenario. The argument is
/// an expression evaluating to a future of a fresh
/// [`StoreFixture`](crate::conformance::StoreFixture), evaluated once per
/// test. The calling crate needs `tokio` (with `macros` and `rt-multi-thread`)
/// as a dev-dependency.
///
/// ```text
/// taskmesh_store::store_conformance_suite!(my_fixture());
/// ```
#[macro_export]
macro_rules! store_conformance_suite {
    ($fixture:expr) => {
        $crate::store_conformance_suite!(@each $fixture;
            create_get_round_trip,
            idempotent_create,
            create_tasks_batch,
            create_tasks_many,
            concurrent_idempotent_creates,
            list_filters_and_paging,
            lists_by_state_follow_each_task_through_its_life,
            children_are_listed_by_parent,
            full_life_records_attempts,
            stale_execution_refused,
            missing_task_not_found,
            terminal_stays_terminal,
            claim_order_limit_and_chooser,
            create_dispatching_claims_new_ready_tasks,
            concurrent_claimers_never_double_claim,
            due_tasks_after_run_at,
            in_flight_by_worker,
            ready_counts_by_handler,
            transition_many_mixed,
            transition_many_isolates_a_refused_write,
            subscribe_sees_changes,
            subscribe_to_sends_what_the_interest_wants,
            survives_reopen,
            schedule_crud_with_cas,
            due_schedules_and_next_due,
            fire_commit_is_atomic_and_idempotent,
            fire_commit_cancels_the_previous_run,
            fire_commits_of_many_schedules_go_together,
            fire_commit_dispatching_claims_the_new_tasks,
            awaiting_run_end_lists_fixed_delay_waiters,
            fenced_writes_from_an_old_leader_are_refused,
            callback_queued_with_terminal_transition,
            callback_claims_lease_and_outcomes,
            callbacks_survive_reopen,
            store_clock_corrects_a_skewed_host,
            namespaces_keep_tasks_apart,
            schedules_list_by_namespace,
            tokens_are_stored_listed_and_revoked,
            cluster_key_is_made_once,
            retention_removes_only_ended_tasks_past_their_horizon,
            fire_history_is_trimmed_to_the_newest,
            task_logs_are_kept_per_attempt_within_the_cap,
            retention_follows_namespace_and_handler_horizons,
            long_task_logs_go_with_their_task,
            list_by_label_time_and_key,
            stats_count_states_queues_and_minutes,
            rerun_opens_an_ended_task_once_more,
            concurrency_keys_cap_claims,
            a_full_key_does_not_block_the_tasks_behind_it,
            waiting_keys_are_claimed_round_robin,
            a_diamond_workflow_releases_each_step_once_with_its_parents_outputs,
            a_failed_step_follows_the_workflow_policy_and_cancel_stops_the_rest,
            an_ended_workflow_ages_out_whole,
            the_on_failure_step_runs_with_the_failed_steps_errors,
            a_broadcast_is_spread_into_shards_and_ends_with_them,
            a_workflow_run_starts_its_schedules_workflow_and_ends_with_it,
            a_join_after_its_parents_end_runs_with_outputs_and_errors,
        );
    };
    (@each $fixture:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let fixture = $fixture.await;
                $crate::conformance::$scenario(&fixture).await;
            }
        )+
    };
}

/// Expands to one `#[tokio::test]` per scenario of a store shared by
/// several processes ([`cluster`]): each opens the fixture twice, as two
/// replicas. For the backends meant for a cluster (Postgres, MySQL).
#[macro_export]
macro_rules! cluster_conformance_suite {
    ($fixture:expr) => {
        $crate::store_conformance_suite!(@each $fixture;
            two_replicas_claiming_at_once_never_double_claim,
            racing_batches_on_the_same_tasks_write_each_once,
            two_replicas_never_claim_one_callback_twice,
            changes_reach_the_other_replica_once,
            store_clock_follows_the_database_clock,
            two_replicas_never_exceed_a_concurrency_limit,
            two_replicas_ending_parents_at_once_release_each_child_once,
        );
    };
}

/// The fixed "now" of the scenarios.
pub const T0: UnixMillis = 1_700_000_000_000;

/// A READY-at-`T0` task of `handler` with plain defaults.
pub fn new_task(handler: &str) -> NewTask {
    NewTask::new(handler, T0)
}

fn dispatch(execution_id: &str, worker_id: &str, ack_deadline: UnixMillis) -> Event {
    Event::Dispatch {
        execution_id: execution_id.into(),
        worker_id: worker_id.into(),
        ack_deadline,
    }
}

fn ack(execution_id: &str) -> Event {
    Event::Ack {
        execution_id: execution_id.into(),
        at: None,
    }
}

fn succeed(execution_id: &str, output: &[u8]) -> Event {
    Event::Succeed {
        execution_id: execution_id.into(),
        output: output.to_vec(),
        content_type: "text/plain".into(),
    }
}

async fn create(store: &dyn Store, task: NewTask, now: UnixMillis) -> TaskRecord {
    let created = store
        .create_task(task, "fp", now)
        .await
        .expect("create_task");
    assert!(
        !created.existing,
        "a fresh task must not be reported existing"
    );
    created.task
}

/// The last state the change feed told of each task, read until it has
/// told of `tasks` different tasks (10 s at most per change).
async fn feed_states(
    feed: &mut tokio::sync::broadcast::Receiver<crate::TaskChange>,
    tasks: usize,
) -> std::collections::BTreeMap<String, taskmesh_core::TaskState> {
    let mut states = std::collections::BTreeMap::new();
    while states.len() < tasks {
        let change = tokio::time::timeout(std::time::Duration::from_secs(10), feed.recv())
            .await
            .expect("a change within 10 s")
            .expect("the feed");
        states.insert(change.task_id, change.state);
    }
    states
}

async fn get(store: &dyn Store, id: &str) -> TaskRecord {
    store
        .get_task(id)
        .await
        .expect("get_task")
        .unwrap_or_else(|| panic!("task {id} must exist"))
}

/// Applies `event` through the store and checks the store wrote exactly what
/// the pure state machine computes from the previous record, plus a fresh
/// callback outbox entry exactly when the task has just ended with a
/// callback URL.
async fn step(store: &dyn Store, prev: &TaskRecord, event: Event, now: UnixMillis) -> TaskRecord {
    let mut expected = apply(prev, &event, now).expect("event must be legal").task;
    let written = store
        .transition(&prev.id, &event, now)
        .await
        .expect("transition");
    expected.attempts = written.attempts.clone();
    if expected.wants_callback() {
        let entry = written
            .callback
            .clone()
            .expect("a task ending with a callback_url must queue its callback");
        assert_eq!(
            (
                entry.url.as_str(),
                entry.state,
                entry.attempts,
                entry.next_attempt_at,
                entry.created_at
            ),
            (
                expected.callback_url.as_str(),
                CallbackState::Pending,
                0,
                Some(now),
                now
            )
        );
        assert!(entry.last_error.is_empty() && entry.delivered_at.is_none());
        expected.callback = Some(entry);
    }
    assert_eq!(
        written, expected,
        "store must write what core::apply computes"
    );
    written
}

fn without_attempts(mut task: TaskRecord) -> TaskRecord {
    task.attempts.clear();
    task
}

fn all_filter(limit: u32) -> TaskFilter {
    TaskFilter {
        limit,
        ..TaskFilter::default()
    }
}

mod batch_create;
mod batch_watch;
mod callbacks;
mod claims;
mod clock;
pub mod cluster;
mod concurrency;
mod create_list;
mod fence;
mod lifecycle;
mod logs;
mod namespaces;
mod operations;
mod retention;
mod schedules;
mod scheduling;
mod workflows;

pub use batch_create::{create_tasks_batch, create_tasks_many};
pub use batch_watch::{
    subscribe_sees_changes, subscribe_to_sends_what_the_interest_wants, survives_reopen,
    transition_many_isolates_a_refused_write, transition_many_mixed,
};
pub use callbacks::{
    callback_claims_lease_and_outcomes, callback_queued_with_terminal_transition,
    callbacks_survive_reopen,
};
pub use claims::{
    claim_order_limit_and_chooser, concurrent_claimers_never_double_claim,
    create_dispatching_claims_new_ready_tasks,
};
pub use clock::store_clock_corrects_a_skewed_host;
pub use cluster::{
    changes_reach_the_other_replica_once, racing_batches_on_the_same_tasks_write_each_once,
    store_clock_follows_the_database_clock, two_replicas_claiming_at_once_never_double_claim,
    two_replicas_never_claim_one_callback_twice,
};
pub use concurrency::{
    a_full_key_does_not_block_the_tasks_behind_it, concurrency_keys_cap_claims,
    two_replicas_never_exceed_a_concurrency_limit, waiting_keys_are_claimed_round_robin,
};
pub use create_list::{
    children_are_listed_by_parent, concurrent_idempotent_creates, idempotent_create,
    list_filters_and_paging, lists_by_state_follow_each_task_through_its_life,
};
pub use fence::fenced_writes_from_an_old_leader_are_refused;
pub use lifecycle::{
    create_get_round_trip, full_life_records_attempts, missing_task_not_found,
    stale_execution_refused, terminal_stays_terminal,
};
pub use logs::{long_task_logs_go_with_their_task, task_logs_are_kept_per_attempt_within_the_cap};
pub use namespaces::{
    cluster_key_is_made_once, namespaces_keep_tasks_apart, schedules_list_by_namespace,
    tokens_are_stored_listed_and_revoked,
};
pub use operations::{
    list_by_label_time_and_key, rerun_opens_an_ended_task_once_more,
    stats_count_states_queues_and_minutes,
};
pub use retention::{
    fire_history_is_trimmed_to_the_newest, retention_follows_namespace_and_handler_horizons,
    retention_removes_only_ended_tasks_past_their_horizon,
};
pub use schedules::{
    awaiting_run_end_lists_fixed_delay_waiters, due_schedules_and_next_due,
    fire_commit_cancels_the_previous_run, fire_commit_dispatching_claims_the_new_tasks,
    fire_commit_is_atomic_and_idempotent, fire_commits_of_many_schedules_go_together,
    schedule_crud_with_cas,
};
pub use scheduling::{due_tasks_after_run_at, in_flight_by_worker, ready_counts_by_handler};
pub use workflows::{
    a_broadcast_is_spread_into_shards_and_ends_with_them,
    a_diamond_workflow_releases_each_step_once_with_its_parents_outputs,
    a_failed_step_follows_the_workflow_policy_and_cancel_stops_the_rest,
    a_join_after_its_parents_end_runs_with_outputs_and_errors,
    a_workflow_run_starts_its_schedules_workflow_and_ends_with_it,
    an_ended_workflow_ages_out_whole, the_on_failure_step_runs_with_the_failed_steps_errors,
    two_replicas_ending_parents_at_once_release_each_child_once,
};
