//! The workflow calls of `TaskApi`: SubmitWorkflow, GetWorkflow,
//! ListWorkflows and CancelWorkflow. A definition is checked whole (the
//! contract's rules, then names, dependencies, cycles, the step limit and
//! each template as a schedule's is) before anything is written; the store
//! creates the workflow and its steps in one transaction and advances it in
//! the transaction that ends a step (`taskmesh_store::sql::workflows`).

use taskmesh::v1 as pb;
use taskmesh_core::workflow::{
    FailurePolicy, SpecStep, WorkflowRecord, WorkflowSpec, WorkflowState, fingerprint, is_waiting,
};
use taskmesh_core::{TaskRecord, id, validate};
use taskmesh_scheduler::meters;
use tracing::info;

use crate::convert::timestamp;
use crate::engine::Shared;
use crate::schedule_api::template_at;
use crate::{Error, children, task_api::task_id_of};

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

fn workflow_id_of(text: &str) -> Result<String, Error> {
    task_id_of(text).map_err(|_| {
        invalid(format!(
            "workflow_id {text:?} is not a valid workflow id (a UUID)"
        ))
    })
}

fn policy_from_pb(value: i32) -> Result<FailurePolicy, Error> {
    match pb::FailurePolicy::try_from(value) {
        Ok(pb::FailurePolicy::Unspecified | pb::FailurePolicy::CancelRemaining) => {
            Ok(FailurePolicy::CancelRemaining)
        }
        Ok(pb::FailurePolicy::ContinueIndependent) => Ok(FailurePolicy::ContinueIndependent),
        Err(_) => Err(invalid(format!(
            "failure_policy {value} is not a known FailurePolicy"
        ))),
    }
}

fn policy_to_pb(p: FailurePolicy) -> pb::FailurePolicy {
    match p {
        FailurePolicy::CancelRemaining => pb::FailurePolicy::CancelRemaining,
        FailurePolicy::ContinueIndependent => pb::FailurePolicy::ContinueIndependent,
    }
}

fn state_to_pb(s: WorkflowState) -> pb::WorkflowState {
    match s {
        WorkflowState::Running => pb::WorkflowState::Running,
        WorkflowState::Succeeded => pb::WorkflowState::Succeeded,
        WorkflowState::Failed => pb::WorkflowState::Failed,
        WorkflowState::Cancelled => pb::WorkflowState::Cancelled,
    }
}

/// A workflow's steps' outputs are included in a message until they total
/// this much, so it stays within the 4 MiB message limit (names, errors
/// and the rest of up to the step limit's steps fit in what is left).
pub(crate) const OUTPUTS_BUDGET: usize = 3 * 1024 * 1024;

fn step_to_pb(t: &TaskRecord) -> pb::WorkflowStep {
    let link = t.workflow.as_ref();
    pb::WorkflowStep {
        name: link.map(|w| w.step.clone()).unwrap_or_default(),
        depends_on: link.map(|w| w.depends_on.clone()).unwrap_or_default(),
        task_id: t.id.clone(),
        state: crate::convert::state_to_pb(t.state) as i32,
        waiting: is_waiting(t),
        attempt: t.attempt,
        output: t.output.as_ref().map(|data| pb::Payload {
            data: data.clone(),
            content_type: t.output_content_type.clone(),
        }),
        error_message: t.error_message.clone(),
        ended_at: t.times.end.map(timestamp),
        on_failure: link.is_some_and(|w| w.on_failure),
        after_parents_end: link.is_some_and(|w| w.after_parents_end),
        output_omitted: false,
    }
}

/// A step's error past [`OUTPUTS_BUDGET`] is cut to this many bytes.
const CUT_ERROR_BYTES: usize = 256;

