//! The OpenAPI 3 document of the REST gateway, generated from the same
//! descriptors and routes the gateway serves: paths from the
//! `google.api.http` templates, parameters from path variables and the
//! remaining request fields, request and response schemas from the
//! messages, enums by name, and source comments as descriptions. The
//! checked-in `docs/openapi.json` must equal [`render`]`(`[`document`]`()?)`;
//! a test says so, and `make openapi` rewrites it.

mod rules;
mod schema;

use std::collections::BTreeMap;

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use crate::Error;
use crate::rules::{BodyRule, Route, Routes, is_scalar_like};
use schema::{Comments, Schemas};

/// Name of the error component.
const STATUS: &str = "Status";

/// The document for the contract compiled into this binary.
pub fn document() -> Result<Value, Error> {
    let pool = crate::descriptor_pool()?;
    let routes = Routes::load(&pool)?;
    Ok(document_from(&pool, &routes))
}

/// The document as checked in: pretty JSON, keys sorted, ending in a newline.
pub fn render(document: &Value) -> String {
    let mut text = serde_json::to_string_pretty(document).unwrap_or_default();
    text.push('\n');
    text
}

/// The document for `routes` of `pool`.
pub fn document_from(pool: &DescriptorPool, routes: &Routes) -> Value {
    let comments = Comments::new(pool);
    let mut schemas = Schemas::new(&comments);
    schemas.insert(STATUS, status_schema());
    let mut paths: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut ids: BTreeMap<String, usize> = BTreeMap::new();
    let mut tags: BTreeMap<String, Value> = BTreeMap::new();
    for route in routes.iter() {
        let service = route.rpc.parent_service();
        let base = format!("{}_{}", service.name(), route.rpc.name());
        let n = ids.entry(base.clone()).or_default();
        let id = if *n == 0 { base } else { format!("{base}_{n}") };
        *n += 1;
        let mut tag = json!({"name": service.name()});
        if let Some(text) = comments.get(service.parent_file().name(), service.path()) {
            tag["description"] = text.into();
        }
        tags.insert(service.name().to_string(), tag);
        let op = operation(route, id, &comments, &mut schemas);
        paths
            .entry(route.template.openapi_path())
            .or_default()
            .insert(route.method.as_str().to_ascii_lowercase(), op);
    }
    tags.insert(
        "health".into(),
        json!({"name": "health", "description": "Liveness and readiness of the node."}),
    );
    let mut paths: Map<String, Value> = paths
        .into_iter()
        .map(|(path, ops)| (path, Value::Object(ops)))
        .collect();
    health_paths(&mut paths);
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "taskmesh REST API",
            "version": "v1",
            "description": "The REST/JSON transcoding of the taskmesh gRPC contract \
                (proto/taskmesh/v1), generated from its google.api.http annotations. \
                Bodies and responses use the proto3 JSON mapping: lowerCamelCase names, \
                64-bit integers as strings, enums by name, Timestamp as RFC 3339 and \
                Duration as seconds with an \"s\" suffix; fields with default values are \
                left out of responses. Unknown fields are refused with 400. Errors are \
                {\"code\", \"message\", \"details\"} with the gRPC status code.",
        },
        "tags": tags.into_values().collect::<Vec<_>>(),
        "paths": paths,
        "components": {"schemas": schemas.into_components()},
    })
}

