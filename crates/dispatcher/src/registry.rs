//! The live worker streams of this node: who serves what, how many tasks
//! each has in flight, the channel to push to it, and — per handler — the
//! pool the balancer chooses from.
//!
//! Architecture invariant: the registry's in-flight sets are the dispatcher's
//! own count of pushes not yet finished; a slot is taken when a task is
//! claimed for a stream (inside the store's claim transaction) and given back
//! when the attempt ends for any reason. Every change to a session's figures
//! is mirrored into the pools of its handlers under the same lock. The lock
//! is a plain mutex, never held across an `.await`.

mod pool;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use taskmesh::v1 as pb;
use taskmesh_core::{TaskRecord, UnixMillis};
use tokio::sync::mpsc;

use crate::balancer::{BalancerOptions, Candidate, hash};
use pool::{Member, Pool};

/// A pool's key: the namespace and the handler (a stream serves a handler
/// for its own namespace only).
pub type PoolKey = (String, String);

fn key(namespace: &str, handler: &str) -> PoolKey {
    (namespace.to_string(), handler.to_string())
}

/// Messages queued to one worker stream, boxed: a channel allocates its
/// slots 32 at a time, and a `ConnectResponse` inline is 456 bytes (an
/// assignment's fields), so every stream held 14.25 KiB of slots from its
/// start (the first block is made with the channel); boxed, a slot is 16
/// bytes and a block 512 (checked below; docs/BENCHMARKS.md, #15 target 6).
pub type StreamItem = Result<Box<pb::ConnectResponse>, tonic::Status>;
const _: () = assert!(std::mem::size_of::<StreamItem>() <= 16);

/// The sending end of one worker stream's queue.
pub type StreamTx = mpsc::Sender<StreamItem>;

/// What a worker announced when it registered.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Session id chosen by the server.
    pub session_id: String,
    /// The worker's id.
    pub worker_id: String,
    /// The namespace whose tasks it runs.
    pub namespace: String,
    /// Who opened the session (`Identity::principal`): only the same
    /// identity may report on it, drain it or take it over.
    pub owner: String,
    /// Human-readable name.
    pub name: String,
    /// Handlers it serves.
    pub handlers: HashSet<String>,
    /// Slots.
    pub capacity: u32,
    /// Labels it carries.
    pub labels: BTreeMap<String, String>,
    /// Weight for WEIGHTED_ROUND_ROBIN (at least 1).
    pub weight: u32,
    /// Where to push.
    pub tx: StreamTx,
    /// When it registered.
    pub now: UnixMillis,
    /// True for a push worker (its `tx` feeds the push loop, not a stream).
    pub push: bool,
}

/// Figures from one heartbeat.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heartbeat {
    /// Tasks the worker says it runs.
    pub active: u32,
    /// CPU idle percentage.
    pub cpu_idle_percent: f64,
    /// Average cost of recent tasks in ms.
    pub avg_cost_ms: f64,
}

/// How a stream stands after an attempt on it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// It finished a task: it has room again (clears `busy`).
    Free,
    /// It answered BUSY: offer it nothing until a slot frees or a heartbeat
    /// shows room.
    Busy,
    /// The push could not be sent: the stream is closed or its queue full.
    Unsendable,
}

/// An attempt taken out of the registry: whose stream it was on.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The stream's session.
    pub session_id: String,
    /// Where to send a cancel, if needed.
    pub tx: StreamTx,
}

/// The stream chosen for a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// Its session.
    pub session_id: String,
    /// Its worker.
    pub worker_id: String,
}

/// The registry of live streams (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Session {
    reg: Registration,
    seq: u64,
    ring_id: u64,
    labels: Arc<BTreeMap<String, String>>,
    /// Attempts in flight: execution id → task id.
    in_flight: HashMap<String, String>,
    busy: bool,
    draining: bool,
    closed: bool,
    /// Reported active beyond our in-flight count at the last heartbeat.
    extra_active: u32,
    cpu_idle_percent: f64,
    avg_cost_ms: f64,
    last_seen: UnixMillis,
}

