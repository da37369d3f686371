//! Servers for tests. Private ones — Postgres ([`PrivatePostgres`]),
//! MariaDB ([`PrivateMariadb`]) and Redis ([`PrivateRedis`]) — each on a
//! free loopback port in a temporary directory, stopped and removed when
//! dropped (also when the test panics), for tests that kill, stop or restart
//! them. The machine's shared servers are never stopped: tests use them
//! under a key prefix of their own ([`SharedRedis`], deleted afterwards) or
//! in a database of their own ([`ScratchDb`], dropped afterwards). A
//! missing piece of the environment fails the test with a message saying
//! what is missing; it is never skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use taskmesh_coord::{RedisCoordinator, RedisOptions};
use taskmesh_store::DatabaseKind;

use crate::process::{Child, free_port, log_tail};

// ---- Postgres ----

/// Where `initdb` and `pg_ctl` live: `TASKMESH_TEST_PG_BIN` or Debian's
/// Postgres 15 directory.
pub fn pg_bin() -> PathBuf {
    let dir = std::env::var_os("TASKMESH_TEST_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"));
    for tool in ["initdb", "pg_ctl", "postgres"] {
        assert!(
            dir.join(tool).exists(),
            "{} is missing: these tests start a private Postgres and need its server binaries \
             (apt-get install postgresql-15, or set TASKMESH_TEST_PG_BIN to their directory)",
            dir.join(tool).display()
        );
    }
    dir
}

/// Runs a Postgres tool: as the unprivileged `postgres` user when we are
/// root (initdb and pg_ctl refuse root), directly otherwise.
fn pg_command(tool: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(tool);
        c
    } else {
        Command::new(tool)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// uid and gid of the `postgres` user.
fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        assert!(
            out.status.success(),
            "running as root, the private Postgres needs an unprivileged `postgres` user \
             (initdb refuses root): `id {flag} postgres` failed"
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    (id("-u"), id("-g"))
}

/// A Postgres server of our own: `initdb` in a temporary directory, started
/// with `pg_ctl` on a free port. `fsync` is off (the machine does not
/// crash under these tests), but commits are synchronous: a test that stops
/// the server with `-m immediate` ([`stop`](Self::stop)) must not lose a
/// commit it was told about.
pub struct PrivatePostgres {
    pub port: u16,
    data: PathBuf,
    run: PathBuf,
    bin: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PrivatePostgres {
    /// Creates and starts the server; waits until it accepts connections.
    pub fn start() -> Self {
        let bin = pg_bin();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data = dir.path().join("data");
        let run = dir.path().join("run");
        std::fs::create_dir(&data).unwrap();
        std::fs::create_dir(&run).unwrap();
        if is_root() {
            use std::os::unix::fs::PermissionsExt;
            let (uid, gid) = postgres_ids();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            for p in [&data, &run] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
            }
        }
        let log = run.join("postgres.log");
        let out = pg_command(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .stdout(Stdio::null())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let this = Self {
            port: free_port(),
            data,
            run,
            bin,
            log,
            _dir: dir,
        };
        this.start_again();
        this
    }

    /// Starts the (stopped) server again on the same port and data
    /// directory; waits until it accepts connections.
    pub fn start_again(&self) {
        let settings = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c full_page_writes=off -c max_connections=200",
            self.port,
            self.run.display()
        );
        let out = pg_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-o", &settings, "-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`: every
    /// connection is cut, no checkpoint), as an outage would; waits until it
    /// is gone.
    pub fn stop(&self) {
        let out = pg_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl stop");
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `postgres://postgres@127.0.0.1:{port}/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // Immediate: nothing in it is worth a checkpoint. Best effort: a
        // failing test must not fail again here.
        let _ = pg_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

// ---- MariaDB ----

/// Where `mariadb-install-db` and `mariadbd` live (Debian's packages).
const MARIADB_INSTALL: &str = "/usr/bin/mariadb-install-db";
const MARIADBD: &str = "/usr/sbin/mariadbd";

/// A MariaDB server of our own: `mariadb-install-db` in a temporary
/// directory, `mariadbd` on a free loopback port, killed when dropped. The
/// database `taskmesh` is created empty.
///
/// `root@127.0.0.1` has no password: the grant tables are made with
/// `--auth-root-authentication-method=normal` (root authenticates by
/// password, which is empty, instead of by Unix socket credentials, which a
/// TCP client cannot present), and `--skip-name-resolve` keeps 127.0.0.1 the
/// host the server matches. The grant tables stay on (unlike
/// `--skip-grant-tables`), so the server behaves as a real deployment does.
/// `innodb_flush_log_at_trx_commit=2`: commits reach the OS at once, so a
/// killed `taskmesh serve` loses none; the machine does not crash under
/// these tests.
pub struct PrivateMariadb {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl PrivateMariadb {
    /// The database every URL of [`url`](Self::url) names.
    pub const DATABASE: &'static str = "taskmesh";

    /// Creates and starts the server; waits until it accepts connections
    /// and has the database `taskmesh`.
    pub async fn start() -> Self {
        for tool in [MARIADB_INSTALL, MARIADBD] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: these tests start a private MariaDB and need its server \
                 binaries (apt-get install mariadb-server)"
            );
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data = dir.path().join("data");
        let install_log = dir.path().join("install.log");
        let out = Command::new(MARIADB_INSTALL)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args([
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .output()
            .expect("run mariadb-install-db");
        std::fs::write(&install_log, [&out.stdout[..], &out.stderr[..]].concat()).unwrap();
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let log = dir.path().join("mariadbd.log");
        // As root, mariadbd refuses to run unless told which user to be.
        let user = if is_root() { "--user=root" } else { "" };
        let mut command = Command::new(MARIADBD);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!(
                "--socket={}",
                dir.path().join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mysqld.pid").display()
            ))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-networking=0",
                "--skip-name-resolve",
                "--max-connections=300",
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-size=128M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !user.is_empty() {
            command.arg(user);
        }
        let mut child = Child::spawn(
            &mut command,
            &format!("private mariadbd on :{port}"),
            Some(log.clone()),
        );
        let admin = format!("mysql://root@127.0.0.1:{port}/mysql");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            child.assert_alive();
            use sqlx::Connection;
            if let Ok(mut conn) = sqlx::mysql::MySqlConnection::connect(&admin).await {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                    Self::DATABASE
                )))
                .execute(&mut conn)
                .await
                .expect("create the database on the private MariaDB");
                let _ = conn.close().await;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the private MariaDB on :{port} did not accept connections within 60 s:\n{}",
                log_tail(&log)
            );
            // Polling interval of a condition with a deadline.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            port,
            child,
            _dir: dir,
        }
    }

    /// `mysql://root@127.0.0.1:{port}/taskmesh`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{}", self.port, Self::DATABASE)
    }

    /// The server process.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }
}

