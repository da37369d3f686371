//! A cluster of real processes for the chaos, fencing and outage tests: a
//! private database (Postgres or MariaDB) and a private Redis
//! ([`crate::services`]), `taskmesh serve` replicas and `taskmesh worker`
//! processes of the binary the test names, each killed when its handle
//! drops; plus the readings the tests make from outside (the lease key in
//! Redis, the database through [`Db`]); the steady load the chaos and
//! fault tests submit ([`submit_load`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use taskmesh_store::DatabaseKind;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::db::Db;
use crate::metrics::leads_at;
use crate::netns::Place;
use crate::process::{Child, WorkerProcess, free_port, spawn_server_at};
use crate::services::{PrivateMariadb, PrivatePostgres, PrivateRedis};
use crate::wait_for;

/// Lease TTL of the test clusters: short, so a takeover is quick.
pub const LEASE_TTL: Duration = Duration::from_secs(3);
/// Lease renew interval of the test clusters.
pub const LEASE_RENEW: Duration = Duration::from_secs(1);
/// Redis key prefix of the test clusters.
pub const PREFIX: &str = "chaos:";

/// The private database of a cluster.
pub enum PrivateDatabase {
    Postgres(PrivatePostgres),
    Mariadb(PrivateMariadb),
}

impl PrivateDatabase {
    /// Starts a private server of `kind`.
    pub async fn start(kind: DatabaseKind) -> Self {
        match kind {
            DatabaseKind::Postgres => Self::Postgres(PrivatePostgres::start()),
            DatabaseKind::Mysql => Self::Mariadb(PrivateMariadb::start().await),
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        match self {
            Self::Postgres(pg) => pg.url(),
            Self::Mariadb(db) => db.url(),
        }
    }

    /// Which kind of server it is.
    pub fn kind(&self) -> DatabaseKind {
        match self {
            Self::Postgres(_) => DatabaseKind::Postgres,
            Self::Mariadb(_) => DatabaseKind::Mysql,
        }
    }
}

/// The shared services of one test cluster, the binary its processes run
/// and its working directory (logs, ledgers, fault-hook files).
pub struct Cluster {
    pub bin: PathBuf,
    pub database: PrivateDatabase,
    pub redis: PrivateRedis,
    pub dir: tempfile::TempDir,
}

/// One `taskmesh serve` process.
pub struct Replica {
    pub grpc: u16,
    pub http: u16,
    pub child: Child,
    /// Where it runs: loopback, or a namespace of a test net.
    pub place: Place,
}

impl Replica {
    /// `http://{ip}:{grpc}` (`127.0.0.1` unless in a namespace).
    pub fn url(&self) -> String {
        format!("http://{}", self.place.addr(self.grpc))
    }

    /// Its HTTP address (`/metrics`, REST).
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.place.addr(self.http)
    }
}

