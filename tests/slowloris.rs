//! Slowloris and connection floods, end to end on loopback: an attacker on
//! 127.0.0.2 opens half-sent HTTP requests, bodies that trickle, silent
//! connections on both ports and more connections than its per-address
//! limit, while a client on 127.0.0.1 keeps calling both ports. The
//! client's calls keep succeeding fast (p99 under 100 ms), connections over
//! the limit are closed at once, and every stalled connection is closed
//! once the header (or first-bytes, or body) timeout has passed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::Method;
use taskmesh::v1 as pb;
use taskmesh_testkit::http::Rest;
use taskmesh_testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const TIMEOUT: Duration = Duration::from_millis(1_500);
const PER_PEER: usize = 200;

/// A connection to `to` from 127.0.0.2 (another client address on
/// loopback).
async fn from_attacker(to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    socket.connect(to).await.expect("connect")
}

/// Waits until the server closes `conn` (EOF or reset), at most `limit`;
/// true when it did.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 or similar before the close: keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_are_closed_and_other_clients_are_not_held_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.header_read_timeout = TIMEOUT;
    opts.dispatcher.request_body_timeout = TIMEOUT;
    opts.conn_limits.first_bytes = TIMEOUT;
    opts.conn_limits.max_per_peer = PER_PEER;
    let node = start_node(opts).await;
    let rest = Rest::new(node.http_addr);
    let mut api = api(node.grpc_addr).await;
    let id = submit(&mut api, "echo", b"{}").await;

    // The attack: on the REST port, half-sent headers, a body that never
    // completes, and silent connections; on the gRPC port, silent ones.
    let started = Instant::now();
    let mut stalled = Vec::new();
    for i in 0..80 {
        let mut c = from_attacker(node.http_addr).await;
        c.write_all(format!("GET /api/tasks/{id} HTTP/1.1\r\nHost: x\r\nX-Slow-{i}: ").as_bytes())
            .await
            .unwrap();
        stalled.push(("half-sent headers", c));
    }
    for _ in 0..40 {
        let mut c = from_attacker(node.http_addr).await;
        c.write_all(
            b"POST /api/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"handler\":",
        )
        .await
        .unwrap();
        stalled.push(("a body that never completes", c));
    }
    for _ in 0..40 {
        stalled.push(("silent (REST)", from_attacker(node.http_addr).await));
    }
    for _ in 0..40 {
        stalled.push(("silent (gRPC)", from_attacker(node.grpc_addr).await));
    }
    // 160 on the REST port; with 40 more it is at its per-address limit.
    for _ in 0..40 {
        stalled.push(("silent (REST)", from_attacker(node.http_addr).await));
    }
    // Over the per-address limit: closed at once.
    let mut over = from_attacker(node.http_addr).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(1)).await,
        "a connection over the per-address limit is closed at once"
    );

    // Meanwhile another client's calls on both ports (bounded: 100 each).
    let mut latencies = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        let reply = rest
            .call(Method::GET, &format!("/api/tasks/{id}"), None)
            .await;
        assert_eq!(reply.status.as_u16(), 200, "{:?}", reply.json);
        latencies.push(t.elapsed());
        let t = Instant::now();
        api.get_task(pb::GetTaskRequest {
            task_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("gRPC answers during the attack");
        latencies.push(t.elapsed());
    }
    let p99 = p99(latencies);
    println!("other client's p99 during the attack: {p99:?}");
    assert!(p99 < Duration::from_millis(100), "p99 {p99:?}");

    // Every stalled connection is closed once its timeout has passed.
    for (what, mut c) in stalled {
        let left = (TIMEOUT + Duration::from_secs(5)).saturating_sub(started.elapsed());
        assert!(
            closed_within(&mut c, left.max(Duration::from_millis(200))).await,
            "a connection with {what} was still open {:?} after it was made",
            started.elapsed()
        );
    }
    let took = started.elapsed();
    println!("all 240 stalled connections closed within {took:?}");
    assert!(took >= TIMEOUT, "not closed before the timeout ({took:?})");

    // Their places came back: the attacker's address may connect again.
    let mut again = from_attacker(node.http_addr).await;
    again
        .write_all(
            format!("GET /api/tasks/{id} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), again.read_to_string(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    stop_node(node).await;
}