// ---- Redis ----

/// A `redis-server` child on a free loopback port, without persistence;
/// killed when dropped. [`kill`](Self::kill) and [`restart`](Self::restart)
/// make an outage: the restarted server is empty, as a real one without
/// persistence would be.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Self {
        let port = free_port();
        Self {
            port,
            child: Some(Self::spawn(port)),
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
        self.child = Some(Self::spawn(self.port));
    }

    /// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`, …) to the server.
    pub fn signal(&self, signal: i32) {
        self.child.as_ref().expect("server running").signal(signal);
    }

    fn spawn(port: u16) -> Child {
        let child = Child::spawn(
            Command::new("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            &format!("private redis-server on :{port} (apt-get install redis-server)"),
            None,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !answers(port) {
            assert!(
                Instant::now() < deadline,
                "private redis-server on port {port} did not answer within 10 s"
            );
            // Polling interval of a condition with a deadline.
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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

/// Whether a Redis server on `port` answers PING.
fn answers(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
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

// ---- scratch databases on the shared servers ----

/// A database of its own on the machine's shared Postgres
/// (`TASKMESH_TEST_DATABASE_URL`) or MariaDB (`TASKMESH_TEST_MYSQL_URL`),
/// created empty and dropped when this is dropped.
pub struct ScratchDb {
    kind: DatabaseKind,
    url: String,
    inner: Option<Scratch>,
}

enum Scratch {
    Postgres(taskmesh_store::postgres::scratch::ScratchDatabase),
    Mysql(taskmesh_store::mysql::scratch::ScratchDatabase),
}

impl ScratchDb {
    /// A fresh database of `kind` on the shared server.
    pub async fn create(kind: DatabaseKind) -> Self {
        let inner = match kind {
            DatabaseKind::Postgres => Scratch::Postgres(
                taskmesh_store::postgres::scratch::ScratchDatabase::create_on(
                    &taskmesh_store::postgres::scratch::test_database_url(),
                )
                .await
                .expect("a scratch database on the shared Postgres (`make services`)"),
            ),
            DatabaseKind::Mysql => Scratch::Mysql(
                taskmesh_store::mysql::scratch::ScratchDatabase::create()
                    .await
                    .expect("a scratch database on the shared MariaDB (`make services`)"),
            ),
        };
        let url = match &inner {
            Scratch::Postgres(db) => db.url().to_string(),
            Scratch::Mysql(db) => db.url().to_string(),
        };
        Self {
            kind,
            url,
            inner: Some(inner),
        }
    }

    /// Which server it is on.
    pub fn kind(&self) -> DatabaseKind {
        self.kind
    }

    /// Its URL (for `--database-url` or `NodeOptions::database_url`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        // Drop runs inside the test's runtime, where blocking on a future
        // is not allowed: a thread with a runtime of its own does it.
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime
                .block_on(async {
                    match inner {
                        Scratch::Postgres(db) => db.drop_now().await,
                        Scratch::Mysql(db) => db.drop_now().await,
                    }
                })
                .map_err(|e| e.to_string())
        })
        .join();
        if let Ok(Err(err)) = done {
            eprintln!("could not drop the scratch database {}: {err}", self.url);
        }
    }
}
