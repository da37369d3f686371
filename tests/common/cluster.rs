//! A cluster of real processes for the chaos and fencing tests: a private
//! Postgres and a private Redis ([`super::services`]), `taskmesh serve`
//! replicas and `taskmesh worker` processes on them, each killed when its
//! handle drops; plus the readings the tests make from outside (a replica's
//! `/metrics`, the leader key in Redis, SQL on the private database).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::services::{PrivatePostgres, PrivateRedis};
use super::{Child, free_port, spawn_server_with};

/// Lease TTL of the test clusters: short, so a takeover is quick.
pub const LEASE_TTL: Duration = Duration::from_secs(3);
/// Lease renew interval of the test clusters.
pub const LEASE_RENEW: Duration = Duration::from_secs(1);
/// Redis key prefix of the test clusters.
pub const PREFIX: &str = "chaos:";

/// The shared services of one test cluster and its working directory (logs,
/// ledgers, fault-hook files).
pub struct Cluster {
    pub pg: PrivatePostgres,
    pub redis: PrivateRedis,
    pub dir: tempfile::TempDir,
}

/// One `taskmesh serve` process.
pub struct Replica {
    pub grpc: u16,
    pub http: u16,
    pub child: Child,
}

impl Replica {
    /// `http://127.0.0.1:{grpc}`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }
}

impl Cluster {
    /// Starts Postgres and Redis.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            pg: PrivatePostgres::start(),
            redis: PrivateRedis::start(),
            dir,
        }
    }

    /// The flags every replica gets.
    fn serve_flags(&self) -> Vec<String> {
        vec![
            "--database-url".into(),
            self.pg.url(),
            "--redis-url".into(),
            self.redis.url(),
            "--redis-prefix".into(),
            PREFIX.into(),
            "--lease-ttl".into(),
            format!("{}ms", LEASE_TTL.as_millis()),
            "--lease-renew".into(),
            format!("{}ms", LEASE_RENEW.as_millis()),
        ]
    }

    /// Starts a replica on `grpc`/`http` (fresh ports when `None`) with
    /// `envs`, and waits until it answers.
    pub async fn replica(&self, ports: Option<(u16, u16)>, envs: &[(&str, &str)]) -> Replica {
        let (grpc, http) = ports.unwrap_or_else(|| (free_port(), free_port()));
        let flags = self.serve_flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let child = spawn_server_with(self.dir.path(), grpc, http, &flags, envs).await;
        Replica { grpc, http, child }
    }

    /// Starts `taskmesh worker` `id` on `servers` (tried in that order),
    /// writing its executions to `ledger`.
    pub fn worker(&self, id: &str, servers: &[String], concurrency: u32, ledger: &Path) -> Child {
        let log = std::fs::File::create(self.dir.path().join(format!("worker-{id}.log"))).unwrap();
        let child = std::process::Command::new(super::binary())
            .arg("worker")
            .arg("--server")
            .arg(servers.join(","))
            .args(["--worker-id", id, "--handlers", "echo,sleep"])
            .arg("--concurrency")
            .arg(concurrency.to_string())
            .arg("--ledger")
            .arg(ledger)
            .env_remove("TASKMESH_SERVER")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn taskmesh worker");
        Child(child)
    }

    /// A file in the working directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A connection pool on the cluster's database, for reading the record.
    pub async fn db(&self) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.pg.url())
            .await
            .expect("connect to the private Postgres")
    }

    /// The lease holder's token, from `{prefix}leader = "{token}:{owner}"`.
    pub fn leader_token(&self) -> Option<u64> {
        let v = self.redis.get(&format!("{PREFIX}leader"))?;
        v.split_once(':')?.0.parse().ok()
    }
}

/// The sum of every series of metric `name` on the replica's `/metrics`,
/// `Some(0.0)` when the family is absent, `None` when the replica does not
/// answer.
pub async fn metric(http: u16, name: &str) -> Option<f64> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?;
    let text = client
        .get(format!("http://127.0.0.1:{http}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let metric = series.split('{').next()?;
                (metric == name).then(|| value.parse::<f64>().ok())?
            })
            .sum(),
    )
}

/// Whether the replica reports holding the lease (`taskmesh_leader 1`).
pub async fn leads(http: u16) -> bool {
    metric(http, "taskmesh_leader").await == Some(1.0)
}

/// Milliseconds since the Unix epoch on this host's clock, which is also
/// the private database's clock (same machine).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
