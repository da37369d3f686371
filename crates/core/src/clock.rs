//! Time as the system sees it. Everything time-dependent takes a [`Clock`] so
//! tests can drive a [`FakeClock`] instead of waiting.

use std::sync::{
    Arc,
    atomic::{AtomicI64, Ordering},
};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, UTC. The one time unit of the store.
pub type UnixMillis = i64;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current instant.
    fn now_millis(&self) -> UnixMillis;
}

/// The process clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now: Arc<AtomicI64>,
}

impl FakeClock {
    /// A fake clock showing `start`.
    pub fn new(start: UnixMillis) -> Self {
        Self {
            now: Arc::new(AtomicI64::new(start)),
        }
    }

    /// Moves the clock forward by `millis`.
    pub fn advance(&self, millis: i64) {
        self.now.fetch_add(millis, Ordering::SeqCst);
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: UnixMillis) {
        self.now.store(at, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_millis(&self) -> UnixMillis {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_moves_only_when_told() {
        let clock = FakeClock::new(1_000);
        let shared = clock.clone();
        assert_eq!(clock.now_millis(), 1_000);
        shared.advance(250);
        assert_eq!(clock.now_millis(), 1_250);
        clock.set(10);
        assert_eq!(shared.now_millis(), 10);
    }

    #[test]
    fn system_clock_is_after_2024() {
        assert!(SystemClock.now_millis() > 1_704_067_200_000);
    }
}
