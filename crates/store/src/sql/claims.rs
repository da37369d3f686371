//! Claims: READY candidates of one handler read in index order (highest
//! priority first, FIFO within a priority) with the dialect's
//! `{skip_locked}`, the chooser asked for each, and the claimed tasks
//! written as one [`Batch`], all in one transaction.
//!
//! Where rows are locked (Postgres, MySQL), `SKIP LOCKED` is what lets
//! replicas claim at once: a candidate another claim holds is passed over
//! instead of waited for, and a row another claim moved out of READY and
//! committed no longer matches, so no task is claimed twice and no claimer
//! waits. The price: a claim may come back short while another holds the
//! remaining READY rows; the next wake-up finds whatever it left. SQLite
//! has one writer, so nothing is held.
//!
//! The first read is `limit` rows (enough when the chooser takes them all,
//! the usual case); each further read continues after the last row seen
//! (a keyset on priority and id) with twice as many, up to
//! [`claim_scan`](crate::claim_scan)`(limit)` candidates in all, so a task
//! no stream can take does not block the ones behind it.
//!
//! Concurrency keys: the first candidate of a key met in a claim locks the
//! key's `concurrency_keys` row (`SKIP LOCKED`: a key another claim holds
//! has no room in this one, and no claim ever waits for another) and counts
//! the key's DISPATCHING and RUNNING tasks; a candidate is offered only
//! while that count, with the claim's own picks, is below its limit. The
//! lock is held to the commit, so two claims never count one key at once;
//! a task of a key leaves DISPATCHING or RUNNING only by a transition,
//! which the count sees once committed. A candidate held back by its key
//! uses a budget of its own (as many again as the scan), and the reads
//! after it leave out the keys found full (up to [`LADDER`]`[0]` of them),
//! so a long queue of one key does not hide the tasks of others behind it.
//! A key held by another claim counts as full in this one.
//!
//! Round robin among waiting keys: a first pass takes at most one task of
//! each key (a key it already took is passed over, and left out of its
//! next reads as a full one is), so a key's long queue does not take a
//! claim's whole room; when it passed some over and room is left, a
//! second pass from the start fills it in index order (the first pass's
//! picks, still READY until the batch is written, are skipped by id).
//! Tasks without a key are taken in index order in both. A claim without
//! keyed candidates runs one pass, as before; one with them may read up to
//! twice the scan (each pass has the budgets above). The rotation is per
//! claim: each claim starts again from each key's oldest task.

use std::collections::{HashMap, HashSet};

use taskmesh_core::{Concurrency, Event, TaskRecord, UnixMillis};

use super::backend::Backend;
use super::batch::Batch;
use super::dialect::{LADDER, in_lists};
use super::tasks::sql_limit;
use super::{SqlStore, Val, args};
use crate::{Chooser, Error, Result, decode};

/// What a claim knows of the concurrency keys it met: how many of each
/// key's tasks are in flight (its own picks included), `None` for a key
/// another claim holds.
#[derive(Default)]
struct Keys {
    in_flight: HashMap<String, Option<u32>>,
    /// Keys found full, in the order found: the next reads leave them out.
    full: Vec<String>,
    /// Keys this claim took a task of, in the order taken: the first pass
    /// takes one task per key, and its next reads leave them out.
    picked: Vec<String>,
    /// The same keys, to look up.
    picked_set: HashSet<String>,
}

impl Keys {
    /// Whether a task of `c` may be offered now, reading the key's count
    /// (and taking its lock) the first time the claim meets it.
    async fn has_room<B: Backend>(
        &mut self,
        b: &B,
        tx: &mut B::Tx,
        namespace: &str,
        c: &Concurrency,
    ) -> Result<bool> {
        let n = match self.in_flight.get(&c.key) {
            Some(n) => *n,
            None => {
                let n = in_flight_of(b, tx, namespace, &c.key).await?;
                self.in_flight.insert(c.key.clone(), n);
                n
            }
        };
        let room = n.is_some_and(|n| n < c.limit);
        if !room && self.full.len() < LADDER[0] && !self.full.contains(&c.key) {
            self.full.push(c.key.clone());
        }
        Ok(room)
    }

    /// A task of `c` was claimed.
    fn took(&mut self, c: &Concurrency) {
        if let Some(Some(n)) = self.in_flight.get_mut(&c.key) {
            *n += 1;
        }
        if self.picked_set.insert(c.key.clone()) {
            self.picked.push(c.key.clone());
        }
    }

    /// The keys the next read leaves out: the full ones, and in the first
    /// pass those already picked (at most the ladder's largest size; a
    /// task of a key past it is read and passed over here instead).
    fn left_out(&self, one_each: bool) -> Vec<String> {
        let picked = self.picked.iter().filter(|_| one_each);
        let mut out: Vec<String> = Vec::new();
        for k in self.full.iter().chain(picked) {
            if out.len() == LADDER[0] {
                break;
            }
            if !out.contains(k) {
                out.push(k.clone());
            }
        }
        out
    }
}

