//! Domain ↔ wire conversions. The only place that knows both
//! `taskmesh_core` records and the generated protobuf types.

use prost_types::{Duration, Timestamp};
use taskmesh::v1 as pb;
use taskmesh_core::{
    AttemptOutcome, CallbackDelivery, CallbackState, Concurrency, Strategy, TaskRecord, TaskState,
    UnixMillis,
};

/// Milliseconds since the epoch as a protobuf Timestamp.
pub fn timestamp(ms: UnixMillis) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1_000),
        nanos: (ms.rem_euclid(1_000) * 1_000_000) as i32,
    }
}

/// A protobuf Timestamp as milliseconds, refusing out-of-range values.
pub fn millis_of(ts: &Timestamp) -> Option<UnixMillis> {
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return None;
    }
    ts.seconds
        .checked_mul(1_000)?
        .checked_add(i64::from(ts.nanos / 1_000_000))
}

/// Milliseconds as a protobuf Duration.
pub fn duration(ms: i64) -> Duration {
    Duration {
        seconds: ms / 1_000,
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

/// A protobuf Duration as milliseconds; `None` when negative or malformed.
pub fn duration_millis(d: &Duration) -> Option<i64> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return None;
    }
    d.seconds
        .checked_mul(1_000)?
        .checked_add(i64::from(d.nanos / 1_000_000))
}

/// The wire form of a state.
pub fn state_to_pb(state: TaskState) -> pb::TaskState {
    match state {
        TaskState::Pending => pb::TaskState::Pending,
        TaskState::Ready => pb::TaskState::Ready,
        TaskState::Dispatching => pb::TaskState::Dispatching,
        TaskState::Running => pb::TaskState::Running,
        TaskState::Succeeded => pb::TaskState::Succeeded,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Retrying => pb::TaskState::Retrying,
        TaskState::TimedOut => pb::TaskState::TimedOut,
        TaskState::Cancelled => pb::TaskState::Cancelled,
    }
}

/// The domain form of a wire state; `None` for UNSPECIFIED.
pub fn state_from_pb(state: pb::TaskState) -> Option<TaskState> {
    Some(match state {
        pb::TaskState::Unspecified => return None,
        pb::TaskState::Pending => TaskState::Pending,
        pb::TaskState::Ready => TaskState::Ready,
        pb::TaskState::Dispatching => TaskState::Dispatching,
        pb::TaskState::Running => TaskState::Running,
        pb::TaskState::Succeeded => TaskState::Succeeded,
        pb::TaskState::Failed => TaskState::Failed,
        pb::TaskState::Retrying => TaskState::Retrying,
        pb::TaskState::TimedOut => TaskState::TimedOut,
        pb::TaskState::Cancelled => TaskState::Cancelled,
    })
}

/// The domain form of a wire strategy; `None` for UNSPECIFIED.
pub fn strategy_from_pb(s: pb::BalancerStrategy) -> Option<Strategy> {
    Some(match s {
        pb::BalancerStrategy::Unspecified => return None,
        pb::BalancerStrategy::LeastActive => Strategy::LeastActive,
        pb::BalancerStrategy::RoundRobin => Strategy::RoundRobin,
        pb::BalancerStrategy::Random => Strategy::Random,
        pb::BalancerStrategy::WeightedRoundRobin => Strategy::WeightedRoundRobin,
        pb::BalancerStrategy::ConsistentHash => Strategy::ConsistentHash,
        pb::BalancerStrategy::EqualCost => Strategy::EqualCost,
    })
}

/// The wire form of a strategy.
pub fn strategy_to_pb(s: Option<Strategy>) -> pb::BalancerStrategy {
    match s {
        None => pb::BalancerStrategy::Unspecified,
        Some(Strategy::LeastActive) => pb::BalancerStrategy::LeastActive,
        Some(Strategy::RoundRobin) => pb::BalancerStrategy::RoundRobin,
        Some(Strategy::Random) => pb::BalancerStrategy::Random,
        Some(Strategy::WeightedRoundRobin) => pb::BalancerStrategy::WeightedRoundRobin,
        Some(Strategy::ConsistentHash) => pb::BalancerStrategy::ConsistentHash,
        Some(Strategy::EqualCost) => pb::BalancerStrategy::EqualCost,
    }
}

