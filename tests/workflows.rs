//! Workflows end to end, on a real node over gRPC and REST with a real
//! worker stream: a diamond whose last step receives its parents' outputs
//! in its assignment, each failure policy, cancel reaching a running step,
//! and definitions refused whole with nothing written.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use taskmesh::v1 as pb;
use taskmesh::v1::connect_request::Message as In;
use taskmesh::v1::connect_response::Message as Out;
use taskmesh_testkit::http::{Events, Rest, assert_error};
use taskmesh_testkit::raw::RawWorker;
use taskmesh_testkit::*;

const LIMIT: Duration = Duration::from_secs(20);

fn step(name: &str, deps: &[&str], handler: &str) -> Value {
    json!({"name": name, "dependsOn": deps, "template": {"handler": handler}})
}

/// Completes `a` with `output`, or fails it for good.
async fn finish(raw: &RawWorker, a: &pb::TaskAssignment, output: Option<&str>) {
    let result = match output {
        Some(text) => pb::task_complete::Result::Success(pb::TaskSuccess {
            output: Some(pb::Payload {
                data: text.as_bytes().to_vec(),
                content_type: "text/plain".into(),
            }),
        }),
        None => pb::task_complete::Result::Failure(pb::TaskFailure {
            message: format!("{} broke", a.workflow_step),
            retryable: false,
        }),
    };
    raw.send(In::Complete(pb::TaskComplete {
        task_id: a.task_id.clone(),
        execution_id: a.execution_id.clone(),
        result: Some(result),
    }))
    .await;
}

/// The next cancel the worker is sent (other messages skipped).
async fn next_cancel(raw: &mut RawWorker) -> pb::TaskCancel {
    loop {
        match raw.next(LIMIT).await {
            Some(Out::Cancel(c)) => return c,
            Some(_) => continue,
            None => panic!("the running step's worker was not told to cancel"),
        }
    }
}

/// The next `n` assignments, sorted by step name.
async fn next_steps(raw: &mut RawWorker, n: usize) -> Vec<pb::TaskAssignment> {
    let mut got = raw.assigns(n).await;
    got.sort_by(|a, b| a.workflow_step.cmp(&b.workflow_step));
    got
}

async fn workflow(rest: &Rest, id: &str) -> Value {
    let reply = rest
        .call(Method::GET, &format!("/api/workflows/{id}"), None)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    reply.json["workflow"].clone()
}

