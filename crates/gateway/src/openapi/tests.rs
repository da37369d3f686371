//! The generated document: shape of the operations that matter, checked
//! against the contract as compiled.

use serde_json::Value;

use super::document;

fn doc() -> Value {
    document().expect("the contract's document builds")
}

fn op<'a>(doc: &'a Value, path: &str, method: &str) -> &'a Value {
    let op = &doc["paths"][path][method];
    assert!(op.is_object(), "{method} {path} is missing");
    op
}

fn param_names(op: &Value) -> Vec<String> {
    op["parameters"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| p["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_annotated_rpc_is_an_operation() {
    let doc = doc();
    let mut ids: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|ops| ops.as_object().unwrap().values())
        .map(|op| op["operationId"].as_str().unwrap().to_string())
        .filter(|id| id.starts_with("TaskApi_"))
        .collect();
    ids.sort();
    let pool = crate::descriptor_pool().unwrap();
    let service = pool.get_service_by_name("taskmesh.v1.TaskApi").unwrap();
    let mut want: Vec<String> = service
        .methods()
        .map(|m| format!("TaskApi_{}", m.name()))
        .collect();
    want.sort();
    assert_eq!(
        ids, want,
        "every TaskApi RPC has exactly one REST operation"
    );
    assert_eq!(doc["openapi"], "3.0.3");
}

#[test]
fn submit_is_accepted_with_a_location() {
    let doc = doc();
    let submit = op(&doc, "/api/tasks", "post");
    let r = &submit["responses"];
    assert_eq!(r["202"]["headers"]["Location"]["required"], true);
    assert!(r["200"].is_object() && r["default"].is_object());
    assert_eq!(
        submit["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/taskmesh.v1.SubmitTaskRequest"
    );
    let req = &doc["components"]["schemas"]["taskmesh.v1.SubmitTaskRequest"];
    assert_eq!(req["additionalProperties"], false);
    assert!(
        req["properties"]["clientRequestId"]["description"]
            .as_str()
            .unwrap()
            .contains("Idempotency key")
    );
    assert_eq!(req["properties"]["delay"]["type"], "string");
    assert_eq!(req["properties"]["runAt"]["format"], "date-time");
}

#[test]
fn path_query_and_body_fields_are_split_as_the_rules_say() {
    let doc = doc();
    let list = op(&doc, "/api/tasks", "get");
    assert_eq!(
        param_names(list),
        [
            "state",
            "handler",
            "pageSize",
            "pageToken",
            "namespace",
            "view",
            "label",
            "createdAfter",
            "createdBefore",
            "clientRequestId",
            "parentTaskId"
        ]
    );
    // The filter takes the defined states, by name or number (the rule
    // `defined_only`), so it lists both.
    let states = list["parameters"][0]["schema"]["enum"].as_array().unwrap();
    assert!(states.contains(&"TASK_STATE_RUNNING".into()), "{states:?}");
    assert!(
        states.contains(&4.into()) && !states.contains(&10.into()),
        "{states:?}"
    );
    // A task id in the path is a UUID; a page size at most 1000.
    let get = op(&doc, "/api/tasks/{task_id}", "get");
    assert_eq!(get["parameters"][0]["schema"]["format"], "uuid");
    assert_eq!(list["parameters"][2]["schema"]["maximum"], 1000);
    let cancel = op(&doc, "/api/tasks/{task_id}/cancel", "post");
    assert_eq!(param_names(cancel), ["task_id"]);
    let body = &cancel["requestBody"]["content"]["application/json"]["schema"];
    let props: Vec<&String> = body["properties"].as_object().unwrap().keys().collect();
    assert_eq!(
        props,
        ["namespace", "reason"],
        "the path-bound task_id is not in the body"
    );
    let create = op(&doc, "/api/schedules", "post");
    assert_eq!(
        param_names(create),
        ["namespace"],
        "what the body (the schedule) does not hold comes from the query"
    );
    assert_eq!(
        create["requestBody"]["content"]["application/json"]["schema"]["allOf"][0]["$ref"],
        "#/components/schemas/taskmesh.v1.Schedule"
    );
    let update = op(&doc, "/api/schedules/{schedule_id}", "put");
    assert_eq!(param_names(update), ["schedule_id", "namespace"]);
    assert!(doc["paths"]["/api/tasks:batch"]["post"].is_object());
    assert!(doc["paths"]["/api/breakers"]["get"].is_object());
}

#[test]
fn watch_is_an_event_stream_and_types_follow_proto3_json() {
    let doc = doc();
    let watch = op(&doc, "/api/tasks/{task_id}/watch", "get");
    let event = &watch["responses"]["200"]["content"]["text/event-stream"]["schema"];
    assert_eq!(event["required"][0], "data");
    assert_eq!(
        event["properties"]["data"]["contentSchema"]["anyOf"][0]["$ref"],
        "#/components/schemas/taskmesh.v1.WatchTaskResponse"
    );
    let schemas = &doc["components"]["schemas"];
    let task = &schemas["taskmesh.v1.Task"]["properties"];
    assert_eq!(
        task["version"]["anyOf"][0]["type"], "string",
        "int64 as a string"
    );
    assert_eq!(task["maxAttempts"]["type"], "integer");
    assert_eq!(task["labels"]["additionalProperties"]["type"], "string");
    assert_eq!(task["attempts"]["type"], "array");
    let states = schemas["taskmesh.v1.TaskState"]["enum"].as_array().unwrap();
    assert!(states.contains(&"TASK_STATE_SUCCEEDED".into()));
    assert!(
        schemas["taskmesh.v1.TaskState"]["description"]
            .as_str()
            .unwrap()
            .contains("`TASK_STATE_READY`: Due")
    );
    assert_eq!(schemas["Status"]["required"][0], "code");
}

#[test]
fn rendering_is_stable() {
    let a = super::render(&doc());
    let b = super::render(&doc());
    assert_eq!(a, b);
    assert!(a.ends_with("}\n"));
}