fn outcome_to_pb(outcome: Option<AttemptOutcome>) -> pb::AttemptOutcome {
    match outcome {
        None => pb::AttemptOutcome::Unspecified,
        Some(AttemptOutcome::Succeeded) => pb::AttemptOutcome::Succeeded,
        Some(AttemptOutcome::Failed) => pb::AttemptOutcome::Failed,
        Some(AttemptOutcome::TimedOut) => pb::AttemptOutcome::TimedOut,
        Some(AttemptOutcome::Cancelled) => pb::AttemptOutcome::Cancelled,
        Some(AttemptOutcome::AckTimeout) => pb::AttemptOutcome::AckTimeout,
        Some(AttemptOutcome::Rejected) => pb::AttemptOutcome::Rejected,
        Some(AttemptOutcome::WorkerLost) => pb::AttemptOutcome::WorkerLost,
    }
}

/// The wire form of a task.
pub fn task_to_pb(t: &TaskRecord) -> pb::Task {
    let ts = |v: Option<UnixMillis>| v.map(timestamp);
    let (concurrency_key, concurrency_limit) = concurrency_to_pb(t.concurrency.as_ref());
    pb::Task {
        namespace: t.namespace.clone(),
        task_id: t.id.clone(),
        handler: t.handler.clone(),
        payload: Some(pb::Payload {
            data: t.payload.clone(),
            content_type: t.content_type.clone(),
        }),
        state: state_to_pb(t.state) as i32,
        priority: t.priority,
        labels: t
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        routing_key: t.routing_key.clone(),
        client_request_id: t.client_request_id.clone().unwrap_or_default(),
        callback_url: t.callback_url.clone(),
        max_attempts: t.retry.max_attempts,
        timeout: Some(duration(t.timeout_ms)),
        run_at: Some(timestamp(t.run_at)),
        create_time: Some(timestamp(t.created_at)),
        update_time: Some(timestamp(t.updated_at)),
        state_times: Some(pb::StateTimes {
            pending_time: ts(t.times.pending),
            ready_time: ts(t.times.ready),
            dispatching_time: ts(t.times.dispatching),
            running_time: ts(t.times.running),
            retrying_time: ts(t.times.retrying),
            end_time: ts(t.times.end),
        }),
        attempts: t
            .attempts
            .iter()
            .map(|a| pb::Attempt {
                number: a.number,
                execution_id: a.execution_id.clone(),
                worker_id: a.worker_id.clone(),
                start_time: Some(timestamp(a.started_at)),
                end_time: a.ended_at.map(timestamp),
                outcome: outcome_to_pb(a.outcome) as i32,
                message: a.message.clone(),
            })
            .collect(),
        output: t.output.as_ref().map(|data| pb::Payload {
            data: data.clone(),
            content_type: t.output_content_type.clone(),
        }),
        error_message: t.error_message.clone(),
        version: t.version,
        retry_policy: Some(pb::RetryPolicy {
            max_attempts: t.retry.max_attempts,
            initial_backoff: Some(duration(t.retry.initial_backoff_ms)),
            multiplier: t.retry.multiplier,
            max_backoff: Some(duration(t.retry.max_backoff_ms)),
        }),
        run_count: t.run_count,
        execution_id: t.execution_id.clone().unwrap_or_default(),
        worker_id: t.worker_id.clone().unwrap_or_default(),
        balancer: strategy_to_pb(t.balancer) as i32,
        schedule_id: t.schedule_id.clone().unwrap_or_default(),
        traceparent: t.traceparent.clone(),
        callback: t.callback.as_ref().map(callback_to_pb),
        concurrency_key,
        concurrency_limit,
        workflow_id: t
            .workflow
            .as_ref()
            .map(|w| w.workflow_id.clone())
            .unwrap_or_default(),
        workflow_step: t
            .workflow
            .as_ref()
            .map(|w| w.step.clone())
            .unwrap_or_default(),
        depends_on: t
            .workflow
            .as_ref()
            .map(|w| w.depends_on.clone())
            .unwrap_or_default(),
        parent_task_id: t.parent_task_id.clone().unwrap_or_default(),
        broadcast: t.broadcast,
        runs_workflow: t.runs_workflow,
        shard_index: t.shard.map_or(0, |s| s.index),
        shard_total: t.shard.map_or(0, |s| s.total),
    }
}

