//! End to end over real gRPC on loopback, on a temporary SQLite file:
//! submit → push → ACK → result, ACK timeouts, least-active. (A killed
//! `taskmesh worker` process: `crates/cli/tests/worker_kill.rs`.)

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use taskmesh::v1::{self as pb, connect_response::Message as Out};
use taskmesh_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_over_three_workers_each_run_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let ledger = Ledger::default();
    let workers: Vec<TestWorker> = (0..3)
        .map(|i| counting_worker(&[node.grpc_addr], &format!("w{i}"), 16, ledger.clone()))
        .collect();
    for w in &workers {
        assert!(w.handle.wait_connected(Duration::from_secs(10)).await);
    }

    let mut api = api(node.grpc_addr).await;
    let mut ids = Vec::new();
    for i in 0..1_000 {
        ids.push(submit(&mut api, "echo", format!("{{\"n\":{i}}}").as_bytes()).await);
    }
    let succeeded = wait_for("1000 tasks to succeed", Duration::from_secs(120), || {
        let mut api = api.clone();
        async move {
            let resp = api
                .list_tasks(pb::ListTasksRequest {
                    state: pb::TaskState::Succeeded as i32,
                    page_size: 1,
                    ..Default::default()
                })
                .await
                .ok()?;
            let _ = resp;
            let mut n = 0;
            let mut token = String::new();
            loop {
                let page = api
                    .list_tasks(pb::ListTasksRequest {
                        state: pb::TaskState::Succeeded as i32,
                        page_size: 1_000,
                        page_token: token.clone(),
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner();
                n += page.tasks.len();
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            (n == 1_000).then_some(n)
        }
    })
    .await;
    assert_eq!(succeeded, 1_000);

    let counts = ledger.all();
    assert_eq!(counts.len(), 1_000, "every task executed");
    let dupes: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dupes.is_empty(), "tasks executed more than once: {dupes:?}");
    let mut by_worker = std::collections::HashMap::<String, u32>::new();
    for id in ids.iter().take(50) {
        let t = get(&mut api, id).await;
        assert_eq!(t.attempts.len(), 1, "one attempt: {t:?}");
        assert_eq!(
            t.output.as_ref().unwrap().data,
            format!("{{\"n\":{}}}", ids.iter().position(|x| x == id).unwrap()).into_bytes()
        );
        *by_worker
            .entry(t.attempts[0].worker_id.clone())
            .or_default() += 1;
    }
    assert!(
        by_worker.len() >= 2,
        "work is spread over workers: {by_worker:?}"
    );
    for w in workers {
        w.stop().await;
    }
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_never_acked_is_taken_back_and_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.ack_timeout = Duration::from_millis(300);
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;

    let mut silent = RawWorker::connect(node.grpc_addr, "silent", &["echo"], 1).await;
    let id = submit(&mut api, "echo", b"{}").await;
    let first = silent
        .next_assign(Duration::from_secs(10))
        .await
        .expect("pushed to the silent worker");
    assert_eq!(first.task_id, id);
    // No ACK: after the ACK timeout the server takes it back and says so.
    let cancel = loop {
        match silent
            .next(Duration::from_secs(10))
            .await
            .expect("a cancel after the ack timeout")
        {
            Out::Cancel(c) => break c,
            _ => continue,
        }
    };
    assert_eq!(cancel.execution_id, first.execution_id);

    let ledger = Ledger::default();
    let good = counting_worker(&[node.grpc_addr], "good", 1, ledger.clone());
    let t = wait_task_state(&api, &id, pb::TaskState::Succeeded, Duration::from_secs(30)).await;
    assert_eq!(t.attempts[0].outcome, pb::AttemptOutcome::AckTimeout as i32);
    assert_eq!(t.attempts[0].execution_id, first.execution_id);
    assert_eq!(t.attempts.last().unwrap().worker_id, "good");
    assert_eq!(ledger.count(&id), 1);
    // A late ACK of the taken-back attempt is refused.
    silent.ack(&first).await;
    let receipt = loop {
        match silent.next(Duration::from_secs(10)).await {
            Some(Out::Recorded(r)) => break r,
            Some(_) => continue,
            None => panic!("no receipt for the late ack"),
        }
    };
    assert!(
        !receipt.accepted,
        "a stale ack must be refused: {receipt:?}"
    );
    good.stop().await;
    silent.close().await;
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tasks_go_to_the_streams_with_fewer_active_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;

    // w1 gets three tasks and keeps them running.
    let mut w1 = RawWorker::connect(node.grpc_addr, "w1", &["echo"], 10).await;
    for _ in 0..3 {
        submit(&mut api, "echo", b"{}").await;
    }
    let mut held = Vec::new();
    for _ in 0..3 {
        let a = w1
            .next_assign(Duration::from_secs(10))
            .await
            .expect("w1 assignment");
        w1.ack(&a).await;
        held.push(a);
    }
    let mut w2 = RawWorker::connect(node.grpc_addr, "w2", &["echo"], 10).await;
    let mut w3 = RawWorker::connect(node.grpc_addr, "w3", &["echo"], 10).await;

    let mut new_ids = HashSet::new();
    for _ in 0..4 {
        new_ids.insert(submit(&mut api, "echo", b"{}").await);
    }
    // Where each new task was claimed, as the store tells: w2 and w3 share
    // the four, 2 and 2; w1 (3 active) gets none.
    let mut placed: HashMap<String, HashSet<String>> = HashMap::new();
    for id in &new_ids {
        let t = wait_task_state(
            &api,
            id,
            pb::TaskState::Dispatching,
            Duration::from_secs(10),
        )
        .await;
        placed.entry(t.worker_id).or_default().insert(id.clone());
    }
    let share = |w: &str| placed.get(w).map_or(0, HashSet::len);
    assert_eq!(
        (share("w1"), share("w2"), share("w3")),
        (0, 2, 2),
        "{placed:?}"
    );
    // Each stream received exactly what it was claimed for.
    for (w, raw) in [("w2", &mut w2), ("w3", &mut w3)] {
        let mut got: HashSet<String> = raw
            .assigns(2)
            .await
            .into_iter()
            .map(|a| a.task_id)
            .collect();
        got.extend(raw.fence().await.into_iter().map(|a| a.task_id));
        assert_eq!(got, placed[w], "what {w} received");
    }
    assert!(
        w1.fence().await.is_empty(),
        "the busy worker got a new task"
    );
    let all: HashSet<String> = placed.into_values().flatten().collect();
    assert_eq!(all, new_ids);
    w1.close().await;
    w2.close().await;
    w3.close().await;
    stop_node(node).await;
}

/// Regression: a worker's output over the payload limit used to be stored,
/// and the task could then no longer be read (GetTask and WatchTask answer
/// within the message limit). Now the attempt fails, not retried, saying
/// why, and the task stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_over_the_payload_limit_fails_its_attempt_and_the_task_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_payload_bytes = 64 * 1024;
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let mut worker = RawWorker::connect(node.grpc_addr, "big-output", &["echo"], 1).await;
    let id = submit(&mut api, "echo", b"{}").await;
    let a = worker
        .next_assign(Duration::from_secs(10))
        .await
        .expect("an assignment");
    worker.ack(&a).await;
    wait_task_state(&api, &id, pb::TaskState::Running, Duration::from_secs(10)).await;
    worker
        .send(pb::connect_request::Message::Complete(pb::TaskComplete {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
            result: Some(pb::task_complete::Result::Success(pb::TaskSuccess {
                output: Some(pb::Payload {
                    data: vec![b'x'; 200 * 1024],
                    content_type: "application/octet-stream".into(),
                }),
            })),
        }))
        .await;
    let t = wait_task_state(&api, &id, pb::TaskState::Failed, Duration::from_secs(10)).await;
    assert!(
        t.error_message.contains("over the limit of 65536 bytes"),
        "{}",
        t.error_message
    );
    assert!(
        t.output.is_none_or(|o| o.data.is_empty()),
        "nothing of it was stored"
    );
    assert_eq!(t.attempts.len(), 1, "not retried: {:?}", t.attempts);
    worker.close().await;
    stop_node(node).await;
}

