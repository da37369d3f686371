//! Workflows: a DAG of named steps, each a task. A step with parents is
//! stored PENDING without a `next_at` (waiting: the scheduler never finds
//! it due, and `Due`/`Defer` refuse it) and released to READY by
//! `Event::Unblock` once every parent SUCCEEDED; its handler
//! receives the parents' outputs by step name. What to do when a step
//! fails is the workflow's [`FailurePolicy`]; a workflow may also have one
//! `on_failure` step, which waits with no parents and runs only once a
//! step has failed (with the failed steps' errors as its parents'
//! outputs), and is cancelled, unneeded, when every other step succeeded.
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

/// The most bytes of parents' outputs (with the step's own payload) a
/// step's assignment may carry: a message is at most 4 MiB unless the
/// operator raises it, and the rest of the assignment needs room. A step
/// whose parents' outputs would exceed it is not released but cancelled,
/// saying so: sent, it would break its worker's stream on every attempt.
pub const MAX_ASSIGNMENT_INPUT_BYTES: usize = 3 * 1024 * 1024;

/// The media type of a failed step's error as the `on_failure` step
/// receives it among its parents' outputs.
pub const ERROR_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A parent's output, as its child's handler receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentOutput {
    /// The parent's step name.
    pub step: String,
    /// Its output bytes.
    pub data: Vec<u8>,
    /// Their media type.
    pub content_type: String,
    /// True for a parent that did not succeed, given to a step run after
    /// its parents ended ([`StepLink::after_parents_end`]): `data` is its
    /// end and error as text ("FAILED: message").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
}

/// What makes a task a workflow's step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLink {
    /// The workflow.
    pub workflow_id: String,
    /// The step's name, unique in the workflow.
    pub step: String,
    /// The steps that must succeed first (by name); none for the
    /// `on_failure` step.
    pub depends_on: Vec<String>,
    /// True for the workflow's `on_failure` step: it waits until a step
    /// fails (see [`advance`]).
    pub on_failure: bool,
    /// Released once every parent has ended, whatever its end, and never
    /// cancelled for a failure (see [`advance`]): a join that runs after
    /// failed children too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_parents_end: bool,
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
    /// The task it was submitted under (each step is that task's child).
    pub parent_task_id: Option<String>,
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
    /// True for the workflow's `on_failure` step.
    pub on_failure: bool,
    /// Runs once its parents have ended, whatever their end.
    pub after_parents_end: bool,
}

/// A step of a [`WorkflowSpec`]: its definition and its task's template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecStep {
    /// Its name.
    pub name: String,
    /// Its parents' names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// True for the workflow's `on_failure` step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_failure: bool,
    /// Runs once its parents have ended, whatever their end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_parents_end: bool,
    /// The task it runs.
    pub template: crate::schedule::TaskTemplate,
}

/// A workflow as a caller defines it (SubmitWorkflow, or a schedule that
/// starts one at each fire): its failure policy and its steps, the
/// `on_failure` step (if any) among them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowSpec {
    /// What a failed step does to the rest.
    pub failure_policy: FailurePolicy,
    /// The steps, in definition order.
    pub steps: Vec<SpecStep>,
}

impl WorkflowSpec {
    /// Checks the definition ([`check_steps`]; no step a broadcast); the
    /// error names the problem.
    pub fn check(&self, max_steps: usize) -> Result<(), String> {
        let defs: Vec<StepDef> = self
            .steps
            .iter()
            .map(|s| StepDef {
                name: s.name.clone(),
                depends_on: s.depends_on.clone(),
                on_failure: s.on_failure,
                after_parents_end: s.after_parents_end,
            })
            .collect();
        check_steps(&defs, max_steps)?;
        if let Some(s) = self.steps.iter().find(|s| s.template.broadcast) {
            return Err(format!(
                "step {:?} is a broadcast; a workflow step cannot be one (submit the broadcast as a task)",
                s.name
            ));
        }
        Ok(())
    }

