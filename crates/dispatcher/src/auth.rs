//! Who is calling, and whether they may: the authentication layer of the
//! gRPC server and the [`Identity`] it leaves on every request it lets
//! through.
//!
//! The layer sits inside the load shedder (so a flood of bad tokens is
//! shed before it costs store lookups) and outside the services: it reads
//! the `authorization: Bearer <token>` header, identifies the caller (the
//! bootstrap token, or a stored token through a short-lived cache), and
//! checks the caller's role against what the called method needs
//! ([`need_of`], by gRPC path). What needs the request itself — which
//! namespace it names — is decided in the handlers with
//! [`Identity::namespace_for`]. Health always passes; reflection passes
//! when the operator left it open.
//!
//! A refusal says only UNAUTHENTICATED ("missing or invalid token") or
//! PERMISSION_DENIED (naming the role and the method), never why a token
//! failed; the reason goes to the log with the token's public id and to
//! `taskmesh_auth_refused_total{reason}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use taskmesh_core::auth::{self, Refusal, Role};
use taskmesh_core::{Clock, validate};
use taskmesh_store::Store;
use tower::{Layer, Service};
use tracing::{info, warn};

use crate::Error;

/// Refused calls, by reason (`missing`, `malformed`, `unknown`, `expired`,
/// `revoked`, `role`, `namespace`).
pub const AUTH_REFUSED_TOTAL: &str = "taskmesh_auth_refused_total";

/// How the server authenticates.
#[derive(Clone, Default)]
pub struct AuthOptions {
    /// Require a token on every call but health (and reflection when
    /// `open_reflection`). Off, every caller acts as [`Identity::open`].
    pub enabled: bool,
    /// A token that is an admin of every namespace (`TASKMESH_BOOTSTRAP_TOKEN`).
    pub bootstrap: Option<String>,
    /// Serve reflection without a token.
    pub open_reflection: bool,
    /// The node's own in-process worker presents this (a random secret
    /// made at start): a worker of namespace `default`.
    pub node_worker: Option<String>,
    /// How long a checked token is trusted before it is read again: a
    /// revocation on another replica takes effect within this.
    pub cache_ttl: Duration,
}

impl std::fmt::Debug for AuthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthOptions")
            .field("enabled", &self.enabled)
            .field("bootstrap", &self.bootstrap.as_ref().map(|_| "<redacted>"))
            .field("open_reflection", &self.open_reflection)
            .field(
                "node_worker",
                &self.node_worker.as_ref().map(|_| "<redacted>"),
            )
            .field("cache_ttl", &self.cache_ttl)
            .finish()
    }
}

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Who it is, for ownership of worker sessions and for logs: `open`
    /// (no authentication), `bootstrap`, or `token:<id>`.
    pub principal: String,
    /// The token's public id, if it came with one.
    pub token_id: Option<String>,
    /// The one namespace it may act in; `None` for every namespace.
    pub namespace: Option<String>,
    /// Its role; `None` may do everything.
    pub role: Option<Role>,
}

/// What a method needs of its caller's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: anybody may call it.
    Nothing,
    /// Reading tasks, schedules, workers, breakers: admin, submitter, reader.
    Read,
    /// Changing tasks and schedules: admin, submitter.
    Write,
    /// Submitting tasks and workflows: admin, submitter, and a worker,
    /// whose submits the call refuses unless they name a parent task (a
    /// handler spawning children).
    Submit,
    /// Being a worker (streams, push sessions, out-of-band ACKs): admin, worker.
    Work,
    /// Managing tokens: admin.
    Admin,
}

impl Identity {
    /// The caller when authentication is off: everything, in any namespace.
    pub fn open() -> Self {
        Self {
            principal: "open".into(),
            token_id: None,
            namespace: None,
            role: None,
        }
    }

    fn bootstrap() -> Self {
        Self {
            principal: "bootstrap".into(),
            ..Self::open()
        }
    }

    fn of_token(t: &auth::TokenRecord) -> Self {
        Self {
            principal: format!("token:{}", t.id),
            token_id: Some(t.id.clone()),
            namespace: Some(t.namespace.clone()),
            role: Some(t.role),
        }
    }

