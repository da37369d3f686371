//! A full disk under a real `taskmesh serve` on SQLite: its data directory
//! is a small tmpfs of the test's own (mounted here, so the test needs
//! root, as `make faults` and CI have). A ballast file takes the free space
//! while tasks are submitted and run; then it is removed.
//!
//! What must hold: submits refused while the disk is full answer
//! RESOURCE_EXHAUSTED or UNAVAILABLE with a message that says the disk is
//! full; the node stays up; it resumes by itself once space returns; every
//! accepted task succeeds exactly once (an execution beyond the first is a
//! later attempt whose earlier one did not succeed); no refused task is
//! stored; and the file passes `PRAGMA integrity_check` after a SIGKILL.
//!
//! `cargo test -p taskmesh-cli --test faults_disk -- --nocapture` prints the
//! scenario's summary line.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use taskmesh_testkit::process::spawn_server;
use taskmesh_testkit::{Ledger, counting_worker, free_port, json_task, wait_for};
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");

/// The tmpfs: room for the database while it is small, not for long.
const DISK: &str = "24m";
/// Free space left beside the ballast: a few commits' worth.
const LEAVE: u64 = 192 * 1024;
/// Each task's payload: the disk fills within a few hundred tasks.
const PAYLOAD: usize = 4 * 1024;
/// Parallel submit loops.
const SUBMITTERS: usize = 4;
/// Refusals to see before space is given back.
const REFUSALS: usize = 20;
/// Tasks accepted (and running) before the disk fills.
const BEFORE: usize = 300;
/// At least this long with the disk full.
const FULL_FOR: Duration = Duration::from_secs(3);

/// A size-limited tmpfs mounted on a temporary directory, unmounted when
/// dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a tmpfs of {size} for the data directory and needs root \
             (run it as root, as `make faults` and CI do): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file must not keep it mounted.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the filesystem of `path`'s directory with `path`, leaving about
/// `leave` bytes free.
fn ballast(path: &Path, leave: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("write the ballast: {e}"),
        }
    }
    f.set_len(written.saturating_sub(leave)).unwrap();
    f.sync_all().unwrap();
}

/// Waits (60 s at most) until task `id` SUCCEEDED; returns it.
async fn succeeded(api: &TaskApiClient<Channel>, id: &str) -> pb::Task {
    taskmesh_testkit::wait_task_state(api, id, pb::TaskState::Succeeded, Duration::from_secs(60))
        .await
}

/// What the submit loops share: a stop flag and the refusals seen so far.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    accepted: AtomicUsize,
    refusals: AtomicUsize,
}

