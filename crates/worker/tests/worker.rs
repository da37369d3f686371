//! The worker against a scripted dispatcher.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Conn, Server, WAIT, dead_addr};
use taskmesh::v1::{
    RejectReason, TaskComplete, WorkerDrain, connect_request::Message as Up, connect_response,
    task_complete,
};
use taskmesh_testkit::{TestWorker, wait_for};
use taskmesh_worker::{Error, Output, Worker, WorkerOptions, builtin, handler_fn};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

fn options(servers: Vec<String>, concurrency: u32) -> WorkerOptions {
    let mut opts = WorkerOptions::new(servers);
    opts.concurrency = concurrency;
    opts.reconnect_initial = Duration::from_millis(10);
    opts.reconnect_max = Duration::from_millis(50);
    opts.drain_timeout = Duration::from_secs(5);
    opts.labels.insert("zone".into(), "a".into());
    opts.weight = 3;
    opts
}

fn with_builtins(opts: WorkerOptions) -> Worker {
    let mut worker = Worker::new(opts);
    for name in taskmesh_worker::BUILTIN_NAMES {
        worker.add_handler(*name, builtin(name).unwrap());
    }
    worker
}

fn start(worker: Worker) -> TestWorker {
    TestWorker::spawn(worker)
}

async fn expect_ack(conn: &mut Conn, execution_id: &str) {
    match conn.next().await {
        Up::Ack(ack) => assert_eq!(ack.execution_id, execution_id),
        other => panic!("expected ack of {execution_id}, got {other:?}"),
    }
}

async fn expect_reject(conn: &mut Conn, execution_id: &str, reason: RejectReason) {
    match conn.next().await {
        Up::Reject(r) => {
            assert_eq!(r.execution_id, execution_id);
            assert_eq!(r.reason, reason as i32, "{r:?}");
        }
        other => panic!("expected reject of {execution_id}, got {other:?}"),
    }
}

async fn expect_complete(conn: &mut Conn, execution_id: &str) -> task_complete::Result {
    match conn.next().await {
        Up::Complete(TaskComplete {
            execution_id: id,
            result: Some(result),
            ..
        }) if id == execution_id => result,
        other => panic!("expected complete of {execution_id}, got {other:?}"),
    }
}

