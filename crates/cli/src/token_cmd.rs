//! `taskmesh token`: create, list and revoke API tokens through the
//! `Admin` service (any language can do the same from the contract).

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use taskmesh::v1::{self as pb, admin_client::AdminClient};

use crate::client::{Common, Output, print_json, status_error, to_duration, ts};

/// `taskmesh token`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Make a token and print its secret (shown this once; only a digest is
    /// kept). Needs an admin token of the namespace, or the bootstrap token.
    Create(CreateArgs),
    /// List the tokens of a namespace (never their secrets).
    List(ListArgs),
    /// Revoke a token by its public id.
    Revoke(RevokeArgs),
}

/// What a token may do within its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Everything in its namespace, tokens included.
    Admin,
    /// Submit, get, list, cancel, watch; schedules; breakers.
    Submitter,
    /// Get, list, watch; breakers.
    Reader,
    /// The Dispatcher service (a worker), and out-of-band ACKs.
    Worker,
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// The role of the new token.
    #[arg(long, value_enum)]
    role: Role,
    /// How long it is valid, e.g. 30d or 12h (default: it never expires).
    #[arg(long, value_parser = humantime::parse_duration)]
    expires: Option<std::time::Duration>,
    /// A name to recognise it by.
    #[arg(long, default_value = "")]
    name: String,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The token's public id (as `token list` shows it).
    token_id: String,
    #[command(flatten)]
    common: Common,
}

fn role_name(role: i32) -> &'static str {
    pb::TokenRole::try_from(role)
        .map(|r| r.as_str_name().trim_start_matches("TOKEN_ROLE_"))
        .unwrap_or("?")
}

fn print_info(t: &pb::TokenInfo) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let status = if t.revoke_time.is_some() {
        "revoked"
    } else if t.expire_time.as_ref().is_some_and(|e| e.seconds <= now) {
        "expired"
    } else {
        "live"
    };
    let expires = if t.expire_time.is_some() {
        ts(&t.expire_time)
    } else {
        "never".into()
    };
    println!(
        "{:<14}  {:<12}  {:<10}  {:<8}  {:<24}  {}",
        t.token_id,
        t.namespace,
        role_name(t.role),
        status,
        expires,
        t.name
    );
}

async fn admin(common: &Common) -> anyhow::Result<AdminClient<crate::client::Authorized>> {
    Ok(AdminClient::new(crate::client::channel(common).await?))
}

/// Runs a `token` subcommand.
pub async fn run(args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Create(a) => {
            let role = match a.role {
                Role::Admin => pb::TokenRole::Admin,
                Role::Submitter => pb::TokenRole::Submitter,
                Role::Reader => pb::TokenRole::Reader,
                Role::Worker => pb::TokenRole::Worker,
            };
            let r = admin(&a.common)
                .await?
                .create_token(pb::CreateTokenRequest {
                    namespace: a.common.namespace.clone(),
                    role: role as i32,
                    name: a.name,
                    ttl: a.expires.map(to_duration),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match a.common.output {
                Output::Json => {
                    let id = r
                        .info
                        .as_ref()
                        .map(|i| i.token_id.clone())
                        .unwrap_or_default();
                    let out = serde_json::json!({ "token": r.token, "id": id });
                    println!("{}", serde_json::to_string_pretty(&out)?);
                }
                // The secret alone on stdout, so `> file` keeps just it; the
                // rest goes to stderr.
                Output::Text => {
                    println!("{}", r.token);
                    if let Some(info) = &r.info {
                        eprintln!(
                            "token {} ({} of namespace {}): this secret is shown once",
                            info.token_id,
                            role_name(info.role),
                            info.namespace
                        );
                    }
                }
            }
            Ok(())
        }
        TokenCommand::List(a) => {
            let r = admin(&a.common)
                .await?
                .list_tokens(pb::ListTokensRequest {
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match a.common.output {
                Output::Json => print_json(&r, "taskmesh.v1.ListTokensResponse"),
                Output::Text => {
                    println!(
                        "{:<14}  {:<12}  {:<10}  {:<8}  {:<24}  NAME",
                        "TOKEN_ID", "NAMESPACE", "ROLE", "STATUS", "EXPIRES"
                    );
                    for t in &r.tokens {
                        print_info(t);
                    }
                    Ok(())
                }
            }
        }
        TokenCommand::Revoke(a) => {
            let r = admin(&a.common)
                .await?
                .revoke_token(pb::RevokeTokenRequest {
                    token_id: a.token_id,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            let t = r.token.context("the server answered without the token")?;
            match a.common.output {
                Output::Json => print_json(&t, "taskmesh.v1.TokenInfo"),
                Output::Text => {
                    print_info(&t);
                    Ok(())
                }
            }
        }
    }
}