    /// The workflow `workflow_id` of `namespace` started at `now` (a child
    /// of `parent`, if given, as each of its steps is) and its steps'
    /// tasks, ids from `new_id`: a step without parents due at once, the
    /// others waiting.
    pub fn start(
        &self,
        workflow_id: &str,
        namespace: &str,
        parent: Option<&str>,
        now: UnixMillis,
        mut new_id: impl FnMut() -> String,
    ) -> (WorkflowRecord, Vec<crate::NewTask>) {
        let steps: Vec<crate::NewTask> = self
            .steps
            .iter()
            .map(|s| crate::NewTask {
                workflow: Some(StepLink {
                    workflow_id: workflow_id.to_string(),
                    step: s.name.clone(),
                    depends_on: s.depends_on.clone(),
                    on_failure: s.on_failure,
                    after_parents_end: s.after_parents_end,
                    parent_outputs: Vec::new(),
                }),
                parent_task_id: parent.map(str::to_string),
                ..s.template.to_task(new_id(), namespace, now)
            })
            .collect();
        let workflow = WorkflowRecord {
            id: workflow_id.to_string(),
            namespace: namespace.to_string(),
            client_request_id: None,
            failure_policy: self.failure_policy,
            state: WorkflowState::Running,
            message: String::new(),
            step_count: u32::try_from(steps.len()).unwrap_or(u32::MAX),
            created_at: now,
            updated_at: now,
            ended_at: None,
            parent_task_id: parent.map(str::to_string),
            steps: Vec::new(),
        };
        (workflow, steps)
    }
}

