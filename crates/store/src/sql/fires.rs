//! The one transaction that handles due schedules: per schedule, in a
//! savepoint of its own, the schedule's compare-and-set, the cancel of its
//! previous run, the tasks of its fires (idempotent on their
//! `schedule:<id>:<fire time>` keys) and its fire records — all or nothing
//! per schedule, one commit for every schedule due at the same instant,
//! behind the leader fence. Several schedules due together, none cancelling
//! a previous run, are first written as one batch ([`commit_batch`]: a
//! hundred schedules in ~200 statements instead of ~800), and so is one
//! schedule alone when its task may be dispatched at the commit (only the
//! batch offers new tasks to a chooser); if the batch fails it is rolled
//! back and they go one by one as above, offering none. A round in which
//! one schedule cancels a previous run goes one by one whole, so none of
//! its tasks is dispatched at the fire (the dispatcher claims them).

use taskmesh_core::schedule::FireRecord;
use taskmesh_core::{TaskRecord, UnixMillis};

use super::backend::{Backend, in_savepoint};
use super::schedules::write_cas;
use super::tasks::{Key, dispatch_new, holders, insert_opened, insert_rows, lock_task};
use super::transitions::{check_fence, transition_one};
use super::{SqlStore, args};
use crate::error::is_unique_violation;
use crate::{Chooser, Error, FireCommit, FireCommitted, Result, ScheduleChange, TaskChange};

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

/// The fire records of schedule `schedule_id`.
async fn insert_fires<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    schedule_id: &str,
    fires: &[FireRecord],
) -> Result<()> {
    for f in fires {
        let values = args![
            schedule_id,
            f.fire_at,
            f.handled_at,
            f.outcome.as_str(),
            f.task_id.clone()
        ];
        b.exec(tx, &b.sql().insert_fire, values).await?;
    }
    Ok(())
}

/// One schedule's commit inside `tx`; `None` when the schedule's version
/// moved (nothing written).
async fn commit_one<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    commit: FireCommit,
    now: UnixMillis,
) -> Result<OneDone> {
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
    insert_fires(b, tx, &commit.schedule.id, &commit.fires).await?;
    Ok(Some((committed, changes)))
}

/// What [`commit_one`] answers for one schedule.
type OneDone = Option<(FireCommitted, Vec<TaskChange>)>;

/// Every commit of a round at once, when none cancels a previous run: the
/// schedules' compare-and-sets, one look-up of the fires' idempotency keys,
/// one multi-row insert of the new tasks, then the fire records — about a
/// quarter of the statements [`commit_one`] runs per schedule (no savepoint
/// per schedule or per task, no look-up per task). With a `chooser`, each
/// new task is offered to it and written DISPATCHING when claimed, its
/// attempt opened: dispatched at the fire's own commit. An error (a key a
/// racing writer took after the look-up, a constraint) fails the whole
/// batch; the caller then rolls it back and goes schedule by schedule,
/// offering none.
async fn commit_batch<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    commits: &[FireCommit],
    now: UnixMillis,
    chooser: Option<&mut Chooser<'_>>,
) -> Result<Vec<OneDone>> {
    let mut won = Vec::with_capacity(commits.len());
    for commit in commits {
        won.push(write_cas(b, tx, &commit.schedule, commit.expected_version).await?);
    }
    let keys: Vec<Key> = commits
        .iter()
        .zip(&won)
        .filter(|(_, won)| **won)
        .flat_map(|(c, _)| &c.tasks)
        .filter_map(|(t, _)| Some((t.namespace.clone(), t.client_request_id.clone()?)))
        .collect();
    let mut held = holders(b, tx, &keys).await?;
    // Per commit, per task: the stored task holding its key, or the new
    // record (index into `new`).
    let mut new: Vec<(TaskRecord, &str)> = Vec::new();
    let mut plans: Vec<Vec<Result<TaskRecord, usize>>> = Vec::with_capacity(commits.len());
    for (commit, won) in commits.iter().zip(&won) {
        let mut plan = Vec::new();
        if *won {
            for (task, fingerprint) in &commit.tasks {
                let stored = task
                    .client_request_id
                    .as_ref()
                    .and_then(|k| held.remove(&(task.namespace.clone(), k.clone())));
                match stored {
                    Some((stored, _)) => plan.push(Ok(stored)),
                    None => {
                        plan.push(Err(new.len()));
                        new.push((task.clone().into_record(now), fingerprint.as_str()));
                    }
                }
            }
        }
        plans.push(plan);
    }
    let opens = match chooser {
        Some(chooser) => {
            let offered: Vec<Option<&TaskRecord>> = new.iter().map(|(t, _)| Some(t)).collect();
            let (dispatched, opens) = dispatch_new(&offered, chooser, now);
            for ((record, _), claimed) in new.iter_mut().zip(dispatched) {
                if let Some(claimed) = claimed {
                    *record = claimed;
                }
            }
            opens
        }
        None => Vec::new(),
    };
    let rows: Vec<(&TaskRecord, &str)> = new.iter().map(|(t, fp)| (t, *fp)).collect();
    insert_rows(b, tx, &rows).await??;
    insert_opened(b, tx, &opens).await?;
    for (commit, _) in commits.iter().zip(&won).filter(|(_, won)| **won) {
        insert_fires(b, tx, &commit.schedule.id, &commit.fires).await?;
    }
    let mut out = Vec::with_capacity(commits.len());
    for (plan, won) in plans.into_iter().zip(won) {
        if !won {
            out.push(None);
            continue;
        }
        let mut committed = FireCommitted::default();
        let mut changes = Vec::new();
        for entry in plan {
            match entry {
                Ok(stored) => committed.tasks.push(stored),
                Err(i) => {
                    changes.push(TaskChange::of(&new[i].0));
                    committed.tasks.push(new[i].0.clone());
                }
            }
        }
        out.push(Some((committed, changes)));
    }
    Ok(out)
}

impl<B: Backend> SqlStore<B> {
    /// `Store::commit_fires_many` (`Store::commit_fires_dispatching` with a
    /// `chooser`); see the module comment.
    pub(super) async fn sched_commit_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
        chooser: Option<&mut Chooser<'_>>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        check_fence(b, &mut tx, fence).await?;
        let mut results = Vec::with_capacity(commits.len());
        let mut task_changes = Vec::new();
        let mut schedule_changes = Vec::new();
        // One schedule alone goes the batched way too when its task may be
        // dispatched at the commit (only that way offers the chooser).
        if (commits.len() > 1 || chooser.is_some()) && commits.iter().all(|c| c.cancel.is_none()) {
            let batch = in_savepoint!(b, &mut tx, "fires", {
                commit_batch(b, &mut tx, &commits, now, chooser).await
            });
            match batch {
                Ok(done) => {
                    for (commit, done) in commits.iter().zip(done) {
                        match done {
                            Some((done, changes)) => {
                                task_changes.extend(changes);
                                schedule_changes.push(ScheduleChange::of(&commit.schedule));
                                results.push(Ok(Some(done)));
                            }
                            None => results.push(Ok(None)),
                        }
                    }
                    b.commit(tx).await?;
                    self.publish(&task_changes, &schedule_changes);
                    return Ok(results);
                }
                Err(err) => {
                    tracing::debug!(error = %err, "batched fires failed; writing schedule by schedule");
                }
            }
        }
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
