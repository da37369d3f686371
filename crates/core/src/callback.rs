//! Callbacks as the domain sees them: the delivery state of a task's outbox
//! entry and the rule that decides, after each try, whether to try again.
//!
//! The outbox entry is written by the store in the same transaction as the
//! task's terminal transition (see [`TaskRecord::wants_callback`]); the
//! delivery loop claims due entries, posts them and records the outcome
//! chosen by [`CallbackPolicy::after_failure`]. Nothing here does I/O.

use crate::UnixMillis;
use crate::retry::backoff_ceiling_ms;
use crate::task::{RetryPolicy, TaskRecord};

/// Where a task's callback delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallbackState {
    /// Queued; `next_attempt_at` says when it is (next) due.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Every allowed attempt failed.
    Failed,
}

impl CallbackState {
    /// Stable text form used in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            CallbackState::Pending => "PENDING",
            CallbackState::Delivered => "DELIVERED",
            CallbackState::Failed => "FAILED",
        }
    }

    /// Parses [`CallbackState::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        [
            CallbackState::Pending,
            CallbackState::Delivered,
            CallbackState::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// The outbox entry of a task, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackDelivery {
    /// Unique id of the delivery, the same on every retry: receivers
    /// de-duplicate on it.
    pub delivery_id: String,
    /// Where it is posted.
    pub url: String,
    /// Where it stands.
    pub state: CallbackState,
    /// Tries made so far.
    pub attempts: u32,
    /// The last failure (HTTP status or transport error); empty when none.
    pub last_error: String,
    /// While pending: when it is due (or when a delivery in progress lapses).
    pub next_attempt_at: Option<UnixMillis>,
    /// When the receiver accepted it.
    pub delivered_at: Option<UnixMillis>,
    /// When it was queued (the task's terminal transition).
    pub created_at: UnixMillis,
}

/// A claimed delivery: the entry and the ended task it reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CallbackJob {
    /// The outbox entry as it was claimed.
    pub delivery: CallbackDelivery,
    /// The task, in its terminal state, with its attempts.
    pub task: TaskRecord,
}

/// What became of one try, as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// The receiver answered 2xx: done.
    Delivered,
    /// Failed; try again at `next_attempt_at`.
    Retry {
        /// Why it failed.
        error: String,
        /// When to try again.
        next_attempt_at: UnixMillis,
    },
    /// Failed and no tries are left.
    Failed {
        /// Why the last try failed.
        error: String,
    },
}

/// How often and how fast a failing delivery is tried again.
#[derive(Debug, Clone, PartialEq)]
pub struct CallbackPolicy {
    /// Tries in total, the first included (at least 1).
    pub max_attempts: u32,
    /// Backoff growth: `initial_backoff_ms * multiplier^(n-1)`, capped at
    /// `max_backoff_ms` (`max_attempts` of this policy is not used).
    pub backoff: RetryPolicy,
}

impl Default for CallbackPolicy {
    /// 15 tries over about an hour: 1 s, 2 s, 4 s … capped at 10 min.
    fn default() -> Self {
        Self {
            max_attempts: 15,
            backoff: RetryPolicy {
                max_attempts: 15,
                initial_backoff_ms: 1_000,
                multiplier: 2.0,
                max_backoff_ms: 600_000,
            },
        }
    }
}

impl CallbackPolicy {
    /// The outcome of a failed try when `attempts_before` tries had failed
    /// before it, at `now`, with a jitter draw in `[0, 1)`.
    ///
    /// The wait is "equal jitter": half the exponential ceiling plus a random
    /// share of the other half. Full jitter (as task retries use) could
    /// retry a receiver that is down at once and burn the tries in a burst.
    pub fn after_failure(
        &self,
        attempts_before: u32,
        error: String,
        now: UnixMillis,
        jitter: f64,
    ) -> CallbackOutcome {
        let tried = attempts_before.saturating_add(1);
        if tried >= self.max_attempts.max(1) {
            return CallbackOutcome::Failed { error };
        }
        let ceiling = backoff_ceiling_ms(&self.backoff, tried);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let half = ceiling / 2;
        let wait = half + ((ceiling - half) as f64 * jitter).round() as i64;
        CallbackOutcome::Retry {
            error,
            next_attempt_at: now.saturating_add(wait.max(1)),
        }
    }
}

impl TaskRecord {
    /// True when this task, as just written, must queue a callback: it has
    /// a `callback_url` and has reached a terminal state. A terminal task
    /// never moves again, so this holds for exactly one write per task.
    pub fn wants_callback(&self) -> bool {
        self.state.is_terminal() && !self.callback_url.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> CallbackPolicy {
        CallbackPolicy {
            max_attempts: 4,
            backoff: RetryPolicy {
                max_attempts: 4,
                initial_backoff_ms: 100,
                multiplier: 2.0,
                max_backoff_ms: 300,
            },
        }
    }

    #[test]
    fn waits_grow_within_equal_jitter_then_give_up() {
        let p = policy();
        let wait = |before, jitter| match p.after_failure(before, "500".into(), 1_000, jitter) {
            CallbackOutcome::Retry {
                next_attempt_at, ..
            } => next_attempt_at - 1_000,
            other => panic!("expected a retry, got {other:?}"),
        };
        assert_eq!((wait(0, 0.0), wait(0, 1.0)), (50, 100));
        assert_eq!((wait(1, 0.0), wait(1, 1.0)), (100, 200));
        assert_eq!((wait(2, 0.0), wait(2, 1.0)), (150, 300), "capped");
        assert_eq!(wait(2, f64::NAN), 300);
        assert_eq!(
            p.after_failure(3, "boom".into(), 1_000, 0.5),
            CallbackOutcome::Failed {
                error: "boom".into()
            }
        );
    }

    #[test]
    fn one_try_policy_fails_at_once_and_states_round_trip() {
        let p = CallbackPolicy {
            max_attempts: 0,
            ..policy()
        };
        assert!(matches!(
            p.after_failure(0, "x".into(), 0, 0.5),
            CallbackOutcome::Failed { .. }
        ));
        for s in [
            CallbackState::Pending,
            CallbackState::Delivered,
            CallbackState::Failed,
        ] {
            assert_eq!(CallbackState::parse(s.as_str()), Some(s));
        }
        assert_eq!(CallbackState::parse("pending"), None);
    }
}
