//! Child tasks: a task (or a workflow) submitted under a live task of its
//! namespace, its parent (`parent_task_id`). A running handler spawns work
//! this way (dynamic fan-out; a workflow of children with a step that
//! depends on all of them is the join). Cancelling the parent cancels its
//! children and theirs; ListTasks finds them by parent.
//!
//! The parent is checked before the children are written and read again
//! after: a child written while its parent was being cancelled (after the
//! cancel's own sweep of the children) is cancelled then, so no child of a
//! cancelled parent runs on. A node that dies between cancelling a parent
//! and sweeping its children leaves them to run (the sweep is not in the
//! parent's transaction) until the parent is cancelled again: CancelTask
//! on a CANCELLED task sweeps its children again.

use std::collections::{BTreeSet, HashSet};

use taskmesh_core::auth::Role;
use taskmesh_core::{TaskRecord, TaskState};
use taskmesh_store::TaskFilter;
use tracing::{info, warn};

use crate::auth::Identity;
use crate::{Error, engine::Shared, ops_api, task_api};

/// The most tasks whose children one cancel lists (children, theirs, and
/// so on, ended ones included): a bound on one call's work, far above the
/// 10,000 children a handler could add in a batch. A sweep that reaches
/// it stops, saying so in the log; cancelling the parent again goes on.
const MAX_SWEPT: usize = 100_000;

/// Whether `who` may submit with `parent_task_id` (empty for none): a
/// worker token only names a parent (it submits as the handler spawning
/// work, never work of its own); checked before the request's shape.
pub(crate) fn may_submit(who: &Identity, parent_task_id: &str) -> Result<(), Error> {
    if parent_task_id.is_empty() && who.role == Some(Role::Worker) {
        return Err(Error::PermissionDenied(
            "a worker token submits tasks only as children of a live task \
             (set parent_task_id)"
                .into(),
        ));
    }
    Ok(())
}

/// The parent a submit names, checked: `None` for none; NOT_FOUND when no
/// task of `namespace` has that id; FAILED_PRECONDITION when it has ended
/// (children are added to live work). A worker token names only a task
/// one of its own workers is running (DISPATCHING or RUNNING on a worker
/// id this token's principal registered, on any replica): it spawns work
/// from the handler it runs, never under somebody else's task.
pub(crate) async fn parent_of(
    shared: &Shared,
    who: &Identity,
    namespace: &str,
    parent_task_id: &str,
) -> Result<Option<String>, Error> {
    if parent_task_id.is_empty() {
        return Ok(None);
    }
    let id = taskmesh_core::id::parse_task_id(parent_task_id).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "parent_task_id {parent_task_id:?} is not a valid task id (a UUID)"
        ))
    })?;
    let parent = task_api::load_in(shared, namespace, &id)
        .await
        .map_err(|err| match err {
            Error::NotFound(_) => Error::NotFound(format!("parent task {id} not found")),
            other => other,
        })?;
    if parent.state.is_terminal() {
        return Err(Error::FailedPrecondition(format!(
            "parent task {id} has ended ({}); children are added to a live task only",
            parent.state
        )));
    }
    if who.role == Some(Role::Worker) && !runs_on_own_worker(shared, who, &parent).await? {
        return Err(Error::PermissionDenied(format!(
            "a worker token submits children only of a task its own workers are running; \
             task {id} is {} on no worker of this token",
            parent.state
        )));
    }
    Ok(Some(id))
}

/// Whether `parent` is in flight on a worker id `who` registered (on this
/// replica, else in the cluster's registry).
async fn runs_on_own_worker(
    shared: &Shared,
    who: &Identity,
    parent: &TaskRecord,
) -> Result<bool, Error> {
    if !matches!(parent.state, TaskState::Dispatching | TaskState::Running) {
        return Ok(false);
    }
    let Some(worker_id) = parent.worker_id.as_deref() else {
        return Ok(false);
    };
    if let Some(owner) = shared.registry.owner_of(worker_id) {
        return Ok(owner == who.principal);
    }
    let workers = shared.coord.list_workers().await?;
    Ok(workers
        .iter()
        .any(|e| e.worker_id == worker_id && e.owner == who.principal))
}

/// After children of `parent` were written: if the parent has been
/// cancelled meanwhile, they are cancelled too (its cancel's sweep may
/// have run before they existed). The children are committed, so the
/// submit's answer must reach its caller: a failure here is logged, not
/// returned.
pub(crate) async fn settle(shared: &Shared, namespace: &str, parent: &str) {
    let swept = async {
        let now = shared.store.get_task(parent).await?;
        if now.is_some_and(|p| p.state == TaskState::Cancelled) {
            cancel_children(shared, namespace, parent, "parent task cancelled").await?;
        }
        Ok::<_, Error>(())
    };
    if let Err(err) = swept.await {
        warn!(parent_task_id = %parent, error = %err, "could not check the parent of new children");
    }
}

/// Cancels every live descendant of `parent` in `namespace`: its children
/// (a child workflow whole, through CancelWorkflow's path), then theirs.
/// Returns how many tasks and workflows it cancelled.
pub(crate) async fn cancel_children(
    shared: &Shared,
    namespace: &str,
    parent: &str,
    reason: &str,
) -> Result<(usize, usize), Error> {
    let mut stack = vec![parent.to_string()];
    let mut seen: HashSet<String> = HashSet::new();
    let mut cancelled = 0;
    let mut workflows_cancelled = 0;
    while let Some(parent) = stack.pop() {
        if seen.len() >= MAX_SWEPT {
            warn!(
                parent_task_id = %parent,
                visited = seen.len(),
                "the children sweep stopped at its bound; cancel the parent again to go on"
            );
            break;
        }
        if !seen.insert(parent.clone()) {
            continue;
        }
        let children = children_of(shared, namespace, &parent).await?;
        let mut workflows = BTreeSet::new();
        for child in children {
            stack.push(child.id.clone());
            if child.state.is_terminal() {
                continue;
            }
            match &child.workflow {
                Some(w) => {
                    workflows.insert(w.workflow_id.clone());
                }
                None => {
                    let after = ops_api::cancel_one(shared, &child, reason).await?;
                    cancelled += usize::from(after.state == TaskState::Cancelled);
                }
            }
        }
        for id in workflows {
            let now = shared.clock.now_millis();
            let (_, stopped) = shared.store.cancel_workflow(&id, reason, now).await?;
            for (task, execution_id) in &stopped {
                shared.take_back_attempt(&task.id, execution_id, reason);
            }
            workflows_cancelled += 1;
        }
    }
    if cancelled + workflows_cancelled > 0 {
        shared.wake.notify_one();
        info!(
            parent_task_id = %parent,
            tasks = cancelled,
            workflows = workflows_cancelled,
            "children cancelled with their parent"
        );
    }
    Ok((cancelled, workflows_cancelled))
}

/// Every child of `parent` (summaries, newest first).
async fn children_of(
    shared: &Shared,
    namespace: &str,
    parent: &str,
) -> Result<Vec<TaskRecord>, Error> {
    let mut filter = TaskFilter {
        namespace: Some(namespace.to_string()),
        parent_task_id: Some(parent.to_string()),
        limit: 1_000,
        ..TaskFilter::default()
    };
    let mut out = Vec::new();
    loop {
        let page = shared.store.list_tasks(&filter).await?;
        out.extend(page.tasks);
        match page.next_before_id {
            Some(next) if out.len() < MAX_SWEPT => filter.before_id = Some(next),
            _ => return Ok(out),
        }
    }
}
