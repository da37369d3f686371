//! The cluster-wide worker registry on Redis: one JSON string per worker
//! stream with a TTL (`worker:{session_id}`) plus an index set (`workers`).
//!
//! The entry's TTL, refreshed by every put, is what removes the streams of a
//! replica that died without saying so; the index is cleaned lazily, inside
//! the listing script, so a stale member and a concurrent re-put cannot race
//! (a put between a client-side "missing" and its `SREM` would otherwise
//! drop a live stream from the index).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::RedisCoordinator;
use crate::{Error, Result, WorkerEntry, WorkerLoad};

/// Every live entry; index members whose entry expired are removed.
/// KEYS: index. ARGV: entry key prefix.
pub(super) const LIST_LUA: &str = r"
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('GET', ARGV[1] .. id)
  if v then
    out[#out + 1] = v
  else
    redis.call('SREM', KEYS[1], id)
  end
end
return out
";

/// The stored form of a [`WorkerEntry`]: its own type so the public struct
/// can change without breaking what other replicas (maybe a version
/// behind) read; unknown fields are ignored and missing ones defaulted.
#[derive(Debug, Serialize, Deserialize)]
#[serde(default)]
struct Stored {
    session_id: String,
    worker_id: String,
    namespace: String,
    owner: String,
    name: String,
    node_id: String,
    handlers: Vec<String>,
    capacity: u32,
    labels: BTreeMap<String, String>,
    weight: u32,
    active: u32,
    cpu_idle_percent: f64,
    avg_cost_ms: f64,
    last_seen: i64,
    draining: bool,
    push: bool,
}

impl Default for Stored {
    fn default() -> Self {
        Self {
            session_id: String::new(),
            worker_id: String::new(),
            // An entry written before namespaces: the one namespace there was.
            namespace: "default".into(),
            owner: String::new(),
            name: String::new(),
            node_id: String::new(),
            handlers: Vec::new(),
            capacity: 0,
            labels: BTreeMap::new(),
            weight: 1,
            active: 0,
            cpu_idle_percent: 0.0,
            avg_cost_ms: 0.0,
            last_seen: 0,
            draining: false,
            push: false,
        }
    }
}

/// JSON has no NaN or infinity; a worker reporting one must not make the
/// entry unreadable for every replica.
fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

pub(super) fn encode(e: &WorkerEntry) -> Result<String> {
    let stored = Stored {
        session_id: e.session_id.clone(),
        worker_id: e.worker_id.clone(),
        namespace: e.namespace.clone(),
        owner: e.owner.clone(),
        name: e.name.clone(),
        node_id: e.node_id.clone(),
        handlers: e.handlers.clone(),
        capacity: e.capacity,
        labels: e.labels.clone(),
        weight: e.weight,
        active: e.load.active,
        cpu_idle_percent: finite(e.load.cpu_idle_percent),
        avg_cost_ms: finite(e.load.avg_cost_ms),
        last_seen: e.last_seen,
        draining: e.draining,
        push: e.push,
    };
    serde_json::to_string(&stored)
        .map_err(|err| Error::Internal(format!("encode worker entry: {err}")))
}

pub(super) fn decode(bytes: &[u8]) -> std::result::Result<WorkerEntry, serde_json::Error> {
    let s: Stored = serde_json::from_slice(bytes)?;
    Ok(WorkerEntry {
        push: s.push,
        session_id: s.session_id,
        worker_id: s.worker_id,
        namespace: s.namespace,
        owner: s.owner,
        name: s.name,
        node_id: s.node_id,
        handlers: s.handlers,
        capacity: s.capacity,
        labels: s.labels,
        weight: s.weight,
        load: WorkerLoad {
            active: s.active,
            cpu_idle_percent: s.cpu_idle_percent,
            avg_cost_ms: s.avg_cost_ms,
        },
        last_seen: s.last_seen,
        draining: s.draining,
    })
}

impl RedisCoordinator {
    fn entry_key(&self, session_id: &str) -> String {
        self.key(&format!("worker:{session_id}"))
    }

    /// Writes the entry with a fresh TTL and indexes it, atomically.
    pub(super) async fn put_entry(&self, entry: &WorkerEntry) -> Result<()> {
        let json = encode(entry)?;
        let ttl_ms = self.inner.opts.worker_ttl.as_millis() as u64;
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(self.entry_key(&entry.session_id))
            .arg(json)
            .arg("PX")
            .arg(ttl_ms)
            .ignore()
            .cmd("SADD")
            .arg(self.key("workers"))
            .arg(&entry.session_id)
            .ignore();
        let mut conn = self.inner.conn.clone();
        self.call(
            "put worker",
            async move { pipe.exec_async(&mut conn).await },
        )
        .await
    }

    /// Drops the entry and its index member, atomically; absent is fine.
    pub(super) async fn remove_entry(&self, session_id: &str) -> Result<()> {
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(self.entry_key(session_id))
            .ignore()
            .cmd("SREM")
            .arg(self.key("workers"))
            .arg(session_id)
            .ignore();
        let mut conn = self.inner.conn.clone();
        self.call(
            "remove worker",
            async move { pipe.exec_async(&mut conn).await },
        )
        .await
    }

    /// Every live entry across replicas, in session-id order. An entry this
    /// version cannot read is skipped (and logged), not an error for all.
    pub(super) async fn list_entries(&self) -> Result<Vec<WorkerEntry>> {
        let mut conn = self.inner.conn.clone();
        let mut invocation = self.inner.scripts.list.key(self.key("workers"));
        invocation.arg(self.key("worker:"));
        let raw: Vec<Vec<u8>> = self
            .call("list workers", async move {
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        let mut out: Vec<WorkerEntry> = raw
            .iter()
            .filter_map(|bytes| match decode(bytes) {
                Ok(entry) => Some(entry),
                Err(err) => {
                    tracing::warn!(error = %err, "skipping an unreadable worker entry");
                    None
                }
            })
            .collect();
        out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_non_finite_load_becomes_zero() {
        let entry = WorkerEntry {
            push: false,
            session_id: "s1".into(),
            worker_id: "w1".into(),
            namespace: "default".into(),
            owner: "open".into(),
            name: "box".into(),
            node_id: "n1".into(),
            handlers: vec!["echo".into()],
            capacity: 4,
            labels: [("zone".to_string(), "a".to_string())].into(),
            weight: 3,
            load: WorkerLoad {
                active: 2,
                cpu_idle_percent: f64::NAN,
                avg_cost_ms: 12.5,
            },
            last_seen: 1_700_000_000_000,
            draining: true,
        };
        let back = decode(encode(&entry).unwrap().as_bytes()).unwrap();
        let mut want = entry;
        want.load.cpu_idle_percent = 0.0;
        assert_eq!(back, want);
    }

    #[test]
    fn missing_fields_take_defaults_and_unknown_ones_are_ignored() {
        let e = decode(br#"{"session_id":"s","node_id":"n","future":1}"#).unwrap();
        assert_eq!(e.session_id, "s");
        assert_eq!(e.weight, 1);
        assert!(decode(b"not json").is_err());
    }
}