impl Session {
    fn free_slots(&self) -> u32 {
        if self.busy || self.draining || self.closed {
            return 0;
        }
        self.reg
            .capacity
            .saturating_sub(self.in_flight.len() as u32)
    }

    fn candidate(&self) -> Candidate {
        Candidate {
            seq: self.seq,
            ring_id: self.ring_id,
            open: self.free_slots() > 0,
            in_flight: self.in_flight.len() as u32,
            extra_active: self.extra_active,
            weight: self.reg.weight.max(1),
            cpu_idle_percent: self.cpu_idle_percent,
            avg_cost_ms: self.avg_cost_ms,
            load_milli: 0,
        }
        .update_load()
    }

    fn member(&self) -> Member {
        Member {
            session_id: Arc::from(self.reg.session_id.as_str()),
            labels: self.labels.clone(),
            tx: self.reg.tx.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    opts: BalancerOptions,
    sessions: HashMap<String, Session>,
    /// execution id → session id.
    owners: HashMap<String, String>,
    /// execution id → the broadcast task, for attempts of a broadcast's
    /// shards: a stream never holds two shards of one broadcast at once.
    shards: HashMap<String, String>,
    /// namespace → handler → the streams serving it (two levels, so a
    /// lookup from borrowed names allocates nothing: `reserve` runs per task).
    pools: HashMap<String, HashMap<String, Pool>>,
    next_seq: u64,
}

impl Inner {
    /// Mirrors a session's figures into the pools of its handlers.
    fn refresh(&mut self, session_id: &str) {
        let Some(s) = self.sessions.get(session_id) else {
            return;
        };
        let cand = s.candidate();
        let Some(pools) = self.pools.get_mut(&s.reg.namespace) else {
            return;
        };
        for h in &s.reg.handlers {
            if let Some(p) = pools.get_mut(h) {
                p.update(cand);
            }
        }
    }

    fn pool_mut(&mut self, namespace: &str, handler: &str) -> Option<&mut Pool> {
        self.pools.get_mut(namespace)?.get_mut(handler)
    }

    fn leave_pool(&mut self, namespace: &str, handler: &str, seq: u64) {
        let Some(pools) = self.pools.get_mut(namespace) else {
            return;
        };
        if let Some(p) = pools.get_mut(handler) {
            p.remove(seq);
            if p.is_empty() {
                pools.remove(handler);
            }
        }
        if pools.is_empty() {
            self.pools.remove(namespace);
        }
    }
}

impl Registry {
    /// An empty registry choosing by `opts`.
    pub fn new(opts: BalancerOptions) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                opts,
                ..Inner::default()
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Only plain maps live behind this lock; a panic elsewhere leaves
        // them consistent enough to go on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a stream.
    pub fn insert(&self, reg: Registration) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let seq = inner.next_seq;
        inner.next_seq += 1;
        let session = Session {
            seq,
            ring_id: hash::str64(&reg.worker_id),
            labels: Arc::new(reg.labels.clone()),
            in_flight: HashMap::new(),
            busy: false,
            draining: false,
            closed: false,
            extra_active: 0,
            cpu_idle_percent: 100.0,
            avg_cost_ms: 0.0,
            last_seen: reg.now,
            reg,
        };
        let (cand, member) = (session.candidate(), session.member());
        let vnodes = inner.opts.hash_vnodes;
        let pools = inner
            .pools
            .entry(session.reg.namespace.clone())
            .or_default();
        for h in &session.reg.handlers {
            pools
                .entry(h.clone())
                .or_insert_with(|| Pool::new(vnodes))
                .insert(member.clone(), cand);
        }
        inner
            .sessions
            .insert(session.reg.session_id.clone(), session);
    }

    /// Removes a stream, returning the execution ids it still had in flight.
    pub fn remove(&self, session_id: &str) -> Vec<String> {
        let mut inner = self.lock();
        let Some(session) = inner.sessions.remove(session_id) else {
            return Vec::new();
        };
        for h in &session.reg.handlers {
            inner.leave_pool(&session.reg.namespace, h, session.seq);
        }
        let execs: Vec<String> = session.in_flight.into_keys().collect();
        for e in &execs {
            inner.owners.remove(e);
            inner.shards.remove(e);
        }
        execs
    }

    /// Notes that the stream sent something.
    pub fn touch(&self, session_id: &str, now: UnixMillis) {
        if let Some(s) = self.lock().sessions.get_mut(session_id) {
            s.last_seen = now;
        }
    }

    /// Records a heartbeat; a busy stream whose worker shows room is offered
    /// tasks again. Figures out of range are clamped, NaN ignored.
    pub fn heartbeat(&self, session_id: &str, hb: Heartbeat) {
        let mut inner = self.lock();
        let Some(s) = inner.sessions.get_mut(session_id) else {
            return;
        };
        // Messages on a stream are ordered: every result the worker sent
        // before this heartbeat is already counted, so a figure above our
        // in-flight count is work we do not know of. Keeping only that
        // excess (not the raw figure) stops a stale heartbeat from making
        // an idle worker look busy until the next one.
        s.extra_active = hb.active.saturating_sub(s.in_flight.len() as u32);
        if hb.cpu_idle_percent.is_finite() {
            s.cpu_idle_percent = hb.cpu_idle_percent.clamp(0.0, 100.0);
        }
        if hb.avg_cost_ms.is_finite() {
            s.avg_cost_ms = hb.avg_cost_ms.clamp(0.0, 1e12);
        }
        if s.busy && hb.active < s.reg.capacity {
            s.busy = false;
        }
        inner.refresh(session_id);
    }

    /// Marks a stream draining: it gets no new tasks.
    pub fn set_draining(&self, session_id: &str) {
        let mut inner = self.lock();
        if let Some(s) = inner.sessions.get_mut(session_id) {
            s.draining = true;
            inner.refresh(session_id);
        }
    }

    /// Marks every session of `worker_id` in `namespace` draining: it gets
    /// no new task and finishes those it has. The worker is not told (the
    /// SDKs answer a server's drain by reconnecting, which would start a
    /// fresh session that takes tasks). Returns how many were found.
    pub fn drain_worker(&self, namespace: &str, worker_id: &str) -> usize {
        let mut inner = self.lock();
        let sessions: Vec<String> = inner
            .sessions
            .values()
            .filter(|s| s.reg.namespace == namespace && s.reg.worker_id == worker_id)
            .map(|s| s.reg.session_id.clone())
            .collect();
        for id in &sessions {
            let Some(s) = inner.sessions.get_mut(id) else {
                continue;
            };
            s.draining = true;
            inner.refresh(id);
        }
        sessions.len()
    }

    /// Who owns the sessions of `worker_id` on this node, if it has any.
    pub fn owner_of(&self, worker_id: &str) -> Option<String> {
        self.lock()
            .sessions
            .values()
            .find(|s| s.reg.worker_id == worker_id)
            .map(|s| s.reg.owner.clone())
    }

    /// Who opened session `session_id`, and in which namespace.
    pub fn session_owner(&self, session_id: &str) -> Option<(String, String)> {
        self.lock()
            .sessions
            .get(session_id)
            .map(|s| (s.reg.owner.clone(), s.reg.namespace.clone()))
    }

    /// How many of this node's streams belong to `worker_id`.
    pub fn streams_of(&self, worker_id: &str) -> usize {
        self.lock()
            .sessions
            .values()
            .filter(|s| s.reg.worker_id == worker_id)
            .count()
    }

    /// How many of this node's sessions are in `namespace`.
    pub fn sessions_in(&self, namespace: &str) -> usize {
        self.lock()
            .sessions
            .values()
            .filter(|s| s.reg.namespace == namespace)
            .count()
    }

    /// How many attempts the session holds; `None` if it is not here.
    pub fn in_flight_of(&self, session_id: &str) -> Option<usize> {
        self.lock()
            .sessions
            .get(session_id)
            .map(|s| s.in_flight.len())
    }

    /// Whether a stream announced a drain.
    pub fn is_draining(&self, session_id: &str) -> bool {
        self.lock()
            .sessions
            .get(session_id)
            .is_some_and(|s| s.draining)
    }

    /// Stops offering `handler` to a stream (it said it does not serve it).
    pub fn drop_handler(&self, session_id: &str, handler: &str) {
        let mut inner = self.lock();
        let Some(s) = inner.sessions.get_mut(session_id) else {
            return;
        };
        if s.reg.handlers.remove(handler) {
            let (seq, namespace) = (s.seq, s.reg.namespace.clone());
            inner.leave_pool(&namespace, handler, seq);
        }
    }

    /// The (namespace, handler) pairs some stream could take a task for
    /// now, with the total free slots across streams serving each.
    pub fn free_slots_by_handler(&self) -> BTreeMap<PoolKey, u32> {
        let inner = self.lock();
        let mut out = BTreeMap::new();
        for s in inner.sessions.values() {
            let free = s.free_slots();
            if free == 0 {
                continue;
            }
            for h in &s.reg.handlers {
                *out.entry(key(&s.reg.namespace, h)).or_insert(0) += free;
            }
        }
        out
    }

    /// Chooses a stream for `task` — by the task's own strategy, else the
    /// one configured for its handler — among those serving the handler
    /// with a free slot and every label the task requires, and takes one of
    /// its slots for `execution_id`. A stream found closed or with a full
    /// queue is marked so and the next candidate is chosen.
    pub fn reserve(&self, task: &TaskRecord, execution_id: &str) -> Option<Reserved> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let strategy = task
            .balancer
            .unwrap_or_else(|| inner.opts.strategy_for(&task.handler));
        let ring_key = hash::routing_key(&task.routing_key, &task.id);
        // A shard of a broadcast goes to a worker (any of its streams on
        // this node) not running one of its siblings, so each worker runs
        // one shard; with none free the shard waits for the next (a
        // sibling's end frees one).
        let broadcast = task.shard.and(task.parent_task_id.as_ref());
        let avoid: HashSet<Arc<str>> = match broadcast {
            None => HashSet::new(),
            Some(parent) => {
                let busy: HashSet<&str> = inner
                    .shards
                    .iter()
                    .filter(|(_, p)| *p == parent)
                    .filter_map(|(e, _)| inner.sessions.get(inner.owners.get(e)?))
                    .map(|s| s.reg.worker_id.as_str())
                    .collect();
                inner
                    .sessions
                    .iter()
                    .filter(|(_, s)| busy.contains(s.reg.worker_id.as_str()))
                    .map(|(id, _)| Arc::from(id.as_str()))
                    .collect()
            }
        };
        loop {
            let pool = inner.pool_mut(&task.namespace, &task.handler)?;
            let i = pool.choose(strategy, &task.labels, &avoid, ring_key)?;
            let member = pool.member(i)?;
            let session_id = member.session_id.to_string();
            let (closed, full) = (member.tx.is_closed(), member.tx.capacity() == 0);
            let session = inner.sessions.get_mut(&session_id)?;
            if closed || full {
                // Each pass turns one open candidate unusable: this ends.
                session.closed |= closed;
                session.busy |= full;
                inner.refresh(&session_id);
                continue;
            }
            session
                .in_flight
                .insert(execution_id.to_string(), task.id.clone());
            let worker_id = session.reg.worker_id.clone();
            inner
                .owners
                .insert(execution_id.to_string(), session_id.clone());
            if let Some(parent) = broadcast {
                inner
                    .shards
                    .insert(execution_id.to_string(), parent.clone());
            }
            inner.refresh(&session_id);
            return Some(Reserved {
                session_id,
                worker_id,
            });
        }
    }

