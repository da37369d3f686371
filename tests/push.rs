//! Push mode end to end over real gRPC on loopback: workers that serve
//! `taskmesh.v1.Worker`, register their address and get tasks as
//! `Worker.Execute` calls; their loss, their place in the balancer, bad
//! input to the push RPCs, and stale results. (A killed push worker
//! process: `crates/cli/tests/worker_kill.rs`.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use taskmesh::v1::{
    self as pb, dispatcher_client::DispatcherClient, task_api_client::TaskApiClient,
};
use taskmesh_testkit::background::BackgroundServer;
use taskmesh_testkit::services::SharedRedis;
use taskmesh_testkit::*;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

const LIMIT: Duration = Duration::from_secs(30);

/// A node whose push workers are probed (and lost) quickly.
async fn fast_node(dir: &std::path::Path) -> taskmesh_cli::node::RunningNode {
    let mut opts = node_options(dir);
    opts.dispatcher.heartbeat_interval = Duration::from_millis(300);
    start_node(opts).await
}

async fn dispatcher(addr: SocketAddr) -> DispatcherClient<Channel> {
    DispatcherClient::new(channel(addr).await)
}

async fn workers(api: &mut TaskApiClient<Channel>) -> Vec<pb::WorkerInfo> {
    api.list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("list workers")
        .into_inner()
        .workers
}

fn registration(worker_id: &str, handlers: &[&str], capacity: u32) -> pb::WorkerRegistration {
    pb::WorkerRegistration {
        worker_id: worker_id.into(),
        name: worker_id.into(),
        handlers: handlers.iter().map(|h| h.to_string()).collect(),
        capacity,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_run_once_each_on_a_push_worker() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_push_worker(&[node.grpc_addr], "push-1", 16, ledger.clone());
    assert!(
        w.handle.wait_connected(LIMIT).await,
        "push worker registers"
    );
    let listed = workers(&mut api).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].worker_id, "push-1");

    let mut ids = Vec::new();
    for i in 0..200 {
        ids.push(submit(&mut api, "echo", format!("{{\"i\":{i}}}").as_bytes()).await);
    }
    for id in &ids {
        let t = wait_task_state(&api, id, pb::TaskState::Succeeded, LIMIT).await;
        assert_eq!(t.attempts.len(), 1, "{t:?}");
        assert_eq!(t.attempts[0].worker_id, "push-1");
    }
    let counts = ledger.all();
    assert_eq!(counts.len(), 200);
    for id in &ids {
        assert_eq!(
            ledger.count(id),
            1,
            "task {id} ran {} times",
            ledger.count(id)
        );
    }

    // A graceful stop deregisters: the worker leaves the list at once.
    w.stop().await;
    wait_for("the push worker to leave", LIMIT, || {
        let mut api = api.clone();
        async move { workers(&mut api).await.is_empty().then_some(()) }
    })
    .await;
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_active_spreads_over_a_push_and_a_stream_worker() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let push = counting_push_worker(&[node.grpc_addr], "push", 8, Ledger::default());
    let stream = counting_worker(&[node.grpc_addr], "stream", 8, Ledger::default());
    assert!(push.handle.wait_connected(LIMIT).await);
    assert!(stream.handle.wait_connected(LIMIT).await);

    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(submit(&mut api, "sleep", br#"{"ms":2000}"#).await);
    }
    let placed: HashMap<String, usize> = wait_for("8 tasks running", LIMIT, || {
        let mut api = api.clone();
        let ids = ids.clone();
        async move {
            let mut placed = HashMap::new();
            for id in &ids {
                let t = get(&mut api, id).await;
                if state(&t) != pb::TaskState::Running {
                    return None;
                }
                *placed.entry(t.worker_id.clone()).or_insert(0) += 1;
            }
            Some(placed)
        }
    })
    .await;
    // Least-active takes the worker with fewer tasks in flight each time,
    // whatever kind of worker it is.
    assert_eq!(placed.get("push"), Some(&4), "{placed:?}");
    assert_eq!(placed.get("stream"), Some(&4), "{placed:?}");
    for id in &ids {
        wait_task_state(&api, id, pb::TaskState::Succeeded, LIMIT).await;
    }
    for w in [push, stream] {
        w.stop().await;
    }
    stop_node(node).await;
}