/// The wire form of a workflow (with its steps, if they were read): the
/// steps' outputs and errors in step order while they total at most
/// [`OUTPUTS_BUDGET`]; from the first step that does not fit on, outputs
/// are left out (and marked) and errors cut to [`CUT_ERROR_BYTES`].
pub(crate) fn to_pb(w: &WorkflowRecord) -> pb::Workflow {
    let mut room = OUTPUTS_BUDGET;
    let mut full = false;
    let mut omitted = 0u32;
    let steps = w
        .steps
        .iter()
        .map(|t| {
            let mut step = step_to_pb(t);
            let size = step
                .output
                .as_ref()
                .map_or(0, |o| o.data.len() + o.content_type.len())
                + step.error_message.len();
            if !full {
                match room.checked_sub(size) {
                    Some(left) => room = left,
                    None => full = true,
                }
            }
            if full {
                if step.output.take().is_some() {
                    step.output_omitted = true;
                    omitted += 1;
                }
                if step.error_message.len() > CUT_ERROR_BYTES {
                    let mut end = CUT_ERROR_BYTES;
                    while !step.error_message.is_char_boundary(end) {
                        end -= 1;
                    }
                    step.error_message.truncate(end);
                    step.error_message.push('…');
                }
            }
            step
        })
        .collect();
    pb::Workflow {
        workflow_id: w.id.clone(),
        namespace: w.namespace.clone(),
        state: state_to_pb(w.state) as i32,
        failure_policy: policy_to_pb(w.failure_policy) as i32,
        message: w.message.clone(),
        step_count: w.step_count,
        steps,
        outputs_omitted: omitted,
        client_request_id: w.client_request_id.clone().unwrap_or_default(),
        created_at: Some(timestamp(w.created_at)),
        ended_at: w.ended_at.map(timestamp),
        parent_task_id: w.parent_task_id.clone().unwrap_or_default(),
    }
}

/// The workflow `steps`, `policy` and `on_failure` define, checked whole
/// (names, dependencies, cycles, the step limit, each template as a
/// schedule's): INVALID_ARGUMENT naming the problem, fields named under
/// `at` (empty, or a schedule's `workflow.`).
pub(crate) fn spec_from_pb(
    shared: &Shared,
    policy: i32,
    steps: Vec<pb::WorkflowStepSpec>,
    on_failure: Option<pb::WorkflowStepSpec>,
    at: &str,
) -> Result<WorkflowSpec, Error> {
    // A definition's own errors name where it is (a schedule's workflow).
    let whose = |e: String| match at.strip_suffix('.') {
        Some(field) => invalid(format!("{field}: {e}")),
        None => invalid(e),
    };
    let max = shared.opts.max_workflow_steps;
    let n = steps.len() + usize::from(on_failure.is_some());
    if n > max {
        return Err(whose(format!(
            "the workflow has {n} steps; the limit is {max}"
        )));
    }
    let failure_policy = policy_from_pb(policy)?;
    // The on_failure step is checked and stored as a step of its own kind.
    let specs = steps
        .into_iter()
        .enumerate()
        .map(|(i, s)| (s, false, format!("{at}steps[{i}].template")))
        .chain(on_failure.map(|s| (s, true, format!("{at}on_failure.template"))));
    let mut out = Vec::with_capacity(n);
    for (s, on_failure, field) in specs {
        let template = template_at(shared, s.template, &field)?;
        if template.broadcast {
            return Err(invalid(format!(
                "{field}.broadcast: a workflow step cannot be a broadcast (submit the broadcast as a task)"
            )));
        }
        out.push(SpecStep {
            name: s.name,
            depends_on: s.depends_on,
            on_failure,
            after_parents_end: s.after_parents_end,
            template,
        });
    }
    let spec = WorkflowSpec {
        failure_policy,
        steps: out,
    };
    spec.check(max).map_err(whose)?;
    Ok(spec)
}

/// The wire form of a workflow definition (a schedule's `workflow`).
pub(crate) fn spec_to_pb(spec: &WorkflowSpec) -> pb::WorkflowTemplate {
    let step = |s: &SpecStep| pb::WorkflowStepSpec {
        name: s.name.clone(),
        depends_on: s.depends_on.clone(),
        template: Some(crate::schedule_api::template_to_pb(&s.template)),
        after_parents_end: s.after_parents_end,
    };
    pb::WorkflowTemplate {
        steps: spec
            .steps
            .iter()
            .filter(|s| !s.on_failure)
            .map(step)
            .collect(),
        failure_policy: policy_to_pb(spec.failure_policy) as i32,
        on_failure: spec.steps.iter().find(|s| s.on_failure).map(step),
    }
}