fn failure(result: task_complete::Result) -> (String, bool) {
    match result {
        task_complete::Result::Failure(f) => (f.message, f.retryable),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn registers_first_with_handlers_and_capacity() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let opts = options(vec![server.addr.clone()], 3);
    let worker_id = opts.worker_id.clone();
    let running = start(with_builtins(opts));
    let conn = server.accept().await;
    let reg = conn.registration();
    assert_eq!(reg.worker_id, worker_id);
    assert_eq!(reg.handlers, ["echo", "fail", "log", "sleep"]);
    assert_eq!(reg.capacity, 3);
    assert_eq!(reg.weight, 3);
    assert_eq!(reg.labels.get("zone").map(String::as_str), Some("a"));
    assert!(running.handle.wait_connected(WAIT).await);
    assert!(running.handle.is_connected());
    assert_eq!(running.handle.sessions(), 1);
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn echo_acks_then_completes_with_payload() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 2)));
    let mut conn = server.accept().await;
    conn.assign("e1", "echo", 1, br#"{"hello":"world"}"#);
    expect_ack(&mut conn, "e1").await;
    match expect_complete(&mut conn, "e1").await {
        task_complete::Result::Success(s) => {
            let out = s.output.unwrap();
            assert_eq!(out.data, br#"{"hello":"world"}"#);
            assert_eq!(out.content_type, "application/json");
        }
        other => panic!("expected success, got {other:?}"),
    }
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_handlers_lines_are_sent_before_its_result() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 2)));
    let mut conn = server.accept().await;
    conn.assign("e1", "log", 1, br#"{"lines": 3}"#);
    expect_ack(&mut conn, "e1").await;
    assert!(matches!(
        expect_complete(&mut conn, "e1").await,
        task_complete::Result::Success(_)
    ));
    // `next` set the lines aside: all of them came before the result.
    let lines: Vec<(&str, &str)> = conn
        .logs
        .iter()
        .flat_map(|m| {
            m.lines
                .iter()
                .map(|l| (m.execution_id.as_str(), l.message.as_str()))
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("e1", "line 1 of 3"),
            ("e1", "line 2 of 3"),
            ("e1", "line 3 of 3")
        ]
    );
    assert!(
        conn.logs
            .iter()
            .all(|m| m.task_id == "task-e1" && m.dropped == 0)
    );
    assert!(
        conn.logs
            .iter()
            .flat_map(|m| &m.lines)
            .all(|l| l.time.is_some()),
        "each line carries the time it was logged"
    );
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn over_capacity_is_rejected_busy() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 1)));
    let mut conn = server.accept().await;
    conn.assign("e1", "sleep", 1, br#"{"ms":60000}"#);
    expect_ack(&mut conn, "e1").await;
    assert_eq!(running.handle.active(), 1);
    conn.assign("e2", "echo", 1, b"{}");
    expect_reject(&mut conn, "e2", RejectReason::Busy).await;
    conn.cancel("e1");
    expect_complete(&mut conn, "e1").await;
    // The slot is free again by the time the completion is seen.
    conn.assign("e3", "echo", 1, b"{}");
    expect_ack(&mut conn, "e3").await;
    expect_complete(&mut conn, "e3").await;
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn unknown_handler_is_rejected() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 1)));
    let mut conn = server.accept().await;
    conn.assign("e1", "nope", 1, b"{}");
    expect_reject(&mut conn, "e1", RejectReason::UnknownHandler).await;
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn cancel_reaches_the_handler() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 2)));
    let mut conn = server.accept().await;
    conn.assign("e1", "sleep", 1, br#"{"ms":60000}"#);
    expect_ack(&mut conn, "e1").await;
    conn.cancel("e1");
    let (message, retryable) = failure(expect_complete(&mut conn, "e1").await);
    assert_eq!(message, "cancelled");
    assert!(retryable);
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn shutdown_drains_running_tasks() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 2)));
    let mut conn = server.accept().await;
    conn.assign("e1", "sleep", 1, br#"{"ms":300}"#);
    expect_ack(&mut conn, "e1").await;
    running.shutdown.cancel();
    assert!(matches!(conn.next().await, Up::Draining(_)));
    conn.assign("e2", "echo", 1, b"{}");
    expect_reject(&mut conn, "e2", RejectReason::Busy).await;
    let result = expect_complete(&mut conn, "e1").await;
    assert!(
        matches!(result, task_complete::Result::Success(_)),
        "{result:?}"
    );
    conn.closed().await;
    tokio::time::timeout(WAIT, running.join)
        .await
        .expect("run() did not return after draining")
        .unwrap()
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn server_drain_finishes_work_then_reconnects() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 2)));
    let mut conn = server.accept().await;
    conn.assign("e1", "sleep", 1, br#"{"ms":200}"#);
    expect_ack(&mut conn, "e1").await;
    conn.send(connect_response::Message::Drain(WorkerDrain {
        reason: "server shutting down".into(),
    }));
    assert!(matches!(conn.next().await, Up::Draining(_)));
    conn.assign("e2", "echo", 1, b"{}");
    expect_reject(&mut conn, "e2", RejectReason::Busy).await;
    expect_complete(&mut conn, "e1").await;
    conn.closed().await;
    let conn2 = server.accept().await;
    conn2.registration();
    assert!(running.handle.wait_connected(WAIT).await);
    assert_eq!(running.handle.sessions(), 2);
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn fails_over_to_the_next_server() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let servers = vec![dead_addr().await, server.addr.clone()];
    let running = start(with_builtins(options(servers, 1)));
    let mut conn = server.accept().await;
    conn.registration();
    assert!(running.handle.wait_connected(WAIT).await);
    assert_eq!(running.handle.sessions(), 1);
    conn.assign("e1", "echo", 1, b"{}");
    expect_ack(&mut conn, "e1").await;
    expect_complete(&mut conn, "e1").await;
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn fail_handler_fails_the_first_attempts() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 1)));
    let mut conn = server.accept().await;
    for attempt in 1..=3 {
        let id = format!("e{attempt}");
        conn.assign(&id, "fail", attempt, br#"{"times":2}"#);
        expect_ack(&mut conn, &id).await;
        let result = expect_complete(&mut conn, &id).await;
        if attempt <= 2 {
            assert!(failure(result).1, "attempt {attempt} should fail retryably");
        } else {
            assert!(
                matches!(result, task_complete::Result::Success(_)),
                "{result:?}"
            );
        }
    }
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn heartbeats_report_load() {
    let mut server = Server::start(Duration::from_millis(50)).await;
    let running = start(with_builtins(options(vec![server.addr.clone()], 2)));
    let mut conn = server.accept().await;
    conn.assign("e1", "sleep", 1, br#"{"ms":60000}"#);
    expect_ack(&mut conn, "e1").await;
    let heartbeat = loop {
        if let Some(Up::Heartbeat(h)) = conn.next_any().await
            && h.active == 1
        {
            break h;
        }
    };
    assert!((0.0..=100.0).contains(&heartbeat.cpu_idle_percent));
    assert_eq!(heartbeat.avg_cost_ms, 0.0);
    conn.cancel("e1");
    expect_complete(&mut conn, "e1").await;
    let heartbeat = loop {
        if let Some(Up::Heartbeat(h)) = conn.next_any().await {
            break h;
        }
    };
    assert_eq!(heartbeat.active, 0);
    assert!(heartbeat.avg_cost_ms > 0.0);
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn panicking_handler_is_a_retryable_failure() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let worker = Worker::new(options(vec![server.addr.clone()], 1)).handler(
        "panic",
        handler_fn(|ctx| async move {
            if ctx.payload == b"boom" {
                panic!("boom");
            }
            Ok(Output::empty())
        }),
    );
    let running = start(worker);
    let mut conn = server.accept().await;
    conn.assign("e1", "panic", 1, b"boom");
    expect_ack(&mut conn, "e1").await;
    let (message, retryable) = failure(expect_complete(&mut conn, "e1").await);
    assert_eq!(message, "handler panicked: boom");
    assert!(retryable);
    // The worker survives and its slot is free.
    conn.assign("e2", "panic", 1, b"fine");
    expect_ack(&mut conn, "e2").await;
    expect_complete(&mut conn, "e2").await;
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn results_of_a_dead_session_are_dropped() {
    let mut server = Server::start(Duration::from_secs(5)).await;
    let gate = Arc::new(Semaphore::new(0));
    let (finished_tx, mut finished) = tokio::sync::mpsc::unbounded_channel();
    let worker = with_builtins(options(vec![server.addr.clone()], 2)).handler("gated", {
        let gate = gate.clone();
        handler_fn(move |ctx| {
            let (gate, finished_tx) = (gate.clone(), finished_tx.clone());
            async move {
                let _permit = gate.acquire().await.unwrap();
                let _ = finished_tx.send(ctx.execution_id);
                Ok(Output::json("\"done\""))
            }
        })
    });
    let running = start(worker);
    let mut conn = server.accept().await;
    conn.assign("old", "gated", 1, b"{}");
    expect_ack(&mut conn, "old").await;
    drop(conn); // the server ends the stream: the session dies
    let mut conn2 = server.accept().await;
    assert!(running.handle.wait_connected(WAIT).await);
    assert_eq!(running.handle.sessions(), 2);
    gate.add_permits(1);
    let done = tokio::time::timeout(WAIT, finished.recv()).await.unwrap();
    assert_eq!(done.as_deref(), Some("old"));
    for id in ["new1", "new2"] {
        conn2.assign(id, "echo", 1, b"{}");
        expect_ack(&mut conn2, id).await; // a stray "old" complete would fail here
        expect_complete(&mut conn2, id).await;
    }
    running.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn invalid_options_fail_fast() {
    let worker = with_builtins(WorkerOptions::new(vec!["localhost:1".into()]));
    let err = worker.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)), "{err}");
    let worker = Worker::new(WorkerOptions::new(vec!["http://127.0.0.1:1".into()]));
    let err = worker.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)), "{err}");
}

