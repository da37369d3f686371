//! Workflows: a DAG of named steps, each a task. A step with parents is
//! stored PENDING without a `next_at` (waiting: the scheduler never finds
//! it due, and `Due`/`Defer` refuse it) and released to READY by
//! `Event::Unblock` once every parent SUCCEEDED; its handler
//! receives the parents' outputs by step name. What to do when a step
//! fails is the workflow's [`FailurePolicy`].
//!
//! [`check_steps`] validates a definition before anything is written;
//! [`advance`] computes, from the steps as they stand, which to release,
//! which to cancel and whether the workflow has ended. Both are pure: the
//! store runs `advance` in the transaction that ended a step, so a crash
//! can neither leave a workflow stuck nor release a step twice.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::{TaskRecord, TaskState, UnixMillis};

/// The most steps a workflow may have when the operator sets no limit.
pub const DEFAULT_MAX_STEPS: usize = 1_000;
/// The most steps any configuration allows.
pub const MAX_STEPS: usize = 10_000;

/// What a failed step does to the rest of its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum FailurePolicy {
    /// Every step that has not ended is cancelled (a running one's result
    /// is then refused; its worker is told to stop when the node holding
    /// its stream sees the change).
    #[default]
    CancelRemaining,
    /// Only the steps that depend on the failed one (they can never run)
    /// are cancelled; independent branches go on.
    ContinueIndependent,
}

impl FailurePolicy {
    /// Stable text form used in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CancelRemaining => "CANCEL_REMAINING",
            Self::ContinueIndependent => "CONTINUE_INDEPENDENT",
        }
    }

    /// Parses [`FailurePolicy::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        [Self::CancelRemaining, Self::ContinueIndependent]
            .into_iter()
            .find(|p| p.as_str() == text)
    }
}

/// Where a workflow stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum WorkflowState {
    /// Some step has not ended.
    #[default]
    Running,
    /// Every step SUCCEEDED.
    Succeeded,
    /// Every step ended and one at least did not succeed.
    Failed,
    /// A caller cancelled it.
    Cancelled,
}

impl WorkflowState {
    /// Stable text form used in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Parses [`WorkflowState::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// True once it has ended.
    pub fn is_terminal(self) -> bool {
        self != Self::Running
    }
}

/// A parent's output, as its child's handler receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentOutput {
    /// The parent's step name.
    pub step: String,
    /// Its output bytes.
    pub data: Vec<u8>,
    /// Their media type.
    pub content_type: String,
}

/// What makes a task a workflow's step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLink {
    /// The workflow.
    pub workflow_id: String,
    /// The step's name, unique in the workflow.
    pub step: String,
    /// The steps that must succeed first (by name).
    pub depends_on: Vec<String>,
    /// The parents' outputs: read when the step is claimed (empty
    /// elsewhere).
    pub parent_outputs: Vec<ParentOutput>,
}

/// A workflow as stored, with its steps (tasks) in definition order.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    /// Workflow id (a UUID, like a task's).
    pub id: String,
    /// The namespace it and its steps belong to.
    pub namespace: String,
    /// Idempotency key, if the caller gave one.
    pub client_request_id: Option<String>,
    /// What a failed step does to the rest.
    pub failure_policy: FailurePolicy,
    /// Where it stands.
    pub state: WorkflowState,
    /// Why it was cancelled or which step failed, empty otherwise.
    pub message: String,
    /// How many steps it has.
    pub step_count: u32,
    /// Created.
    pub created_at: UnixMillis,
    /// Last changed.
    pub updated_at: UnixMillis,
    /// Ended, if it has.
    pub ended_at: Option<UnixMillis>,
    /// The steps' tasks (attempts left empty); empty in listings.
    pub steps: Vec<TaskRecord>,
}

/// A step of a workflow as a caller defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDef {
    /// Its name.
    pub name: String,
    /// Its parents' names.
    pub depends_on: Vec<String>,
}

