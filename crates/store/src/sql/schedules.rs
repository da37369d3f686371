//! Schedules: rows ↔ records, compare-and-set writes, the scheduler's
//! queries and the fire history. The one transaction that handles due
//! schedules is `fires`.

use std::collections::HashMap;

use taskmesh_core::UnixMillis;
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};

use super::backend::{Args, Backend};
use super::dialect::in_lists;
use super::rows::schedule_args;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::error::is_unique_violation;
use crate::{Error, Result, ScheduleChange, TaskRecord, decode};

/// Largest page of schedules or fires.
const MAX_PAGE: u32 = 1000;

/// Writes `s` if it still has version `expected`; false when it moved.
pub(super) async fn write_cas<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    s: &ScheduleRecord,
    expected: i64,
) -> Result<bool> {
    let mut values = Args::with_capacity(20);
    schedule_args(s, &mut values)?;
    values.extend(args![&s.id, expected]);
    Ok(b.exec(tx, &b.sql().update_schedule, values).await? == 1)
}

impl<B: Backend> SqlStore<B> {
    async fn read_schedules(&self, sql: &'static str, values: Args) -> Result<Vec<ScheduleRecord>> {
        let rows = self.backend().read(sql, values).await?;
        rows.iter().map(decode::schedule).collect()
    }

    pub(super) async fn sched_create(&self, s: &ScheduleRecord) -> Result<()> {
        let b = self.backend();
        let mut values = args![&s.id, &s.namespace];
        schedule_args(s, &mut values)?;
        let mut tx = b.begin_write().await?;
        match b.exec(&mut tx, &b.sql().insert_schedule, values).await {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {
                return Err(Error::AlreadyExists(format!(
                    "schedule {} already exists",
                    s.id
                )));
            }
            Err(err) => return Err(err.into()),
        }
        b.commit(tx).await?;
        self.publish(&[], &[ScheduleChange::of(s)]);
        Ok(())
    }

    pub(super) async fn sched_get(&self, id: &str) -> Result<Option<ScheduleRecord>> {
        let mut found = self
            .read_schedules(&self.sql().get_schedule, args![id])
            .await?;
        Ok(found.pop())
    }

    pub(super) async fn sched_list(
        &self,
        namespace: Option<&str>,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)> {
        let limit = limit.clamp(1, MAX_PAGE);
        let page = args![after_id.unwrap_or(""), i64::from(limit) + 1];
        let mut out = match namespace {
            None => {
                self.read_schedules(&self.sql().list_schedules, page)
                    .await?
            }
            Some(ns) => {
                let mut values = args![ns];
                values.extend(page);
                self.read_schedules(&self.sql().list_schedules_in, values)
                    .await?
            }
        };
        let more = out.len() > limit as usize;
        out.truncate(limit as usize);
        let next = more.then(|| out.last().map(|s| s.id.clone())).flatten();
        Ok((out, next))
    }

    pub(super) async fn sched_update(&self, s: &ScheduleRecord, expected: i64) -> Result<bool> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        if !write_cas(b, &mut tx, s, expected).await? {
            let exists = b
                .fetch(&mut tx, &b.sql().schedule_exists, args![&s.id])
                .await?;
            if exists.is_empty() {
                return Err(Error::NotFound(format!("schedule {}", s.id)));
            }
            return Ok(false);
        }
        b.commit(tx).await?;
        self.publish(&[], &[ScheduleChange::of(s)]);
        Ok(true)
    }

    pub(super) async fn sched_delete(&self, id: &str) -> Result<bool> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        b.exec(&mut tx, &b.sql().delete_fires, args![id]).await?;
        let gone = b.exec(&mut tx, &b.sql().delete_schedule, args![id]).await? == 1;
        b.commit(tx).await?;
        if gone {
            let change = ScheduleChange {
                schedule_id: id.to_string(),
                next_fire_at: None,
            };
            self.publish(&[], &[change]);
        }
        Ok(gone)
    }

    pub(super) async fn sched_due(
        &self,
        now: UnixMillis,
        limit: usize,
    ) -> Result<Vec<ScheduleRecord>> {
        let values = args![now, sql_limit(limit)];
        self.read_schedules(&self.sql().due_schedules, values).await
    }

    pub(super) async fn sched_awaiting(
        &self,
        limit: usize,
    ) -> Result<Vec<(ScheduleRecord, Option<TaskRecord>)>> {
        let schedules = self
            .read_schedules(&self.sql().awaiting_run_end, args![sql_limit(limit)])
            .await?;
        let ids: Vec<&str> = schedules
            .iter()
            .filter_map(|s| s.last_task_id.as_deref())
            .collect();
        let mut tasks: HashMap<String, TaskRecord> = HashMap::new();
        for list in in_lists(&ids) {
            let n = list.len();
            let values = list.into_iter().map(Into::into).collect();
            for task in self
                .read_tasks(self.sql().tasks_by_id.get(n), values)
                .await?
            {
                tasks.insert(task.id.clone(), task);
            }
        }
        Ok(schedules
            .into_iter()
            .map(|s| {
                let task = s
                    .last_task_id
                    .as_ref()
                    .and_then(|id| tasks.get(id).cloned());
                (s, task)
            })
            .collect())
    }

    pub(super) async fn sched_recent_fires(&self, id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        let values = args![id, i64::from(limit.clamp(1, MAX_PAGE))];
        let rows = self
            .backend()
            .read(&self.sql().recent_fires, values)
            .await?;
        rows.iter().map(decode::fire).collect()
    }

    pub(super) async fn fence(&self) -> Result<u64> {
        let rows = self
            .backend()
            .read(&self.sql().fence_token, Vec::new())
            .await?;
        let token = rows
            .first()
            .map(|r| decode::Columns::int(r, "token"))
            .transpose()
            .map_err(|e| Error::Internal(format!("bad fence row: {e}")))?
            .unwrap_or_default();
        Ok(u64::try_from(token).unwrap_or(0))
    }
}