fn millis(t: &Option<prost_types::Timestamp>) -> i64 {
    let t = t.as_ref().expect("a timestamp");
    t.seconds * 1_000 + i64::from(t.nanos) / 1_000_000
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// An ACK is held in memory and written in front of the task's result, in
/// the same write: with a hold of a minute, a task whose result follows its
/// ACK still ends at once (had the result waited behind the ACK's hold, it
/// would take a minute), and its RUNNING time is the ACK's arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_ack_is_written_with_the_result_without_waiting_for_the_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.ack_timeout = Duration::from_secs(240);
    opts.dispatcher.ack_hold = Duration::from_secs(60);
    let node = start_node(opts).await;
    let api = api(node.grpc_addr).await;
    let mut worker = RawWorker::connect(node.grpc_addr, "held", &["echo"], 1).await;
    let id = submit(&mut api.clone(), "echo", b"{}").await;
    let a = worker
        .next_assign(Duration::from_secs(10))
        .await
        .expect("an assignment");
    let acked = unix_now_ms();
    worker.ack(&a).await;
    worker.succeed(&a).await;
    let t = wait_task_state(&api, &id, pb::TaskState::Succeeded, Duration::from_secs(30)).await;
    let times = t.state_times.expect("state times");
    let running = millis(&times.running_time);
    assert!(
        running >= acked - 5 && running <= millis(&times.end_time),
        "RUNNING at the ACK's arrival ({running}), sent at {acked}, ended {}",
        millis(&times.end_time)
    );
    assert_eq!(t.attempts.len(), 1, "{:?}", t.attempts);
    worker.close().await;
    stop_node(node).await;
}