    /// Gives back the slot of an attempt that ended; `None` if no stream of
    /// this node holds it.
    pub fn finish(&self, execution_id: &str) -> Option<Ended> {
        self.finish_with(execution_id, After::Free)
    }

    /// Gives back the slot of an attempt and sets the stream's standing in
    /// the same step, so the engine never sees a BUSY stream as free.
    pub fn finish_with(&self, execution_id: &str, after: After) -> Option<Ended> {
        let mut inner = self.lock();
        let session_id = inner.owners.remove(execution_id)?;
        inner.shards.remove(execution_id);
        let session = inner.sessions.get_mut(&session_id)?;
        session.in_flight.remove(execution_id);
        match after {
            After::Free => session.busy = false,
            After::Busy => session.busy = true,
            After::Unsendable => {
                if session.reg.tx.is_closed() {
                    session.closed = true;
                } else {
                    session.busy = true;
                }
            }
        }
        let tx = session.reg.tx.clone();
        inner.refresh(&session_id);
        Some(Ended { session_id, tx })
    }

    /// The attempt of task `task_id` that a stream of this node holds, if
    /// any (a scan of the attempts in flight: for cancels, which are rare).
    pub fn execution_of_task(&self, task_id: &str) -> Option<String> {
        let inner = self.lock();
        inner.sessions.values().find_map(|s| {
            s.in_flight
                .iter()
                .find(|(_, t)| t.as_str() == task_id)
                .map(|(e, _)| e.clone())
        })
    }

