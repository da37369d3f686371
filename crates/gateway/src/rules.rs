//! The REST routes, read at start-up from the `google.api.http` options in
//! the descriptor set. Nothing here is written per endpoint: a new annotated
//! RPC is served (and documented) without touching this crate. The one
//! exception is [`ACCEPTED`], which says which RPCs accept work instead of
//! finishing it, so they answer `202 Accepted` with a `Location`.

use http::Method;
use http::uri::PathAndQuery;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, MethodDescriptor,
    Value,
};
use taskmesh::google_api::{HttpRule, http_rule::Pattern};

use crate::Error;
use crate::template::Template;

/// An RPC whose success means "accepted for processing": it answers 202
/// with a `Location` built from the response, or 200 when the response says
/// the work already existed (an idempotent repeat).
#[derive(Debug)]
pub struct Accepted {
    /// Full name of the RPC, e.g. `taskmesh.v1.TaskApi.SubmitTask`.
    pub rpc: &'static str,
    /// The `Location` header; `{field}` is replaced by that (top-level,
    /// string) field of the response.
    pub location: &'static str,
    /// A bool field of the response; true means nothing new was made.
    pub existing_field: &'static str,
}

/// The RPCs answered with 202 Accepted.
pub const ACCEPTED: &[Accepted] = &[
    Accepted {
        rpc: "taskmesh.v1.TaskApi.SubmitTask",
        location: "/api/tasks/{task_id}",
        existing_field: "existing",
    },
    Accepted {
        rpc: "taskmesh.v1.TaskApi.SubmitWorkflow",
        location: "/api/workflows/{workflow_id}",
        existing_field: "existing",
    },
];

/// Where the request message's fields come from besides the path.
#[derive(Debug, Clone)]
pub enum BodyRule {
    /// No body; every field not in the path is a query parameter.
    None,
    /// `body: "*"`: the body is the request message (minus path fields).
    Whole,
    /// `body: "field"`: the body is this field; the rest from the query.
    Field(FieldDescriptor),
}

/// One HTTP binding of one RPC.
#[derive(Debug, Clone)]
pub struct Route {
    /// HTTP method.
    pub method: Method,
    /// Path template.
    pub template: Template,
    /// Each template variable with the field path it binds.
    pub path_fields: Vec<(String, Vec<FieldDescriptor>)>,
    /// Where the body goes.
    pub body: BodyRule,
    /// `response_body`: answer with this field of the response only.
    pub response_body: Option<FieldDescriptor>,
    /// The RPC.
    pub rpc: MethodDescriptor,
    /// The gRPC path, `/package.Service/Method`.
    pub grpc_path: PathAndQuery,
    /// Set for RPCs that answer 202 Accepted.
    pub accepted: Option<&'static Accepted>,
}

impl Route {
    /// True for server-streaming RPCs (served as Server-Sent Events).
    pub fn streaming(&self) -> bool {
        self.rpc.is_server_streaming()
    }
}

/// What a request path and method resolve to.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// The route with the decoded path variables.
    Found(&'a Route, Vec<(String, String)>),
    /// The path exists, with these methods only.
    MethodNotAllowed(Vec<Method>),
    /// No template matches the path.
    NotFound,
}

/// Every route, most specific first.
#[derive(Debug, Clone)]
pub struct Routes {
    routes: Vec<Route>,
}