    /// Whether its role may call a method that needs `need`.
    pub fn allows(&self, need: Need) -> bool {
        let Some(role) = self.role else { return true };
        match need {
            Need::Nothing => true,
            Need::Read => matches!(role, Role::Admin | Role::Submitter | Role::Reader),
            Need::Write => matches!(role, Role::Admin | Role::Submitter),
            Need::Submit => matches!(role, Role::Admin | Role::Submitter | Role::Worker),
            Need::Work => matches!(role, Role::Admin | Role::Worker),
            Need::Admin => role == Role::Admin,
        }
    }

    /// The namespace a request acts in: the one it names, else the
    /// caller's own (`default` for a caller of every namespace). A name it
    /// may not act in is PERMISSION_DENIED; a malformed one
    /// INVALID_ARGUMENT.
    pub fn namespace_for(&self, requested: &str) -> Result<String, Error> {
        let ns = match (requested, &self.namespace) {
            ("", Some(own)) => own.clone(),
            ("", None) => validate::DEFAULT_NAMESPACE.to_string(),
            (named, _) => named.to_string(),
        };
        validate::namespace(&ns).map_err(Error::InvalidArgument)?;
        match &self.namespace {
            Some(own) if *own != ns => {
                metrics::counter!(AUTH_REFUSED_TOTAL, "reason" => "namespace").increment(1);
                warn!(token_id = ?self.token_id, namespace = %ns, "refused: a token of another namespace");
                Err(Error::PermissionDenied(format!(
                    "this token acts in namespace {own:?}, not {ns:?}"
                )))
            }
            _ => Ok(ns),
        }
    }

    /// Whether it may see what lets one act as a worker (execution ids,
    /// session ids, push addresses): not a reader.
    pub fn sees_worker_details(&self) -> bool {
        self.role != Some(Role::Reader)
    }
}

/// The identity the layer left on a request (open when there is none:
/// the service was called without the layer, as in-process tests do).
pub fn identity<T>(request: &tonic::Request<T>) -> Identity {
    request
        .extensions()
        .get::<Identity>()
        .cloned()
        .unwrap_or_else(Identity::open)
}

/// What the method at gRPC `path` needs; `None` for a method this server
/// does not know (it answers UNIMPLEMENTED itself).
pub fn need_of(path: &str, open_reflection: bool) -> Option<Need> {
    let (service, method) = path.trim_start_matches('/').split_once('/')?;
    Some(match service {
        "grpc.health.v1.Health" => Need::Nothing,
        "grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection" => {
            if open_reflection {
                Need::Nothing
            } else {
                Need::Read
            }
        }
        "taskmesh.v1.Dispatcher" => Need::Work,
        "taskmesh.v1.Admin" => Need::Admin,
        "taskmesh.v1.TaskApi" => match method {
            "GetTask"
            | "ListTasks"
            | "WatchTask"
            | "GetTaskLogs"
            | "WatchTaskLogs"
            | "ListWorkers"
            | "GetSchedule"
            | "ListSchedules"
            | "ListCircuitBreakers"
            | "GetStats"
            | "PreviewSchedule"
            | "GetWorkflow"
            | "ListWorkflows"
            | "WatchWorkflow" => Need::Read,
            "AckTask" => Need::Work,
            "SubmitTask" | "SubmitTasks" | "SubmitWorkflow" => Need::Submit,
            // Draining a worker is an operator's act, not a submitter's.
            "DrainWorker" => Need::Admin,
            _ => Need::Write,
        },
        _ => return None,
    })
}

/// Checks presented tokens, with a cache of the ones recently found good.
pub struct Authenticator {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    opts: AuthOptions,
    /// Token digest → identity, and until when it is trusted.
    cache: Mutex<HashMap<String, (Identity, Instant)>>,
}

/// Entries the cache keeps at most; beyond it, it starts over.
const CACHE_MAX: usize = 10_000;

