//! In-process nodes (`taskmesh_cli::node`) on ephemeral loopback ports,
//! and the gRPC client calls every test makes of them.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use taskmesh::v1::{self as pb, task_api_client::TaskApiClient};
use taskmesh_cli::node::{NodeOptions, RunningNode};
use tonic::transport::Channel;

use crate::services::SharedRedis;

/// How long a node's parts may take to stop in a test.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Node options on ephemeral loopback ports in `dir` (SQLite there).
pub fn node_options(dir: &Path) -> NodeOptions {
    let mut opts = NodeOptions::new();
    opts.data_dir = dir.to_path_buf();
    opts.grpc_addr = ([127, 0, 0, 1], 0).into();
    opts.http_addr = ([127, 0, 0, 1], 0).into();
    // Receivers and push workers of tests listen on loopback.
    opts.egress = taskmesh_core::egress::EgressPolicy::allowing_loopback();
    opts
}

/// Options of one replica of an in-process cluster: coordinated through
/// `redis` (lease TTL 3 s), its store at `database_url`.
pub fn replica_options(dir: &Path, redis: &SharedRedis, database_url: &str) -> NodeOptions {
    let mut opts = node_options(dir);
    opts.redis = Some(redis.options("replica"));
    opts.database_url = Some(database_url.to_string());
    opts
}

/// Starts an in-process node.
pub async fn start_node(opts: NodeOptions) -> RunningNode {
    taskmesh_cli::node::start(opts).await.unwrap_or_else(|e| {
        panic!("the node starts (`make services` for Redis and the databases): {e:#}")
    })
}

/// Stops a node, failing the test if any part of it failed, panicked or
/// did not stop in time.
pub async fn stop_node(node: RunningNode) {
    let failures = node.stop(STOP_GRACE).await;
    assert!(failures.is_empty(), "the node stopped badly: {failures:#?}");
}

/// A `TaskApi` client for `addr`.
pub async fn api(addr: SocketAddr) -> TaskApiClient<Channel> {
    TaskApiClient::new(channel(addr).await)
}

/// A channel to `addr`.
pub async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// Submits a task with a JSON payload and returns its id.
pub async fn submit(api: &mut TaskApiClient<Channel>, handler: &str, payload: &[u8]) -> String {
    api.submit_task(pb::SubmitTaskRequest {
        handler: handler.into(),
        payload: Some(pb::Payload {
            data: payload.to_vec(),
            content_type: "application/json".into(),
        }),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
    .task_id
}

/// Reads a task.
pub async fn get(api: &mut TaskApiClient<Channel>, id: &str) -> pb::Task {
    api.get_task(pb::GetTaskRequest {
        task_id: id.into(),
        ..Default::default()
    })
    .await
    .expect("get")
    .into_inner()
    .task
    .expect("task")
}

/// Every child of task `parent` (ListTasks by parent, all pages), newest
/// first.
pub async fn children(api: &mut TaskApiClient<Channel>, parent: &str) -> Vec<pb::Task> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = api
            .list_tasks(pb::ListTasksRequest {
                parent_task_id: parent.into(),
                page_size: 1000,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("ListTasks by parent")
            .into_inner();
        out.extend(page.tasks);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

/// The shards of broadcast `parent` (its children), by shard index.
pub async fn shards(api: &mut TaskApiClient<Channel>, parent: &str) -> Vec<pb::Task> {
    let mut tasks = children(api, parent).await;
    tasks.sort_by_key(|t| t.shard_index);
    tasks
}

/// The state of a task.
pub fn state(t: &pb::Task) -> pb::TaskState {
    pb::TaskState::try_from(t.state).unwrap_or(pb::TaskState::Unspecified)
}
