//! Load shedding on a real node with `max_concurrent_requests = 1`: while a
//! call holds the only slot, another is refused at once with
//! RESOURCE_EXHAUSTED (health checks too: they pass through the same
//! layer); a `Dispatcher.Connect` stream holds the slot only until its
//! response starts (after its register message), so a live worker stream
//! does not starve unary calls.

use std::time::Duration;

use taskmesh::v1::{
    self as pb, connect_request::Message as In, connect_response::Message as Out,
    dispatcher_client::DispatcherClient,
};
use taskmesh_testkit::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const MESSAGE: &str = "server is at its limit of 1 requests in flight; retry with backoff";
const LIMIT: Duration = Duration::from_secs(10);

type Opening = tokio::task::JoinHandle<
    Result<tonic::Response<tonic::Streaming<pb::ConnectResponse>>, tonic::Status>,
>;

/// Opens a `Connect` stream that sends nothing yet: the call is in flight
/// (the server waits for the register message) until the test sends one.
async fn open_connect(addr: std::net::SocketAddr) -> (mpsc::Sender<pb::ConnectRequest>, Opening) {
    let (tx, rx) = mpsc::channel(8);
    let mut client = DispatcherClient::new(channel(addr).await);
    let opening = tokio::spawn(async move { client.connect(ReceiverStream::new(rx)).await });
    (tx, opening)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_shed_while_another_holds_the_slot_and_a_live_stream_holds_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_concurrent_requests = 1;
    // The server waits three heartbeat intervals (at most the request body
    // timeout) for a register message: long enough for this test.
    opts.dispatcher.heartbeat_interval = Duration::from_secs(10);
    opts.dispatcher.request_body_timeout = Duration::from_secs(30);
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let mut health = HealthClient::new(channel(node.grpc_addr).await);

    // The opening Connect holds the slot. Until it reached the server a
    // probe may find the slot free (or take it from the opening call, which
    // is then refused itself and opened again).
    let (mut tx, mut opening) = open_connect(node.grpc_addr).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    let refused = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call was shed within {LIMIT:?}"
        );
        if opening.is_finished() {
            let status = opening.await.unwrap().expect_err("no register was sent");
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            (tx, opening) = open_connect(node.grpc_addr).await;
            continue;
        }
        match api.list_tasks(pb::ListTasksRequest::default()).await {
            Err(status) if status.code() == Code::ResourceExhausted => break status,
            Ok(_) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        // Polling interval of a condition with a deadline.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.message(), MESSAGE);
    let hint = retry_after_ms(&refused).expect("a retry hint");
    assert!((50..150).contains(&hint), "{hint} ms");
    // While it is held, every call is refused at once, health checks too.
    let started = tokio::time::Instant::now();
    let again = api
        .get_task(pb::GetTaskRequest {
            task_id: "any".into(),
            ..Default::default()
        })
        .await
        .expect_err("the slot is still held");
    assert_eq!(
        (again.code(), again.message()),
        (Code::ResourceExhausted, MESSAGE)
    );
    let probe = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect_err("health checks pass through the limit");
    assert_eq!(probe.code(), Code::ResourceExhausted, "{probe:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refusals are immediate, not queued: {:?}",
        started.elapsed()
    );
    assert!(!opening.is_finished(), "the holder is still waiting");

    // The register message starts the stream's response: the slot is free.
    tx.send(pb::ConnectRequest {
        message: Some(In::Register(pb::WorkerRegistration {
            worker_id: "w".into(),
            name: "w".into(),
            handlers: vec!["echo".into()],
            capacity: 4,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut stream = tokio::time::timeout(LIMIT, opening)
        .await
        .expect("the stream opens")
        .unwrap()
        .expect("the stream is accepted")
        .into_inner();
    let first = stream.message().await.unwrap().expect("registered");
    assert!(
        matches!(first.message, Some(Out::Registered(_))),
        "{first:?}"
    );

    // With the stream live, calls one after another all get through, and
    // the stream still carries work.
    for _ in 0..20 {
        api.list_tasks(pb::ListTasksRequest::default())
            .await
            .expect("a live stream holds no slot");
    }
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers");
    let id = submit(&mut api, "echo", b"{}").await;
    let assigned = loop {
        let m = tokio::time::timeout(LIMIT, stream.message())
            .await
            .expect("an assignment in time")
            .unwrap()
            .expect("the stream is open");
        if let Some(Out::Assign(a)) = m.message {
            break a;
        }
    };
    assert_eq!(assigned.task_id, id);

    drop(tx);
    tokio::time::timeout(LIMIT, async {
        while let Ok(Some(_)) = stream.message().await {}
    })
    .await
    .expect("the server ends the closed stream");
    stop_node(node).await;
}

/// Opens `n` unary `GetTask` streams on one raw HTTP/2 connection that send
/// their headers and never a body, and returns once the server has read
/// them all: their answers, and the send halves (kept, so the streams stay
/// open).
async fn bodiless_requests(
    addr: std::net::SocketAddr,
    n: usize,
) -> Vec<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, mut connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let mut ping_pong = connection.ping_pong().expect("a ping handle");
    tokio::spawn(connection);
    let mut client = client;
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        client = client.ready().await.expect("a stream may open");
        let request = ::http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/taskmesh.v1.TaskApi/GetTask"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        open.push(
            client
                .send_request(request, false)
                .expect("send the headers"),
        );
    }
    // The server answers a PING after every frame sent before it: all the
    // headers have reached it (and each request its service) by then.
    ping_pong
        .ping(h2::Ping::opaque())
        .await
        .expect("the server answers the ping");
    open
}

/// Regression: headers without a body used to hold a concurrency slot each
/// until the request timeout, so one connection could refuse every call
/// of every client. Now a request takes a slot only once it has arrived,
/// and a body that never comes is answered DEADLINE_EXCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_body_hold_no_slot_and_are_answered_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_concurrent_requests = 8;
    opts.dispatcher.request_body_timeout = Duration::from_millis(1_500);
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let id = submit(&mut api, "echo", b"{}").await;

    // Far more bodiless requests than there are slots: 1,000 on four
    // connections (each at most its 256 streams).
    let mut pending = Vec::new();
    for _ in 0..4 {
        pending.extend(bodiless_requests(node.grpc_addr, 250).await);
    }
    // Other calls on both ports all get through meanwhile, fast (100 each,
    // a bounded loop).
    let rest = taskmesh_testkit::http::Rest::new(node.http_addr);
    let mut latencies = Vec::new();
    for _ in 0..100 {
        let started = std::time::Instant::now();
        let t = api
            .get_task(pb::GetTaskRequest {
                task_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("a bodiless flood holds no slot");
        assert_eq!(t.into_inner().task.unwrap().task_id, id);
        latencies.push(started.elapsed());
        let started = std::time::Instant::now();
        let reply = rest
            .call(reqwest::Method::GET, &format!("/api/tasks/{id}"), None)
            .await;
        assert_eq!(reply.status.as_u16(), 200, "{:?}", reply.json);
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    println!("other calls' p99 during 1,000 bodiless requests: {p99:?}");
    assert!(p99 < Duration::from_millis(100), "p99 {p99:?}");
    // Each bodiless request is answered, DEADLINE_EXCEEDED, once its body
    // timeout passed (all within the limit).
    for (response, _send) in pending {
        let response = tokio::time::timeout(LIMIT, response)
            .await
            .expect("answered in time")
            .expect("an HTTP/2 response");
        let status = response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(
            status.as_deref(),
            Some("4"),
            "DEADLINE_EXCEEDED: {:?}",
            response.headers()
        );
    }
    stop_node(node).await;
}

/// Regression: each `RegisterPushWorker` naming a silent address held its
/// request slot for the whole probe (5 s), so a burst of them refused every
/// other client. Now at most `MAX_PROBING` (64) are probed at once per node
/// and the rest are refused at once; other calls stay fast meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_naming_a_silent_address_cannot_hold_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_concurrent_requests = 128;
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let id = submit(&mut api, "echo", b"{}").await;
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", silent.local_addr().unwrap());
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let d = DispatcherClient::new(channel(node.grpc_addr).await);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..300 {
        let mut d = d.clone();
        let address = address.clone();
        calls.spawn(async move {
            d.register_push_worker(pb::RegisterPushWorkerRequest {
                registration: Some(pb::WorkerRegistration {
                    worker_id: format!("silent-{i}"),
                    name: "silent".into(),
                    handlers: vec!["echo".into()],
                    capacity: 1,
                    ..Default::default()
                }),
                address,
                server_secret: "s".repeat(32),
                ..Default::default()
            })
            .await
        });
    }
    // Other calls meanwhile (100, a bounded loop).
    let mut latencies = Vec::new();
    for _ in 0..100 {
        let started = std::time::Instant::now();
        api.get_task(pb::GetTaskRequest {
            task_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("other calls are not shed");
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let p99 = latencies[99];
    println!("other calls' p99 during 300 registrations probing a silent address: {p99:?}");
    // Far below the probe's 5 s, which a held call would wait: the bound
    // tells "not held" from "held", not a fast machine from a slow one (the
    // same test measured 61 ms one day; the previous release measures
    // 154 ms on a slower one).
    assert!(p99 < Duration::from_secs(1), "p99 {p99:?}");
    let (mut refused, mut unanswered) = (0, 0);
    while let Some(done) = calls.join_next().await {
        match done.unwrap() {
            Ok(r) => panic!("a silent address was registered: {r:?}"),
            Err(s) if s.code() == Code::ResourceExhausted => refused += 1,
            Err(s) => {
                assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
                unanswered += 1;
            }
        }
    }
    println!("{refused} refused at once, {unanswered} probed and refused");
    assert!(
        refused >= 300 - 64 && unanswered <= 64,
        "{refused} / {unanswered}"
    );
    holder.abort();
    stop_node(node).await;
}