/// The wire form of a concurrency key: its key and limit, or `("", 0)` for
/// none.
pub fn concurrency_to_pb(c: Option<&Concurrency>) -> (String, u32) {
    c.map_or((String::new(), 0), |c| (c.key.clone(), c.limit))
}

/// The wire form of a task's callback delivery.
pub fn callback_to_pb(c: &CallbackDelivery) -> pb::CallbackDelivery {
    let state = match c.state {
        CallbackState::Pending => pb::CallbackState::Pending,
        CallbackState::Delivered => pb::CallbackState::Delivered,
        CallbackState::Failed => pb::CallbackState::Failed,
    };
    pb::CallbackDelivery {
        state: state as i32,
        attempts: c.attempts,
        last_error: c.last_error.clone(),
        delivered_time: c.delivered_at.map(timestamp),
        // Only a pending delivery has a next attempt.
        next_attempt_time: (c.state == CallbackState::Pending)
            .then_some(c.next_attempt_at)
            .flatten()
            .map(timestamp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_including_before_the_epoch() {
        for ms in [0, 1, 999, 1_000, 1_700_000_000_123, -1, -1_500] {
            assert_eq!(millis_of(&timestamp(ms)), Some(ms), "{ms}");
        }
        assert_eq!(
            millis_of(&Timestamp {
                seconds: 0,
                nanos: -1
            }),
            None
        );
        assert_eq!(
            millis_of(&Timestamp {
                seconds: i64::MAX,
                nanos: 0
            }),
            None
        );
    }

    #[test]
    fn durations_refuse_negative_values() {
        assert_eq!(duration_millis(&duration(1_500)), Some(1_500));
        assert_eq!(
            duration_millis(&Duration {
                seconds: -1,
                nanos: 0
            }),
            None
        );
    }

    #[test]
    fn callback_delivery_states_map_to_the_wire() {
        let mut c = CallbackDelivery {
            delivery_id: "d".into(),
            url: "http://x/".into(),
            state: CallbackState::Pending,
            attempts: 2,
            last_error: "HTTP 500".into(),
            next_attempt_at: Some(1_500),
            delivered_at: None,
            created_at: 1_000,
        };
        let wire = callback_to_pb(&c);
        assert_eq!(wire.state, pb::CallbackState::Pending as i32);
        assert_eq!(wire.next_attempt_time, Some(timestamp(1_500)));
        assert_eq!((wire.attempts, wire.last_error.as_str()), (2, "HTTP 500"));
        c.state = CallbackState::Delivered;
        c.delivered_at = Some(2_000);
        let wire = callback_to_pb(&c);
        assert_eq!(wire.state, pb::CallbackState::Delivered as i32);
        assert_eq!(wire.delivered_time, Some(timestamp(2_000)));
        assert_eq!(wire.next_attempt_time, None);
        c.state = CallbackState::Failed;
        assert_eq!(callback_to_pb(&c).state, pb::CallbackState::Failed as i32);
    }

    #[test]
    fn every_state_round_trips() {
        for s in TaskState::ALL {
            assert_eq!(state_from_pb(state_to_pb(s)), Some(s));
        }
    }
}
