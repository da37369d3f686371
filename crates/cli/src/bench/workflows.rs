//! `--scenario workflows`: `--tasks` workflows (default 10,000) of ten
//! `echo` steps each — a root, eight steps that depend on it, and a join of
//! the eight — submitted (`SubmitWorkflow`, four calls in flight, at
//! `--rate` workflows per second if given, else as fast as accepted) while
//! `--workers` drain them. Unpaced, the release latency includes the wait
//! behind every step already READY; paced below the drain rate, it is the
//! release itself. Reports steps and workflows completed per second
//! (first to last step end, as the store recorded them) and the step
//! release latency: from the instant a step's last parent ended (the
//! parent's `ended_at`, the transaction that released the step) to the
//! step entering DISPATCHING (the claim that sent it) and RUNNING (its
//! worker's ACK), as the store recorded them (millisecond resolution).

use std::time::Instant;

use serde::Serialize;
use taskmesh::v1 as pb;
use taskmesh_core::workflow::WorkflowRecord;

use super::Percentiles;
use super::load::{self, CpuReport, LoadArgs, Recorder, Rig, WorkersAs};

/// Steps of each workflow: a root, eight children, a join.
pub const STEPS: usize = 10;
/// Default number of workflows.
pub const DEFAULT_WORKFLOWS: usize = 10_000;

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct WorkflowsReport {
    /// `workflows`.
    pub scenario: &'static str,
    /// The store.
    pub store: String,
    /// Workflows submitted.
    pub workflows: u64,
    /// Steps of each.
    pub steps_per_workflow: usize,
    /// Workers.
    pub workers: usize,
    /// Slots per worker.
    pub worker_concurrency: u32,
    /// Where the workers ran.
    pub workers_as: WorkersAs,
    /// The submit pace asked for (`--rate`), workflows per second.
    pub rate: Option<f64>,
    /// Workflows submitted per second while submitting.
    pub submit_per_s: f64,
    /// Workflows that SUCCEEDED.
    pub succeeded: u64,
    /// Workflows in any other state at the end (should be 0).
    pub not_succeeded: u64,
    /// First to last step end, in seconds.
    pub drain_s: f64,
    /// Steps completed per second over that span.
    pub steps_per_s: f64,
    /// Workflows completed per second over that span.
    pub workflows_per_s: f64,
    /// Last parent's end → the step DISPATCHING.
    pub release_to_dispatch: Percentiles,
    /// Last parent's end → the step RUNNING (its worker's ACK).
    pub release_to_running: Percentiles,
    /// CPU over the whole run.
    pub cpu: CpuReport,
}