impl Authenticator {
    /// An authenticator reading tokens from `store`.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, opts: AuthOptions) -> Self {
        Self {
            store,
            clock,
            opts,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether tokens are required.
    pub fn enabled(&self) -> bool {
        self.opts.enabled
    }

    /// Identifies the caller presenting `header` (the `authorization`
    /// value). Store failures are UNAVAILABLE-worthy and reported as such.
    pub async fn identify(&self, header: Option<&str>) -> Result<Identity, Failure> {
        let Some(header) = header else {
            return Err(Failure::Refused(Refusal::Missing, None));
        };
        let Some(text) = header.strip_prefix("Bearer ") else {
            return Err(Failure::Refused(Refusal::Malformed, None));
        };
        let text = text.trim();
        if let Some(bootstrap) = &self.opts.bootstrap
            && auth::same_secret(text, bootstrap)
        {
            return Ok(Identity::bootstrap());
        }
        if let Some(node) = &self.opts.node_worker
            && auth::same_secret(text, node)
        {
            return Ok(Identity {
                principal: "node".into(),
                token_id: None,
                namespace: Some(validate::DEFAULT_NAMESPACE.into()),
                role: Some(Role::Worker),
            });
        }
        let Some(id) = auth::token_id(text) else {
            return Err(Failure::Refused(Refusal::Malformed, None));
        };
        let digest = auth::digest(text);
        if let Some((identity, until)) = self.lock().get(&digest)
            && Instant::now() < *until
        {
            return Ok(identity.clone());
        }
        let record = self
            .store
            .get_token(id)
            .await
            .map_err(|e| Failure::Store(e.to_string()))?;
        auth::check_token(text, record.as_ref(), self.clock.now_millis())
            .map_err(|r| Failure::Refused(r, Some(id.to_string())))?;
        let Some(record) = record else {
            return Err(Failure::Refused(Refusal::Unknown, Some(id.to_string())));
        };
        let identity = Identity::of_token(&record);
        // Trusted until the cache's lifetime ends, or the token expires.
        let mut until = Instant::now() + self.opts.cache_ttl;
        if let Some(expires) = record.expires_at {
            let left = expires.saturating_sub(self.clock.now_millis()).max(0);
            until = until.min(Instant::now() + Duration::from_millis(left as u64));
        }
        let mut cache = self.lock();
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(digest, (identity.clone(), until));
        Ok(identity)
    }

    /// Forgets token `id` at once (it was just revoked here).
    pub fn forget(&self, id: &str) {
        self.lock()
            .retain(|_, (identity, _)| identity.token_id.as_deref() != Some(id));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Identity, Instant)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a call could not be identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The token is missing or bad; with its public id when it had one.
    Refused(Refusal, Option<String>),
    /// The token could not be read.
    Store(String),
}

/// Adds [`Identity`] to every request, refusing the unidentified.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Arc<Authenticator>,
}

impl AuthLayer {
    /// The layer over `auth`.
    pub fn new(auth: Arc<Authenticator>) -> Self {
        Self { auth }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            auth: self.auth.clone(),
        }
    }
}

/// The service made by [`AuthLayer`].
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Arc<Authenticator>,
}

