//! Real processes: a [`Child`] that is killed when dropped and fails its
//! test when it died on its own, `taskmesh serve` ([`spawn_server`]) and
//! `taskmesh worker` ([`WorkerProcess`]) started from the binary the test
//! names, the workers' ledgers, free ports and the host clock.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;

use crate::netns::Place;

/// A free loopback port (bound then released; the tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Milliseconds since the Unix epoch on this host's clock, which is also
/// the clock of the servers the tests start on this machine.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A child process, killed when dropped. A process that exited by itself
/// (a crash the test did not cause) fails the test at the next
/// [`kill`](Self::kill), [`assert_alive`](Self::assert_alive) or drop, with
/// its exit status and the tail of its log.
pub struct Child {
    child: Option<std::process::Child>,
    what: String,
    log: Option<PathBuf>,
}

impl Child {
    /// Spawns `command` as `what` (for messages), its output going where
    /// `command` says; `log` is where its stderr goes, if a file.
    pub fn spawn(command: &mut Command, what: &str, log: Option<PathBuf>) -> Self {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Self {
            child: Some(child),
            what: what.to_string(),
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running child").id()
    }

    /// Where its log goes, if a file.
    pub fn log(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Whether the test killed it ([`kill`](Self::kill)).
    pub fn is_killed(&self) -> bool {
        self.child.is_none()
    }

    /// Fails the test if the process exited by itself.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.exited() {
            let died = self.died(status);
            // Reaped: reported once, not again when dropped.
            self.child = None;
            panic!("{died}");
        }
    }

