//! `Store::remove_ended`: retention's removal of old terminal tasks, in
//! bounded batches (one short write transaction each, never a long lock or
//! a table rewrite).

use taskmesh_core::{TaskState, UnixMillis};

use super::backend::Backend;
use super::dialect::in_lists;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::{Error, Result};

impl<B: Backend> SqlStore<B> {
    /// Reads the ids (the oldest first) and deletes them in one write
    /// transaction; the delete names the terminal states again, so a row
    /// that is not terminal can never go.
    pub(super) async fn remove_ended_tasks(
        &self,
        state: TaskState,
        ended_before: UnixMillis,
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
        let mut tx = b.begin_write().await?;
        let rows = b
            .fetch(
                &mut tx,
                &b.sql().ended_ids,
                args![state.as_str(), ended_before, sql_limit(limit)],
            )
            .await?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(
                crate::decode::Columns::text(row, "id")
                    .map_err(|e| Error::Internal(format!("bad tasks row: {e}")))?,
            );
        }
        let mut removed = 0;
        for list in in_lists(&ids) {
            let n = list.len();
            let values = list.into_iter().map(Into::into).collect();
            removed += b.exec(&mut tx, b.sql().delete_ended.get(n), values).await?;
        }
        b.commit(tx).await?;
        Ok(removed)
    }
}
