//! Creating and reading tasks: creates with idempotency (one transaction
//! for a batch, rows in multi-row inserts, each entry answered as a lone
//! create would be), reads of one snapshot, lists and the scheduler's
//! queries.

use std::collections::{BTreeMap, HashMap};

use taskmesh_core::{
    AttemptChange, AttemptRecord, CallbackDelivery, Event, NewTask, TaskRecord, TaskState,
    UnixMillis,
};

use super::backend::{Backend, in_savepoint};
use super::batch::insert_many;
use super::dialect::{chunks, in_lists};
use super::rows::{attempt_args, insert_args};
use super::{
    SqlStore, Val, args,
    statements::{ListState, list_index},
};
use crate::error::is_unique_violation;
use crate::{
    Chooser, Created, Error, LIST_SCAN, Result, TaskChange, TaskFilter, TaskPage, decode,
    existing_or_taken,
};

/// Largest page [`crate::Store::list_tasks`] returns.
pub(super) const MAX_PAGE: u32 = 1000;

/// A `usize` limit as an SQL `LIMIT` value.
pub(super) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The task `id` without attempts; locked until the transaction ends where
/// the dialect locks rows.
pub(super) async fn lock_task<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
) -> Result<Option<TaskRecord>> {
    let rows = b.fetch(tx, &b.sql().lock_task, args![id]).await?;
    rows.first().map(decode::task).transpose()
}

/// Task `id` as `tx` reads it, without locking its row.
pub(super) async fn read_task<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
) -> Result<Option<TaskRecord>> {
    let rows = b.fetch(tx, &b.sql().get_task, args![id]).await?;
    rows.first().map(decode::task).transpose()
}

/// The attempts of task `id`, oldest first.
async fn load_attempts<B: Backend>(b: &B, tx: &mut B::Tx, id: &str) -> Result<Vec<AttemptRecord>> {
    let rows = b.fetch(tx, &b.sql().attempts_of, args![id]).await?;
    rows.iter().map(|row| decode::attempt(row, id)).collect()
}

/// The callback outbox entry of task `id`, if any.
async fn load_callback<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
) -> Result<Option<CallbackDelivery>> {
    let rows = b.fetch(tx, &b.sql().callback_of, args![id]).await?;
    rows.first().map(decode::callback).transpose()
}

/// Fills in the attempts and callback of `task`.
pub(super) async fn complete<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    mut task: TaskRecord,
) -> Result<TaskRecord> {
    task.attempts = load_attempts(b, tx, &task.id).await?;
    task.callback = load_callback(b, tx, &task.id).await?;
    Ok(task)
}

/// An idempotency key: unique within its namespace.
pub(super) type Key = (String, String);

/// The key of `task`, if it has one.
fn key_of(task: &TaskRecord) -> Option<Key> {
    let crid = task.client_request_id.clone()?;
    Some((task.namespace.clone(), crid))
}

/// The tasks holding these idempotency keys (attempts and callback
/// included), each with the fingerprint of the request that created it.
pub(super) async fn holders<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    keys: &[Key],
) -> Result<HashMap<Key, (TaskRecord, String)>> {
    let mut by_namespace: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (namespace, crid) in keys {
        by_namespace.entry(namespace).or_default().push(crid);
    }
    let mut found = Vec::new();
    for (namespace, crids) in by_namespace {
        for list in in_lists(&crids) {
            let n = list.len();
            let mut values = args![namespace];
            values.extend(list.into_iter().map(Into::into));
            for row in &b
                .fetch(tx, b.sql().tasks_by_request_id.get(n), values)
                .await?
            {
                found.push((decode::task(row)?, decode::fingerprint(row)?));
            }
        }
    }
    let mut out = HashMap::with_capacity(found.len());
    for (task, fingerprint) in found {
        let Some(key) = key_of(&task) else {
            continue;
        };
        out.insert(key, (complete(b, tx, task).await?, fingerprint));
    }
    Ok(out)
}

