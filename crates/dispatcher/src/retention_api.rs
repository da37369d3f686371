//! `Admin.GetRetention` and `Admin.SetRetention`: how long a namespace's
//! ended tasks are kept. Horizons are stored per namespace and per handler
//! (`Store::set_retention`); the leader's retention pass reads them on
//! every pass, so a change applies within seconds on every replica.

use taskmesh::v1 as pb;
use taskmesh_core::retention::{Horizons, MIN_HORIZON_MS, RetentionRule, TERMINAL, set_for};
use taskmesh_core::validate;
use tracing::info;

use crate::Error;
use crate::convert::{duration, duration_millis, state_to_pb, timestamp};
use crate::engine::Shared;

/// The longest horizon: 100 years (the contract's limit).
const MAX_HORIZON_MS: i64 = 3_155_760_000_000;

/// `GetRetention` for `namespace`.
pub(crate) async fn get(shared: &Shared, namespace: &str) -> Result<pb::NamespaceRetention, Error> {
    let rules = shared.store.retention_rules(Some(namespace)).await?;
    let server = shared.opts.retention;
    let namespace_set = set_for(&rules, namespace, "");
    let effective = namespace_set.over(&server);
    let mut handlers: Vec<&str> = rules
        .iter()
        .filter(|r| !r.handler.is_empty())
        .map(|r| r.handler.as_str())
        .collect();
    handlers.dedup();
    let mut oldest = Vec::new();
    for state in TERMINAL {
        if let Some((task_id, ended)) = shared.store.oldest_ended(namespace, state).await? {
            oldest.push(pb::OldestKept {
                state: state_to_pb(state) as i32,
                task_id,
                end_time: ended.map(timestamp),
            });
        }
    }
    Ok(pb::NamespaceRetention {
        namespace: namespace.to_string(),
        server: Some(horizons_to_pb(&server)),
        namespace_set: Some(horizons_to_pb(&namespace_set)),
        effective: Some(horizons_to_pb(&effective)),
        handlers: handlers
            .into_iter()
            .map(|h| handler_to_pb(&rules, namespace, h, &effective))
            .collect(),
        oldest,
    })
}

/// `SetRetention` in `namespace`; answers with what is then in effect.
pub(crate) async fn set(
    shared: &Shared,
    namespace: &str,
    by: &str,
    req: pb::SetRetentionRequest,
) -> Result<pb::NamespaceRetention, Error> {
    if !req.handler.is_empty() {
        validate::handler_name(&req.handler).map_err(Error::InvalidArgument)?;
    }
    let horizons = horizons_from_pb(req.horizons.unwrap_or_default())?;
    shared
        .store
        .set_retention(namespace, &req.handler, &horizons)
        .await?;
    info!(namespace, handler = %req.handler, horizons = ?horizons.0, by, "retention set");
    get(shared, namespace).await
}

fn handler_to_pb(
    rules: &[RetentionRule],
    namespace: &str,
    handler: &str,
    namespace_effective: &Horizons,
) -> pb::HandlerRetention {
    let set = set_for(rules, namespace, handler);
    pb::HandlerRetention {
        handler: handler.to_string(),
        set: Some(horizons_to_pb(&set)),
        effective: Some(horizons_to_pb(&set.over(namespace_effective))),
    }
}

fn horizons_to_pb(h: &Horizons) -> pb::RetentionHorizons {
    let d = |i: usize| h.0[i].map(duration);
    pb::RetentionHorizons {
        succeeded: d(0),
        failed: d(1),
        timed_out: d(2),
        cancelled: d(3),
    }
}

fn horizons_from_pb(p: pb::RetentionHorizons) -> Result<Horizons, Error> {
    let fields = [
        ("succeeded", p.succeeded),
        ("failed", p.failed),
        ("timed_out", p.timed_out),
        ("cancelled", p.cancelled),
    ];
    let mut out = Horizons::default();
    for (i, (name, d)) in fields.into_iter().enumerate() {
        let Some(d) = d else { continue };
        let ms = duration_millis(&d)
            .filter(|ms| (MIN_HORIZON_MS..=MAX_HORIZON_MS).contains(ms))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "horizons.{name} must be between 1 minute and 100 years"
                ))
            })?;
        out.0[i] = Some(ms);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizons_round_trip_and_out_of_range_is_refused() {
        let h = Horizons([Some(60_000), None, Some(86_400_000), None]);
        assert_eq!(horizons_from_pb(horizons_to_pb(&h)).unwrap(), h);
        let short = pb::RetentionHorizons {
            failed: Some(duration(59_999)),
            ..Default::default()
        };
        let err = horizons_from_pb(short).unwrap_err();
        assert!(err.to_string().contains("horizons.failed"), "{err}");
    }
}
