//! Client subcommands: submit, get, list, cancel. They talk gRPC to a node
//! and print either a short human form or the proto3 JSON of the response.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use prost::Message;
use taskmesh::v1::{self as pb, task_api_client::TaskApiClient};
use taskmesh_cli::env;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Output forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Short human-readable text.
    Text,
    /// The response as proto3 JSON.
    Json,
}

/// Flags every client subcommand takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Server URL (the first of a comma-separated list is used).
    #[arg(long, env = env::SERVER, default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// The namespace to act in (default: the token's, or "default" without
    /// authentication).
    #[arg(long, env = env::NAMESPACE, default_value = "")]
    pub namespace: String,
    /// A file holding the API token to present. Without it the token is
    /// read from $TASKMESH_TOKEN; it is never given as a flag (`ps` and
    /// shell histories would show it).
    #[arg(long, env = env::TOKEN_FILE, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub tls: taskmesh_cli::tls::ClientTlsFiles,
    /// Output form.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Presents the API token on every call (`authorization: Bearer …`).
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// A channel with the token on every call.
pub type Authorized = InterceptedService<Channel, Bearer>;

/// The `TaskApi` client the subcommands use.
pub type Api = TaskApiClient<Authorized>;

/// The API token: the file `--token-file` names, else `$TASKMESH_TOKEN`,
/// else none.
pub fn token(common: &Common) -> anyhow::Result<Option<String>> {
    let text = match &common.token_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?,
        None => match std::env::var(env::TOKEN) {
            Ok(t) => t,
            Err(_) => return Ok(None),
        },
    };
    let text = text.trim().to_string();
    Ok((!text.is_empty()).then_some(text))
}

/// The interceptor presenting `common`'s token.
pub fn bearer(common: &Common) -> anyhow::Result<Bearer> {
    let Some(token) = token(common)? else {
        return Ok(Bearer(None));
    };
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| anyhow::anyhow!("the token is not a valid header value"))?;
    Ok(Bearer(Some(value)))
}

/// A channel to `common`'s server, with its token on every call.
pub async fn channel(common: &Common) -> anyhow::Result<Authorized> {
    let url = common
        .server
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let bearer = bearer(common)?;
    let tls = common.tls.load()?;
    let channel = taskmesh_worker::ClientTls::endpoint(tls.as_ref(), &url)
        .with_context(|| format!("invalid server URL {url:?}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    Ok(InterceptedService::new(channel, bearer))
}

/// `taskmesh submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Handler name, e.g. echo.
    handler: String,
    /// Payload (sent as application/json when it parses as JSON).
    #[arg(long, default_value = "")]
    payload: String,
    /// Priority: higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Run after this delay, e.g. 30s or 5m.
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Idempotency key.
    #[arg(long)]
    client_request_id: Option<String>,
    /// Total attempts allowed.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Execution timeout of one attempt, e.g. 30s.
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Concurrency key, e.g. customer:42: across the cluster at most
    /// --concurrency-limit tasks of the namespace with this key run at once.
    #[arg(long, requires = "concurrency_limit", value_name = "KEY")]
    concurrency_key: Option<String>,
    /// Most tasks of --concurrency-key in flight at once (1-10000).
    #[arg(long, requires = "concurrency_key", value_name = "N")]
    concurrency_limit: Option<u32>,
    /// Submit it as a child of this live task (cancelled with it).
    #[arg(long, value_name = "TASK_ID")]
    parent: Option<String>,
    /// Sharding broadcast: run it once on each live worker serving the
    /// handler (shards 0..N-1; `taskmesh list --parent ID` shows them).
    #[arg(long)]
    broadcast: bool,
    #[command(flatten)]
    common: Common,
}

/// `taskmesh get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// Task id.
    task_id: String,
    #[command(flatten)]
    common: Common,
}

/// `taskmesh list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this state, e.g. RUNNING.
    #[arg(long)]
    state: Option<String>,
    /// Only this handler.
    #[arg(long)]
    handler: Option<String>,
    /// Only tasks carrying this label: KEY (any value) or KEY=VALUE.
    #[arg(long, value_name = "KEY[=VALUE]")]
    label: Option<String>,
    /// Only the children of this task.
    #[arg(long, value_name = "TASK_ID")]
    parent: Option<String>,
    /// Page size (1-1000).
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// Page token from a previous list.
    #[arg(long)]
    page_token: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// `taskmesh cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Task id.
    task_id: String,
    /// Why.
    #[arg(long, default_value = "")]
    reason: String,
    #[command(flatten)]
    common: Common,
}

pub async fn connect(common: &Common) -> anyhow::Result<Api> {
    Ok(TaskApiClient::new(channel(common).await?))
}

pub fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

/// A timestamp as RFC 3339 in UTC with milliseconds; `-` when unset.
pub fn ts(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .map(|t| {
            chrono::DateTime::from_timestamp(t.seconds, t.nanos as u32)
                .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .unwrap_or_default()
        })
        .unwrap_or_else(|| "-".into())
}

pub fn to_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// Prints a message as proto3 JSON using the contract's descriptors.
pub fn print_json<M: Message>(msg: &M, full_name: &str) -> anyhow::Result<()> {
    let pool = prost_reflect::DescriptorPool::decode(taskmesh::FILE_DESCRIPTOR_SET)?;
    let desc = pool
        .get_message_by_name(full_name)
        .with_context(|| format!("{full_name} missing from the descriptor set"))?;
    let dynamic = prost_reflect::DynamicMessage::decode(desc, msg.encode_to_vec().as_slice())?;
    println!("{}", serde_json::to_string_pretty(&dynamic)?);
    Ok(())
}

