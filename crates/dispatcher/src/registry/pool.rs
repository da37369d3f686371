//! A pool: the streams serving one handler, as the balancer sees them, with
//! that handler's strategy state. Each handler has its own pool so one
//! handler's traffic does not move another's cursors or weights.
//!
//! Invariant: `members` and `candidates` are parallel and sorted by `seq`;
//! `epoch` changes whenever a stream joins or leaves.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::balancer::{Candidate, Pick, Strategy, StrategySet};

use super::StreamTx;

/// What the registry needs of a pool member after a pick.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub session_id: Arc<str>,
    pub labels: Arc<BTreeMap<String, String>>,
    pub tx: StreamTx,
}

#[derive(Debug)]
pub(super) struct Pool {
    members: Vec<Member>,
    candidates: Vec<Candidate>,
    epoch: u64,
    strategies: StrategySet,
}

impl Pool {
    pub fn new(vnodes: u32) -> Self {
        Self {
            members: Vec::new(),
            candidates: Vec::new(),
            epoch: 0,
            strategies: StrategySet::new(vnodes, rand::random()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn insert(&mut self, member: Member, candidate: Candidate) {
        let at = self.candidates.partition_point(|c| c.seq < candidate.seq);
        if self
            .candidates
            .get(at)
            .is_some_and(|c| c.seq == candidate.seq)
        {
            self.members[at] = member;
            self.candidates[at] = candidate;
        } else {
            self.members.insert(at, member);
            self.candidates.insert(at, candidate);
        }
        self.epoch += 1;
    }

    pub fn remove(&mut self, seq: u64) {
        if let Some(at) = self.position(seq) {
            self.members.remove(at);
            self.candidates.remove(at);
            self.epoch += 1;
        }
    }

    /// Replaces the figures of the stream `seq`.
    pub fn update(&mut self, candidate: Candidate) {
        if let Some(at) = self.position(candidate.seq) {
            self.candidates[at] = candidate;
        }
    }

    pub fn member(&self, i: usize) -> Option<&Member> {
        self.members.get(i)
    }

    /// Chooses with `strategy` among members carrying every label in
    /// `labels`, other than the sessions in `avoid`.
    pub fn choose(
        &mut self,
        strategy: Strategy,
        labels: &BTreeMap<String, String>,
        avoid: &HashSet<Arc<str>>,
        key: u64,
    ) -> Option<usize> {
        let mask: Option<Vec<bool>> = (!labels.is_empty() || !avoid.is_empty()).then(|| {
            self.members
                .iter()
                .map(|m| {
                    labels.iter().all(|(k, v)| m.labels.get(k) == Some(v))
                        && !avoid.contains(&m.session_id)
                })
                .collect()
        });
        let pick = Pick {
            candidates: &self.candidates,
            mask: mask.as_deref(),
            key,
            epoch: self.epoch,
        };
        let i = self.strategies.get(strategy).choose(&pick)?;
        // A strategy returning an ineligible index would be a bug; refuse it
        // rather than push to a full or unlabelled stream.
        pick.eligible(i).then_some(i)
    }

    fn position(&self, seq: u64) -> Option<usize> {
        self.candidates.binary_search_by_key(&seq, |c| c.seq).ok()
    }
}
