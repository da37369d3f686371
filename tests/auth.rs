//! Who may do what, end to end: every RPC and every REST route of a node
//! with `--auth`, called with each kind of bad or insufficient credential,
//! answers the documented code — and the store is exactly as it was.
//!
//! The calls are raw: the request bytes are the real request message of
//! each method (so a call the layer lets through reaches the handler's own
//! checks), the path is the method's gRPC path, and nothing is decoded but
//! the status.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use taskmesh::v1 as pb;
use taskmesh_cli::node::RunningNode;
use taskmesh_core::auth::{Role, new_token};
use taskmesh_dispatcher::auth::Need;
// Request and response bodies as bytes, untouched.
use taskmesh_gateway::BytesCodec as RawCodec;
use taskmesh_store::TaskFilter;
use taskmesh_testkit::*;
use taskmesh_worker::{
    HandlerError, Output, Secret, TaskContext, Worker, WorkerOptions, handler_fn,
};
use tonic::Code;
use tonic::transport::Channel;

/// The bootstrap token of the nodes these tests start.
const BOOTSTRAP: &str = "bootstrap-token-of-the-auth-tests-0123456789";

/// How a method streams.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Unary,
    ServerStream,
    Bidi,
}

/// A node with authentication on, a bootstrap token, and what the tests
/// act on: a task and a paused schedule in namespace `default`.
struct Fixture {
    node: RunningNode,
    _dir: tempfile::TempDir,
    channel: Channel,
    task_id: String,
    schedule_id: String,
    /// Admin, submitter, reader and worker tokens of `default`.
    tokens: Vec<(Role, String)>,
    /// A token of `default` that expired.
    expired: String,
    /// A token of `default` that was revoked.
    revoked: String,
    /// The public id of the default admin token.
    admin_id: String,
    /// An admin token of namespace `other`.
    other_admin: String,
}

fn with_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

async fn create_token(
    admin: &mut pb::admin_client::AdminClient<Channel>,
    namespace: &str,
    role: pb::TokenRole,
) -> pb::CreateTokenResponse {
    admin
        .create_token(with_token(
            BOOTSTRAP,
            pb::CreateTokenRequest {
                namespace: namespace.into(),
                role: role as i32,
                name: format!("{namespace}-{}", role.as_str_name()),
                ttl: None,
            },
        ))
        .await
        .expect("create a token")
        .into_inner()
}

impl Fixture {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = node_options(dir.path());
        opts.dispatcher.auth.enabled = true;
        opts.dispatcher.auth.bootstrap = Some(BOOTSTRAP.into());
        let node = start_node(opts).await;
        let channel = channel(node.grpc_addr).await;
        let mut admin = pb::admin_client::AdminClient::new(channel.clone());
        let mut tokens = Vec::new();
        let mut admin_id = String::new();
        for (role, pb_role) in [
            (Role::Admin, pb::TokenRole::Admin),
            (Role::Submitter, pb::TokenRole::Submitter),
            (Role::Reader, pb::TokenRole::Reader),
            (Role::Worker, pb::TokenRole::Worker),
        ] {
            let made = create_token(&mut admin, "default", pb_role).await;
            if role == Role::Admin {
                admin_id = made.info.unwrap().token_id;
            }
            tokens.push((role, made.token));
        }
        let revoked = create_token(&mut admin, "default", pb::TokenRole::Admin).await;
        admin
            .revoke_token(with_token(
                BOOTSTRAP,
                pb::RevokeTokenRequest {
                    token_id: revoked.info.unwrap().token_id,
                },
            ))
            .await
            .expect("revoke");
        // Expired a minute ago: written to the store as it would be found.
        let now = now_ms();
        let (expired, record) = new_token(
            "expired",
            "default",
            Role::Admin,
            now - 120_000,
            Some(now - 60_000),
        );
        node.store
            .create_token(&record)
            .await
            .expect("store a token");
        let other_admin = create_token(&mut admin, "other", pb::TokenRole::Admin)
            .await
            .token;

        let mut api = pb::task_api_client::TaskApiClient::new(channel.clone());
        let task_id = api
            .submit_task(with_token(
                BOOTSTRAP,
                pb::SubmitTaskRequest {
                    handler: "nobody-serves-this".into(),
                    payload: Some(pb::Payload {
                        data: b"{\"secret\":1}".to_vec(),
                        content_type: "application/json".into(),
                    }),
                    ..Default::default()
                },
            ))
            .await
            .expect("submit")
            .into_inner()
            .task_id;
        let schedule_id = api
            .create_schedule(with_token(
                BOOTSTRAP,
                pb::CreateScheduleRequest {
                    schedule: Some(pb::Schedule {
                        paused: true,
                        ..schedule::every_second("nobody-serves-this")
                    }),
                    ..Default::default()
                },
            ))
            .await
            .expect("create a schedule")
            .into_inner()
            .schedule
            .unwrap()
            .schedule_id;
        Self {
            node,
            _dir: dir,
            channel,
            task_id,
            schedule_id,
            tokens,
            expired,
            revoked: revoked.token,
            admin_id,
            other_admin,
        }
    }

    fn token(&self, role: Role) -> &str {
        &self.tokens.iter().find(|(r, _)| *r == role).unwrap().1
    }

    /// Fails the test naming every wrong answer, or if the store is no
    /// longer as `before`.
    async fn assert_refused_and_unchanged(&self, failures: &[String], before: &Value) {
        assert!(
            failures.is_empty(),
            "{} wrong answers:\n{}",
            failures.len(),
            failures.join("\n")
        );
        assert_eq!(
            self.snapshot().await,
            *before,
            "a refused call changed the store"
        );
    }

    /// Everything the calls could have changed, as the store holds it.
    async fn snapshot(&self) -> Value {
        let store = &self.node.store;
        let tasks = store
            .list_tasks(&TaskFilter {
                limit: 1_000,
                ..Default::default()
            })
            .await
            .expect("list tasks")
            .tasks;
        let (schedules, _) = store
            .list_schedules(None, None, 1_000)
            .await
            .expect("list schedules");
        let tokens = store.list_tokens(None).await.expect("list tokens");
        let workers = pb::task_api_client::TaskApiClient::new(self.channel.clone())
            .list_workers(with_token(BOOTSTRAP, pb::ListWorkersRequest::default()))
            .await
            .expect("list workers")
            .into_inner()
            .workers
            .len();
        json!({
            "tasks": tasks.iter().map(|t| json!([t.id, t.namespace, t.state.as_str(), t.version, t.attempt])).collect::<Vec<_>>(),
            "schedules": schedules.iter().map(|s| json!([s.id, s.namespace, s.version, s.paused])).collect::<Vec<_>>(),
            "tokens": tokens.iter().map(|t| json!([t.id, t.namespace, t.role.as_str(), t.revoked_at])).collect::<Vec<_>>(),
            "workers": workers,
        })
    }
}