fn assert_code<T: std::fmt::Debug>(r: Result<T, Status>, code: Code, needle: &str) {
    match r {
        Ok(v) => panic!("expected {code:?} ({needle}), got {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(s.message().contains(needle), "{needle:?} not in {s:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_the_push_rpcs_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let mut d = dispatcher(node.grpc_addr).await;
    let good = registration("w", &["echo"], 2);
    let register =
        |reg: Option<pb::WorkerRegistration>, address: &str| pb::RegisterPushWorkerRequest {
            registration: reg,
            address: address.into(),
            session_id: String::new(),
            ..Default::default()
        };

    let cases: Vec<(pb::RegisterPushWorkerRequest, &str)> = vec![
        (
            register(None, "http://127.0.0.1:1"),
            "registration is required",
        ),
        (register(Some(good.clone()), ""), "is empty"),
        (register(Some(good.clone()), "not a url"), "address must be"),
        (
            register(Some(good.clone()), "127.0.0.1:7070"),
            "address must be",
        ),
        (
            register(Some(good.clone()), "ftp://127.0.0.1:7070"),
            "no http:// scheme",
        ),
        (
            register(Some(good.clone()), "https://127.0.0.1:7070"),
            "https",
        ),
        (
            register(Some(good.clone()), "http://127.0.0.1"),
            "has no port",
        ),
        (
            register(Some(good.clone()), "http://user:pw@127.0.0.1:7070"),
            "carries credentials",
        ),
        (
            register(Some(good.clone()), "http://127.0.0.1:7070/run"),
            "path",
        ),
        (
            register(
                Some(good.clone()),
                &format!("http://{}:1", "a".repeat(3000)),
            ),
            "too long",
        ),
        (
            register(Some(registration("", &["echo"], 2)), "http://127.0.0.1:1"),
            "worker_id",
        ),
        (
            register(Some(registration("w", &[], 2)), "http://127.0.0.1:1"),
            "handlers",
        ),
        (
            register(Some(registration("w", &["echo"], 0)), "http://127.0.0.1:1"),
            "capacity",
        ),
        (
            register(
                Some(registration("w", &["bad handler!"], 1)),
                "http://127.0.0.1:1",
            ),
            "handlers",
        ),
    ];
    for (req, needle) in cases {
        assert_code(
            d.register_push_worker(req).await,
            Code::InvalidArgument,
            needle,
        );
    }

    let done =
        |task: &str, exec: &str, result: Option<pb::task_complete::Result>| pb::TaskComplete {
            task_id: task.into(),
            execution_id: exec.into(),
            result,
        };
    let ok = Some(pb::task_complete::Result::Success(pb::TaskSuccess {
        output: None,
    }));
    let report = |session: &str, complete: Option<pb::TaskComplete>| pb::ReportResultRequest {
        session_id: session.into(),
        complete,
        ..Default::default()
    };
    let cases: Vec<(pb::ReportResultRequest, Code, &str)> = vec![
        (
            report("", Some(done("t", "e", ok.clone()))),
            Code::InvalidArgument,
            "session_id",
        ),
        (
            report("s", None),
            Code::InvalidArgument,
            "complete is required",
        ),
        (
            report("s", Some(done("", "e", ok.clone()))),
            Code::InvalidArgument,
            "task_id",
        ),
        (
            report("s", Some(done("t", "", ok.clone()))),
            Code::InvalidArgument,
            "execution_id",
        ),
        (
            report("s", Some(done("t", "e", None))),
            Code::InvalidArgument,
            "success or a failure",
        ),
        (
            report("no-such-session", Some(done("t", "e", ok.clone()))),
            Code::NotFound,
            "no push-mode session",
        ),
    ];
    for (req, code, needle) in cases {
        assert_code(d.report_result(req).await, code, needle);
    }
    let leave = |session: &str| pb::DeregisterPushWorkerRequest {
        session_id: session.into(),
        reason: "test".into(),
    };
    assert_code(
        d.deregister_push_worker(leave("")).await,
        Code::InvalidArgument,
        "session_id",
    );
    assert_code(
        d.deregister_push_worker(leave("nope")).await,
        Code::NotFound,
        "no push-mode session",
    );

    // Nothing was registered, cluster-wide or here.
    assert!(workers(&mut api).await.is_empty());
    stop_node(node).await;
}

/// A `Worker` service driven by the test: it accepts every assignment and
/// hands it to the test instead of running it.
struct Scripted {
    worker_id: String,
    seen: mpsc::UnboundedSender<pb::ExecuteRequest>,
    /// Fail every Execute call instead (a worker whose handler side is down).
    fail_execute: bool,
}

#[tonic::async_trait]
impl pb::worker_server::Worker for Scripted {
    async fn execute(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<pb::ExecuteResponse>, Status> {
        let _ = self.seen.send(request.into_inner());
        if self.fail_execute {
            return Err(Status::unavailable("scripted to fail"));
        }
        Ok(Response::new(pb::ExecuteResponse {
            accepted: true,
            ..Default::default()
        }))
    }

    async fn cancel(
        &self,
        _: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        Ok(Response::new(pb::CancelResponse { found: false }))
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse {
            worker_id: self.worker_id.clone(),
            capacity: 4,
            cpu_idle_percent: 90.0,
            ..Default::default()
        }))
    }
}

/// Serves a scripted `Worker` on a free loopback port until the returned
/// server is stopped; returns its URL and the assignments it receives.
async fn scripted(
    worker_id: &str,
    fail_execute: bool,
) -> (
    String,
    mpsc::UnboundedReceiver<pb::ExecuteRequest>,
    BackgroundServer,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, rx) = mpsc::unbounded_channel();
    let service = pb::worker_server::WorkerServer::new(Scripted {
        worker_id: worker_id.into(),
        seen,
        fail_execute,
    });
    let server = BackgroundServer::spawn("a scripted Worker service", |stop| {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.cancelled_owned(),
            )
    });
    (format!("http://{addr}"), rx, server)
}