/// Submits echo tasks until told to stop; returns the accepted ids and
/// the refusals.
async fn submit_loop(
    mut api: TaskApiClient<Channel>,
    shared: Arc<Shared>,
) -> (Vec<String>, Vec<tonic::Status>) {
    let payload = serde_json::to_vec(&serde_json::json!({ "pad": "x".repeat(PAYLOAD) })).unwrap();
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    // Bounded: at most this many submits per loop.
    for _ in 0..20_000 {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let call = api.submit_task(json_task("echo", &payload));
        match call.await {
            Ok(r) => {
                accepted.push(r.into_inner().task_id);
                shared.accepted.fetch_add(1, Ordering::Relaxed);
            }
            Err(status) => {
                refused.push(status);
                shared.refusals.fetch_add(1, Ordering::Relaxed);
                // Not a synchronisation: a refused client backs off a little.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    (accepted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_submits_clearly_loses_nothing_and_resumes_by_itself() {
    let disk = Tmpfs::mount(DISK);
    let data = disk.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], grpc).into();
    let mut server = spawn_server(BIN.as_ref(), &data, (grpc, http), &[], &[]).await;
    let api = taskmesh_testkit::api(addr).await;
    let ledger = Ledger::default();
    let worker = counting_worker(&[addr], "disk-w", 8, ledger.clone());
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

    // Load, then the disk fills under it.
    let shared = Arc::new(Shared::default());
    let loops: Vec<_> = (0..SUBMITTERS)
        .map(|_| tokio::spawn(submit_loop(api.clone(), shared.clone())))
        .collect();
    wait_for(
        "tasks accepted before the disk fills",
        Duration::from_secs(60),
        || {
            let n = shared.accepted.load(Ordering::Relaxed);
            async move { (n >= BEFORE).then_some(()) }
        },
    )
    .await;
    let ballast_path = disk.path().join("ballast");
    ballast(&ballast_path, LEAVE);
    let full_at = Instant::now();
    wait_for(
        "submits refused on the full disk",
        Duration::from_secs(60),
        || {
            let n = shared.refusals.load(Ordering::Relaxed);
            // The disk stays full for a while, the worker's reports meeting it too.
            let long = full_at.elapsed() >= FULL_FOR;
            async move { (n >= REFUSALS && long).then_some(()) }
        },
    )
    .await;
    server.assert_alive();
    std::fs::remove_file(&ballast_path).unwrap();
    let freed_at = Instant::now();
    let full_ms = full_at.elapsed().as_millis();
    // Resumes by itself: a submit succeeds again.
    let probe = wait_for(
        "a submit accepted after space returned",
        Duration::from_secs(30),
        || {
            let mut api = api.clone();
            async move {
                api.submit_task(json_task("echo", b"{}"))
                    .await
                    .ok()
                    .map(|r| r.into_inner().task_id)
            }
        },
    )
    .await;
    let resumed_ms = freed_at.elapsed().as_millis();
    shared.stop.store(true, Ordering::Relaxed);
    let mut accepted = vec![probe];
    let mut refused = Vec::new();
    for l in loops {
        let (a, r) = l.await.unwrap();
        accepted.extend(a);
        refused.extend(r);
    }
    for status in &refused {
        assert!(
            matches!(
                status.code(),
                tonic::Code::ResourceExhausted | tonic::Code::Unavailable
            ),
            "a submit on a full disk answers RESOURCE_EXHAUSTED or UNAVAILABLE, not {:?}: {}",
            status.code(),
            status.message()
        );
        let m = status.message().to_lowercase();
        assert!(
            m.contains("full") || m.contains("space"),
            "the refusal says the disk is full: {:?}",
            status.message()
        );
    }

    // Every accepted task succeeds, exactly once.
    let mut executions_beyond = 0u32;
    for id in &accepted {
        let t = succeeded(&api, id).await;
        let succeeded = t
            .attempts
            .iter()
            .filter(|a| a.outcome == pb::AttemptOutcome::Succeeded as i32)
            .count();
        assert_eq!(succeeded, 1, "task {id} succeeded once: {t:?}");
        let ran = ledger.count(id);
        assert!(ran >= 1, "task {id} ran");
        assert!(
            ran as usize <= t.attempts.len(),
            "task {id}: each execution is an attempt ({ran} executions, {} attempts)",
            t.attempts.len()
        );
        executions_beyond += ran - 1;
    }
    worker.stop().await;

    // Nothing refused was stored; the file is whole after a SIGKILL.
    server.kill();
    let db = data.join("taskmesh.db");
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(&db))
        .await
        .unwrap();
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(check, "ok", "PRAGMA integrity_check after the full disk");
    let stored: Vec<String> = sqlx::query_scalar("SELECT id FROM tasks WHERE handler = 'echo'")
        .fetch_all(&pool)
        .await
        .unwrap();
    let stored: HashSet<String> = stored.into_iter().collect();
    let accepted_set: HashSet<&String> = accepted.iter().collect();
    assert_eq!(accepted.len(), accepted_set.len(), "ids are unique");
    for id in &accepted {
        assert!(stored.contains(id), "accepted task {id} is stored");
    }
    assert_eq!(stored.len(), accepted.len(), "nothing refused was stored");
    let mut codes: HashMap<String, usize> = HashMap::new();
    for s in &refused {
        *codes.entry(format!("{:?}", s.code())).or_default() += 1;
    }
    println!(
        "fault disk-full: accepted {} lost 0 succeeded-twice 0 extra-executions {} \
         (each a later attempt after one that did not succeed) refused {} {:?} \
         full {} ms, resumed {} ms after space returned; integrity ok; first refusal: {:?}",
        accepted.len(),
        executions_beyond,
        refused.len(),
        codes,
        full_ms,
        resumed_ms,
        refused[0].message()
    );
}

