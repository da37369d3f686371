//! A scripted callback receiver: a real axum server on loopback that
//! answers each delivery with the next scripted status (then 200), records
//! every request, and checks each as a receiver would (when it knows the
//! secret: a Standard Webhooks signature over id, timestamp and body, and
//! a timestamp no more than five minutes from its own clock; always: the
//! delivery id in the body against the header). It verifies with its own
//! code, not the deliverer's. What does not match is recorded, not asserted inside the
//! handler (a panic there would only drop a connection): the test asserts
//! [`CallbackReceiver::mismatches`] is empty.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::background::BackgroundServer;

/// The path deliveries are posted to.
pub const PATH: &str = "/hook";

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub status: u16,
}

impl Received {
    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Whether it was accepted (answered 2xx).
    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

#[derive(Clone, Default)]
struct Script {
    secret: Option<String>,
    statuses: Arc<Mutex<VecDeque<u16>>>,
    received: Arc<Mutex<Vec<Received>>>,
    mismatches: Arc<Mutex<Vec<String>>>,
}

/// The running receiver.
pub struct CallbackReceiver {
    pub addr: SocketAddr,
    script: Script,
    server: BackgroundServer,
}

impl CallbackReceiver {
    /// Starts a receiver on a free loopback port. With a `secret`, a
    /// request whose signature does not verify is recorded as a mismatch
    /// and answered 401.
    pub async fn start(secret: Option<&str>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, secret)
    }

    /// Starts a receiver on `listener`.
    pub fn start_on(listener: tokio::net::TcpListener, secret: Option<&str>) -> Self {
        let addr = listener.local_addr().unwrap();
        let script = Script {
            secret: secret.map(str::to_string),
            ..Script::default()
        };
        let app = Router::new()
            .route(PATH, post(receive))
            .with_state(script.clone());
        Self {
            addr,
            script,
            server: BackgroundServer::axum("the callback receiver", listener, app),
        }
    }

    /// `http://{addr}/hook`.
    pub fn url(&self) -> String {
        format!("http://{}{PATH}", self.addr)
    }

    /// The next answers (HTTP statuses), in order; after them, 200.
    pub fn script(&self, statuses: &[u16]) {
        self.script
            .statuses
            .lock()
            .unwrap()
            .extend(statuses.iter().copied());
    }

    /// Every request so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.script.received.lock().unwrap().clone()
    }

    /// How many requests arrived.
    pub fn tries(&self) -> usize {
        self.script.received.lock().unwrap().len()
    }

    /// The accepted deliveries of task `id`: (delivery id, body).
    pub fn accepted(&self, id: &str) -> Vec<(String, Value)> {
        self.received()
            .into_iter()
            .filter(Received::accepted)
            .map(|r| {
                let delivery = r
                    .headers
                    .get(taskmesh_callbacks::DELIVERY_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                (delivery, r.json())
            })
            .filter(|(_, body)| body["taskId"] == id)
            .collect()
    }

    /// What did not check out (bad signatures, a delivery id in the body
    /// that is not the header's).
    pub fn mismatches(&self) -> Vec<String> {
        self.script.mismatches.lock().unwrap().clone()
    }

    /// Stops the server (checked, see [`BackgroundServer::stop`]) and fails
    /// the test if anything did not match.
    pub async fn stop(self) {
        self.server.stop().await;
        let mismatches = self.script.mismatches.lock().unwrap().clone();
        assert!(
            mismatches.is_empty(),
            "the receiver saw mismatches: {mismatches:#?}"
        );
    }
}

async fn receive(State(s): State<Script>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let status = answer(&s, &headers, &body);
    s.received.lock().unwrap().push(Received {
        headers,
        body,
        status: status.as_u16(),
    });
    status
}

fn answer(s: &Script, headers: &HeaderMap, body: &Bytes) -> StatusCode {
    let mismatch = |what: String| {
        s.mismatches.lock().unwrap().push(what);
    };
    if let Some(Err(why)) = s.secret.as_ref().map(|key| verify(key, headers, body)) {
        mismatch(why);
        return StatusCode::UNAUTHORIZED;
    }
    let delivery = headers
        .get(taskmesh_callbacks::DELIVERY_HEADER)
        .and_then(|v| v.to_str().ok());
    match serde_json::from_slice::<Value>(body) {
        Ok(json) if json["deliveryId"].as_str() == delivery => {}
        Ok(json) => mismatch(format!(
            "body deliveryId {} but header {delivery:?}",
            json["deliveryId"]
        )),
        Err(e) => mismatch(format!("the body is not JSON: {e}")),
    }
    let next = s.statuses.lock().unwrap().pop_front().unwrap_or(200);
    StatusCode::from_u16(next).unwrap()
}

/// Longest a receiver accepts between a delivery's timestamp and its own
/// clock (the Standard Webhooks reference libraries' tolerance).
pub const TIMESTAMP_TOLERANCE_S: i64 = 300;

/// Verifies a delivery as a Standard Webhooks receiver would: some
/// `v1,` signature in `webhook-signature` is the base64 HMAC-SHA256 of
/// `id.timestamp.body` under the secret (`whsec_` + base64, or its bytes),
/// and the timestamp is within [`TIMESTAMP_TOLERANCE_S`] of now.
pub fn verify(secret: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| format!("no {name} header"))
    };
    let id = header("webhook-id")?;
    let timestamp = header("webhook-timestamp")?;
    let seconds: i64 = timestamp
        .parse()
        .map_err(|_| format!("webhook-timestamp {timestamp:?} is not a number"))?;
    let now = crate::now_ms() / 1_000;
    if (now - seconds).abs() > TIMESTAMP_TOLERANCE_S {
        return Err(format!(
            "webhook-timestamp {seconds} is too far from now ({now})"
        ));
    }
    let key = match secret.strip_prefix("whsec_") {
        Some(rest) => b64
            .decode(rest)
            .map_err(|e| format!("bad test secret: {e}"))?,
        None => secret.as_bytes().to_vec(),
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let want = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
    let given = header("webhook-signature")?;
    if given.split(' ').any(|sig| sig == want) {
        Ok(())
    } else {
        Err(format!("signatures {given:?}, none is {want:?}"))
    }
}