/// SubmitWorkflow in `namespace`.
pub(crate) async fn submit(
    shared: &Shared,
    who: &crate::auth::Identity,
    namespace: String,
    req: pb::SubmitWorkflowRequest,
) -> Result<pb::SubmitWorkflowResponse, Error> {
    children::may_submit(who, &req.parent_task_id)?;
    validate::short_text("client_request_id", &req.client_request_id).map_err(invalid)?;
    let spec = spec_from_pb(shared, req.failure_policy, req.steps, req.on_failure, "")?;
    // Checked last: a definition refused costs no read.
    let parent = children::parent_of(shared, who, &namespace, &req.parent_task_id).await?;
    let fp = fingerprint(&spec, parent.as_deref());
    let now = shared.clock.now_millis();
    let (mut record, steps) = spec.start(
        &id::new_task_id(),
        &namespace,
        parent.as_deref(),
        now,
        id::new_task_id,
    );
    record.client_request_id = (!req.client_request_id.is_empty()).then_some(req.client_request_id);
    let n = steps.len();
    shared.quotas.admit_tasks(&namespace, n as u64)?;
    let created = shared.store.create_workflow(record, &fp, steps, now).await;
    shared.quotas.settled(&namespace, n as u64);
    let created = created?;
    if let Some(parent) = &parent {
        children::settle(shared, &namespace, parent).await;
    }
    if !created.existing {
        info!(workflow_id = %created.workflow.id, steps = n, "workflow submitted");
        for t in &created.workflow.steps {
            meters::submitted(&t.namespace, &t.handler, 1);
        }
        shared.wake.notify_one();
    }
    Ok(pb::SubmitWorkflowResponse {
        workflow_id: created.workflow.id.clone(),
        workflow: Some(to_pb(&created.workflow)),
        existing: created.existing,
    })
}

/// Workflow `id` of `namespace`, or NOT_FOUND (also when it belongs to
/// another namespace).
async fn load_in(shared: &Shared, namespace: &str, id: &str) -> Result<WorkflowRecord, Error> {
    shared
        .store
        .get_workflow(id)
        .await?
        .filter(|w| w.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("workflow {id} not found")))
}

/// GetWorkflow in `namespace`.
pub(crate) async fn get(
    shared: &Shared,
    namespace: &str,
    req: pb::GetWorkflowRequest,
) -> Result<pb::GetWorkflowResponse, Error> {
    let id = workflow_id_of(&req.workflow_id)?;
    let workflow = load_in(shared, namespace, &id).await?;
    Ok(pb::GetWorkflowResponse {
        workflow: Some(to_pb(&workflow)),
    })
}

/// ListWorkflows in `namespace`.
pub(crate) async fn list(
    shared: &Shared,
    namespace: &str,
    req: pb::ListWorkflowsRequest,
) -> Result<pb::ListWorkflowsResponse, Error> {
    if req.page_size > 1_000 {
        return Err(invalid("page_size must be at most 1000"));
    }
    let limit = if req.page_size == 0 {
        100
    } else {
        req.page_size as usize
    };
    let state = match pb::WorkflowState::try_from(req.state) {
        Ok(pb::WorkflowState::Unspecified) => None,
        Ok(pb::WorkflowState::Running) => Some(WorkflowState::Running),
        Ok(pb::WorkflowState::Succeeded) => Some(WorkflowState::Succeeded),
        Ok(pb::WorkflowState::Failed) => Some(WorkflowState::Failed),
        Ok(pb::WorkflowState::Cancelled) => Some(WorkflowState::Cancelled),
        Err(_) => {
            return Err(invalid(format!(
                "state {} is not a known WorkflowState",
                req.state
            )));
        }
    };
    let before = if req.page_token.is_empty() {
        None
    } else {
        Some(id::parse_task_id(&req.page_token).ok_or_else(|| invalid("page_token is not valid"))?)
    };
    let mut page = shared
        .store
        .list_workflows(namespace, state, before.as_deref(), limit + 1)
        .await?;
    let next = if page.len() > limit {
        page.truncate(limit);
        page.last().map(|w| w.id.clone()).unwrap_or_default()
    } else {
        String::new()
    };
    Ok(pb::ListWorkflowsResponse {
        workflows: page.iter().map(to_pb).collect(),
        next_page_token: next,
    })
}