/// A task still running when the hold passes has its ACK written alone:
/// it shows RUNNING, never before the hold has passed, dated at the ACK's
/// arrival rather than at the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_ack_of_a_running_task_is_written_once_the_hold_passes() {
    const HOLD: Duration = Duration::from_millis(1_500);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.ack_hold = HOLD;
    let node = start_node(opts).await;
    let api = api(node.grpc_addr).await;
    let mut worker = RawWorker::connect(node.grpc_addr, "held-long", &["echo"], 1).await;
    let id = submit(&mut api.clone(), "echo", b"{}").await;
    let a = worker
        .next_assign(Duration::from_secs(10))
        .await
        .expect("an assignment");
    let sent = std::time::Instant::now();
    let acked = unix_now_ms();
    worker.ack(&a).await;
    let t = wait_task_state(&api, &id, pb::TaskState::Running, Duration::from_secs(10)).await;
    let seen_after = sent.elapsed();
    assert!(
        seen_after >= HOLD,
        "RUNNING was written {seen_after:?} after the ACK, before the hold of {HOLD:?}"
    );
    let running = millis(&t.state_times.expect("state times").running_time);
    assert!(
        running >= acked - 5 && running < acked + HOLD.as_millis() as i64,
        "RUNNING dated {running}, the ACK was sent at {acked}"
    );
    worker.succeed(&a).await;
    wait_task_state(&api, &id, pb::TaskState::Succeeded, Duration::from_secs(10)).await;
    worker.close().await;
    stop_node(node).await;
}

/// A slot freed by a result wakes the engine, but a handler whose last
/// claim found it empty is not claimed again until a task becomes READY
/// (or the 500 ms safety tick passes): one claim transaction per task, not
/// one more per result. Fails with a claim after every result (about two
/// per task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_slot_costs_no_claim_while_nothing_is_ready() {
    const TASKS: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let api = api(node.grpc_addr).await;
    let mut worker = RawWorker::connect(node.grpc_addr, "one-by-one", &["echo"], 4).await;
    let started = std::time::Instant::now();
    let claims_before = node.dispatch_stats.snapshot().1;
    for _ in 0..TASKS {
        let id = submit(&mut api.clone(), "echo", b"{}").await;
        let a = worker
            .next_assign(Duration::from_secs(10))
            .await
            .expect("an assignment");
        assert_eq!(a.task_id, id);
        worker.ack(&a).await;
        worker.succeed(&a).await;
        wait_task_state(&api, &id, pb::TaskState::Succeeded, Duration::from_secs(10)).await;
    }
    let claims = node.dispatch_stats.snapshot().1 - claims_before;
    // One per task, one per safety tick, one spare for a round in flight.
    let ticks = started.elapsed().as_millis() as u64 / 500 + 1;
    assert!(
        claims <= TASKS + ticks + 1,
        "{claims} claim transactions for {TASKS} tasks in {:?}",
        started.elapsed()
    );
    worker.close().await;
    stop_node(node).await;
}

