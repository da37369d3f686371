//! The REST/JSON front door of taskmesh, grpc-gateway style: routes built at
//! start-up from the `google.api.http` rules of the descriptor set,
//! JSON ↔ protobuf by the proto3 JSON mapping, each request forwarded to
//! the node's own gRPC port through a generic client, server streaming as
//! Server-Sent Events, and the OpenAPI 3 document generated from the same
//! descriptors. Also the node's `/healthz` and `/readyz`, and the web
//! console's embedded files at `/ui/` (`console`).
//!
//! Architecture invariant: nothing here is written per endpoint, and this
//! crate never links the service implementation: it knows the contract
//! (`taskmesh`) and the error vocabulary (`taskmesh-core`) only, never SQL,
//! Redis or the dispatcher. Both front doors therefore share one
//! implementation, one validation and one set of limits.

mod backend;
pub mod console;
mod error;
mod handler;
mod health;
pub mod openapi;
mod rules;
mod template;
mod transcode;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use http::{HeaderValue, header};
use prost_reflect::DescriptorPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

pub use backend::BytesCodec;
pub use error::{ApiError, Error};
pub use handler::FORWARDED_HEADERS;
pub use health::{Check, Readiness};

use backend::Backend;
use rules::Routes;

/// How the gateway behaves.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// The gRPC server whose `google.api.http` RPCs are served, e.g.
    /// `http://127.0.0.1:50051` (the node's own gRPC port).
    pub grpc_target: String,
    /// Larger request bodies are refused with 413.
    pub max_body_bytes: usize,
    /// Largest gRPC message sent or received.
    pub max_message_bytes: usize,
    /// A comment is sent on idle Server-Sent Events streams this often, so
    /// proxies do not cut them.
    pub sse_keep_alive: Duration,
    /// A channel to the gRPC server to use instead of connecting to
    /// `grpc_target` (an in-process pipe when the gRPC port speaks TLS).
    pub grpc_channel: Option<tonic::transport::Channel>,
    /// A request's headers must arrive within this, counted from when the
    /// connection is ready for the next request (a new or idle keep-alive
    /// connection is closed after it).
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this (else 408).
    pub body_read_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once.
    pub max_streams_per_connection: u32,
}

impl GatewayOptions {
    /// Options for `grpc_target` with the defaults: 4 MiB bodies and
    /// messages (a 1 MiB payload is about 1.4 MB of base64 in JSON), 15 s
    /// keep-alive.
    pub fn new(grpc_target: impl Into<String>) -> Self {
        Self {
            grpc_target: grpc_target.into(),
            max_body_bytes: 4 * 1024 * 1024,
            max_message_bytes: 4 * 1024 * 1024,
            sse_keep_alive: Duration::from_secs(15),
            grpc_channel: None,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            max_streams_per_connection: 256,
        }
    }
}

/// What every request handler shares.
struct Shared {
    options: GatewayOptions,
    routes: Routes,
    backend: Backend,
    readiness: Readiness,
    openapi: Arc<String>,
    /// Ends Server-Sent Events streams when the gateway stops.
    shutdown: CancellationToken,
}

/// A built gateway, ready to serve.
pub struct Gateway {
    shared: Arc<Shared>,
    /// Routes the embedding program adds (the node's `/metrics`).
    extra: Router,
}