async fn wait_workflow(rest: &Rest, id: &str, want: &str) -> Value {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let w = workflow(rest, id).await;
        if w["state"] == want {
            return w;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workflow {id} never reached {want}: {w:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_diamond_over_rest_passes_its_parents_outputs_to_the_last_step() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let mut raw = RawWorker::connect(node.grpc_addr, "w-dag", &["dag"], 4).await;

    let body = json!({
        "clientRequestId": "diamond",
        "steps": [
            step("a", &[], "dag"),
            step("b", &["a"], "dag"),
            step("c", &["a"], "dag"),
            step("d", &["b", "c"], "dag"),
        ]
    });
    let reply = rest
        .call(Method::POST, "/api/workflows", Some(body.clone()))
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{:?}", reply.json);
    let id = reply.json["workflowId"].as_str().unwrap().to_string();
    assert_eq!(
        reply.headers["location"].to_str().unwrap(),
        format!("/api/workflows/{id}")
    );
    assert_eq!(reply.json["workflow"]["stepCount"], 4);
    let again = rest.call(Method::POST, "/api/workflows", Some(body)).await;
    assert_eq!(again.status, StatusCode::OK, "an idempotent repeat");
    assert_eq!(again.json["workflowId"], id.as_str());
    let (status, _, mut watch) = Events::open(&rest, &format!("/api/workflows/{id}/watch")).await;
    assert_eq!(status, StatusCode::OK);
    let (_, first) = watch.next(LIMIT).await.expect("the first snapshot");
    assert_eq!(first["workflow"]["state"], "WORKFLOW_STATE_RUNNING");

    let a = next_steps(&mut raw, 1).await;
    assert_eq!(a[0].workflow_step, "a");
    assert_eq!(a[0].workflow_id, id);
    assert!(a[0].parent_outputs.is_empty());
    finish(&raw, &a[0], Some("A")).await;
    let bc = next_steps(&mut raw, 2).await;
    assert_eq!(
        bc.iter()
            .map(|s| s.workflow_step.as_str())
            .collect::<Vec<_>>(),
        ["b", "c"]
    );
    assert_eq!(bc[0].parent_outputs["a"].data, b"A");
    finish(&raw, &bc[0], Some("B")).await;
    finish(&raw, &bc[1], Some("C")).await;
    let d = next_steps(&mut raw, 1).await;
    assert_eq!(d[0].workflow_step, "d");
    let mut outs: Vec<(String, String)> = d[0]
        .parent_outputs
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8(v.data.clone()).unwrap()))
        .collect();
    outs.sort();
    assert_eq!(
        outs,
        [("b".into(), "B".into()), ("c".into(), "C".into())],
        "d sees b's and c's outputs, not a's"
    );
    assert_eq!(d[0].parent_outputs["b"].content_type, "text/plain");
    finish(&raw, &d[0], Some("D")).await;

    // The watch follows every step to the end, then closes.
    let mut seen = vec![first];
    while let Some((_, event)) = watch.next(LIMIT).await {
        seen.push(event);
    }
    let last = &seen.last().unwrap()["workflow"];
    assert_eq!(last["state"], "WORKFLOW_STATE_SUCCEEDED", "{seen:#?}");
    assert!(seen.len() >= 2, "a snapshot and the end: {}", seen.len());
    let done = wait_workflow(&rest, &id, "WORKFLOW_STATE_SUCCEEDED").await;
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    for (s, want) in steps.iter().zip(["A", "B", "C", "D"]) {
        assert_eq!(s["state"], "TASK_STATE_SUCCEEDED");
        let data = s["output"]["data"].as_str().unwrap();
        assert_eq!(data, base64_of(want), "{s}");
    }
    let listed = rest
        .call(
            Method::GET,
            "/api/workflows?state=WORKFLOW_STATE_SUCCEEDED",
            None,
        )
        .await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.json["workflows"][0]["workflowId"], id.as_str());
    // A step's task names its workflow.
    let task = rest.task(steps[3]["taskId"].as_str().unwrap()).await;
    assert_eq!(task["workflowId"], id.as_str());
    assert_eq!(task["dependsOn"], json!(["b", "c"]));
    raw.close().await;
    stop_node(node).await;
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

async fn get_workflow(api: &mut TaskApi, id: &str) -> pb::Workflow {
    api.get_workflow(pb::GetWorkflowRequest {
        workflow_id: id.into(),
        ..Default::default()
    })
    .await
    .expect("get_workflow")
    .into_inner()
    .workflow
    .expect("a workflow")
}

type TaskApi = pb::task_api_client::TaskApiClient<tonic::transport::Channel>;