/// A push worker on servers [A, B] whose refreshes at A fail as scripted.
async fn push_worker_against(a: &Server, b: &Server) -> TestWorker {
    let mut opts = options(vec![a.addr.clone(), b.addr.clone()], 2);
    opts.push_listen = Some("127.0.0.1:0".parse().unwrap());
    start(with_builtins(opts))
}

/// Waits until `server` has seen `n` push registrations.
async fn wait_push_calls(server: &Server, n: usize) {
    wait_for(
        &format!("{n} push registrations at {}", server.addr),
        WAIT,
        || async { (server.push_calls().len() >= n).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn one_failed_push_refresh_is_tried_again_at_the_same_server() {
    // Call 1 registers, call 2 (the first refresh) fails, the rest succeed.
    let a = Server::start_push(Duration::from_millis(50), &[2]).await;
    let b = Server::start_push(Duration::from_millis(50), &[]).await;
    let w = push_worker_against(&a, &b).await;
    wait_push_calls(&a, 5).await;
    let calls = a.push_calls();
    assert_eq!(calls[0], "", "a first registration names no session");
    assert!(
        calls[1..].iter().all(|s| s == "push-session"),
        "every refresh, the retry included, names the granted session: {calls:?}"
    );
    assert!(
        b.push_calls().is_empty(),
        "one failed refresh moved the worker to B: {:?}",
        b.push_calls()
    );
    assert_eq!(w.handle.sessions(), 1, "the session was kept");
    w.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn push_refreshes_failing_twice_in_a_row_move_to_the_next_server() {
    let a = Server::start_push(Duration::from_millis(50), &[2, 3]).await;
    let b = Server::start_push(Duration::from_millis(50), &[]).await;
    let w = push_worker_against(&a, &b).await;
    wait_push_calls(&b, 1).await;
    assert_eq!(
        a.push_calls().len(),
        3,
        "A: the registration and two failed refreshes"
    );
    assert_eq!(b.push_calls()[0], "", "at B the worker registers afresh");
    w.stop().await;
    a.stop().await;
    b.stop().await;
}
