//! The egress policy on the callback client: a resolver that hands reqwest
//! only the addresses the policy allows (so those are the only ones
//! dialled, whatever the name resolved to when the task was submitted),
//! and the classes failed tries are stored under.

use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use taskmesh_core::egress::EgressPolicy;

use crate::Failure;

/// The stored class of a try the egress policy refused.
pub(crate) const REFUSED: &str = "refused by the egress policy";

/// Resolves with the system resolver, then filters by the policy.
pub(crate) struct Resolver {
    policy: Arc<EgressPolicy>,
}

impl Resolver {
    pub(crate) fn new(policy: EgressPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
        }
    }
}

/// The resolver's refusal, found again in the error chain by [`classify`]
/// (by type, or by its text where a layer between re-wraps it).
#[derive(Debug, thiserror::Error)]
#[error("{REFUSED_MARK}{0}")]
struct Refused(String);

const REFUSED_MARK: &str = "egress policy refused ";

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed = policy
                .filter_resolved(addrs)
                .map_err(|e| Box::new(Refused(format!("{host} {e}"))))?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// The class of a transport error, with its full chain as the detail.
pub(crate) fn classify(err: &reqwest::Error) -> Failure {
    let mut detail = err.to_string();
    let mut refused = false;
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        refused |= cause.downcast_ref::<Refused>().is_some()
            || cause.to_string().starts_with(REFUSED_MARK);
        detail.push_str(": ");
        detail.push_str(&cause.to_string());
        source = cause.source();
    }
    if refused {
        Failure::fatal(REFUSED, detail)
    } else if err.is_timeout() {
        Failure::retry("timeout", detail)
    } else if err.is_connect() {
        Failure::retry("connect failed", detail)
    } else {
        Failure::retry("request failed", detail)
    }
}
