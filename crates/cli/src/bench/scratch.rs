//! The database a bench run on a server (Postgres, MySQL/MariaDB) makes for
//! itself next to the one its URL names, and drops at the end.

use anyhow::Context;
use taskmesh_store::DatabaseKind;
use taskmesh_store::urls::redact;

/// The database a run on a server made for itself, dropped at the end.
pub(super) enum Scratch {
    Postgres(taskmesh_store::postgres::scratch::ScratchDatabase),
    Mysql(taskmesh_store::mysql::scratch::ScratchDatabase),
}

impl Scratch {
    /// Creates one next to the database `url` names; returns it with the
    /// label the report gives the store (its durability settings included).
    pub(super) async fn create(kind: DatabaseKind, url: &str) -> anyhow::Result<(Self, String)> {
        Ok(match kind {
            DatabaseKind::Postgres => {
                let db = taskmesh_store::postgres::scratch::ScratchDatabase::create_on(url)
                    .await
                    .context("creating the bench database")?;
                let (fsync, sync) = db.durability().await?;
                let label = format!(
                    "postgres (own database on {}, fsync={fsync}, synchronous_commit={sync})",
                    redact(url)
                );
                (Self::Postgres(db), label)
            }
            DatabaseKind::Mysql => {
                let db =
                    taskmesh_store::mysql::scratch::ScratchDatabase::create_on(url, "tm_bench")
                        .await
                        .context("creating the bench database")?;
                let (flush, sync) = db.durability().await?;
                let label = format!(
                    "mysql (own database on {}, innodb_flush_log_at_trx_commit={flush}, \
                     sync_binlog={sync})",
                    redact(url)
                );
                (Self::Mysql(db), label)
            }
        })
    }

    pub(super) fn url(&self) -> &str {
        match self {
            Self::Postgres(db) => db.url(),
            Self::Mysql(db) => db.url(),
        }
    }

    pub(super) fn kind(&self) -> DatabaseKind {
        match self {
            Self::Postgres(_) => DatabaseKind::Postgres,
            Self::Mysql(_) => DatabaseKind::Mysql,
        }
    }

    pub(super) async fn drop_now(self) -> taskmesh_store::Result<()> {
        match self {
            Self::Postgres(db) => db.drop_now().await,
            Self::Mysql(db) => db.drop_now().await,
        }
    }
}
