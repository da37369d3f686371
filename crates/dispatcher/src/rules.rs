//! The contract's own rules: every unary request (and the one request of a
//! server stream) is checked against the `buf.validate` annotations in
//! `proto/` before a handler sees it, so gRPC and REST (which reaches the
//! node over gRPC) refuse the same requests with the same words, and the
//! rules live once, where the OpenAPI document and the Python and Node
//! clients read them too. What needs the store, the clock or the server's
//! configuration (idempotency, states, quotas, the egress policy, whether a
//! cron expression ever fires) stays in the handlers.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use prost_protovalidate::{Error as RuleError, Filter, ValidationOption, Validator};
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, MessageDescriptor, OneofDescriptor,
};
use tower::{Layer, Service};

use crate::layers::WholeBytes;

/// The input message of every method of the contract, and the validator
/// with its compiled rules.
pub struct RequestRules {
    validator: Validator,
    inputs: HashMap<String, MessageDescriptor>,
    /// The message of each message-level CEL rule by id (the validator
    /// reports those rules by id alone).
    cel_messages: HashMap<String, String>,
    /// The validator's options for every check: the filter that skips the
    /// submit's own rules where they are seen to hold ([`SubmitRulesHold`]).
    options: [ValidationOption; 1],
}

impl std::fmt::Debug for RequestRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestRules")
            .field("methods", &self.inputs.len())
            .finish()
    }
}

impl RequestRules {
    /// The rules of the contract compiled into this binary.
    pub fn load() -> Result<Self, String> {
        let pool = DescriptorPool::decode(taskmesh::FILE_DESCRIPTOR_SET)
            .map_err(|e| format!("the contract's descriptors do not decode: {e}"))?;
        Ok(Self::from_pool(&pool))
    }

    /// The rules of every service in `pool`.
    pub fn from_pool(pool: &DescriptorPool) -> Self {
        use prost_protovalidate::types::MessageConstraintsExt;
        let mut cel_messages = HashMap::new();
        for message in pool.all_messages() {
            if let Ok(Some(rules)) = message.message_constraints() {
                for rule in rules.cel {
                    if let (Some(id), Some(text)) = (rule.id, rule.message) {
                        cel_messages.insert(id, text);
                    }
                }
            }
        }
        let mut inputs = HashMap::new();
        for service in pool.services() {
            for method in service.methods() {
                if method.is_client_streaming() {
                    continue;
                }
                let path = format!("/{}/{}", service.full_name(), method.name());
                inputs.insert(path, method.input());
            }
        }
        Self {
            validator: Validator::new(),
            inputs,
            cel_messages,
            options: [ValidationOption::Filter(Arc::new(SubmitRulesHold::new(
                pool,
            )))],
        }
    }

    /// The input message of the method at `path`, if it is the contract's.
    pub fn input(&self, path: &str) -> Option<&MessageDescriptor> {
        self.inputs.get(path)
    }

