//! The callback outbox. Entries are queued by the terminal transition
//! itself (`transitions::write_transition`, `batch`); here they are claimed,
//! leased and finished. Claims lock with the dialect's `{skip_locked}`, so
//! the delivery loops of several replicas share the due entries without
//! handing one out twice.

use std::collections::HashMap;

use taskmesh_core::{CallbackJob, CallbackOutcome, UnixMillis};

use super::backend::Backend;
use super::dialect::in_lists;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::{Error, Result, decode};

impl<B: Backend> SqlStore<B> {
    /// `Store::claim_callbacks`: due entries, earliest first, leased until
    /// `now + lease_ms`, each with its task and attempts.
    pub(super) async fn cb_claim(
        &self,
        now: UnixMillis,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<CallbackJob>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let b = self.backend();
        let sql = b.sql();
        let lease_end = now.saturating_add(lease_ms.max(1));
        let mut tx = b.begin_write().await?;
        let rows = b
            .fetch(&mut tx, &sql.claim_callbacks, args![now, sql_limit(limit)])
            .await?;
        let mut due = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut delivery = decode::callback(row)?;
            delivery.next_attempt_at = Some(lease_end);
            let task_id = decode::Columns::text(row, "task_id")
                .map_err(|e| Error::Internal(format!("bad callbacks row: {e}")))?;
            due.push((task_id, delivery));
        }
        if due.is_empty() {
            b.commit(tx).await?;
            return Ok(Vec::new());
        }
        let deliveries: Vec<&str> = due.iter().map(|(_, d)| d.delivery_id.as_str()).collect();
        for list in in_lists(&deliveries) {
            let n = list.len();
            let mut values = args![lease_end];
            values.extend(list.into_iter().map(Into::into));
            b.exec(&mut tx, sql.lease_callbacks.get(n), values).await?;
        }
        let task_ids: Vec<&str> = due.iter().map(|(t, _)| t.as_str()).collect();
        let mut tasks = HashMap::with_capacity(due.len());
        for list in in_lists(&task_ids) {
            let n = list.len();
            let values = list.into_iter().map(Into::into).collect();
            for row in b.fetch(&mut tx, sql.tasks_by_id.get(n), values).await? {
                let task = decode::task(&row)?;
                tasks.insert(task.id.clone(), task);
            }
        }
        for list in in_lists(&task_ids) {
            let n = list.len();
            let values = list.into_iter().map(Into::into).collect();
            for row in b
                .fetch(&mut tx, sql.attempts_of_many.get(n), values)
                .await?
            {
                let task_id = decode::Columns::text(&row, "task_id")
                    .map_err(|e| Error::Internal(format!("bad attempts row: {e}")))?;
                if let Some(task) = tasks.get_mut(&task_id) {
                    task.attempts.push(decode::attempt(&row, &task_id)?);
                }
            }
        }
        b.commit(tx).await?;
        due.into_iter()
            .map(|(task_id, delivery)| {
                let mut task = tasks.get(&task_id).cloned().ok_or_else(|| {
                    // The foreign key makes this impossible; say so if it happens.
                    Error::Internal(format!(
                        "callback {} names missing task {task_id}",
                        delivery.delivery_id
                    ))
                })?;
                task.callback = Some(delivery.clone());
                Ok(CallbackJob { delivery, task })
            })
            .collect()
    }

    /// `Store::postpone_callbacks`: the lease statement, with `at` as the
    /// new due time.
    pub(super) async fn cb_postpone(&self, delivery_ids: &[&str], at: UnixMillis) -> Result<()> {
        if delivery_ids.is_empty() {
            return Ok(());
        }
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        for list in in_lists(delivery_ids) {
            let n = list.len();
            let mut values = args![at];
            values.extend(list.iter().map(|id| (*id).into()));
            b.exec(&mut tx, b.sql().lease_callbacks.get(n), values)
                .await?;
        }
        b.commit(tx).await?;
        Ok(())
    }

    /// `Store::finish_callback`: records one try; only a PENDING entry
    /// changes.
    pub(super) async fn cb_finish(
        &self,
        delivery_id: &str,
        outcome: &CallbackOutcome,
        now: UnixMillis,
    ) -> Result<bool> {
        let (state, last_error, next_attempt_at, delivered_at) = match outcome {
            CallbackOutcome::Delivered => ("DELIVERED", String::new(), None, Some(now)),
            CallbackOutcome::Retry {
                error,
                next_attempt_at,
            } => ("PENDING", error.clone(), Some(*next_attempt_at), None),
            CallbackOutcome::Failed { error } => ("FAILED", error.clone(), None, None),
        };
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let values = args![
            state,
            last_error,
            next_attempt_at,
            delivered_at,
            delivery_id
        ];
        let changed = b.exec(&mut tx, &b.sql().finish_callback, values).await?;
        if changed == 0 {
            // Entries are never deleted but with their task: one that is
            // not PENDING now never will be again.
            let exists = b
                .fetch(&mut tx, &b.sql().callback_exists, args![delivery_id])
                .await?;
            if exists.is_empty() {
                return Err(Error::NotFound(format!("callback delivery {delivery_id}")));
            }
        }
        b.commit(tx).await?;
        Ok(changed > 0)
    }
}