impl Cluster {
    /// Starts a private database of `kind` and a private Redis; its
    /// processes will run `bin`.
    pub async fn start(bin: &Path, kind: DatabaseKind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            bin: bin.to_path_buf(),
            database: PrivateDatabase::start(kind).await,
            redis: PrivateRedis::start(),
            dir,
        }
    }

    /// A private Postgres in `database` and a private Redis in `redis`
    /// (namespaces of a test net); its processes will run `bin`.
    pub fn start_at(bin: &Path, database: &Place, redis: &Place) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            bin: bin.to_path_buf(),
            database: PrivateDatabase::Postgres(PrivatePostgres::start_at(database)),
            redis: PrivateRedis::start_at(redis),
            dir,
        }
    }

    /// The private Postgres (for tests written for Postgres only).
    pub fn pg(&self) -> &PrivatePostgres {
        match &self.database {
            PrivateDatabase::Postgres(pg) => pg,
            PrivateDatabase::Mariadb(_) => panic!("this cluster runs on MariaDB"),
        }
    }

    /// The flags every replica gets.
    fn serve_flags(&self) -> Vec<String> {
        vec![
            "--database-url".into(),
            self.database.url(),
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
        self.replica_at(&Place::local(), ports, envs).await
    }

    /// [`replica`](Self::replica) in `place` (a namespace of a test net).
    pub async fn replica_at(
        &self,
        place: &Place,
        ports: Option<(u16, u16)>,
        envs: &[(&str, &str)],
    ) -> Replica {
        let (grpc, http) = ports.unwrap_or_else(|| (free_port(), free_port()));
        let flags = self.serve_flags();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let child = spawn_server_at(
            place,
            &self.bin,
            self.dir.path(),
            (grpc, http),
            &flags,
            envs,
        )
        .await;
        Replica {
            grpc,
            http,
            child,
            place: place.clone(),
        }
    }

    /// `taskmesh worker` `id` on `servers` (tried in that order), its log
    /// in the working directory: configure it, then `spawn()`.
    pub fn worker(&self, id: &str, servers: &[String]) -> WorkerProcess {
        WorkerProcess::new(&self.bin, id, servers, self.dir.path())
    }

    /// A file in the working directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A small pool on the cluster's database, for reading the record.
    pub async fn db(&self) -> Db {
        Db::connect(&self.database.url()).await
    }

    /// The lease holder's token, from `{prefix}leader = "{token}:{owner}"`.
    pub fn leader_token(&self) -> Option<u64> {
        let v = self.redis.get(&format!("{PREFIX}leader"))?;
        v.split_once(':')?.0.parse().ok()
    }
}

/// The retry policy of the load's tasks and schedules: up to 25 attempts,
/// backing off 100 ms to 1 s, so a fault costs retries, never a task.
pub fn retry_policy() -> pb::RetryPolicy {
    pb::RetryPolicy {
        max_attempts: 25,
        initial_backoff: Some(prost_types::Duration {
            seconds: 0,
            nanos: 100_000_000,
        }),
        multiplier: 2.0,
        max_backoff: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
    }
}

/// A lazily connecting client: a dead or cut-off replica fails its calls
/// quickly (1 s to connect, 10 s per call) and is reached again when back.
pub fn lazy_client(url: &str) -> TaskApiClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    TaskApiClient::new(ch)
}

/// A steady load: `batches` batches of `batch` `sleep` tasks of `task_ms`
/// each, one batch every `every`, with client request ids `{prefix}-{b}-{j}`.
#[derive(Debug, Clone)]
pub struct Load {
    pub batches: usize,
    pub batch: usize,
    pub every: Duration,
    pub task_ms: u64,
    pub prefix: String,
}

