//! Every environment variable taskmesh reads, in one place. Precedence:
//! built-in defaults < `TASKMESH_*` variables < command-line flags.

/// Directory holding the SQLite database (`serve`).
pub const DATA_DIR: &str = "TASKMESH_DATA_DIR";
/// gRPC listen address (`serve`).
pub const GRPC_ADDR: &str = "TASKMESH_GRPC_ADDR";
/// HTTP listen address: the REST gateway, `/openapi.json`, health (`serve`).
pub const HTTP_ADDR: &str = "TASKMESH_HTTP_ADDR";
/// ACK timeout (`serve`), e.g. "10s".
pub const ACK_TIMEOUT: &str = "TASKMESH_ACK_TIMEOUT";
/// `serve --ack-hold`.
pub const ACK_HOLD: &str = "TASKMESH_ACK_HOLD";
/// Heartbeat interval asked of workers (`serve`), e.g. "5s".
pub const HEARTBEAT_INTERVAL: &str = "TASKMESH_HEARTBEAT_INTERVAL";
/// Largest payload accepted at submit, in bytes (`serve`).
pub const MAX_PAYLOAD_BYTES: &str = "TASKMESH_MAX_PAYLOAD_BYTES";
/// Most steps a submitted workflow may have (`serve`).
pub const MAX_WORKFLOW_STEPS: &str = "TASKMESH_MAX_WORKFLOW_STEPS";
/// Requests in flight before shedding (`serve`).
pub const MAX_CONCURRENT_REQUESTS: &str = "TASKMESH_MAX_CONCURRENT_REQUESTS";
/// Balancer strategy per handler, `handler=STRATEGY`, comma-separated (`serve`).
pub const BALANCER: &str = "TASKMESH_BALANCER";
/// Balancer strategy for handlers not named in `TASKMESH_BALANCER` (`serve`).
pub const BALANCER_DEFAULT: &str = "TASKMESH_BALANCER_DEFAULT";
/// Virtual nodes per stream on consistent-hash rings (`serve`).
pub const HASH_VNODES: &str = "TASKMESH_HASH_VNODES";
/// Largest REST request body, in bytes (`serve`).
pub const MAX_BODY_BYTES: &str = "TASKMESH_MAX_BODY_BYTES";
/// Requests per second per namespace (`serve`).
pub const RATE_LIMIT: &str = "TASKMESH_RATE_LIMIT";
/// Requests per namespace allowed at once above the rate (`serve`).
pub const RATE_BURST: &str = "TASKMESH_RATE_BURST";
/// READY tasks per namespace (`serve`).
pub const MAX_READY_TASKS: &str = "TASKMESH_MAX_READY_TASKS";
/// Schedules per namespace (`serve`).
pub const MAX_SCHEDULES: &str = "TASKMESH_MAX_SCHEDULES";
/// Shortest time between two fires of a schedule (`serve`).
pub const MIN_SCHEDULE_INTERVAL: &str = "TASKMESH_MIN_SCHEDULE_INTERVAL";
/// Open watches per namespace on one server (`serve`).
pub const MAX_WATCHES: &str = "TASKMESH_MAX_WATCHES";
/// Worker sessions per namespace on one server (`serve`).
pub const MAX_WORKERS: &str = "TASKMESH_MAX_WORKERS";
/// Handlers one worker registration may name (`serve`).
pub const MAX_HANDLERS_PER_WORKER: &str = "TASKMESH_MAX_HANDLERS_PER_WORKER";
/// Open connections per port (`serve`).
pub const MAX_CONNECTIONS: &str = "TASKMESH_MAX_CONNECTIONS";
/// Open connections per port from one client address (`serve`).
pub const MAX_CONNECTIONS_PER_PEER: &str = "TASKMESH_MAX_CONNECTIONS_PER_PEER";
/// First bytes of a connection and a REST request's headers (`serve`).
pub const HEADER_READ_TIMEOUT: &str = "TASKMESH_HEADER_READ_TIMEOUT";
/// Callback signing secrets (`serve`; environment only, no flag): one or
/// more, separated by white space, each `whsec_` + base64 (the Standard
/// Webhooks form) or plain text; every one signs. Unset sends callbacks
/// unsigned.
pub const CALLBACK_SECRET: &str = "TASKMESH_CALLBACK_SECRET";
/// Callback POSTs in flight at once (`serve`).
pub const CALLBACK_CONCURRENCY: &str = "TASKMESH_CALLBACK_CONCURRENCY";
/// Callback POSTs in flight at once to one receiver (`serve`).
pub const CALLBACK_PER_HOST: &str = "TASKMESH_CALLBACK_PER_HOST";
/// Non-public ranges callbacks and push addresses may use (`serve`).
pub const EGRESS_ALLOW: &str = "TASKMESH_EGRESS_ALLOW";
/// Tries per callback before it is given up (`serve`).
pub const CALLBACK_MAX_ATTEMPTS: &str = "TASKMESH_CALLBACK_MAX_ATTEMPTS";
/// Server address(es) for clients and workers, comma-separated.
pub const SERVER: &str = "TASKMESH_SERVER";
/// Handlers a worker serves, comma-separated.
pub const HANDLERS: &str = "TASKMESH_HANDLERS";
/// Worker concurrency (slots).
pub const CONCURRENCY: &str = "TASKMESH_CONCURRENCY";
/// Push mode (`worker`): the address the worker's `Worker` service listens on.
pub const PUSH_LISTEN: &str = "TASKMESH_PUSH_LISTEN";
/// Push mode (`worker`): the URL servers call the worker at.
pub const PUSH_ADVERTISE: &str = "TASKMESH_PUSH_ADVERTISE";
/// Log format: "text" or "json".
pub const LOG_FORMAT: &str = "TASKMESH_LOG_FORMAT";
/// Log filter, in `tracing_subscriber::EnvFilter` syntax.
pub const LOG: &str = "TASKMESH_LOG";
/// Trigger engine of the scheduler: "wheel" (default) or "poll" (`serve`).
pub const TRIGGER_ENGINE: &str = "TASKMESH_TRIGGER_ENGINE";
/// Interval of the polling trigger engine (`serve`), e.g. "500ms".
pub const POLL_INTERVAL: &str = "TASKMESH_POLL_INTERVAL";
/// A schedule fire time further behind than this counts as missed (`serve`).
pub const MISFIRE_THRESHOLD: &str = "TASKMESH_MISFIRE_THRESHOLD";
/// How long SUCCEEDED tasks are kept after they ended (`serve`), e.g. "24h".
pub const RETENTION_SUCCEEDED: &str = "TASKMESH_RETENTION_SUCCEEDED";
/// How long FAILED (and, unless set apart, TIMED_OUT and CANCELLED) tasks
/// are kept (`serve`).
pub const RETENTION_FAILED: &str = "TASKMESH_RETENTION_FAILED";
/// How long TIMED_OUT tasks are kept (`serve`).
pub const RETENTION_TIMED_OUT: &str = "TASKMESH_RETENTION_TIMED_OUT";
/// Ended tasks removed per state per retention batch (`serve`).
pub const RETENTION_BATCH: &str = "TASKMESH_RETENTION_BATCH";
/// Fire records kept per schedule (`serve`).
pub const FIRE_HISTORY: &str = "TASKMESH_FIRE_HISTORY";
/// Task log lines kept per attempt (`serve`).
pub const LOG_MAX_LINES: &str = "TASKMESH_LOG_MAX_LINES";
/// Task log bytes kept per attempt (`serve`).
pub const LOG_MAX_BYTES: &str = "TASKMESH_LOG_MAX_BYTES";
/// How long CANCELLED tasks are kept (`serve`).
pub const RETENTION_CANCELLED: &str = "TASKMESH_RETENTION_CANCELLED";
/// Redis URL for cluster coordination (`serve`); unset means a single node.
pub const REDIS_URL: &str = "TASKMESH_REDIS_URL";
/// Prefix of every Redis key (`serve`).
pub const REDIS_PREFIX: &str = "TASKMESH_REDIS_PREFIX";
/// Leader lease TTL (`serve`, cluster mode), e.g. "10s".
pub const LEASE_TTL: &str = "TASKMESH_LEASE_TTL";
/// Leader lease renew interval (`serve`, cluster mode), e.g. "3s".
pub const LEASE_RENEW: &str = "TASKMESH_LEASE_RENEW";
/// The namespace client commands and workers act in.
pub const NAMESPACE: &str = "TASKMESH_NAMESPACE";
/// The API token client commands and workers present (environment only:
/// never a flag).
pub const TOKEN: &str = "TASKMESH_TOKEN";
/// A file holding the API token (instead of `TASKMESH_TOKEN`).
pub const TOKEN_FILE: &str = "TASKMESH_TOKEN_FILE";
/// A token that is an admin of every namespace (`serve`; environment only:
/// never a flag).
pub const BOOTSTRAP_TOKEN: &str = "TASKMESH_BOOTSTRAP_TOKEN";
/// Require tokens (`serve --auth`).
pub const AUTH: &str = "TASKMESH_AUTH";
/// Serve beyond loopback without authentication (`serve --insecure`).
pub const INSECURE: &str = "TASKMESH_INSECURE";