fn operation(route: &Route, id: String, comments: &Comments, schemas: &mut Schemas) -> Value {
    let rpc = &route.rpc;
    let input = rpc.input();
    let mut op = json!({
        "operationId": id,
        "tags": [rpc.parent_service().name()],
    });
    if let Some(text) = comments.get(rpc.parent_file().name(), rpc.path()) {
        let summary = text.split(['\n', '.']).next().unwrap_or(text).trim();
        op["summary"] = summary.into();
        op["description"] = text.into();
    }

    let mut parameters = Vec::new();
    for (var, fields) in &route.path_fields {
        let leaf = fields.last().expect("never empty");
        let mut p = json!({
            "name": var,
            "in": "path",
            "required": true,
            "schema": rules::apply(leaf, schemas.kind(&leaf.kind())),
        });
        if let Some(text) = comments.field(leaf) {
            p["description"] = text.into();
        }
        parameters.push(p);
    }
    let bound: Vec<FieldDescriptor> = route
        .path_fields
        .iter()
        .map(|(_, p)| p[0].clone())
        .collect();
    match &route.body {
        BodyRule::Whole => {}
        BodyRule::None => query_params(&input, "", &bound, 0, comments, schemas, &mut parameters),
        BodyRule::Field(body) => {
            let mut skip = bound.clone();
            skip.push(body.clone());
            query_params(&input, "", &skip, 0, comments, schemas, &mut parameters);
        }
    }
    if !parameters.is_empty() {
        op["parameters"] = parameters.into();
    }

    let body_schema = match &route.body {
        BodyRule::None => None,
        BodyRule::Whole if bound.is_empty() => Some(schemas.message_ref(&input)),
        BodyRule::Whole => Some(schemas.object(&input, &bound)),
        BodyRule::Field(field) => Some(schemas.field(field)),
    };
    if let Some(schema) = body_schema {
        // A body may be left out when none of its fields is required (the
        // request is then all defaults).
        let required = match &route.body {
            BodyRule::Field(field) => rules::required(field),
            _ => schema_requires_fields(&schema, &input),
        };
        op["requestBody"] = json!({
            "required": required,
            "content": {"application/json": {"schema": schema}},
        });
    }

    let output = match &route.response_body {
        Some(field) => schemas.field(field),
        None => schemas.message_ref(&rpc.output()),
    };
    let json_content = |schema: &Value| json!({"application/json": {"schema": schema}});
    let mut responses = Map::new();
    if route.streaming() {
        // Each event described as OpenAPI 3.2 does (and schemathesis reads a
        // 3.0 `schema` on text/event-stream): an object with the event name
        // and its data, a JSON text of the message or of a Status.
        let status = json!({"$ref": format!("#/components/schemas/{STATUS}")});
        responses.insert(
            "200".into(),
            json!({
                "description": format!(
                    "A stream of Server-Sent Events. Each event's data is one {} as JSON; \
                     a failure after the stream started is an event named \"error\" whose \
                     data is a Status, and ends the stream.",
                    rpc.output().name()
                ),
                "content": {"text/event-stream": {"schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "event": {"type": "string", "enum": ["message", "error"]},
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"anyOf": [output.clone(), status]},
                        },
                    },
                }}},
            }),
        );
    } else if let Some(accepted) = route.accepted {
        responses.insert(
            "202".into(),
            json!({
                "description": "Accepted: the work is queued; poll the resource at Location.",
                "headers": {"Location": {
                    "description": format!("The accepted resource, {}.", accepted.location),
                    "required": true,
                    "schema": {"type": "string"},
                }},
                "content": json_content(&output),
            }),
        );
        responses.insert(
            "200".into(),
            json!({
                "description": format!(
                    "The same request was accepted before ({} is true); nothing new was made.",
                    accepted.existing_field
                ),
                "content": json_content(&output),
            }),
        );
    } else {
        responses.insert(
            "200".into(),
            json!({"description": "OK", "content": json_content(&output)}),
        );
    }
    responses.insert(
        "default".into(),
        json!({
            "description": "An error. The HTTP status follows the gRPC code as grpc-gateway maps it \
                (INVALID_ARGUMENT and FAILED_PRECONDITION 400, NOT_FOUND 404, ALREADY_EXISTS and \
                ABORTED 409, UNAUTHENTICATED 401, PERMISSION_DENIED 403, RESOURCE_EXHAUSTED 429, \
                UNAVAILABLE 503, DEADLINE_EXCEEDED 504, others 500); a body over the size limit \
                is 413, an unknown path 404 and an unserved method 405.",
            "content": json_content(&json!({"$ref": format!("#/components/schemas/{STATUS}")})),
        }),
    );
    op["responses"] = Value::Object(responses);
    op
}