/// Submits `load`, one replica after the other; a batch that fails (its
/// replica died or is cut off) is sent again, with the same client request
/// ids, to the next one; a batch refused everywhere for 60 s fails the
/// test. Returns the accepted task ids.
pub async fn submit_load(urls: Vec<String>, load: Load) -> Vec<String> {
    let clients: Vec<_> = urls.iter().map(|u| lazy_client(u)).collect();
    let mut accepted = Vec::with_capacity(load.batches * load.batch);
    let mut pace = tokio::time::interval(load.every);
    let payload = format!(r#"{{"ms":{}}}"#, load.task_ms).into_bytes();
    for b in 0..load.batches {
        pace.tick().await;
        let batch: Vec<_> = (0..load.batch)
            .map(|j| pb::SubmitTaskRequest {
                handler: "sleep".into(),
                payload: Some(pb::Payload {
                    data: payload.clone(),
                    content_type: "application/json".into(),
                }),
                client_request_id: format!("{}-{b}-{j}", load.prefix),
                retry_policy: Some(retry_policy()),
                ..Default::default()
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut target = b;
        let results = loop {
            let mut c = clients[target % clients.len()].clone();
            match c
                .submit_tasks(pb::SubmitTasksRequest {
                    tasks: batch.clone(),
                })
                .await
            {
                Ok(r) => break r.into_inner().results,
                Err(status) => {
                    assert!(
                        Instant::now() < deadline,
                        "batch {b} refused for 60 s, last: {status}"
                    );
                    target += 1;
                    // Retry pacing of a condition with a deadline.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        for (j, r) in results.into_iter().enumerate() {
            let a = r.accepted.unwrap_or_else(|| {
                panic!("task {b}-{j} refused: {} {}", r.error_code, r.error_message)
            });
            accepted.push(a.task_id);
        }
    }
    accepted
}

/// Submits `n` diamond workflows (a → b, c → d, each step a `sleep` of
/// `task_ms` with [`retry_policy`]), one per `every`, one replica after the
/// other; a refused submit is sent again with the same client request id
/// to the next replica (60 s at most). Returns the workflow ids, and the
/// ids of every step's task.
pub async fn submit_workflows(
    urls: Vec<String>,
    n: usize,
    every: Duration,
    task_ms: u64,
    prefix: String,
) -> (Vec<String>, Vec<String>) {
    let clients: Vec<_> = urls.iter().map(|u| lazy_client(u)).collect();
    let payload = format!(r#"{{"ms":{task_ms}}}"#).into_bytes();
    let step = |name: &str, deps: &[&str]| pb::WorkflowStepSpec {
        after_parents_end: false,
        name: name.into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        template: Some(pb::TaskTemplate {
            handler: "sleep".into(),
            payload: Some(pb::Payload {
                data: payload.clone(),
                content_type: "application/json".into(),
            }),
            retry_policy: Some(retry_policy()),
            ..Default::default()
        }),
    };
    let mut pace = tokio::time::interval(every);
    let (mut workflows, mut steps) = (Vec::with_capacity(n), Vec::with_capacity(4 * n));
    for i in 0..n {
        pace.tick().await;
        let request = pb::SubmitWorkflowRequest {
            steps: vec![
                step("a", &[]),
                step("b", &["a"]),
                step("c", &["a"]),
                step("d", &["b", "c"]),
            ],
            client_request_id: format!("{prefix}-{i}"),
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut target = i;
        let answer = loop {
            let mut c = clients[target % clients.len()].clone();
            match c.submit_workflow(request.clone()).await {
                Ok(r) => break r.into_inner(),
                Err(status) => {
                    assert!(
                        Instant::now() < deadline,
                        "workflow {i} refused for 60 s, last: {status}"
                    );
                    target += 1;
                    // Retry pacing of a condition with a deadline.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let w = answer.workflow.expect("the workflow");
        assert_eq!(w.steps.len(), 4, "workflow {i} has its four steps");
        steps.extend(w.steps.into_iter().map(|s| s.task_id));
        workflows.push(answer.workflow_id);
    }
    (workflows, steps)
}

/// Submits `n` sharding broadcasts of `sleep` (`task_ms` each, the chaos
/// retry policy), one per `every`, to the replicas in turn (the next on a
/// refusal, for up to 60 s each); returns their ids.
pub async fn submit_broadcasts(
    urls: Vec<String>,
    n: usize,
    every: Duration,
    task_ms: u64,
    prefix: String,
) -> Vec<String> {
    let clients: Vec<_> = urls.iter().map(|u| lazy_client(u)).collect();
    let mut pace = tokio::time::interval(every);
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        pace.tick().await;
        let request = pb::SubmitTaskRequest {
            handler: "sleep".into(),
            payload: Some(pb::Payload {
                data: format!(r#"{{"ms":{task_ms}}}"#).into_bytes(),
                content_type: "application/json".into(),
            }),
            retry_policy: Some(retry_policy()),
            client_request_id: format!("{prefix}-{i}"),
            broadcast: true,
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut target = i;
        let id = loop {
            let mut c = clients[target % clients.len()].clone();
            match c.submit_task(request.clone()).await {
                Ok(r) => break r.into_inner().task_id,
                Err(status) => {
                    assert!(
                        Instant::now() < deadline,
                        "broadcast {i} refused for 60 s, last: {status}"
                    );
                    target += 1;
                    // Retry pacing of a condition with a deadline.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        ids.push(id);
    }
    ids
}

/// The replica holding the lease (exactly one reports it), within 20 s.
pub async fn leader_index(replicas: &[Replica]) -> usize {
    wait_for("exactly one leader", Duration::from_secs(20), || async {
        let mut leading = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if leads_at(r.http_addr()).await {
                leading.push(i);
            }
        }
        (leading.len() == 1).then(|| leading[0])
    })
    .await
}
