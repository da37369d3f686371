//! Child tasks end to end, on a real node over gRPC and REST with the real
//! worker SDK: a running handler fans out 100 children and a join that
//! receives their outputs (map / reduce), the children are listed by
//! parent, cancelling a parent cancels its children (plain and a child
//! workflow), and a child of an ended or unknown parent is refused with
//! nothing written.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use taskmesh::v1 as pb;
use taskmesh_testkit::http::Rest;
use taskmesh_testkit::*;
use taskmesh_worker::{HandlerError, Output, TaskContext, Worker, WorkerOptions, handler_fn};

const LIMIT: Duration = Duration::from_secs(30);
const CHILDREN: u64 = 100;

fn worker_options(grpc: std::net::SocketAddr, id: &str) -> WorkerOptions {
    let mut opts = WorkerOptions::new(vec![format!("http://{grpc}")]);
    opts.worker_id = id.into();
    opts.name = id.into();
    opts.concurrency = 64;
    opts.reconnect_initial = Duration::from_millis(50);
    opts
}

fn spec(name: &str, handler: &str, payload: Value) -> pb::WorkflowStepSpec {
    pb::WorkflowStepSpec {
        after_parents_end: false,
        name: name.into(),
        depends_on: Vec::new(),
        template: Some(pb::TaskTemplate {
            handler: handler.into(),
            payload: Some(pb::Payload {
                data: payload.to_string().into_bytes(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        }),
    }
}

fn fatal(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::fatal(e.to_string())
}

/// `split` fans out `square` children of 0..n and a `sum` join, answering
/// with the workflow's id; `square` answers x²; `sum` adds its parents'
/// outputs and answers "how many:total".
fn map_reduce_worker(opts: WorkerOptions) -> Worker {
    let split = handler_fn(|ctx: TaskContext| async move {
        let req: Value = serde_json::from_slice(&ctx.payload).map_err(fatal)?;
        let n = req["n"].as_u64().ok_or_else(|| fatal("no n"))?;
        let children: Vec<pb::WorkflowStepSpec> = (0..n)
            .map(|i| spec(&format!("c{i}"), "square", json!({ "x": i })))
            .collect();
        let join = spec("join", "sum", json!({}));
        let key = format!("{}:fan-out", ctx.task_id);
        // Twice: a handler run again (after a lost attempt) adds no second
        // set, the same key answering with the same workflow.
        let mut answers = Vec::new();
        for _ in 0..2 {
            let answer = ctx
                .children
                .fan_out(children.clone(), Some(join.clone()), &key)
                .await
                .map_err(|e| HandlerError::retryable(e.to_string()))?;
            answers.push(answer);
        }
        let (answer, again) = (answers.swap_remove(0), &answers[0]);
        if !again.existing || again.workflow_id != answer.workflow_id {
            return Err(fatal(format!(
                "a repeated fan-out made another workflow: {again:?}"
            )));
        }
        Ok::<_, HandlerError>(Output::new(answer.workflow_id.into_bytes(), "text/plain"))
    });
    let square = handler_fn(|ctx: TaskContext| async move {
        let req: Value = serde_json::from_slice(&ctx.payload).map_err(fatal)?;
        let x = req["x"].as_u64().ok_or_else(|| fatal("no x"))?;
        Ok::<_, HandlerError>(Output::new((x * x).to_string().into_bytes(), "text/plain"))
    });
    let sum = handler_fn(|ctx: TaskContext| async move {
        let mut total = 0u64;
        for (name, out) in &ctx.parent_outputs {
            let text = String::from_utf8(out.data.clone()).map_err(fatal)?;
            total += text
                .parse::<u64>()
                .map_err(|e| fatal(format!("{name}: {e}")))?;
        }
        let answer = format!("{}:{total}", ctx.parent_outputs.len());
        Ok::<_, HandlerError>(Output::new(answer.into_bytes(), "text/plain"))
    });
    Worker::new(opts)
        .handler("split", split)
        .handler("square", square)
        .handler("sum", sum)
}

type TaskApi = taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>;

#[tokio::test]
async fn a_handler_fans_out_100_children_and_the_join_sees_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let worker = TestWorker::spawn(map_reduce_worker(worker_options(node.grpc_addr, "w-map")));
    assert!(worker.handle.wait_connected(LIMIT).await);
    let mut api = api(node.grpc_addr).await;

    let parent = submit(
        &mut api,
        "split",
        json!({ "n": CHILDREN }).to_string().as_bytes(),
    )
    .await;
    let done = wait_task_state(&api, &parent, pb::TaskState::Succeeded, LIMIT).await;
    let workflow_id = String::from_utf8(done.output.unwrap().data).unwrap();

    let workflow = wait_for("the children's workflow to end", LIMIT, || {
        let mut api = api.clone();
        let id = workflow_id.clone();
        async move {
            let w = api
                .get_workflow(pb::GetWorkflowRequest {
                    workflow_id: id,
                    ..Default::default()
                })
                .await
                .expect("GetWorkflow")
                .into_inner()
                .workflow
                .unwrap();
            (w.state != pb::WorkflowState::Running as i32).then_some(w)
        }
    })
    .await;
    assert_eq!(
        workflow.state,
        pb::WorkflowState::Succeeded as i32,
        "{}",
        workflow.message
    );
    assert_eq!(workflow.parent_task_id, parent);
    assert_eq!(workflow.step_count as u64, CHILDREN + 1);
    let join = workflow.steps.iter().find(|s| s.name == "join").unwrap();
    let want: u64 = (0..CHILDREN).map(|i| i * i).sum();
    assert_eq!(
        String::from_utf8(join.output.clone().unwrap().data).unwrap(),
        format!("{CHILDREN}:{want}"),
        "the join saw every child's output"
    );

    // Every child (and the join) is listed under the parent, over gRPC
    // and over REST; the parent's own listing is untouched.
    let listed = children(&mut api, &parent).await;
    assert_eq!(listed.len() as u64, CHILDREN + 1);
    assert!(listed.iter().all(|t| t.parent_task_id == parent));
    assert!(
        listed.windows(2).all(|w| w[0].task_id > w[1].task_id),
        "newest first"
    );
    let rest = Rest::new(node.http_addr);
    let reply = rest
        .call(
            Method::GET,
            &format!("/api/tasks?parentTaskId={parent}&pageSize=1000&state=TASK_STATE_SUCCEEDED"),
            None,
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert_eq!(
        reply.json["tasks"].as_array().unwrap().len() as u64,
        CHILDREN + 1
    );
    let parent_task = get(&mut api, &parent).await;
    assert!(parent_task.parent_task_id.is_empty());
    let listed = api
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("ListWorkflows")
        .into_inner()
        .workflows;
    assert_eq!(listed.len(), 1, "the repeated fan-out added no workflow");
    assert_eq!(listed[0].parent_task_id, parent);
    worker.stop().await;
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_children_and_refuses_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    // `spawn` adds three held children and a child workflow of two held
    // steps, then holds itself; `hold` runs until it is cancelled.
    let spawn = handler_fn(|ctx: TaskContext| async move {
        let held = |i: u32| pb::SubmitTaskRequest {
            handler: "hold".into(),
            client_request_id: format!("{}:{i}", ctx.task_id),
            ..Default::default()
        };
        let answer = ctx
            .children
            .submit_many((0..3).map(held).collect())
            .await
            .map_err(|e| HandlerError::retryable(e.to_string()))?;
        assert!(answer.results.iter().all(|r| r.accepted.is_some()));
        ctx.children
            .fan_out(
                vec![spec("x", "hold", json!({})), spec("y", "hold", json!({}))],
                None,
                &format!("{}:wf", ctx.task_id),
            )
            .await
            .map_err(|e| HandlerError::retryable(e.to_string()))?;
        ctx.cancelled().await;
        Err::<Output, _>(HandlerError::fatal("cancelled"))
    });
    let hold = handler_fn(|ctx: TaskContext| async move {
        ctx.cancelled().await;
        Err::<Output, _>(HandlerError::fatal("cancelled"))
    });
    let worker = TestWorker::spawn(
        Worker::new(worker_options(node.grpc_addr, "w-hold"))
            .handler("spawn", spawn)
            .handler("hold", hold),
    );
    assert!(worker.handle.wait_connected(LIMIT).await);
    let mut api = api(node.grpc_addr).await;
    let rest = Rest::new(node.http_addr);

    let parent = submit(&mut api, "spawn", b"{}").await;
    let running = five_running(&api, &parent).await;
    let workflow_id = running
        .iter()
        .find(|t| !t.workflow_id.is_empty())
        .map(|t| t.workflow_id.clone())
        .unwrap();

    let reply = rest
        .call(
            Method::POST,
            &format!("/api/tasks/{parent}/cancel"),
            Some(json!({"reason": "enough"})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert_eq!(reply.json["task"]["state"], "TASK_STATE_CANCELLED");
    all_cancelled(&api, &parent).await;
    let workflow = rest
        .call(Method::GET, &format!("/api/workflows/{workflow_id}"), None)
        .await;
    assert_eq!(
        workflow.json["workflow"]["state"],
        "WORKFLOW_STATE_CANCELLED"
    );
    assert_eq!(workflow.json["workflow"]["parentTaskId"], parent.as_str());

    // The parent has ended: a child is refused and nothing is written.
    let refused = rest
        .call(
            Method::POST,
            "/api/tasks",
            Some(json!({"handler": "hold", "parentTaskId": parent})),
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        refused.json
    );
    assert!(
        refused.json.to_string().contains("has ended"),
        "{:?}",
        refused.json
    );
    let refused_wf = api
        .submit_workflow(pb::SubmitWorkflowRequest {
            steps: vec![spec("z", "hold", json!({}))],
            parent_task_id: parent.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused_wf.code(), tonic::Code::FailedPrecondition);
    // An unknown parent, and a malformed one.
    let unknown = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "hold".into(),
            parent_task_id: "0190b0b0-0000-7000-8000-000000000001".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    let malformed = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "hold".into(),
            parent_task_id: "not-a-task".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), tonic::Code::InvalidArgument);
    assert_eq!(children(&mut api, &parent).await.len(), 5);
    let all = api
        .list_tasks(pb::ListTasksRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.tasks.len(), 6, "the parent and its five children only");

    // The bulk CancelTasks sweeps the children of what it cancels too.
    let second = submit(&mut api, "spawn", b"{}").await;
    five_running(&api, &second).await;
    let answer = api
        .cancel_tasks(pb::CancelTasksRequest {
            handler: "spawn".into(),
            ..Default::default()
        })
        .await
        .expect("CancelTasks")
        .into_inner();
    assert_eq!(answer.cancelled, 1, "{answer:?}");
    all_cancelled(&api, &second).await;

    // So does CancelWorkflow, for the children of its steps.
    let w = api
        .submit_workflow(pb::SubmitWorkflowRequest {
            steps: vec![spec("s", "spawn", json!({}))],
            ..Default::default()
        })
        .await
        .expect("SubmitWorkflow")
        .into_inner();
    let step = w.workflow.unwrap().steps[0].task_id.clone();
    five_running(&api, &step).await;
    api.cancel_workflow(pb::CancelWorkflowRequest {
        workflow_id: w.workflow_id,
        ..Default::default()
    })
    .await
    .expect("CancelWorkflow");
    all_cancelled(&api, &step).await;
    worker.stop().await;
}

/// Waits until `parent` has 5 children RUNNING (`spawn`'s work); them.
async fn five_running(api: &TaskApi, parent: &str) -> Vec<pb::Task> {
    wait_for("5 children running", LIMIT, || {
        let mut api = api.clone();
        let parent = parent.to_string();
        async move {
            let c = children(&mut api, &parent).await;
            let n = c
                .iter()
                .filter(|t| t.state == pb::TaskState::Running as i32)
                .count();
            (n == 5).then_some(c)
        }
    })
    .await
}

/// Waits until every child of `parent` (5) is CANCELLED.
async fn all_cancelled(api: &TaskApi, parent: &str) {
    wait_for("every child cancelled", LIMIT, || {
        let mut api = api.clone();
        let parent = parent.to_string();
        async move {
            let c = children(&mut api, &parent).await;
            (c.len() == 5 && c.iter().all(|t| t.state == pb::TaskState::Cancelled as i32))
                .then_some(())
        }
    })
    .await;
}
