//! Schedules on Postgres, as on SQLite: compare-and-set writes, and the one
//! transaction that handles due schedules (schedule, fire records, the
//! cancel of the previous run and the new tasks, a savepoint per schedule),
//! each commit's changes published to this process and the others.

use sqlx::PgConnection;
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::{TaskRecord, UnixMillis};

use super::sql::schedule_columns;
use super::store_impl::sql_limit;
use super::tx::{self, PgQuery};
use super::{PostgresStore, sql};
use crate::error::is_unique_violation;
use crate::{Error, FireCommit, FireCommitted, Result, ScheduleChange, TaskChange, decode};

const INSERT: &str = "INSERT INTO schedules (id, name, kind, cron_expression, interval_ms, \
    time_zone, template, misfire_policy, max_catch_up, overlap_policy, paused, next_fire_at, \
    last_fire_at, last_task_id, fire_count, skipped_count, created_at, updated_at, version) \
    VALUES ($19, $1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
    $17, $18)";

const UPDATE_CAS: &str = "UPDATE schedules SET name = $1, kind = $2, cron_expression = $3, \
    interval_ms = $4, time_zone = $5, template = $6::jsonb, misfire_policy = $7, \
    max_catch_up = $8, overlap_policy = $9, paused = $10, next_fire_at = $11, \
    last_fire_at = $12, last_task_id = $13, fire_count = $14, skipped_count = $15, \
    created_at = $16, updated_at = $17, version = $18 WHERE id = $19 AND version = $20";

const GET: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules WHERE id = $1"
);

const LIST: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules WHERE id > $1 ORDER BY id LIMIT $2"
);

const DUE: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules WHERE next_fire_at IS NOT NULL AND NOT paused \
     AND next_fire_at <= $1 ORDER BY next_fire_at, id LIMIT $2"
);

const NEXT_DUE: &str =
    "SELECT MIN(next_fire_at) FROM schedules WHERE next_fire_at IS NOT NULL AND NOT paused";

const AWAITING: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules WHERE kind = 'FIXED_DELAY' AND next_fire_at IS NULL \
     AND NOT paused AND last_task_id IS NOT NULL ORDER BY id LIMIT $1"
);

const INSERT_FIRE: &str = "INSERT INTO schedule_fires (schedule_id, fire_at, handled_at, \
    outcome, task_id) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (schedule_id, fire_at) DO NOTHING";

const RECENT_FIRES: &str = "SELECT fire_at, handled_at, outcome, task_id FROM schedule_fires \
    WHERE schedule_id = $1 ORDER BY fire_at DESC LIMIT $2";

/// Binds `$1`..`$18` (every column but `id`) of [`INSERT`] and [`UPDATE_CAS`].
fn bind_body<'q>(q: PgQuery<'q>, s: &ScheduleRecord) -> Result<PgQuery<'q>> {
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(q.bind(s.name.clone())
        .bind(s.kind.as_str())
        .bind(s.cron_expression.clone())
        .bind(s.interval_ms)
        .bind(s.time_zone.clone())
        .bind(decode::template_json(s)?)
        .bind(s.misfire.as_str())
        .bind(i64::from(s.max_catch_up))
        .bind(s.overlap.as_str())
        .bind(s.paused)
        .bind(s.next_fire_at)
        .bind(s.last_fire_at)
        .bind(s.last_task_id.clone())
        .bind(as_i64(s.fire_count))
        .bind(as_i64(s.skipped_count))
        .bind(s.created_at)
        .bind(s.updated_at)
        .bind(s.version))
}

async fn write_cas(conn: &mut PgConnection, s: &ScheduleRecord, expected: i64) -> Result<bool> {
    let q = bind_body(sqlx::query(UPDATE_CAS), s)?
        .bind(s.id.clone())
        .bind(expected);
    Ok(q.execute(&mut *conn).await?.rows_affected() == 1)
}

impl PostgresStore {
    pub(super) async fn sched_create(&self, s: &ScheduleRecord) -> Result<()> {
        let mut db = self.pool.begin().await?;
        let q = bind_body(sqlx::query(INSERT), s)?.bind(s.id.clone());
        match q.execute(&mut *db).await {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {
                return Err(Error::AlreadyExists(format!(
                    "schedule {} already exists",
                    s.id
                )));
            }
            Err(err) => return Err(err.into()),
        }
        db.commit().await?;
        self.publish([], [ScheduleChange::of(s)]);
        Ok(())
    }

    pub(super) async fn sched_get(&self, id: &str) -> Result<Option<ScheduleRecord>> {
        let row = sqlx::query(GET).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(decode::schedule).transpose()
    }

    pub(super) async fn sched_list(
        &self,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)> {
        let limit = limit.clamp(1, 1000);
        let rows = sqlx::query(LIST)
            .bind(after_id.unwrap_or(""))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let mut out = rows
            .iter()
            .map(decode::schedule)
            .collect::<Result<Vec<_>>>()?;
        let more = out.len() > limit as usize;
        out.truncate(limit as usize);
        let next = more.then(|| out.last().map(|s| s.id.clone())).flatten();
        Ok((out, next))
    }