/// Inserts task rows in multi-row statements, after the rows of their
/// concurrency keys that do not exist yet (in key order, so two writers
/// never wait for each other's keys in opposite orders). An error (a taken
/// id or key) leaves the transaction to be rolled back.
pub(super) async fn insert_rows<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    rows: &[(&TaskRecord, &str)],
) -> Result<sqlx::Result<()>> {
    let mut keys: Vec<(&str, &str)> = rows
        .iter()
        .filter_map(|(t, _)| Some((t.namespace.as_str(), t.concurrency.as_ref()?.key.as_str())))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    // Only the missing ones: on MySQL an insert that ignores a duplicate
    // locks the row it found, and would wait for a claim holding it.
    let mut missing = Vec::with_capacity(keys.len());
    for (namespace, key) in keys {
        let found = b
            .fetch(tx, &b.sql().concurrency_key_exists, args![namespace, key])
            .await;
        match found {
            Ok(rows) if rows.is_empty() => missing.push((namespace, key)),
            Ok(_) => {}
            Err(err) => return Ok(Err(err)),
        }
    }
    let keys = missing;
    insert_many(
        b,
        tx,
        &keys,
        2,
        |(namespace, key), out| out.extend(args![*namespace, *key]),
        |n| b.sql().insert_concurrency_keys.get(n),
    )
    .await?;
    let mut rest = rows;
    for n in chunks(rows.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut values = Vec::with_capacity(n * 40);
        for (task, fingerprint) in chunk {
            insert_args(task, fingerprint, &mut values)?;
        }
        if let Err(err) = b.exec(tx, b.sql().insert_tasks.get(n), values).await {
            return Ok(Err(err));
        }
    }
    Ok(Ok(()))
}

/// How one entry of a create is answered before anything is inserted.
enum Plan {
    Answered(Box<Result<Created>>),
    Insert,
}

/// Decides each entry: a key held by a stored task answers with it (or is
/// refused for another fingerprint); a key repeated in the batch answers
/// against its first use; the rest are inserted.
fn plan(
    entries: &[(TaskRecord, String)],
    mut holders: HashMap<Key, (TaskRecord, String)>,
) -> Vec<Plan> {
    entries
        .iter()
        .map(|(task, fingerprint)| {
            let Some(key) = key_of(task) else {
                return Plan::Insert;
            };
            match holders.get(&key) {
                Some((stored, stored_fp)) => Plan::Answered(Box::new(existing_or_taken(
                    stored.clone(),
                    stored_fp,
                    fingerprint,
                ))),
                None => {
                    holders.insert(key, (task.clone(), fingerprint.clone()));
                    Plan::Insert
                }
            }
        })
        .collect()
}