/// Registers a scripted worker and keeps its registration fresh (as the SDK
/// does) until the returned refresher is stopped; a refresh that comes back
/// with another session fails the refresher, and so the test at its stop.
async fn register_scripted(
    d: &DispatcherClient<Channel>,
    reg: pb::WorkerRegistration,
    address: &str,
) -> (String, BackgroundServer) {
    let mut req = pb::RegisterPushWorkerRequest {
        registration: Some(reg),
        address: address.into(),
        session_id: String::new(),
        ..Default::default()
    };
    let registered = d
        .clone()
        .register_push_worker(req.clone())
        .await
        .expect("register")
        .into_inner()
        .registered
        .expect("registered");
    let every: Duration = registered.heartbeat_interval.unwrap().try_into().unwrap();
    let mut d = d.clone();
    let session_id = registered.session_id.clone();
    // Refreshes name the session, as a live worker's do.
    req.session_id = session_id.clone();
    let refresher = BackgroundServer::spawn("the registration refresher", |token| async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = token.cancelled() => return Ok(()),
                _ = tick.tick() => {
                    // A refresh keeps the session; once the worker cannot
                    // be probed it is refused.
                    if let Ok(again) = d.register_push_worker(req.clone()).await {
                        let again = again.into_inner().registered.unwrap();
                        if again.session_id != session_id {
                            return Err(format!(
                                "a refresh of {session_id} came back with session {}",
                                again.session_id
                            ));
                        }
                    }
                }
            }
        }
    });
    (registered.session_id, refresher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_result_is_refused_and_the_right_one_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let d = dispatcher(node.grpc_addr).await;

    let (url_a, mut seen_a, serving_a) = scripted("raw-a", false).await;
    let (session_a, stop_a) =
        register_scripted(&d, registration("raw-a", &["echo"], 4), &url_a).await;
    let (url_b, _seen_b, serving_b) = scripted("raw-b", false).await;
    let (session_b, stop_b) =
        register_scripted(&d, registration("raw-b", &["other"], 4), &url_b).await;
    assert_ne!(session_a, session_b);

    let id = submit(&mut api, "echo", b"{}").await;
    let exec = tokio::time::timeout(LIMIT, seen_a.recv())
        .await
        .expect("an Execute call in time")
        .expect("an assignment");
    assert_eq!(
        exec.session_id, session_a,
        "the assignment names its session"
    );
    let a = exec.assignment.expect("assignment");
    assert_eq!(a.task_id, id);
    // The Execute answer was the ACK.
    wait_task_state(&api, &id, pb::TaskState::Running, LIMIT).await;

    let d2 = d.clone();
    let secret = a.report_secret.clone();
    assert!(
        !secret.is_empty(),
        "the push carries the assignment's secret"
    );
    let report = |session: String, exec: String| {
        let req = pb::ReportResultRequest {
            report_secret: secret.clone(),
            session_id: session,
            complete: Some(pb::TaskComplete {
                task_id: a.task_id.clone(),
                execution_id: exec,
                result: Some(pb::task_complete::Result::Success(pb::TaskSuccess {
                    output: None,
                })),
            }),
        };
        let mut d = d2.clone();
        async move {
            d.report_result(req)
                .await
                .map(|r| r.into_inner().recorded.unwrap())
        }
    };
    // Another worker's session does not hold the attempt.
    let r = report(session_b.clone(), a.execution_id.clone())
        .await
        .unwrap();
    assert!(!r.accepted, "{r:?}");
    assert!(r.message.contains("stale"), "{r:?}");
    // An execution id that is not the current attempt's: the secret is
    // not its secret.
    let r = report(session_a.clone(), "old-execution".into()).await;
    assert_code(r, Code::PermissionDenied, "report_secret");
    assert_eq!(state(&get(&mut api, &id).await), pb::TaskState::Running);

    // The right one is recorded, once.
    let r = report(session_a.clone(), a.execution_id.clone())
        .await
        .unwrap();
    assert!(r.accepted, "{r:?}");
    assert_eq!(state(&get(&mut api, &id).await), pb::TaskState::Succeeded);
    let r = report(session_a.clone(), a.execution_id.clone())
        .await
        .unwrap();
    assert!(!r.accepted, "a repeat is stale: {r:?}");

    // A deregistered session with nothing running ends at once; its results
    // are then unknown to the server.
    stop_b.stop().await;
    d.clone()
        .deregister_push_worker(pb::DeregisterPushWorkerRequest {
            session_id: session_b.clone(),
            reason: "test".into(),
        })
        .await
        .expect("deregister");
    let r = report(session_b, a.execution_id.clone()).await;
    assert_code(r, Code::NotFound, "no push-mode session");
    stop_a.stop().await;
    stop_node(node).await;
    serving_a.stop().await;
    serving_b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_push_worker_loses_its_push_and_then_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let mut d = dispatcher(node.grpc_addr).await;

    // An address nothing listens on is refused at registration.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let req = pb::RegisterPushWorkerRequest {
        registration: Some(registration("ghost", &["echo"], 4)),
        address: nowhere.clone(),
        session_id: String::new(),
        ..Default::default()
    };
    assert_code(
        d.register_push_worker(req).await,
        Code::FailedPrecondition,
        "Worker.Probe",
    );
    // So is a worker answering as someone else.
    let (url, _seen, someone_else) = scripted("someone-else", false).await;
    let req = pb::RegisterPushWorkerRequest {
        registration: Some(registration("ghost", &["echo"], 4)),
        address: url,
        session_id: String::new(),
        ..Default::default()
    };
    assert_code(
        d.register_push_worker(req).await,
        Code::FailedPrecondition,
        "someone-else",
    );
    assert!(workers(&mut api).await.is_empty());

    // A worker whose Execute calls fail: each push is taken back at once.
    let (url, _seen, serving) = scripted("ghost", true).await;
    let (_session, refreshing) =
        register_scripted(&d, registration("ghost", &["echo"], 4), &url).await;
    let id = submit(&mut api, "echo", b"{}").await;
    let t = wait_for("the failed push to be taken back", LIMIT, || {
        let mut api = api.clone();
        let id = id.clone();
        async move {
            let t = get(&mut api, &id).await;
            let first = t.attempts.first()?;
            (first.outcome == pb::AttemptOutcome::WorkerLost as i32).then_some(t)
        }
    })
    .await;
    assert_eq!(t.attempts[0].worker_id, "ghost");
    assert!(
        t.attempts[0].message.contains("Worker.Execute failed"),
        "{t:?}"
    );
    // Then it stops answering at all while it keeps refreshing: failed
    // probes lose the session.
    serving.stop().await;
    wait_for("the ghost to leave the list", LIMIT, || {
        let mut api = api.clone();
        async move { workers(&mut api).await.is_empty().then_some(()) }
    })
    .await;

    let ledger = Ledger::default();
    let w = counting_worker(&[node.grpc_addr], "real", 2, ledger.clone());
    let t = wait_task_state(&api, &id, pb::TaskState::Succeeded, LIMIT).await;
    assert_eq!(t.attempts.last().unwrap().worker_id, "real");
    assert!(
        t.attempts
            .iter()
            .all(|a| a.worker_id != "ghost" || a.outcome == pb::AttemptOutcome::WorkerLost as i32)
    );
    assert_eq!(ledger.count(&id), 1);
    refreshing.stop().await;
    w.stop().await;
    stop_node(node).await;
    someone_else.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_task_cancels_it_on_the_push_worker() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let w = counting_push_worker(&[node.grpc_addr], "push", 2, Ledger::default());
    assert!(w.handle.wait_connected(LIMIT).await);
    let id = submit(&mut api, "sleep", br#"{"ms":600000}"#).await;
    wait_for("the task to run on the worker", LIMIT, || {
        let mut api = api.clone();
        let (id, handle) = (id.clone(), w.handle.clone());
        async move {
            let running = state(&get(&mut api, &id).await) == pb::TaskState::Running;
            (running && handle.active() == 1).then_some(())
        }
    })
    .await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: id.clone(),
        reason: "test".into(),
        ..Default::default()
    })
    .await
    .expect("cancel");
    assert_eq!(state(&get(&mut api, &id).await), pb::TaskState::Cancelled);
    // Worker.Cancel reached the handler: its slot frees long before the
    // ten-minute sleep would end.
    let handle = w.handle.clone();
    wait_for("the handler to stop", LIMIT, || {
        let handle = handle.clone();
        async move { (handle.active() == 0).then_some(()) }
    })
    .await;
    w.stop().await;
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_registering_anew_at_its_address_gets_its_attempts_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;
    let mut d = dispatcher(node.grpc_addr).await;
    let (url, mut seen, serving) = scripted("phoenix", false).await;
    let reg = registration("phoenix", &["echo"], 4);
    let (first, refreshing) = register_scripted(&d, reg.clone(), &url).await;
    let id = submit(&mut api, "echo", b"{}").await;
    let pushed = tokio::time::timeout(LIMIT, seen.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pushed.session_id, first);
    wait_task_state(&api, &id, pb::TaskState::Running, LIMIT).await;

    // The process restarts at the same address: it registers without a
    // session id. It cannot be running the old session's attempt.
    refreshing.stop().await;
    let again = d
        .register_push_worker(pb::RegisterPushWorkerRequest {
            registration: Some(reg),
            address: url.clone(),
            session_id: String::new(),
            ..Default::default()
        })
        .await
        .expect("register again")
        .into_inner()
        .registered
        .unwrap();
    assert_ne!(again.session_id, first);
    let repushed = tokio::time::timeout(LIMIT, seen.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(repushed.session_id, again.session_id);
    let a = repushed.assignment.unwrap();
    assert_eq!(a.task_id, id);
    let t = get(&mut api, &id).await;
    assert_eq!(
        t.attempts[0].outcome,
        pb::AttemptOutcome::WorkerLost as i32,
        "{t:?}"
    );
    let listed = workers(&mut api).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].session_id, again.session_id);
    stop_node(node).await;
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_worker_on_one_replica_is_seen_and_used_from_the_other() {
    let redis = SharedRedis::new();
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let mut opts = node_options(dir.path());
        opts.dispatcher.heartbeat_interval = Duration::from_millis(300);
        opts.redis = Some(redis.options("replica"));
        replicas.push(start_node(opts).await);
    }
    let mut a = api(replicas[0].grpc_addr).await;

    // The first server of its list is down: it registers with the next.
    let dead: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let ledger = Ledger::default();
    let w = counting_push_worker(
        &[dead, replicas[1].grpc_addr],
        "push-on-b",
        4,
        ledger.clone(),
    );
    assert!(w.handle.wait_connected(LIMIT).await);
    let listed = workers(&mut a).await;
    assert_eq!(
        listed.len(),
        1,
        "replica A sees B's push worker: {listed:?}"
    );
    assert_eq!(listed[0].worker_id, "push-on-b");

    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(submit(&mut a, "echo", b"{}").await);
    }
    for id in &ids {
        let t = wait_task_state(&a, id, pb::TaskState::Succeeded, LIMIT).await;
        assert_eq!(t.attempts.len(), 1, "{t:?}");
        assert_eq!(ledger.count(id), 1);
    }
    // Refreshes keep one session: the worker never registered twice.
    assert_eq!(w.handle.sessions(), 1);
    w.stop().await;
    for r in replicas {
        stop_node(r).await;
    }
}
