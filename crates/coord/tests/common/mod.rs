//! Redis for the coordinator's tests: the machine's shared server (each
//! test under its own random key prefix, deleted afterwards) and private
//! `redis-server` children for tests that kill the server.

#![allow(dead_code)] // each test binary uses part of this module

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use taskmesh_coord::{RedisCoordinator, RedisOptions};

/// The shared server's URL: `TASKMESH_TEST_REDIS_URL` or the local default.
pub fn shared_url() -> String {
    std::env::var("TASKMESH_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix nobody else uses.
pub fn fresh_prefix() -> String {
    format!("taskmesh-test:{}:", uuid::Uuid::new_v4().simple())
}

/// Connects `opts`, failing the test with a message that says what to start.
pub async fn connect(opts: RedisOptions) -> RedisCoordinator {
    let url = opts.url.clone();
    RedisCoordinator::connect(opts).await.unwrap_or_else(|e| {
        panic!(
            "these tests need Redis at {url} (set TASKMESH_TEST_REDIS_URL, or run \
             `make services` to start the local one): {e}"
        )
    })
}

/// Deletes every key under `prefix` (best effort: a test that already
/// failed should not fail again in its clean-up).
pub fn delete_prefix(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return;
    };
    let mut cursor = 0u64;
    loop {
        let step: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn);
        let Ok((next, keys)) = step else {
            return;
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// A `redis-server` child on a free loopback port, without persistence;
/// killed when dropped.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut this = Self { port, child: None };
        this.restart();
        this
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the server process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty, and waits until it
    /// answers.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for the outage tests");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.answers() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private redis-server on port {} did not answer within 10 s",
                self.port
            );
            // Polling interval of a condition with a deadline.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        // A stopped process ignores nothing but SIGKILL, which kill() sends.
        self.kill();
    }
}

/// Polls `check` until it returns `Some`, failing after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    taskmesh_coord::conformance::wait_for(what, limit, check).await
}
