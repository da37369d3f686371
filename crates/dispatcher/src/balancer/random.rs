//! RANDOM: uniformly among the eligible streams. A few blind draws first
//! (cheap when most streams are eligible), then an exact draw among the
//! eligible ones, so the choice is uniform and never lands on an ineligible
//! stream.

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{Balancer, Pick};

/// Uniform among the eligible.
#[derive(Debug)]
pub struct Random {
    rng: StdRng,
}

impl Random {
    /// A generator seeded with `seed` (reproducible in tests).
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl Balancer for Random {
    fn choose(&mut self, pick: &Pick<'_>) -> Option<usize> {
        let n = pick.candidates.len();
        if n == 0 {
            return None;
        }
        for _ in 0..4 {
            let i = self.rng.random_range(0..n);
            if pick.eligible(i) {
                return Some(i);
            }
        }
        let eligible = (0..n).filter(|&i| pick.eligible(i)).count();
        if eligible == 0 {
            return None;
        }
        let k = self.rng.random_range(0..eligible);
        (0..n).filter(|&i| pick.eligible(i)).nth(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::testing::{idle, pick};

    #[test]
    fn only_eligible_streams_and_all_of_them() {
        let mut c = idle(10);
        for cand in c.iter_mut().take(7) {
            cand.open = false;
        }
        let mut r = Random::new(7);
        let mut seen = [0u32; 10];
        for _ in 0..3_000 {
            seen[r.choose(&pick(&c, 0)).unwrap()] += 1;
        }
        assert!(seen[..7].iter().all(|&s| s == 0), "{seen:?}");
        // Each of the three open streams gets about a third.
        assert!(
            seen[7..].iter().all(|&s| (800..1_200).contains(&s)),
            "{seen:?}"
        );
        for cand in &mut c {
            cand.open = false;
        }
        assert_eq!(r.choose(&pick(&c, 0)), None);
        assert_eq!(r.choose(&pick(&[], 0)), None);
    }
}