impl Gateway {
    /// Reads the routes from [`taskmesh::FILE_DESCRIPTOR_SET`] and prepares
    /// the client for `options.grpc_target`. `readiness` is what `/readyz`
    /// checks. Fails on a descriptor rule the gateway cannot serve.
    pub fn build(options: GatewayOptions, readiness: Readiness) -> Result<Self, Error> {
        let pool = descriptor_pool()?;
        let routes = Routes::load(&pool)?;
        let openapi = openapi::render(&openapi::document_from(&pool, &routes));
        let backend = match &options.grpc_channel {
            Some(channel) => Backend::from_channel(channel.clone(), options.max_message_bytes),
            None => Backend::new(&options.grpc_target, options.max_message_bytes)?,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                options,
                routes,
                backend,
                readiness,
                openapi: Arc::new(openapi),
                shutdown: CancellationToken::new(),
            }),
            extra: Router::new(),
        })
    }

    /// Serves `extra`'s routes beside the gateway's own (they go through the
    /// same tracing and panic layers). Its paths must not clash with them.
    pub fn with_routes(mut self, extra: Router) -> Self {
        self.extra = self.extra.merge(extra);
        self
    }

    /// The HTTP application: `/healthz`, `/readyz`, `/openapi.json`, every
    /// transcoded route and the routes added by [`Gateway::with_routes`].
    pub fn router(&self) -> Router {
        let openapi = self.shared.openapi.clone();
        Router::new()
            .route("/healthz", get(health::healthz))
            .route("/readyz", get(health::readyz))
            .route(
                "/openapi.json",
                get(move || {
                    let body = openapi.clone();
                    async move {
                        (
                            [(
                                header::CONTENT_TYPE,
                                HeaderValue::from_static("application/json"),
                            )],
                            body.as_str().to_owned(),
                        )
                    }
                }),
            )
            // The web console's files, before the transcoding fallback.
            .merge(console::routes())
            .method_not_allowed_fallback(handler::method_not_allowed)
            .fallback(handler::transcode)
            .with_state(self.shared.clone())
            .merge(self.extra.clone())
            // The stack, outermost first. A span per request, so everything
            // below logs inside it; then panics become a 500 (a bug must
            // never drop the connection without an answer). No concurrency
            // limit or deadline here: the gRPC server that every request
            // reaches applies the node's (shedding with RESOURCE_EXHAUSTED,
            // cutting unary calls with DEADLINE_EXCEEDED), once for both
            // front doors.
            .layer(CatchPanicLayer::custom(|_| {
                ApiError::from_grpc(error::code::INTERNAL, "internal error").into_response()
            }))
            .layer(TraceLayer::new_for_http())
    }

    /// Serves on `listener` until `shutdown`; open event streams end then.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let router = self.router();
        let streams = self.shared.shutdown.clone();
        let addr = listener.local_addr().ok();
        tracing::info!(http_addr = ?addr, "rest gateway listening");
        // Nagle off, as on the gRPC port: small responses and SSE events
        // must not wait for the client's delayed ACK.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(err) = tcp.set_nodelay(true) {
                tracing::warn!(error = %err, "cannot set TCP_NODELAY on a connection");
            }
        });
        self.serve_on_router(listener, router, streams, shutdown)
            .await
    }

    /// [`serve`](Self::serve) on any listener (e.g. one yielding TLS streams).
    pub async fn serve_on<L>(self, listener: L, shutdown: CancellationToken) -> std::io::Result<()>
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        let router = self.router();
        let streams = self.shared.shutdown.clone();
        tracing::info!(http_addr = ?listener.local_addr().ok(), "rest gateway listening");
        self.serve_on_router(listener, router, streams, shutdown)
            .await
    }

    /// The accept loop. Not `axum::serve`: it gives hyper no timer, so
    /// there is no header read timeout and a client that never finishes
    /// its headers (or never sends any) holds its connection forever. Here
    /// each connection gets hyper's HTTP/1 header timeout and, for HTTP/2,
    /// a stream cap and keepalive PINGs; shutdown is graceful (open
    /// connections finish their requests; event streams end first).
    async fn serve_on_router<L>(
        self,
        mut listener: L,
        router: Router,
        streams: CancellationToken,
        shutdown: CancellationToken,
    ) -> std::io::Result<()>
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
        use hyper_util::server::conn::auto::Builder;
        use hyper_util::service::TowerToHyperService;
        use tower::ServiceExt as _;

        let o = &self.shared.options;
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(o.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(o.max_streams_per_connection)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(30));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            let (io, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            tracing::trace!(?peer, "http connection accepted");
            let service = TowerToHyperService::new(router.clone().map_request(
                |req: axum::http::Request<hyper::body::Incoming>| req.map(axum::body::Body::new),
            ));
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(err) = conn.await {
                    tracing::trace!(error = %err, "http connection ended with an error");
                }
            });
        }
        streams.cancel();
        graceful.shutdown().await;
        Ok(())
    }
}

/// Entry points for the coverage-guided fuzz targets in `fuzz/`: the
/// transcoder without a server around it. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use std::sync::OnceLock;

    use crate::rules::{Lookup, Routes};

    fn routes() -> &'static Routes {
        static ROUTES: OnceLock<Routes> = OnceLock::new();
        ROUTES.get_or_init(|| {
            let pool = crate::descriptor_pool().expect("the contract's descriptors");
            Routes::load(&pool).expect("the contract's routes")
        })
    }

    /// Routes `method` and `target` (path and query) as the gateway does,
    /// then transcodes `body` both ways: as the JSON request body, and as
    /// the protobuf answer of the route's RPC. Whatever the input, this
    /// must return (an error is fine), never panic.
    pub fn transcode(method: &[u8], target: &str, body: &[u8]) {
        let Ok(method) = http::Method::from_bytes(method) else {
            return;
        };
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        if let Lookup::Found(route, vars) = routes().lookup(&method, path) {
            let _ = crate::transcode::request(route, &vars, query, body);
            if let Ok((_, message)) = crate::transcode::response(route, body) {
                let _ = crate::transcode::to_json(&message);
            }
        }
    }
}

/// The descriptor pool of the contract.
pub fn descriptor_pool() -> Result<DescriptorPool, Error> {
    DescriptorPool::decode(taskmesh::FILE_DESCRIPTOR_SET)
        .map_err(|e| Error::Descriptor(e.to_string()))
}
