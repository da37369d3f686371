//! The one handler behind every transcoded route: find the route, read the
//! body within its limit, build the request message, call the RPC over the
//! generic client and answer with proto3 JSON, or with Server-Sent Events
//! for a server-streaming RPC. Every failure is an [`ApiError`] in the one
//! JSON shape; nothing is sent to the service unless the whole request
//! decoded.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

use crate::Shared;
use crate::error::{ApiError, code};
use crate::rules::{BodyRule, Lookup, Route, accepted_location};
use crate::transcode;

/// Request headers passed on to the service as gRPC metadata: the caller's
/// credentials and its W3C trace context.
pub const FORWARDED_HEADERS: [&str; 3] = ["authorization", "traceparent", "tracestate"];

/// Axum fallback: every path that is not one of the gateway's own.
pub async fn transcode(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    match handle(&shared, request).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

/// Answer for a known path with a method it does not serve.
pub async fn method_not_allowed(request: Request) -> Response {
    method_error(request.method(), request.uri().path(), Vec::new()).into_response()
}

fn method_error(method: &Method, path: &str, allowed: Vec<Method>) -> ApiError {
    let mut err = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        code::UNIMPLEMENTED,
        format!("{method} is not served on {path}"),
    );
    if !allowed.is_empty() {
        let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
        err.allow = Some(names.join(", "));
    }
    err
}

async fn handle(shared: &Shared, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let (route, vars) = match shared.routes.lookup(&parts.method, path) {
        Lookup::Found(route, vars) => (route, vars),
        Lookup::MethodNotAllowed(allowed) => {
            return Err(method_error(&parts.method, path, allowed));
        }
        Lookup::NotFound => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                code::NOT_FOUND,
                format!("no such resource: {path}"),
            ));
        }
    };
    let body = read_body(
        body,
        &parts.headers,
        shared.options.max_body_bytes,
        shared.options.body_read_timeout,
    )
    .await?;
    if !matches!(route.body, BodyRule::None) && !body.is_empty() {
        check_content_type(&parts.headers)?;
    }
    let message = transcode::request(route, &vars, parts.uri.query(), &body)?;
    let metadata = forward(&parts.headers)?;
    if route.streaming() {
        return watch(shared, route, metadata, message).await;
    }
    let reply = shared
        .backend
        .unary(route.grpc_path.clone(), metadata, message)
        .await?;
    let (json, response) = transcode::response(route, &reply)?;
    let location = route
        .accepted
        .and_then(|accepted| accepted_location(accepted, &response));
    let mut answer = (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        json,
    )
        .into_response();
    if let Some(location) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        *answer.status_mut() = StatusCode::ACCEPTED;
        answer.headers_mut().insert(header::LOCATION, location);
    }
    Ok(answer)
}

/// Reads the whole body, refusing (413) more than `limit` bytes: at once
/// when `Content-Length` says so, otherwise as soon as the limit is passed;
/// and (408) a body that has not all arrived within `timeout`, so a client
/// trickling bytes cannot hold a request open.
async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::RESOURCE_EXHAUSTED,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let read = tokio::time::timeout(timeout, Limited::new(body, limit).collect());
    let Ok(read) = read.await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            code::DEADLINE_EXCEEDED,
            format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
        ));
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(err) => Err(ApiError::invalid(format!(
            "cannot read the request body: {err}"
        ))),
    }
}

/// A body must be JSON; a missing `Content-Type` is taken to mean JSON.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
    {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        code::INVALID_ARGUMENT,
        format!("the request body must be application/json, not {essence:?}"),
    ))
}

/// The gRPC metadata carried over from the HTTP request.
fn forward(headers: &HeaderMap) -> Result<MetadataMap, ApiError> {
    let mut metadata = MetadataMap::new();
    for name in FORWARDED_HEADERS {
        if let Some(value) = headers.get(name) {
            let value = AsciiMetadataValue::try_from(value.as_bytes())
                .map_err(|_| ApiError::invalid(format!("header {name} is not valid")))?;
            metadata.insert(name, value);
        }
    }
    Ok(metadata)
}

/// A server-streaming RPC as Server-Sent Events: one `data:` event per
/// message (its proto3 JSON); a failure after the stream started is an
/// `event: error` with the error JSON, and ends the stream, as does the
/// gateway shutting down. A failure before the first message is an ordinary
/// JSON error response with its status.
async fn watch(
    shared: &Shared,
    route: &Route,
    metadata: MetadataMap,
    message: Bytes,
) -> Result<Response, ApiError> {
    let stream = shared
        .backend
        .server_streaming(route.grpc_path.clone(), metadata, message)
        .await?;
    let route = route.clone();
    let events = futures::stream::unfold(Some(stream), move |state| {
        let route = route.clone();
        async move {
            let mut stream = state?;
            let error = |err: ApiError| Event::default().event("error").data(err.body_json());
            match stream.message().await {
                Ok(Some(bytes)) => match transcode::response(&route, &bytes) {
                    Ok((json, _)) => Some((Event::default().data(json), Some(stream))),
                    Err(err) => Some((error(err), None)),
                },
                Ok(None) => None,
                Err(status) => Some((error(ApiError::from(status)), None)),
            }
        }
    })
    .map(Ok::<_, Infallible>)
    .take_until(shared.shutdown.clone().cancelled_owned());
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(shared.options.sse_keep_alive))
        .into_response())
}