fn keys(entries: &[(TaskRecord, String)]) -> Vec<Key> {
    let mut keys: Vec<Key> = entries.iter().filter_map(|(t, _)| key_of(t)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// True when `task` passes the filters a listing checks on read rows
/// (and, for a lookup by key, those its statement did not apply).
fn matches_all(filter: &TaskFilter, task: &TaskRecord) -> bool {
    filter.state.is_none_or(|s| task.state == s)
        && filter.handler.as_ref().is_none_or(|h| &task.handler == h)
        && filter.before_id.as_ref().is_none_or(|b| task.id < *b)
        && filter.created_after.is_none_or(|t| task.created_at >= t)
        && filter.created_before.is_none_or(|t| task.created_at < t)
        && filter
            .parent_task_id
            .as_ref()
            .is_none_or(|p| task.parent_task_id.as_ref() == Some(p))
        && matches_label(filter, task)
}

fn matches_label(filter: &TaskFilter, task: &TaskRecord) -> bool {
    match &filter.label {
        None => true,
        Some((key, None)) => task.labels.contains_key(key),
        Some((key, Some(value))) => task.labels.get(key) == Some(value),
    }
}

/// The listing statement for `filter`'s columns, and its arguments, for
/// a chunk of `chunk` rows before `cursor`.
fn list_statement<B: Backend>(
    b: &B,
    filter: &TaskFilter,
    cursor: Option<&str>,
    chunk: usize,
) -> (&'static str, Vec<Val>) {
    let i = list_index(
        filter.namespace.is_some(),
        ListState::of(filter.state),
        filter.handler.is_some(),
        cursor.is_some(),
        filter.created_after.is_some(),
        filter.created_before.is_some(),
    );
    let mut values = Vec::new();
    if let Some(namespace) = &filter.namespace {
        values.push(namespace.into());
    }
    if let Some(state) = filter.state {
        values.push(state.as_str().into());
    }
    if let Some(handler) = &filter.handler {
        values.push(handler.into());
    }
    if let Some(before) = cursor {
        values.push(before.into());
    }
    if let Some(t) = filter.created_after {
        values.push(t.into());
    }
    if let Some(t) = filter.created_before {
        values.push(t.into());
    }
    values.push(sql_limit(chunk).into());
    (b.sql().list[i].as_str(), values)
}

/// Reads rows newest first in the filter's order, keeping those whose
/// label matches, until the page (plus one, to know a next one exists) is
/// full, the rows end, or [`LIST_SCAN`] rows were read: then the page may
/// be short and its cursor the last row read.
async fn scan<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    filter: &TaskFilter,
    limit: u32,
) -> Result<(Vec<B::Row>, Vec<TaskRecord>, Option<String>)> {
    let want = limit as usize + 1;
    // Without a label (or a parent, whose index leaves the other filters
    // to the rows read) every row read is kept: one read of the page.
    let chunk = if filter.label.is_some() || filter.parent_task_id.is_some() {
        want.max(500)
    } else {
        want
    };
    let mut cursor = filter.before_id.clone();
    let mut kept_rows = Vec::new();
    let mut tasks = Vec::new();
    let mut read = 0usize;
    loop {
        let (sql, values) = match &filter.parent_task_id {
            Some(parent) => {
                let mut values: Vec<Val> = vec![parent.into()];
                if let Some(before) = &cursor {
                    values.push(before.into());
                }
                if let Some(namespace) = &filter.namespace {
                    values.push(namespace.into());
                }
                values.push(sql_limit(chunk).into());
                let i =
                    usize::from(cursor.is_some()) | usize::from(filter.namespace.is_some()) << 1;
                (b.sql().by_parent[i].as_str(), values)
            }
            None => list_statement(b, filter, cursor.as_deref(), chunk),
        };
        let rows = b.fetch(tx, sql, values).await?;
        let got = rows.len();
        read += got;
        for row in rows {
            let task = decode::task(&row)?;
            cursor = Some(task.id.clone());
            let keep = match &filter.parent_task_id {
                Some(_) => {
                    matches_all(filter, &task)
                        && filter
                            .namespace
                            .as_ref()
                            .is_none_or(|n| &task.namespace == n)
                }
                None => matches_label(filter, &task),
            };
            if keep {
                tasks.push(task);
                kept_rows.push(row);
                if tasks.len() == want {
                    break;
                }
            }
        }
        if tasks.len() == want {
            tasks.truncate(limit as usize);
            kept_rows.truncate(limit as usize);
            let next = tasks.last().map(|t| t.id.clone());
            return Ok((kept_rows, tasks, next));
        }
        if got < chunk {
            return Ok((kept_rows, tasks, None));
        }
        if read >= LIST_SCAN {
            return Ok((kept_rows, tasks, cursor));
        }
    }
}

/// The attempt a claim opened, with its task's id.
pub(super) type Opened = (String, AttemptRecord);

/// Offers each task of `offered` (`None`: not a new row, skipped) that is
/// READY at once and has no concurrency key to `chooser` (dispatch at
/// write: `Store::create_tasks_dispatching`, `Store::commit_fires_dispatching`).
/// Per entry, the record to write in its place when it was claimed
/// (DISPATCHING, exactly as a claim would write it), and the attempts the
/// claims opened ([`insert_opened`]).
pub(super) fn dispatch_new(
    offered: &[Option<&TaskRecord>],
    chooser: &mut Chooser<'_>,
    now: UnixMillis,
) -> (Vec<Option<TaskRecord>>, Vec<Opened>) {
    let mut opens = Vec::new();
    let mut dispatched = vec![None; offered.len()];
    for (task, slot) in offered.iter().zip(&mut dispatched) {
        // A task with a concurrency key waits for a claim, which counts its
        // key's tasks in flight.
        let Some(task) = task.filter(|t| t.state == TaskState::Ready && t.concurrency.is_none())
        else {
            continue;
        };
        let Some(claim) = chooser(task) else { continue };
        let event = Event::from(claim);
        match taskmesh_core::apply(task, &event, now) {
            Ok(transition) => {
                if let AttemptChange::Open(attempt) = transition.attempt {
                    opens.push((task.id.clone(), attempt));
                }
                *slot = Some(transition.task);
            }
            Err(err) => {
                tracing::warn!(task_id = %task.id, error = %err, "new task refused dispatch");
            }
        }
    }
    (dispatched, opens)
}

/// Inserts the attempts [`dispatch_new`] opened, in multi-row statements.
pub(super) async fn insert_opened<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    opens: &[Opened],
) -> Result<()> {
    insert_many(
        b,
        tx,
        opens,
        8,
        |(id, a), out| attempt_args(id, a, out),
        |n| b.sql().insert_attempts.get(n),
    )
    .await
}

