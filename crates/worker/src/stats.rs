//! The sliding-window average of recent task durations.

use std::collections::VecDeque;

/// The mean of the last `capacity` samples.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    samples: VecDeque<f64>,
    capacity: usize,
}

impl SlidingWindow {
    /// Window size the worker uses for `avg_cost_ms`.
    pub const DEFAULT_CAPACITY: usize = 64;

    /// An empty window keeping at most `capacity` samples (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SlidingWindow {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds a sample, evicting the oldest when full.
    pub fn push(&mut self, sample: f64) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when no sample was pushed.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The mean of the held samples; 0 when empty.
    pub fn average(&self) -> f64 {
        if self.samples.is_empty() {
            0.0
        } else {
            self.samples.iter().sum::<f64>() / self.samples.len() as f64
        }
    }
}

impl Default for SlidingWindow {
    fn default() -> Self {
        SlidingWindow::new(Self::DEFAULT_CAPACITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_average_is_zero() {
        let w = SlidingWindow::default();
        assert!(w.is_empty());
        assert_eq!(w.average(), 0.0);
    }

    #[test]
    fn averages_held_samples() {
        let mut w = SlidingWindow::new(4);
        w.push(10.0);
        w.push(20.0);
        assert_eq!(w.average(), 15.0);
    }

    #[test]
    fn evicts_oldest_beyond_capacity() {
        let mut w = SlidingWindow::new(64);
        for i in 0..64 {
            w.push(1000.0 + f64::from(i));
        }
        for _ in 0..64 {
            w.push(2.0);
        }
        assert_eq!(w.len(), 64);
        assert_eq!(w.average(), 2.0);
        w.push(66.0);
        assert_eq!(w.len(), 64);
        assert_eq!(w.average(), (63.0 * 2.0 + 66.0) / 64.0);
    }
}
