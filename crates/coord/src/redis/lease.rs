//! The leader lease on Redis and where its fencing tokens come from.
//!
//! Taking the lease, the token and the counter move together in one Lua
//! script, so only the winner consumes a token and a loser changes nothing.
//! Renewal and resignation compare the owner (node id plus a per-process
//! nonce) before they touch the key, so a node can never extend or delete a
//! lease it does not hold.
//!
//! # Tokens when Redis forgets
//!
//! The store accepts a leader write only with a token at least as new as the
//! newest it has seen, so two leaders must never hold the same token. `INCR`
//! alone guarantees that only while Redis keeps its data; a Redis restarted
//! without persistence (or a failover to a replica that had not caught up)
//! starts the counter again from nothing. A fresh token is therefore the
//! largest of:
//!
//! 1. `INCR fence` — strictly above every token this Redis issued;
//! 2. the floor + 1 — the floor is the largest of the store's newest token
//!    ([`TokenFloor`](super::TokenFloor), read on every fresh acquisition), any floor set with
//!    [`RedisCoordinator::set_token_floor`] and the newest token this
//!    process has seen. It covers every token that ever reached the store,
//!    whatever happened to Redis or to the clocks;
//! 3. Redis's `TIME` in milliseconds — covers tokens that were issued but
//!    never written to the store (a leader paused before its first write),
//!    which the floor cannot know about: those were issued at an earlier
//!    instant, and lease changes are far rarer than one per millisecond.
//!    This relies on the Redis server's clock not stepping back across a
//!    restart or failover by more than the outage lasted.
//!
//! The counter is then set to the token, so later `INCR`s continue above it.
//! Tokens are exact up to 2^53 (Lua numbers are doubles); millisecond tokens
//! reach that in the year 287,000.

use std::sync::atomic::Ordering;

use taskmesh_core::{Clock, SystemClock, UnixMillis};

use super::RedisCoordinator;
use crate::{Error, Lease, Result};

/// Look at, renew or take the lease.
/// KEYS: leader, fence. ARGV: owner, ttl ms, floor ('' = do not take).
/// Returns {status, token, raw INCR}: 0 held by another, 1 renewed by us,
/// 2 free (nothing taken), 3 taken by us.
pub(super) const LEASE_LUA: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, ':', 1, true)
  local token = sep and tonumber(string.sub(cur, 1, sep - 1)) or 0
  if sep and string.sub(cur, sep + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, token, 0}
  end
  return {0, token, 0}
end
if ARGV[3] == '' then
  return {2, 0, 0}
end
local raw = redis.call('INCR', KEYS[2])
local token = raw
local floor = tonumber(ARGV[3]) + 1
if floor > token then token = floor end
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if clock > token then token = clock end
local text = string.format('%d', token)
redis.call('SET', KEYS[2], text)
redis.call('SET', KEYS[1], text .. ':' .. ARGV[1], 'PX', ARGV[2])
return {3, token, raw}
";

/// Delete the lease only if we hold it. KEYS: leader. ARGV: owner.
pub(super) const RESIGN_LUA: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, ':', 1, true)
  if sep and string.sub(cur, sep + 1) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
  end
end
return 0
";

/// Largest floor Lua can add one to exactly.
const MAX_FLOOR: u64 = (1 << 53) - 2;

/// The node id in a lease value `"{token}:{node_id}#{nonce}"`.
pub(super) fn holder_node(value: &str) -> Option<String> {
    let (_, owner) = value.split_once(':')?;
    let (node, _) = owner.rsplit_once('#')?;
    Some(node.to_string())
}

impl RedisCoordinator {
    /// One `acquire_or_renew`: renew if ours, report another holder, or —
    /// when the lease is free — read the floor and take it.
    pub(super) async fn lease_round(&self) -> Result<Option<Lease>> {
        let sent = SystemClock.now_millis();
        let (status, token, _) = self.run_lease(None).await?;
        match status {
            0 => return Ok(None),
            1 => return Ok(Some(self.lease(token, sent)?)),
            2 => {}
            _ => return Err(unexpected(status)),
        }
        // Free: only now pay for the floor (a store read), then race for it.
        let floor = self.token_floor().await?;
        let sent = SystemClock.now_millis();
        let (status, token, raw) = self.run_lease(Some(floor)).await?;
        match status {
            0 => Ok(None),
            1 | 3 => {
                let lease = self.lease(token, sent)?;
                if status == 3 {
                    tracing::info!(
                        node_id = %self.inner.opts.node_id,
                        token = lease.token,
                        counter_was_empty = raw == 1,
                        "took the leader lease"
                    );
                }
                Ok(Some(lease))
            }
            _ => Err(unexpected(status)),
        }
    }

    /// Deletes the lease if this process holds it.
    pub(super) async fn resign_lease(&self) -> Result<()> {
        let mut conn = self.inner.conn.clone();
        let mut invocation = self.inner.scripts.resign.key(self.key("leader"));
        invocation.arg(&self.inner.owner);
        let deleted: i64 = self
            .call(
                "resign",
                async move { invocation.invoke_async(&mut conn).await },
            )
            .await?;
        if deleted > 0 {
            tracing::info!(node_id = %self.inner.opts.node_id, "resigned the leader lease");
        }
        Ok(())
    }

    async fn run_lease(&self, floor: Option<u64>) -> Result<(i64, i64, i64)> {
        let ttl_ms = self.inner.opts.lease_ttl.as_millis() as u64;
        let mut conn = self.inner.conn.clone();
        let mut invocation = self.inner.scripts.lease.key(self.key("leader"));
        invocation
            .key(self.key("fence"))
            .arg(&self.inner.owner)
            .arg(ttl_ms)
            .arg(floor.map(|f| f.to_string()).unwrap_or_default());
        self.call("leader lease", async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    /// The floor a fresh token must exceed (see the module docs).
    async fn token_floor(&self) -> Result<u64> {
        let source = self
            .inner
            .floor_source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut floor = self.inner.floor.load(Ordering::SeqCst);
        if let Some(source) = source {
            let stored = source.token_floor().await.map_err(|e| {
                Error::Unavailable(format!(
                    "cannot read the fencing token floor, not taking the lease: {e}"
                ))
            })?;
            floor = floor.max(stored);
        }
        if floor > MAX_FLOOR {
            return Err(Error::Internal(format!(
                "fencing token floor {floor} is beyond what redis counts exactly (2^53)"
            )));
        }
        Ok(floor)
    }

    /// The lease for `token`, valid until conservatively before Redis
    /// expires the key: Redis starts its TTL after `sent`, and clocks may
    /// drift a little apart over one TTL (the Redlock allowance).
    fn lease(&self, token: i64, sent: UnixMillis) -> Result<Lease> {
        let token = u64::try_from(token)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| Error::Internal(format!("redis returned fencing token {token}")))?;
        self.inner.floor.fetch_max(token, Ordering::SeqCst);
        let ttl = self.inner.opts.lease_ttl.as_millis() as i64;
        let drift = ttl / 100 + 2;
        Ok(Lease {
            token,
            expires_at: sent + ttl - drift,
        })
    }
}

fn unexpected(status: i64) -> Error {
    Error::Internal(format!("lease script answered with status {status}"))
}

#[cfg(test)]
mod tests {
    use super::holder_node;

    #[test]
    fn the_holder_is_read_from_the_lease_value() {
        assert_eq!(holder_node("17:n1#abc").as_deref(), Some("n1"));
        assert_eq!(
            holder_node("17:host:9000#n#abc").as_deref(),
            Some("host:9000#n")
        );
        assert_eq!(holder_node("garbage"), None);
    }
}
