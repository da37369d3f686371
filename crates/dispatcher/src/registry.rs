//! The live worker streams of this node: who serves what, how many tasks
//! each has in flight, and the channel to push to it.
//!
//! Architecture invariant: the registry's in-flight sets are the dispatcher's
//! own count of pushes not yet finished; a slot is taken when a task is
//! claimed for a stream (inside the store's claim transaction) and given back
//! when the attempt ends for any reason. It is guarded by a plain mutex and
//! never held across an `.await`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use taskmesh::v1 as pb;
use taskmesh_core::{TaskRecord, UnixMillis};
use tokio::sync::mpsc;

use crate::balancer::{Candidate, least_active};

/// Messages queued to one worker stream.
pub type StreamTx = mpsc::Sender<Result<pb::ConnectResponse, tonic::Status>>;

/// One registered stream.
#[derive(Debug)]
pub struct Session {
    /// Session id.
    pub session_id: String,
    /// The worker's id.
    pub worker_id: String,
    /// Human-readable name.
    pub name: String,
    /// Handlers it serves.
    pub handlers: HashSet<String>,
    /// Slots.
    pub capacity: u32,
    /// Labels it carries.
    pub labels: BTreeMap<String, String>,
    /// Weight.
    pub weight: u32,
    /// Where to push.
    pub tx: StreamTx,
    /// Execution ids pushed to it and not yet ended.
    pub in_flight: HashSet<String>,
    /// Set after a BUSY reject: no pushes until one of its tasks ends or it
    /// heartbeats, so a busy worker is not hammered.
    pub busy: bool,
    /// Set after the worker announced a drain.
    pub draining: bool,
    /// Latest heartbeat figures.
    pub cpu_idle_percent: f64,
    /// Latest heartbeat figures.
    pub avg_cost_ms: f64,
    /// When it last sent anything.
    pub last_seen: UnixMillis,
}

impl Session {
    fn free_slots(&self) -> u32 {
        if self.busy || self.draining {
            return 0;
        }
        self.capacity.saturating_sub(self.in_flight.len() as u32)
    }

    fn eligible(&self, task: &TaskRecord) -> bool {
        self.free_slots() > 0
            && self.handlers.contains(&task.handler)
            && task
                .labels
                .iter()
                .all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// An attempt taken out of the registry: whose stream it was on.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The stream's session.
    pub session_id: String,
    /// Where to send a cancel, if needed.
    pub tx: StreamTx,
}

/// The registry of live streams (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: BTreeMap<String, Session>,
    /// execution id → session id.
    owners: HashMap<String, String>,
    cursor: usize,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Only plain maps live behind this lock; a panic elsewhere leaves
        // them consistent enough to go on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a stream.
    pub fn insert(&self, session: Session) {
        self.lock()
            .sessions
            .insert(session.session_id.clone(), session);
    }

    /// Removes a stream, returning the execution ids it still had in flight.
    pub fn remove(&self, session_id: &str) -> Vec<String> {
        let mut inner = self.lock();
        let Some(session) = inner.sessions.remove(session_id) else {
            return Vec::new();
        };
        let execs: Vec<String> = session.in_flight.into_iter().collect();
        for e in &execs {
            inner.owners.remove(e);
        }
        execs
    }

    /// Runs `f` on a session, if it is still registered.
    pub fn with_session<R>(
        &self,
        session_id: &str,
        f: impl FnOnce(&mut Session) -> R,
    ) -> Option<R> {
        self.lock().sessions.get_mut(session_id).map(f)
    }

    /// Handlers that some stream could take a task for now, with the total
    /// free slots across streams serving each.
    pub fn free_slots_by_handler(&self) -> BTreeMap<String, u32> {
        let inner = self.lock();
        let mut out = BTreeMap::new();
        for s in inner.sessions.values() {
            let free = s.free_slots();
            if free == 0 {
                continue;
            }
            for h in &s.handlers {
                *out.entry(h.clone()).or_insert(0) += free;
            }
        }
        out
    }

    /// Chooses a stream for `task` by least-active and takes one of its slots
    /// for `execution_id`. Returns the session id and worker id.
    pub fn reserve(&self, task: &TaskRecord, execution_id: &str) -> Option<(String, String)> {
        let mut inner = self.lock();
        let eligible: Vec<&Session> = inner
            .sessions
            .values()
            .filter(|s| s.eligible(task))
            .collect();
        let cands: Vec<Candidate> = eligible
            .iter()
            .enumerate()
            .map(|(index, s)| Candidate {
                index,
                active: s.in_flight.len() as u32,
            })
            .collect();
        let pick = least_active(&cands, inner.cursor)?;
        let session_id = eligible[pick].session_id.clone();
        inner.cursor = inner.cursor.wrapping_add(1);
        let session = inner.sessions.get_mut(&session_id)?;
        session.in_flight.insert(execution_id.to_string());
        let worker_id = session.worker_id.clone();
        inner
            .owners
            .insert(execution_id.to_string(), session_id.clone());
        Some((session_id, worker_id))
    }

    /// Gives back the slot of an attempt that ended; `None` if no stream of
    /// this node holds it.
    pub fn finish(&self, execution_id: &str) -> Option<Ended> {
        let mut inner = self.lock();
        let session_id = inner.owners.remove(execution_id)?;
        let session = inner.sessions.get_mut(&session_id)?;
        session.in_flight.remove(execution_id);
        session.busy = false;
        Some(Ended {
            session_id,
            tx: session.tx.clone(),
        })
    }

    /// The sender of the stream that holds `execution_id`.
    pub fn sender_of(&self, execution_id: &str) -> Option<StreamTx> {
        let inner = self.lock();
        let session_id = inner.owners.get(execution_id)?;
        inner.sessions.get(session_id).map(|s| s.tx.clone())
    }

    /// Whether `execution_id` is held by the stream `session_id`.
    pub fn holds(&self, session_id: &str, execution_id: &str) -> bool {
        self.lock().owners.get(execution_id).map(String::as_str) == Some(session_id)
    }

    /// A snapshot for `ListWorkers`.
    pub fn snapshot(&self, node_id: &str) -> Vec<pb::WorkerInfo> {
        let inner = self.lock();
        inner
            .sessions
            .values()
            .map(|s| {
                let mut handlers: Vec<String> = s.handlers.iter().cloned().collect();
                handlers.sort();
                pb::WorkerInfo {
                    worker_id: s.worker_id.clone(),
                    name: s.name.clone(),
                    handlers,
                    capacity: s.capacity,
                    active: s.in_flight.len() as u32,
                    labels: s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    weight: s.weight,
                    cpu_idle_percent: s.cpu_idle_percent,
                    avg_cost_ms: s.avg_cost_ms,
                    last_seen_time: Some(crate::convert::timestamp(s.last_seen)),
                    draining: s.draining,
                    session_id: s.session_id.clone(),
                    node_id: node_id.to_string(),
                }
            })
            .collect()
    }

    /// Every stream's sender (for a drain on shutdown).
    pub fn senders(&self) -> Vec<StreamTx> {
        self.lock()
            .sessions
            .values()
            .map(|s| s.tx.clone())
            .collect()
    }
}