/// Checks a workflow's steps: at least one, at most `max_steps`, names
/// unique and well formed, every dependency a step of the workflow named
/// once, and no cycle. The error names the problem (and the steps of a
/// cycle, in order).
pub fn check_steps(steps: &[StepDef], max_steps: usize) -> Result<(), String> {
    if steps.is_empty() {
        return Err("a workflow needs at least one step".into());
    }
    // The on_failure step is one of them: the limit counts it.
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
    let mut handlers = steps.iter().filter(|s| s.on_failure);
    if let Some(f) = handlers.next() {
        if let Some(g) = handlers.next() {
            return Err(format!(
                "steps {:?} and {:?} are both on_failure steps; a workflow has at most one",
                f.name, g.name
            ));
        }
        if !f.depends_on.is_empty() {
            return Err(format!(
                "the on_failure step {:?} has depends_on; it runs when any step fails and depends on none",
                f.name
            ));
        }
        if let Some(s) = steps.iter().find(|s| s.depends_on.contains(&f.name)) {
            return Err(format!(
                "step {:?} depends on {:?}, the on_failure step; no step may",
                s.name, f.name
            ));
        }
        if steps.len() == 1 {
            return Err("a workflow needs at least one step besides its on_failure step".into());
        }
    }
    for s in steps.iter().filter(|s| s.after_parents_end) {
        if s.on_failure {
            return Err(format!(
                "the on_failure step {:?} cannot be after_parents_end",
                s.name
            ));
        }
        if s.depends_on.is_empty() {
            return Err(format!(
                "step {:?} is after_parents_end but has no depends_on: it runs after its parents end",
                s.name
            ));
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
pub fn fingerprint(spec: &WorkflowSpec, parent_task_id: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    // The steps as [`SpecStep`] serialises them, but depends_on always
    // written: the digests of workflows stored before schedules kept specs.
    #[derive(Serialize)]
    struct Step<'a> {
        name: &'a str,
        depends_on: &'a [String],
        // Left out when false: a workflow without one keeps the digest
        // it had before on_failure steps existed.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        on_failure: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        after_parents_end: bool,
        template: &'a crate::schedule::TaskTemplate,
    }
    let steps: Vec<Step<'_>> = spec
        .steps
        .iter()
        .map(|s| Step {
            name: &s.name,
            depends_on: &s.depends_on,
            on_failure: s.on_failure,
            after_parents_end: s.after_parents_end,
            template: &s.template,
        })
        .collect();
    let policy = spec.failure_policy;
    // A workflow without a parent keeps the digest it had before children.
    let body = match parent_task_id {
        None => serde_json::to_vec(&(policy, steps)),
        Some(parent) => serde_json::to_vec(&(policy, steps, parent)),
    }
    .unwrap_or_default();
    Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// True for a step run once its parents have ended, whatever their end
/// ([`StepLink::after_parents_end`]).
pub fn after_end(task: &TaskRecord) -> bool {
    task.workflow.as_ref().is_some_and(|w| w.after_parents_end)
}

/// True for a step still waiting for its parents (PENDING, never due).
pub fn is_waiting(task: &TaskRecord) -> bool {
    task.state == TaskState::Pending && task.next_at.is_none() && task.workflow.is_some()
}

/// True for a workflow's `on_failure` step.
pub fn is_on_failure(task: &TaskRecord) -> bool {
    task.workflow.as_ref().is_some_and(|w| w.on_failure)
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
/// the workflow's tasks; their `workflow` links carry the DAG. A step run
/// after its parents end ([`after_end`]) is released once they all have,
/// and only a caller's cancel cancels it. The caller writes the plan and
/// runs `advance` again until it changes nothing: a cancel written here
/// may end the last parent of such a step.
pub fn advance(steps: &[TaskRecord], policy: FailurePolicy, cancelled: bool) -> Advance {
    fn parents(t: &TaskRecord) -> Vec<&str> {
        t.workflow
            .as_ref()
            .map(|w| w.depends_on.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }
    let handler = steps.iter().find(|t| is_on_failure(t));
    let others = || steps.iter().filter(|t| !is_on_failure(t));
    // A step's end as it will be once this advance is written.
    let mut ends: HashMap<&str, TaskState> = others()
        .filter(|t| t.state.is_terminal())
        .filter_map(|t| Some((t.workflow.as_ref()?.step.as_str(), t.state)))
        .collect();
    let failed_first = others()
        .filter(|t| t.state.is_terminal() && t.state != TaskState::Succeeded)
        .min_by_key(|t| (t.times.end, t.id.clone()));
    let mut out = Advance::default();
    let sizes = output_sizes(steps);
    // True once a step has failed, or is cancelled here for its input size.
    let mut any_failed = failed_first.is_some();
    if let Some(f) = failed_first {
        let name = f.workflow.as_ref().map_or("", |w| w.step.as_str());
        out.message = format!("step {name:?} ended {}: {}", f.state, f.error_message);
    }
    let cancel_all = cancelled || (any_failed && policy == FailurePolicy::CancelRemaining);
    if !cancel_all {
        // Waiting steps in definition order; parents come before children
        // in no particular order, so repeat until nothing changes (a chain
        // of cancelled descendants settles in at most `steps` rounds).
        let mut decided: HashSet<&str> = HashSet::new();
        loop {
            let mut changed = false;
            // A step whose parents allow it: released, or cancelled when
            // its input is too large to send (a failure, decided here).
            macro_rules! release_or_cancel {
                ($t:expr, $name:expr) => {{
                    let (t, name) = ($t, $name);
                    if let Some(why) = too_large(t, &sizes) {
                        if !any_failed {
                            out.message = format!("step {name:?} was cancelled: {why}");
                        }
                        any_failed = true;
                        out.cancel.push((t.id.clone(), why));
                        ends.insert(name, TaskState::Cancelled);
                        changed = true;
                    } else {
                        out.release.push(t.id.clone());
                    }
                    decided.insert(name);
                }};
            }
            for t in others().filter(|t| is_waiting(t)) {
                let name = t.workflow.as_ref().map_or("", |w| w.step.as_str());
                if decided.contains(name) {
                    continue;
                }
                let ps = parents(t);
                if after_end(t) {
                    // Released once every parent has ended, whatever its end.
                    if ps.iter().all(|p| ends.contains_key(p)) {
                        release_or_cancel!(t, name);
                    }
                    continue;
                }
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
                    release_or_cancel!(t, name);
                }
            }
            if !changed {
                break;
            }
        }
    }
    // Under CANCEL_REMAINING a failure (one found here included) cancels
    // every step not ended; a cancel by a caller cancels them all, the
    // on_failure step too, which a failure never cancels: it runs next.
    if cancelled || (any_failed && policy == FailurePolicy::CancelRemaining) {
        let reason = if cancelled {
            "workflow cancelled".to_string()
        } else {
            format!("workflow failed: {}", out.message)
        };
        // A failure cancels neither the on_failure step nor a step run
        // after its parents end: both run next (the latter once its
        // parents have ended, cancelled ones included). A cancel by a
        // caller cancels them too.
        let spared = |t: &TaskRecord| !cancelled && (is_on_failure(t) || after_end(t));
        out.release
            .retain(|id| !cancelled && steps.iter().any(|t| t.id == *id && after_end(t)));
        let already: HashSet<String> = out.cancel.iter().map(|(id, _)| id.clone()).collect();
        for t in steps
            .iter()
            .filter(|t| !t.state.is_terminal() && !spared(t) && !already.contains(&t.id))
        {
            out.cancel.push((t.id.clone(), reason.clone()));
        }
        if !cancelled {
            // Those whose parents have all ended by now; the caller runs
            // `advance` again once this one's cancels are written, which
            // releases those whose parents these cancels end.
            for t in steps.iter().filter(|t| after_end(t) && is_waiting(t)) {
                let done = parents(t).iter().all(|p| ends.contains_key(p));
                if done && !out.release.contains(&t.id) && !already.contains(&t.id) {
                    match too_large(t, &sizes) {
                        None => out.release.push(t.id.clone()),
                        Some(why) => out.cancel.push((t.id.clone(), why)),
                    }
                }
            }
        }
    }
    if let Some(h) = handler.filter(|h| h.state.is_terminal() && h.state != TaskState::Succeeded) {
        let name = h.workflow.as_ref().map_or("", |w| w.step.as_str());
        let own = format!(
            "the on_failure step {name:?} ended {}: {}",
            h.state, h.error_message
        );
        out.message = if out.message.is_empty() {
            own
        } else {
            format!("{}; {own}", out.message)
        };
    }
    let cancelled_ids: HashSet<&str> = out.cancel.iter().map(|(id, _)| id.as_str()).collect();
    let others_ended =
        others().all(|t| t.state.is_terminal() || cancelled_ids.contains(t.id.as_str()));
    let failing = any_failed || others().any(|t| cancelled_ids.contains(t.id.as_str()));
    // The on_failure step: released once a step has failed (under
    // CONTINUE_INDEPENDENT once the independent branches have ended too),
    // cancelled as unneeded when the rest all succeeded.
    let mut handler_ends = true;
    if let Some(h) = handler.filter(|_| !cancelled) {
        if is_waiting(h) {
            if any_failed && (policy == FailurePolicy::CancelRemaining || others_ended) {
                out.release.push(h.id.clone());
                handler_ends = false;
            } else if others_ended && !failing {
                out.cancel.push((
                    h.id.clone(),
                    "every step succeeded: the on_failure step is not needed".into(),
                ));
            } else {
                handler_ends = false;
            }
        } else if !h.state.is_terminal() {
            handler_ends = false;
        }
    }
    let all_ended = others_ended && handler_ends;
    out.state = if cancelled {
        WorkflowState::Cancelled
    } else if !all_ended {
        WorkflowState::Running
    } else if failing {
        WorkflowState::Failed
    } else {
        WorkflowState::Succeeded
    };
    out
}

/// What each step (the on_failure step aside) adds to a child's
/// assignment: its name, output and media type, in bytes. Read once per
/// [`advance`] or [`retry`].
fn output_sizes(steps: &[TaskRecord]) -> HashMap<&str, usize> {
    steps
        .iter()
        .filter_map(|p| {
            let w = p.workflow.as_ref().filter(|w| !w.on_failure)?;
            let size =
                w.step.len() + p.output.as_ref().map_or(0, Vec::len) + p.output_content_type.len();
            Some((w.step.as_str(), size))
        })
        .collect()
}

/// Why step `t`, whose parents all succeeded, cannot be sent: its payload
/// and its parents' outputs total more than [`MAX_ASSIGNMENT_INPUT_BYTES`].
fn too_large(t: &TaskRecord, sizes: &HashMap<&str, usize>) -> Option<String> {
    let parents = &t.workflow.as_ref()?.depends_on;
    let input = t.payload.len()
        + parents
            .iter()
            .map(|p| sizes.get(p.as_str()).copied().unwrap_or(0))
            .sum::<usize>();
    (input > MAX_ASSIGNMENT_INPUT_BYTES).then(|| {
        format!(
            "its payload and its parents' outputs total {input} bytes, over the \
             {MAX_ASSIGNMENT_INPUT_BYTES} a step's assignment may carry: pass a reference \
             to large results instead"
        )
    })
}

/// RetryWorkflow: the events that run again every step that FAILED, TIMED
/// OUT or was CANCELLED — [`Event::Rerun`](crate::Event::Rerun) (to
/// READY) for one whose parents all SUCCEEDED, else
/// [`Event::RerunAfterParents`](crate::Event::RerunAfterParents) (to
/// waiting; also one whose input is over [`MAX_ASSIGNMENT_INPUT_BYTES`],
/// which the caller's [`advance`] then cancels again) — by task id, in
/// step order. A SUCCEEDED step is never among
/// them; no step to re-run gives none. When some step re-runs, the
/// `on_failure` step, if it has ended (whatever its end), waits again for
/// the next failure ([`Event::RerunAfterParents`](crate::Event::RerunAfterParents)).
pub fn retry(steps: &[TaskRecord]) -> Vec<(String, crate::Event)> {
    let succeeded: HashSet<&str> = steps
        .iter()
        .filter(|t| t.state == TaskState::Succeeded)
        .filter_map(|t| Some(t.workflow.as_ref()?.step.as_str()))
        .collect();
    let sizes = output_sizes(steps);
    let mut events: Vec<(String, crate::Event)> = steps
        .iter()
        .filter(|t| {
            !is_on_failure(t)
                && matches!(
                    t.state,
                    TaskState::Failed | TaskState::TimedOut | TaskState::Cancelled
                )
        })
        .map(|t| {
            // One whose input is over the bound waits: the advance that
            // follows the retry cancels it again, saying why.
            let ready = t
                .workflow
                .as_ref()
                .is_none_or(|w| w.depends_on.iter().all(|p| succeeded.contains(p.as_str())))
                && too_large(t, &sizes).is_none();
            let event = if ready {
                crate::Event::Rerun
            } else {
                crate::Event::RerunAfterParents
            };
            (t.id.clone(), event)
        })
        .collect();
    if !events.is_empty()
        && let Some(h) = steps
            .iter()
            .find(|t| is_on_failure(t) && t.state.is_terminal())
    {
        events.push((h.id.clone(), crate::Event::RerunAfterParents));
    }
    events
}

/// Why RetryWorkflow must wait, if it must: the `on_failure` step is
/// running (it handles the failure being retried), or a step run after its
/// parents end is (it was given their ends).
pub fn retry_blocked(steps: &[TaskRecord]) -> Option<String> {
    if let Some(parent) = steps
        .first()
        .filter(|s| s.shard.is_some())
        .and_then(|s| s.parent_task_id.as_ref())
    {
        return Some(format!(
            "this workflow holds the shards of broadcast task {parent}; retry that task (RetryTask) to spread it again"
        ));
    }
    // A step run after its parents end, released and not ended, has been
    // given their ends: re-running a parent under it would hand it a
    // parent that has not ended.
    if let Some(j) = steps
        .iter()
        .find(|t| after_end(t) && !t.state.is_terminal() && !is_waiting(t))
    {
        let name = j.workflow.as_ref().map_or("", |w| w.step.as_str());
        return Some(format!(
            "step {name:?} runs after its parents end and is {}; retry once it has ended",
            j.state
        ));
    }
    let h = steps
        .iter()
        .find(|t| is_on_failure(t) && !t.state.is_terminal() && !is_waiting(t))?;
    let name = h.workflow.as_ref().map_or("", |w| w.step.as_str());
    Some(format!(
        "the on_failure step {name:?} is {}; retry once it has ended",
        h.state
    ))
}

#[cfg(test)]
mod tests;
