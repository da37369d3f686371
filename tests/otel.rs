//! OpenTelemetry end to end: `OTEL_EXPORTER_OTLP_ENDPOINT` points the node
//! at an OTLP receiver served here (the trace service from
//! opentelemetry-proto over tonic, on loopback); a task submitted with a W3C
//! `traceparent` yields one trace: the submit request, the dispatch, the
//! handler's run on the worker and the recording of its result, each a child
//! of the one before (the result's of the request's).
//!
//! The tracing subscriber and the environment are process-wide, so this
//! file holds exactly one test, and it sets the variable before any thread
//! of its runtime exists.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use opentelemetry_proto::tonic::trace::v1::Span;
use taskmesh::v1 as pb;
use taskmesh_testkit::background::BackgroundServer;
use taskmesh_testkit::*;
use tonic::{Request, Response, Status};

/// Collects every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn one_trace_spans_submit_dispatch_run_and_complete() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    // SAFETY: no other thread exists yet in this test binary's only test
    // (the runtime is built below), so nothing reads the environment
    // concurrently.
    unsafe { std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let receiver = Receiver::default();
        let spans = receiver.spans.clone();
        let otlp = BackgroundServer::spawn("the OTLP receiver", |stop| {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(receiver))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    stop.cancelled_owned(),
                )
        });

        let guard = taskmesh_cli::telemetry::init_tracing("warn", false, "taskmesh-test");
        assert!(guard.exporting(), "the OTLP variable turns export on");

        let dir = tempfile::tempdir().unwrap();
        let node = start_node(node_options(dir.path())).await;
        let mut api = api(node.grpc_addr).await;
        let mut wopts =
            taskmesh_worker::WorkerOptions::new(vec![format!("http://{}", node.grpc_addr)]);
        wopts.concurrency = 4;
        let worker =
            taskmesh_worker::Worker::new(wopts).handler("echo", taskmesh_worker::builtin::Echo);
        let worker = TestWorker::spawn(worker);
        assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

        let trace_id = uuid::Uuid::new_v4().simple().to_string();
        let caller_span = "00f067aa0ba902b7";
        let mut req = tonic::Request::new(pb::SubmitTaskRequest {
            handler: "echo".into(),
            payload: Some(pb::Payload {
                data: b"{}".to_vec(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        });
        req.metadata_mut().insert(
            "traceparent",
            format!("00-{trace_id}-{caller_span}-01").parse().unwrap(),
        );
        let submitted = api.submit_task(req).await.expect("submit").into_inner();
        let stored = submitted.task.as_ref().unwrap().traceparent.clone();
        assert!(
            stored.starts_with(&format!("00-{trace_id}-")) && !stored.contains(caller_span),
            "the task stores the request span's context in the caller's trace: {stored}"
        );
        wait_task_state(
            &api,
            &submitted.task_id,
            pb::TaskState::Succeeded,
            Duration::from_secs(20),
        )
        .await;

        let find = |all: &[Span], name: &str| {
            all.iter()
                .find(|s| hex(&s.trace_id) == trace_id && s.name == name)
                .cloned()
        };
        let names = [
            "/taskmesh.v1.TaskApi/SubmitTask",
            "dispatch",
            "echo",
            "complete",
        ];
        let got = wait_for("the four spans to arrive", Duration::from_secs(20), || {
            guard.flush();
            let all = spans.lock().unwrap().clone();
            let found: Vec<Option<Span>> = names.iter().map(|n| find(&all, n)).collect();
            let ready = found.iter().all(Option::is_some);
            async move { ready.then(|| found.into_iter().flatten().collect::<Vec<_>>()) }
        })
        .await;
        let [submit, dispatch, run, complete] = [&got[0], &got[1], &got[2], &got[3]];
        assert_eq!(
            hex(&submit.parent_span_id),
            caller_span,
            "submit continues the caller"
        );
        assert_eq!(
            dispatch.parent_span_id, submit.span_id,
            "dispatch is a child of submit"
        );
        assert_eq!(
            run.parent_span_id, dispatch.span_id,
            "the worker's run continues the dispatch"
        );
        assert_eq!(
            complete.parent_span_id, submit.span_id,
            "complete joins the task's trace"
        );
        assert!(complete.end_time_unix_nano >= run.end_time_unix_nano);
        assert!(run.start_time_unix_nano >= submit.start_time_unix_nano);

        worker.stop().await;
        stop_node(node).await;
        drop(guard);
        otlp.stop().await;
    });
}
