//! Database polling: a round every `interval`, whatever is or is not due.

use std::time::Duration;

use async_trait::async_trait;

use super::TriggerEngine;

/// Wakes every `interval`.
#[derive(Debug)]
pub struct PollEngine {
    interval: tokio::time::Interval,
}

impl PollEngine {
    /// An engine that wakes every `interval` (at least 1 ms).
    pub fn new(interval: Duration) -> Self {
        let mut interval = tokio::time::interval(interval.max(Duration::from_millis(1)));
        // A slow round must not cause a burst of catch-up rounds.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { interval }
    }
}

#[async_trait]
impl TriggerEngine for PollEngine {
    fn name(&self) -> &'static str {
        "poll"
    }

    async fn next_wake(&mut self) {
        self.interval.tick().await;
    }
}
