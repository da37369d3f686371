//! Trigger engines: *when* the scheduler looks for due work. Both engines
//! hand over to the same round, which asks the store what is due at the
//! store's clock (`next_at <= now`), so neither can make anything fire
//! early; they differ only in how late they can be.
//!
//! - [`PollEngine`]: wakes every `poll_interval` (the classic database
//!   polling of XXL-JOB-style schedulers): lateness up to one interval.
//! - [`WheelEngine`]: a hierarchical timing wheel (tokio-util's `DelayQueue`)
//!   holding every task and schedule due within a horizon, loaded from the
//!   store and kept in sync from its change streams: lateness ~1 ms.

mod poll;
mod wheel;

use async_trait::async_trait;

pub use poll::PollEngine;
pub use wheel::WheelEngine;

/// Which engine a scheduler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// Database polling.
    Poll,
    /// In-memory timing wheel fed from the store.
    #[default]
    Wheel,
}

impl EngineKind {
    /// Parses "poll" or "wheel".
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "poll" | "polling" => Some(EngineKind::Poll),
            "wheel" | "timing-wheel" => Some(EngineKind::Wheel),
            _ => None,
        }
    }

    /// The text form.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Poll => "poll",
            EngineKind::Wheel => "wheel",
        }
    }
}

/// Decides when the next scheduling round runs.
#[async_trait]
pub trait TriggerEngine: Send {
    /// The engine's name, for logs and benchmarks.
    fn name(&self) -> &'static str;

    /// Resolves when something may be due: never before the earliest item
    /// it knows of is due (the round re-checks against the store anyway).
    async fn next_wake(&mut self);
}