    /// The sender of the stream that holds `execution_id`.
    pub fn sender_of(&self, execution_id: &str) -> Option<StreamTx> {
        let inner = self.lock();
        let session_id = inner.owners.get(execution_id)?;
        inner.sessions.get(session_id).map(|s| s.reg.tx.clone())
    }

    /// Whether `execution_id` is held by the stream `session_id`.
    pub fn holds(&self, session_id: &str, execution_id: &str) -> bool {
        self.lock().owners.get(execution_id).map(String::as_str) == Some(session_id)
    }

    /// A snapshot for `ListWorkers` (of `namespace`, or all), in join order.
    pub fn snapshot(&self, node_id: &str, namespace: Option<&str>) -> Vec<pb::WorkerInfo> {
        let inner = self.lock();
        let mut sessions: Vec<&Session> = inner
            .sessions
            .values()
            .filter(|s| namespace.is_none_or(|ns| s.reg.namespace == ns))
            .collect();
        sessions.sort_by_key(|s| s.seq);
        sessions
            .into_iter()
            .map(|s| {
                let mut handlers: Vec<String> = s.reg.handlers.iter().cloned().collect();
                handlers.sort();
                pb::WorkerInfo {
                    worker_id: s.reg.worker_id.clone(),
                    name: s.reg.name.clone(),
                    handlers,
                    capacity: s.reg.capacity,
                    // The larger of our count and the worker's own figure.
                    active: s.in_flight.len() as u32 + s.extra_active,
                    labels: s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    weight: s.reg.weight,
                    cpu_idle_percent: s.cpu_idle_percent,
                    avg_cost_ms: s.avg_cost_ms,
                    last_seen_time: Some(crate::convert::timestamp(s.last_seen)),
                    draining: s.draining,
                    session_id: s.reg.session_id.clone(),
                    node_id: node_id.to_string(),
                    namespace: s.reg.namespace.clone(),
                    mode: worker_mode(s.reg.push).into(),
                }
            })
            .collect()
    }

    /// Every stream's sender (for a drain on shutdown).
    pub fn senders(&self) -> Vec<StreamTx> {
        self.lock()
            .sessions
            .values()
            .map(|s| s.reg.tx.clone())
            .collect()
    }
}

/// The wire mode of a worker registered as push (or not).
pub fn worker_mode(push: bool) -> pb::WorkerMode {
    if push {
        pb::WorkerMode::Push
    } else {
        pb::WorkerMode::Stream
    }
}

#[cfg(test)]
mod tests;