/// Whether a whole-message body schema names a required field (inline, or
/// in the component of `message` it refers to).
fn schema_requires_fields(schema: &Value, message: &MessageDescriptor) -> bool {
    if schema.get("$ref").is_some() {
        return message.fields().any(|f| rules::required(&f));
    }
    schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty())
}

/// Query parameters for the fields of `message` not in `skip`: scalars and
/// repeated scalars by their dotted lowerCamel path, nested messages
/// flattened (to a bounded depth), maps and repeated messages left out
/// (the query cannot carry them).
fn query_params(
    message: &MessageDescriptor,
    prefix: &str,
    skip: &[FieldDescriptor],
    depth: usize,
    comments: &Comments,
    schemas: &mut Schemas,
    out: &mut Vec<Value>,
) {
    for field in message.fields() {
        if skip.contains(&field) || field.is_map() {
            continue;
        }
        let name = format!("{prefix}{}", field.json_name());
        let kind = field.kind();
        if let Kind::Message(inner) = &kind
            && !is_scalar_like(&kind)
        {
            if !field.is_list() && depth < 3 {
                let prefix = format!("{name}.");
                query_params(inner, &prefix, &[], depth + 1, comments, schemas, out);
            }
            continue;
        }
        let one = schemas.kind(&kind);
        let schema = if field.is_list() {
            json!({"type": "array", "items": one})
        } else {
            one
        };
        let schema = rules::apply(&field, schema);
        let required = depth == 0 && rules::required(&field);
        let mut p = json!({"name": name, "in": "query", "required": required, "schema": schema});
        if field.is_list() {
            p["style"] = "form".into();
            p["explode"] = true.into();
        }
        if let Some(text) = comments.field(&field) {
            p["description"] = text.into();
        }
        out.push(p);
    }
}

fn status_schema() -> Value {
    json!({
        "type": "object",
        "description": "An error, as grpc-gateway reports it.",
        "required": ["code", "message", "details"],
        "properties": {
            "code": {"type": "integer", "format": "int32", "description": "The gRPC status code number, e.g. 3 for INVALID_ARGUMENT."},
            "message": {"type": "string", "description": "What went wrong, for a human."},
            "details": {"type": "array", "items": {"type": "object"}, "description": "Further details; empty for now."},
        },
        "additionalProperties": false,
    })
}

/// `/healthz` and `/readyz`, which are the node's own, not the contract's.
fn health_paths(paths: &mut Map<String, Value>) {
    let readiness = json!({
        "type": "object",
        "required": ["status", "checks"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "unavailable"]},
            "reason": {"type": "string", "description": "The first failing check and why; only when unavailable."},
            "checks": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Each dependency: \"ok\" or its error."},
        },
        "additionalProperties": false,
    });
    paths.insert(
        "/healthz".into(),
        json!({"get": {
            "operationId": "healthz",
            "tags": ["health"],
            "summary": "Liveness: the process serves HTTP",
            "responses": {"200": {"description": "Alive", "content": {"application/json": {"schema": {
                "type": "object",
                "required": ["status"],
                "properties": {"status": {"type": "string", "enum": ["alive"]}},
                "additionalProperties": false,
            }}}}},
        }}),
    );
    paths.insert(
        "/readyz".into(),
        json!({"get": {
            "operationId": "readyz",
            "tags": ["health"],
            "summary": "Readiness: the store and coordination answer",
            "responses": {
                "200": {"description": "Ready", "content": {"application/json": {"schema": readiness}}},
                "503": {"description": "A dependency does not answer", "content": {"application/json": {"schema": readiness}}},
            },
        }}),
    );
}

#[cfg(test)]
mod tests;
