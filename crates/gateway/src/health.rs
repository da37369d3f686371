//! `GET /healthz` (the process answers) and `GET /readyz` (its
//! dependencies answer). The gateway does not know what the dependencies
//! are: the node hands it named [`Check`]s (the store, coordination), so
//! this crate stays free of SQL and Redis.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use http::StatusCode;
use serde_json::json;

use crate::Shared;

/// One readiness check: `Ok` when the dependency answers, else why not.
pub type Check = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// The named checks `/readyz` runs, in order.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<(String, Check)>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.checks.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Readiness").field("checks", &names).finish()
    }
}

impl Readiness {
    /// No checks: always ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check named `name`.
    pub fn check<F, Fut>(mut self, name: impl Into<String>, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        let check: Check = Arc::new(move || Box::pin(check()));
        self.checks.push((name.into(), check));
        self
    }
}

/// `GET /healthz`: 200 while the process serves HTTP.
pub async fn healthz() -> Response {
    Json(json!({"status": "alive"})).into_response()
}

/// How long one check may take before it counts as failed: a dependency
/// that hangs must make the node unready, not hang the probe.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /readyz`: 200 when every check passes; otherwise 503 naming the
/// first failure in `reason` and every check's result in `checks`.
pub async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let mut checks = serde_json::Map::new();
    let mut reason = None;
    for (name, check) in &shared.readiness.checks {
        let result = tokio::time::timeout(CHECK_TIMEOUT, check())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {CHECK_TIMEOUT:?}")));
        let text = match &result {
            Ok(()) => "ok".to_string(),
            Err(err) => err.clone(),
        };
        if let Err(err) = result {
            reason.get_or_insert_with(|| format!("{name}: {err}"));
        }
        checks.insert(name.clone(), text.into());
    }
    match reason {
        None => Json(json!({"status": "ready", "checks": checks})).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": reason, "checks": checks})),
        )
            .into_response(),
    }
}
