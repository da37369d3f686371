//! ROUND_ROBIN: each eligible stream in turn, by join order. The cursor is
//! the last chosen stream's sequence number, not an index, so a stream
//! joining or leaving neither skips anyone nor repeats anyone.

use super::{Balancer, Pick};

/// Each eligible stream in turn.
#[derive(Debug, Default)]
pub struct RoundRobin {
    last: Option<u64>,
}

impl Balancer for RoundRobin {
    fn choose(&mut self, pick: &Pick<'_>) -> Option<usize> {
        let n = pick.candidates.len();
        let start = match self.last {
            Some(last) => pick.candidates.partition_point(|c| c.seq <= last),
            None => 0,
        };
        let i = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| pick.eligible(i))?;
        self.last = Some(pick.candidates[i].seq);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::testing::{idle, pick};
    use proptest::prelude::*;

    fn seqs(c: &[crate::balancer::Candidate], rr: &mut RoundRobin, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| c[rr.choose(&pick(c, 0)).unwrap()].seq)
            .collect()
    }

    #[test]
    fn cycles_skips_the_ineligible_and_survives_joins_and_leaves() {
        let mut c = idle(3);
        let mut rr = RoundRobin::default();
        assert_eq!(seqs(&c, &mut rr, 4), vec![0, 1, 2, 0]);
        c[1].open = false;
        assert_eq!(seqs(&c, &mut rr, 2), vec![2, 0]);
        c[1].open = true;
        c.push(crate::balancer::Candidate::idle(7, "late"));
        assert_eq!(seqs(&c, &mut rr, 4), vec![1, 2, 7, 0]);
        c.remove(1);
        assert_eq!(seqs(&c, &mut rr, 3), vec![2, 7, 0]);
        assert_eq!(rr.choose(&pick(&[], 0)), None);
    }

    proptest! {
        #[test]
        fn every_eligible_stream_is_chosen_once_per_cycle(n in 1usize..30, closed in proptest::collection::vec(any::<bool>(), 30)) {
            let mut c = idle(n);
            for (cand, &cl) in c.iter_mut().zip(&closed) { cand.open = !cl; }
            let open = c.iter().filter(|x| x.open).count();
            let mut rr = RoundRobin::default();
            let mut counts = vec![0u32; n];
            for _ in 0..open * 3 {
                counts[rr.choose(&pick(&c, 0)).unwrap()] += 1;
            }
            for (i, cand) in c.iter().enumerate() {
                prop_assert_eq!(counts[i], if cand.open { 3 } else { 0 });
            }
        }
    }
}
