//! JSON ↔ protobuf for one route, by the proto3 JSON mapping (prost-reflect).
//!
//! A request message is assembled as one JSON object (body, then query
//! parameters, then path variables, later sources overriding earlier ones
//! as grpc-gateway does) and decoded once, so every type error, unknown
//! field or bad enum name is reported by the same decoder with the field's
//! name, and nothing reaches the service unless the whole request is valid.

use bytes::Bytes;
use prost::Message;
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, SerializeOptions};
use serde::de::DeserializeSeed;
use serde_json::{Map, Value as Json};

use crate::error::ApiError;
use crate::rules::{BodyRule, Route, is_scalar_like};

/// The protobuf encoding of `route`'s request built from the decoded path
/// variables, the raw query string and the body.
pub fn request(
    route: &Route,
    vars: &[(String, String)],
    query: Option<&str>,
    body: &[u8],
) -> Result<Bytes, ApiError> {
    let mut tree = body_tree(route, body)?;
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        apply_query(route, &mut tree, query)?;
    }
    for ((_, value), (var, fields)) in vars.iter().zip(&route.path_fields) {
        let leaf = fields.last().expect("path fields are never empty");
        let json = scalar_json(leaf, value)
            .map_err(|e| ApiError::invalid(format!("path parameter {var}: {e}")))?;
        set(&mut tree, fields, json);
    }
    // Deserializing with the descriptor as seed uses prost-reflect's default
    // options, which refuse unknown fields; the tracker names the field an
    // error is about ("priority: invalid digit found in string").
    let mut track = serde_path_to_error::Track::new();
    let message = route
        .rpc
        .input()
        .deserialize(serde_path_to_error::Deserializer::new(
            Json::Object(tree),
            &mut track,
        ))
        .map_err(|e| {
            let path = track.path().to_string();
            if path == "." || path == "?" {
                ApiError::invalid(format!("invalid request: {e}"))
            } else {
                ApiError::invalid(format!("invalid request: {path}: {e}"))
            }
        })?;
    Ok(message.encode_to_vec().into())
}

/// The response message decoded from `bytes` (its `response_body` field
/// only, when the route names one), as proto3 JSON text.
pub fn response(route: &Route, bytes: &[u8]) -> Result<(String, DynamicMessage), ApiError> {
    let message = DynamicMessage::decode(route.rpc.output(), bytes).map_err(|e| {
        ApiError::from_grpc(
            crate::error::code::INTERNAL,
            format!("the service answered an undecodable message: {e}"),
        )
    })?;
    let text = match &route.response_body {
        None => to_json(&message),
        Some(field) => {
            let value = message.get_field(field);
            field_json(field, &value)
        }
    }
    .map_err(|e| ApiError::from_grpc(crate::error::code::INTERNAL, e))?;
    Ok((text, message))
}

/// A message as canonical proto3 JSON (lowerCamel names, int64 as strings,
/// enums by name, default values left out).
pub fn to_json(message: &DynamicMessage) -> Result<String, String> {
    let mut out = serde_json::Serializer::new(Vec::new());
    message
        .serialize_with_options(&mut out, &SerializeOptions::new())
        .map_err(|e| format!("cannot encode the response as JSON: {e}"))?;
    String::from_utf8(out.into_inner()).map_err(|e| e.to_string())
}

/// One field's value as JSON, by wrapping it in a message of its own type.
fn field_json(field: &FieldDescriptor, value: &prost_reflect::Value) -> Result<String, String> {
    let mut holder = DynamicMessage::new(field.parent_message().clone());
    holder.set_field(field, value.clone());
    let json: Json = serde_json::from_str(&to_json(&holder)?).map_err(|e| e.to_string())?;
    Ok(json
        .get(field.json_name())
        .cloned()
        .unwrap_or(Json::Null)
        .to_string())
}

fn body_tree(route: &Route, body: &[u8]) -> Result<Map<String, Json>, ApiError> {
    let empty = body.iter().all(u8::is_ascii_whitespace);
    match &route.body {
        BodyRule::None if empty => Ok(Map::new()),
        BodyRule::None => Err(ApiError::invalid(format!(
            "{} {} takes no request body",
            route.method, route.template.text
        ))),
        _ if empty => Ok(Map::new()),
        BodyRule::Whole => match parse(body)? {
            Json::Object(map) => Ok(map),
            _ => Err(ApiError::invalid("the request body must be a JSON object")),
        },
        BodyRule::Field(field) => {
            let mut map = Map::new();
            map.insert(field.json_name().to_string(), parse(body)?);
            Ok(map)
        }
    }
}

fn parse(body: &[u8]) -> Result<Json, ApiError> {
    let json = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("malformed JSON body: {e}")))?;
    exact_numbers(&json)?;
    Ok(json)
}

/// JSON numbers are doubles: an integer beyond 2^53 - 1 may not be the one
/// the client meant. The document sends 64-bit integers as strings and
/// allows numbers only up to that bound; larger ones are refused here.
const MAX_EXACT: f64 = 9_007_199_254_740_991.0;