/// CancelWorkflow in `namespace`: the store cancels every step not ended
/// in one transaction; the workers of those that were running on this
/// node's streams are told to stop.
pub(crate) async fn cancel(
    shared: &Shared,
    namespace: &str,
    req: pb::CancelWorkflowRequest,
) -> Result<pb::CancelWorkflowResponse, Error> {
    let id = workflow_id_of(&req.workflow_id)?;
    validate::short_text("reason", &req.reason).map_err(invalid)?;
    load_in(shared, namespace, &id).await?;
    let reason = if req.reason.is_empty() {
        "workflow cancelled by a caller".to_string()
    } else {
        req.reason
    };
    let now = shared.clock.now_millis();
    let (workflow, stopped) = shared.store.cancel_workflow(&id, &reason, now).await?;
    for (task, execution_id) in &stopped {
        shared.take_back_attempt(&task.id, execution_id, &reason);
    }
    // The children its steps spawned (a step's fan-out, ended or not) are
    // the workflow's work too: cancelled as CancelTask cancels a parent's,
    // also when the workflow had ended (a second call finishes a sweep cut
    // short). One indexed read per step; a failed sweep does not stop the
    // others.
    for step in &workflow.steps {
        if let Err(err) =
            children::cancel_children(shared, namespace, &step.id, "workflow cancelled").await
        {
            tracing::warn!(workflow_id = %id, task_id = %step.id, error = %err, "the children of a cancelled workflow's step were not all cancelled; CancelWorkflow again sweeps them");
        }
    }
    if !stopped.is_empty() {
        shared.wake.notify_one();
    }
    info!(workflow_id = %id, state = workflow.state.as_str(), "workflow cancel requested");
    Ok(pb::CancelWorkflowResponse {
        workflow: Some(to_pb(&workflow)),
    })
}

/// RetryWorkflow in `namespace`.
pub(crate) async fn retry(
    shared: &Shared,
    namespace: &str,
    req: pb::RetryWorkflowRequest,
) -> Result<pb::RetryWorkflowResponse, Error> {
    let id = workflow_id_of(&req.workflow_id)?;
    load_in(shared, namespace, &id).await?;
    let now = shared.clock.now_millis();
    let (workflow, rerun) = shared.store.retry_workflow(&id, now).await?;
    if rerun > 0 {
        info!(workflow_id = %id, steps = rerun, "workflow retried");
        shared.wake.notify_one();
    }
    Ok(pb::RetryWorkflowResponse {
        workflow: Some(to_pb(&workflow)),
        rerun_steps: rerun,
    })
}

/// The stream of WatchWorkflow.
pub(crate) type WatchStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<pb::WatchWorkflowResponse, tonic::Status>> + Send>,
>;