/// A worker that says it reads batches gets what was queued for its
/// stream as few messages, and may answer in one: every ACK and result in
/// it counts and gets its receipt. (Workers that do not say so, as every
/// other test's `RawWorker`, get each message alone.) A batch that breaks
/// the rules is refused whole with INVALID_ARGUMENT, naming the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_reads_batches_gets_them_and_may_answer_in_one() {
    use taskmesh::batch::{Batchable, MAX_BATCH_MESSAGES};
    use taskmesh::v1::connect_request::Message as In;
    const N: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let registration = |id: &str| pb::WorkerRegistration {
        worker_id: id.into(),
        name: id.into(),
        handlers: vec!["echo".into()],
        capacity: N as u32,
        accepts_batches: true,
        ..Default::default()
    };
    let mut worker = RawWorker::open(node.grpc_addr, None, registration("batched"))
        .await
        .expect("register");
    assert!(
        worker.server_reads_batches,
        "registered says it reads batches"
    );

    let tasks = (0..N)
        .map(|i| pb::SubmitTaskRequest {
            handler: "echo".into(),
            payload: Some(pb::Payload {
                data: format!("{i}").into_bytes(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        })
        .collect();
    let results = api
        .submit_tasks(pb::SubmitTasksRequest { tasks })
        .await
        .expect("submit")
        .into_inner()
        .results;
    let ids: HashSet<String> = results
        .into_iter()
        .map(|r| r.accepted.expect("accepted").task_id)
        .collect();
    assert_eq!(ids.len(), N);

    // The wire's own messages, batches opened.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut wire = 0usize;
    let next = async |rx: &mut tonic::Streaming<pb::ConnectResponse>| {
        let m = tokio::time::timeout_at(deadline, rx.message())
            .await
            .expect("within 30 s")
            .expect("the stream stays up")
            .expect("the stream stays open");
        m.into_messages().collect::<Vec<_>>()
    };
    let mut assigns = Vec::new();
    while assigns.len() < N {
        wire += 1;
        for m in next(&mut worker.rx).await {
            if let Some(Out::Assign(a)) = m.message {
                assigns.push(a);
            }
        }
    }
    let assigned: HashSet<String> = assigns.iter().map(|a| a.task_id.clone()).collect();
    assert_eq!(assigned, ids, "each task assigned once");
    assert!(
        wire < N,
        "{N} assignments queued together came as {wire} messages: none batched"
    );

    // One batch answers them all: every ACK, then every result.
    let acks = assigns.iter().map(|a| pb::ConnectRequest {
        message: Some(In::Ack(pb::TaskAck {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
        })),
    });
    let results = assigns.iter().map(|a| pb::ConnectRequest {
        message: Some(In::Complete(pb::TaskComplete {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
            result: Some(pb::task_complete::Result::Success(pb::TaskSuccess {
                output: None,
            })),
        })),
    });
    let answer = pb::ConnectRequest::batch(acks.chain(results).collect());
    worker.tx.send(answer).await.expect("the stream is open");
    let mut receipts = 0usize;
    while receipts < 2 * N {
        for m in next(&mut worker.rx).await {
            if let Some(Out::Recorded(r)) = m.message {
                assert!(r.accepted, "refused: {r:?}");
                receipts += 1;
            }
        }
    }
    for id in ids.iter().take(20) {
        let t = wait_task_state(&api, id, pb::TaskState::Succeeded, Duration::from_secs(10)).await;
        assert_eq!(t.attempts.len(), 1, "{:?}", t.attempts);
    }
    let listed = api
        .list_tasks(pb::ListTasksRequest {
            state: pb::TaskState::Succeeded as i32,
            page_size: 1_000,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), N, "every task SUCCEEDED");

    // Refused whole: a register inside a batch, and one message too many.
    let heartbeat = || pb::ConnectRequest {
        message: Some(In::Heartbeat(pb::WorkerHeartbeat::default())),
    };
    let register = pb::ConnectRequest {
        message: Some(In::Register(registration("batched"))),
    };
    let too_many = (0..=MAX_BATCH_MESSAGES).map(|_| heartbeat()).collect();
    let mut other = RawWorker::open(node.grpc_addr, None, registration("batched-2"))
        .await
        .expect("register");
    for (w, batch, want) in [
        (
            &mut worker,
            vec![heartbeat(), register],
            "batch.messages[1] is a register",
        ),
        (&mut other, too_many, "at most 1024"),
    ] {
        w.tx.send(pb::ConnectRequest::batch(batch))
            .await
            .expect("the stream is open");
        let status = loop {
            match tokio::time::timeout_at(deadline, w.rx.message())
                .await
                .expect("an answer within 30 s")
            {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without an error"),
                Err(status) => break status,
            }
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(want), "{status:?}");
    }
    stop_node(node).await;

    // A node whose message limit cannot hold the largest batch does not
    // say it reads batches, so no worker sends it one.
    let small = tempfile::tempdir().unwrap();
    let mut opts = node_options(small.path());
    opts.dispatcher.max_message_bytes = taskmesh::batch::MAX_BATCH_ENCODED_BYTES - 1;
    opts.dispatcher.max_payload_bytes = 64 * 1024;
    let node = start_node(opts).await;
    let worker = RawWorker::open(node.grpc_addr, None, registration("small"))
        .await
        .expect("register");
    assert!(!worker.server_reads_batches, "a batch would not fit");
    worker.close().await;
    stop_node(node).await;
}
