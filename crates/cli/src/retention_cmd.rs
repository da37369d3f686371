//! `taskmesh retention`: show and set how long a namespace's ended tasks
//! are kept, through `Admin.GetRetention` / `Admin.SetRetention`.

use clap::{Args, Subcommand};
use taskmesh::v1::{self as pb, admin_client::AdminClient};

use crate::client::{Common, Output, print_json, status_error, to_duration, ts};

/// `taskmesh retention`.
#[derive(Debug, Args)]
pub struct RetentionArgs {
    #[command(subcommand)]
    command: RetentionCommand,
}

#[derive(Debug, Subcommand)]
enum RetentionCommand {
    /// Show the horizons in effect (server, namespace, handlers) and the
    /// oldest ended task kept per state.
    Show(ShowArgs),
    /// Set the namespace's horizons, or one handler's with --handler. This
    /// replaces that level's horizons: a state not given inherits (handler,
    /// then namespace, then the server's flags); none given clears it.
    Set(SetArgs),
}

#[derive(Debug, Args)]
struct ShowArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct SetArgs {
    /// One handler's horizons instead of the namespace's.
    #[arg(long, default_value = "")]
    handler: String,
    /// Keep SUCCEEDED tasks this long after they ended (at least 1m).
    #[arg(long, value_parser = humantime::parse_duration)]
    succeeded: Option<std::time::Duration>,
    /// Keep FAILED tasks this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    failed: Option<std::time::Duration>,
    /// Keep TIMED_OUT tasks this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    timed_out: Option<std::time::Duration>,
    /// Keep CANCELLED tasks this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    cancelled: Option<std::time::Duration>,
    #[command(flatten)]
    common: Common,
}

/// Runs a `retention` subcommand.
pub async fn run(args: RetentionArgs) -> anyhow::Result<()> {
    let (common, answer) = match args.command {
        RetentionCommand::Show(a) => {
            let r = admin(&a.common)
                .await?
                .get_retention(pb::GetRetentionRequest {
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map(|r| r.into_inner().retention);
            (a.common, r)
        }
        RetentionCommand::Set(a) => {
            let r = admin(&a.common)
                .await?
                .set_retention(pb::SetRetentionRequest {
                    namespace: a.common.namespace.clone(),
                    handler: a.handler,
                    horizons: Some(pb::RetentionHorizons {
                        succeeded: a.succeeded.map(to_duration),
                        failed: a.failed.map(to_duration),
                        timed_out: a.timed_out.map(to_duration),
                        cancelled: a.cancelled.map(to_duration),
                    }),
                })
                .await
                .map(|r| r.into_inner().retention);
            (a.common, r)
        }
    };
    let r = answer.map_err(status_error)?.unwrap_or_default();
    match common.output {
        Output::Json => print_json(&r, "taskmesh.v1.NamespaceRetention"),
        Output::Text => {
            print_text(&r);
            Ok(())
        }
    }
}

async fn admin(common: &Common) -> anyhow::Result<AdminClient<crate::client::Authorized>> {
    Ok(AdminClient::new(crate::client::channel(common).await?))
}

fn print_text(r: &pb::NamespaceRetention) {
    println!("namespace {}", r.namespace);
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>10}",
        "", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"
    );
    let row = |label: &str, h: Option<pb::RetentionHorizons>, unset: &str| {
        let h = h.unwrap_or_default();
        let f = |d: Option<prost_types::Duration>| match d {
            Some(d) => {
                humantime::format_duration(std::time::Duration::from_secs(d.seconds.max(0) as u64))
                    .to_string()
            }
            None => unset.to_string(),
        };
        println!(
            "{label:<22} {:>10} {:>10} {:>10} {:>10}",
            f(h.succeeded),
            f(h.failed),
            f(h.timed_out),
            f(h.cancelled)
        );
    };
    row("server", r.server, "forever");
    row("namespace (set)", r.namespace_set, "-");
    row("namespace (in effect)", r.effective, "forever");
    for h in &r.handlers {
        row(&format!("handler {}", h.handler), h.effective, "forever");
    }
    for o in &r.oldest {
        let state = pb::TaskState::try_from(o.state)
            .map(|s| s.as_str_name().trim_start_matches("TASK_STATE_"))
            .unwrap_or("?");
        println!(
            "oldest {state} kept: {} (ended {})",
            o.task_id,
            ts(&o.end_time)
        );
    }
}
