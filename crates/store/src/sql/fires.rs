//! The one transaction that handles due schedules: per schedule, in a
//! savepoint of its own, the schedule's compare-and-set, the cancel of its
//! previous run, the tasks of its fires (idempotent on their
//! `schedule:<id>:<fire time>` keys) and its fire records — all or nothing
//! per schedule, one commit for every schedule due at the same instant,
//! behind the leader fence.

use taskmesh_core::{TaskRecord, UnixMillis};

use super::backend::{Backend, in_savepoint};
use super::schedules::write_cas;
use super::tasks::{holders, insert_rows, lock_task};
use super::transitions::{check_fence, transition_one};
use super::{SqlStore, args};
use crate::error::is_unique_violation;
use crate::{Error, FireCommit, FireCommitted, Result, ScheduleChange, TaskChange};

/// The task of a fire whose key `key` (in `namespace`) is already taken:
/// the one holding it.
async fn held_by<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    namespace: &str,
    key: &str,
) -> Result<Option<TaskRecord>> {
    let key = (namespace.to_string(), key.to_string());
    Ok(holders(b, tx, std::slice::from_ref(&key))
        .await?
        .remove(&key)
        .map(|(t, _)| t))
}

/// One schedule's commit inside `tx`; `None` when the schedule's version
/// moved (nothing written).
async fn commit_one<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    commit: FireCommit,
    now: UnixMillis,
) -> Result<Option<(FireCommitted, Vec<TaskChange>)>> {
    if !write_cas(b, tx, &commit.schedule, commit.expected_version).await? {
        return Ok(None);
    }
    let mut committed = FireCommitted::default();
    let mut changes = Vec::new();
    if let Some((task_id, event)) = &commit.cancel {
        let before = lock_task(b, tx, task_id).await?;
        match transition_one(b, tx, task_id, event, now).await {
            Ok(after) => {
                changes.push(TaskChange::of(&after));
                committed.cancelled = before;
            }
            // It ended meanwhile: nothing to cancel.
            Err(Error::Transition(_) | Error::NotFound(_)) => {}
            Err(err) => return Err(err),
        }
    }
    for (task, fingerprint) in commit.tasks {
        if let Some(key) = &task.client_request_id
            && let Some(stored) = held_by(b, tx, &task.namespace, key).await?
        {
            committed.tasks.push(stored);
            continue;
        }
        let record = task.into_record(now);
        let inserted = in_savepoint!(b, tx, "fire_task", {
            insert_rows(b, tx, &[(&record, fingerprint.as_str())]).await?
        });
        match inserted {
            Ok(()) => {
                changes.push(TaskChange::of(&record));
                committed.tasks.push(record);
            }
            // Another writer took the key between the look-up and the
            // insert (the insert waited for it to commit): the fire's task
            // is theirs.
            Err(err) if is_unique_violation(&err) => {
                let key = record.client_request_id.as_deref().unwrap_or_default();
                match held_by(b, tx, &record.namespace, key).await? {
                    Some(stored) => committed.tasks.push(stored),
                    None => return Err(Error::Conflict(format!("client_request_id {key}"))),
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
    for f in &commit.fires {
        let values = args![
            &commit.schedule.id,
            f.fire_at,
            f.handled_at,
            f.outcome.as_str(),
            f.task_id.clone()
        ];
        b.exec(tx, &b.sql().insert_fire, values).await?;
    }
    Ok(Some((committed, changes)))
}

impl<B: Backend> SqlStore<B> {
    /// `Store::commit_fires_many`; see the module comment.
    pub(super) async fn sched_commit_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        check_fence(b, &mut tx, fence).await?;
        let mut results = Vec::with_capacity(commits.len());
        let mut task_changes = Vec::new();
        let mut schedule_changes = Vec::new();
        for commit in commits {
            // A savepoint per schedule: one failing commit leaves nothing
            // half-written and does not undo the others.
            let change = ScheduleChange::of(&commit.schedule);
            let done = in_savepoint!(b, &mut tx, "fire", {
                commit_one(b, &mut tx, commit, now).await
            });
            match done {
                Ok(Some((done, changes))) => {
                    task_changes.extend(changes);
                    schedule_changes.push(change);
                    results.push(Ok(Some(done)));
                }
                Ok(None) => results.push(Ok(None)),
                Err(err) => results.push(Err(err)),
            }
        }
        b.commit(tx).await?;
        self.publish(&task_changes, &schedule_changes);
        Ok(results)
    }
}
