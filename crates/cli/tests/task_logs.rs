//! Task logs end to end: lines a `taskmesh worker` process's handler logs
//! (through its `TaskLog` and through `tracing`), on a stream and in push
//! mode, are read back with `GetTaskLogs` and followed live with
//! `WatchTaskLogs`; the server's cap truncates with its mark; the lines a
//! worker had sent before it was killed stay.

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_testkit::logs::{follow_logs, messages, read_logs};
use taskmesh_testkit::process::{WorkerProcess, spawn_server};
use taskmesh_testkit::*;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");
const LIMIT: Duration = Duration::from_secs(30);

fn numbered(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("line {i} of {n}")).collect()
}

/// Submits a `log` task, follows it while it runs, then reads it back.
async fn logged_and_followed(api: &pb::task_api_client::TaskApiClient<tonic::transport::Channel>) {
    let mut api = api.clone();
    // 8 lines 250 ms apart: about 2 s of running to follow.
    let id = submit(&mut api, "log", br#"{"lines": 8, "every_ms": 250}"#).await;
    let (followed, at_first) = follow_logs(&api, &id, LIMIT).await;
    assert_eq!(messages(&followed), numbered(8), "followed, in order");
    let seqs: Vec<u64> = followed.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, (1..=8).collect::<Vec<u64>>());
    assert!(followed.iter().all(|l| l.attempt == 1 && l.time.is_some()));
    let running = at_first.expect("lines came while following");
    assert_ne!(
        state(&running),
        pb::TaskState::Succeeded,
        "the first lines arrived while the task ran (a live follow, not a read at the end)"
    );
    assert_eq!(
        state(&get(&mut api, &id).await),
        pb::TaskState::Succeeded,
        "the follow ends once the task has"
    );
    let (read, attempts) = read_logs(&api, &id).await;
    assert_eq!(read, followed, "read back as followed");
    assert_eq!(attempts.len(), 1);
    assert!(!attempts[0].truncated && attempts[0].lines == 8 && attempts[0].dropped == 0);

    // `tracing` events inside the handler are captured as its lines.
    let id = submit(&mut api, "log", br#"{"lines": 3, "tracing": true}"#).await;
    wait_task_state(&api, &id, pb::TaskState::Succeeded, LIMIT).await;
    let (read, _) = read_logs(&api, &id).await;
    let texts = messages(&read);
    assert_eq!(texts.len(), 3, "{texts:?}");
    for (i, t) in texts.iter().enumerate() {
        assert!(
            t.starts_with(&format!("line {} of 3", i + 1)) && t.contains("handler=log"),
            "a tracing event with its fields: {t:?}"
        );
    }

    // Namespaced like the task: from another namespace it is not there.
    let err = api
        .get_task_logs(pb::GetTaskLogsRequest {
            task_id: id.clone(),
            namespace: "elsewhere".into(),
            ..Default::default()
        })
        .await
        .expect_err("another namespace's task");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
}

/// A node and one `taskmesh worker` process serving `log` (in push mode
/// when `push`), then [`logged_and_followed`].
async fn check_a_worker(id: &str, push: bool) {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let api = api(node.grpc_addr).await;
    let mut worker = WorkerProcess::new(
        BIN.as_ref(),
        id,
        &[format!("http://{}", node.grpc_addr)],
        dir.path(),
    )
    .handlers("log");
    if push {
        worker = worker.push("127.0.0.1:0");
    }
    let mut worker = worker.spawn().await;
    logged_and_followed(&api).await;
    worker.assert_alive();
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_workers_lines_are_read_back_and_followed_live() {
    check_a_worker("logger", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_workers_lines_are_read_back_and_followed_live() {
    check_a_worker("push-logger", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_keeps_an_attempts_first_lines_and_marks_it_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let _server = spawn_server(
        BIN.as_ref(),
        dir.path(),
        (grpc, http),
        &["--log-max-lines", "5"],
        &[],
    )
    .await;
    let server = format!("http://127.0.0.1:{grpc}");
    let mut api = api(([127, 0, 0, 1], grpc).into()).await;
    let _worker = WorkerProcess::new(BIN.as_ref(), "capped", &[server], dir.path())
        .handlers("log")
        .spawn()
        .await;
    let id = submit(&mut api, "log", br#"{"lines": 20}"#).await;
    wait_task_state(&api, &id, pb::TaskState::Succeeded, LIMIT).await;
    // The worker sent its lines before its result; they are written in a
    // batch of their own, so wait for the count to settle at the cap.
    let (lines, attempts) = wait_for("the capped lines stored", LIMIT, || async {
        let (lines, attempts) = read_logs(&api, &id).await;
        let settled = attempts
            .first()
            .is_some_and(|a| a.lines + a.truncated_lines == 20);
        settled.then_some((lines, attempts))
    })
    .await;
    assert_eq!(
        messages(&lines),
        numbered(20)[..5].to_vec(),
        "the first five kept"
    );
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert!(a.truncated, "marked truncated: {a:?}");
    assert_eq!((a.lines, a.truncated_lines, a.dropped), (5, 15, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_lines_stay_and_the_retry_logs_as_attempt_two() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let servers = [format!("http://{}", node.grpc_addr)];
    let mut a = WorkerProcess::new(BIN.as_ref(), "doomed", &servers, dir.path())
        .handlers("log")
        .spawn()
        .await;
    // Long enough never to end by itself within the test.
    let id = submit(&mut api, "log", br#"{"lines": 100000, "every_ms": 20}"#).await;
    let before_kill = wait_for("attempt 1 has sent some lines", LIMIT, || async {
        let (lines, _) = read_logs(&api, &id).await;
        (lines.len() >= 5).then_some(lines)
    })
    .await;
    a.kill();

    // The attempt is taken back (its stream closed) and runs again on B.
    let _b = WorkerProcess::new(BIN.as_ref(), "survivor", &servers, dir.path())
        .handlers("log")
        .spawn()
        .await;
    let (lines, attempts) = wait_for("attempt 2 logging on the second worker", LIMIT, || async {
        let (lines, attempts) = read_logs(&api, &id).await;
        lines
            .iter()
            .any(|l| l.attempt == 2)
            .then_some((lines, attempts))
    })
    .await;
    let first: Vec<&pb::TaskLogEntry> = lines.iter().filter(|l| l.attempt == 1).collect();
    assert!(
        first.len() >= before_kill.len(),
        "attempt 1 kept every line it had sent ({} then, {} now)",
        before_kill.len(),
        first.len()
    );
    for (then, now) in before_kill.iter().zip(&first) {
        assert_eq!(then, *now, "attempt 1's lines unchanged");
    }
    assert_eq!(
        lines
            .iter()
            .find(|l| l.attempt == 2)
            .map(|l| (l.seq, l.message.as_str())),
        Some((1, "line 1 of 100000")),
        "the retry's lines are its own, numbered from 1"
    );
    assert_eq!(
        attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let task = get(&mut api, &id).await;
    assert_eq!(task.attempts[0].worker_id, "doomed");
    api.cancel_task(pb::CancelTaskRequest {
        task_id: id,
        ..Default::default()
    })
    .await
    .expect("cancel");
    stop_node(node).await;
}
