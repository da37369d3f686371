//! The test kit: every helper taskmesh's tests share, once. Waiting on a
//! condition with a deadline ([`wait_for`], [`wait_task_state`]); real
//! processes that fail their test when they die on their own
//! ([`process`]); private Postgres, MariaDB and Redis servers and scratch
//! databases on the machine's shared ones ([`services`]); a cluster of
//! `taskmesh serve` and `taskmesh worker` processes ([`cluster`]) and what
//! the tests read from outside it ([`db`], [`metrics`]); in-process nodes
//! and workers whose failure or panic fails the test ([`node`],
//! [`workers`], [`raw`]); REST and SSE clients ([`http`]); a scripted
//! callback receiver ([`callbacks`]) and servers spawned by a test that are
//! stopped and checked ([`background`]).
//!
//! A dev-dependency only (`publish = false`). It must never be a
//! dependency of a library: a lib's own `#[cfg(test)]` unit tests cannot use
//! it (that would be a cycle), and production code never needs it. Tests
//! that run the `taskmesh` binary pass the binary built from the code under
//! test (`env!("CARGO_BIN_EXE_taskmesh")`, so they live in `crates/cli`);
//! the kit never looks for a binary itself.

pub mod background;
pub mod callbacks;
pub mod cluster;
pub mod db;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod netns;
pub mod node;
pub mod process;
pub mod raw;
pub mod record;
pub mod schedule;
pub mod services;
pub mod workers;

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use tonic::transport::Channel;

/// Polls `check` until it returns `Some`, failing the test after `limit`.
///
/// The one implementation lives in the coordinator's conformance suite
/// (`taskmesh_coord::conformance`, compiled into that library, which
/// cannot depend on this kit); everything else uses it from here.
pub use taskmesh_coord::conformance::wait_for;

/// The `retry-after-ms` hint of a refusal, if it carries one.
pub fn retry_after_ms(status: &tonic::Status) -> Option<u64> {
    status
        .metadata()
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

pub use node::{
    api, channel, children, get, node_options, shards, start_node, state, stop_node, submit,
};
pub use process::{Child, free_port, now_ms};
pub use raw::RawWorker;
pub use workers::{Ledger, TestWorker, counting_push_worker, counting_worker};

/// A task of `handler` with the JSON payload `json`.
pub fn json_task(handler: &str, json: &[u8]) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        handler: handler.into(),
        payload: Some(pb::Payload {
            data: json.to_vec(),
            content_type: "application/json".into(),
        }),
        ..Default::default()
    }
}

/// Waits until task `id` is in state `want` (read with `GetTask`), failing
/// the test after `limit`; returns the task as last read.
pub async fn wait_task_state(
    api: &TaskApiClient<Channel>,
    id: &str,
    want: pb::TaskState,
    limit: Duration,
) -> pb::Task {
    wait_for(&format!("task {id} to be {want:?}"), limit, || {
        let mut api = api.clone();
        let id = id.to_string();
        async move {
            let t = get(&mut api, &id).await;
            (state(&t) == want).then_some(t)
        }
    })
    .await
}