/// Checks a workflow's steps: at least one, at most `max_steps`, names
/// unique and well formed, every dependency a step of the workflow named
/// once, and no cycle. The error names the problem (and the steps of a
/// cycle, in order).
pub fn check_steps(steps: &[StepDef], max_steps: usize) -> Result<(), String> {
    if steps.is_empty() {
        return Err("a workflow needs at least one step".into());
    }
    if steps.len() > max_steps {
        return Err(format!(
            "the workflow has {} steps; the limit is {max_steps}",
            steps.len()
        ));
    }
    let mut index = HashMap::with_capacity(steps.len());
    for (i, s) in steps.iter().enumerate() {
        crate::validate::handler_name(&s.name)
            .map_err(|e| format!("step {:?}: {}", s.name, e.replace("handler", "step name")))?;
        if index.insert(s.name.as_str(), i).is_some() {
            return Err(format!("step name {:?} is used twice", s.name));
        }
    }
    for s in steps {
        let mut seen = HashSet::new();
        for d in &s.depends_on {
            if !index.contains_key(d.as_str()) {
                return Err(format!(
                    "step {:?} depends on {d:?}, which is not a step of this workflow",
                    s.name
                ));
            }
            if d == &s.name {
                return Err(format!("step {:?} depends on itself", s.name));
            }
            if !seen.insert(d.as_str()) {
                return Err(format!("step {:?} names {d:?} twice in depends_on", s.name));
            }
        }
    }
    // Depth-first search with colours; the grey path is the cycle.
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    let mut colour = vec![Colour::White; steps.len()];
    for root in 0..steps.len() {
        if colour[root] != Colour::White {
            continue;
        }
        // (node, next dependency to visit)
        let mut stack = vec![(root, 0usize)];
        colour[root] = Colour::Grey;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let deps = &steps[node].depends_on;
            if *next == deps.len() {
                colour[node] = Colour::Black;
                stack.pop();
                continue;
            }
            let child = index[deps[*next].as_str()];
            *next += 1;
            match colour[child] {
                Colour::White => {
                    colour[child] = Colour::Grey;
                    stack.push((child, 0));
                }
                Colour::Grey => {
                    let from = stack.iter().position(|(n, _)| *n == child).unwrap_or(0);
                    let mut names: Vec<&str> = stack[from..]
                        .iter()
                        .map(|(n, _)| steps[*n].name.as_str())
                        .collect();
                    names.push(&steps[child].name);
                    names.reverse();
                    return Err(format!(
                        "the steps form a cycle: {}",
                        names
                            .iter()
                            .map(|n| format!("{n:?}"))
                            .collect::<Vec<_>>()
                            .join(" -> ")
                    ));
                }
                Colour::Black => {}
            }
        }
    }
    Ok(())
}

/// A digest of a workflow request (policy, and each step's name,
/// dependencies and template), so a repeated `client_request_id` can be
/// told apart from a different request.
pub fn fingerprint(
    policy: FailurePolicy,
    steps: &[(StepDef, &crate::schedule::TaskTemplate)],
) -> String {
    use sha2::{Digest, Sha256};
    #[derive(Serialize)]
    struct Step<'a> {
        name: &'a str,
        depends_on: &'a [String],
        template: &'a crate::schedule::TaskTemplate,
    }
    let body = serde_json::to_vec(&(
        policy,
        steps
            .iter()
            .map(|(d, t)| Step {
                name: &d.name,
                depends_on: &d.depends_on,
                template: t,
            })
            .collect::<Vec<_>>(),
    ))
    .unwrap_or_default();
    Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// True for a step still waiting for its parents (PENDING, never due).
pub fn is_waiting(task: &TaskRecord) -> bool {
    task.state == TaskState::Pending && task.next_at.is_none() && task.workflow.is_some()
}

/// What [`advance`] decided.
#[derive(Debug, Default, PartialEq)]
pub struct Advance {
    /// Waiting steps whose parents all succeeded: to READY by
    /// [`Event::Unblock`](crate::Event::Unblock) (task ids).
    pub release: Vec<String>,
    /// Steps to cancel (task ids), with the reason.
    pub cancel: Vec<(String, String)>,
    /// The workflow's state once those are written, and its message.
    pub state: WorkflowState,
    /// Why it failed (the first failed step's name and error), if it did.
    pub message: String,
}

