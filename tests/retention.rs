//! Retention through the API: `Admin.GetRetention` shows the server's
//! horizons, the namespace's and its handlers' own, what is in effect and
//! the oldest ended task kept; `Admin.SetRetention` sets them (validated,
//! inherited where unset, cleared when all are unset); both over REST too.
//! That removal follows them is the store's conformance suite and the
//! scheduler's fake-clock tests.

use reqwest::{Method, StatusCode};
use serde_json::json;
use taskmesh::v1::{self as pb, admin_client::AdminClient};
use taskmesh_testkit::http::Rest;
use taskmesh_testkit::*;

fn mins(n: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: n * 60,
        nanos: 0,
    })
}

/// The default namespace's retention, as `GetRetention` answers it.
async fn retention_of(
    admin: &mut AdminClient<tonic::transport::Channel>,
) -> pb::NamespaceRetention {
    admin
        .get_retention(pb::GetRetentionRequest::default())
        .await
        .expect("GetRetention")
        .into_inner()
        .retention
        .expect("retention")
}

#[tokio::test]
async fn horizons_are_set_per_namespace_and_handler_and_shown_in_effect() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut admin = AdminClient::new(channel(node.grpc_addr).await);
    let mut api = api(node.grpc_addr).await;

    // The server's defaults: succeeded and cancelled 24 h, the others 7 days.
    let r = retention_of(&mut admin).await;
    assert_eq!(r.namespace, "default");
    let day = mins(24 * 60);
    let week = mins(7 * 24 * 60);
    let server = r.server.expect("server horizons");
    assert_eq!(
        (
            server.succeeded,
            server.failed,
            server.timed_out,
            server.cancelled
        ),
        (day, week, week, day)
    );
    assert_eq!(r.effective, r.server, "nothing set: the server's apply");
    assert!(r.handlers.is_empty() && r.oldest.is_empty());

    // The namespace keeps FAILED tasks 30 days; "echo" keeps SUCCEEDED 5 min.
    let set = |handler: &str, horizons: pb::RetentionHorizons| pb::SetRetentionRequest {
        handler: handler.into(),
        horizons: Some(horizons),
        ..Default::default()
    };
    admin
        .set_retention(set(
            "",
            pb::RetentionHorizons {
                failed: mins(30 * 24 * 60),
                ..Default::default()
            },
        ))
        .await
        .expect("set the namespace's");
    let r = admin
        .set_retention(set(
            "echo",
            pb::RetentionHorizons {
                succeeded: mins(5),
                ..Default::default()
            },
        ))
        .await
        .expect("set a handler's")
        .into_inner()
        .retention
        .expect("retention");
    let effective = r.effective.expect("effective");
    assert_eq!(
        (effective.succeeded, effective.failed),
        (day, mins(30 * 24 * 60)),
        "the namespace's own over the server's"
    );
    assert_eq!(r.handlers.len(), 1);
    let echo = &r.handlers[0];
    assert_eq!(echo.handler, "echo");
    let echo_effective = echo.effective.expect("effective");
    assert_eq!(
        (
            echo_effective.succeeded,
            echo_effective.failed,
            echo_effective.cancelled
        ),
        (mins(5), mins(30 * 24 * 60), day),
        "the handler's own, then the namespace's, then the server's"
    );

    // Out of range: refused naming the field, nothing changed.
    let err = admin
        .set_retention(set(
            "echo",
            pb::RetentionHorizons {
                succeeded: Some(prost_types::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
                ..Default::default()
            },
        ))
        .await
        .expect_err("30 s is under the minimum");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("succeeded"), "{}", err.message());

    // The oldest ended task kept, per state.
    let id = submit(&mut api, "nobody-serves-this", b"{}").await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: id.clone(),
        ..Default::default()
    })
    .await
    .expect("cancel");
    let r = retention_of(&mut admin).await;
    assert_eq!(r.oldest.len(), 1, "{:?}", r.oldest);
    assert_eq!(r.oldest[0].state, pb::TaskState::Cancelled as i32);
    assert_eq!(r.oldest[0].task_id, id);
    assert!(r.oldest[0].end_time.is_some());
    assert_eq!(r.handlers.len(), 1, "the refused set changed nothing");

    // Over REST; clearing the handler's (nothing set) removes it.
    let rest = Rest::new(node.http_addr);
    let reply = rest
        .call(
            Method::POST,
            "/api/retention",
            Some(json!({"handler": "echo", "horizons": {}})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert!(
        reply.json["retention"]
            .get("handlers")
            .is_none_or(|h| h.as_array().is_some_and(Vec::is_empty)),
        "{:?}",
        reply.json
    );
    let reply = rest.call(Method::GET, "/api/retention", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json["retention"]["effective"]["failed"], "2592000s");
    assert_eq!(reply.json["retention"]["server"]["succeeded"], "86400s");
    stop_node(node).await;
}
