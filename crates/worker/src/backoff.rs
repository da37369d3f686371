//! Reconnect delays: exponential backoff with full jitter.

use std::time::Duration;

use rand::Rng;

/// Delays grow as `initial * 2^n` up to `max`; each delay is drawn uniformly
/// from `[initial, cap]`, so it never undercuts `initial` nor exceeds `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// Back to the first delay (after a successful registration).
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The upper bound of the next delay, without advancing.
    pub(crate) fn cap(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The next delay, drawn with full jitter.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let cap = self.cap();
        self.attempt = self.attempt.saturating_add(1).min(31);
        let low = self.initial.as_nanos() as u64;
        let high = cap.as_nanos() as u64;
        if high <= low {
            return cap;
        }
        Duration::from_nanos(rand::rng().random_range(low..=high))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_within_bounds_and_resets() {
        let initial = Duration::from_millis(200);
        let max = Duration::from_secs(10);
        let mut b = Backoff::new(initial, max);
        let mut caps = Vec::new();
        for _ in 0..40 {
            let cap = b.cap();
            let d = b.next_delay();
            assert!(d >= initial && d <= cap && cap <= max, "{d:?} {cap:?}");
            caps.push(cap);
        }
        assert_eq!(caps[0], initial);
        assert_eq!(caps[1], Duration::from_millis(400));
        assert_eq!(*caps.last().unwrap(), max);
        b.reset();
        assert_eq!(b.cap(), initial);
    }
}
