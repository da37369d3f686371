//! Exponential backoff with full jitter ("Exponential Backoff And Jitter",
//! AWS Architecture Blog): the wait before retry `n` is drawn uniformly from
//! `[0, min(cap, initial * multiplier^(n-1))]`, which spreads a burst of
//! failures out instead of retrying it in lock-step (the retry storm of the
//! seeds).

use crate::task::RetryPolicy;

/// The exponential ceiling before jitter for retry number `n` (1-based).
pub fn backoff_ceiling_ms(policy: &RetryPolicy, n: u32) -> i64 {
    let exp = policy
        .multiplier
        .max(1.0)
        .powi(n.saturating_sub(1).min(64) as i32);
    let raw = policy.initial_backoff_ms.max(0) as f64 * exp;
    let cap = policy.max_backoff_ms.max(0) as f64;
    raw.min(cap).max(0.0) as i64
}

/// The wait before retry `n` given a jitter draw in `[0, 1)`.
pub fn backoff_ms(policy: &RetryPolicy, n: u32, jitter: f64) -> i64 {
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        1.0
    };
    (backoff_ceiling_ms(policy, n) as f64 * jitter).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            initial_backoff_ms: 100,
            multiplier: 2.0,
            max_backoff_ms: 1_000,
        }
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let got: Vec<i64> = (1..=6).map(|n| backoff_ceiling_ms(&policy(), n)).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1_000, 1_000]);
    }

    #[test]
    fn jitter_scales_within_the_ceiling() {
        assert_eq!(backoff_ms(&policy(), 3, 0.0), 0);
        assert_eq!(backoff_ms(&policy(), 3, 0.5), 200);
        assert_eq!(backoff_ms(&policy(), 3, 1.0), 400);
        assert_eq!(backoff_ms(&policy(), 3, f64::NAN), 400);
    }

    #[test]
    fn huge_retry_numbers_do_not_overflow() {
        assert_eq!(backoff_ceiling_ms(&policy(), u32::MAX), 1_000);
    }
}
