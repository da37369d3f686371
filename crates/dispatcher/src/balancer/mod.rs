//! Choosing a stream for a task: the [`Balancer`] seam and one strategy per
//! file. The registry filters first (serves the handler, has a free slot,
//! carries the task's labels, is neither draining nor busy nor closed) and
//! hands the balancer a [`Pick`]: every stream serving the handler, in join
//! order, with a per-candidate eligibility test. A strategy returns the index
//! of an eligible candidate, or `None`.
//!
//! Architecture invariant: strategy state (cursors, smooth-weighted current
//! weights, hash rings) is kept per handler in the registry's pools, keyed by
//! a stream's join sequence number or worker id — never by a position that
//! shifts when another stream joins or leaves — and re-synchronised when the
//! pool's membership epoch changes. A strategy never picks an ineligible
//! candidate and never panics on any input.

mod equal_cost;
pub mod hash;
mod hash_ring;
mod least_active;
mod random;
mod round_robin;
mod weighted;

use std::collections::BTreeMap;

pub use equal_cost::{EqualCost, load};
pub use hash_ring::HashRing;
pub use least_active::LeastActive;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use taskmesh_core::Strategy;
pub use weighted::SmoothWeighted;

/// Virtual nodes per stream on a consistent-hash ring, unless configured.
pub const DEFAULT_HASH_VNODES: u32 = 160;
/// Most virtual nodes per stream accepted in configuration: a ring of 1,000
/// streams stays under a few million points.
pub const MAX_HASH_VNODES: u32 = 4_096;

/// Which strategy serves which handler (server configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerOptions {
    /// Strategy for handlers not named in `per_handler`.
    pub default: Strategy,
    /// Strategy per handler name.
    pub per_handler: BTreeMap<String, Strategy>,
    /// Virtual nodes per stream for [`Strategy::ConsistentHash`].
    pub hash_vnodes: u32,
}

impl Default for BalancerOptions {
    fn default() -> Self {
        Self {
            default: Strategy::LeastActive,
            per_handler: BTreeMap::new(),
            hash_vnodes: DEFAULT_HASH_VNODES,
        }
    }
}

impl BalancerOptions {
    /// The configured strategy for `handler` (a task may still override it).
    pub fn strategy_for(&self, handler: &str) -> Strategy {
        self.per_handler
            .get(handler)
            .copied()
            .unwrap_or(self.default)
    }

    /// Checks the options: handler names valid, vnodes within bounds.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_HASH_VNODES).contains(&self.hash_vnodes) {
            return Err(format!(
                "hash vnodes must be 1..={MAX_HASH_VNODES}, got {}",
                self.hash_vnodes
            ));
        }
        for handler in self.per_handler.keys() {
            taskmesh_core::validate::handler_name(handler)
                .map_err(|m| format!("balancer for handler {handler:?}: {m}"))?;
        }
        Ok(())
    }
}

/// What a strategy knows of one stream serving the handler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Join order of the stream on this node: unique, never reused, so state
    /// keyed by it survives other streams joining and leaving.
    pub seq: u64,
    /// Stable hash of the worker id: where its virtual nodes sit on a hash
    /// ring, so a worker that reconnects gets its keys back.
    pub ring_id: u64,
    /// Has a free slot and is neither busy, draining nor closed.
    pub open: bool,
    /// Pushes of this dispatcher on the stream not yet ended (always current).
    pub in_flight: u32,
    /// Tasks the worker's latest heartbeat reported beyond this
    /// dispatcher's in-flight count at that moment — work it does that we
    /// no longer count, e.g. a handler still running after the reaper took
    /// its attempt back. Usually 0.
    pub extra_active: u32,
    /// Weight from registration (at least 1).
    pub weight: u32,
    /// CPU idle percentage from the latest heartbeat, 0-100.
    pub cpu_idle_percent: f64,
    /// Average cost of recent tasks from the latest heartbeat, in ms.
    pub avg_cost_ms: f64,
    /// EQUAL_COST's [`load`] in thousandths, as of the last
    /// [`Candidate::update_load`]: computed when the figures change rather
    /// than once per candidate per pick.
    pub load_milli: u64,
}

impl Candidate {
    /// An open, idle candidate with weight 1 (tests and benchmarks).
    pub fn idle(seq: u64, worker_id: &str) -> Self {
        Self {
            seq,
            ring_id: hash::str64(worker_id),
            open: true,
            in_flight: 0,
            extra_active: 0,
            weight: 1,
            cpu_idle_percent: 100.0,
            avg_cost_ms: 0.0,
            load_milli: 0,
        }
        .update_load()
    }

    /// Recomputes `load_milli` from the figures (call after changing them).
    #[must_use]
    pub fn update_load(mut self) -> Self {
        // Thousandths are finer than any figure that matters; the cast
        // saturates, and the registry keeps the figures finite.
        self.load_milli = (load(&self) * 1_000.0) as u64;
        self
    }
}

