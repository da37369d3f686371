//! CPU idle percentage from `/proc/stat` deltas.

/// Cumulative jiffies from the aggregate `cpu` line: (idle, total).
fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if fields.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]:
    // guest time is already counted in user/nice, so only the first 8 count.
    let total = fields.iter().take(8).sum();
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    Some((idle, total))
}

/// Samples the CPU idle percentage between successive calls.
#[derive(Debug, Default)]
pub(crate) struct CpuSampler {
    last: Option<(u64, u64)>,
}

impl CpuSampler {
    /// Idle percentage since the previous sample (since boot on the first);
    /// 100.0 when `/proc/stat` is unavailable.
    pub(crate) fn sample(&mut self) -> f64 {
        let Some(now) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_proc_stat(&t))
        else {
            return 100.0;
        };
        let (prev_idle, prev_total) = self.last.replace(now).unwrap_or((0, 0));
        idle_percent(
            now.0.saturating_sub(prev_idle),
            now.1.saturating_sub(prev_total),
        )
    }
}

fn idle_percent(idle: u64, total: u64) -> f64 {
    if total == 0 {
        return 100.0;
    }
    (idle as f64 / total as f64 * 100.0).clamp(0.0, 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_aggregate_line() {
        let text = "cpu  10 0 10 70 10 0 0 0 5 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_proc_stat(text), Some((80, 100)));
        assert_eq!(parse_proc_stat("intr 1 2"), None);
    }

    #[test]
    fn percent_of_delta() {
        assert_eq!(idle_percent(25, 100), 25.0);
        assert_eq!(idle_percent(0, 0), 100.0);
    }

    #[test]
    fn sample_is_a_percentage() {
        let mut s = CpuSampler::default();
        for _ in 0..2 {
            let v = s.sample();
            assert!((0.0..=100.0).contains(&v), "{v}");
        }
    }
}