impl<B: Backend> SqlStore<B> {
    /// `Store::create_tasks`: the whole batch in one transaction; if the
    /// database refuses a row of it (an id or key taken meanwhile), again
    /// with each row alone, so only that entry fails. With a `chooser`
    /// (`Store::create_tasks_dispatching`), the batched path offers it each
    /// new READY task; the row-by-row fallback offers none.
    pub(super) async fn create_many(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
        chooser: Option<&mut Chooser<'_>>,
    ) -> Result<Vec<Result<Created>>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let entries: Vec<(TaskRecord, String)> = tasks
            .into_iter()
            .map(|(t, fp)| (t.into_record(now), fp))
            .collect();
        // On the fallback, claims made for the batch are gone with it.
        let answers = match self.create_batched(&entries, now, chooser).await? {
            Some(answers) => answers,
            None => self.create_one_by_one(&entries).await?,
        };
        let created: Vec<TaskChange> = answers
            .iter()
            .flatten()
            .filter(|c| !c.existing)
            .map(|c| TaskChange::of(&c.task))
            .collect();
        tracing::debug!(created = created.len(), "tasks created");
        self.publish(&created, &[]);
        Ok(answers)
    }

    /// The batch in multi-row inserts; `None` when the database refused a
    /// row (nothing written). A new READY task the `chooser` claims is
    /// written dispatched, its attempt inserted with it.
    async fn create_batched(
        &self,
        entries: &[(TaskRecord, String)],
        now: UnixMillis,
        chooser: Option<&mut Chooser<'_>>,
    ) -> Result<Option<Vec<Result<Created>>>> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let held = holders(b, &mut tx, &keys(entries)).await?;
        let plans = plan(entries, held);
        let offered: Vec<Option<&TaskRecord>> = entries
            .iter()
            .zip(&plans)
            .map(|((task, _), plan)| matches!(plan, Plan::Insert).then_some(task))
            .collect();
        let (dispatched, opens) = match chooser {
            Some(chooser) => dispatch_new(&offered, chooser, now),
            None => (vec![None; entries.len()], Vec::new()),
        };
        let fresh: Vec<(&TaskRecord, &str)> = entries
            .iter()
            .zip(&plans)
            .zip(&dispatched)
            .filter(|((_, p), _)| matches!(p, Plan::Insert))
            .map(|(((t, fp), _), d)| (d.as_ref().unwrap_or(t), fp.as_str()))
            .collect();
        match insert_rows(b, &mut tx, &fresh).await? {
            Ok(()) => {}
            Err(err) if crate::error::kind(&err).is_row_refusal() => {
                tracing::debug!(error = %err, "batched insert refused a row; one by one");
                return Ok(None);
            }
            Err(err) => return Err(err.into()),
        }
        insert_opened(b, &mut tx, &opens).await?;
        b.commit(tx).await?;
        Ok(Some(
            entries
                .iter()
                .zip(plans)
                .zip(dispatched)
                .map(|(((task, _), plan), d)| match plan {
                    Plan::Answered(answer) => *answer,
                    Plan::Insert => Ok(Created {
                        task: d.unwrap_or_else(|| task.clone()),
                        existing: false,
                    }),
                })
                .collect(),
        ))
    }

    /// Each new row in a savepoint of its own: a row the database refuses
    /// fails alone, answered from the task that holds its key if another
    /// writer committed one meanwhile.
    async fn create_one_by_one(
        &self,
        entries: &[(TaskRecord, String)],
    ) -> Result<Vec<Result<Created>>> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let held = holders(b, &mut tx, &keys(entries)).await?;
        let mut answers = Vec::with_capacity(entries.len());
        for ((task, fingerprint), plan) in entries.iter().zip(plan(entries, held)) {
            if let Plan::Answered(answer) = plan {
                answers.push(*answer);
                continue;
            }
            let inserted = in_savepoint!(b, &mut tx, "create_row", {
                insert_rows(b, &mut tx, &[(task, fingerprint)]).await?
            });
            answers.push(match inserted {
                Ok(()) => Ok(Created {
                    task: task.clone(),
                    existing: false,
                }),
                Err(err) if is_unique_violation(&err) => {
                    let found = match key_of(task) {
                        Some(key) => holders(b, &mut tx, std::slice::from_ref(&key))
                            .await?
                            .remove(&key),
                        None => None,
                    };
                    match found {
                        Some((stored, stored_fp)) => {
                            existing_or_taken(stored, &stored_fp, fingerprint)
                        }
                        None => Err(Error::AlreadyExists(format!(
                            "task {} already exists",
                            task.id
                        ))),
                    }
                }
                Err(err) => Err(err.into()),
            });
        }
        b.commit(tx).await?;
        Ok(answers)
    }

    /// `Store::get_task`: the task, its attempts and its callback, read in
    /// one snapshot.
    pub(super) async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        let b = self.backend();
        let mut tx = b.begin_read().await?;
        let rows = b.fetch(&mut tx, &b.sql().get_task, args![id]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let task = complete(b, &mut tx, decode::task(row)?).await?;
        b.commit(tx).await?;
        Ok(Some(task))
    }

    /// `Store::list_tasks`: a page, newest first, each ended task with its
    /// callback, in one snapshot.
    pub(super) async fn list(&self, filter: &TaskFilter) -> Result<TaskPage> {
        let b = self.backend();
        let limit = filter.limit.clamp(1, MAX_PAGE);
        let mut tx = b.begin_read().await?;
        let (rows, mut tasks, mut next_before_id) = if let Some(key) = &filter.client_request_id {
            // One task at most: the key's, if the other filters keep it.
            let rows = match &filter.namespace {
                Some(ns) => {
                    b.fetch(&mut tx, &b.sql().by_request_id, args![ns, key])
                        .await?
                }
                None => {
                    b.fetch(&mut tx, &b.sql().by_request_id_any, args![key])
                        .await?
                }
            };
            let mut kept = Vec::new();
            let mut tasks = Vec::new();
            for row in rows {
                let task = decode::task(&row)?;
                if matches_all(filter, &task) && kept.len() < limit as usize {
                    tasks.push(task);
                    kept.push(row);
                }
            }
            (kept, tasks, None)
        } else {
            scan(b, &mut tx, filter, limit).await?
        };
        if let Some(budget) = filter.bodies {
            // As many as fit in the budget (at least one), then their
            // bodies, read for those only.
            let mut size = 0usize;
            let mut fit = 0;
            for row in rows.iter().take(tasks.len()) {
                let len = |c| decode::Columns::opt_int(row, c).ok().flatten().unwrap_or(0);
                let bytes = usize::try_from(len("payload_len") + len("output_len")).unwrap_or(0);
                if fit > 0 && size.saturating_add(bytes) > budget {
                    break;
                }
                size = size.saturating_add(bytes);
                fit += 1;
            }
            if fit < tasks.len() {
                tasks.truncate(fit);
                next_before_id = tasks.last().map(|t| t.id.clone());
            }
            let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
            let mut full = HashMap::with_capacity(ids.len());
            for list in in_lists(&ids) {
                let n = list.len();
                let values = list.into_iter().map(Into::into).collect();
                for row in b.fetch(&mut tx, b.sql().tasks_by_id.get(n), values).await? {
                    let task = decode::task(&row)?;
                    full.insert(task.id.clone(), task);
                }
            }
            for task in &mut tasks {
                // Gone between the two reads cannot happen in one snapshot;
                // if it did, the summary stays.
                if let Some(f) = full.remove(&task.id) {
                    *task = f;
                }
            }
        } else {
            for task in &mut tasks {
                task.output = None;
            }
        }
        let ended: Vec<&str> = tasks
            .iter()
            .filter(|t| t.state.is_terminal() && !t.callback_url.is_empty())
            .map(|t| t.id.as_str())
            .collect();
        let mut callbacks = HashMap::new();
        for list in in_lists(&ended) {
            let n = list.len();
            let values = list.into_iter().map(Into::into).collect();
            for row in b
                .fetch(&mut tx, b.sql().callbacks_of_many.get(n), values)
                .await?
            {
                let task_id = crate::decode::Columns::text(&row, "task_id")
                    .map_err(|e| Error::Internal(format!("bad callbacks row: {e}")))?;
                callbacks.insert(task_id, decode::callback(&row)?);
            }
        }
        b.commit(tx).await?;
        for task in &mut tasks {
            task.callback = callbacks.remove(&task.id);
        }
        Ok(TaskPage {
            tasks,
            next_before_id,
        })
    }

    /// Runs a query of task rows outside a transaction.
    pub(super) async fn read_tasks(
        &self,
        sql: &'static str,
        values: super::Args,
    ) -> Result<Vec<TaskRecord>> {
        let rows = self.backend().read(sql, values).await?;
        rows.iter().map(decode::task).collect()
    }

    /// Runs a query whose one row holds an optional instant `v`.
    pub(super) async fn read_instant(&self, sql: &'static str) -> Result<Option<UnixMillis>> {
        let rows = self.backend().read(sql, Vec::new()).await?;
        match rows.first() {
            None => Ok(None),
            Some(row) => crate::decode::Columns::opt_int(row, "v")
                .map_err(|e| Error::Internal(format!("bad instant: {e}"))),
        }
    }
}