/// One choice to make.
#[derive(Debug, Clone, Copy)]
pub struct Pick<'a> {
    /// Every stream serving the handler, sorted by `seq`.
    pub candidates: &'a [Candidate],
    /// Per-task filter (labels), parallel to `candidates`; `None` = all pass.
    pub mask: Option<&'a [bool]>,
    /// Hash of the task's routing key (see [`hash::routing_key`]).
    pub key: u64,
    /// Changes whenever membership changes; strategies re-sync their state
    /// when it differs from the one they last saw.
    pub epoch: u64,
}

impl Pick<'_> {
    /// Whether candidate `i` may take the task.
    #[inline]
    pub fn eligible(&self, i: usize) -> bool {
        self.candidates.get(i).is_some_and(|c| c.open)
            && self.mask.is_none_or(|m| m.get(i).copied().unwrap_or(false))
    }
}

/// A strategy: picks the index of an eligible candidate.
pub trait Balancer: Send + std::fmt::Debug {
    /// Index into `pick.candidates` of an eligible candidate, `None` when no
    /// candidate is eligible.
    fn choose(&mut self, pick: &Pick<'_>) -> Option<usize>;
}

/// The state of every strategy for one handler, created on first use.
#[derive(Debug)]
pub struct StrategySet {
    vnodes: u32,
    seed: u64,
    least_active: LeastActive,
    round_robin: RoundRobin,
    random: Option<Random>,
    weighted: SmoothWeighted,
    ring: Option<HashRing>,
    equal_cost: EqualCost,
}

impl StrategySet {
    /// Fresh state; `seed` drives RANDOM, `vnodes` the hash ring.
    pub fn new(vnodes: u32, seed: u64) -> Self {
        Self {
            vnodes,
            seed,
            least_active: LeastActive::default(),
            round_robin: RoundRobin::default(),
            random: None,
            weighted: SmoothWeighted::default(),
            ring: None,
            equal_cost: EqualCost::default(),
        }
    }

    /// The balancer for `strategy`.
    pub fn get(&mut self, strategy: Strategy) -> &mut dyn Balancer {
        match strategy {
            Strategy::LeastActive => &mut self.least_active,
            Strategy::RoundRobin => &mut self.round_robin,
            Strategy::Random => self.random.get_or_insert_with(|| Random::new(self.seed)),
            Strategy::WeightedRoundRobin => &mut self.weighted,
            Strategy::ConsistentHash => self.ring.get_or_insert_with(|| HashRing::new(self.vnodes)),
            Strategy::EqualCost => &mut self.equal_cost,
        }
    }
}

/// The eligible candidate with the smallest `key`; among equals, the first
/// whose `seq` comes after `last` (wrapping to the start), so equal streams
/// take turns even as others join and leave. One pass, no allocation.
#[inline]
pub(crate) fn min_rotating<K: MinKey>(
    pick: &Pick<'_>,
    last: Option<u64>,
    key: impl Fn(&Candidate) -> K,
) -> Option<usize> {
    // Two copies of the loop, so the common unlabelled case has no mask test.
    match pick.mask {
        None => min_rotating_in(pick.candidates, |_| true, last, key),
        Some(m) => min_rotating_in(
            pick.candidates,
            |i| m.get(i).copied().unwrap_or(false),
            last,
            key,
        ),
    }
}

/// A key strategies minimise, with a bound no real key reaches.
pub(crate) trait MinKey: PartialOrd + Copy {
    const UNREACHED: Self;
}

impl MinKey for u64 {
    const UNREACHED: Self = u64::MAX;
}

#[inline(always)]
fn min_rotating_in<K: MinKey>(
    candidates: &[Candidate],
    passes: impl Fn(usize) -> bool,
    last: Option<u64>,
    key: impl Fn(&Candidate) -> K,
) -> Option<usize> {
    let last = last.unwrap_or(u64::MAX);
    let mut best_i = usize::MAX;
    // (key, wrapped): candidates at or before the last pick (wrapped) come
    // after those past it; among full equals the first in order stays.
    let mut best = (K::UNREACHED, true);
    for (i, c) in candidates.iter().enumerate() {
        if !c.open || !passes(i) {
            continue;
        }
        let cand = (key(c), last != u64::MAX && c.seq <= last);
        if cand < best || best_i == usize::MAX {
            best = cand;
            best_i = i;
        }
    }
    (best_i != usize::MAX).then_some(best_i)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Open idle candidates `w0..wn` with seq 0..n.
    pub fn idle(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate::idle(i as u64, &format!("w{i}")))
            .collect()
    }

    /// A pick over `c` with no mask.
    pub fn pick(c: &[Candidate], epoch: u64) -> Pick<'_> {
        Pick {
            candidates: c,
            mask: None,
            key: 0,
            epoch,
        }
    }
}
