//! Change notifications between processes: the NOTIFY payloads (sent by
//! `super::outbox` after the commits), and the LISTEN task that relays
//! other processes' changes to this store's subscribers.
//!
//! A payload is text, under Postgres's 8000-byte limit: the sending store's
//! origin id on the first line, then one line per change,
//! `t<TAB>task_id<TAB>state<TAB>version<TAB>next_at` or
//! `s<TAB>schedule_id<TAB>next_fire_at` (empty for none), ids escaped so
//! they cannot break the format. A store skips payloads of its own origin:
//! it published those itself right after the commit.
//!
//! Notifications are wake-ups, not a log: one lost (a lost connection, a
//! record too long to send) is reported to subscribers as a resync (see
//! [`lag`]), and consumers re-read the store.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use taskmesh_core::TaskState;
use tokio::sync::broadcast;

use super::{CHANGE_CAPACITY, Shared};
use crate::{Result, ScheduleChange, TaskChange};

/// Payloads stay under this many bytes (Postgres refuses 8000 and more).
const MAX_PAYLOAD: usize = 7_900;

/// The line that stands for changes too long to send: receivers resync.
const LAG_LINE: &str = "l";

/// The NOTIFY channel of a schema (Postgres channels are per database, so
/// stores in different schemas of one database must not share one).
pub(super) fn channel_name(schema: Option<&str>) -> String {
    match schema {
        None => "taskmesh".to_string(),
        Some(schema) => format!("taskmesh_{schema}"),
    }
}

/// Builds the payloads of one commit.
pub(super) struct Payloads<'a> {
    origin: &'a str,
    done: Vec<String>,
    current: String,
}

impl<'a> Payloads<'a> {
    pub(super) fn new(origin: &'a str) -> Self {
        Self {
            origin,
            done: Vec::new(),
            current: String::new(),
        }
    }

    pub(super) fn task(&mut self, c: &TaskChange) {
        let next = c.next_at.map(|n| n.to_string()).unwrap_or_default();
        let line = format!(
            "t\t{}\t{}\t{}\t{next}",
            escape(&c.task_id),
            c.state.as_str(),
            c.version
        );
        self.line(line);
    }

    pub(super) fn schedule(&mut self, c: &ScheduleChange) {
        let next = c.next_fire_at.map(|n| n.to_string()).unwrap_or_default();
        self.line(format!("s\t{}\t{next}", escape(&c.schedule_id)));
    }

    fn line(&mut self, line: String) {
        let line = if self.origin.len() + 1 + line.len() > MAX_PAYLOAD {
            LAG_LINE.to_string()
        } else {
            line
        };
        if !self.current.is_empty() && self.current.len() + 1 + line.len() > MAX_PAYLOAD {
            self.done.push(std::mem::take(&mut self.current));
        }
        if self.current.is_empty() {
            self.current.push_str(self.origin);
        }
        self.current.push('\n');
        self.current.push_str(&line);
    }

