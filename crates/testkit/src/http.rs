//! REST helpers for the end-to-end tests: a real HTTP client (reqwest)
//! speaking JSON to a node's HTTP port, and a Server-Sent Events reader.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// A REST client for one node.
#[derive(Clone)]
pub struct Rest {
    pub base: String,
    pub client: reqwest::Client,
}

/// A response: status, headers and the body parsed as JSON (`Null` if it
/// is not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub json: Value,
}

impl Rest {
    /// A client for the HTTP port at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    /// Sends `body` (JSON) with `method` to `path`.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let bytes = body.map(|b| b.to_string().into_bytes());
        self.raw(method, path, &[("content-type", "application/json")], bytes)
            .await
    }

    /// Sends raw bytes with the given headers.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req.send().await.expect("http request");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            json,
        }
    }

    /// GET /api/tasks/{id}, expecting 200; returns the task.
    pub async fn task(&self, id: &str) -> Value {
        let reply = self
            .call(Method::GET, &format!("/api/tasks/{id}"), None)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
        reply.json["task"].clone()
    }

    /// Waits until the task is in state `want` (its JSON name, e.g.
    /// `TASK_STATE_SUCCEEDED`), failing the test after `limit`; returns it.
    pub async fn wait_state(&self, id: &str, want: &str, limit: Duration) -> Value {
        crate::wait_for(&format!("task {id} to be {want}"), limit, || async {
            let task = self.task(id).await;
            (state_of(&task) == want).then_some(task)
        })
        .await
    }

    /// Waits until the task's callback is in state `want` (e.g.
    /// `CALLBACK_STATE_DELIVERED`), failing the test after `limit`; returns
    /// the task.
    pub async fn wait_callback(&self, id: &str, want: &str, limit: Duration) -> Value {
        crate::wait_for(
            &format!("the callback of {id} to be {want}"),
            limit,
            || async {
                let task = self.task(id).await;
                (task["callback"]["state"] == want).then_some(task)
            },
        )
        .await
    }

    /// How many tasks the node holds (up to 1000).
    pub async fn count_tasks(&self) -> usize {
        let reply = self
            .call(Method::GET, "/api/tasks?pageSize=1000", None)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
        reply.json["tasks"].as_array().map_or(0, Vec::len)
    }
}

/// Asserts `reply` is the JSON error shape with `status` and gRPC `code`,
/// its message containing `text`.
pub fn assert_error(reply: &Reply, status: u16, code: i64, text: &str) {
    assert_eq!(reply.status.as_u16(), status, "{:?}", reply.json);
    assert_eq!(
        reply.headers["content-type"], "application/json",
        "{:?}",
        reply.json
    );
    let body = reply.json.as_object().expect("a JSON object");
    assert_eq!(body.len(), 3, "exactly code, message, details: {body:?}");
    assert_eq!(body["code"], code, "{body:?}");
    assert_eq!(body["details"], Value::Array(vec![]), "{body:?}");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains(text),
        "{message:?} should contain {text:?}"
    );
}

/// The state name of a task's JSON (absent means UNSPECIFIED).
pub fn state_of(task: &Value) -> String {
    task["state"]
        .as_str()
        .unwrap_or("TASK_STATE_UNSPECIFIED")
        .to_string()
}

/// A Server-Sent Events stream being read.
pub struct Events {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
}

impl Events {
    /// Opens `path` as an event stream; the status and headers come first.
    pub async fn open(rest: &Rest, path: &str) -> (StatusCode, HeaderMap, Self) {
        let resp = rest
            .client
            .get(format!("{}{path}", rest.base))
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .expect("open event stream");
        let status = resp.status();
        let headers = resp.headers().clone();
        (
            status,
            headers,
            Self {
                body: resp.bytes_stream().boxed(),
                buffer: String::new(),
            },
        )
    }

    /// The next event as (event name, parsed data), skipping comments;
    /// `None` when the stream ends. Fails the test after `limit`.
    pub async fn next(&mut self, limit: Duration) -> Option<(String, Value)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut name = "message".to_string();
                let mut data = String::new();
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some((
                    name,
                    serde_json::from_str(&data).expect("event data is JSON"),
                ));
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .unwrap_or_else(|_| panic!("no event within {limit:?}"))?;
            let chunk = chunk.expect("event stream chunk");
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8 events"));
        }
    }
}