/// An ext4 filesystem on a loop device over an image file, mounted on a
/// temporary directory; unmounted and detached when dropped.
struct LoopDisk {
    dir: tempfile::TempDir,
    device: String,
}

impl LoopDisk {
    fn new(size_mb: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size_mb << 20)
            .unwrap();
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("run a disk tool");
            assert!(
                out.status.success(),
                "{cmd:?} failed (the slow-disk test needs root, losetup and mkfs.ext4): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let device = run(Command::new("losetup").args(["-f", "--show"]).arg(&image));
        let this = Self { dir, device };
        std::fs::create_dir(this.mount_point()).unwrap();
        run(Command::new("mount")
            .arg(&this.device)
            .arg(this.mount_point()));
        this
    }

    fn mount_point(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// `major:minor` of the loop device.
    fn dev_numbers(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.device).unwrap().rdev();
        format!("{}:{}", libc::major(rdev), libc::minor(rdev))
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mount_point()).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// A blkio cgroup (v1) of the test's own, throttling writes to one device
/// for the processes put in it; removed when dropped.
struct Throttle {
    dir: PathBuf,
    device: String,
}

impl Throttle {
    fn new(device: String) -> Self {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/blkio/taskmesh-slow-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
            panic!(
                "create {} (the slow-disk test throttles writes with the blkio cgroup): {e}",
                dir.display()
            )
        });
        Self { dir, device }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// Write operations per second allowed to the device; 0 lifts the limit.
    fn write_iops(&self, iops: u32) {
        std::fs::write(
            self.dir.join("blkio.throttle.write_iops_device"),
            format!("{} {iops}", self.device),
        )
        .unwrap();
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.dir.join("blkio.throttle.write_iops_device"),
            format!("{} 0", self.device),
        );
        // Its processes are gone by now (the server is dropped first); a
        // cgroup with members cannot be removed, so move stragglers out.
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/blkio/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Submit-call latencies of `n` echo tasks, one after the other: the
/// accepted ids and the latencies in ms, sorted.
async fn timed_submits(api: &TaskApiClient<Channel>, n: usize) -> (Vec<String>, Vec<f64>) {
    let mut ids = Vec::with_capacity(n);
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let mut api = api.clone();
        let t = Instant::now();
        let r = api
            .submit_task(json_task("echo", b"{}"))
            .await
            .expect("a submit on a slow disk is accepted");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        ids.push(r.into_inner().task_id);
    }
    ms.sort_by(f64::total_cmp);
    (ids, ms)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disk_raises_latency_and_loses_nothing() {
    const SLOW_IOPS: u32 = 25;
    const EACH: usize = 100;
    let disk = LoopDisk::new(128);
    let throttle = Throttle::new(disk.dev_numbers());
    let data = disk.mount_point().join("data");
    std::fs::create_dir(&data).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], grpc).into();
    let mut server = spawn_server(BIN.as_ref(), &data, (grpc, http), &[], &[]).await;
    throttle.add(server.pid());
    let api = taskmesh_testkit::api(addr).await;
    let ledger = Ledger::default();
    let worker = counting_worker(&[addr], "slow-w", 8, ledger.clone());
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

    let (mut ids, fast) = timed_submits(&api, EACH).await;
    throttle.write_iops(SLOW_IOPS);
    let (slow_ids, slow) = timed_submits(&api, EACH).await;
    throttle.write_iops(0);
    ids.extend(slow_ids);
    for id in &ids {
        let t = succeeded(&api, id).await;
        assert_eq!(ledger.count(id), 1, "task {id} ran once: {t:?}");
    }
    worker.stop().await;
    server.assert_alive();
    drop(server);
    println!(
        "fault slow-disk: accepted {} lost 0 succeeded-twice 0 extra-executions 0; \
         submit p50 / p99: unthrottled {:.2} / {:.2} ms, {SLOW_IOPS} write IOPS {:.2} / {:.2} ms",
        ids.len(),
        pct(&fast, 0.5),
        pct(&fast, 0.99),
        pct(&slow, 0.5),
        pct(&slow, 0.99)
    );
    assert!(
        pct(&slow, 0.5) > pct(&fast, 0.5),
        "the throttle slowed the disk (else this test proves nothing): p50 {:.2} → {:.2} ms",
        pct(&fast, 0.5),
        pct(&slow, 0.5)
    );
}
