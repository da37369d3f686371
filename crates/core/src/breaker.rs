//! A circuit breaker per handler, so a handler that keeps failing does not
//! drive a retry storm: when its failure rate over a window of recent
//! outcomes passes a threshold, its retries wait (they do not fail) until a
//! cool-down has passed and one trial retry succeeds.
//!
//! Closed → (failure rate ≥ threshold over ≥ min_samples) → Open until
//! cool-down end → HalfOpen: one trial retry goes through → its success
//! closes the breaker, a failure opens it again.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::UnixMillis;

/// How breakers judge a handler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerOptions {
    /// Outcomes remembered per handler.
    pub window: usize,
    /// Outcomes needed before the breaker may open.
    pub min_samples: usize,
    /// Failure rate (0-1] at which it opens.
    pub failure_threshold: f64,
    /// How long it stays open before a trial.
    pub cool_down_ms: i64,
    /// How long other retries wait while a trial is out.
    pub trial_wait_ms: i64,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        Self {
            window: 20,
            min_samples: 10,
            failure_threshold: 0.5,
            cool_down_ms: 30_000,
            trial_wait_ms: 1_000,
        }
    }
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Retries flow.
    Closed,
    /// Retries wait until `until`.
    Open {
        /// End of the cool-down.
        until: UnixMillis,
    },
    /// One trial retry may go; `trial_out` once it went.
    HalfOpen {
        /// The trial has been let through.
        trial_out: bool,
    },
}

/// One handler's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    outcomes: VecDeque<bool>,
    state: BreakerState,
    opened_at: Option<UnixMillis>,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            outcomes: VecDeque::new(),
            state: BreakerState::Closed,
            opened_at: None,
        }
    }
}

impl Breaker {
    /// Records the outcome of an attempt of the handler.
    pub fn record(&mut self, opts: &BreakerOptions, success: bool, now: UnixMillis) {
        self.outcomes.push_back(success);
        while self.outcomes.len() > opts.window.max(1) {
            self.outcomes.pop_front();
        }
        match self.state {
            BreakerState::HalfOpen { .. } if success => {
                self.state = BreakerState::Closed;
                self.outcomes.clear();
            }
            BreakerState::HalfOpen { .. } => self.open(opts, now),
            BreakerState::Closed => {
                let (failures, total) = self.counts();
                if total >= opts.min_samples.max(1)
                    && failures as f64 / total as f64 >= opts.failure_threshold
                {
                    self.open(opts, now);
                }
            }
            BreakerState::Open { .. } => {}
        }
    }

    fn open(&mut self, opts: &BreakerOptions, now: UnixMillis) {
        self.state = BreakerState::Open {
            until: now + opts.cool_down_ms,
        };
        self.opened_at = Some(now);
    }

    /// May a retry of the handler run now? `Err(t)`: wait until `t`.
    pub fn allow_retry(
        &mut self,
        opts: &BreakerOptions,
        now: UnixMillis,
    ) -> Result<(), UnixMillis> {
        match self.state {
            BreakerState::Closed => Ok(()),
            BreakerState::Open { until } if now < until => Err(until),
            BreakerState::Open { .. } | BreakerState::HalfOpen { trial_out: false } => {
                self.state = BreakerState::HalfOpen { trial_out: true };
                Ok(())
            }
            BreakerState::HalfOpen { trial_out: true } => Err(now + opts.trial_wait_ms),
        }
    }

    /// The state.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// (failures, outcomes) in the window.
    pub fn counts(&self) -> (usize, usize) {
        let failures = self.outcomes.iter().filter(|ok| !**ok).count();
        (failures, self.outcomes.len())
    }

    /// When it last opened.
    pub fn opened_at(&self) -> Option<UnixMillis> {
        self.opened_at
    }
}

/// A breaker's key: the namespace and the handler (one namespace's
/// failures never open another's breaker).
pub type BreakerKey = (String, String);

/// Every handler's breaker, per namespace (cheap to clone, shared by the
/// dispatcher, which records outcomes, and the scheduler, which gates
/// retries).
#[derive(Debug, Clone, Default)]
pub struct Breakers {
    opts: BreakerOptions,
    inner: Arc<Mutex<BTreeMap<BreakerKey, Breaker>>>,
}

impl Breakers {
    /// Breakers with these options.
    pub fn new(opts: BreakerOptions) -> Self {
        Self {
            opts,
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<BreakerKey, Breaker>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an outcome of `handler` in `namespace`.
    pub fn record(&self, namespace: &str, handler: &str, success: bool, now: UnixMillis) {
        let mut map = self.lock();
        let opts = self.opts;
        map.entry((namespace.to_string(), handler.to_string()))
            .or_default()
            .record(&opts, success, now);
    }

    /// May a retry of `handler` in `namespace` run now? `Err(t)`: wait
    /// until `t`.
    pub fn allow_retry(
        &self,
        namespace: &str,
        handler: &str,
        now: UnixMillis,
    ) -> Result<(), UnixMillis> {
        let opts = self.opts;
        let key = (namespace.to_string(), handler.to_string());
        match self.lock().get_mut(&key) {
            Some(b) => b.allow_retry(&opts, now),
            None => Ok(()),
        }
    }

    /// A snapshot of every breaker.
    pub fn snapshot(&self) -> Vec<(BreakerKey, Breaker)> {
        self.lock()
            .iter()
            .map(|(h, b)| (h.clone(), b.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> BreakerOptions {
        BreakerOptions {
            window: 10,
            min_samples: 4,
            failure_threshold: 0.5,
            cool_down_ms: 1_000,
            trial_wait_ms: 100,
        }
    }

    #[test]
    fn opens_on_a_failure_rate_and_closes_after_a_successful_trial() {
        let o = opts();
        let mut b = Breaker::default();
        for ok in [true, false, false] {
            b.record(&o, ok, 0);
        }
        assert_eq!(b.state(), BreakerState::Closed, "too few samples to judge");
        b.record(&o, false, 10);
        assert_eq!(b.state(), BreakerState::Open { until: 1_010 });
        assert_eq!(
            b.allow_retry(&o, 500),
            Err(1_010),
            "retries wait during the cool-down"
        );

        // Cool-down over: exactly one trial goes, the others wait.
        assert_eq!(b.allow_retry(&o, 1_010), Ok(()));
        assert_eq!(b.allow_retry(&o, 1_011), Err(1_111));
        b.record(&o, false, 1_020);
        assert_eq!(
            b.state(),
            BreakerState::Open { until: 2_020 },
            "a failed trial opens it again"
        );

        assert_eq!(b.allow_retry(&o, 2_020), Ok(()));
        b.record(&o, true, 2_030);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.counts(), (0, 0));
        assert_eq!(b.allow_retry(&o, 2_031), Ok(()));
    }

    #[test]
    fn a_healthy_handler_stays_closed() {
        let o = opts();
        let mut b = Breaker::default();
        for i in 0..100 {
            b.record(&o, i % 4 != 0, i);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.counts().1, 10, "the window is bounded");
    }

    #[test]
    fn breakers_are_per_handler() {
        let all = Breakers::new(opts());
        for _ in 0..4 {
            all.record("a", "bad", false, 0);
            all.record("a", "good", true, 0);
        }
        assert!(all.allow_retry("a", "bad", 1).is_err());
        assert_eq!(
            all.allow_retry("b", "bad", 1),
            Ok(()),
            "another namespace's breaker is its own"
        );
        assert_eq!(all.allow_retry("a", "good", 1), Ok(()));
        assert_eq!(all.allow_retry("a", "unknown", 1), Ok(()));
        assert_eq!(all.snapshot().len(), 2);
    }
}
