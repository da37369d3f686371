//! The text format of a wake-up: what one process tells the others it
//! committed, sent by `pg_notify` on Postgres and as rows of the `changes`
//! table on MySQL.
//!
//! A payload is text, under 7,900 bytes (Postgres refuses 8000 and more):
//! the sending store's origin id on the first line, then one line per
//! change, `t<TAB>task_id<TAB>state<TAB>version<TAB>next_at<TAB>c` (`c` is
//! `1` when the change queued a callback, else `0`; a line without the
//! field, from a replica of an older release, counts a terminal state as
//! one), then `<TAB>1` when the change may have freed room in a
//! concurrency key (absent otherwise, so a line of an unkeyed task reads
//! the same as before keys existed), or
//! `s<TAB>schedule_id<TAB>next_fire_at` (empty for none), ids escaped so
//! they cannot break the format. A store skips payloads of its own origin:
//! it published those itself right after the commit. A line that cannot be
//! sent or read becomes a resync.

use taskmesh_core::TaskState;

use crate::{ScheduleChange, TaskChange};

/// Payloads stay under this many bytes (Postgres refuses 8000 and more).
const MAX_PAYLOAD: usize = 7_900;

/// The line that stands for changes too long to send: receivers resync.
const LAG_LINE: &str = "l";

/// Builds the payloads of one commit.
pub(crate) struct Payloads<'a> {
    origin: &'a str,
    done: Vec<String>,
    current: String,
}

impl<'a> Payloads<'a> {
    pub(crate) fn new(origin: &'a str) -> Self {
        Self {
            origin,
            done: Vec::new(),
            current: String::new(),
        }
    }

    pub(crate) fn task(&mut self, c: &TaskChange) {
        let next = c.next_at.map(|n| n.to_string()).unwrap_or_default();
        let line = format!(
            "t\t{}\t{}\t{}\t{next}\t{}{}",
            escape(&c.task_id),
            c.state.as_str(),
            c.version,
            u8::from(c.callback),
            if c.frees_key { "\t1" } else { "" }
        );
        self.line(line);
    }

    pub(crate) fn schedule(&mut self, c: &ScheduleChange) {
        let next = c.next_fire_at.map(|n| n.to_string()).unwrap_or_default();
        self.line(format!("s\t{}\t{next}", escape(&c.schedule_id)));
    }

    fn line(&mut self, line: String) {
        let line = if self.origin.len() + 1 + line.len() > MAX_PAYLOAD {
            LAG_LINE.to_string()
        } else {
            line
        };
        if !self.current.is_empty() && self.current.len() + 1 + line.len() > MAX_PAYLOAD {
            self.done.push(std::mem::take(&mut self.current));
        }
        if self.current.is_empty() {
            self.current.push_str(self.origin);
        }
        self.current.push('\n');
        self.current.push_str(&line);
    }

