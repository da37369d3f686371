//! `Admin`: API tokens, and retention (`retention_api`). A token's secret
//! is returned once, at creation;
//! the store keeps its digest. Every creation and revocation is logged
//! with the token's public id (never the secret) and counted in
//! `taskmesh_tokens_total{op}`.

use taskmesh::v1 as pb;
use taskmesh_core::auth::{Role, TokenRecord, new_token};
use taskmesh_core::validate;
use tonic::{Request, Response, Status};
use tracing::info;

use crate::Error;
use crate::convert::{duration_millis, timestamp};
use crate::engine::Shared;
use crate::task_api::scope;

/// Tokens created and revoked, by `op`.
pub const TOKENS_TOTAL: &str = "taskmesh_tokens_total";

/// Longest token lifetime: ten years.
const MAX_TTL_MS: i64 = 10 * 366 * 24 * 3_600_000;

/// The `Admin` service.
#[derive(Clone)]
pub struct AdminService {
    shared: Shared,
}

impl AdminService {
    /// Builds the service over the shared state.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }
}

fn role_from_pb(value: i32) -> Result<Role, Error> {
    match pb::TokenRole::try_from(value) {
        Ok(pb::TokenRole::Admin) => Ok(Role::Admin),
        Ok(pb::TokenRole::Submitter) => Ok(Role::Submitter),
        Ok(pb::TokenRole::Reader) => Ok(Role::Reader),
        Ok(pb::TokenRole::Worker) => Ok(Role::Worker),
        _ => Err(Error::InvalidArgument(
            "role must be TOKEN_ROLE_ADMIN, TOKEN_ROLE_SUBMITTER, TOKEN_ROLE_READER or \
             TOKEN_ROLE_WORKER"
                .into(),
        )),
    }
}

fn role_to_pb(role: Role) -> pb::TokenRole {
    match role {
        Role::Admin => pb::TokenRole::Admin,
        Role::Submitter => pb::TokenRole::Submitter,
        Role::Reader => pb::TokenRole::Reader,
        Role::Worker => pb::TokenRole::Worker,
    }
}

/// The wire form of a token record: never its digest.
pub fn token_to_pb(t: &TokenRecord) -> pb::TokenInfo {
    pb::TokenInfo {
        token_id: t.id.clone(),
        name: t.name.clone(),
        namespace: t.namespace.clone(),
        role: role_to_pb(t.role) as i32,
        create_time: Some(timestamp(t.created_at)),
        expire_time: t.expires_at.map(timestamp),
        revoke_time: t.revoked_at.map(timestamp),
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        let role = role_from_pb(req.role)?;
        validate::short_text("name", &req.name).map_err(Error::InvalidArgument)?;
        let now = self.shared.clock.now_millis();
        let expires_at = match &req.ttl {
            None => None,
            Some(d) => match duration_millis(d) {
                Some(ms) if (1..=MAX_TTL_MS).contains(&ms) => Some(now + ms),
                _ => {
                    return Err(Error::InvalidArgument(
                        "ttl must be between 1 ms and 10 years".into(),
                    )
                    .into());
                }
            },
        };
        let (text, record) = new_token(&req.name, &namespace, role, now, expires_at);
        self.shared
            .store
            .create_token(&record)
            .await
            .map_err(Error::from)?;
        metrics::counter!(TOKENS_TOTAL, "op" => "create").increment(1);
        info!(token_id = %record.id, namespace = %record.namespace, role = %record.role, by = %who.principal, "token created");
        Ok(Response::new(pb::CreateTokenResponse {
            token: text,
            info: Some(token_to_pb(&record)),
        }))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let tokens = self
            .shared
            .store
            .list_tokens(Some(&namespace))
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListTokensResponse {
            tokens: tokens.iter().map(token_to_pb).collect(),
        }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let who = crate::auth::identity(&request);
        let id = request.into_inner().token_id;
        let not_found = || Error::NotFound(format!("token {id} not found"));
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::InvalidArgument(
                "token_id must be a token's public id (hex digits)".into(),
            )
            .into());
        }
        let store = &self.shared.store;
        // Another namespace's token is NOT_FOUND, as if it did not exist.
        let mut record = store
            .get_token(&id)
            .await
            .map_err(Error::from)?
            .filter(|t| who.namespace.as_ref().is_none_or(|ns| *ns == t.namespace))
            .ok_or_else(not_found)?;
        let now = self.shared.clock.now_millis();
        // False when it was revoked already: it keeps its first revocation.
        if store.revoke_token(&id, now).await.map_err(Error::from)? {
            record.revoked_at = Some(now);
        }
        self.shared.auth.forget(&id);
        metrics::counter!(TOKENS_TOTAL, "op" => "revoke").increment(1);
        info!(token_id = %id, namespace = %record.namespace, by = %who.principal, "token revoked");
        Ok(Response::new(pb::RevokeTokenResponse {
            token: Some(token_to_pb(&record)),
        }))
    }

    async fn get_retention(
        &self,
        request: Request<pb::GetRetentionRequest>,
    ) -> Result<Response<pb::GetRetentionResponse>, Status> {
        let (_, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let retention = crate::retention_api::get(&self.shared, &namespace).await?;
        Ok(Response::new(pb::GetRetentionResponse {
            retention: Some(retention),
        }))
    }

    async fn set_retention(
        &self,
        request: Request<pb::SetRetentionRequest>,
    ) -> Result<Response<pb::SetRetentionResponse>, Status> {
        let (who, namespace) = scope(&self.shared, &request, &request.get_ref().namespace)?;
        let answer = crate::retention_api::set(
            &self.shared,
            &namespace,
            &who.principal,
            request.into_inner(),
        )
        .await?;
        Ok(Response::new(pb::SetRetentionResponse {
            retention: Some(answer),
        }))
    }
}