/// Locks `key`'s row and counts its tasks in flight; `None` when another
/// transaction holds the row (a claim, or a create of the key's tasks on
/// MySQL). A row that is truly missing is made first; one that exists is
/// never written here (on MySQL the insert that ignores a duplicate locks
/// it, and would wait for the claim holding it).
async fn in_flight_of<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    namespace: &str,
    key: &str,
) -> Result<Option<u32>> {
    let sql = b.sql();
    let locked = b
        .fetch(tx, &sql.lock_concurrency_key, args![namespace, key])
        .await?;
    if locked.is_empty() {
        let exists = !b
            .fetch(tx, &sql.concurrency_key_exists, args![namespace, key])
            .await?
            .is_empty();
        if exists {
            return Ok(None);
        }
        let insert = sql.insert_concurrency_keys.get(1);
        b.exec(tx, insert, args![namespace, key]).await?;
        let locked = b
            .fetch(tx, &sql.lock_concurrency_key, args![namespace, key])
            .await?;
        if locked.is_empty() {
            return Ok(None);
        }
    }
    let rows = b
        .fetch(tx, &sql.in_flight_of_key, args![namespace, key])
        .await?;
    let n = match rows.first() {
        Some(row) => decode::Columns::int(row, "n")
            .map_err(|e| Error::Internal(format!("bad count of key {key:?}: {e}")))?,
        None => 0,
    };
    Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)))
}

impl<B: Backend> SqlStore<B> {
    /// `Store::claim_ready`; see the module comment.
    pub(super) async fn claim(
        &self,
        namespace: &str,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let b = self.backend();
        let sql = b.sql();
        let scan = crate::claim_scan(limit);
        let mut tx = b.begin_write().await?;
        let mut batch = Batch::default();
        let mut claimed = 0usize;
        let mut keys = Keys::default();
        // Round robin among keys: the first pass takes one task per key
        // (a key already picked is passed over, and left out of the next
        // reads); when it passed some over and room is left, a second pass
        // from the start fills it in index order. Tasks without a key are
        // taken in both, in index order.
        let mut one_each = true;
        // Whether the first pass passed over a picked key's task, or read
        // past one with the key left out: the second pass is due then.
        let mut passed_over = false;
        loop {
            let mut seen = 0usize;
            let mut cursor: Option<(i32, String)> = None;
            let mut want = limit - claimed;
            // Candidates held back by their key: as many again as the scan.
            let mut held = 0usize;
            'scan: while claimed < limit && seen < scan {
                let take = want.min(scan - seen);
                let except = keys.left_out(one_each);
                passed_over |= one_each && cursor.is_some() && !keys.picked.is_empty();
                let rows = match &cursor {
                    None => {
                        b.fetch(
                            &mut tx,
                            &sql.claim_first,
                            args![namespace, handler, sql_limit(take)],
                        )
                        .await?
                    }
                    Some((priority, id)) if except.is_empty() => {
                        let values = args![
                            namespace,
                            handler,
                            *priority,
                            *priority,
                            id,
                            sql_limit(take)
                        ];
                        b.fetch(&mut tx, &sql.claim_after, values).await?
                    }
                    Some((priority, id)) => {
                        // One list: `except` holds at most the ladder's
                        // largest size; padded to a ladder size.
                        let except = in_lists(&except).swap_remove(0);
                        let n = except.len();
                        let mut values = args![namespace, handler, *priority, *priority, id];
                        values.extend(except.into_iter().map(Val::from));
                        values.push(sql_limit(take).into());
                        b.fetch(&mut tx, sql.claim_after_except.get(n), values)
                            .await?
                    }
                };
                let exhausted = rows.len() < take;
                for row in &rows {
                    let task = decode::task(row)?;
                    cursor = Some((task.priority, task.id.clone()));
                    if claimed == limit {
                        break 'scan;
                    }
                    // The second pass reads the first's picks again.
                    if !one_each && batch.current(&task.id).is_some() {
                        continue;
                    }
                    if let Some(c) = &task.concurrency {
                        // Passed over (first pass) or held back by its
                        // key: counted against a budget of their own.
                        let again = one_each && keys.picked_set.contains(&c.key);
                        passed_over |= again;
                        if again || !keys.has_room(b, &mut tx, namespace, c).await? {
                            held += 1;
                            if held == scan {
                                break 'scan;
                            }
                            continue;
                        }
                    }
                    seen += 1;
                    let Some(claim) = chooser(&task) else {
                        continue;
                    };
                    let event = Event::from(claim);
                    match batch.apply(&task, &event, now) {
                        Ok(_) => {
                            claimed += 1;
                            if let Some(c) = &task.concurrency {
                                keys.took(c);
                            }
                        }
                        Err(err) => {
                            tracing::warn!(task_id = %task.id, error = %err, "READY task refused dispatch");
                        }
                    }
                }
                if exhausted {
                    break;
                }
                want = want.saturating_mul(2);
            }
            if !(one_each && passed_over && claimed < limit) {
                break;
            }
            one_each = false;
        }
        if batch.is_empty() {
            b.commit(tx).await?;
            return Ok(Vec::new());
        }
        // A claim that cannot be written fails whole: the tasks stay READY.
        // Its rows are locked (or the writer is single), so a missed
        // compare-and-set here is a bug, never a race.
        if !b.write_batch(&mut tx, &batch).await?.is_empty() {
            return Err(Error::Internal(format!(
                "claim of {claimed} {handler} tasks could not be written"
            )));
        }
        let changes = std::mem::take(&mut batch.changes);
        let mut tasks = batch.into_tasks();
        super::workflows::fill_parent_outputs(b, &mut tx, &mut tasks).await?;
        b.commit(tx).await?;
        self.publish(&changes, &[]);
        Ok(tasks)
    }
}
