//! `taskmesh schedule create|get|list|update|pause|resume|delete|trigger`.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use taskmesh::v1 as pb;

use crate::client::{Common, Output, connect, print_json, status_error, to_duration, ts};

/// `taskmesh schedule …`.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Create a schedule.
    Create(Definition),
    /// Show a schedule and its recent fires.
    Get(IdArgs),
    /// List schedules.
    List(ListArgs),
    /// Replace a schedule's definition (give the whole definition again).
    Update {
        /// Schedule id.
        schedule_id: String,
        #[command(flatten)]
        def: Definition,
    },
    /// Stop a schedule from firing.
    Pause(IdArgs),
    /// Let a paused schedule fire again.
    Resume(IdArgs),
    /// Delete a schedule (its tasks are kept).
    Delete(IdArgs),
    /// Create a task from the schedule now.
    Trigger(IdArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Misfire {
    FireOnceNow,
    Skip,
    CatchUp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Overlap {
    Allow,
    Skip,
    CancelPrevious,
}

/// A schedule definition from flags.
#[derive(Debug, Args)]
struct Definition {
    /// Handler each fire runs.
    handler: String,
    /// Cron expression: 5 fields (minute first) or 6 (second first).
    #[arg(long, conflicts_with_all = ["every", "delay_after"])]
    cron: Option<String>,
    /// Fixed rate: fire every this long, e.g. 30s.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "delay_after")]
    every: Option<Duration>,
    /// Fixed delay: fire this long after the previous run ended.
    #[arg(long, value_parser = humantime::parse_duration)]
    delay_after: Option<Duration>,
    /// IANA time zone the cron expression is read in (default UTC).
    #[arg(long, default_value = "")]
    tz: String,
    /// Payload of each task.
    #[arg(long, default_value = "")]
    payload: String,
    /// A name for people.
    #[arg(long, default_value = "")]
    name: String,
    /// What to do with fire times missed while nothing was scheduling.
    #[arg(long, value_enum, default_value_t = Misfire::FireOnceNow)]
    misfire: Misfire,
    /// Most missed times fired by catch-up.
    #[arg(long, default_value_t = 10)]
    max_catch_up: u32,
    /// What to do when the previous run is still going.
    #[arg(long, value_enum, default_value_t = Overlap::Allow)]
    overlap: Overlap,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct IdArgs {
    /// Schedule id.
    schedule_id: String,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Page size (1-1000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Page token from a previous list.
    #[arg(long)]
    page_token: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// What each fire of `s` runs: its template's handler, or its workflow.
fn runs(s: &pb::Schedule) -> String {
    match (&s.template, &s.workflow) {
        (Some(t), _) => t.handler.clone(),
        (None, Some(w)) => format!(
            "workflow ({} steps{})",
            w.steps.len(),
            if w.on_failure.is_some() {
                " + on_failure"
            } else {
                ""
            }
        ),
        (None, None) => String::new(),
    }
}

impl Definition {
    fn to_pb(&self) -> anyhow::Result<pb::Schedule> {
        let (kind, interval) = match (&self.cron, self.every, self.delay_after) {
            (Some(_), None, None) => (pb::ScheduleKind::Cron, None),
            (None, Some(d), None) => (pb::ScheduleKind::FixedRate, Some(to_duration(d))),
            (None, None, Some(d)) => (pb::ScheduleKind::FixedDelay, Some(to_duration(d))),
            _ => anyhow::bail!("give exactly one of --cron, --every or --delay-after"),
        };
        let content_type = if serde_json::from_str::<serde_json::Value>(&self.payload).is_ok() {
            "application/json"
        } else {
            "text/plain"
        };
        Ok(pb::Schedule {
            name: self.name.clone(),
            kind: kind as i32,
            cron_expression: self.cron.clone().unwrap_or_default(),
            interval,
            time_zone: self.tz.clone(),
            template: Some(pb::TaskTemplate {
                handler: self.handler.clone(),
                payload: Some(pb::Payload {
                    data: self.payload.clone().into_bytes(),
                    content_type: content_type.into(),
                }),
                ..Default::default()
            }),
            misfire_policy: match self.misfire {
                Misfire::FireOnceNow => pb::MisfirePolicy::FireOnceNow,
                Misfire::Skip => pb::MisfirePolicy::Skip,
                Misfire::CatchUp => pb::MisfirePolicy::CatchUp,
            } as i32,
            max_catch_up: self.max_catch_up,
            overlap_policy: match self.overlap {
                Overlap::Allow => pb::OverlapPolicy::Allow,
                Overlap::Skip => pb::OverlapPolicy::Skip,
                Overlap::CancelPrevious => pb::OverlapPolicy::CancelPrevious,
            } as i32,
            paused: self.paused,
            ..Default::default()
        })
    }
}

fn print_schedule(s: &pb::Schedule) {
    let spec = if s.cron_expression.is_empty() {
        format!(
            "{} {}s",
            pb::ScheduleKind::try_from(s.kind)
                .map(|k| k.as_str_name())
                .unwrap_or("?"),
            s.interval.as_ref().map(|d| d.seconds).unwrap_or(0)
        )
    } else {
        format!(
            "cron {:?} in {}",
            s.cron_expression,
            if s.time_zone.is_empty() {
                "UTC"
            } else {
                &s.time_zone
            }
        )
    };
    println!("schedule_id: {}", s.schedule_id);
    println!("spec:        {spec}");
    println!("handler:     {}", runs(s));
    println!("paused:      {}", s.paused);
    println!("next fire:   {}", ts(&s.next_fire_time));
    println!(
        "last fire:   {}  (task {})",
        ts(&s.last_fire_time),
        s.last_task_id
    );
    println!(
        "fires:       {} created, {} skipped",
        s.fire_count, s.skipped_count
    );
}

fn out(
    common: &Common,
    resp: &impl prost::Message,
    name: &str,
    s: Option<&pb::Schedule>,
) -> anyhow::Result<()> {
    match common.output {
        Output::Json => print_json(resp, name),
        Output::Text => {
            if let Some(s) = s {
                print_schedule(s);
            }
            Ok(())
        }
    }
}

/// Runs a `schedule` subcommand.
pub async fn run(args: ScheduleArgs) -> anyhow::Result<()> {
    match args.command {
        ScheduleCommand::Create(def) => {
            let mut api = connect(&def.common).await?;
            let r = api
                .create_schedule(pb::CreateScheduleRequest {
                    schedule: Some(def.to_pb()?),
                    namespace: def.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            out(
                &def.common,
                &r,
                "taskmesh.v1.CreateScheduleResponse",
                r.schedule.as_ref(),
            )
        }
        ScheduleCommand::Get(a) => {
            let mut api = connect(&a.common).await?;
            let r = api
                .get_schedule(pb::GetScheduleRequest {
                    schedule_id: a.schedule_id,
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            out(
                &a.common,
                &r,
                "taskmesh.v1.GetScheduleResponse",
                r.schedule.as_ref(),
            )?;
            if a.common.output == Output::Text {
                for f in r.recent_fires.iter().take(10) {
                    let outcome = pb::FireOutcome::try_from(f.outcome)
                        .map(|o| o.as_str_name().trim_start_matches("FIRE_OUTCOME_"))
                        .unwrap_or("?");
                    println!("  fire {}  {outcome:<26} {}", ts(&f.fire_time), f.task_id);
                }
            }
            Ok(())
        }
        ScheduleCommand::List(a) => {
            let mut api = connect(&a.common).await?;
            let r = api
                .list_schedules(pb::ListSchedulesRequest {
                    page_size: a.limit,
                    namespace: a.common.namespace.clone(),
                    page_token: a.page_token.unwrap_or_default(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match a.common.output {
                Output::Json => print_json(&r, "taskmesh.v1.ListSchedulesResponse"),
                Output::Text => {
                    println!(
                        "{:<36}  {:<6}  {:<24}  NEXT FIRE",
                        "SCHEDULE_ID", "PAUSED", "HANDLER"
                    );
                    for s in &r.schedules {
                        let handler = runs(s);
                        println!(
                            "{:<36}  {:<6}  {:<24}  {}",
                            s.schedule_id,
                            s.paused,
                            handler,
                            ts(&s.next_fire_time)
                        );
                    }
                    if !r.next_page_token.is_empty() {
                        println!("next page: --page-token {}", r.next_page_token);
                    }
                    Ok(())
                }
            }
        }
        ScheduleCommand::Update { schedule_id, def } => {
            let mut api = connect(&def.common).await?;
            let r = api
                .update_schedule(pb::UpdateScheduleRequest {
                    schedule_id,
                    schedule: Some(def.to_pb()?),
                    namespace: def.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            out(
                &def.common,
                &r,
                "taskmesh.v1.UpdateScheduleResponse",
                r.schedule.as_ref(),
            )
        }
        ScheduleCommand::Pause(a) => {
            let mut api = connect(&a.common).await?;
            let r = api
                .pause_schedule(pb::PauseScheduleRequest {
                    schedule_id: a.schedule_id,
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            out(
                &a.common,
                &r,
                "taskmesh.v1.PauseScheduleResponse",
                r.schedule.as_ref(),
            )
        }
        ScheduleCommand::Resume(a) => {
            let mut api = connect(&a.common).await?;
            let r = api
                .resume_schedule(pb::ResumeScheduleRequest {
                    schedule_id: a.schedule_id,
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            out(
                &a.common,
                &r,
                "taskmesh.v1.ResumeScheduleResponse",
                r.schedule.as_ref(),
            )
        }
        ScheduleCommand::Delete(a) => {
            let mut api = connect(&a.common).await?;
            let r = api
                .delete_schedule(pb::DeleteScheduleRequest {
                    schedule_id: a.schedule_id.clone(),
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match a.common.output {
                Output::Json => print_json(&r, "taskmesh.v1.DeleteScheduleResponse"),
                Output::Text => {
                    println!("deleted {}", a.schedule_id);
                    Ok(())
                }
            }
        }
        ScheduleCommand::Trigger(a) => {
            let mut api = connect(&a.common).await?;
            let r = api
                .trigger_schedule(pb::TriggerScheduleRequest {
                    schedule_id: a.schedule_id,
                    namespace: a.common.namespace.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match a.common.output {
                Output::Json => print_json(&r, "taskmesh.v1.TriggerScheduleResponse"),
                Output::Text => {
                    let id = r
                        .task
                        .map(|t| t.task_id)
                        .context("no task in the response")?;
                    println!("{id}");
                    Ok(())
                }
            }
        }
    }
}