async fn wait_grpc(api: &mut TaskApi, id: &str, want: pb::WorkflowState) -> pb::Workflow {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let w = get_workflow(api, id).await;
        if w.state == want as i32 {
            return w;
        }
        assert!(tokio::time::Instant::now() < deadline, "{w:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn each_failure_policy_and_cancel_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let mut raw = RawWorker::connect(node.grpc_addr, "w-policy", &["pol"], 4).await;
    let spec = |name: &str, deps: &[&str]| pb::WorkflowStepSpec {
        after_parents_end: false,
        name: name.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        template: Some(pb::TaskTemplate {
            handler: "pol".into(),
            ..Default::default()
        }),
    };
    let diamond = || {
        vec![
            spec("a", &[]),
            spec("b", &["a"]),
            spec("c", &["a"]),
            spec("d", &["b", "c"]),
        ]
    };
    for policy in [
        pb::FailurePolicy::CancelRemaining,
        pb::FailurePolicy::ContinueIndependent,
    ] {
        let id = api
            .submit_workflow(pb::SubmitWorkflowRequest {
                steps: diamond(),
                failure_policy: policy as i32,
                ..Default::default()
            })
            .await
            .expect("submit")
            .into_inner()
            .workflow_id;
        let a = next_steps(&mut raw, 1).await;
        finish(&raw, &a[0], Some("A")).await;
        let bc = next_steps(&mut raw, 2).await;
        raw.ack(&bc[1]).await;
        finish(&raw, &bc[0], None).await;
        if policy == pb::FailurePolicy::CancelRemaining {
            // c was running: its worker is told to stop.
            let told = next_cancel(&mut raw).await;
            assert_eq!(told.task_id, bc[1].task_id);
        }
        let deadline = tokio::time::Instant::now() + LIMIT;
        let w = loop {
            let w = get_workflow(&mut api, &id).await;
            let d = &w.steps[3];
            if d.state == pb::TaskState::Cancelled as i32 {
                break w;
            }
            assert!(tokio::time::Instant::now() < deadline, "{w:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        match policy {
            pb::FailurePolicy::CancelRemaining => {
                assert_eq!(w.state, pb::WorkflowState::Failed as i32);
                assert_eq!(w.steps[2].state, pb::TaskState::Cancelled as i32, "c too");
                assert!(w.message.contains("b broke"), "{}", w.message);
                // A step is retried with its workflow, never alone.
                let alone = api
                    .retry_task(pb::RetryTaskRequest {
                        task_id: w.steps[1].task_id.clone(),
                        ..Default::default()
                    })
                    .await
                    .expect_err("RetryTask on a step");
                assert_eq!(alone.code(), tonic::Code::FailedPrecondition);
                assert!(
                    alone.message().contains("RetryWorkflow"),
                    "{}",
                    alone.message()
                );
            }
            _ => {
                assert_eq!(w.state, pb::WorkflowState::Running as i32, "c still runs");
                finish(&raw, &bc[1], Some("C")).await;
                wait_grpc(&mut api, &id, pb::WorkflowState::Failed).await;
                // RetryWorkflow: b again, then d with both outputs.
                let r = api
                    .retry_workflow(pb::RetryWorkflowRequest {
                        workflow_id: id.clone(),
                        ..Default::default()
                    })
                    .await
                    .expect("retry")
                    .into_inner();
                assert_eq!(r.rerun_steps, 2);
                let b = next_steps(&mut raw, 1).await;
                assert_eq!(b[0].workflow_step, "b");
                assert_eq!(b[0].attempt, 2, "attempt numbers go on");
                finish(&raw, &b[0], Some("B2")).await;
                let d = next_steps(&mut raw, 1).await;
                assert_eq!(d[0].workflow_step, "d");
                assert_eq!(d[0].parent_outputs["b"].data, b"B2");
                assert_eq!(d[0].parent_outputs["c"].data, b"C");
                finish(&raw, &d[0], Some("D")).await;
                let w = wait_grpc(&mut api, &id, pb::WorkflowState::Succeeded).await;
                assert_eq!(
                    w.steps[0].attempt, 1,
                    "a, which succeeded, did not run again"
                );
            }
        }
    }

    // Cancel reaches the running step's worker.
    let id = api
        .submit_workflow(pb::SubmitWorkflowRequest {
            steps: diamond(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .workflow_id;
    let a = next_steps(&mut raw, 1).await;
    raw.ack(&a[0]).await;
    let w = api
        .cancel_workflow(pb::CancelWorkflowRequest {
            workflow_id: id.clone(),
            reason: "enough".into(),
            ..Default::default()
        })
        .await
        .expect("cancel")
        .into_inner()
        .workflow
        .unwrap();
    assert_eq!(w.state, pb::WorkflowState::Cancelled as i32);
    assert!(
        w.steps
            .iter()
            .all(|s| s.state == pb::TaskState::Cancelled as i32)
    );
    let told = next_cancel(&mut raw).await;
    assert_eq!(told.task_id, a[0].task_id);
    assert_eq!(told.execution_id, a[0].execution_id);
    raw.close().await;
    stop_node(node).await;
}

#[tokio::test]
async fn a_bad_definition_is_refused_whole_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let cases = [
        (
            json!({"steps": [step("a", &["b"], "x"), step("b", &["c"], "x"), step("c", &["a"], "x")]}),
            "cycle",
        ),
        (
            json!({"steps": [step("a", &["zz"], "x")]}),
            "\"zz\", which is not a step",
        ),
        (
            json!({"steps": [step("a", &[], "x"), step("a", &[], "x")]}),
            "used twice",
        ),
        (json!({"steps": []}), "steps"),
        (
            json!({"steps": [step("a", &[], "x")], "onFailure": step("f", &["a"], "x")}),
            "depends on none",
        ),
        (
            json!({"steps": [step("a", &["f"], "x")], "onFailure": step("f", &[], "x")}),
            "no step may",
        ),
        (
            json!({"steps": [step("a", &[], "x")], "onFailure": step("a", &[], "x")}),
            "used twice",
        ),
        (
            json!({"steps": [{"name": "a", "template": {"handler": "x", "timeout": "0s"}}]}),
            "timeout",
        ),
    ];
    for (body, text) in cases {
        let reply = rest.call(Method::POST, "/api/workflows", Some(body)).await;
        assert_error(&reply, 400, 3, text);
    }
    let listed = rest.call(Method::GET, "/api/workflows", None).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert!(
        listed.json["workflows"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "{:?}",
        listed.json
    );
    assert_eq!(rest.count_tasks().await, 0, "no step was written");
    let missing = rest
        .call(
            Method::GET,
            "/api/workflows/018f2b9e-0000-7000-8000-000000000000",
            None,
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    stop_node(node).await;
}

/// An on_failure step: it waits while the steps run, then, once one fails,
/// runs with the failed step's error under its name among its parents'
/// outputs; the workflow ends FAILED after it, and the step shows as the
/// on_failure step.
#[tokio::test]
async fn the_on_failure_step_runs_after_a_failure_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let mut raw = RawWorker::connect(node.grpc_addr, "w-of", &["of"], 4).await;
    let body = json!({
        "steps": [step("a", &[], "of"), step("b", &["a"], "of")],
        "onFailure": step("cleanup", &[], "of"),
    });
    let reply = rest.call(Method::POST, "/api/workflows", Some(body)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{:?}", reply.json);
    let id = reply.json["workflowId"].as_str().unwrap().to_string();
    assert_eq!(reply.json["workflow"]["stepCount"], 3);
    let cleanup = &reply.json["workflow"]["steps"][2];
    assert_eq!(cleanup["name"], "cleanup");
    assert_eq!(cleanup["onFailure"], true);
    assert_eq!(cleanup["waiting"], true);

    let a = next_steps(&mut raw, 1).await;
    assert_eq!(a[0].workflow_step, "a", "only a runs first");
    finish(&raw, &a[0], None).await;
    let c = next_steps(&mut raw, 1).await;
    assert_eq!(c[0].workflow_step, "cleanup");
    let error = &c[0].parent_outputs["a"];
    assert_eq!(error.data, b"a broke");
    assert!(
        error.content_type.starts_with("text/plain"),
        "{}",
        error.content_type
    );
    assert!(
        !c[0].parent_outputs.contains_key("b"),
        "b was cancelled, not failed"
    );
    assert_eq!(
        workflow(&rest, &id).await["state"],
        "WORKFLOW_STATE_RUNNING",
        "the workflow waits for its on_failure step"
    );
    finish(&raw, &c[0], Some("cleaned")).await;
    let done = wait_workflow(&rest, &id, "WORKFLOW_STATE_FAILED").await;
    assert!(
        done["message"].as_str().unwrap().contains("a broke"),
        "{done:#}"
    );
    let states: Vec<&str> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "TASK_STATE_FAILED",
            "TASK_STATE_CANCELLED",
            "TASK_STATE_SUCCEEDED"
        ]
    );
    raw.close().await;
    stop_node(node).await;
}

/// A schedule whose template is a workflow: each fire creates the
/// workflow's run (a task with runsWorkflow and handler "workflow"), the
/// leader starts the diamond under it, its last step sees its parents'
/// outputs, and the run ends as the workflow does. RetryWorkflow of a
/// run's workflow is refused (RetryTask on the run starts it again), and
/// cancelling a run reaches its running step. A definition with both a
/// template and a workflow, or with a cycle, is refused.
#[tokio::test]
async fn a_schedule_starts_a_workflow_at_each_fire() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let mut raw = RawWorker::connect(node.grpc_addr, "w-sched", &["sdag"], 4).await;
    let diamond = json!({"steps": [
        step("a", &[], "sdag"),
        step("b", &["a"], "sdag"),
        step("c", &["a"], "sdag"),
        step("d", &["b", "c"], "sdag"),
    ]});
    for (body, text) in [
        (
            json!({"kind": "SCHEDULE_KIND_FIXED_RATE", "interval": "1s",
                   "template": {"handler": "sdag"}, "workflow": diamond}),
            "exactly one",
        ),
        (
            json!({"kind": "SCHEDULE_KIND_FIXED_RATE", "interval": "1s",
                   "workflow": {"steps": [step("a", &["b"], "x"), step("b", &["a"], "x")]}}),
            "cycle",
        ),
    ] {
        let reply = rest.call(Method::POST, "/api/schedules", Some(body)).await;
        assert_error(&reply, 400, 3, text);
    }
    let reply = rest
        .call(
            Method::POST,
            "/api/schedules",
            Some(json!({"kind": "SCHEDULE_KIND_FIXED_RATE", "interval": "1s",
                        "overlapPolicy": "OVERLAP_POLICY_SKIP", "workflow": diamond})),
        )
        .await;
    assert!(reply.status.is_success(), "{:?}", reply.json);
    let schedule = reply.json["schedule"].clone();
    let schedule_id = schedule["scheduleId"].as_str().unwrap().to_string();
    assert!(
        schedule.get("template").is_none_or(Value::is_null),
        "{schedule:#}"
    );
    assert_eq!(
        schedule["workflow"]["steps"][3]["dependsOn"],
        json!(["b", "c"])
    );

    // The first fire's run: its steps arrive as a workflow's.
    let a = next_steps(&mut raw, 1).await;
    assert_eq!(a[0].workflow_step, "a");
    let run_id = rest.task(&a[0].task_id).await["parentTaskId"]
        .as_str()
        .expect("a step of the run")
        .to_string();
    let workflow_id = a[0].workflow_id.clone();
    // A fire while the run runs is skipped (overlap SKIP): steps come from
    // this run only.
    finish(&raw, &a[0], Some("A")).await;
    let bc = next_steps(&mut raw, 2).await;
    assert!(bc.iter().all(|s| s.workflow_id == workflow_id));
    finish(&raw, &bc[0], Some("B")).await;
    finish(&raw, &bc[1], Some("C")).await;
    let d = next_steps(&mut raw, 1).await;
    assert_eq!(
        (d[0].workflow_step.as_str(), d[0].workflow_id.as_str()),
        ("d", workflow_id.as_str())
    );
    assert_eq!(d[0].parent_outputs["b"].data, b"B");
    assert_eq!(d[0].parent_outputs["c"].data, b"C");
    // Pause before the run ends, so no further fire starts a workflow.
    let paused = rest
        .call(
            Method::POST,
            &format!("/api/schedules/{schedule_id}/pause"),
            Some(json!({})),
        )
        .await;
    assert_eq!(paused.status, StatusCode::OK, "{:?}", paused.json);
    finish(&raw, &d[0], Some("D")).await;
    let run = rest
        .wait_state(&run_id, "TASK_STATE_SUCCEEDED", LIMIT)
        .await;
    assert_eq!(run["runsWorkflow"], true, "{run:#}");
    assert_eq!(run["handler"], "workflow");
    assert_eq!(run["scheduleId"], schedule_id.as_str());
    let w = wait_workflow(&rest, &workflow_id, "WORKFLOW_STATE_SUCCEEDED").await;
    assert_eq!(w["parentTaskId"], run_id.as_str());
    let retry = rest
        .call(
            Method::POST,
            &format!("/api/workflows/{workflow_id}/retry"),
            Some(json!({})),
        )
        .await;
    assert_error(&retry, 400, 9, "RetryTask");

    // A triggered run, cancelled while its first step runs.
    let trig = rest
        .call(
            Method::POST,
            &format!("/api/schedules/{schedule_id}/trigger"),
            Some(json!({})),
        )
        .await;
    assert_eq!(trig.status, StatusCode::OK, "{:?}", trig.json);
    let a2 = next_steps(&mut raw, 1).await;
    assert_eq!(a2[0].workflow_step, "a");
    assert_ne!(
        a2[0].workflow_id, workflow_id,
        "a new workflow for the new run"
    );
    let run2 = rest.task(&a2[0].task_id).await["parentTaskId"]
        .as_str()
        .expect("a step of the run")
        .to_string();
    let cancel = rest
        .call(
            Method::POST,
            &format!("/api/tasks/{run2}/cancel"),
            Some(json!({})),
        )
        .await;
    assert_eq!(cancel.status, StatusCode::OK, "{:?}", cancel.json);
    let told = next_cancel(&mut raw).await;
    assert_eq!(
        told.task_id, a2[0].task_id,
        "the running step is told to stop"
    );
    wait_workflow(&rest, &a2[0].workflow_id, "WORKFLOW_STATE_CANCELLED").await;
    rest.wait_state(&run2, "TASK_STATE_CANCELLED", LIMIT).await;
    raw.close().await;
    stop_node(node).await;
}

/// A join run after its parents end (afterParentsEnd): a child fails, the
/// other is cancelled by the default policy, and the join still runs, with
/// the succeeded child's output in parentOutputs and the others' ends and
/// errors in parentErrors; the workflow ends FAILED after it.
#[tokio::test]
async fn a_join_after_its_parents_end_runs_with_their_outputs_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let mut raw = RawWorker::connect(node.grpc_addr, "w-join", &["mapper", "reducer"], 8).await;
    let mut join = step("join", &["a", "b", "c"], "reducer");
    join["afterParentsEnd"] = json!(true);
    let reply = rest
        .call(
            Method::POST,
            "/api/workflows",
            Some(json!({"steps": [
                step("a", &[], "mapper"),
                step("b", &[], "mapper"),
                step("c", &[], "mapper"),
                join,
            ]})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{:?}", reply.json);
    let id = reply.json["workflowId"].as_str().unwrap().to_string();
    assert_eq!(reply.json["workflow"]["steps"][3]["afterParentsEnd"], true);
    let abc = next_steps(&mut raw, 3).await;
    finish(&raw, &abc[0], Some("A")).await;
    // b fails for good: c (still running) is cancelled and told so.
    finish(&raw, &abc[1], None).await;
    // c's cancel and the join's assignment come in either order.
    let (mut told, mut j) = (None, Vec::new());
    while told.is_none() || j.is_empty() {
        match raw.next(LIMIT).await {
            Some(Out::Cancel(c)) => told = Some(c),
            Some(Out::Assign(a)) => j.push(a),
            Some(_) => {}
            None => panic!("no cancel of c ({told:?}) or no join ({j:?})"),
        }
    }
    assert_eq!(told.unwrap().task_id, abc[2].task_id);
    assert_eq!(j[0].workflow_step, "join");
    assert_eq!(j[0].parent_outputs.len(), 1, "{:?}", j[0].parent_outputs);
    assert_eq!(j[0].parent_outputs["a"].data, b"A");
    assert!(
        j[0].parent_errors["b"].starts_with("FAILED: b broke"),
        "{:?}",
        j[0].parent_errors
    );
    assert!(
        j[0].parent_errors["c"].starts_with("CANCELLED: "),
        "{:?}",
        j[0].parent_errors
    );
    finish(&raw, &j[0], Some("reduced")).await;
    let done = wait_workflow(&rest, &id, "WORKFLOW_STATE_FAILED").await;
    assert_eq!(
        done["steps"][3]["state"], "TASK_STATE_SUCCEEDED",
        "{done:#}"
    );
    assert!(
        done["message"].as_str().unwrap().contains("\"b\""),
        "{done:#}"
    );
    raw.close().await;
    stop_node(node).await;
}
