//! The callback outbox on Postgres. Entries are queued by the terminal
//! transition itself (`tx::write_transition`, `batch`); here they are
//! claimed, leased and finished. Claims use `FOR UPDATE SKIP LOCKED`, so the
//! delivery loops of several replicas share the due entries without
//! handing one out twice, in one statement that also returns each entry's
//! task with its attempts.

use taskmesh_core::{CallbackJob, CallbackOutcome, UnixMillis};

use super::store_impl::sql_limit;
use super::{PostgresStore, sql, tx};
use crate::{Error, Result};

impl PostgresStore {
    pub(super) async fn cb_claim(
        &self,
        now: UnixMillis,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<CallbackJob>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let lease_end = now.saturating_add(lease_ms.max(1));
        let rows = sqlx::query(sql::CLAIM_CALLBACKS)
            .bind(now)
            .bind(sql_limit(limit))
            .bind(lease_end)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let task = tx::task_with_attempts(row)?;
                let delivery = task.callback.clone().ok_or_else(|| {
                    Error::Internal(format!("claimed callback of task {} vanished", task.id))
                })?;
                Ok(CallbackJob { delivery, task })
            })
            .collect()
    }

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
        let changed = sqlx::query(sql::FINISH_CALLBACK)
            .bind(state)
            .bind(last_error)
            .bind(next_attempt_at)
            .bind(delivered_at)
            .bind(delivery_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if changed == 0 {
            // Entries are never deleted but with their task: one that is
            // not PENDING now never will be again.
            let exists: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM callbacks WHERE delivery_id = $1")
                    .bind(delivery_id)
                    .fetch_optional(&self.pool)
                    .await?;
            if exists.is_none() {
                return Err(Error::NotFound(format!("callback delivery {delivery_id}")));
            }
        }
        Ok(changed > 0)
    }

    pub(super) async fn cb_next(&self) -> Result<Option<UnixMillis>> {
        Ok(sqlx::query_scalar(sql::NEXT_CALLBACK)
            .fetch_one(&self.pool)
            .await?)
    }
}