impl Routes {
    /// Reads every `google.api.http` rule (additional bindings included) of
    /// every service in `pool`. A rule the gateway cannot serve faithfully
    /// is an error naming the RPC, so a bad annotation fails at start-up.
    pub fn load(pool: &DescriptorPool) -> Result<Self, Error> {
        let ext = pool.get_extension_by_name("google.api.http");
        let mut routes = Vec::new();
        for service in pool.services() {
            for rpc in service.methods() {
                let Some(ext) = &ext else { continue };
                let options = rpc.options();
                if !options.has_extension(ext) {
                    continue;
                }
                let rule = match options.get_extension(ext).as_ref() {
                    Value::Message(m) => m.transcode_to::<HttpRule>().map_err(|e| {
                        Error::Descriptor(format!("{}: bad google.api.http: {e}", rpc.full_name()))
                    })?,
                    _ => continue,
                };
                let mut bindings = vec![rule.clone()];
                bindings.extend(rule.additional_bindings.iter().cloned());
                for binding in bindings {
                    routes.push(
                        route(&rpc, &binding)
                            .map_err(|e| Error::Descriptor(format!("{}: {e}", rpc.full_name())))?,
                    );
                }
            }
        }
        // Verbs first, then more literal segments: `/api/tasks:batch` and
        // `/api/tasks/{id}/watch` are tried before looser templates.
        routes.sort_by_key(|r| {
            (
                r.template.verb.is_none(),
                std::cmp::Reverse(r.template.literal_count()),
                r.template.text.clone(),
            )
        });
        for pair in routes.windows(2) {
            if pair[0].method == pair[1].method && pair[0].template == pair[1].template {
                return Err(Error::Descriptor(format!(
                    "{} {} is bound by both {} and {}",
                    pair[0].method,
                    pair[0].template.text,
                    pair[0].rpc.full_name(),
                    pair[1].rpc.full_name()
                )));
            }
        }
        Ok(Self { routes })
    }

    /// Every route.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }

    /// The route for `method` and the (percent-encoded) `path`.
    pub fn lookup(&self, method: &Method, path: &str) -> Lookup<'_> {
        let mut allowed = Vec::new();
        for route in &self.routes {
            let Some(vars) = route.template.matches(path) else {
                continue;
            };
            if route.method == *method {
                return Lookup::Found(route, vars);
            }
            if !allowed.contains(&route.method) {
                allowed.push(route.method.clone());
            }
        }
        if allowed.is_empty() {
            Lookup::NotFound
        } else {
            Lookup::MethodNotAllowed(allowed)
        }
    }
}

/// Builds the route of one binding.
fn route(rpc: &MethodDescriptor, rule: &HttpRule) -> Result<Route, String> {
    if rpc.is_client_streaming() {
        return Err("client-streaming RPCs cannot be served over REST".into());
    }
    let (method, path) = match &rule.pattern {
        Some(Pattern::Get(p)) => (Method::GET, p),
        Some(Pattern::Put(p)) => (Method::PUT, p),
        Some(Pattern::Post(p)) => (Method::POST, p),
        Some(Pattern::Delete(p)) => (Method::DELETE, p),
        Some(Pattern::Patch(p)) => (Method::PATCH, p),
        Some(Pattern::Custom(c)) => (
            Method::from_bytes(c.kind.as_bytes()).map_err(|e| format!("custom method: {e}"))?,
            &c.path,
        ),
        None => return Err("google.api.http without a pattern".into()),
    };
    let template = Template::parse(path)?;
    let input = rpc.input();
    let mut path_fields = Vec::new();
    for var in template.variables() {
        let fields = resolve(&input, var)?;
        let leaf = fields.last().expect("resolve returns at least one field");
        if leaf.is_list() || leaf.is_map() || !is_scalar_like(&leaf.kind()) {
            return Err(format!(
                "path variable {var} must name a singular scalar field"
            ));
        }
        path_fields.push((var.to_string(), fields));
    }
    let body = match rule.body.as_str() {
        "" => BodyRule::None,
        "*" => BodyRule::Whole,
        name => {
            let field = input
                .get_field_by_name(name)
                .ok_or_else(|| format!("body field {name} is not in {}", input.full_name()))?;
            if path_fields.iter().any(|(_, p)| p[0] == field) {
                return Err(format!("body field {name} is also bound by the path"));
            }
            BodyRule::Field(field)
        }
    };
    if method == Method::GET && !matches!(body, BodyRule::None) {
        return Err("a GET binding cannot take a body".into());
    }
    let response_body = match rule.response_body.as_str() {
        "" => None,
        name => Some(rpc.output().get_field_by_name(name).ok_or_else(|| {
            format!(
                "response_body {name} is not in {}",
                rpc.output().full_name()
            )
        })?),
    };
    let accepted = ACCEPTED.iter().find(|a| a.rpc == rpc.full_name());
    if let Some(a) = accepted {
        check_accepted(a, &rpc.output())?;
    }
    let grpc_path = format!("/{}/{}", rpc.parent_service().full_name(), rpc.name())
        .parse::<PathAndQuery>()
        .map_err(|e| format!("gRPC path: {e}"))?;
    Ok(Route {
        method,
        template,
        path_fields,
        body,
        response_body,
        rpc: rpc.clone(),
        grpc_path,
        accepted,
    })
}