/// Database URL of the store (`serve`): postgres://, mysql:// or mariadb://; unset means SQLite in the data dir.
pub const DATABASE_URL: &str = "TASKMESH_DATABASE_URL";
/// Test-only fault hook (`serve`): a path; while a file exists there, a
/// scheduler round about to commit schedule fires waits after its lease
/// check (see `taskmesh_scheduler::fault`). Chaos tests use it to make a
/// deposed leader write with its old fencing token. Never set in production.
pub const FAULT_HOLD_ROUND: &str = "TASKMESH_FAULT_HOLD_ROUND";

// OpenTelemetry's standard variables that decide whether traces are
// exported at all; the SDK reads the rest (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES, ...).

/// OTLP endpoint for every signal, e.g. `http://127.0.0.1:4317`.
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// OTLP endpoint for traces only.
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `true` turns OpenTelemetry off whatever else is set.
pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
/// `none` turns trace export off.
pub const OTEL_TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
/// The service name spans are exported under (default `taskmesh`, or
/// `taskmesh-worker` for `taskmesh worker`).
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `serve --tls-cert`: the server's certificate chain (PEM).
pub const TLS_CERT: &str = "TASKMESH_TLS_CERT";
/// `serve --tls-key`: its private key (PEM).
pub const TLS_KEY: &str = "TASKMESH_TLS_KEY";
/// `serve --tls-client-ca`: CA certificates client certificates must chain to.
pub const TLS_CLIENT_CA: &str = "TASKMESH_TLS_CLIENT_CA";
/// Clients' `--tls-ca`: the CA to trust for https:// servers.
pub const TLS_CA: &str = "TASKMESH_TLS_CA";
/// Clients' `--tls-cert`: their certificate for mutual TLS.
pub const TLS_CLIENT_CERT: &str = "TASKMESH_TLS_CLIENT_CERT";
/// Clients' `--tls-key`: its private key.
pub const TLS_CLIENT_KEY: &str = "TASKMESH_TLS_CLIENT_KEY";
/// `serve --request-body-timeout`.
pub const REQUEST_BODY_TIMEOUT: &str = "TASKMESH_REQUEST_BODY_TIMEOUT";
/// `serve --max-streams-per-connection`.
pub const MAX_STREAMS_PER_CONNECTION: &str = "TASKMESH_MAX_STREAMS_PER_CONNECTION";