/// Decides what follows from the steps as they stand: which waiting steps
/// to release, which to cancel under `policy` (all that have not ended
/// when `cancelled` is set), and the workflow's resulting state. Steps are
/// the workflow's tasks; their `workflow` links carry the DAG.
pub fn advance(steps: &[TaskRecord], policy: FailurePolicy, cancelled: bool) -> Advance {
    fn parents(t: &TaskRecord) -> Vec<&str> {
        t.workflow
            .as_ref()
            .map(|w| w.depends_on.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }
    // A step's end as it will be once this advance is written.
    let mut ends: HashMap<&str, TaskState> = steps
        .iter()
        .filter(|t| t.state.is_terminal())
        .filter_map(|t| Some((t.workflow.as_ref()?.step.as_str(), t.state)))
        .collect();
    let failed_first = steps
        .iter()
        .filter(|t| t.state.is_terminal() && t.state != TaskState::Succeeded)
        .min_by_key(|t| (t.times.end, t.id.clone()));
    let mut out = Advance::default();
    let any_failed = failed_first.is_some();
    if let Some(f) = failed_first {
        let name = f.workflow.as_ref().map_or("", |w| w.step.as_str());
        out.message = format!("step {name:?} ended {}: {}", f.state, f.error_message);
    }
    let cancel_all = cancelled || (any_failed && policy == FailurePolicy::CancelRemaining);
    if cancel_all {
        let reason = if cancelled {
            "workflow cancelled".to_string()
        } else {
            format!("workflow failed: {}", out.message)
        };
        for t in steps.iter().filter(|t| !t.state.is_terminal()) {
            out.cancel.push((t.id.clone(), reason.clone()));
        }
    } else {
        // Waiting steps in definition order; parents come before children
        // in no particular order, so repeat until nothing changes (a chain
        // of cancelled descendants settles in at most `steps` rounds).
        let mut decided: HashSet<&str> = HashSet::new();
        loop {
            let mut changed = false;
            for t in steps.iter().filter(|t| is_waiting(t)) {
                let name = t.workflow.as_ref().map_or("", |w| w.step.as_str());
                if decided.contains(name) {
                    continue;
                }
                let ps = parents(t);
                let blocked = ps
                    .iter()
                    .find(|p| ends.get(*p).is_some_and(|s| *s != TaskState::Succeeded));
                if let Some(p) = blocked {
                    out.cancel.push((
                        t.id.clone(),
                        format!("step {p:?} did not succeed, so this step cannot run"),
                    ));
                    ends.insert(name, TaskState::Cancelled);
                    decided.insert(name);
                    changed = true;
                } else if ps
                    .iter()
                    .all(|p| ends.get(*p) == Some(&TaskState::Succeeded))
                {
                    out.release.push(t.id.clone());
                    decided.insert(name);
                }
            }
            if !changed {
                break;
            }
        }
    }
    let cancelled_ids: HashSet<&str> = out.cancel.iter().map(|(id, _)| id.as_str()).collect();
    let all_ended = steps
        .iter()
        .all(|t| t.state.is_terminal() || cancelled_ids.contains(t.id.as_str()));
    out.state = if cancelled {
        WorkflowState::Cancelled
    } else if !all_ended {
        WorkflowState::Running
    } else if any_failed || !cancelled_ids.is_empty() {
        WorkflowState::Failed
    } else {
        WorkflowState::Succeeded
    };
    out
}

/// RetryWorkflow: the events that run again every step that FAILED, TIMED
/// OUT or was CANCELLED — [`Event::Rerun`](crate::Event::Rerun) (to
/// READY) for one whose parents all SUCCEEDED, else
/// [`Event::RerunAfterParents`](crate::Event::RerunAfterParents) (to
/// waiting) — by task id, in step order. A SUCCEEDED step is never among
/// them; no step to re-run gives none.
pub fn retry(steps: &[TaskRecord]) -> Vec<(String, crate::Event)> {
    let succeeded: HashSet<&str> = steps
        .iter()
        .filter(|t| t.state == TaskState::Succeeded)
        .filter_map(|t| Some(t.workflow.as_ref()?.step.as_str()))
        .collect();
    steps
        .iter()
        .filter(|t| {
            matches!(
                t.state,
                TaskState::Failed | TaskState::TimedOut | TaskState::Cancelled
            )
        })
        .map(|t| {
            let ready = t
                .workflow
                .as_ref()
                .is_none_or(|w| w.depends_on.iter().all(|p| succeeded.contains(p.as_str())));
            let event = if ready {
                crate::Event::Rerun
            } else {
                crate::Event::RerunAfterParents
            };
            (t.id.clone(), event)
        })
        .collect()
}

#[cfg(test)]
mod tests;
