//! A private MariaDB: `mariadb-install-db` and `mariadbd` in a temporary
//! directory.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::is_root;
use crate::process::{Child, free_port, log_tail};

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