    /// Checks `message` against its rules: `Err` holds one line per broken
    /// rule, each naming the field and the rule (`task_id: value must be a
    /// valid UUID`).
    pub fn check_message(&self, message: &DynamicMessage) -> Result<(), tonic::Status> {
        match self.validator.validate_with(message, &self.options) {
            Ok(()) => Ok(()),
            Err(RuleError::Validation(err)) => Err(tonic::Status::invalid_argument(
                err.violations()
                    .iter()
                    .map(|v| {
                        let text = match v.message() {
                            "" => match self.cel_messages.get(v.rule_id()) {
                                Some(text) => text.clone(),
                                None => standard_message(v.rule_id()),
                            },
                            text => text.to_string(),
                        };
                        let path = v.field_path();
                        if path.is_empty() {
                            text
                        } else {
                            format!("{path}: {text}")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
            // A rule that does not compile is the contract's fault, never the
            // caller's: a unit test compiles every rule, so this is a bug.
            Err(err) => {
                tracing::error!(message = %prost_reflect::ReflectMessage::descriptor(message).full_name(), error = %err, "a contract rule failed to evaluate");
                Err(tonic::Status::internal(
                    "the server could not evaluate its own request rules",
                ))
            }
        }
    }

    /// Checks the gRPC-framed body of a request to `path`. Bodies this
    /// cannot read (compressed, malformed, not one message) pass unchecked:
    /// the method's own codec refuses them with its error.
    pub fn check(&self, path: &str, body: &[u8]) -> Result<(), tonic::Status> {
        let Some(input) = self.inputs.get(path) else {
            return Ok(());
        };
        let Some(message) = single_frame(body) else {
            return Ok(());
        };
        let Ok(message) = DynamicMessage::decode(input.clone(), message) else {
            return Ok(());
        };
        self.check_message(&message)
    }
}

/// The message-level rules of `SubmitTaskRequest` (its CEL rule and its
/// oneof of `run_at` and `delay`), seen to hold without the CEL
/// interpreter. The interpreter first turns the whole message into a map of
/// CEL values, which cost ~17 µs of the ~19 µs a submitted task's rules
/// took (`cargo bench -p taskmesh-dispatcher --bench rules`). As the
/// validator's [`Filter`], this only ever lets it skip those rules for a
/// task where they hold; where they may not, the validator evaluates them
/// and writes the violation, so the words stay the contract's. Its field
/// rules (patterns, lengths) run either way.
///
/// It knows the rules by their text: when `proto/` gives the message other
/// message-level rules than [`SubmitRulesHold::KNOWN_CEL`] and
/// [`SubmitRulesHold::KNOWN_ONEOF`], it stands aside (every rule then runs
/// through the interpreter) and a unit test fails until it learns them.
#[derive(Debug)]
struct SubmitRulesHold {
    fields: Option<SubmitFields>,
}

/// The fields [`SubmitRulesHold`] reads.
#[derive(Debug)]
struct SubmitFields {
    message: MessageDescriptor,
    run_at: FieldDescriptor,
    delay: FieldDescriptor,
    concurrency_key: FieldDescriptor,
    concurrency_limit: FieldDescriptor,
}

impl SubmitRulesHold {
    const MESSAGE: &str = "taskmesh.v1.SubmitTaskRequest";
    /// The one CEL rule it checks natively: (id, expression).
    const KNOWN_CEL: (&str, &str) = (
        "submit.concurrency",
        "(this.concurrency_key == '') == (this.concurrency_limit == 0u)",
    );
    /// The one oneof rule (not required) it checks natively.
    const KNOWN_ONEOF: [&str; 2] = ["run_at", "delay"];

    fn new(pool: &DescriptorPool) -> Self {
        use prost_protovalidate::types::MessageConstraintsExt;
        let fields = pool.get_message_by_name(Self::MESSAGE).and_then(|message| {
            let rules = message.message_constraints().ok()??;
            let [cel] = rules.cel.as_slice() else {
                return None;
            };
            let [oneof] = rules.oneof.as_slice() else {
                return None;
            };
            let known = rules.cel_expression.is_empty()
                && cel.id.as_deref() == Some(Self::KNOWN_CEL.0)
                && cel.expression.as_deref() == Some(Self::KNOWN_CEL.1)
                && oneof.fields == Self::KNOWN_ONEOF
                && !oneof.required.unwrap_or(false);
            if !known {
                return None;
            }
            Some(SubmitFields {
                run_at: message.get_field_by_name("run_at")?,
                delay: message.get_field_by_name("delay")?,
                concurrency_key: message.get_field_by_name("concurrency_key")?,
                concurrency_limit: message.get_field_by_name("concurrency_limit")?,
                message,
            })
        });
        Self { fields }
    }

    /// Whether the submit's message-level rules are seen to hold for
    /// `message` (false when it is not a submit, or they may not).
    fn hold(&self, message: &DynamicMessage, descriptor: &MessageDescriptor) -> bool {
        let Some(f) = &self.fields else {
            return false;
        };
        if *descriptor != f.message {
            return false;
        }
        let at_most_one_time = !(message.has_field(&f.run_at) && message.has_field(&f.delay));
        let no_key = message
            .get_field(&f.concurrency_key)
            .as_str()
            .is_some_and(str::is_empty);
        let no_limit = message.get_field(&f.concurrency_limit).as_u32() == Some(0);
        at_most_one_time && no_key == no_limit
    }
}

impl Filter for SubmitRulesHold {
    fn should_validate(&self, message: &DynamicMessage, descriptor: &MessageDescriptor) -> bool {
        !self.hold(message, descriptor)
    }

    fn should_validate_field(&self, _message: &DynamicMessage, _field: &FieldDescriptor) -> bool {
        true
    }

    fn should_validate_oneof(&self, _message: &DynamicMessage, _oneof: &OneofDescriptor) -> bool {
        true
    }
}

/// The words protovalidate's other runtimes use for the rules whose
/// violations this one leaves without a message (its well-known formats).
fn standard_message(rule_id: &str) -> String {
    match rule_id {
        "string.uuid" => "value must be a valid UUID".into(),
        "string.uuid_empty" => "value is empty, which is not a valid UUID".into(),
        "required" => "value is required".into(),
        id => format!("value breaks the rule {id}"),
    }
}

/// The message of a body that is exactly one uncompressed gRPC frame.
fn single_frame(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    if flag != 0 || rest.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes(rest[..4].try_into().ok()?) as usize;
    let message = &rest[4..];
    (message.len() == len).then_some(message)
}

/// Checks each whole request body against [`RequestRules`]; a broken rule
/// is INVALID_ARGUMENT before the handler runs. Inside the authentication
/// layer (an unidentified caller learns nothing of the rules) and after
/// [`crate::layers::WholeBodyLayer`], whose bytes it reads ([`WholeBytes`]).
#[derive(Debug, Clone)]
pub struct RulesLayer {
    rules: Arc<RequestRules>,
}

impl RulesLayer {
    /// Enforces `rules`.
    pub fn new(rules: Arc<RequestRules>) -> Self {
        Self { rules }
    }
}

impl<S> Layer<S> for RulesLayer {
    type Service = Rules<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Rules {
            inner,
            rules: self.rules.clone(),
        }
    }
}

/// The service made by [`RulesLayer`].
#[derive(Debug, Clone)]
pub struct Rules<S> {
    inner: S,
    rules: Arc<RequestRules>,
}

impl<S, ResBody> Service<http::Request<tonic::body::Body>> for Rules<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path();
        if self.rules.input(path).is_some() {
            // Every method with rules has its body read whole further out.
            let checked = match req.extensions().get::<WholeBytes>() {
                Some(WholeBytes(bytes)) => self.rules.check(path, bytes),
                None => Err(tonic::Status::internal(
                    "the request's body was not read whole before its rules",
                )),
            };
            if let Err(status) = checked {
                return Either::Left(ready(Ok(status.into_http())));
            }
        }
        Either::Right(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> RequestRules {
        RequestRules::load().expect("the contract loads")
    }

    fn check(rules: &RequestRules, path: &str, json: &str) -> Result<(), String> {
        let input = rules.input(path).expect("a method of the contract").clone();
        let mut de = serde_json::Deserializer::from_str(json);
        let message = DynamicMessage::deserialize(input, &mut de).expect("valid JSON");
        rules
            .check_message(&message)
            .map_err(|s| s.message().to_string())
    }

    #[test]
    fn every_rule_of_every_request_compiles() {
        let rules = rules();
        assert!(rules.inputs.len() > 20, "{}", rules.inputs.len());
        for (path, input) in &rules.inputs {
            // An empty message runs every rule's compilation; a rule that
            // does not compile is an error other than a validation error.
            match rules
                .validator
                .validate(&DynamicMessage::new(input.clone()))
            {
                Ok(()) | Err(RuleError::Validation(_)) => {}
                Err(err) => panic!("{path}: {err}"),
            }
        }
    }

    #[test]
    fn violations_name_the_field_and_the_rule() {
        let rules = rules();
        let get = "/taskmesh.v1.TaskApi/GetTask";
        assert_eq!(
            check(&rules, get, r#"{"taskId":"0"}"#),
            Err("task_id: value must be a valid UUID".into())
        );
        assert_eq!(
            check(
                &rules,
                get,
                r#"{"taskId":"0190b3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b"}"#
            ),
            Ok(())
        );
        let submit = "/taskmesh.v1.TaskApi/SubmitTasks";
        let err = check(
            &rules,
            submit,
            r#"{"tasks":[{"handler":"echo"},{"handler":"a b","namespace":"-x"}]}"#,
        )
        .unwrap_err();
        assert!(err.contains("tasks[1].handler: "), "{err}");
        assert!(err.contains("tasks[1].namespace: "), "{err}");
        assert!(!err.contains("tasks[0]"), "{err}");
        let schedule = "/taskmesh.v1.TaskApi/CreateSchedule";
        let err = check(
            &rules,
            schedule,
            r#"{"schedule":{"kind":"SCHEDULE_KIND_CRON","template":{"handler":"echo"}}}"#,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "schedule: cron_expression is required for a CRON schedule"
        );
    }

    #[test]
    fn the_submit_pre_check_knows_the_submits_rules() {
        let pool = DescriptorPool::decode(taskmesh::FILE_DESCRIPTOR_SET).expect("decodes");
        assert!(
            SubmitRulesHold::new(&pool).fields.is_some(),
            "SubmitTaskRequest's message-level rules in proto/ are not the ones \
             SubmitRulesHold checks: teach it the new ones (KNOWN_CEL, KNOWN_ONEOF, hold)"
        );
    }

    /// Every combination of the fields the submit's own rules read: the
    /// validator with the pre-check as its filter finds exactly what it
    /// finds without it.
    #[test]
    fn the_submit_pre_check_agrees_with_the_interpreter() {
        let rules = rules();
        let input = rules
            .input("/taskmesh.v1.TaskApi/SubmitTask")
            .expect("SubmitTask")
            .clone();
        let verdict = |result: Result<(), RuleError>| match result {
            Ok(()) => Ok(()),
            Err(RuleError::Validation(err)) => Err(err
                .violations()
                .iter()
                .map(|v| format!("{} {} {}", v.field_path(), v.rule_id(), v.message()))
                .collect::<Vec<_>>()),
            Err(err) => panic!("{err}"),
        };
        let mut refused = 0;
        for key in ["", "customer:42"] {
            for limit in [0, 1, 10_000, 10_001] {
                for run_at in [false, true] {
                    for delay in [false, true] {
                        for handler in ["echo", "a b"] {
                            let mut json = serde_json::json!({
                                "handler": handler,
                                "concurrencyKey": key,
                                "concurrencyLimit": limit,
                            });
                            if run_at {
                                json["runAt"] = "2026-12-07T00:00:00Z".into();
                            }
                            if delay {
                                json["delay"] = "5s".into();
                            }
                            let message = DynamicMessage::deserialize(input.clone(), json)
                                .expect("valid JSON");
                            let with =
                                verdict(rules.validator.validate_with(&message, &rules.options));
                            let without = verdict(rules.validator.validate(&message));
                            assert_eq!(with, without, "{key:?} {limit} {run_at} {delay} {handler}");
                            refused += usize::from(without.is_err());
                        }
                    }
                }
            }
        }
        // Both kinds of outcome were seen: of the 64 combinations, those
        // with the good handler, one time at most (3 of 4) and neither key
        // nor limit or a key with a limit in range (3 of 8) pass: 9.
        assert_eq!(refused, 64 - 9);
    }

    #[test]
    fn bodies_it_cannot_read_pass_to_the_codec() {
        let rules = rules();
        let get = "/taskmesh.v1.TaskApi/GetTask";
        assert!(rules.check(get, b"").is_ok());
        assert!(rules.check(get, &[1, 0, 0, 0, 0]).is_ok(), "compressed");
        assert!(rules.check(get, &[0, 0, 0, 0, 9, 1]).is_ok(), "short");
        // An empty GetTaskRequest breaks the task_id rule.
        assert!(rules.check(get, &[0, 0, 0, 0, 0]).is_err());
        assert!(
            rules
                .check("/grpc.health.v1.Health/Check", &[0, 0, 0, 0, 0])
                .is_ok()
        );
    }
}