/// WatchWorkflow in `namespace`: the workflow first, then again after each
/// committed change of one of its steps (the workflow's own state changes
/// in the same transactions) that changed what it shows, until it has
/// ended; re-read every second as well.
pub(crate) async fn watch(
    shared: &Shared,
    namespace: &str,
    req: pb::WatchWorkflowRequest,
) -> Result<WatchStream, Error> {
    use tokio::sync::broadcast::error::RecvError;
    let id = workflow_id_of(&req.workflow_id)?;
    // Subscribe before the first read, so no change falls between them.
    let mut changes = shared.store.subscribe();
    let first = load_in(shared, namespace, &id).await?;
    let slot = shared.quotas.watch(namespace)?;
    let store = shared.store.clone();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let _slot = slot;
        let steps: std::collections::HashSet<String> =
            first.steps.iter().map(|t| t.id.clone()).collect();
        let mut last = to_pb(&first);
        let mut done = first.state.is_terminal();
        let send = |w: pb::Workflow| pb::WatchWorkflowResponse { workflow: Some(w) };
        if tx.send(Ok(send(last.clone()))).await.is_err() {
            return;
        }
        // A re-read now and then: a change lost by a store without a
        // cross-replica feed (or a lagging one) costs at most this.
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        while !done {
            let must_read = tokio::select! {
                _ = tx.closed() => return,
                _ = tick.tick() => true,
                change = changes.recv() => match change {
                    Ok(c) => steps.contains(&c.task_id),
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return,
                },
            };
            if !must_read {
                continue;
            }
            match store.get_workflow(&id).await {
                Ok(Some(w)) => {
                    done = w.state.is_terminal();
                    let now = to_pb(&w);
                    if now != last {
                        last = now.clone();
                        if tx.send(Ok(send(now))).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(None) => return,
                Err(err) => {
                    tracing::warn!(workflow_id = %id, error = %err, "workflow watch read failed");
                    let _ = tx.send(Err(tonic::Status::from(Error::from(err)))).await;
                    return;
                }
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use taskmesh_core::workflow::{FailurePolicy, StepLink, WorkflowRecord, WorkflowState};
    use taskmesh_core::{NewTask, TaskState};

    use super::*;

    /// Ten steps of 1 MiB outputs: the first two are in the message, the
    /// other eight are left out and marked, and the message fits in 4 MiB.
    #[test]
    fn outputs_past_the_budget_are_left_out_and_the_message_fits() {
        let steps: Vec<TaskRecord> = (0..10)
            .map(|i| {
                let mut t = NewTask {
                    workflow: Some(StepLink {
                        workflow_id: "w".into(),
                        step: format!("s{i}"),
                        depends_on: Vec::new(),
                        on_failure: false,
                        after_parents_end: false,
                        parent_outputs: Vec::new(),
                    }),
                    ..NewTask::new("echo", 0)
                }
                .into_record(0);
                t.state = TaskState::Succeeded;
                t.output = Some(vec![b'x'; 1 << 20]);
                t.output_content_type = "application/octet-stream".into();
                t
            })
            .collect();
        let w = WorkflowRecord {
            id: "w".into(),
            namespace: "default".into(),
            client_request_id: None,
            failure_policy: FailurePolicy::CancelRemaining,
            state: WorkflowState::Succeeded,
            message: String::new(),
            step_count: 10,
            created_at: 0,
            updated_at: 0,
            ended_at: Some(1),
            parent_task_id: None,
            steps,
        };
        let wire = to_pb(&w);
        assert_eq!(wire.outputs_omitted, 8);
        let kept: Vec<bool> = wire.steps.iter().map(|s| s.output.is_some()).collect();
        assert_eq!(
            kept,
            [
                true, true, false, false, false, false, false, false, false, false
            ]
        );
        assert!(wire.steps[2..].iter().all(|s| s.output_omitted));
        let response = pb::GetWorkflowResponse {
            workflow: Some(wire),
        };
        assert!(
            response.encoded_len() < 4 << 20,
            "{}",
            response.encoded_len()
        );

        // Errors count too: past the budget a step's error is cut.
        let mut failing = w.clone();
        for t in &mut failing.steps[5..] {
            t.state = TaskState::Failed;
            t.output = None;
            t.error_message = "é".repeat(1 << 19);
        }
        let wire = to_pb(&failing);
        assert_eq!(wire.outputs_omitted, 3, "steps 2-4 lose their outputs");
        assert!(
            wire.steps[5..]
                .iter()
                .all(|s| s.error_message.len() <= CUT_ERROR_BYTES + 3)
        );
        let response = pb::GetWorkflowResponse {
            workflow: Some(wire),
        };
        assert!(
            response.encoded_len() < 4 << 20,
            "{}",
            response.encoded_len()
        );
    }
}