fn exact_numbers(json: &Json) -> Result<(), ApiError> {
    match json {
        Json::Number(n) => {
            let big = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => i.unsigned_abs() > MAX_EXACT as u64,
                (_, Some(u), _) => u > MAX_EXACT as u64,
                (_, _, Some(f)) => f.fract() == 0.0 && f.abs() > MAX_EXACT,
                _ => false,
            };
            if big {
                return Err(ApiError::invalid(format!(
                    "the number {n} is beyond 2^53 - 1, where JSON numbers stop being exact integers; send 64-bit integers as strings"
                )));
            }
            Ok(())
        }
        Json::Array(items) => items.iter().try_for_each(exact_numbers),
        Json::Object(map) => map.values().try_for_each(exact_numbers),
        _ => Ok(()),
    }
}

fn apply_query(route: &Route, tree: &mut Map<String, Json>, query: &str) -> Result<(), ApiError> {
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |why: String| ApiError::invalid(format!("query parameter {key}: {why}"));
        if matches!(route.body, BodyRule::Whole) {
            return Err(bad("this endpoint takes its fields from the body".into()));
        }
        let fields = query_field(route, &key).map_err(bad)?;
        let leaf = fields.last().expect("query fields are never empty");
        let json = scalar_json(leaf, &value).map_err(bad)?;
        let canonical: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        let canonical = canonical.join(".");
        if leaf.is_list() {
            push(tree, &fields, json);
        } else if seen.contains(&canonical) {
            return Err(bad("given more than once".into()));
        } else {
            set(tree, &fields, json);
        }
        seen.push(canonical);
    }
    Ok(())
}

/// The field path a query parameter names: dotted, each part a JSON or
/// proto field name; not bound by the path or the body.
fn query_field(route: &Route, key: &str) -> Result<Vec<FieldDescriptor>, String> {
    let mut message = route.rpc.input();
    let mut fields = Vec::new();
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let field = message
            .get_field_by_json_name(part)
            .or_else(|| message.get_field_by_name(part))
            .ok_or_else(|| format!("unknown field {part:?} of {}", message.full_name()))?;
        if i == 0 {
            if route.path_fields.iter().any(|(_, p)| p[0] == field) {
                return Err("set by the path, not the query".into());
            }
            if matches!(&route.body, BodyRule::Field(b) if *b == field) {
                return Err("set by the body, not the query".into());
            }
        }
        let last = i + 1 == parts.len();
        match field.kind() {
            Kind::Message(m)
                if !last
                    && !field.is_list()
                    && !field.is_map()
                    && !is_scalar_like(&field.kind()) =>
            {
                message = m;
            }
            _ if !last => return Err(format!("{part} has no sub-fields")),
            _ if field.is_map() => return Err("map fields cannot be set from the query".into()),
            kind if !is_scalar_like(&kind) => {
                return Err(format!(
                    "{part} is a message: set its fields as {key}.<field>"
                ));
            }
            _ => {}
        }
        fields.push(field);
    }
    Ok(fields)
}

/// The JSON value for the text of a path segment or query parameter.
fn scalar_json(field: &FieldDescriptor, text: &str) -> Result<Json, String> {
    let boolean = |text: &str| match text.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" => Ok(Json::Bool(true)),
        "false" | "f" | "0" => Ok(Json::Bool(false)),
        _ => Err(format!("{text:?} is not a boolean")),
    };
    match field.kind() {
        Kind::Bool => boolean(text),
        Kind::Message(m) if m.full_name() == "google.protobuf.BoolValue" => boolean(text),
        // An enum by number is a JSON number; by name, a string.
        Kind::Enum(_) => Ok(text
            .parse::<i32>()
            .map(Json::from)
            .unwrap_or_else(|_| Json::String(text.to_string()))),
        // Numbers as strings are valid proto3 JSON for every numeric type,
        // and keep 64-bit values exact.
        _ => Ok(Json::String(text.to_string())),
    }
}

/// Sets `value` at `fields` (JSON names), creating objects on the way and
/// dropping any value the body gave the same field under either name.
fn set(tree: &mut Map<String, Json>, fields: &[FieldDescriptor], value: Json) {
    let slot = parent(tree, fields);
    let leaf = fields.last().expect("fields are never empty");
    slot.remove(leaf.name());
    slot.insert(leaf.json_name().to_string(), value);
}

/// Appends `value` to the list at `fields`.
fn push(tree: &mut Map<String, Json>, fields: &[FieldDescriptor], value: Json) {
    let slot = parent(tree, fields);
    let leaf = fields.last().expect("fields are never empty");
    match slot.get_mut(leaf.json_name()) {
        Some(Json::Array(items)) => items.push(value),
        _ => {
            slot.remove(leaf.name());
            slot.insert(leaf.json_name().to_string(), Json::Array(vec![value]));
        }
    }
}

/// The object holding the last of `fields`.
fn parent<'a>(
    tree: &'a mut Map<String, Json>,
    fields: &[FieldDescriptor],
) -> &'a mut Map<String, Json> {
    let mut slot = tree;
    for field in &fields[..fields.len() - 1] {
        // The proto name spelling would be decoded after (and so override)
        // the JSON one; fold it in so the merge is predictable.
        let moved = slot.remove(field.name());
        let entry = slot
            .entry(field.json_name().to_string())
            .or_insert_with(|| moved.unwrap_or_else(|| Json::Object(Map::new())));
        if !entry.is_object() {
            *entry = Json::Object(Map::new());
        }
        slot = entry.as_object_mut().expect("made an object above");
    }
    slot
}

#[cfg(test)]
mod tests;
