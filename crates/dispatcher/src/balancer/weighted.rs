//! WEIGHTED_ROUND_ROBIN, smooth (nginx): each pick adds every eligible
//! stream's weight to its current weight, chooses the largest current and
//! takes the total off it. Over any run of `sum(weights)` picks each stream
//! is chosen exactly `weight` times, and heavy streams are interleaved with
//! light ones rather than hit in a row ({a:5,b:1,c:1} → a a b a c a a).
//!
//! Current weights are kept by join sequence number: on a membership change
//! the survivors keep theirs and newcomers start at zero.

use super::{Balancer, Pick};

/// Smooth weighted round robin.
#[derive(Debug, Default)]
pub struct SmoothWeighted {
    epoch: Option<u64>,
    /// Sequence numbers the weights below belong to, as of `epoch`.
    seqs: Vec<u64>,
    /// Current weights, parallel to the candidates of `epoch`.
    current: Vec<i64>,
}

impl SmoothWeighted {
    fn sync(&mut self, pick: &Pick<'_>) {
        let c = pick.candidates;
        let aligned = self.epoch == Some(pick.epoch)
            && self.seqs.len() == c.len()
            && self.seqs.iter().zip(c).all(|(s, c)| *s == c.seq);
        if aligned {
            return;
        }
        // Both sides are sorted by seq: a merge keeps survivors' weights.
        let (old_seqs, old) = (
            std::mem::take(&mut self.seqs),
            std::mem::take(&mut self.current),
        );
        let mut j = 0;
        for cand in c {
            while j < old_seqs.len() && old_seqs[j] < cand.seq {
                j += 1;
            }
            let cur = match old_seqs.get(j) {
                Some(&seq) if seq == cand.seq => old[j],
                _ => 0,
            };
            self.seqs.push(cand.seq);
            self.current.push(cur);
        }
        self.epoch = Some(pick.epoch);
    }
}

impl Balancer for SmoothWeighted {
    fn choose(&mut self, pick: &Pick<'_>) -> Option<usize> {
        self.sync(pick);
        let mut total: i64 = 0;
        let (mut best, mut best_cur) = (usize::MAX, i64::MIN);
        let cands = pick.candidates.iter().zip(self.current.iter_mut());
        for (i, (c, cur)) in cands.enumerate() {
            if !c.open
                || pick
                    .mask
                    .is_some_and(|m| !m.get(i).copied().unwrap_or(false))
            {
                continue;
            }
            let w = i64::from(c.weight.max(1));
            *cur += w;
            total += w;
            // Strictly greater: among equals the first in join order wins.
            if *cur > best_cur {
                (best, best_cur) = (i, *cur);
            }
        }
        let slot = self.current.get_mut(best)?;
        *slot -= total;
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::testing::{idle, pick};
    use proptest::prelude::*;

    fn weighted(weights: &[u32]) -> Vec<crate::balancer::Candidate> {
        let mut c = idle(weights.len());
        for (cand, &w) in c.iter_mut().zip(weights) {
            cand.weight = w;
        }
        c
    }

    #[test]
    fn five_one_one_yields_a_a_b_a_c_a_a_in_every_cycle() {
        let c = weighted(&[5, 1, 1]);
        let mut wrr = SmoothWeighted::default();
        for _cycle in 0..10 {
            let names: String = (0..7)
                .map(|_| ['a', 'b', 'c'][wrr.choose(&pick(&c, 0)).unwrap()])
                .collect();
            assert_eq!(names, "aabacaa");
        }
    }

    #[test]
    fn a_newcomer_starts_at_zero_and_survivors_keep_their_weight() {
        let mut c = weighted(&[5, 1, 1]);
        let mut wrr = SmoothWeighted::default();
        for _ in 0..3 {
            wrr.choose(&pick(&c, 0));
        }
        let before: Vec<i64> = wrr.current.clone();
        c.remove(1);
        let mut late = crate::balancer::Candidate::idle(9, "late");
        late.weight = 2;
        c.push(late);
        wrr.sync(&pick(&c, 1));
        assert_eq!(wrr.seqs, vec![0, 2, 9]);
        assert_eq!(wrr.current, vec![before[0], before[2], 0]);
        assert!(wrr.choose(&pick(&c, 1)).is_some());
    }

    proptest! {
        #[test]
        fn shares_are_exactly_proportional_over_whole_cycles(
            weights in proptest::collection::vec(1u32..20, 1..12),
            cycles in 1usize..5,
        ) {
            let c = weighted(&weights);
            let total: usize = weights.iter().map(|&w| w as usize).sum();
            let mut wrr = SmoothWeighted::default();
            let mut counts = vec![0usize; weights.len()];
            for cycle in 1..=cycles {
                for _ in 0..total {
                    counts[wrr.choose(&pick(&c, 0)).unwrap()] += 1;
                }
                for (i, &w) in weights.iter().enumerate() {
                    prop_assert_eq!(counts[i], w as usize * cycle);
                }
            }
        }

        #[test]
        fn never_picks_an_ineligible_stream(
            weights in proptest::collection::vec((1u32..20, any::<bool>()), 0..12),
        ) {
            let mut c = weighted(&weights.iter().map(|w| w.0).collect::<Vec<_>>());
            for (cand, w) in c.iter_mut().zip(&weights) { cand.open = w.1; }
            let mut wrr = SmoothWeighted::default();
            for _ in 0..50 {
                match wrr.choose(&pick(&c, 0)) {
                    Some(i) => prop_assert!(c[i].open),
                    None => prop_assert!(c.iter().all(|x| !x.open)),
                }
            }
        }
    }
}
