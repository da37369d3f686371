//! Retention horizons: how long ended tasks are kept, per terminal state,
//! set for the server (its flags), for a namespace, or for one handler
//! within it. What a level leaves unset it inherits from the level above:
//! handler, then namespace, then server; unset everywhere keeps the tasks.

use crate::TaskState;

/// The terminal states, in the order horizons are listed.
pub const TERMINAL: [TaskState; 4] = [
    TaskState::Succeeded,
    TaskState::Failed,
    TaskState::TimedOut,
    TaskState::Cancelled,
];

/// The shortest horizon that may be set (as the flags' minimum).
pub const MIN_HORIZON_MS: i64 = 60_000;

/// A horizon in milliseconds per terminal state, in [`TERMINAL`] order;
/// `None` is unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Horizons(pub [Option<i64>; 4]);

impl Horizons {
    /// The horizon of `state` (`None` for a state that is not terminal).
    pub fn of(&self, state: TaskState) -> Option<i64> {
        TERMINAL
            .iter()
            .position(|s| *s == state)
            .and_then(|i| self.0[i])
    }

    /// Sets the horizon of terminal `state`.
    pub fn set(&mut self, state: TaskState, horizon_ms: Option<i64>) {
        if let Some(i) = TERMINAL.iter().position(|s| *s == state) {
            self.0[i] = horizon_ms;
        }
    }

    /// These horizons, each unset one taken from `parent`.
    pub fn over(&self, parent: &Horizons) -> Horizons {
        Horizons(std::array::from_fn(|i| self.0[i].or(parent.0[i])))
    }

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// One stored horizon: of `state` tasks of `namespace`, and of `handler`
/// within it (`""`: the namespace's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRule {
    /// The namespace.
    pub namespace: String,
    /// The handler; empty for the namespace's own horizon.
    pub handler: String,
    /// The terminal state.
    pub state: TaskState,
    /// How long after they ended its tasks are kept.
    pub horizon_ms: i64,
}

/// The horizons `rules` set for `namespace` and `handler` (`""`: the
/// namespace's own).
pub fn set_for(rules: &[RetentionRule], namespace: &str, handler: &str) -> Horizons {
    let mut h = Horizons::default();
    for r in rules
        .iter()
        .filter(|r| r.namespace == namespace && r.handler == handler)
    {
        h.set(r.state, Some(r.horizon_ms));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ns: &str, handler: &str, state: TaskState, ms: i64) -> RetentionRule {
        RetentionRule {
            namespace: ns.into(),
            handler: handler.into(),
            state,
            horizon_ms: ms,
        }
    }

    #[test]
    fn a_handler_inherits_from_its_namespace_and_the_server() {
        let server = Horizons([Some(1_000), Some(7_000), None, Some(1_000)]);
        let rules = [
            rule("a", "", TaskState::Succeeded, 2_000),
            rule("a", "", TaskState::TimedOut, 9_000),
            rule("a", "img", TaskState::Succeeded, 3_000),
            rule("b", "img", TaskState::Failed, 5),
        ];
        let ns = set_for(&rules, "a", "").over(&server);
        assert_eq!(
            ns,
            Horizons([Some(2_000), Some(7_000), Some(9_000), Some(1_000)])
        );
        let img = set_for(&rules, "a", "img").over(&ns);
        assert_eq!(img.of(TaskState::Succeeded), Some(3_000));
        assert_eq!(
            img.of(TaskState::Failed),
            Some(7_000),
            "another namespace's rule is not ours"
        );
        assert_eq!(img.of(TaskState::Running), None);
        assert!(set_for(&rules, "c", "").is_empty());
    }
}
