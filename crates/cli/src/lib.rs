//! The wiring of a taskmesh node: store, coordination, scheduler, dispatcher
//! and the HTTP port, started together and stopped together. The binary's
//! subcommands live in `main.rs` and the modules beside it.
//!
//! Architecture invariant: no business rule lives here; this crate only
//! builds components from options and connects their handles.

pub mod conn;
pub mod env;
pub mod node;
pub mod telemetry;
pub mod tls;
