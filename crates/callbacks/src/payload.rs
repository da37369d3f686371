//! What a callback carries: the proto3 JSON of `taskmesh.v1.TaskCallback`
//! built from the ended task, and its signatures in the Standard Webhooks
//! scheme (<https://www.standardwebhooks.com>): `webhook-id` (the delivery
//! id, equal on every retry), `webhook-timestamp` (Unix seconds of this
//! try) and `webhook-signature`, one `v1,<base64 HMAC-SHA256>` per key over
//! `id.timestamp.body`, space-separated, so a receiver that knows either
//! the old or the new key verifies during a rotation. A terminal task never
//! changes, so every retry of a delivery sends the same body; the
//! timestamp, and so the signature, is the try's own, and receivers refuse
//! old ones (a captured request cannot be replayed later).

use hmac::{Hmac, Mac};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use sha2::Sha256;
use taskmesh::v1 as pb;
use taskmesh_core::{CallbackJob, UnixMillis};

use crate::Error;

/// The header naming the delivery (equal on every retry).
pub const DELIVERY_HEADER: &str = "webhook-id";
/// The header carrying the try's Unix time in seconds.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header carrying the signatures.
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// The prefix of a Standard Webhooks secret (base64 after it).
pub const SECRET_PREFIX: &str = "whsec_";

/// Encodes callback bodies; built once from the contract's descriptors.
#[derive(Debug, Clone)]
pub struct Encoder {
    descriptor: MessageDescriptor,
}

impl Encoder {
    /// Reads `taskmesh.v1.TaskCallback` from the compiled contract.
    pub fn new() -> Result<Self, Error> {
        let pool = DescriptorPool::decode(taskmesh::FILE_DESCRIPTOR_SET)
            .map_err(|e| Error::Contract(e.to_string()))?;
        let descriptor = pool
            .get_message_by_name("taskmesh.v1.TaskCallback")
            .ok_or_else(|| Error::Contract("taskmesh.v1.TaskCallback is missing".into()))?;
        Ok(Self { descriptor })
    }

    /// The JSON body for `job`.
    pub fn body(&self, job: &CallbackJob) -> Result<Vec<u8>, Error> {
        let message = message(job);
        let dynamic =
            DynamicMessage::decode(self.descriptor.clone(), message.encode_to_vec().as_slice())
                .map_err(|e| Error::Contract(e.to_string()))?;
        let mut out = serde_json::Serializer::new(Vec::new());
        dynamic
            .serialize_with_options(&mut out, &SerializeOptions::new())
            .map_err(|e| Error::Contract(e.to_string()))?;
        Ok(out.into_inner())
    }
}

/// The `TaskCallback` message for `job`.
pub fn message(job: &CallbackJob) -> pb::TaskCallback {
    let task = &job.task;
    let state = pb::TaskState::from_str_name(&format!("TASK_STATE_{}", task.state.as_str()))
        .unwrap_or(pb::TaskState::Unspecified);
    pb::TaskCallback {
        delivery_id: job.delivery.delivery_id.clone(),
        task_id: task.id.clone(),
        execution_id: task
            .attempts
            .iter()
            .max_by_key(|a| a.number)
            .map(|a| a.execution_id.clone())
            .unwrap_or_default(),
        handler: task.handler.clone(),
        state: state as i32,
        output: task.output.as_ref().map(|data| pb::Payload {
            data: data.clone(),
            content_type: task.output_content_type.clone(),
        }),
        error_message: task.error_message.clone(),
        attempts: task.attempt,
        end_time: task.times.end.map(timestamp),
        client_request_id: task.client_request_id.clone().unwrap_or_default(),
    }
}

/// The signing key of a configured secret: `whsec_` and base64 (the
/// Standard Webhooks form, what its libraries take) is decoded; any other
/// text is used as its bytes.
pub fn signing_key(secret: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let secret = secret.trim();
    if secret.is_empty() {
        return Err("a callback secret must not be empty".into());
    }
    match secret.strip_prefix(SECRET_PREFIX) {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .filter(|key| !key.is_empty())
            .ok_or_else(|| "a callback secret starting whsec_ must be base64 after it".into()),
        None => Ok(secret.as_bytes().to_vec()),
    }
}

/// `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body` under `key`.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    use base64::Engine as _;
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// The `webhook-signature` value: one signature per key, space-separated.
pub fn signatures(keys: &[Vec<u8>], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|key| signature(key, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

fn timestamp(ms: UnixMillis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1_000),
        nanos: (ms.rem_euclid(1_000) * 1_000_000) as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks reference libraries.
        let key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn every_key_signs_and_bad_secrets_are_refused() {
        let keys = vec![b"old".to_vec(), b"new".to_vec()];
        let both = signatures(&keys, "id", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signature(b"old", "id", 1, b"{}"));
        assert_eq!(parts[1], signature(b"new", "id", 1, b"{}"));
        assert_eq!(signing_key("plain").unwrap(), b"plain");
        assert!(signing_key("").is_err());
        assert!(signing_key("whsec_!!!").is_err());
        assert!(signing_key("whsec_").is_err());
    }
}
