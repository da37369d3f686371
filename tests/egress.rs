//! The server as a scanner, and one receiver holding up the others: the
//! egress attacks of the limits issue, end to end on loopback.
//!
//! - Callback URLs and push addresses that point at loopback, link-local
//!   (the cloud metadata service), private or otherwise non-public
//!   addresses, however they are spelled, or that carry credentials, are
//!   refused with INVALID_ARGUMENT (gRPC and REST, tasks and schedules) and
//!   nothing is stored.
//! - A name that resolves to such an address is refused when the callback
//!   is delivered (the resolved addresses are checked before the connect):
//!   FAILED at once with a generic class, and the receiver behind it never
//!   sees a request; a push registration naming it is refused.
//! - What a caller learns of a failed callback or push registration is a
//!   class, never what answered on the port (a refused port, an SSH banner).
//! - Behind 200 callbacks to a receiver that accepts connections and never
//!   answers, a healthy receiver's callback still arrives within a second.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use taskmesh::v1::{self as pb, dispatcher_client::DispatcherClient};
use taskmesh_core::egress::EgressPolicy;
use taskmesh_testkit::callbacks::CallbackReceiver;
use taskmesh_testkit::http::{Rest, assert_error};
use taskmesh_testkit::*;
use tokio::io::AsyncWriteExt;
use tonic::Code;

const LIMIT: Duration = Duration::from_secs(30);

/// A node that allows public addresses only, as `serve` does by default.
async fn strict_node(dir: &std::path::Path) -> taskmesh_cli::node::RunningNode {
    let mut opts = node_options(dir);
    opts.egress = EgressPolicy::public_only();
    opts.with_worker = Some(4);
    start_node(opts).await
}

/// POST /api/tasks of an echo task with `callback_url`.
async fn post_task(rest: &Rest, callback_url: &str) -> taskmesh_testkit::http::Reply {
    rest.call(
        Method::POST,
        "/api/tasks",
        Some(json!({"handler": "echo", "callbackUrl": callback_url})),
    )
    .await
}

fn registration(worker_id: &str) -> pb::WorkerRegistration {
    pb::WorkerRegistration {
        worker_id: worker_id.into(),
        name: worker_id.into(),
        handlers: vec!["echo".into()],
        capacity: 1,
        ..Default::default()
    }
}

fn push_request(address: &str) -> pb::RegisterPushWorkerRequest {
    pb::RegisterPushWorkerRequest {
        registration: Some(registration("scanner")),
        address: address.into(),
        ..Default::default()
    }
}

