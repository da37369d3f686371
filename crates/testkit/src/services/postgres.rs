//! A private Postgres: `initdb` and `pg_ctl` in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::is_root;
use crate::netns::Place;
use crate::process::free_port;

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
fn pg_command(place: &Place, tool: &Path) -> Command {
    if is_root() {
        let mut c = place.command("runuser");
        c.args(["-u", "postgres", "--"]).arg(tool);
        c
    } else {
        place.command(tool)
    }
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
    place: Place,
    _dir: tempfile::TempDir,
}

impl PrivatePostgres {
    /// Creates and starts the server; waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_at(&Place::local())
    }

    /// Creates and starts the server in `place` (a namespace of a test
    /// net), listening on its address; waits until it accepts connections.
    pub fn start_at(place: &Place) -> Self {
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
        let out = pg_command(&Place::local(), &bin.join("initdb"))
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
        if !place.is_loopback() {
            // initdb trusts loopback only; the test net's hosts connect
            // from their own addresses.
            use std::io::Write;
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))
                .expect("open pg_hba.conf");
            writeln!(hba, "host all all 10.0.0.0/8 trust").unwrap();
        }
        let this = Self {
            port: free_port(),
            data,
            run,
            bin,
            log,
            place: place.clone(),
            _dir: dir,
        };
        this.start_again();
        this
    }

    /// Starts the (stopped) server again on the same port and data
    /// directory; waits until it accepts connections.
    pub fn start_again(&self) {
        let settings = format!(
            "-p {} -k {} -c listen_addresses={} -c fsync=off \
             -c full_page_writes=off -c max_connections=200",
            self.port,
            self.run.display(),
            self.place.ip
        );
        let out = pg_command(&self.place, &self.bin.join("pg_ctl"))
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
        let out = pg_command(&self.place, &self.bin.join("pg_ctl"))
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

    /// `postgres://postgres@{ip}:{port}/postgres` (`127.0.0.1` unless
    /// started in a namespace).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@{}/postgres",
            self.place.addr(self.port)
        )
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // Immediate: nothing in it is worth a checkpoint. Best effort: a
        // failing test must not fail again here.
        let _ = pg_command(&self.place, &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
