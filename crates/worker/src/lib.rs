//! The taskmesh worker SDK.
//!
//! This crate owns the worker side of the `Dispatcher.Connect` stream: it
//! registers with a dispatcher, keeps the session alive with heartbeats,
//! acknowledges or rejects assignments, runs [`Handler`]s within a bounded
//! number of slots, reports their results, reconnects with backoff and
//! failover, and drains gracefully on shutdown.
//!
//! It also owns push mode ([`WorkerOptions::push_listen`]): the worker serves
//! the `Worker` service, registers its address with `RegisterPushWorker`,
//! receives assignments as `Worker.Execute` calls and reports results with
//! `ReportResult`. Handlers cannot tell the two modes apart.
//!
//! It depends only on the `taskmesh` contract crate (the code generated from
//! `proto/`) and must never depend on server internals (`taskmesh-core`,
//! `taskmesh-dispatcher`, ...): a worker talks to the server through the wire
//! protocol alone.
//!
//! ```no_run
//! use taskmesh_worker::{Worker, WorkerOptions, builtin, handler_fn, Output};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> Result<(), taskmesh_worker::Error> {
//! let opts = WorkerOptions::new(vec!["http://127.0.0.1:50051".to_string()]);
//! let worker = Worker::new(opts)
//!     .handler("echo", builtin::Echo)
//!     .handler("hello", handler_fn(|_ctx| async { Ok(Output::json(b"\"hi\"".to_vec())) }));
//! worker.run(CancellationToken::new()).await
//! # }
//! ```

#![warn(missing_docs)]

mod backoff;
pub mod builtin;
mod children;
mod cpu;
mod error;
mod exec;
mod handler;
mod logs;
mod options;
mod push;
mod session;
mod stats;
mod trace_context;
mod wire;
mod worker;

pub use builtin::{BUILTIN_NAMES, builtin};
pub use children::Children;
pub use error::Error;
pub use handler::{FnHandler, Handler, HandlerError, Output, TaskContext, handler_fn};
pub use logs::{CaptureLayer, MAX_LINE_BYTES, TaskLog, capture_layer};
pub use options::{ClientTls, Secret, WorkerOptions};
pub use stats::SlidingWindow;
pub use worker::{Worker, WorkerHandle};
