//! Scratch databases on the machine's shared Postgres and MariaDB.

use taskmesh_store::DatabaseKind;

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
