//! Redis: a private `redis-server` child, or the machine's shared server
//! under a key prefix of the test's own.

use std::process::Stdio;
use std::time::{Duration, Instant};

use taskmesh_coord::{RedisCoordinator, RedisOptions};

use crate::netns::Place;
use crate::process::{Child, free_port};

/// A `redis-server` child on a free loopback port, without persistence;
/// killed when dropped. [`kill`](Self::kill) and [`restart`](Self::restart)
/// make an outage: the restarted server is empty, as a real one without
/// persistence would be.
pub struct PrivateRedis {
    pub port: u16,
    place: Place,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_at(&Place::local())
    }

    /// Starts a server in `place` (a namespace of a test net), listening on
    /// its address, and waits until it answers PING.
    pub fn start_at(place: &Place) -> Self {
        let port = free_port();
        Self {
            port,
            child: Some(Self::spawn(place, port)),
            place: place.clone(),
        }
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Starts a fresh, empty server on the same port (killing the running
    /// one, if any) and waits until it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Some(Self::spawn(&self.place, self.port));
    }

    /// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`, …) to the server.
    pub fn signal(&self, signal: i32) {
        self.child.as_ref().expect("server running").signal(signal);
    }

    fn spawn(place: &Place, port: u16) -> Child {
        let child = Child::spawn(
            place
                .command("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--bind", &place.ip.to_string()])
                .args(["--protected-mode", "no", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            &format!("private redis-server on :{port} (apt-get install redis-server)"),
            None,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !answers(&format!("redis://{}", place.addr(port))) {
            assert!(
                Instant::now() < deadline,
                "private redis-server on port {port} did not answer within 10 s"
            );
            // Polling interval of a condition with a deadline.
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// `redis://{ip}:{port}` (`127.0.0.1` unless started in a namespace).
    pub fn url(&self) -> String {
        format!("redis://{}", self.place.addr(self.port))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").pid()
    }

    /// `GET key` on a fresh connection: the value, or `None` when the key
    /// is missing or the server does not answer.
    pub fn get(&self, key: &str) -> Option<String> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        redis::cmd("GET").arg(key).query(&mut conn).ok()?
    }
}

/// Whether the Redis server at `url` answers PING.
fn answers(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
        return false;
    };
    redis::cmd("PING").query::<String>(&mut conn).is_ok()
}

/// The machine's Redis under a key prefix nobody else uses; every key under
/// it is deleted when this is dropped.
pub struct SharedRedis {
    pub url: String,
    pub prefix: String,
}

impl SharedRedis {
    /// `TASKMESH_TEST_REDIS_URL` or the local default, with a fresh prefix.
    pub fn new() -> Self {
        Self {
            url: std::env::var("TASKMESH_TEST_REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            prefix: format!("taskmesh-test:{}:", uuid::Uuid::new_v4().simple()),
        }
    }

    /// Coordinator options for `node_id` on this prefix: the defaults, with
    /// a short lease (TTL 3 s, renewed every second) so takeovers are quick.
    pub fn options(&self, node_id: &str) -> RedisOptions {
        let mut opts = RedisOptions::new(self.url.clone(), node_id);
        opts.key_prefix = self.prefix.clone();
        opts.lease_ttl = Duration::from_secs(3);
        opts.renew_interval = Duration::from_secs(1);
        opts
    }

    /// How many keys are under the prefix now.
    pub fn keys(&self) -> usize {
        scan(&self.url, &self.prefix).map_or(0, |k| k.len())
    }
}

impl Default for SharedRedis {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SharedRedis {
    fn drop(&mut self) {
        delete_prefix(&self.url, &self.prefix);
    }
}

/// Connects `opts`, failing the test with a message that says what to start.
pub async fn connect_redis(opts: RedisOptions) -> RedisCoordinator {
    let url = opts.url.clone();
    RedisCoordinator::connect(opts).await.unwrap_or_else(|e| {
        panic!(
            "these tests need Redis at {url} (set TASKMESH_TEST_REDIS_URL, or run \
             `make services` to start the local one): {e}"
        )
    })
}

fn scan(url: &str, prefix: &str) -> Option<Vec<String>> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let mut cursor = 0u64;
    let mut out = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)
            .ok()?;
        out.extend(keys);
        if next == 0 {
            return Some(out);
        }
        cursor = next;
    }
}

/// Deletes every key under `prefix` (best effort: a test that already
/// failed should not fail again in its clean-up).
pub fn delete_prefix(url: &str, prefix: &str) {
    let Some(keys) = scan(url, prefix) else {
        return;
    };
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return;
    };
    for chunk in keys.chunks(1000) {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(chunk).query(&mut conn);
    }
}
