//! Schedules on SQLite: rows ↔ records, compare-and-set writes, and the one
//! transaction that handles a due schedule (schedule, fire records, the
//! cancel of the previous run and the new tasks, all or nothing).

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::{TaskRecord, UnixMillis};

use super::SqliteStore;
use super::store_impl::change_of;
use super::tx;
use crate::error::is_unique_violation;
use crate::{Error, FireCommit, FireCommitted, Result, ScheduleChange, decode};

/// The columns of `schedules`, in the order [`bind_body`] binds them (after `id`).
macro_rules! columns {
    () => {
        "id, name, kind, cron_expression, interval_ms, time_zone, template, \
         misfire_policy, max_catch_up, overlap_policy, paused, next_fire_at, last_fire_at, \
         last_task_id, fire_count, skipped_count, created_at, updated_at, version"
    };
}

fn from_row(row: &SqliteRow) -> Result<ScheduleRecord> {
    decode::schedule(row)
}

/// Binds every column but `id`, in `columns!()` order.
fn bind_body<'q>(
    q: super::rows::SqliteQuery<'q>,
    s: &ScheduleRecord,
) -> Result<super::rows::SqliteQuery<'q>> {
    let template = decode::template_json(s)?;
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(q.bind(s.name.clone())
        .bind(s.kind.as_str())
        .bind(s.cron_expression.clone())
        .bind(s.interval_ms)
        .bind(s.time_zone.clone())
        .bind(template)
        .bind(s.misfire.as_str())
        .bind(i64::from(s.max_catch_up))
        .bind(s.overlap.as_str())
        .bind(i64::from(s.paused))
        .bind(s.next_fire_at)
        .bind(s.last_fire_at)
        .bind(s.last_task_id.clone())
        .bind(as_i64(s.fire_count))
        .bind(as_i64(s.skipped_count))
        .bind(s.created_at)
        .bind(s.updated_at)
        .bind(s.version))
}

const UPDATE_CAS: &str = "UPDATE schedules SET name = ?, kind = ?, cron_expression = ?, \
    interval_ms = ?, time_zone = ?, template = ?, misfire_policy = ?, max_catch_up = ?, \
    overlap_policy = ?, paused = ?, next_fire_at = ?, last_fire_at = ?, last_task_id = ?, \
    fire_count = ?, skipped_count = ?, created_at = ?, updated_at = ?, version = ? \
    WHERE id = ? AND version = ?";

async fn write_cas(conn: &mut SqliteConnection, s: &ScheduleRecord, expected: i64) -> Result<bool> {
    let q = bind_body(sqlx::query(UPDATE_CAS), s)?
        .bind(s.id.clone())
        .bind(expected);
    Ok(q.execute(&mut *conn).await?.rows_affected() == 1)
}

fn change(s: &ScheduleRecord) -> ScheduleChange {
    ScheduleChange::of(s)
}

fn fire_from_row(row: &SqliteRow) -> Result<FireRecord> {
    decode::fire(row)
}

impl SqliteStore {
    fn publish_schedule(&self, s: &ScheduleRecord) {
        let _ = self.schedule_changes.send(change(s));
    }

