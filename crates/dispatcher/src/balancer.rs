//! Choosing a stream for a task. Least-active is the default (and, for now,
//! only) strategy: the eligible stream with the fewest tasks in flight, ties
//! broken round robin so equal workers share evenly.

/// What the balancer needs to know of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Index of the stream in the caller's list.
    pub index: usize,
    /// Tasks in flight on it.
    pub active: u32,
}

/// Picks the candidate with the fewest active tasks; among equals, the first
/// at or after `cursor` (mod the candidate count), so a rotating cursor
/// spreads ties. `None` for no candidates.
pub fn least_active(candidates: &[Candidate], cursor: usize) -> Option<usize> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let start = cursor % n;
    let mut best: Option<Candidate> = None;
    for offset in 0..n {
        let c = candidates[(start + offset) % n];
        if best.is_none_or(|b| c.active < b.active) {
            best = Some(c);
        }
    }
    best.map(|c| c.index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_picks_a_stream_busier_than_another_eligible_one(
            actives in proptest::collection::vec(0u32..8, 1..20),
            cursor in 0usize..100,
        ) {
            let cands: Vec<Candidate> = actives
                .iter()
                .enumerate()
                .map(|(index, &active)| Candidate { index, active })
                .collect();
            let chosen = least_active(&cands, cursor).unwrap();
            let min = *actives.iter().min().unwrap();
            prop_assert_eq!(actives[chosen], min);
        }
    }

    #[test]
    fn ties_rotate_with_the_cursor() {
        let cands = [
            Candidate {
                index: 0,
                active: 1,
            },
            Candidate {
                index: 1,
                active: 1,
            },
            Candidate {
                index: 2,
                active: 1,
            },
        ];
        let picks: Vec<usize> = (0..6).map(|c| least_active(&cands, c).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(least_active(&[], 3), None);
    }
}