/// The fields of a dotted path of proto field names, from `message` down.
pub fn resolve(message: &MessageDescriptor, path: &str) -> Result<Vec<FieldDescriptor>, String> {
    let mut fields = Vec::new();
    let mut current = message.clone();
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let field = current
            .get_field_by_name(part)
            .ok_or_else(|| format!("{path}: no field {part} in {}", current.full_name()))?;
        if i + 1 < parts.len() {
            match field.kind() {
                Kind::Message(m) if !field.is_list() && !field.is_map() => current = m,
                _ => return Err(format!("{path}: {part} is not a singular message")),
            }
        }
        fields.push(field);
    }
    Ok(fields)
}

/// Scalars, enums and the well-known types whose JSON form is a string or
/// a scalar: the values a path segment or query parameter can carry.
pub fn is_scalar_like(kind: &Kind) -> bool {
    match kind {
        Kind::Message(m) => matches!(
            m.full_name(),
            "google.protobuf.Timestamp"
                | "google.protobuf.Duration"
                | "google.protobuf.FieldMask"
                | "google.protobuf.StringValue"
                | "google.protobuf.BytesValue"
                | "google.protobuf.BoolValue"
                | "google.protobuf.Int32Value"
                | "google.protobuf.UInt32Value"
                | "google.protobuf.Int64Value"
                | "google.protobuf.UInt64Value"
                | "google.protobuf.FloatValue"
                | "google.protobuf.DoubleValue"
        ),
        _ => true,
    }
}

fn check_accepted(a: &Accepted, output: &MessageDescriptor) -> Result<(), String> {
    output
        .get_field_by_name(a.existing_field)
        .filter(|f| f.kind() == Kind::Bool && !f.is_list())
        .ok_or_else(|| {
            format!(
                "{} has no bool field {}",
                output.full_name(),
                a.existing_field
            )
        })?;
    for var in Template::parse(a.location)?.variables() {
        output
            .get_field_by_name(var)
            .filter(|f| f.kind() == Kind::String && !f.is_list())
            .ok_or_else(|| format!("{} has no string field {var}", output.full_name()))?;
    }
    Ok(())
}

/// Characters escaped in a path segment: all but RFC 3986's unreserved ones.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The `Location` of an accepted response, or `None` when the response
/// says the work already existed.
pub fn accepted_location(a: &Accepted, response: &DynamicMessage) -> Option<String> {
    let existing = response
        .get_field_by_name(a.existing_field)
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if existing {
        return None;
    }
    let template = Template::parse(a.location).ok()?;
    let mut out = String::new();
    for segment in &template.segments {
        out.push('/');
        match segment {
            crate::template::Segment::Literal(l) => out.push_str(l),
            crate::template::Segment::Variable(v) => {
                let value = response.get_field_by_name(v)?;
                let text = value.as_str()?.to_string();
                out.extend(percent_encoding::utf8_percent_encode(&text, SEGMENT));
            }
        }
    }
    Some(out)
}