    /// The payloads, each under the limit; none for no change.
    pub(crate) fn finish(mut self) -> Vec<String> {
        if !self.current.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

/// The payloads announcing `tasks` and `schedules`.
pub(crate) fn payloads<'t, 's>(
    origin: &str,
    tasks: impl IntoIterator<Item = &'t TaskChange>,
    schedules: impl IntoIterator<Item = &'s ScheduleChange>,
) -> Vec<String> {
    let mut p = Payloads::new(origin);
    for c in tasks {
        p.task(c);
    }
    for c in schedules {
        p.schedule(c);
    }
    p.finish()
}

/// A payload that only tells listeners to resync.
pub(crate) fn resync_payload(origin: &str) -> String {
    format!("{origin}\n{LAG_LINE}")
}

/// What one payload announces.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Decoded {
    pub(crate) tasks: Vec<TaskChange>,
    pub(crate) schedules: Vec<ScheduleChange>,
    /// Something could not be sent or read: subscribers must resync.
    pub(crate) lag: bool,
}

/// Reads a payload; `None` when it is `own_origin`'s.
pub(crate) fn decode(payload: &str, own_origin: &str) -> Option<Decoded> {
    let mut lines = payload.split('\n');
    if lines.next()? == own_origin {
        return None;
    }
    let mut out = Decoded::default();
    for line in lines {
        match decode_line(line) {
            Some(Line::Task(c)) => out.tasks.push(c),
            Some(Line::Schedule(c)) => out.schedules.push(c),
            None => {
                if line != LAG_LINE {
                    tracing::warn!(line, "unreadable change notification; resyncing");
                }
                out.lag = true;
            }
        }
    }
    Some(out)
}

enum Line {
    Task(TaskChange),
    Schedule(ScheduleChange),
}

fn decode_line(line: &str) -> Option<Line> {
    let fields: Vec<&str> = line.split('\t').collect();
    let millis = |s: &str| -> Option<Option<i64>> {
        if s.is_empty() {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    match fields.as_slice() {
        ["t", id, state, version, next, rest @ ..] if rest.len() <= 2 => {
            let state = TaskState::parse(state)?;
            let (callback, frees_key) = match rest {
                [] => (state.is_terminal(), false),
                ["1"] => (true, false),
                ["0"] => (false, false),
                ["1", "1"] => (true, true),
                ["0", "1"] => (false, true),
                _ => return None,
            };
            Some(Line::Task(TaskChange {
                task_id: unescape(id)?,
                state,
                version: version.parse().ok()?,
                next_at: millis(next)?,
                callback,
                frees_key,
            }))
        }
        ["s", id, next] => Some(Line::Schedule(ScheduleChange {
            schedule_id: unescape(id)?,
            next_fire_at: millis(next)?,
        })),
        _ => None,
    }
}

fn escape(id: &str) -> String {
    if !id.contains(['%', '\t', '\n']) {
        return id.to_string();
    }
    id.replace('%', "%25")
        .replace('\t', "%09")
        .replace('\n', "%0A")
}

fn unescape(id: &str) -> Option<String> {
    if !id.contains('%') {
        return Some(id.to_string());
    }
    let mut out = String::with_capacity(id.len());
    let mut rest = id;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "09" => '\t',
            "0A" => '\n',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(id: &str, next_at: Option<i64>) -> TaskChange {
        TaskChange {
            task_id: id.into(),
            state: TaskState::Ready,
            version: 7,
            next_at,
            callback: false,
            frees_key: false,
        }
    }

    #[test]
    fn payloads_round_trip_and_stay_under_the_limit() {
        let tasks: Vec<TaskChange> = (0..500)
            .map(|i| change(&format!("task-{i:05}-0123456789abcdef"), Some(i)))
            .collect();
        let schedules = vec![
            ScheduleChange {
                schedule_id: "odd\tid\nwith%".into(),
                next_fire_at: None,
            },
            ScheduleChange {
                schedule_id: "plain".into(),
                next_fire_at: Some(42),
            },
        ];
        let out = payloads("origin-a", &tasks, &schedules);
        assert!(out.len() > 1, "500 changes do not fit one payload");
        let mut got = Decoded::default();
        for p in &out {
            assert!(p.len() < 8_000, "payload of {} bytes", p.len());
            assert!(decode(p, "origin-a").is_none(), "own payloads are skipped");
            let d = decode(p, "origin-b").expect("decoded");
            got.tasks.extend(d.tasks);
            got.schedules.extend(d.schedules);
            assert!(!d.lag);
        }
        assert_eq!(got.tasks, tasks);
        assert_eq!(got.schedules, schedules);
        assert!(payloads("o", &[], &[]).is_empty());
    }

    #[test]
    fn oversized_and_garbled_lines_become_a_resync() {
        let huge = change(&"x".repeat(9_000), None);
        let out = payloads("o", [&huge, &change("small", None)], &[]);
        let d = decode(&out[0], "other").expect("decoded");
        assert!(d.lag);
        assert_eq!(d.tasks, [change("small", None)]);
        for garbled in [
            "o\nt\tid\tNOPE\t1\t",
            "o\nt\tid\tREADY\tx\t",
            "o\nq",
            "o\ns\tbad%zz\t",
            "o\nt\tid\tSUCCEEDED\t1\t\tx",
            "o\nt\tid\tSUCCEEDED\t1\t\t1\t2",
            "o\nt\tid\tSUCCEEDED\t1\t\t1\t1\t1",
        ] {
            let d = decode(garbled, "other").expect("decoded");
            assert!(
                d.lag && d.tasks.is_empty() && d.schedules.is_empty(),
                "{garbled}"
            );
        }
    }

    #[test]
    fn a_change_that_queued_a_callback_says_so_and_older_lines_count_terminal_ones() {
        let mut ended = change("ended", None);
        ended.state = TaskState::Succeeded;
        ended.callback = true;
        let mut quiet = change("quiet", None);
        quiet.state = TaskState::Succeeded;
        let out = payloads("o", &[ended.clone(), quiet.clone()], &[]);
        let d = decode(&out[0], "other").expect("decoded");
        assert_eq!(d.tasks, [ended, quiet]);
        // A replica of the previous release sends five fields.
        let old = decode("o\nt\tid\tFAILED\t3\t\nt\tid2\tREADY\t1\t", "other").expect("decoded");
        assert!(!old.lag);
        assert!(
            old.tasks[0].callback,
            "a terminal change may have queued one"
        );
        assert!(!old.tasks[1].callback);
    }

    #[test]
    fn a_change_that_may_free_a_concurrency_key_says_so_and_others_read_as_before() {
        let mut freed = change("freed", None);
        freed.state = TaskState::Succeeded;
        freed.frees_key = true;
        let mut both = freed.clone();
        both.callback = true;
        let plain = change("plain", None);
        let out = payloads("o", &[freed.clone(), both.clone(), plain.clone()], &[]);
        assert!(
            out[0].ends_with("t\tplain\tREADY\t7\t\t0"),
            "an unkeyed change has the five fields and the callback flag: {}",
            out[0]
        );
        let d = decode(&out[0], "other").expect("decoded");
        assert!(!d.lag);
        assert_eq!(d.tasks, [freed, both, plain]);
    }
}
