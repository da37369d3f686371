//! The operational services on the gRPC port, checked through the front door
//! with tonic's own clients: `grpc.health.v1.Health` answers SERVING for the
//! server and each service and follows the store's health; server reflection
//! (v1 and v1alpha) lists the contract's three services and serves their
//! descriptors with the REST annotations intact.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use taskmesh_coord::{Coordinator, LocalCoordinator};
use taskmesh_core::breaker::{BreakerOptions, Breakers};
use taskmesh_core::{Clock, SystemClock};
use taskmesh_dispatcher::{Dispatcher, DispatcherOptions, HEALTH_SERVICE_NAMES};
use taskmesh_scheduler::{Scheduler, SchedulerOptions};
use taskmesh_store::{SqliteStore, Store};
use taskmesh_testkit::*;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::{v1, v1alpha};

const CONTRACT: [&str; 3] = [
    "taskmesh.v1.TaskApi",
    "taskmesh.v1.Dispatcher",
    "taskmesh.v1.Worker",
];

async fn health_of(
    client: &mut HealthClient<Channel>,
    service: &str,
) -> Result<i32, tonic::Status> {
    client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
}

/// Asks reflection v1 one question and returns its single answer.
async fn reflect_v1(
    addr: SocketAddr,
    request: v1::server_reflection_request::MessageRequest,
) -> v1::server_reflection_response::MessageResponse {
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel(addr).await);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection stream")
        .into_inner();
    answers
        .next()
        .await
        .expect("one answer")
        .expect("answer ok")
        .message_response
        .expect("a response")
}

#[tokio::test]
async fn health_answers_serving_for_the_server_and_each_service() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut health = HealthClient::new(channel(node.grpc_addr).await);

    assert_eq!(HEALTH_SERVICE_NAMES.len(), 3);
    for name in HEALTH_SERVICE_NAMES {
        let status = health_of(&mut health, name).await.expect("check");
        assert_eq!(status, ServingStatus::Serving as i32, "service {name:?}");
    }
    assert!(HEALTH_SERVICE_NAMES.contains(&"taskmesh.v1.TaskApi"));
    assert!(HEALTH_SERVICE_NAMES.contains(&"taskmesh.v1.Dispatcher"));
    let unknown = health_of(&mut health, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    stop_node(node).await;
}

#[tokio::test]
async fn reflection_lists_the_contract_and_serves_its_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;

    let listed = reflect_v1(
        node.grpc_addr,
        v1::server_reflection_request::MessageRequest::ListServices(String::new()),
    )
    .await;
    let v1::server_reflection_response::MessageResponse::ListServicesResponse(list) = listed else {
        panic!("expected a service list, got {listed:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for service in CONTRACT.iter().chain(&["grpc.health.v1.Health"]) {
        assert!(names.contains(service), "{service} missing from {names:?}");
    }

    // The descriptor of TaskApi keeps its google.api.http options (prost
    // would drop them if the file were decoded and re-encoded).
    let file = reflect_v1(
        node.grpc_addr,
        v1::server_reflection_request::MessageRequest::FileContainingSymbol(
            "taskmesh.v1.TaskApi.SubmitTask".into(),
        ),
    )
    .await;
    let v1::server_reflection_response::MessageResponse::FileDescriptorResponse(files) = file
    else {
        panic!("expected descriptors, got {file:?}");
    };
    let task_api = files
        .file_descriptor_proto
        .iter()
        .find(|f| {
            f.windows(b"task_api.proto".len())
                .any(|w| w == b"task_api.proto")
        })
        .expect("task_api.proto among the answer's files");
    assert!(
        task_api
            .windows(b"/api/tasks".len())
            .any(|w| w == b"/api/tasks"),
        "the REST route is missing from the served descriptor"
    );

    // v1alpha answers too: Python's grpcio-reflection speaks only that.
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(
        channel(node.grpc_addr).await,
    );
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
            ),
        }]))
        .await
        .expect("v1alpha stream")
        .into_inner();
    let answer = answers
        .next()
        .await
        .expect("one answer")
        .expect("answer ok");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("expected a v1alpha service list");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for service in CONTRACT {
        assert!(
            names.contains(&service),
            "{service} missing from v1alpha {names:?}"
        );
    }
    stop_node(node).await;
}

#[tokio::test]
async fn health_turns_not_serving_when_the_store_fails() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open_in(dir.path()).await.unwrap();
    let store: Arc<dyn Store> = Arc::new(sqlite.clone());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let coord: Arc<dyn Coordinator> =
        Arc::new(LocalCoordinator::with_clock("node-health", clock.clone()));
    let (reaped_tx, reaped_rx) = tokio::sync::mpsc::channel(16);
    let breakers = Breakers::new(BreakerOptions::default());
    let scheduler = Scheduler::build(
        SchedulerOptions::default(),
        store.clone(),
        coord.clone(),
        clock.clone(),
        breakers.clone(),
        reaped_tx,
    );
    let opts = DispatcherOptions {
        health_interval: Duration::from_millis(50),
        ..DispatcherOptions::default()
    };
    let dispatcher = Dispatcher::build(
        opts,
        store,
        coord,
        clock,
        scheduler.handle(),
        breakers,
        reaped_rx,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(dispatcher.serve(listener, shutdown.clone()));

    let mut health = HealthClient::new(channel(addr).await);
    assert_eq!(
        health_of(&mut health, "").await.unwrap(),
        ServingStatus::Serving as i32
    );

    // Every clone of the store stops working: the node can no longer accept
    // or move a task, and its health must say so.
    sqlite.close().await;
    for name in HEALTH_SERVICE_NAMES {
        let mut health = health.clone();
        wait_for(
            &format!("{name:?} to report NOT_SERVING"),
            Duration::from_secs(10),
            || {
                let mut health = health.clone();
                async move {
                    (health_of(&mut health, name).await.ok()? == ServingStatus::NotServing as i32)
                        .then_some(())
                }
            },
        )
        .await;
        assert_eq!(
            health_of(&mut health, name).await.unwrap(),
            ServingStatus::NotServing as i32
        );
    }
    shutdown.cancel();
    let served = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops")
        .expect("server task");
    assert!(served.is_ok(), "{served:?}");
}