    pub(super) async fn sched_create(&self, s: &ScheduleRecord) -> Result<()> {
        let mut tx = self.begin_write().await?;
        let q = sqlx::query(concat!(
            "INSERT INTO schedules (",
            columns!(),
            ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .bind(s.id.clone());
        match bind_body(q, s)?.execute(&mut *tx).await {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {
                return Err(Error::AlreadyExists(format!(
                    "schedule {} already exists",
                    s.id
                )));
            }
            Err(err) => return Err(err.into()),
        }
        tx.commit().await?;
        self.publish_schedule(s);
        Ok(())
    }

    pub(super) async fn sched_get(&self, id: &str) -> Result<Option<ScheduleRecord>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM schedules WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    pub(super) async fn sched_list(
        &self,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)> {
        let limit = limit.clamp(1, 1000);
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM schedules WHERE id > ? ORDER BY id LIMIT ?"
        ))
        .bind(after_id.unwrap_or(""))
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.reader)
        .await?;
        let mut out = rows.iter().map(from_row).collect::<Result<Vec<_>>>()?;
        let more = out.len() > limit as usize;
        out.truncate(limit as usize);
        let next = more.then(|| out.last().map(|s| s.id.clone())).flatten();
        Ok((out, next))
    }

    pub(super) async fn sched_update(&self, s: &ScheduleRecord, expected: i64) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        if !write_cas(&mut tx, s, expected).await? {
            let exists = sqlx::query("SELECT 1 FROM schedules WHERE id = ?")
                .bind(s.id.clone())
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            if !exists {
                return Err(Error::NotFound(format!("schedule {}", s.id)));
            }
            return Ok(false);
        }
        tx.commit().await?;
        self.publish_schedule(s);
        Ok(true)
    }

    pub(super) async fn sched_delete(&self, id: &str) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM schedule_fires WHERE schedule_id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let gone = sqlx::query("DELETE FROM schedules WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        tx.commit().await?;
        if gone {
            let _ = self.schedule_changes.send(ScheduleChange {
                schedule_id: id.to_string(),
                next_fire_at: None,
            });
        }
        Ok(gone)
    }

    pub(super) async fn sched_due(
        &self,
        now: UnixMillis,
        limit: usize,
    ) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM schedules WHERE next_fire_at IS NOT NULL AND paused = 0 \
             AND next_fire_at <= ? ORDER BY next_fire_at, id LIMIT ?"
        ))
        .bind(now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(from_row).collect()
    }

    pub(super) async fn sched_next_due(&self) -> Result<Option<UnixMillis>> {
        let v: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(next_fire_at) FROM schedules WHERE next_fire_at IS NOT NULL AND paused = 0",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(v)
    }

    pub(super) async fn sched_awaiting(
        &self,
        limit: usize,
    ) -> Result<Vec<(ScheduleRecord, Option<TaskRecord>)>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM schedules WHERE kind = 'FIXED_DELAY' AND next_fire_at IS NULL \
             AND paused = 0 AND last_task_id IS NOT NULL ORDER BY id LIMIT ?"
        ))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.reader)
        .await?;
        let schedules = rows.iter().map(from_row).collect::<Result<Vec<_>>>()?;
        let mut conn = self.reader.acquire().await?;
        let mut out = Vec::with_capacity(schedules.len());
        for s in schedules {
            let task = match &s.last_task_id {
                Some(id) => tx::load_task(&mut conn, id).await?,
                None => None,
            };
            out.push((s, task));
        }
        Ok(out)
    }

    pub(super) async fn sched_commit_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        let mut tx = self.begin_write().await?;
        tx::check_fence(&mut tx, fence).await?;
        let mut results = Vec::with_capacity(commits.len());
        let mut task_changes = Vec::new();
        let mut schedules = Vec::new();
        for commit in commits {
            // A savepoint per schedule: one failing commit leaves nothing
            // half-written and does not undo the others.
            sqlx::query("SAVEPOINT fire").execute(&mut *tx).await?;
            let schedule = commit.schedule.clone();
            match commit_one(&mut tx, commit, now).await {
                Ok(Some((done, changes))) => {
                    sqlx::query("RELEASE fire").execute(&mut *tx).await?;
                    task_changes.extend(changes);
                    schedules.push(schedule);
                    results.push(Ok(Some(done)));
                }
                Ok(None) => {
                    sqlx::query("RELEASE fire").execute(&mut *tx).await?;
                    results.push(Ok(None));
                }
                Err(err) => {
                    sqlx::query("ROLLBACK TO fire").execute(&mut *tx).await?;
                    sqlx::query("RELEASE fire").execute(&mut *tx).await?;
                    results.push(Err(err));
                }
            }
        }
        tx.commit().await?;
        self.publish(task_changes);
        for s in &schedules {
            self.publish_schedule(s);
        }
        Ok(results)
    }

    pub(super) async fn sched_recent_fires(&self, id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        let rows = sqlx::query(
            "SELECT fire_at, handled_at, outcome, task_id FROM schedule_fires \
             WHERE schedule_id = ? ORDER BY fire_at DESC LIMIT ?",
        )
        .bind(id)
        .bind(i64::from(limit.clamp(1, 1000)))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(fire_from_row).collect()
    }
}

/// One schedule's fire commit inside the caller's transaction; `None` when
/// the schedule's version moved (nothing written).
async fn commit_one(
    tx: &mut SqliteConnection,
    commit: FireCommit,
    now: UnixMillis,
) -> Result<Option<(FireCommitted, Vec<crate::TaskChange>)>> {
    if !write_cas(tx, &commit.schedule, commit.expected_version).await? {
        return Ok(None);
    }
    let mut committed = FireCommitted::default();
    let mut changes = Vec::new();
    if let Some((task_id, event)) = &commit.cancel {
        let before = tx::load_task(tx, task_id).await?;
        match tx::transition_one(tx, task_id, event, now).await {
            Ok(after) => {
                changes.push(change_of(&after));
                committed.cancelled = before;
            }
            // It ended meanwhile: nothing to cancel.
            Err(Error::Transition(_) | Error::NotFound(_)) => {}
            Err(err) => return Err(err),
        }
    }
    for (task, fingerprint) in commit.tasks {
        if let Some(key) = &task.client_request_id
            && let Some((stored, _)) = tx::find_by_request_id(tx, key).await?
        {
            committed.tasks.push(stored);
            continue;
        }
        let record = task.into_record(now);
        tx::insert_task(tx, &record, &fingerprint).await??;
        changes.push(change_of(&record));
        committed.tasks.push(record);
    }
    for f in &commit.fires {
        sqlx::query(
            "INSERT INTO schedule_fires (schedule_id, fire_at, handled_at, outcome, task_id) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (schedule_id, fire_at) DO NOTHING",
        )
        .bind(commit.schedule.id.clone())
        .bind(f.fire_at)
        .bind(f.handled_at)
        .bind(f.outcome.as_str())
        .bind(f.task_id.clone())
        .execute(&mut *tx)
        .await?;
    }
    Ok(Some((committed, changes)))
}