    pub(super) async fn sched_update(&self, s: &ScheduleRecord, expected: i64) -> Result<bool> {
        let mut db = self.pool.begin().await?;
        if !write_cas(&mut db, s, expected).await? {
            let exists = sqlx::query("SELECT 1 FROM schedules WHERE id = $1")
                .bind(s.id.clone())
                .fetch_optional(&mut *db)
                .await?
                .is_some();
            if !exists {
                return Err(Error::NotFound(format!("schedule {}", s.id)));
            }
            return Ok(false);
        }
        db.commit().await?;
        self.publish([], [ScheduleChange::of(s)]);
        Ok(true)
    }

    pub(super) async fn sched_delete(&self, id: &str) -> Result<bool> {
        let mut db = self.pool.begin().await?;
        sqlx::query("DELETE FROM schedule_fires WHERE schedule_id = $1")
            .bind(id)
            .execute(&mut *db)
            .await?;
        let gone = sqlx::query("DELETE FROM schedules WHERE id = $1")
            .bind(id)
            .execute(&mut *db)
            .await?
            .rows_affected()
            == 1;
        db.commit().await?;
        if gone {
            let change = ScheduleChange {
                schedule_id: id.to_string(),
                next_fire_at: None,
            };
            self.publish([], [change]);
        }
        Ok(gone)
    }

    pub(super) async fn sched_due(
        &self,
        now: UnixMillis,
        limit: usize,
    ) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(DUE)
            .bind(now)
            .bind(sql_limit(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(decode::schedule).collect()
    }

    pub(super) async fn sched_next_due(&self) -> Result<Option<UnixMillis>> {
        Ok(sqlx::query_scalar(NEXT_DUE).fetch_one(&self.pool).await?)
    }

    pub(super) async fn sched_awaiting(
        &self,
        limit: usize,
    ) -> Result<Vec<(ScheduleRecord, Option<TaskRecord>)>> {
        let rows = sqlx::query(AWAITING)
            .bind(sql_limit(limit))
            .fetch_all(&self.pool)
            .await?;
        let schedules = rows
            .iter()
            .map(decode::schedule)
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<&str> = schedules
            .iter()
            .filter_map(|s| s.last_task_id.as_deref())
            .collect();
        let tasks = sqlx::query(sql::TASKS_BY_ID)
            .bind(&ids)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(decode::task)
            .collect::<Result<Vec<_>>>()?;
        Ok(schedules
            .into_iter()
            .map(|s| {
                let task = s
                    .last_task_id
                    .as_ref()
                    .and_then(|id| tasks.iter().find(|t| t.id == *id).cloned());
                (s, task)
            })
            .collect())
    }

    pub(super) async fn sched_commit_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        let mut db = self.pool.begin().await?;
        tx::check_fence(&mut db, fence).await?;
        let mut results = Vec::with_capacity(commits.len());
        let mut task_changes = Vec::new();
        let mut schedule_changes = Vec::new();
        for commit in commits {
            // A savepoint per schedule: one failing commit leaves nothing
            // half-written and does not undo the others.
            let mut sp = sqlx::Connection::begin(&mut *db).await?;
            let change = ScheduleChange::of(&commit.schedule);
            match commit_one(&mut sp, commit, now).await {
                Ok(Some((done, changes))) => {
                    sp.commit().await?;
                    task_changes.extend(changes);
                    schedule_changes.push(change);
                    results.push(Ok(Some(done)));
                }
                Ok(None) => {
                    sp.commit().await?;
                    results.push(Ok(None));
                }
                Err(err) => {
                    sp.rollback().await?;
                    results.push(Err(err));
                }
            }
        }
        db.commit().await?;
        self.publish(task_changes, schedule_changes);
        Ok(results)
    }

    pub(super) async fn sched_recent_fires(&self, id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        let rows = sqlx::query(RECENT_FIRES)
            .bind(id)
            .bind(i64::from(limit.clamp(1, 1000)))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(decode::fire).collect()
    }
}

/// One schedule's fire commit inside the caller's transaction; `None` when
/// the schedule's version moved (nothing written).
async fn commit_one(
    db: &mut PgConnection,
    commit: FireCommit,
    now: UnixMillis,
) -> Result<Option<(FireCommitted, Vec<TaskChange>)>> {
    if !write_cas(db, &commit.schedule, commit.expected_version).await? {
        return Ok(None);
    }
    let mut committed = FireCommitted::default();
    let mut changes = Vec::new();
    if let Some((task_id, event)) = &commit.cancel {
        let before = tx::lock_task(db, task_id).await?;
        match tx::transition_one(db, task_id, event, now).await {
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
            && let Some((stored, _)) = tx::find_by_request_id(db, key).await?
        {
            committed.tasks.push(stored);
            continue;
        }
        let record = task.into_record(now);
        if tx::insert_task(db, &record, &fingerprint).await?? {
            changes.push(TaskChange::of(&record));
            committed.tasks.push(record);
            continue;
        }
        // Another writer took the key between the lookup and the insert
        // (ON CONFLICT waited for it to commit): the fire's task is theirs.
        let key = record.client_request_id.as_deref().unwrap_or_default();
        match tx::find_by_request_id(db, key).await? {
            Some((stored, _)) => committed.tasks.push(stored),
            None => {
                return Err(Error::Conflict(format!("client_request_id {key}")));
            }
        }
    }
    for f in &commit.fires {
        sqlx::query(INSERT_FIRE)
            .bind(commit.schedule.id.clone())
            .bind(f.fire_at)
            .bind(f.handled_at)
            .bind(f.outcome.as_str())
            .bind(f.task_id.clone())
            .execute(&mut *db)
            .await?;
    }
    Ok(Some((committed, changes)))
}
