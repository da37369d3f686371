//! EQUAL_COST: the lowest load figure, from the seeds:
//! `load = active × 10 + avg_cost_ms / 1000 + (100 − cpu_idle%) / 10`.
//!
//! `active` is this dispatcher's own in-flight count on the stream plus
//! whatever the worker's last heartbeat reported beyond it. The heartbeat
//! figure alone can be seconds old: a burst would pile onto whichever worker
//! looked idle at its last heartbeat, and a worker that has just finished
//! everything would look busy until its next one. The in-flight count moves
//! with every push and every result, so each push raises the chosen stream's
//! load at once; the excess still counts work we no longer track (a handler
//! running on after the reaper took its attempt back). Ties go round robin,
//! as in least-active.
//! The figure is kept in each candidate (`load_milli`), recomputed when its
//! figures change, so a pick compares integers.

use super::{Balancer, Candidate, Pick, min_rotating};

/// The load figure of a candidate; lower is better.
#[inline]
pub fn load(c: &Candidate) -> f64 {
    let active = f64::from(c.in_flight.saturating_add(c.extra_active));
    // Multiplications, not divisions: this runs once per candidate per pick.
    active * 10.0 + c.avg_cost_ms * 0.001 + (100.0 - c.cpu_idle_percent) * 0.1
}

/// Lowest load; ties round robin.
#[derive(Debug, Default)]
pub struct EqualCost {
    last: Option<u64>,
}

impl Balancer for EqualCost {
    fn choose(&mut self, pick: &Pick<'_>) -> Option<usize> {
        let i = min_rotating(pick, self.last, |c| c.load_milli)?;
        self.last = Some(pick.candidates[i].seq);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::testing::{idle, pick};
    use proptest::prelude::*;

    #[test]
    fn the_seed_formula() {
        let mut c = Candidate::idle(0, "w");
        c.in_flight = 2;
        c.avg_cost_ms = 3_000.0;
        c.cpu_idle_percent = 40.0;
        assert!((load(&c) - (20.0 + 3.0 + 6.0)).abs() < 1e-9);
        // Work the worker reports beyond our count adds to it.
        c.extra_active = 3;
        assert!((load(&c) - (50.0 + 3.0 + 6.0)).abs() < 1e-9);
    }

    #[test]
    fn a_burst_spreads_although_the_heartbeat_figures_are_stale() {
        let mut c = idle(4);
        let mut ec = EqualCost::default();
        for _ in 0..40 {
            let i = ec.choose(&pick(&c, 0)).unwrap();
            c[i].in_flight += 1; // what the registry does on reserve
            c[i] = c[i].update_load();
        }
        assert!(c.iter().all(|x| x.in_flight == 10), "{c:?}");
    }

    proptest! {
        #[test]
        fn picks_an_eligible_stream_of_least_load(
            figs in proptest::collection::vec((0u32..6, 0u32..6, 0.0f64..100.0, 0.0f64..5000.0, any::<bool>()), 1..30),
        ) {
            let mut c = idle(figs.len());
            for (x, f) in c.iter_mut().zip(&figs) {
                (x.in_flight, x.extra_active, x.cpu_idle_percent, x.avg_cost_ms, x.open) = *f;
                *x = x.update_load();
            }
            let chosen = EqualCost::default().choose(&pick(&c, 0));
            match chosen {
                None => prop_assert!(c.iter().all(|x| !x.open)),
                Some(i) => {
                    prop_assert!(c[i].open);
                    for x in c.iter().filter(|x| x.open) {
                        // Within the thousandth the comparison rounds to.
                        prop_assert!(load(&c[i]) <= load(x) + 0.001);
                    }
                }
            }
        }
    }
}
