//! [`Store::create_tasks`](crate::Store::create_tasks) on Postgres: one
//! transaction, the new rows in multi-row inserts (256 rows a statement)
//! instead of one round trip each.
//!
//! Every entry is answered as `create_task` would answer it alone: an id
//! already stored is refused; a stored idempotency key answers with its task
//! (same fingerprint) or is refused (another); a key repeated inside the
//! batch is answered against its first use. `ON CONFLICT DO NOTHING` on the
//! key covers a concurrent writer of the same key: Postgres waits for it to
//! commit, the row is skipped, and the entry is answered from what it
//! stored.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use sqlx::Row;
use taskmesh_core::{NewTask, TaskRecord, UnixMillis};

use super::PostgresStore;
use super::{sql, tx};
use crate::{Created, Error, Result, TaskChange, existing_or_taken};

/// Rows per insert statement (37 parameters each, well below Postgres's
/// 65,535).
const CHUNK: usize = 256;
const COLUMNS: usize = 37;

fn insert_sql(rows: usize) -> String {
    let mut out = format!("INSERT INTO tasks ({}) VALUES ", sql::INSERT_COLUMNS);
    for r in 0..rows {
        out.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..COLUMNS {
            let n = r * COLUMNS + c + 1;
            let sep = if c == 0 { "" } else { ", " };
            // Column 9 is labels, sent as text and stored as jsonb.
            let cast = if c == 8 { "::jsonb" } else { "" };
            let _ = write!(out, "{sep}${n}{cast}");
        }
        out.push(')');
    }
    out.push_str(
        " ON CONFLICT (client_request_id) WHERE client_request_id IS NOT NULL \
         DO NOTHING RETURNING id",
    );
    out
}

impl PostgresStore {
    pub(super) async fn create_many(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created>>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let entries: Vec<(TaskRecord, String)> = tasks
            .into_iter()
            .map(|(t, fp)| (t.into_record(now), fp))
            .collect();
        let mut db = self.pool.begin().await?;
        let ids: Vec<String> = entries.iter().map(|(t, _)| t.id.clone()).collect();
        let taken: HashSet<String> = sqlx::query("SELECT id FROM tasks WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut *db)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;

        // First use of each key inside the batch goes to the insert; later
        // uses are answered against it afterwards.
        let mut answers: Vec<Option<Result<Created>>> = Vec::with_capacity(entries.len());
        let mut first_of_key: HashMap<String, usize> = HashMap::new();
        let mut insert: Vec<usize> = Vec::new();
        for (i, (task, _)) in entries.iter().enumerate() {
            if taken.contains(&task.id) {
                answers.push(Some(Err(Error::AlreadyExists(format!(
                    "task {} already exists",
                    task.id
                )))));
                continue;
            }
            answers.push(None);
            match &task.client_request_id {
                Some(key) if first_of_key.contains_key(key) => {}
                Some(key) => {
                    first_of_key.insert(key.clone(), i);
                    insert.push(i);
                }
                None => insert.push(i),
            }
        }
        let mut inserted: HashSet<String> = HashSet::new();
        for chunk in insert.chunks(CHUNK) {
            let sql = insert_sql(chunk.len());
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for &i in chunk {
                let (task, fp) = &entries[i];
                q = tx::bind_insert(q, task, fp)?;
            }
            for row in q.fetch_all(&mut *db).await? {
                inserted.insert(row.try_get::<String, _>(0)?);
            }
        }
        // Keys already held by a stored task (or by a concurrent writer that
        // committed meanwhile), one look-up per such key.
        let mut holders: HashMap<String, (TaskRecord, String)> = HashMap::new();
        for &i in &insert {
            let (task, fp) = &entries[i];
            if inserted.contains(&task.id) {
                if let Some(key) = &task.client_request_id {
                    holders.insert(key.clone(), (task.clone(), fp.clone()));
                }
                continue;
            }
            let Some(key) = &task.client_request_id else {
                answers[i] = Some(Err(Error::Internal(format!(
                    "task {} was not inserted and has no idempotency key",
                    task.id
                ))));
                continue;
            };
            match tx::find_by_request_id(&mut db, key).await? {
                Some(found) => {
                    holders.insert(key.clone(), found);
                }
                None => {
                    answers[i] = Some(Err(Error::Conflict(format!("client_request_id {key}"))));
                }
            }
        }
        db.commit().await?;

        let mut created = Vec::new();
        for (i, (task, fp)) in entries.into_iter().enumerate() {
            if answers[i].is_some() {
                continue;
            }
            if inserted.contains(&task.id) {
                created.push(TaskChange::of(&task));
                answers[i] = Some(Ok(Created {
                    task,
                    existing: false,
                }));
                continue;
            }
            answers[i] = Some(
                match task.client_request_id.as_ref().and_then(|k| holders.get(k)) {
                    Some((stored, stored_fp)) => existing_or_taken(stored.clone(), stored_fp, &fp),
                    None => Err(Error::Conflict(format!("task {}", task.id))),
                },
            );
        }
        tracing::debug!(created = created.len(), "tasks created");
        self.publish(created, []);
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(Error::Internal("entry left unanswered".into()))))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_numbered_placeholder_per_column() {
        let sql = super::insert_sql(3);
        assert!(sql.contains("$111)") && !sql.contains("$112"), "{sql}");
        assert_eq!(sql.matches("::jsonb").count(), 3);
    }
}