fn refuse<B: Default>(status: tonic::Status) -> http::Response<B> {
    status.into_http()
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for AuthService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let mut inner = crate::layers::take_ready(&mut self.inner);
        let auth = self.auth.clone();
        Box::pin(async move {
            if !auth.enabled() {
                req.extensions_mut().insert(Identity::open());
                return inner.call(req).await;
            }
            let path = req.uri().path();
            let need = need_of(path, auth.opts.open_reflection);
            if need == Some(Need::Nothing) {
                return inner.call(req).await;
            }
            let header = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let identity = match auth.identify(header.as_deref()).await {
                Ok(identity) => identity,
                Err(Failure::Refused(reason, token_id)) => {
                    metrics::counter!(AUTH_REFUSED_TOTAL, "reason" => reason.as_str()).increment(1);
                    info!(path, reason = reason.as_str(), token_id = ?token_id, "refused: not authenticated");
                    return Ok(refuse(tonic::Status::unauthenticated(
                        "missing or invalid token (authorization: Bearer <token>)",
                    )));
                }
                Err(Failure::Store(error)) => {
                    warn!(path, error, "cannot read tokens");
                    return Ok(refuse(tonic::Status::unavailable(
                        "cannot check the token now; retry with backoff",
                    )));
                }
            };
            // Unknown methods fall through to the server's UNIMPLEMENTED.
            if let Some(need) = need
                && !identity.allows(need)
            {
                metrics::counter!(AUTH_REFUSED_TOTAL, "reason" => "role").increment(1);
                info!(path, token_id = ?identity.token_id, role = ?identity.role, "refused: role");
                let role = identity.role.map_or("?", Role::as_str);
                return Ok(refuse(tonic::Status::permission_denied(format!(
                    "a {role} token may not call {path}"
                ))));
            }
            req.extensions_mut().insert(identity);
            inner.call(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(role: Role) -> Identity {
        Identity {
            principal: "token:x".into(),
            token_id: Some("x".into()),
            namespace: Some("a".into()),
            role: Some(role),
        }
    }

    #[test]
    fn roles_reach_exactly_their_methods() {
        let paths = [
            ("/taskmesh.v1.TaskApi/GetTask", Need::Read),
            ("/taskmesh.v1.TaskApi/ListWorkers", Need::Read),
            ("/taskmesh.v1.TaskApi/SubmitTask", Need::Submit),
            ("/taskmesh.v1.TaskApi/SubmitTasks", Need::Submit),
            ("/taskmesh.v1.TaskApi/SubmitWorkflow", Need::Submit),
            ("/taskmesh.v1.TaskApi/CancelWorkflow", Need::Write),
            ("/taskmesh.v1.TaskApi/CancelTask", Need::Write),
            ("/taskmesh.v1.TaskApi/CreateSchedule", Need::Write),
            ("/taskmesh.v1.TaskApi/RetryTask", Need::Write),
            ("/taskmesh.v1.TaskApi/CancelTasks", Need::Write),
            ("/taskmesh.v1.TaskApi/GetStats", Need::Read),
            ("/taskmesh.v1.TaskApi/PreviewSchedule", Need::Read),
            ("/taskmesh.v1.TaskApi/DrainWorker", Need::Admin),
            ("/taskmesh.v1.TaskApi/AckTask", Need::Work),
            ("/taskmesh.v1.Dispatcher/Connect", Need::Work),
            ("/taskmesh.v1.Admin/CreateToken", Need::Admin),
            ("/grpc.health.v1.Health/Check", Need::Nothing),
        ];
        for (path, need) in paths {
            assert_eq!(need_of(path, false), Some(need), "{path}");
        }
        assert_eq!(need_of("/nope.Service/X", false), None);
        assert_eq!(
            need_of(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                false
            ),
            Some(Need::Read)
        );
        assert_eq!(
            need_of(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                true
            ),
            Some(Need::Nothing)
        );
        let table = [
            (Role::Admin, [true, true, true, true, true]),
            (Role::Submitter, [true, true, false, false, true]),
            (Role::Reader, [true, false, false, false, false]),
            (Role::Worker, [false, false, true, false, true]),
        ];
        for (role, allowed) in table {
            let got: Vec<bool> = [
                Need::Read,
                Need::Write,
                Need::Work,
                Need::Admin,
                Need::Submit,
            ]
            .into_iter()
            .map(|n| token(role).allows(n))
            .collect();
            assert_eq!(got, allowed, "{role}");
        }
        assert!(Identity::open().allows(Need::Admin));
    }

    #[test]
    fn a_request_acts_in_the_tokens_namespace_or_the_one_it_names() {
        let t = token(Role::Submitter);
        assert_eq!(t.namespace_for("").unwrap(), "a");
        assert_eq!(t.namespace_for("a").unwrap(), "a");
        assert!(matches!(
            t.namespace_for("b"),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            t.namespace_for("bad name"),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(Identity::open().namespace_for("").unwrap(), "default");
        assert_eq!(Identity::open().namespace_for("b").unwrap(), "b");
        assert!(!token(Role::Reader).sees_worker_details());
        assert!(token(Role::Worker).sees_worker_details());
    }
}
