//! LEAST_ACTIVE (the default): the eligible stream with the fewest of this
//! dispatcher's pushes in flight — a count that is exact and current, unlike
//! a heartbeat figure — ties broken round robin by join order so equal
//! workers share evenly.

use super::{Balancer, Pick, min_rotating};

/// Fewest in flight; ties round robin.
#[derive(Debug, Default)]
pub struct LeastActive {
    last: Option<u64>,
}

impl Balancer for LeastActive {
    fn choose(&mut self, pick: &Pick<'_>) -> Option<usize> {
        let i = min_rotating(pick, self.last, |c| u64::from(c.in_flight))?;
        self.last = Some(pick.candidates[i].seq);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::testing::{idle, pick};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_picks_a_stream_busier_than_another_eligible_one(
            figures in proptest::collection::vec((0u32..8, any::<bool>(), any::<bool>()), 1..40),
            rounds in 1usize..20,
        ) {
            let mut c = idle(figures.len());
            let mask: Vec<bool> = figures.iter().map(|f| f.2).collect();
            for (cand, &(active, open, _)) in c.iter_mut().zip(&figures) {
                cand.in_flight = active;
                cand.open = open;
            }
            let mut la = LeastActive::default();
            for _ in 0..rounds {
                let p = Pick { mask: Some(&mask), ..pick(&c, 0) };
                let eligible: Vec<usize> = (0..c.len()).filter(|&i| p.eligible(i)).collect();
                match la.choose(&p) {
                    None => prop_assert!(eligible.is_empty()),
                    Some(i) => {
                        prop_assert!(p.eligible(i));
                        let min = eligible.iter().map(|&j| c[j].in_flight).min().unwrap();
                        prop_assert_eq!(c[i].in_flight, min);
                        // The pushed task makes it busier, as in the registry.
                        c[i].in_flight += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn equal_streams_take_turns_even_when_one_leaves() {
        let mut c = idle(3);
        let mut la = LeastActive::default();
        let picks: Vec<u64> = (0..6)
            .map(|_| c[la.choose(&pick(&c, 0)).unwrap()].seq)
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        // Stream 1 leaves after 0 was picked: the turn goes to 2, not 0 again.
        la.choose(&pick(&c, 0));
        c.remove(1);
        assert_eq!(c[la.choose(&pick(&c, 1)).unwrap()].seq, 2);
        assert_eq!(la.choose(&pick(&[], 2)), None);
    }
}