fn state_name(state: i32) -> &'static str {
    pb::TaskState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("TASK_STATE_"))
        .unwrap_or("?")
}

fn print_task(t: &pb::Task) {
    println!("task_id:  {}", t.task_id);
    println!("handler:  {}", t.handler);
    println!("state:    {}", state_name(t.state));
    println!(
        "attempts: {} (runs {} of {})",
        t.attempts.len(),
        t.run_count,
        t.max_attempts
    );
    if !t.concurrency_key.is_empty() {
        println!(
            "key:      {} (at most {} at once)",
            t.concurrency_key, t.concurrency_limit
        );
    }
    if !t.parent_task_id.is_empty() {
        println!("parent:   {}", t.parent_task_id);
    }
    if t.runs_workflow {
        println!("workflow run: its workflow's steps are its children (list --parent)");
    }
    if t.broadcast {
        println!("broadcast: its shards are its children (list --parent)");
    }
    if t.shard_total > 0 {
        println!("shard:    {} of {}", t.shard_index, t.shard_total);
    }
    if let Some(out) = &t.output {
        println!("output:   {}", String::from_utf8_lossy(&out.data));
    }
    if !t.error_message.is_empty() {
        println!("error:    {}", t.error_message);
    }
}

/// `taskmesh submit`.
pub async fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    let mut api = connect(&args.common).await?;
    let content_type = if serde_json::from_str::<serde_json::Value>(&args.payload).is_ok() {
        "application/json"
    } else {
        "text/plain"
    };
    let req = pb::SubmitTaskRequest {
        handler: args.handler,
        payload: Some(pb::Payload {
            data: args.payload.into_bytes(),
            content_type: content_type.into(),
        }),
        priority: args.priority,
        client_request_id: args.client_request_id.unwrap_or_default(),
        retry_policy: args.max_attempts.map(|n| pb::RetryPolicy {
            max_attempts: n,
            ..Default::default()
        }),
        timeout: args.timeout.map(to_duration),
        delay: args.delay.map(to_duration),
        namespace: args.common.namespace.clone(),
        concurrency_key: args.concurrency_key.unwrap_or_default(),
        concurrency_limit: args.concurrency_limit.unwrap_or_default(),
        parent_task_id: args.parent.unwrap_or_default(),
        broadcast: args.broadcast,
        ..Default::default()
    };
    let resp = api
        .submit_task(req)
        .await
        .map_err(status_error)?
        .into_inner();
    match args.common.output {
        Output::Json => print_json(&resp, "taskmesh.v1.SubmitTaskResponse"),
        Output::Text => {
            println!("{}", resp.task_id);
            Ok(())
        }
    }
}

/// `taskmesh get`.
pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    let mut api = connect(&args.common).await?;
    let resp = api
        .get_task(pb::GetTaskRequest {
            task_id: args.task_id,
            namespace: args.common.namespace.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    match args.common.output {
        Output::Json => print_json(&resp, "taskmesh.v1.GetTaskResponse"),
        Output::Text => {
            if let Some(t) = &resp.task {
                print_task(t);
            }
            Ok(())
        }
    }
}

/// `taskmesh list`.
pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let state = match &args.state {
        None => pb::TaskState::Unspecified,
        Some(s) => {
            let name = format!("TASK_STATE_{}", s.to_ascii_uppercase());
            pb::TaskState::from_str_name(&name).with_context(|| {
                format!("unknown state {s:?}; try READY, RUNNING, SUCCEEDED, FAILED")
            })?
        }
    };
    let mut api = connect(&args.common).await?;
    let resp = api
        .list_tasks(pb::ListTasksRequest {
            state: state as i32,
            handler: args.handler.unwrap_or_default(),
            page_size: args.limit,
            page_token: args.page_token.unwrap_or_default(),
            namespace: args.common.namespace.clone(),
            view: pb::TaskView::Summary as i32,
            label: args.label.unwrap_or_default(),
            parent_task_id: args.parent.unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map_err(status_error)?
        .into_inner();
    match args.common.output {
        Output::Json => print_json(&resp, "taskmesh.v1.ListTasksResponse"),
        Output::Text => {
            println!(
                "{:<36}  {:<11}  {:<16}  ATTEMPTS",
                "TASK_ID", "STATE", "HANDLER"
            );
            for t in &resp.tasks {
                println!(
                    "{:<36}  {:<11}  {:<16}  {}",
                    t.task_id,
                    state_name(t.state),
                    t.handler,
                    t.run_count
                );
            }
            if !resp.next_page_token.is_empty() {
                println!("next page: --page-token {}", resp.next_page_token);
            }
            Ok(())
        }
    }
}

/// `taskmesh cancel`.
pub async fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    let mut api = connect(&args.common).await?;
    let resp = api
        .cancel_task(pb::CancelTaskRequest {
            task_id: args.task_id,
            reason: args.reason,
            namespace: args.common.namespace.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    match args.common.output {
        Output::Json => print_json(&resp, "taskmesh.v1.CancelTaskResponse"),
        Output::Text => {
            if let Some(t) = &resp.task {
                print_task(t);
            }
            Ok(())
        }
    }
}