/// A TCP server that writes `banner` to every connection and then holds
/// it open without reading (an SSH server, or a silent one with an empty
/// banner). Returns its address; it lives as long as the test's runtime.
async fn banner_server(banner: &'static [u8]) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut conn, _)) = listener.accept().await {
            let _ = conn.write_all(banner).await;
            held.push(conn);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssrf_targets_are_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let node = strict_node(dir.path()).await;
    let rest = Rest::new(node.http_addr);
    let mut api = api(node.grpc_addr).await;
    let mut dispatcher = DispatcherClient::new(channel(node.grpc_addr).await);

    // (expected code, HTTP status, words): a well-formed URL whose address
    // the policy refuses is PERMISSION_DENIED; a host the contract's URL form
    // does not take (IPv6 literals, hex or one-number IPv4) is
    // INVALID_ARGUMENT before any policy is asked.
    let policy = (Code::PermissionDenied, 403, 7, "does not connect to");
    let form = (
        Code::InvalidArgument,
        400,
        3,
        "callback_url: does not match regex pattern",
    );
    let refused = [
        (
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            policy,
        ),
        ("http://127.0.0.1:22/", policy),
        ("http://[::1]:6379/", form),
        ("http://0x7f.0.0.1:5432/", form), // 127.0.0.1, spelled in hex
        ("http://2130706433:3306/", form), // 127.0.0.1 as one number
        ("http://localhost:8080/", policy),
        ("http://10.0.0.5/hook", policy),
        ("http://192.168.1.1/hook", policy),
        ("http://[::ffff:169.254.169.254]/", form),
        ("http://0.0.0.0:50051/", policy),
        ("http://100.64.0.1/", policy),
        ("http://[fd00::1]/", form),
    ];
    for (url, (code, status, number, words)) in refused {
        let grpc = api
            .submit_task(pb::SubmitTaskRequest {
                handler: "echo".into(),
                callback_url: url.into(),
                ..Default::default()
            })
            .await
            .expect_err(url);
        assert_eq!(grpc.code(), code, "{url}: {grpc:?}");
        assert!(grpc.message().contains(words), "{url}: {grpc:?}");
        let reply = post_task(&rest, url).await;
        assert_error(&reply, status, number, words);
        let reply = rest
            .call(
                Method::POST,
                "/api/schedules",
                Some(json!({"kind": "SCHEDULE_KIND_CRON", "cronExpression": "* * * * * *",
                            "timeZone": "UTC", "template": {"handler": "echo", "callbackUrl": url}})),
            )
            .await;
        assert_error(&reply, status, number, words);
    }
    for url in [
        "https://user:password@example.com/hook",
        "https://token@example.com/hook",
    ] {
        // Not the contract's URL form (no user information before the host).
        let reply = post_task(&rest, url).await;
        assert_error(&reply, 400, 3, "callback_url: does not match regex pattern");
        assert!(
            !reply.json.to_string().contains("password@"),
            "the secret is not echoed: {}",
            reply.json
        );
    }

    // Push addresses: refused before anything is dialled.
    let silent = banner_server(b"").await;
    for address in [
        format!("http://{silent}"),
        "http://169.254.169.254:80".to_string(),
        "http://[::1]:50051".to_string(),
        "http://localhost:7070".to_string(),
        "http://10.1.2.3:7070".to_string(),
    ] {
        let started = Instant::now();
        let err = dispatcher
            .register_push_worker(push_request(&address))
            .await
            .expect_err(&address);
        assert_eq!(err.code(), Code::InvalidArgument, "{address}: {err:?}");
        assert!(
            err.message().contains("does not connect to"),
            "{address}: {err:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "refused without a probe: {:?}",
            started.elapsed()
        );
    }

    assert_eq!(rest.count_tasks().await, 0, "nothing was stored");
    let schedules = rest.call(Method::GET, "/api/schedules", None).await;
    assert_eq!(
        schedules.json["schedules"].as_array().map_or(0, Vec::len),
        0
    );
    let workers = rest.call(Method::GET, "/api/workers", None).await;
    assert!(
        workers.json["workers"]
            .as_array()
            .is_none_or(|w| w.iter().all(|w| w["workerId"] != "scanner")),
        "{:?}",
        workers.json
    );
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_resolves_to_loopback_is_refused_when_delivered() {
    // This machine's own host name: a name (not a literal, not
    // "localhost") that the resolver maps to a non-public address.
    let host = String::from_utf8(
        std::process::Command::new("hostname")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let resolved: Vec<SocketAddr> = (host.as_str(), 80)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default();
    assert!(
        !resolved.is_empty()
            && resolved
                .iter()
                .all(|a| !EgressPolicy::public_only().allows(a.ip())),
        "the test needs this host's name ({host:?}) to resolve to non-public addresses only; it resolves to {resolved:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let node = strict_node(dir.path()).await;
    let rest = Rest::new(node.http_addr);
    // A receiver that would accept, listening on every address the name
    // may resolve to.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let receiver = CallbackReceiver::start_on(listener, None);
    let url = format!("http://{host}:{port}{}", taskmesh_testkit::callbacks::PATH);

    let reply = post_task(&rest, &url).await;
    assert_eq!(
        reply.status.as_u16(),
        202,
        "names are checked at delivery: {:?}",
        reply.json
    );
    let id = reply.json["taskId"].as_str().unwrap().to_string();
    let task = rest
        .wait_callback(&id, "CALLBACK_STATE_FAILED", LIMIT)
        .await;
    assert_eq!(
        task["callback"]["lastError"],
        "refused by the egress policy"
    );
    assert_eq!(task["callback"]["attempts"], 1, "not retried: {task}");
    assert_eq!(receiver.tries(), 0, "nothing reached the receiver");

    let mut dispatcher = DispatcherClient::new(channel(node.grpc_addr).await);
    let err = dispatcher
        .register_push_worker(push_request(&format!("http://{host}:{port}")))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("does not connect to"), "{err:?}");
    assert_eq!(receiver.tries(), 0);
    stop_node(node).await;
    receiver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_tell_a_class_not_what_answered() {
    let dir = tempfile::tempdir().unwrap();
    // Loopback allowed, so the probes reach what listens there.
    let mut opts = node_options(dir.path());
    opts.with_worker = Some(4);
    opts.callbacks.request_timeout = Duration::from_millis(500);
    opts.callbacks.policy.max_attempts = 1;
    let node = start_node(opts).await;
    let rest = Rest::new(node.http_addr);
    let mut dispatcher = DispatcherClient::new(channel(node.grpc_addr).await);

    let ssh = banner_server(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n").await;
    let closed: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let silent = banner_server(b"").await;
    for (target, class) in [
        (ssh, "request failed"),
        (closed, "connect failed"),
        (silent, "timeout"),
    ] {
        let reply = post_task(&rest, &format!("http://{target}/")).await;
        let id = reply.json["taskId"].as_str().unwrap().to_string();
        let task = rest
            .wait_callback(&id, "CALLBACK_STATE_FAILED", LIMIT)
            .await;
        assert_eq!(task["callback"]["lastError"], class, "{target}: {task}");
    }
    for target in [ssh, closed] {
        let err = dispatcher
            .register_push_worker(push_request(&format!("http://{target}")))
            .await
            .expect_err("no worker there");
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        let text = err.message().to_lowercase();
        assert!(text.contains("no taskmesh worker answered"), "{err:?}");
        for leak in [
            "ssh",
            "refused",
            "http version",
            "unexpected",
            "error trying",
        ] {
            assert!(!text.contains(leak), "{leak:?} leaks in {err:?}");
        }
    }
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_receiver_is_not_held_up_by_two_hundred_stalled_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.with_worker = Some(16);
    let node = start_node(opts).await;
    let rest = Rest::new(node.http_addr);
    let stalled = banner_server(b"").await;
    let stalled_url = format!("http://{stalled}/hook");
    let healthy = CallbackReceiver::start(None).await;

    let mut api = api(node.grpc_addr).await;
    let batch = pb::SubmitTasksRequest {
        tasks: (0..200)
            .map(|_| pb::SubmitTaskRequest {
                handler: "echo".into(),
                callback_url: stalled_url.clone(),
                ..Default::default()
            })
            .collect(),
    };
    let stalled_ids: Vec<String> = api
        .submit_tasks(batch)
        .await
        .expect("batch")
        .into_inner()
        .results
        .into_iter()
        .map(|r| match r.accepted {
            Some(a) => a.task_id,
            None => panic!("refused: {r:?}"),
        })
        .collect();
    // All 200 ended, so their callbacks are queued (and stalling) first.
    for id in &stalled_ids {
        rest.wait_state(id, "TASK_STATE_SUCCEEDED", LIMIT).await;
    }
    let reply = post_task(&rest, &healthy.url()).await;
    let id = reply.json["taskId"].as_str().unwrap().to_string();
    let task = rest
        .wait_callback(&id, "CALLBACK_STATE_DELIVERED", LIMIT)
        .await;
    let ended = chrono_ms(task["stateTimes"]["endTime"].as_str().unwrap());
    let delivered = chrono_ms(task["callback"]["deliveredTime"].as_str().unwrap());
    let behind = delivered - ended;
    println!("healthy callback delivered {behind} ms after its task ended, behind 200 stalled");
    assert!(
        behind < 1_000,
        "the healthy receiver waited {behind} ms behind the stalled one"
    );
    assert_eq!(healthy.accepted(&id).len(), 1);
    // The stalled receiver got no more than its share at a time.
    let stalled_task = rest.task(&stalled_ids[0]).await;
    assert_eq!(stalled_task["callback"]["state"], "CALLBACK_STATE_PENDING");
    stop_node(node).await;
    healthy.stop().await;
}

/// Milliseconds since the epoch of an RFC 3339 time.
fn chrono_ms(text: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
        .timestamp_millis()
}