/// One gRPC method: its path, how it streams, what its role needs, and
/// its request naming namespace `ns` (empty: the caller's own).
struct Rpc {
    path: &'static str,
    shape: Shape,
    need: Need,
    request: Box<dyn Fn(&str) -> Bytes>,
}

fn enc(m: impl Message) -> Bytes {
    Bytes::from(m.encode_to_vec())
}

fn rpcs(f: &Fixture) -> Vec<Rpc> {
    let task = f.task_id.clone();
    let sched = f.schedule_id.clone();
    let admin_id = f.admin_id.clone();
    let submit = |ns: &str| pb::SubmitTaskRequest {
        handler: "echo".into(),
        namespace: ns.into(),
        ..Default::default()
    };
    let registration = |ns: &str| pb::WorkerRegistration {
        worker_id: "intruder".into(),
        name: "intruder".into(),
        handlers: vec!["echo".into()],
        capacity: 1,
        namespace: ns.into(),
        ..Default::default()
    };
    let rpc = |path, shape, need, request: Box<dyn Fn(&str) -> Bytes>| Rpc {
        path,
        shape,
        need,
        request,
    };
    use Need::*;
    use Shape::*;
    // A request naming one resource by id (`field`), in namespace `ns`.
    macro_rules! by_id {
        ($path:literal, $shape:expr, $need:expr, $msg:ident { $field:ident: $id:expr }) => {{
            let id = $id.clone();
            rpc(
                $path,
                $shape,
                $need,
                Box::new(move |ns: &str| {
                    #[allow(clippy::needless_update)]
                    let request = pb::$msg {
                        $field: id.clone(),
                        namespace: ns.into(),
                        ..Default::default()
                    };
                    enc(request)
                }),
            )
        }};
    }
    vec![
        rpc(
            "/taskmesh.v1.TaskApi/SubmitTask",
            Unary,
            Submit,
            Box::new(move |ns| enc(submit(ns))),
        ),
        rpc(
            "/taskmesh.v1.TaskApi/SubmitTasks",
            Unary,
            Submit,
            Box::new(move |ns| {
                enc(pb::SubmitTasksRequest {
                    tasks: vec![submit(ns)],
                })
            }),
        ),
        by_id!(
            "/taskmesh.v1.TaskApi/GetTask",
            Unary,
            Read,
            GetTaskRequest { task_id: task }
        ),
        rpc(
            "/taskmesh.v1.TaskApi/ListTasks",
            Unary,
            Read,
            Box::new(|ns| {
                enc(pb::ListTasksRequest {
                    namespace: ns.into(),
                    ..Default::default()
                })
            }),
        ),
        by_id!(
            "/taskmesh.v1.TaskApi/CancelTask",
            Unary,
            Write,
            CancelTaskRequest { task_id: task }
        ),
        {
            let t = task.clone();
            rpc(
                "/taskmesh.v1.TaskApi/AckTask",
                Unary,
                Work,
                Box::new(move |ns| {
                    enc(pb::AckTaskRequest {
                        task_id: t.clone(),
                        execution_id: "stolen-execution-id".into(),
                        namespace: ns.into(),
                        report_secret: String::new(),
                    })
                }),
            )
        },
        by_id!(
            "/taskmesh.v1.TaskApi/WatchTask",
            ServerStream,
            Read,
            WatchTaskRequest { task_id: task }
        ),
        rpc(
            "/taskmesh.v1.TaskApi/ListWorkers",
            Unary,
            Read,
            Box::new(|ns| {
                enc(pb::ListWorkersRequest {
                    namespace: ns.into(),
                    ..Default::default()
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.TaskApi/CreateSchedule",
            Unary,
            Write,
            Box::new(|ns| {
                enc(pb::CreateScheduleRequest {
                    schedule: Some(schedule::every_second("echo")),
                    namespace: ns.into(),
                })
            }),
        ),
        by_id!(
            "/taskmesh.v1.TaskApi/GetSchedule",
            Unary,
            Read,
            GetScheduleRequest { schedule_id: sched }
        ),
        rpc(
            "/taskmesh.v1.TaskApi/ListSchedules",
            Unary,
            Read,
            Box::new(|ns| {
                enc(pb::ListSchedulesRequest {
                    namespace: ns.into(),
                    ..Default::default()
                })
            }),
        ),
        {
            let s = sched.clone();
            rpc(
                "/taskmesh.v1.TaskApi/UpdateSchedule",
                Unary,
                Write,
                Box::new(move |ns| {
                    enc(pb::UpdateScheduleRequest {
                        schedule: Some(pb::Schedule {
                            schedule_id: s.clone(),
                            ..schedule::every_second("echo")
                        }),
                        namespace: ns.into(),
                        ..Default::default()
                    })
                }),
            )
        },
        by_id!(
            "/taskmesh.v1.TaskApi/DeleteSchedule",
            Unary,
            Write,
            DeleteScheduleRequest { schedule_id: sched }
        ),
        by_id!(
            "/taskmesh.v1.TaskApi/PauseSchedule",
            Unary,
            Write,
            PauseScheduleRequest { schedule_id: sched }
        ),
        by_id!(
            "/taskmesh.v1.TaskApi/ResumeSchedule",
            Unary,
            Write,
            ResumeScheduleRequest { schedule_id: sched }
        ),
        by_id!(
            "/taskmesh.v1.TaskApi/TriggerSchedule",
            Unary,
            Write,
            TriggerScheduleRequest { schedule_id: sched }
        ),
        rpc(
            "/taskmesh.v1.TaskApi/ListCircuitBreakers",
            Unary,
            Read,
            Box::new(|ns| {
                enc(pb::ListCircuitBreakersRequest {
                    namespace: ns.into(),
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Dispatcher/Connect",
            Bidi,
            Work,
            Box::new(move |ns| {
                enc(pb::ConnectRequest {
                    message: Some(pb::connect_request::Message::Register(registration(ns))),
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Dispatcher/RegisterPushWorker",
            Unary,
            Work,
            Box::new(move |ns| {
                enc(pb::RegisterPushWorkerRequest {
                    registration: Some(registration(ns)),
                    address: "http://127.0.0.1:9".into(),
                    ..Default::default()
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Dispatcher/ReportResult",
            Unary,
            Work,
            Box::new(move |_| {
                enc(pb::ReportResultRequest {
                    session_id: "someone-elses-session".into(),
                    complete: Some(pb::TaskComplete {
                        task_id: task.clone(),
                        execution_id: "stolen-execution-id".into(),
                        result: Some(pb::task_complete::Result::Success(pb::TaskSuccess {
                            output: Some(pb::Payload {
                                data: b"{\"paid\":true}".to_vec(),
                                content_type: "application/json".into(),
                            }),
                        })),
                    }),
                    report_secret: String::new(),
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Dispatcher/DeregisterPushWorker",
            Unary,
            Work,
            Box::new(|_| {
                enc(pb::DeregisterPushWorkerRequest {
                    session_id: "someone-elses-session".into(),
                    reason: "test".into(),
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Admin/CreateToken",
            Unary,
            Admin,
            Box::new(|ns| {
                enc(pb::CreateTokenRequest {
                    namespace: ns.into(),
                    role: pb::TokenRole::Admin as i32,
                    name: "escalation".into(),
                    ttl: None,
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Admin/ListTokens",
            Unary,
            Admin,
            Box::new(|ns| {
                enc(pb::ListTokensRequest {
                    namespace: ns.into(),
                })
            }),
        ),
        rpc(
            "/taskmesh.v1.Admin/RevokeToken",
            Unary,
            Admin,
            Box::new(move |_| {
                enc(pb::RevokeTokenRequest {
                    token_id: admin_id.clone(),
                })
            }),
        ),
    ]
}

/// Calls `rpc` presenting `authorization` (a whole header value), with
/// the request naming namespace `ns`; the code it ends with.
async fn call(channel: &Channel, rpc: &Rpc, authorization: Option<&str>, ns: &str) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("the channel is ready");
    let body = (rpc.request)(ns);
    let path = ::http::uri::PathAndQuery::from_static(rpc.path);
    let add = |metadata: &mut tonic::metadata::MetadataMap| {
        if let Some(value) = authorization {
            metadata.insert("authorization", value.parse().unwrap());
        }
    };
    let deadline = Duration::from_secs(10);
    let result = match rpc.shape {
        Shape::Unary => {
            let mut req = tonic::Request::new(body);
            add(req.metadata_mut());
            let reply = grpc.unary(req, path, RawCodec).await;
            // A batch answers OK with one code per task.
            match reply {
                Ok(r) if rpc.path.ends_with("/SubmitTasks") => {
                    let r = pb::SubmitTasksResponse::decode(r.into_inner()).expect("decode");
                    match r.results.first().map(|x| x.error_code).unwrap_or(0) {
                        0 => Ok(()),
                        code => Err(tonic::Status::new(Code::from_i32(code), "in the batch")),
                    }
                }
                other => other.map(|_| ()),
            }
        }
        Shape::ServerStream | Shape::Bidi => {
            let response = if matches!(rpc.shape, Shape::Bidi) {
                // The stream stays open (the server answers the
                // registration before the client's side ends).
                let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
                tx.send(body).await.unwrap();
                let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
                add(req.metadata_mut());
                let r = grpc.streaming(req, path, RawCodec).await;
                drop(tx);
                r
            } else {
                let mut req = tonic::Request::new(body);
                add(req.metadata_mut());
                grpc.server_streaming(req, path, RawCodec).await
            };
            match response {
                Err(status) => Err(status),
                Ok(response) => {
                    let mut stream = response.into_inner();
                    match tokio::time::timeout(deadline, stream.message()).await {
                        Ok(Err(status)) => Err(status),
                        Ok(Ok(_)) => Ok(()),
                        Err(_) => panic!("{}: no answer within {deadline:?}", rpc.path),
                    }
                }
            }
        }
    };
    match result {
        Ok(()) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// The credentials no call may pass with, as `authorization` values.
fn refused_credentials(f: &Fixture) -> Vec<(&'static str, Option<String>)> {
    let unknown = new_token("unknown", "default", Role::Admin, 0, None).0;
    vec![
        ("no token", None),
        (
            "not a bearer token",
            Some(format!("Basic {}", "dXNlcjpwYXNz")),
        ),
        ("a malformed token", Some("Bearer tmk_not-a-token".into())),
        ("an unknown token", Some(format!("Bearer {unknown}"))),
        ("an expired token", Some(format!("Bearer {}", f.expired))),
        ("a revoked token", Some(format!("Bearer {}", f.revoked))),
        // A real token with one character changed: found by its id, refused by its digest.
        (
            "a forged secret",
            Some(format!("Bearer {}", flip_last(f.token(Role::Admin)))),
        ),
    ]
}

/// `taskmesh_auth_refused_total` by reason, from the node's `/metrics`.
async fn refusals(f: &Fixture) -> std::collections::HashMap<&'static str, f64> {
    let text = metrics::scrape(f.node.http_addr.port())
        .await
        .expect("/metrics answers on loopback");
    [
        "missing",
        "malformed",
        "unknown",
        "expired",
        "revoked",
        "role",
        "namespace",
    ]
    .into_iter()
    .map(|r| {
        let v = metrics::sum(&text, "taskmesh_auth_refused_total", &[("reason", r)]);
        (r, v)
    })
    .collect()
}

fn flip_last(token: &str) -> String {
    let mut t = token.to_string();
    let last = if t.ends_with('0') { "1" } else { "0" };
    t.replace_range(t.len() - 1.., last);
    t
}

#[tokio::test]
async fn every_rpc_refuses_what_may_not_call_it_and_writes_nothing() {
    let f = Fixture::start().await;
    let before = f.snapshot().await;
    let refused_before = refusals(&f).await;
    let rpcs = rpcs(&f);
    assert_eq!(
        rpcs.len(),
        24,
        "every method of TaskApi, Dispatcher and Admin"
    );
    let mut failures = Vec::new();
    let mut check = |what: String, got: Code, want: Code| {
        if got != want {
            failures.push(format!("{what}: {got:?}, want {want:?}"));
        }
    };
    for rpc in &rpcs {
        for (what, header) in refused_credentials(&f) {
            let got = call(&f.channel, rpc, header.as_deref(), "").await;
            check(
                format!("{} with {what}", rpc.path),
                got,
                Code::Unauthenticated,
            );
        }
        let bearer = |role| format!("Bearer {}", f.token(role));
        if rpc.need != Need::Read {
            let got = call(&f.channel, rpc, Some(&bearer(Role::Reader)), "").await;
            check(
                format!("{} as a reader", rpc.path),
                got,
                Code::PermissionDenied,
            );
        }
        if rpc.path.starts_with("/taskmesh.v1.TaskApi/") && rpc.need != Need::Work
            || rpc.need == Need::Admin
        {
            let got = call(&f.channel, rpc, Some(&bearer(Role::Worker)), "").await;
            check(
                format!("{} as a worker", rpc.path),
                got,
                Code::PermissionDenied,
            );
        }
        if matches!(rpc.need, Need::Work | Need::Admin) {
            let got = call(&f.channel, rpc, Some(&bearer(Role::Submitter)), "").await;
            check(
                format!("{} as a submitter", rpc.path),
                got,
                Code::PermissionDenied,
            );
        }
        // An admin of another namespace naming `default`: refused for the
        // namespace; where a request names no namespace, what it points at
        // does not exist for that caller.
        let other = format!("Bearer {}", f.other_admin);
        let names_nothing = [
            "/taskmesh.v1.Dispatcher/ReportResult",
            "/taskmesh.v1.Dispatcher/DeregisterPushWorker",
            "/taskmesh.v1.Admin/RevokeToken",
        ];
        let want = if names_nothing.contains(&rpc.path) {
            Code::NotFound
        } else {
            Code::PermissionDenied
        };
        let got = call(&f.channel, rpc, Some(&other), "default").await;
        check(
            format!("{} from namespace other naming default", rpc.path),
            got,
            want,
        );
    }
    // By id alone, another namespace's task and schedule do not exist:
    // NOT_FOUND, never PERMISSION_DENIED (which would confirm them).
    let other = format!("Bearer {}", f.other_admin);
    for rpc in rpcs.iter().filter(|r| {
        r.path.contains("Task/") && !r.path.ends_with("SubmitTask") && !r.path.ends_with("AckTask")
            || r.path.contains("Schedule/") && !r.path.ends_with("CreateSchedule")
    }) {
        let got = call(&f.channel, rpc, Some(&other), "").await;
        check(
            format!("{} by id from namespace other", rpc.path),
            got,
            Code::NotFound,
        );
    }
    f.assert_refused_and_unchanged(&failures, &before).await;
    // Every refusal is counted by its reason (the counters are the
    // process's: other tests only add to them).
    let refused = refusals(&f).await;
    let n = rpcs.len() as f64;
    for (reason, at_least) in [
        ("missing", n),
        ("malformed", 2.0 * n),
        ("unknown", 2.0 * n),
        ("expired", n),
        ("revoked", n),
        ("role", n),
        ("namespace", 1.0),
    ] {
        let counted = refused[reason] - refused_before[reason];
        assert!(
            counted >= at_least,
            "taskmesh_auth_refused_total{{reason={reason:?}}} rose by {counted}, want >= {at_least}"
        );
    }
    // The health service stays open.
    let mut health = tonic_health::pb::health_client::HealthClient::new(f.channel.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health answers without a token");
    stop_node(f.node).await;
}

/// One REST route: method, path (ids filled in) and a body naming `ns`.
fn routes(f: &Fixture) -> Vec<(Method, String, Need, Option<Value>)> {
    let t = &f.task_id;
    let s = &f.schedule_id;
    let submit =
        json!({"handler": "echo", "payload": {"data": "e30=", "contentType": "application/json"}});
    let schedule = json!({"kind": "SCHEDULE_KIND_CRON", "cronExpression": "* * * * * *", "timeZone": "UTC", "template": {"handler": "echo"}});
    use Need::*;
    vec![
        (
            Method::POST,
            "/api/tasks".into(),
            Write,
            Some(submit.clone()),
        ),
        (
            Method::POST,
            "/api/tasks:batch".into(),
            Write,
            Some(json!({"tasks": [submit]})),
        ),
        (Method::GET, format!("/api/tasks/{t}"), Read, None),
        (Method::GET, "/api/tasks".into(), Read, None),
        (
            Method::POST,
            format!("/api/tasks/{t}/cancel"),
            Write,
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/api/tasks/{t}/ack"),
            Work,
            Some(json!({"executionId": "stolen"})),
        ),
        (Method::GET, format!("/api/tasks/{t}/watch"), Read, None),
        (Method::GET, "/api/workers".into(), Read, None),
        (
            Method::POST,
            "/api/schedules".into(),
            Write,
            Some(schedule.clone()),
        ),
        (Method::GET, format!("/api/schedules/{s}"), Read, None),
        (Method::GET, "/api/schedules".into(), Read, None),
        (
            Method::PUT,
            format!("/api/schedules/{s}"),
            Write,
            Some(schedule),
        ),
        (Method::DELETE, format!("/api/schedules/{s}"), Write, None),
        (
            Method::POST,
            format!("/api/schedules/{s}/pause"),
            Write,
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/api/schedules/{s}/resume"),
            Write,
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/api/schedules/{s}/trigger"),
            Write,
            Some(json!({})),
        ),
        (Method::GET, "/api/breakers".into(), Read, None),
        (
            Method::POST,
            "/api/tokens".into(),
            Admin,
            Some(json!({"role": "TOKEN_ROLE_ADMIN", "name": "escalation"})),
        ),
        (Method::GET, "/api/tokens".into(), Admin, None),
        (
            Method::POST,
            format!("/api/tokens/{}/revoke", f.admin_id),
            Admin,
            Some(json!({})),
        ),
    ]
}

async fn rest_call(
    addr: SocketAddr,
    method: &Method,
    path: &str,
    body: Option<&Value>,
    authorization: Option<&str>,
) -> StatusCode {
    let rest = taskmesh_testkit::http::Rest::new(addr);
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = authorization {
        headers.push(("authorization", a));
    }
    let bytes = body.map(|b| b.to_string().into_bytes());
    let reply = rest.raw(method.clone(), path, &headers, bytes).await;
    // A batch answers 200 with one code per task (gRPC codes).
    if reply.status == StatusCode::OK && path.starts_with("/api/tasks:batch") {
        return match reply.json["results"][0]["errorCode"].as_i64() {
            Some(7) => StatusCode::FORBIDDEN,
            Some(code) => panic!("{path}: code {code} in the batch"),
            None => StatusCode::OK,
        };
    }
    reply.status
}

#[tokio::test]
async fn every_rest_route_refuses_what_may_not_call_it_and_writes_nothing() {
    let f = Fixture::start().await;
    let addr = f.node.http_addr;
    let before = f.snapshot().await;
    let routes = routes(&f);
    let mut failures = Vec::new();
    let mut check = |what: String, got: StatusCode, want: StatusCode| {
        if got != want {
            failures.push(format!("{what}: {got}, want {want}"));
        }
    };
    for (method, path, need, body) in &routes {
        let name = format!("{method} {path}");
        for (what, header) in refused_credentials(&f) {
            let got = rest_call(addr, method, path, body.as_ref(), header.as_deref()).await;
            check(format!("{name} with {what}"), got, StatusCode::UNAUTHORIZED);
        }
        let bearer = |role| format!("Bearer {}", f.token(role));
        if *need != Need::Read {
            let got = rest_call(
                addr,
                method,
                path,
                body.as_ref(),
                Some(&bearer(Role::Reader)),
            )
            .await;
            check(format!("{name} as a reader"), got, StatusCode::FORBIDDEN);
        }
        if *need != Need::Work {
            let got = rest_call(
                addr,
                method,
                path,
                body.as_ref(),
                Some(&bearer(Role::Worker)),
            )
            .await;
            check(format!("{name} as a worker"), got, StatusCode::FORBIDDEN);
        }
        // From another namespace: naming `default` is forbidden; by id
        // alone the resource does not exist for that caller.
        let other = format!("Bearer {}", f.other_admin);
        let by_id_only = path.starts_with("/api/tokens/");
        // Where each route takes the namespace: the query when the body is
        // not the request (GET, DELETE, `body: "schedule"`), each task of a
        // batch, else the body.
        let in_query = matches!(*method, Method::GET | Method::DELETE | Method::PUT)
            || path == "/api/schedules";
        let (named_path, named_body) = match body {
            _ if by_id_only => (path.clone(), body.clone()),
            _ if in_query => (format!("{path}?namespace=default"), body.clone()),
            Some(b) if path == "/api/tasks:batch" => {
                let mut b = b.clone();
                b["tasks"][0]["namespace"] = json!("default");
                (path.clone(), Some(b))
            }
            Some(b) => {
                let mut b = b.clone();
                b["namespace"] = json!("default");
                (path.clone(), Some(b))
            }
            None => (path.clone(), None),
        };
        let want = if by_id_only {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::FORBIDDEN
        };
        let got = rest_call(addr, method, &named_path, named_body.as_ref(), Some(&other)).await;
        check(
            format!("{name} from namespace other naming default"),
            got,
            want,
        );
    }
    f.assert_refused_and_unchanged(&failures, &before).await;
    // Health stays open; /metrics needs a token once the node is not
    // open-by-default (it is on loopback here: open).
    let health = rest_call(addr, &Method::GET, "/healthz", None, None).await;
    assert_eq!(health, StatusCode::OK);
    stop_node(f.node).await;
}

// ---------------------------------------------------------------------------
// The attacks of the issue that introduced authentication, each performed
// against a node with `--auth` and refused.

/// A token of `namespace` with `role`, made with the bootstrap token.
async fn token_of(channel: &Channel, namespace: &str, role: pb::TokenRole) -> String {
    let mut admin = pb::admin_client::AdminClient::new(channel.clone());
    create_token(&mut admin, namespace, role).await.token
}

/// Reads a task presenting `token`.
async fn get_as(channel: &Channel, token: &str, id: &str) -> pb::Task {
    pb::task_api_client::TaskApiClient::new(channel.clone())
        .get_task(with_token(
            token,
            pb::GetTaskRequest {
                task_id: id.into(),
                ..Default::default()
            },
        ))
        .await
        .expect("get the task")
        .into_inner()
        .task
        .expect("a task")
}

/// Waits until task `id` is in `want`, reading it with the bootstrap token.
async fn wait_state(channel: &Channel, id: &str, want: pb::TaskState) -> pb::Task {
    wait_for(
        &format!("task {id} to be {want:?}"),
        Duration::from_secs(20),
        || async {
            let t = get_as(channel, BOOTSTRAP, id).await;
            (t.state == want as i32).then_some(t)
        },
    )
    .await
}

/// Submits a task of `handler` in the token's namespace; its id.
async fn submit_as(channel: &Channel, token: &str, handler: &str, payload: &str) -> String {
    pb::task_api_client::TaskApiClient::new(channel.clone())
        .submit_task(with_token(
            token,
            pb::SubmitTaskRequest {
                handler: handler.into(),
                payload: Some(pb::Payload {
                    data: payload.as_bytes().to_vec(),
                    content_type: "application/json".into(),
                }),
                ..Default::default()
            },
        ))
        .await
        .expect("submit")
        .into_inner()
        .task_id
}

fn registration(worker_id: &str, handler: &str, namespace: &str) -> pb::WorkerRegistration {
    pb::WorkerRegistration {
        worker_id: worker_id.into(),
        name: worker_id.into(),
        handlers: vec![handler.into()],
        capacity: 10,
        namespace: namespace.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_worker_of_another_namespace_receives_none_of_its_payloads() {
    let f = Fixture::start().await;
    let addr = f.node.grpc_addr;
    let intruder = token_of(&f.channel, "other", pb::TokenRole::Worker).await;
    // Naming the victim's namespace is refused outright.
    let refused = RawWorker::open(
        addr,
        Some(&intruder),
        registration("fake", "echo", "default"),
    )
    .await
    .err()
    .expect("a worker token of `other` may not serve `default`");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Registered in its own namespace, for the same handler, it gets nothing
    // of `default` — although it is the only `echo` worker while the
    // secrets are submitted.
    let mut fake = RawWorker::open(addr, Some(&intruder), registration("fake", "echo", ""))
        .await
        .expect("a worker of `other`");
    let mut ids = Vec::new();
    for i in 0..4 {
        let submitter = f.token(Role::Submitter);
        ids.push(submit_as(&f.channel, submitter, "echo", &format!("\"secret-{i}\"")).await);
    }
    let mut real = RawWorker::open(
        addr,
        Some(f.token(Role::Worker)),
        registration("real", "echo", ""),
    )
    .await
    .expect("a worker of `default`");
    let got = real.assigns(4).await;
    let mut got_ids: Vec<_> = got.iter().map(|a| a.task_id.clone()).collect();
    got_ids.sort();
    ids.sort();
    assert_eq!(
        got_ids, ids,
        "the worker of `default` runs every task of `default`"
    );
    assert!(
        fake.fence().await.is_empty(),
        "the worker of `other` received a task of `default`"
    );
    // Neither namespace's worker list shows the other's workers.
    for (token, want) in [
        (f.token(Role::Reader), "real"),
        (f.other_admin.as_str(), "fake"),
    ] {
        let workers = pb::task_api_client::TaskApiClient::new(f.channel.clone())
            .list_workers(with_token(token, pb::ListWorkersRequest::default()))
            .await
            .expect("list workers")
            .into_inner()
            .workers;
        let names: Vec<_> = workers.iter().map(|w| w.worker_id.as_str()).collect();
        assert_eq!(
            names,
            [want],
            "workers seen by a token of another namespace"
        );
        assert!(
            token != f.token(Role::Reader) || workers.iter().all(|w| w.session_id.is_empty()),
            "a reader sees no session ids"
        );
    }
    fake.close().await;
    real.close().await;
    stop_node(f.node).await;
}

#[tokio::test]
async fn a_stolen_execution_id_acknowledges_nothing() {
    let f = Fixture::start().await;
    let addr = f.node.grpc_addr;
    let mut worker = RawWorker::open(
        addr,
        Some(f.token(Role::Worker)),
        registration("w", "echo", ""),
    )
    .await
    .expect("a worker");
    let id = submit_as(&f.channel, f.token(Role::Submitter), "echo", "{}").await;
    let a = worker
        .next_assign(Duration::from_secs(10))
        .await
        .expect("an assignment");
    assert!(
        !a.report_secret.is_empty(),
        "the assignment carries its secret"
    );
    // What the public API shows: the execution id (to a submitter).
    let shown = get_as(&f.channel, f.token(Role::Submitter), &id).await;
    assert_eq!(shown.execution_id, a.execution_id);
    assert!(
        get_as(&f.channel, f.token(Role::Reader), &id)
            .await
            .execution_id
            .is_empty(),
        "a reader sees no execution id"
    );
    let attacker = token_of(&f.channel, "default", pb::TokenRole::Worker).await;
    let mut api = pb::task_api_client::TaskApiClient::new(f.channel.clone());
    for secret in ["", "0000", &a.report_secret[..a.report_secret.len() - 1]] {
        let err = api
            .ack_task(with_token(
                &attacker,
                pb::AckTaskRequest {
                    task_id: id.clone(),
                    execution_id: shown.execution_id.clone(),
                    report_secret: secret.into(),
                    ..Default::default()
                },
            ))
            .await
            .expect_err("an ACK without the assignment's secret");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }
    assert_eq!(
        get_as(&f.channel, BOOTSTRAP, &id).await.state,
        pb::TaskState::Dispatching as i32,
        "the forged ACKs changed nothing"
    );
    // The worker's own ACK still lands.
    worker.ack(&a).await;
    wait_state(&f.channel, &id, pb::TaskState::Running).await;
    worker.succeed(&a).await;
    wait_state(&f.channel, &id, pb::TaskState::Succeeded).await;
    // The out-of-band ACK works with the secret.
    let id2 = submit_as(&f.channel, f.token(Role::Submitter), "echo", "{}").await;
    let a2 = worker
        .next_assign(Duration::from_secs(10))
        .await
        .expect("an assignment");
    assert_eq!(a2.task_id, id2);
    api.ack_task(with_token(
        f.token(Role::Worker),
        pb::AckTaskRequest {
            task_id: id2.clone(),
            execution_id: a2.execution_id.clone(),
            report_secret: a2.report_secret.clone(),
            ..Default::default()
        },
    ))
    .await
    .expect("the ACK with the assignment's secret");
    wait_state(&f.channel, &id2, pb::TaskState::Running).await;
    worker.succeed(&a2).await;
    wait_state(&f.channel, &id2, pb::TaskState::Succeeded).await;
    worker.close().await;
    stop_node(f.node).await;
}

/// A push worker with the `default` worker token whose `hold` handler
/// waits for `release`; its push port, its handle and its task.
async fn held_push_worker(
    f: &Fixture,
    release: Arc<tokio::sync::Notify>,
    runs: Arc<std::sync::atomic::AtomicU32>,
) -> (u16, TestWorker) {
    let port = free_port();
    let mut opts = WorkerOptions::new(vec![format!("http://{}", f.node.grpc_addr)]);
    opts.worker_id = "pushed".into();
    opts.name = "pushed".into();
    opts.token = Some(Secret::new(f.token(Role::Worker)));
    opts.push_listen = Some(([127, 0, 0, 1], port).into());
    opts.reconnect_initial = Duration::from_millis(50);
    let hold = handler_fn(move |ctx: TaskContext| {
        let release = release.clone();
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            release.notified().await;
            Ok::<_, HandlerError>(Output::new(ctx.payload.clone(), ctx.content_type.clone()))
        }
    });
    let worker = TestWorker::spawn(Worker::new(opts).handler("hold", hold));
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);
    (port, worker)
}

#[tokio::test]
async fn a_forged_push_result_is_refused_and_the_real_one_recorded() {
    let f = Fixture::start().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (_, worker) = held_push_worker(&f, release.clone(), runs.clone()).await;
    let id = submit_as(
        &f.channel,
        f.token(Role::Submitter),
        "hold",
        "{\"paid\":false}",
    )
    .await;
    let running = wait_state(&f.channel, &id, pb::TaskState::Running).await;
    // What the public API shows an admin: the session and the execution.
    let workers = pb::task_api_client::TaskApiClient::new(f.channel.clone())
        .list_workers(with_token(
            f.token(Role::Admin),
            pb::ListWorkersRequest::default(),
        ))
        .await
        .expect("list workers")
        .into_inner()
        .workers;
    let session_id = workers[0].session_id.clone();
    assert!(!session_id.is_empty());
    let forged = |session_id: &str| pb::ReportResultRequest {
        session_id: session_id.into(),
        complete: Some(pb::TaskComplete {
            task_id: id.clone(),
            execution_id: running.execution_id.clone(),
            result: Some(pb::task_complete::Result::Success(pb::TaskSuccess {
                output: Some(pb::Payload {
                    data: b"{\"paid\":true}".to_vec(),
                    content_type: "application/json".into(),
                }),
            })),
        }),
        report_secret: String::new(),
    };
    let mut dispatcher = pb::dispatcher_client::DispatcherClient::new(f.channel.clone());
    // Another worker identity: not its session.
    let attacker = token_of(&f.channel, "default", pb::TokenRole::Worker).await;
    let err = dispatcher
        .report_result(with_token(&attacker, forged(&session_id)))
        .await
        .expect_err("a result for another identity's session");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // Even the session's own token, without the assignment's secret.
    let err = dispatcher
        .report_result(with_token(f.token(Role::Worker), forged(&session_id)))
        .await
        .expect_err("a result without the assignment's secret");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // Nor log lines into its task's log.
    let lines = pb::ReportLogsRequest {
        session_id: session_id.clone(),
        logs: Some(pb::TaskLogs {
            task_id: id.clone(),
            execution_id: running.execution_id.clone(),
            lines: vec![pb::LogLine {
                message: "forged".into(),
                ..Default::default()
            }],
            dropped: 0,
        }),
        report_secret: String::new(),
    };
    let err = dispatcher
        .report_logs(with_token(f.token(Role::Worker), lines))
        .await
        .expect_err("log lines without the assignment's secret");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // No token at all.
    let err = dispatcher
        .report_result(forged(&session_id))
        .await
        .expect_err("an unauthenticated result");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert_eq!(
        get_as(&f.channel, BOOTSTRAP, &id).await.state,
        pb::TaskState::Running as i32,
        "the forgeries changed nothing"
    );
    release.notify_one();
    let done = wait_state(&f.channel, &id, pb::TaskState::Succeeded).await;
    let output = done.output.expect("an output").data;
    assert_eq!(
        output, b"{\"paid\":false}",
        "the real worker's result stands"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    worker.stop().await;
    stop_node(f.node).await;
}

#[tokio::test]
async fn a_push_worker_runs_nothing_for_a_caller_that_is_not_its_server() {
    let f = Fixture::start().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (port, worker) = held_push_worker(&f, release.clone(), runs.clone()).await;
    let mut direct =
        pb::worker_client::WorkerClient::new(channel(([127, 0, 0, 1], port).into()).await);
    let execute = || pb::ExecuteRequest {
        assignment: Some(pb::TaskAssignment {
            task_id: uuid::Uuid::now_v7().to_string(),
            attempt: 1,
            execution_id: "made-up".into(),
            handler: "hold".into(),
            payload: Some(pb::Payload {
                data: b"{}".to_vec(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        }),
        session_id: String::new(),
    };
    let forged_secrets = [None, Some(f.token(Role::Worker)), Some(BOOTSTRAP)];
    for secret in forged_secrets {
        let request = match secret {
            Some(s) => with_token(s, execute()),
            None => tonic::Request::new(execute()),
        };
        let err = direct
            .execute(request)
            .await
            .expect_err("an Execute from a stranger");
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        let cancel = pb::CancelRequest {
            task_id: uuid::Uuid::now_v7().to_string(),
            execution_id: "made-up".into(),
            reason: "attack".into(),
        };
        let err = direct
            .cancel(match secret {
                Some(s) => with_token(s, cancel),
                None => tonic::Request::new(cancel),
            })
            .await
            .expect_err("a Cancel from a stranger");
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    }
    // The server's own calls still run tasks.
    let id = submit_as(&f.channel, f.token(Role::Submitter), "hold", "{}").await;
    wait_state(&f.channel, &id, pb::TaskState::Running).await;
    release.notify_one();
    wait_state(&f.channel, &id, pb::TaskState::Succeeded).await;
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the server's Execute ran the handler"
    );
    worker.stop().await;
    stop_node(f.node).await;
}

#[tokio::test]
async fn a_worker_id_held_on_another_replica_cannot_be_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let database = services::ScratchDb::create(taskmesh_store::DatabaseKind::Postgres).await;
    let redis = services::SharedRedis::new();
    let options = || {
        let mut o = node::replica_options(dir.path(), &redis, database.url());
        o.dispatcher.auth.enabled = true;
        o.dispatcher.auth.bootstrap = Some(BOOTSTRAP.into());
        o
    };
    let a = start_node(options()).await;
    let b = start_node(options()).await;
    let (ca, cb) = (channel(a.grpc_addr).await, channel(b.grpc_addr).await);
    let victim = token_of(&ca, "default", pb::TokenRole::Worker).await;
    let attacker = token_of(&ca, "default", pb::TokenRole::Worker).await;
    let mut w = RawWorker::open(
        a.grpc_addr,
        Some(&victim),
        registration("victim", "echo", ""),
    )
    .await
    .expect("the victim registers on A");
    let submitter = token_of(&ca, "default", pb::TokenRole::Submitter).await;
    let id = submit_as(&ca, &submitter, "echo", "{}").await;
    let assigned = w
        .next_assign(Duration::from_secs(20))
        .await
        .expect("an assignment");
    w.ack(&assigned).await;
    wait_state(&ca, &id, pb::TaskState::Running).await;
    // The registry is cluster-wide: B knows who holds "victim".
    wait_for("B to list the victim", Duration::from_secs(10), || async {
        let workers = pb::task_api_client::TaskApiClient::new(cb.clone())
            .list_workers(with_token(BOOTSTRAP, pb::ListWorkersRequest::default()))
            .await
            .expect("list workers on B")
            .into_inner()
            .workers;
        workers
            .iter()
            .any(|w| w.worker_id == "victim")
            .then_some(())
    })
    .await;
    let err = RawWorker::open(
        b.grpc_addr,
        Some(&attacker),
        registration("victim", "echo", ""),
    )
    .await
    .err()
    .expect("another identity may not register the victim's worker id");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // The victim's attempt is untouched: it finishes as the only attempt.
    w.succeed(&assigned).await;
    let t = wait_state(&ca, &id, pb::TaskState::Succeeded).await;
    assert_eq!(
        t.attempts.len(),
        1,
        "nothing was taken back: {:?}",
        t.attempts
    );
    w.close().await;
    for r in [a, b] {
        stop_node(r).await;
    }
}

#[tokio::test]
async fn a_worker_token_submits_children_only_of_the_tasks_it_runs() {
    let f = Fixture::start().await;
    // `spawn`, run by a worker of the `default` worker token, submits a
    // child and a child workflow of its own task with that token, and
    // answers with their ids.
    let spawn = handler_fn(|ctx: TaskContext| async move {
        let failed = |e: taskmesh_worker::Error| HandlerError::fatal(e.to_string());
        let child = ctx
            .children
            .submit(pb::SubmitTaskRequest {
                handler: "nobody-serves-this".into(),
                ..Default::default()
            })
            .await
            .map_err(failed)?;
        let step = pb::WorkflowStepSpec {
            after_parents_end: false,
            name: "a".into(),
            template: Some(pb::TaskTemplate {
                handler: "nobody-serves-this".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let wf = ctx
            .children
            .fan_out(vec![step], None, "")
            .await
            .map_err(failed)?;
        let answer = format!("{} {}", child.task_id, wf.workflow_id);
        Ok::<_, HandlerError>(Output::new(answer.into_bytes(), "text/plain"))
    });
    let mut opts = WorkerOptions::new(vec![format!("http://{}", f.node.grpc_addr)]);
    opts.worker_id = "spawner".into();
    opts.name = "spawner".into();
    opts.token = Some(Secret::new(f.token(Role::Worker)));
    opts.reconnect_initial = Duration::from_millis(50);
    let worker = TestWorker::spawn(Worker::new(opts).handler("spawn", spawn));
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);
    let submitter = f.token(Role::Submitter).to_string();
    let parent = submit_as(&f.channel, &submitter, "spawn", "{}").await;
    let mut api = pb::task_api_client::TaskApiClient::new(f.channel.clone());
    let done = wait_for("the spawning task to end", Duration::from_secs(20), || {
        let mut api = api.clone();
        let req = with_token(
            &submitter,
            pb::GetTaskRequest {
                task_id: parent.clone(),
                ..Default::default()
            },
        );
        async move {
            let t = api.get_task(req).await.expect("get").into_inner().task?;
            let ended = [pb::TaskState::Succeeded, pb::TaskState::Failed];
            ended.iter().any(|s| *s as i32 == t.state).then_some(t)
        }
    })
    .await;
    assert_eq!(
        done.state,
        pb::TaskState::Succeeded as i32,
        "{}",
        done.error_message
    );
    let listed = api
        .list_tasks(with_token(
            &submitter,
            pb::ListTasksRequest {
                parent_task_id: parent.clone(),
                ..Default::default()
            },
        ))
        .await
        .expect("list by parent")
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), 2, "the child and the workflow's step");
    let ids = String::from_utf8(done.output.unwrap().data).unwrap();
    let child_id = ids.split(' ').next().unwrap();
    assert!(listed.iter().any(|t| t.task_id == child_id));
    worker.stop().await;

    // Not running it (the fixture's task waits for a worker; the spawner's
    // task has ended), without a parent, or one bad entry in a batch:
    // refused, and nothing written.
    let worker_token = f.token(Role::Worker).to_string();
    let child = |parent: &str| pb::SubmitTaskRequest {
        handler: "nobody-serves-this".into(),
        parent_task_id: parent.into(),
        ..Default::default()
    };
    let refused = |what: &str, got: Result<(), tonic::Status>, want: Code| match got {
        Ok(()) => panic!("{what}: accepted"),
        Err(status) => assert_eq!(status.code(), want, "{what}: {status:?}"),
    };
    refused(
        "a child of a task no worker of its own runs",
        api.submit_task(with_token(&worker_token, child(&f.task_id)))
            .await
            .map(|_| ()),
        Code::PermissionDenied,
    );
    refused(
        "a child of an ended task",
        api.submit_task(with_token(&worker_token, child(&parent)))
            .await
            .map(|_| ()),
        Code::FailedPrecondition,
    );
    refused(
        "a task of its own",
        api.submit_task(with_token(&worker_token, child("")))
            .await
            .map(|_| ()),
        Code::PermissionDenied,
    );
    refused(
        "a batch with one task of its own",
        api.submit_tasks(with_token(
            &worker_token,
            pb::SubmitTasksRequest {
                tasks: vec![child(&f.task_id), child("")],
            },
        ))
        .await
        .map(|_| ()),
        Code::PermissionDenied,
    );
    refused(
        "a workflow of its own",
        api.submit_workflow(with_token(
            &worker_token,
            pb::SubmitWorkflowRequest {
                steps: vec![pb::WorkflowStepSpec {
                    after_parents_end: false,
                    name: "a".into(),
                    template: Some(pb::TaskTemplate {
                        handler: "nobody-serves-this".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ))
        .await
        .map(|_| ()),
        Code::PermissionDenied,
    );
    let all = api
        .list_tasks(with_token(BOOTSTRAP, pb::ListTasksRequest::default()))
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(
        all.len(),
        4,
        "the fixture's task, the spawner, its child and its workflow's step"
    );
}