    /// SIGKILL and reap; fails the test if the process had already exited
    /// by itself.
    pub fn kill(&mut self) {
        self.assert_alive();
        self.reap();
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`), failing the test if it cannot.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.pid()).expect("a pid");
        // SAFETY: kill(2) with a pid we spawned and have not reaped.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}) of {}: {}",
            self.what,
            std::io::Error::last_os_error()
        );
    }

    /// The exit status, if the process has exited (and was not reaped).
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn died(&self, status: ExitStatus) -> String {
        match &self.log {
            Some(log) => format!(
                "{} exited by itself ({status}); its log {}:\n{}",
                self.what,
                log.display(),
                log_tail(log)
            ),
            None => format!("{} exited by itself ({status})", self.what),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let status = self.exited();
        self.reap();
        // A second panic while unwinding would abort the test binary.
        if let Some(status) = status
            && !std::thread::panicking()
        {
            panic!("{}", self.died(status));
        }
    }
}

/// The last 40 lines of a log file.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Starts `bin serve` on loopback ports `grpc`/`http` with its data in
/// `data_dir`, the `extra` flags and `envs`, and waits until its gRPC port
/// answers; see [`spawn_server_at`].
pub async fn spawn_server(
    bin: &Path,
    data_dir: &Path,
    ports: (u16, u16),
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Child {
    spawn_server_at(&Place::local(), bin, data_dir, ports, extra, envs).await
}

/// Starts `bin serve` in `place` (a namespace of a test net, or loopback),
/// listening on its address at ports `grpc`/`http`, with its data in
/// `data_dir`, the `extra` flags and `envs`, and waits until its gRPC port
/// answers. Beyond loopback it serves without authentication
/// (`--insecure`: the test's own namespaces). Its log (stderr) is appended
/// to `serve-{grpc}.log` in `data_dir`, so a server restarted on the same
/// port keeps its predecessor's log. A server that exits while starting,
/// or does not answer within 30 s, fails the test with the tail of that
/// log.
pub async fn spawn_server_at(
    place: &Place,
    bin: &Path,
    data_dir: &Path,
    (grpc, http): (u16, u16),
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Child {
    let log_path = data_dir.join(format!("serve-{grpc}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap();
    let mut command = place.command(bin);
    command
        .envs(envs.iter().copied())
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--grpc-addr")
        .arg(place.addr(grpc).to_string())
        .arg("--http-addr")
        .arg(place.addr(http).to_string())
        // Receivers and push workers of tests listen on loopback.
        .args(["--egress-allow", "127.0.0.0/8,::1"])
        .args(extra)
        .env_remove("TASKMESH_SERVER")
        .stdout(Stdio::null())
        .stderr(log);
    if !place.is_loopback() {
        command.arg("--insecure");
    }
    let what = format!("taskmesh serve on {}", place.addr(grpc));
    let mut child = Child::spawn(&mut command, &what, Some(log_path.clone()));
    let addr = place.addr(grpc);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        child.assert_alive();
        if answers(addr).await {
            return child;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not answer within 30 s; its log {}:\n{}",
            log_path.display(),
            log_tail(&log_path)
        );
        // Polling interval of a condition with a deadline.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn answers(addr: SocketAddr) -> bool {
    let Ok(ep) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
        return false;
    };
    let Ok(ch) = ep.connect().await else {
        return false;
    };
    // A server with --auth answers too: it refuses the tokenless call.
    match TaskApiClient::new(ch)
        .list_tasks(pb::ListTasksRequest::default())
        .await
    {
        Ok(_) => true,
        Err(status) => status.code() == tonic::Code::Unauthenticated,
    }
}

/// `taskmesh worker` as a process: a stream worker by default, push mode
/// with [`push`](Self::push); its log goes to `worker-{id}.log` in the
/// directory given.
pub struct WorkerProcess {
    bin: PathBuf,
    id: String,
    servers: Vec<String>,
    log_dir: PathBuf,
    handlers: String,
    concurrency: u32,
    ledger: Option<PathBuf>,
    push_listen: Option<String>,
    start_stamps: Option<PathBuf>,
    place: Place,
}

impl WorkerProcess {
    /// Worker `id` of `bin`, trying `servers` (URLs) in that order, with
    /// the handlers `echo,sleep` and 4 slots.
    pub fn new(bin: &Path, id: &str, servers: &[String], log_dir: &Path) -> Self {
        Self {
            bin: bin.to_path_buf(),
            id: id.into(),
            servers: servers.to_vec(),
            log_dir: log_dir.to_path_buf(),
            handlers: "echo,sleep".into(),
            concurrency: 4,
            ledger: None,
            push_listen: None,
            start_stamps: None,
            place: Place::local(),
        }
    }

    /// The handlers it serves (comma-separated built-ins).
    pub fn handlers(mut self, handlers: &str) -> Self {
        self.handlers = handlers.into();
        self
    }

    /// Its slots.
    pub fn concurrency(mut self, slots: u32) -> Self {
        self.concurrency = slots;
        self
    }

    /// Writes a line per execution to `path` (`--ledger`).
    pub fn ledger(mut self, path: &Path) -> Self {
        self.ledger = Some(path.to_path_buf());
        self
    }

    /// Push mode, serving `taskmesh.v1.Worker` on `listen` (`--push-listen`).
    pub fn push(mut self, listen: &str) -> Self {
        self.push_listen = Some(listen.into());
        self
    }

    /// Stamps each execution's start (`task_id unix_micros`, this host's
    /// clock) into `path` (`--start-stamps`; see [`read_start_stamps`]).
    pub fn start_stamps(mut self, path: &Path) -> Self {
        self.start_stamps = Some(path.to_path_buf());
        self
    }

    /// Runs it in `place` (a namespace of a test net).
    pub fn at(mut self, place: &Place) -> Self {
        self.place = place.clone();
        self
    }

    /// Starts it. With a ledger, waits until the worker has opened it (so a
    /// missing ledger later means something went wrong, never "it had not
    /// started yet").
    pub async fn spawn(self) -> Child {
        let log_path = self.log_dir.join(format!("worker-{}.log", self.id));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut command = self.place.command(&self.bin);
        command
            .arg("worker")
            .arg("--server")
            .arg(self.servers.join(","))
            .args(["--worker-id", &self.id, "--handlers", &self.handlers])
            .arg("--concurrency")
            .arg(self.concurrency.to_string())
            .env_remove("TASKMESH_SERVER")
            .env_remove("TASKMESH_PUSH_LISTEN")
            .env_remove("TASKMESH_PUSH_ADVERTISE")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(ledger) = &self.ledger {
            command.arg("--ledger").arg(ledger);
        }
        if let Some(stamps) = &self.start_stamps {
            command.arg("--start-stamps").arg(stamps);
        }
        if let Some(listen) = &self.push_listen {
            command.arg("--push-listen").arg(listen);
        }
        let mut child = Child::spawn(
            &mut command,
            &format!("taskmesh worker {}", self.id),
            Some(log_path.clone()),
        );
        if let Some(ledger) = &self.ledger {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !ledger.exists() {
                child.assert_alive();
                assert!(
                    Instant::now() < deadline,
                    "worker {} did not open its ledger {} within 10 s; its log:\n{}",
                    self.id,
                    ledger.display(),
                    log_tail(&log_path)
                );
                // Polling interval of a condition with a deadline.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        child
    }
}

/// One line of a worker's ledger: an execution, written before it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerLine {
    pub task_id: String,
    pub attempt: i64,
    pub execution_id: String,
    pub worker_id: String,
}

/// Every line of the ledger at `path`. A missing file or a line that is
/// not whole fails the test.
pub fn read_ledger(path: &Path) -> Vec<LedgerLine> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the ledger {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(
                f.len(),
                4,
                "a whole ledger line in {}: {line:?}",
                path.display()
            );
            LedgerLine {
                task_id: f[0].into(),
                attempt: f[1]
                    .parse()
                    .unwrap_or_else(|_| panic!("an attempt number in {line:?}")),
                execution_id: f[2].into(),
                worker_id: f[3].into(),
            }
        })
        .collect()
}

/// The start stamps a worker wrote with [`WorkerProcess::start_stamps`]:
/// (task id, microseconds since the Unix epoch), one per execution; a
/// missing file is none.
pub fn read_start_stamps(path: &Path) -> Vec<(String, i64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (id, us) = line.split_once(' ')?;
            Some((id.to_string(), us.parse().ok()?))
        })
        .collect()
}
