//! `taskmesh bench`: load generators and measurers, one per scenario. Each
//! prints a table (or JSON with `--output json`) of what it measured; the
//! numbers and the exact commands go to docs/BENCHMARKS.md.

mod cpu;
mod cron;
mod fairness;
mod fill;
mod fleet;
mod latency;
mod load;
mod scratch;
mod skew;
mod throughput;
mod workflows;

use clap::{Args, ValueEnum};
use serde::Serialize;

/// Which scenario to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Fire lateness of schedules (scheduled instant → dispatch) for each
    /// trigger engine.
    Cron,
    /// Workers of mixed speed, tasks of mixed duration, Poisson arrivals:
    /// makespan and wait (submit → start) per balancer strategy.
    Skew,
    /// Completed tasks/s end to end: `--tasks` drained by `--workers`
    /// running `echo` (pre-inserted, or `--mode continuous`).
    Throughput,
    /// Submit → dispatch / start / complete percentiles at a fixed
    /// arrival `--rate` for `--duration`.
    Latency,
    /// A quiet namespace's wait (at `--rate`, default 100/s, for
    /// `--duration`) alone and beside one flooding with `--tasks` (default
    /// 200000).
    Fairness,
    /// A thousand workers (`--fleet`) connected to one node: the node's
    /// memory per connected worker, and the latency at `--rate` (default
    /// 1000/s) with and without them.
    Workers,
    /// `--tasks` workflows (default 10000) of ten `echo` steps (a root,
    /// eight children, a join): steps/s and the step release latency
    /// (last parent's end → the step dispatched / running).
    Workflows,
}

/// Output forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchOutput {
    /// A table for people.
    Table,
    /// JSON for machines.
    Json,
}

/// `taskmesh bench` flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The scenario to run.
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// Output form.
    #[arg(long, short, value_enum, default_value_t = BenchOutput::Table)]
    output: BenchOutput,
    /// Tasks per run (skew: default 1000; throughput: default 100000;
    /// fairness: the flood, default 200000; workflows: workflows, default
    /// 10000).
    #[arg(long)]
    tasks: Option<usize>,
    #[command(flatten)]
    cron: cron::CronArgs,
    #[command(flatten)]
    skew: skew::SkewArgs,
    #[command(flatten)]
    load: load::LoadArgs,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// From a histogram of microseconds.
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1_000.0;
        Self {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// Runs `taskmesh bench`.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::Cron => {
            let report = cron::run(&args.cron).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => cron::print(&report),
            }
        }
        Scenario::Skew => {
            let report = skew::run_args(&args.skew, args.tasks.unwrap_or(1_000)).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => skew::print(&report),
            }
        }
        Scenario::Throughput => {
            let tasks = args.tasks.unwrap_or(100_000);
            let report = throughput::run(&args.load, tasks).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => throughput::print(&report),
            }
        }
        Scenario::Fairness => {
            let flood = args.tasks.unwrap_or(fairness::DEFAULT_FLOOD);
            let report = fairness::run(&args.load, flood).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => fairness::print(&report),
            }
        }
        Scenario::Workers => {
            let report = fleet::run(&args.load).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => fleet::print(&report),
            }
        }
        Scenario::Workflows => {
            let n = args.tasks.unwrap_or(workflows::DEFAULT_WORKFLOWS);
            let report = workflows::run(&args.load, n).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => workflows::print(&report),
            }
        }
        Scenario::Latency => {
            let report = latency::run(&args.load).await?;
            match args.output {
                BenchOutput::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                BenchOutput::Table => latency::print(&report),
            }
        }
    }
    Ok(())
}
