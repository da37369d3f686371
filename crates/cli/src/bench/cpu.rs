//! CPU time of processes and threads, for the load scenarios' "CPU used"
//! column: `getrusage` for this process and the calling thread, and
//! `/proc/<pid>/stat` for worker processes (Linux).

use std::time::Duration;

/// User plus system CPU time of this whole process so far.
pub fn process() -> Duration {
    rusage(libc::RUSAGE_SELF)
}

/// User plus system CPU time of the calling OS thread so far.
pub fn thread() -> Duration {
    rusage(libc::RUSAGE_THREAD)
}

fn rusage(who: libc::c_int) -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a properly sized, writable rusage; getrusage only
    // writes into it and reports failure by its return value.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage returned 0, so it filled the struct (and it was
    // zeroed before, so every field is initialised either way).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// User plus system CPU time of process `pid` so far, from
/// `/proc/<pid>/stat` (clock-tick resolution, usually 10 ms). `None` when it
/// cannot be read (the process is gone, or this is not Linux).
pub fn of_pid(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text, ticks_per_second())
}

/// User plus system CPU time so far of each process whose command name is
/// `comm` (e.g. the `postgres` server's backends), by pid, from `/proc`.
pub fn of_command(comm: &str) -> Processes {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Processes::default();
    };
    let ticks = ticks_per_second();
    Processes(
        dir.filter_map(|e| e.ok())
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let text = std::fs::read_to_string(e.path().join("stat")).ok()?;
                let name = text
                    .find('(')
                    .zip(text.rfind(')'))
                    .map(|(a, b)| &text[a + 1..b]);
                (name == Some(comm)).then_some(())?;
                Some((pid, parse_stat(&text, ticks)?))
            })
            .collect(),
    )
}

/// CPU time so far by pid ([`of_command`]).
#[derive(Debug, Clone, Default)]
pub struct Processes(pub std::collections::HashMap<u32, Duration>);

impl Processes {
    /// The CPU these processes used since `earlier`: each one's growth
    /// (all of it for one started since). One that ended meanwhile counts
    /// for nothing, where a difference of sums took its whole past off
    /// the others' (the `--ended` runs on Postgres read 0.0 s of database
    /// CPU; which backend ended was not looked into).
    pub fn since(&self, earlier: &Processes) -> Duration {
        self.0
            .iter()
            .map(|(pid, now)| now.saturating_sub(earlier.0.get(pid).copied().unwrap_or_default()))
            .sum()
    }

    /// These and `other`'s together.
    pub fn with(mut self, other: Processes) -> Self {
        self.0.extend(other.0);
        self
    }
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The
/// command name (field 2) may hold spaces and parentheses, so fields are
/// counted after its last `)`.
fn parse_stat(text: &str, ticks_per_second: u64) -> Option<Duration> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime + stime;
    Some(Duration::from_micros(
        ticks * 1_000_000 / ticks_per_second.max(1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let line = "4242 (taskmesh (w) 1) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 8 0 100 0 0";
        assert_eq!(parse_stat(line, 100), Some(Duration::from_secs(2)));
        assert_eq!(parse_stat("garbage", 100), None);
    }

    #[test]
    fn a_process_that_ended_takes_nothing_off_the_others() {
        let s = Duration::from_secs;
        let before = Processes([(1, s(100)), (2, s(5))].into());
        let after = Processes([(2, s(7)), (3, s(1))].into());
        assert_eq!(after.since(&before), s(3), "2 grew by 2 s, 3 is new");
        assert_eq!(before.since(&before), Duration::ZERO);
    }

    #[test]
    fn this_process_and_thread_have_used_some_cpu() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(process() > Duration::ZERO);
        assert!(thread() > Duration::ZERO);
        assert!(process() >= thread());
        let own = of_pid(std::process::id()).expect("own /proc entry");
        assert!(own <= process() + Duration::from_millis(20));
    }
}
