//! API tokens (stored as digests only) and the cluster key that derives
//! assignment secrets.

use taskmesh_core::UnixMillis;
use taskmesh_core::auth::{TokenRecord, new_cluster_key};

use super::rows::token_args;
use super::{Backend, SqlStore, args};
use crate::error::is_unique_violation;
use crate::{Error, Result, decode};

impl<B: Backend> SqlStore<B> {
    pub(super) async fn token_create(&self, token: &TokenRecord) -> Result<()> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        match b
            .exec(&mut tx, &b.sql().insert_token, token_args(token))
            .await
        {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {
                return Err(Error::AlreadyExists(format!(
                    "token {} already exists",
                    token.id
                )));
            }
            Err(err) => return Err(err.into()),
        }
        b.commit(tx).await
    }

    pub(super) async fn token_get(&self, id: &str) -> Result<Option<TokenRecord>> {
        let rows = self
            .backend()
            .read(&self.sql().get_token, args![id])
            .await?;
        rows.first().map(decode::token).transpose()
    }

    pub(super) async fn token_list(&self, namespace: Option<&str>) -> Result<Vec<TokenRecord>> {
        let rows = match namespace {
            None => {
                self.backend()
                    .read(&self.sql().list_tokens, Vec::new())
                    .await?
            }
            Some(ns) => {
                self.backend()
                    .read(&self.sql().list_tokens_in, args![ns])
                    .await?
            }
        };
        rows.iter().map(decode::token).collect()
    }

    pub(super) async fn token_revoke(&self, id: &str, now: UnixMillis) -> Result<bool> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let changed = b
            .exec(&mut tx, &b.sql().revoke_token, args![now, id])
            .await?;
        if changed == 0 {
            let exists = b.fetch(&mut tx, &b.sql().token_exists, args![id]).await?;
            if exists.is_empty() {
                return Err(Error::NotFound(format!("token {id}")));
            }
        }
        b.commit(tx).await?;
        Ok(changed > 0)
    }

    /// The cluster key, made on first use: every replica inserts a random
    /// one unless one is there, then reads whichever won.
    pub(super) async fn key(&self) -> Result<Vec<u8>> {
        let b = self.backend();
        let read = async || -> Result<Option<Vec<u8>>> {
            let rows = b.read(&b.sql().get_cluster_key, Vec::new()).await?;
            rows.first()
                .map(|r| decode::Columns::bytes(r, "value"))
                .transpose()
                .map_err(|e| Error::Internal(format!("bad cluster key row: {e}")))
        };
        if let Some(key) = read().await? {
            return Ok(key);
        }
        let mut tx = b.begin_write().await?;
        b.exec(
            &mut tx,
            &b.sql().insert_cluster_key,
            args![new_cluster_key()],
        )
        .await?;
        b.commit(tx).await?;
        read()
            .await?
            .ok_or_else(|| Error::Internal("the cluster key vanished".into()))
    }
}