/// The request of one workflow.
fn request() -> pb::SubmitWorkflowRequest {
    let step = |name: String, deps: Vec<String>| pb::WorkflowStepSpec {
        after_parents_end: false,
        name,
        depends_on: deps,
        template: Some(pb::TaskTemplate {
            handler: "echo".into(),
            payload: Some(pb::Payload {
                data: b"{}".to_vec(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        }),
    };
    let middle: Vec<String> = (1..STEPS - 1).map(|i| format!("m{i}")).collect();
    let mut steps = vec![step("root".into(), Vec::new())];
    steps.extend(middle.iter().map(|m| step(m.clone(), vec!["root".into()])));
    steps.push(step("join".into(), middle));
    pb::SubmitWorkflowRequest {
        steps,
        ..Default::default()
    }
}

/// Submits `n` workflows, four calls in flight, at `rate` per second when
/// given (else as fast as they are accepted); returns their ids.
async fn submit(
    api: pb::task_api_client::TaskApiClient<tonic::transport::Channel>,
    n: usize,
    rate: Option<f64>,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::with_capacity(n);
    let mut calls = tokio::task::JoinSet::new();
    let mut queued = 0;
    let t0 = tokio::time::Instant::now();
    while queued < n || !calls.is_empty() {
        while queued < n && calls.len() < 4 {
            if let Some(rate) = rate {
                let due = t0 + std::time::Duration::from_secs_f64(queued as f64 / rate);
                if tokio::time::Instant::now() < due {
                    // Pacing of an open-loop arrival schedule.
                    tokio::time::sleep_until(due).await;
                }
            }
            queued += 1;
            let mut api = api.clone();
            calls.spawn(async move { api.submit_workflow(request()).await });
        }
        if let Some(done) = calls.join_next().await {
            ids.push(done??.into_inner().workflow_id);
        }
    }
    Ok(ids)
}

/// Runs the scenario.
pub async fn run(args: &LoadArgs, workflows: usize) -> anyhow::Result<WorkflowsReport> {
    args.validate()?;
    anyhow::ensure!(
        (1..=1_000_000).contains(&workflows),
        "--tasks (workflows) must be 1..=1000000"
    );
    let mut rig = Rig::start(args).await?;
    let recorder = Recorder::start(rig.node.store.clone(), false);
    let result = async {
        rig.start_workers(args).await?;
        let mark = rig.cpu_mark();
        let steps = (workflows * STEPS) as u64;
        let rate = args.rate;
        let started = Instant::now();
        let (ids, generator_cpu) =
            load::submit_while_draining(&rig, &recorder, steps, move |api| async move {
                submit(api, workflows, rate).await
            })
            .await?;
        let submit_s = started.elapsed().as_secs_f64();
        let cpu = rig.cpu_since(&mark, generator_cpu, steps);
        let store = rig.node.store.clone();
        let mut read = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(w) = store.get_workflow(id).await? {
                read.push(w);
            }
        }
        Ok::<_, anyhow::Error>(measure(args, &rig, submit_s, read, cpu))
    }
    .await;
    load::end_run(recorder, rig).await;
    result
}

fn measure(
    args: &LoadArgs,
    rig: &Rig,
    submit_s: f64,
    read: Vec<WorkflowRecord>,
    cpu: CpuReport,
) -> WorkflowsReport {
    let new_hist = || hdrhistogram::Histogram::<u64>::new(3).expect("a histogram");
    let (mut dispatch, mut running) = (new_hist(), new_hist());
    let (mut first_end, mut last_end) = (i64::MAX, i64::MIN);
    let mut succeeded = 0u64;
    for w in &read {
        if w.state == taskmesh_core::workflow::WorkflowState::Succeeded {
            succeeded += 1;
        }
        let ended: std::collections::HashMap<&str, Option<i64>> = w
            .steps
            .iter()
            .filter_map(|t| Some((t.workflow.as_ref()?.step.as_str(), t.times.end)))
            .collect();
        for t in &w.steps {
            if let Some(end) = t.times.end {
                first_end = first_end.min(end);
                last_end = last_end.max(end);
            }
            let Some(link) = &t.workflow else { continue };
            let release = link
                .depends_on
                .iter()
                .filter_map(|p| ended.get(p.as_str()).copied().flatten())
                .max();
            let Some(release) = release else { continue };
            let us = |at: Option<i64>| at.map(|at| (at - release).max(0) as u64 * 1_000);
            if let Some(v) = us(t.times.dispatching) {
                let _ = dispatch.record(v);
            }
            if let Some(v) = us(t.times.running) {
                let _ = running.record(v);
            }
        }
    }
    let drain_ms = if last_end >= first_end {
        (last_end - first_end).max(1) as f64
    } else {
        0.0
    };
    let steps_done: u64 = read
        .iter()
        .map(|w| {
            w.steps
                .iter()
                .filter(|t| t.state == taskmesh_core::TaskState::Succeeded)
                .count() as u64
        })
        .sum();
    let per_s = |n: u64| {
        if drain_ms > 0.0 {
            n as f64 * 1_000.0 / drain_ms
        } else {
            0.0
        }
    };
    WorkflowsReport {
        scenario: "workflows",
        store: rig.store_label.clone(),
        workflows: read.len() as u64,
        steps_per_workflow: STEPS,
        workers: args.workers,
        worker_concurrency: args.worker_concurrency,
        workers_as: args.workers_as,
        rate: args.rate,
        submit_per_s: read.len() as f64 / submit_s.max(f64::MIN_POSITIVE),
        succeeded,
        not_succeeded: read.len() as u64 - succeeded,
        drain_s: drain_ms / 1_000.0,
        steps_per_s: per_s(steps_done),
        workflows_per_s: per_s(succeeded),
        release_to_dispatch: Percentiles::of(&dispatch),
        release_to_running: Percentiles::of(&running),
        cpu,
    }
}

/// Prints the report as a table.
pub fn print(r: &WorkflowsReport) {
    let p = |x: &Percentiles| {
        format!(
            "{:.1} / {:.1} / {:.1} / {:.1} (n={})",
            x.p50_ms, x.p90_ms, x.p99_ms, x.max_ms, x.count
        )
    };
    let mut rows = vec![
        ("store".into(), r.store.clone()),
        (
            "workflows × steps".into(),
            format!("{} × {}", r.workflows, r.steps_per_workflow),
        ),
        (
            "workers × slots".into(),
            format!(
                "{} × {} ({:?})",
                r.workers, r.worker_concurrency, r.workers_as
            ),
        ),
        (
            "submitted workflows/s".into(),
            format!("{:.0}", r.submit_per_s),
        ),
        (
            "succeeded / other".into(),
            format!("{} / {}", r.succeeded, r.not_succeeded),
        ),
        ("drain (s)".into(), format!("{:.2}", r.drain_s)),
        ("steps/s".into(), format!("{:.0}", r.steps_per_s)),
        ("workflows/s".into(), format!("{:.0}", r.workflows_per_s)),
        (
            "release → dispatch p50/p90/p99/max ms".into(),
            p(&r.release_to_dispatch),
        ),
        (
            "release → running p50/p90/p99/max ms".into(),
            p(&r.release_to_running),
        ),
    ];
    rows.extend(load::cpu_rows(&r.cpu));
    load::print_rows("workflows", &rows);
}
