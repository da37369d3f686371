//! Retention's removals, in bounded batches (one short write transaction
//! each, never a long lock or a table rewrite): `Store::remove_ended`
//! (old terminal tasks, each by its handler's, namespace's or the
//! server's horizon) and `Store::trim_fires` (fire history beyond a
//! schedule's newest records); and the horizons set through the API.

use taskmesh_core::retention::{Horizons, RetentionRule, TERMINAL};
use taskmesh_core::{TaskState, UnixMillis};

use super::backend::Backend;
use super::dialect::in_lists;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::decode::Columns;
use crate::{Error, Result};

/// Log lines deleted per transaction when a task with a long log goes (the
/// rest of a removed task's log goes in the task's own transaction).
pub(super) const LOG_LINES_PER_DELETE: i64 = 1_000;

impl<B: Backend> SqlStore<B> {
    /// Reads the ids (the oldest first) and deletes them in one write
    /// transaction; the delete names the terminal states again, so a row
    /// that is not terminal can never go. Long task logs go first, in
    /// bounded transactions of their own ([`Self::drop_long_logs`]), so the
    /// cascade of the task delete stays small.
    pub(super) async fn remove_ended_tasks(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<u64> {
        if !state.is_terminal() {
            return Err(Error::InvalidArgument(format!(
                "only ended tasks are removed; {} is not a terminal state",
                state.as_str()
            )));
        }
        if limit == 0 {
            return Ok(0);
        }
        let b = self.backend();
        let chosen = self
            .past_horizon(state, now, default_horizon_ms, limit)
            .await?;
        let candidates = ids_of(b.read(&b.sql().ended_ids, chosen.clone()).await?)?;
        if candidates.is_empty() {
            // Nothing past its horizon: no write transaction at all (a
            // pass visits every terminal state, most of them usually
            // empty, and each commit is a round trip or an fsync).
            return Ok(0);
        }
        self.drop_long_logs(&candidates).await?;
        let mut tx = b.begin_write().await?;
        let ids = ids_of(b.fetch(&mut tx, &b.sql().ended_ids, chosen).await?)?;
        let removed = delete_tasks(b, &mut tx, &ids).await?;
        b.commit(tx).await?;
        Ok(removed)
    }

    /// The placeholders of the scans of rows in `state` past their
    /// horizon (`ended_ids`, `ended_workflows`): the state, a first bound
    /// (no row that ended later is past a horizon: now less the shortest
    /// that can apply, the server's or one set through the API), now, the
    /// server's horizon and the limit.
    async fn past_horizon(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<crate::sql::Args> {
        let b = self.backend();
        let shortest = b
            .read(&b.sql().shortest_horizon, args![state.as_str()])
            .await?
            .first()
            .map(|row| row.opt_int("h"))
            .transpose()
            .map_err(|e| Error::Internal(format!("bad retention_policies minimum: {e}")))?
            .flatten()
            .map_or(default_horizon_ms, |h| h.min(default_horizon_ms));
        let bound = now.saturating_sub(shortest.max(0));
        Ok(args![
            state.as_str(),
            bound,
            now,
            default_horizon_ms,
            sql_limit(limit)
        ])
    }

    /// Removes ended workflows past their horizon, each with every step
    /// (the history of a workflow ages out as one unit), the oldest end
    /// first, at most `limit` steps in all; a workflow of more steps than
    /// that goes over several calls, its row last. Each workflow goes in
    /// its own transaction, which holds the workflow's row (so a
    /// RetryWorkflow either comes first, and the workflow is running
    /// again and stays, or finds it gone). Returns (workflows, steps)
    /// removed. Only SUCCEEDED, FAILED and CANCELLED are workflow states.
    pub(super) async fn remove_ended_workflows_sql(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<(u64, u64)> {
        if !state.is_terminal() {
            return Err(Error::InvalidArgument(format!(
                "only ended workflows are removed; {} is not a terminal state",
                state.as_str()
            )));
        }
        if limit == 0 || state == TaskState::TimedOut {
            return Ok((0, 0));
        }
        let b = self.backend();
        let sql = b.sql();
        let chosen = self
            .past_horizon(state, now, default_horizon_ms, limit)
            .await?;
        let mut workflows = Vec::new();
        for row in b.read(&sql.ended_workflows, chosen).await? {
            let bad = |e: String| Error::Internal(format!("bad workflows row: {e}"));
            workflows.push((
                row.text("id").map_err(bad)?,
                row.int("ended_at").map_err(bad)?,
            ));
        }
        let (mut gone, mut steps) = (0, 0);
        let mut budget = limit;
        for (id, ended_at) in workflows {
            if budget == 0 {
                break;
            }
            let page = args![id.as_str(), sql_limit(budget)];
            self.drop_long_logs(&ids_of(
                b.read(&sql.workflow_step_ids, page.clone()).await?,
            )?)
            .await?;
            let mut tx = b.begin_write().await?;
            let held = b
                .fetch(&mut tx, &sql.lock_workflow, args![id.as_str()])
                .await?;
            // As chosen, or changed since: gone, or retried (and perhaps
            // ended again, later, maybe otherwise). Then nothing of it goes.
            let unchanged = match held.first() {
                None => false,
                Some(row) => {
                    let w = crate::decode::workflow_row(row)?;
                    w.state.as_str() == state.as_str() && w.ended_at == Some(ended_at)
                }
            };
            if !unchanged {
                b.commit(tx).await?;
                continue;
            }
            let ids = ids_of(b.fetch(&mut tx, &sql.workflow_step_ids, page).await?)?;
            let removed = delete_tasks(b, &mut tx, &ids).await?;
            // Every step went (none was live), and the page held them all.
            if removed == ids.len() as u64 && ids.len() < budget {
                gone += b
                    .exec(&mut tx, &sql.delete_workflow, args![id.as_str()])
                    .await?;
            }
            b.commit(tx).await?;
            steps += removed;
            budget = budget.saturating_sub(ids.len().max(1));
        }
        Ok((gone, steps))
    }

    /// Deletes the log lines of `task_ids`' attempts that hold more than
    /// [`LOG_LINES_PER_DELETE`], newest first, that many per transaction
    /// (their counters stay until the task goes: they are about to).
    async fn drop_long_logs(&self, task_ids: &[String]) -> Result<()> {
        let b = self.backend();
        let sql = b.sql();
        let mut long = Vec::new();
        for list in in_lists(task_ids) {
            let n = list.len();
            let mut values: crate::sql::Args = args![LOG_LINES_PER_DELETE];
            values.extend(list.into_iter().map(Into::into));
            for row in b.read(sql.long_logs.get(n), values).await? {
                let bad = |e: String| Error::Internal(format!("bad task_log_attempts row: {e}"));
                long.push((
                    row.text("task_id").map_err(bad)?,
                    row.int("attempt").map_err(bad)?,
                    row.int("kept_lines").map_err(bad)?,
                ));
            }
        }
        long.sort();
        long.dedup();
        for (task_id, attempt, lines) in long {
            let mut upto = lines;
            while upto > 0 {
                let from = (upto - LOG_LINES_PER_DELETE).max(0);
                let mut tx = b.begin_write().await?;
                b.exec(
                    &mut tx,
                    &sql.delete_log_range,
                    args![task_id.as_str(), attempt, from, upto],
                )
                .await?;
                b.commit(tx).await?;
                upto = from;
            }
        }
        Ok(())
    }

    /// Finds the oldest fire time to keep (the `keep`-th newest), then the
    /// last of at most `limit` older ones, and deletes through it.
    pub(super) async fn trim_schedule_fires(
        &self,
        schedule_id: &str,
        keep: u32,
        limit: usize,
    ) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let b = self.backend();
        let sql = b.sql();
        let mut tx = b.begin_write().await?;
        let first_kept = instant(
            b.fetch(
                &mut tx,
                &sql.nth_newest_fire,
                args![schedule_id, i64::from(keep.max(1)) - 1],
            )
            .await?,
        )?;
        let Some(first_kept) = first_kept else {
            // No more than `keep` records.
            b.commit(tx).await?;
            return Ok(0);
        };
        let last_of_batch = instant(
            b.fetch(
                &mut tx,
                &sql.nth_oldest_fire_before,
                args![schedule_id, first_kept, sql_limit(limit) - 1],
            )
            .await?,
        )?
        .unwrap_or(first_kept);
        let removed = b
            .exec(
                &mut tx,
                &sql.delete_fires_through,
                args![schedule_id, first_kept, last_of_batch],
            )
            .await?;
        b.commit(tx).await?;
        Ok(removed)
    }
}

impl<B: Backend> SqlStore<B> {
    /// Replaces the horizons of (`namespace`, `handler`) in one write.
    pub(super) async fn retention_set(
        &self,
        namespace: &str,
        handler: &str,
        horizons: &Horizons,
    ) -> Result<()> {
        let b = self.backend();
        let sql = b.sql();
        let mut tx = b.begin_write().await?;
        b.exec(&mut tx, &sql.delete_retention, args![namespace, handler])
            .await?;
        for state in TERMINAL {
            if let Some(ms) = horizons.of(state) {
                b.exec(
                    &mut tx,
                    &sql.insert_retention,
                    args![namespace, handler, state.as_str(), ms],
                )
                .await?;
            }
        }
        b.commit(tx).await
    }

    /// The horizons set, of `namespace` or of all.
    pub(super) async fn retention_list(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<RetentionRule>> {
        let b = self.backend();
        let rows = match namespace {
            Some(ns) => b.read(&b.sql().retention_rules_in, args![ns]).await?,
            None => b.read(&b.sql().retention_rules, args![]).await?,
        };
        let bad = |e: String| Error::Internal(format!("bad retention_policies row: {e}"));
        let mut rules = Vec::with_capacity(rows.len());
        for row in rows {
            let state = row.text("state").map_err(bad)?;
            rules.push(RetentionRule {
                namespace: row.text("namespace").map_err(bad)?,
                handler: row.text("handler").map_err(bad)?,
                state: TaskState::parse(&state)
                    .ok_or_else(|| bad(format!("unknown state {state:?}")))?,
                horizon_ms: row.int("horizon_ms").map_err(bad)?,
            });
        }
        Ok(rules)
    }

    /// The first-created task kept in `namespace` and `state`, with when
    /// it ended.
    pub(super) async fn oldest_ended_task(
        &self,
        namespace: &str,
        state: TaskState,
    ) -> Result<Option<(String, Option<UnixMillis>)>> {
        let b = self.backend();
        let rows = b
            .read(&b.sql().oldest_ended, args![namespace, state.as_str()])
            .await?;
        let bad = |e: String| Error::Internal(format!("bad tasks row: {e}"));
        match rows.first() {
            None => Ok(None),
            Some(row) => Ok(Some((
                row.text("id").map_err(bad)?,
                row.opt_int("ended_at").map_err(bad)?,
            ))),
        }
    }
}

/// Deletes the terminal tasks among `ids` with their logs (which have no
/// foreign key to their task); attempts and callbacks go by cascade.
async fn delete_tasks<B: Backend>(b: &B, tx: &mut B::Tx, ids: &[String]) -> Result<u64> {
    let mut removed = 0;
    for list in in_lists(ids) {
        let n = list.len();
        let values: crate::sql::Args = list.into_iter().map(Into::into).collect();
        b.exec(tx, b.sql().delete_logs_of.get(n), values.clone())
            .await?;
        b.exec(tx, b.sql().delete_log_attempts_of.get(n), values.clone())
            .await?;
        removed += b.exec(tx, b.sql().delete_ended.get(n), values).await?;
    }
    Ok(removed)
}

/// The `id` column of each row.
fn ids_of<R: Columns>(rows: Vec<R>) -> Result<Vec<String>> {
    rows.iter()
        .map(|row| {
            row.text("id")
                .map_err(|e| Error::Internal(format!("bad tasks row: {e}")))
        })
        .collect()
}

/// The instant `v` of the first row, if any.
fn instant<R: crate::decode::Columns>(rows: Vec<R>) -> Result<Option<UnixMillis>> {
    match rows.first() {
        None => Ok(None),
        Some(row) => row
            .opt_int("v")
            .map_err(|e| Error::Internal(format!("bad fire time: {e}"))),
    }
}
