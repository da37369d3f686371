//! What a callback carries: the proto3 JSON of `taskmesh.v1.TaskCallback`
//! built from the ended task, and its HMAC-SHA256 signature. A terminal
//! task never changes, so every retry of a delivery sends the same bytes.

use hmac::{Hmac, Mac};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use sha2::Sha256;
use taskmesh::v1 as pb;
use taskmesh_core::{CallbackJob, UnixMillis};

use crate::Error;

/// The header naming the delivery (equal on every retry).
pub const DELIVERY_HEADER: &str = "taskmesh-delivery-id";
/// The header carrying `sha256=<hex HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "taskmesh-signature";

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

/// `sha256=` and the lowercase hex HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
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
    fn signature_matches_rfc_4231_case_2() {
        // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
