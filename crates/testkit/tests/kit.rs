//! The kit's own promises: a process that died by itself fails its test
//! with its status and log, a shared-Redis prefix leaves no key behind, a
//! private MariaDB takes root over TCP without a password, a scratch
//! database goes away, and a background server that failed fails its stop.

use std::process::{Command, Stdio};
use std::time::Duration;

use taskmesh_store::DatabaseKind;
use taskmesh_testkit::background::BackgroundServer;
use taskmesh_testkit::db::{Arg, Db};
use taskmesh_testkit::process::{Child, log_tail};
use taskmesh_testkit::services::{PrivateMariadb, ScratchDb, SharedRedis};
use taskmesh_testkit::wait_for;

/// The message of a caught panic.
fn panic_text(err: Box<dyn std::any::Any + Send>) -> String {
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_child_that_died_by_itself_fails_with_its_status_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dies.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Child::spawn(
        Command::new("sh")
            .args(["-c", "echo 'the last words' >&2; exit 3"])
            .stdout(Stdio::null())
            .stderr(file),
        "a process that dies",
        Some(log.clone()),
    );
    // Wait (bounded) until it has exited.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !log_tail(&log).contains("the last words") {
        assert!(std::time::Instant::now() < deadline, "sh did not run");
        // Polling interval of a condition with a deadline.
        std::thread::sleep(Duration::from_millis(10));
    }
    let message = loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child.assert_alive())) {
            Err(e) => break panic_text(e),
            Ok(()) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the exit never showed"
                );
                // Polling interval of a condition with a deadline.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    assert!(message.contains("exited by itself"), "{message}");
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains(&log.display().to_string()), "{message}");
    assert!(message.contains("the last words"), "{message}");
}

#[test]
fn a_child_killed_by_the_test_is_no_failure() {
    let mut child = Child::spawn(
        Command::new("sleep").arg("600").stdout(Stdio::null()),
        "a sleeper",
        None,
    );
    child.assert_alive();
    child.kill();
    drop(child);
}

#[test]
fn a_shared_redis_prefix_is_deleted_when_dropped() {
    let shared = SharedRedis::new();
    let client = redis::Client::open(shared.url.as_str()).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("the machine's Redis (`make services`)");
    for i in 0..3 {
        let _: () = redis::cmd("SET")
            .arg(format!("{}k{i}", shared.prefix))
            .arg("v")
            .query(&mut conn)
            .unwrap();
    }
    assert_eq!(shared.keys(), 3);
    let prefix = shared.prefix.clone();
    drop(shared);
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut conn)
        .unwrap();
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_mariadb_takes_root_over_tcp_and_has_its_database() {
    let server = PrivateMariadb::start().await;
    let db = Db::connect(&server.url()).await;
    let Db::Mysql(pool) = &db else {
        panic!("a MySQL pool");
    };
    let (name,): (String,) = sqlx::query_as("SELECT DATABASE()")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(name, PrivateMariadb::DATABASE);
    sqlx::query("CREATE TABLE t (n BIGINT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES (1), (2), (3)")
        .execute(pool)
        .await
        .unwrap();
    let n = db
        .int("SELECT COUNT(*) FROM t WHERE n > $1", &[Arg::Int(1)])
        .await
        .unwrap();
    assert_eq!(n, Some(2), "placeholders are rewritten for MySQL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch_databases_are_dropped_with_their_handle() {
    for kind in [DatabaseKind::Postgres, DatabaseKind::Mysql] {
        let scratch = ScratchDb::create(kind).await;
        let url = scratch.url().to_string();
        let db = Db::connect(&url).await;
        assert_eq!(
            db.int("SELECT COUNT(*) FROM (SELECT 1 AS one) AS t", &[])
                .await
                .unwrap(),
            Some(1),
            "{kind:?} scratch database answers"
        );
        drop(db);
        drop(scratch);
        wait_for(
            &format!("{kind:?} scratch database to be gone"),
            Duration::from_secs(10),
            || async {
                let gone = match kind {
                    DatabaseKind::Postgres => sqlx::postgres::PgPoolOptions::new()
                        .max_connections(1)
                        .connect(&url)
                        .await
                        .is_err(),
                    DatabaseKind::Mysql => sqlx::mysql::MySqlPoolOptions::new()
                        .max_connections(1)
                        .connect(&url)
                        .await
                        .is_err(),
                };
                gone.then_some(())
            },
        )
        .await;
    }
}

#[tokio::test]
async fn a_background_server_that_failed_fails_its_stop() {
    let server = BackgroundServer::spawn("a failing server", |_| async {
        Err::<(), _>("bind: address in use")
    });
    wait_for("it to end", Duration::from_secs(5), || async {
        server.is_finished().then_some(())
    })
    .await;
    let stopped = tokio::spawn(server.stop()).await;
    let message = panic_text(stopped.expect_err("stop fails").into_panic());
    assert!(
        message.contains("a failing server failed: bind: address in use"),
        "{message}"
    );
}
