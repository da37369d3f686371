//! `--scenario workers`: what a thousand connected workers cost one node.
//!
//! The node runs in this process with `--workers` worker processes; the
//! latency of an open loop at `--rate` (default 1,000/s) for `--duration`
//! is measured with them alone. Then one more process opens `--fleet`
//! workers (default 1,000; `worker --copies`), each on a connection and
//! stream of its own, all serving `echo`, and the same loop is measured
//! again, now dispatched across all of them. The node's resident memory is
//! read just before the fleet connects and once it has (and again after
//! the second loop): the difference divided by the fleet is what one
//! connected worker costs the server.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::latency::{self, Measured};
use super::load::{self, LoadArgs, Rig};

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// `workers`.
    pub scenario: &'static str,
    /// The store.
    pub store: String,
    /// Arrival rate of each measured loop, tasks/s.
    pub rate: f64,
    /// Workers connected for both loops.
    pub base_workers: usize,
    /// Workers the fleet added.
    pub fleet: u32,
    /// Slots of each fleet worker.
    pub fleet_concurrency: u32,
    /// From starting the fleet process to all of it connected, seconds.
    pub connect_s: f64,
    /// The node's (this process's) resident set before the fleet, KiB.
    pub rss_before_kib: u64,
    /// The same once the fleet is connected, KiB.
    pub rss_connected_kib: u64,
    /// The same after the second loop, KiB.
    pub rss_after_kib: u64,
    /// (connected − before) / fleet, KiB.
    pub rss_per_worker_kib: f64,
    /// The fleet process's own resident set, KiB (the client side).
    pub fleet_process_rss_kib: u64,
    /// The loop with the base workers only.
    pub without_fleet: Measured,
    /// The loop with the fleet connected.
    pub with_fleet: Measured,
}

/// Default fleet size.
pub const DEFAULT_FLEET: u32 = 1_000;

/// Runs the scenario.
pub async fn run(args: &LoadArgs) -> anyhow::Result<FleetReport> {
    args.validate()?;
    anyhow::ensure!(
        args.workers_as == load::WorkersAs::Processes,
        "--scenario workers measures the node's memory: its workers must be processes"
    );
    let rate = args.rate.unwrap_or(latency::DEFAULT_RATE);
    let tasks = (rate * args.duration.as_secs_f64()).round().max(1.0) as usize;
    let fleet = args.fleet;
    let fleet_concurrency = 8;
    let mut rig = Rig::start(args).await?;
    rig.stamp_starts()?;
    let result = async {
        rig.start_workers(args).await?;
        let without_fleet = latency::measure(&rig, tasks, rate).await?;
        let rss_before_kib = rss_kib(None)?;
        let started = Instant::now();
        rig.start_fleet(
            args,
            fleet,
            fleet_concurrency,
            "fleet",
            Duration::from_secs(120),
        )
        .await?;
        let connect_s = started.elapsed().as_secs_f64();
        let rss_connected_kib = rss_kib(None)?;
        let fleet_process_rss_kib = rig.last_worker_pid().map_or(Ok(0), |p| rss_kib(Some(p)))?;
        let with_fleet = latency::measure(&rig, tasks, rate).await?;
        let rss_after_kib = rss_kib(None)?;
        Ok::<_, anyhow::Error>(FleetReport {
            scenario: "workers",
            store: rig.store_label.clone(),
            rate,
            base_workers: args.workers,
            fleet,
            fleet_concurrency,
            connect_s,
            rss_before_kib,
            rss_connected_kib,
            rss_after_kib,
            rss_per_worker_kib: rss_connected_kib.saturating_sub(rss_before_kib) as f64
                / f64::from(fleet.max(1)),
            fleet_process_rss_kib,
            without_fleet,
            with_fleet,
        })
    }
    .await;
    rig.stop().await;
    result
}

/// VmRSS of this process (`None`) or of `pid`, in KiB.
pub(super) fn rss_kib(pid: Option<u32>) -> anyhow::Result<u64> {
    let path = match pid {
        None => "/proc/self/status".to_string(),
        Some(p) => format!("/proc/{p}/status"),
    };
    let text = std::fs::read_to_string(&path)?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in {path}"))
}

/// Prints the report as a table.
pub fn print(r: &FleetReport) {
    let p = |x: &super::Percentiles| format!("{:.2} / {:.2} / {:.2}", x.p50_ms, x.p99_ms, x.max_ms);
    let mut rows = vec![
        ("store".into(), r.store.clone()),
        ("arrivals".into(), format!("{:.0}/s per loop", r.rate)),
        (
            "workers".into(),
            format!(
                "{} processes; then + {} in one process ({} slots each)",
                r.base_workers, r.fleet, r.fleet_concurrency
            ),
        ),
        (
            "fleet connected in (s)".into(),
            format!("{:.1}", r.connect_s),
        ),
        (
            "server RSS before / connected / after (MiB)".into(),
            format!(
                "{:.1} / {:.1} / {:.1}",
                r.rss_before_kib as f64 / 1024.0,
                r.rss_connected_kib as f64 / 1024.0,
                r.rss_after_kib as f64 / 1024.0
            ),
        ),
        (
            "server RSS per connected worker (KiB)".into(),
            format!("{:.1}", r.rss_per_worker_kib),
        ),
        (
            "fleet process RSS (MiB)".into(),
            format!("{:.1}", r.fleet_process_rss_kib as f64 / 1024.0),
        ),
    ];
    for (label, m) in [
        ("without fleet", &r.without_fleet),
        ("with fleet", &r.with_fleet),
    ] {
        rows.push((
            format!("{label}: submit → dispatch p50/p99/max ms"),
            p(&m.submit_to_dispatch),
        ));
        rows.push((
            format!("{label}: submit → start p50/p99/max ms"),
            p(&m.submit_to_start),
        ));
        rows.push((
            format!("{label}: cpu per task (µs)"),
            format!("{:.1}", m.cpu.us_per_task),
        ));
        rows.push((
            format!("{label}: tasks, changes missed"),
            format!("{}, {}", m.tasks, m.missed_changes),
        ));
    }
    load::print_rows("workers", &rows);
}

#[cfg(test)]
mod tests {
    use super::rss_kib;

    #[test]
    fn rss_is_read_from_proc_and_a_missing_process_is_an_error() {
        let own = rss_kib(None).expect("this process's RSS");
        assert!(own > 0, "a running process has resident pages");
        let mine = rss_kib(Some(std::process::id())).expect("by pid");
        assert!(mine > 0);
        assert!(rss_kib(Some(u32::MAX)).is_err(), "no such process");
    }
}