    /// The payloads, each under the limit; none for no change.
    pub(super) fn finish(mut self) -> Vec<String> {
        if !self.current.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

/// The payloads announcing `tasks` and `schedules`.
pub(super) fn payloads<'t, 's>(
    origin: &str,
    tasks: impl IntoIterator<Item = &'t TaskChange>,
    schedules: impl IntoIterator<Item = &'s ScheduleChange>,
) -> Vec<String> {
    let mut p = Payloads::new(origin);
    for c in tasks {
        p.task(c);
    }
    for c in schedules {
        p.schedule(c);
    }
    p.finish()
}

/// A payload that only tells listeners to resync.
pub(super) fn resync_payload(origin: &str) -> String {
    format!("{origin}\n{LAG_LINE}")
}

/// What one payload announces.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Decoded {
    pub(super) tasks: Vec<TaskChange>,
    pub(super) schedules: Vec<ScheduleChange>,
    /// Something could not be sent or read: subscribers must resync.
    pub(super) lag: bool,
}

/// Reads a payload; `None` when it is `own_origin`'s.
pub(super) fn decode(payload: &str, own_origin: &str) -> Option<Decoded> {
    let mut lines = payload.split('\n');
    if lines.next()? == own_origin {
        return None;
    }
    let mut out = Decoded::default();
    for line in lines {
        match decode_line(line) {
            Some(Line::Task(c)) => out.tasks.push(c),
            Some(Line::Schedule(c)) => out.schedules.push(c),
            None => {
                if line != LAG_LINE {
                    tracing::warn!(line, "unreadable change notification; resyncing");
                }
                out.lag = true;
            }
        }
    }
    Some(out)
}

enum Line {
    Task(TaskChange),
    Schedule(ScheduleChange),
}

fn decode_line(line: &str) -> Option<Line> {
    let fields: Vec<&str> = line.split('\t').collect();
    let millis = |s: &str| -> Option<Option<i64>> {
        if s.is_empty() {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    match fields.as_slice() {
        ["t", id, state, version, next] => Some(Line::Task(TaskChange {
            task_id: unescape(id)?,
            state: TaskState::parse(state)?,
            version: version.parse().ok()?,
            next_at: millis(next)?,
        })),
        ["s", id, next] => Some(Line::Schedule(ScheduleChange {
            schedule_id: unescape(id)?,
            next_fire_at: millis(next)?,
        })),
        _ => None,
    }
}

fn escape(id: &str) -> String {
    if !id.contains(['%', '\t', '\n']) {
        return id.to_string();
    }
    id.replace('%', "%25")
        .replace('\t', "%09")
        .replace('\n', "%0A")
}

fn unescape(id: &str) -> Option<String> {
    if !id.contains('%') {
        return Some(id.to_string());
    }
    let mut out = String::with_capacity(id.len());
    let mut rest = id;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "09" => '\t',
            "0A" => '\n',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Tells every subscriber of `shared` that changes may have been missed:
/// a burst of resync markers one longer than the channel, so a receiver
/// that is not reading at this very moment gets `Lagged` (the signal every
/// consumer already re-reads on), and one that keeps up reads markers
/// ([`TaskChange::is_resync`]) that say the same.
pub(super) fn lag(shared: &Shared) {
    burst(&shared.changes, TaskChange::resync());
    burst(&shared.schedule_changes, ScheduleChange::resync());
}

fn burst<T: Clone>(tx: &broadcast::Sender<T>, marker: T) {
    if tx.receiver_count() == 0 {
        return;
    }
    for _ in 0..=CHANGE_CAPACITY {
        let _ = tx.send(marker.clone());
    }
}

/// Relays one payload to the subscribers of `shared`.
fn relay(shared: &Shared, payload: &str) {
    let Some(decoded) = decode(payload, &shared.origin) else {
        return;
    };
    if decoded.lag {
        lag(shared);
    }
    for c in decoded.tasks {
        let _ = shared.changes.send(c);
    }
    for c in decoded.schedules {
        let _ = shared.schedule_changes.send(c);
    }
}

/// Connects the LISTEN connection (on a pool of its own, so it never takes
/// a connection callers need) and spawns the task relaying notifications
/// until the store is dropped.
pub(super) async fn start_listener(
    connect: PgConnectOptions,
    channel: String,
    shared: &Arc<Shared>,
) -> Result<tokio::task::AbortHandle> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(connect.application_name("taskmesh-listener"));
    let listener = listen(&pool, &channel, shared).await?;
    let task = tokio::spawn(run(pool, channel, listener, Arc::downgrade(shared)));
    Ok(task.abort_handle())
}

async fn listen(pool: &PgPool, channel: &str, shared: &Shared) -> Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is rebuilt here (see `run`), not inside sqlx, so
    // this task knows when it happened.
    listener.eager_reconnect(false);
    listener.listen(channel).await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut listener)
        .await?;
    shared
        .listener_pid
        .store(u32::try_from(pid).unwrap_or(0), Ordering::SeqCst);
    Ok(listener)
}

/// Relays notifications; on a lost connection, reconnects (backing off up
/// to 5 s) and then tells subscribers to resync, because whatever was
/// committed meanwhile was announced to nobody here.
async fn run(pool: PgPool, channel: String, mut listener: PgListener, shared: Weak<Shared>) {
    loop {
        let error = match listener.try_recv().await {
            Ok(Some(notification)) => {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                relay(&shared, notification.payload());
                continue;
            }
            Ok(None) => "connection lost".to_string(),
            Err(err) => err.to_string(),
        };
        let Some(strong) = shared.upgrade() else {
            return;
        };
        strong.listener_pid.store(0, Ordering::SeqCst);
        drop(strong);
        tracing::warn!(error = %error, channel = %channel, "lost the change notification connection; reconnecting");
        drop(listener);
        let mut backoff = Duration::from_millis(100);
        listener = loop {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            match listen(&pool, &channel, &strong).await {
                Ok(l) => break l,
                Err(err) => {
                    drop(strong);
                    tracing::warn!(error = %err, channel = %channel, "cannot listen for changes yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        };
        let Some(strong) = shared.upgrade() else {
            return;
        };
        tracing::info!(channel = %channel, "listening for changes again; subscribers resync");
        lag(&strong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(id: &str, next_at: Option<i64>) -> TaskChange {
        TaskChange {
            task_id: id.into(),
            state: TaskState::Ready,
            version: 7,
            next_at,
        }
    }

    #[test]
    fn payloads_round_trip_and_stay_under_the_limit() {
        let tasks: Vec<TaskChange> = (0..500)
            .map(|i| change(&format!("task-{i:05}-0123456789abcdef"), Some(i)))
            .collect();
        let schedules = vec![
            ScheduleChange {
                schedule_id: "odd\tid\nwith%".into(),
                next_fire_at: None,
            },
            ScheduleChange {
                schedule_id: "plain".into(),
                next_fire_at: Some(42),
            },
        ];
        let out = payloads("origin-a", &tasks, &schedules);
        assert!(out.len() > 1, "500 changes do not fit one payload");
        let mut got = Decoded::default();
        for p in &out {
            assert!(p.len() < 8_000, "payload of {} bytes", p.len());
            assert!(decode(p, "origin-a").is_none(), "own payloads are skipped");
            let d = decode(p, "origin-b").expect("decoded");
            got.tasks.extend(d.tasks);
            got.schedules.extend(d.schedules);
            assert!(!d.lag);
        }
        assert_eq!(got.tasks, tasks);
        assert_eq!(got.schedules, schedules);
        assert!(payloads("o", &[], &[]).is_empty());
    }

    #[test]
    fn oversized_and_garbled_lines_become_a_resync() {
        let huge = change(&"x".repeat(9_000), None);
        let out = payloads("o", [&huge, &change("small", None)], &[]);
        let d = decode(&out[0], "other").expect("decoded");
        assert!(d.lag);
        assert_eq!(d.tasks, [change("small", None)]);
        for garbled in [
            "o\nt\tid\tNOPE\t1\t",
            "o\nt\tid\tREADY\tx\t",
            "o\nq",
            "o\ns\tbad%zz\t",
        ] {
            let d = decode(garbled, "other").expect("decoded");
            assert!(
                d.lag && d.tasks.is_empty() && d.schedules.is_empty(),
                "{garbled}"
            );
        }
    }
}
