//! Fire-time arithmetic: when a cron expression or an interval fires next,
//! in a given IANA time zone, DST included.
//!
//! Cron fields are matched on the *wall clock* of the schedule's zone: the
//! expression is evaluated on naive local date-times (croner over UTC, which
//! has no DST), and each match is then placed on the time line:
//! - a wall time inside a spring-forward gap fires once, at the first valid
//!   instant after the gap (the transition itself);
//! - a wall time inside a fall-back overlap fires once, at its first
//!   occurrence: the second pass over the same wall times fires nothing.
//!
//! Fire times never come earlier than asked: `next_after(t)` is strictly
//! after `t`.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex};

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::{
    Cron,
    parser::{CronParser, Seconds},
};

use crate::UnixMillis;

mod dst;
pub use dst::dst_notes;

/// Longest search through cron matches before giving up (a pattern such as
/// "30 February" never matches).
const MAX_STEPS: usize = 100_000;

/// How fire times are produced.
#[derive(Debug, Clone)]
pub enum Timetable {
    /// A cron expression read in a time zone.
    Cron {
        /// The parsed expression (shared: see [`cached_cron`]).
        cron: Arc<Cron>,
        /// The zone its fields are read in.
        tz: Tz,
    },
    /// Every `interval_ms`, counted from `anchor`.
    FixedRate {
        /// The first fire is `anchor + interval_ms`.
        anchor: UnixMillis,
        /// The period.
        interval_ms: i64,
    },
    /// `interval_ms` after the previous run ended (see [`Timetable::next_after`]).
    FixedDelay {
        /// The delay.
        interval_ms: i64,
    },
}

/// Every IANA zone name [`parse_zone`] accepts, for documents that list them.
pub fn zone_names() -> impl Iterator<Item = &'static str> {
    chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name())
}

/// Parses an IANA zone name; empty means UTC.
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    if name.is_empty() {
        return Ok(Tz::UTC);
    }
    Tz::from_str(name).map_err(|_| format!("time_zone {name:?} is not an IANA time zone name"))
}

/// Parses a cron expression of 5 fields (minute hour day month weekday) or 6
/// fields (second first). Weekdays are POSIX: 0 or 7 is Sunday.
pub fn parse_cron(expr: &str) -> Result<Cron, String> {
    let fields = expr.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "cron_expression {expr:?} has {fields} fields; use 5 (minute hour day month weekday) or 6 (second first)"
        ));
    }
    // An empty element in a list (",5", "5,", "1,,2"): the parser takes
    // a leading one as an empty set, and finding that such an expression
    // never fires took seconds of search per call (found by fuzzing).
    if let Some((n, field)) = expr
        .split_whitespace()
        .enumerate()
        .find(|(_, f)| f.starts_with(',') || f.ends_with(',') || f.contains(",,"))
    {
        return Err(format!(
            "cron_expression {expr:?}: field {} ({field:?}) has an empty list element",
            n + 1
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| format!("cron_expression {expr:?} is invalid: {e}"))
}

/// Most parsed expressions [`cached_cron`] keeps; past it the cache starts
/// over (a fleet has far fewer distinct expressions than schedules).
const CRON_CACHE_LEN: usize = 16_384;

/// Parsed cron expressions by their text.
static CRON_CACHE: LazyLock<Mutex<HashMap<String, Arc<Cron>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// [`parse_cron`], remembered: the scheduler plans every due schedule in
/// each round, and parsing an expression costs several times finding its
/// next fire (`cargo bench -p taskmesh-core --bench fires`). Only
/// expressions that parse are kept, at most [`CRON_CACHE_LEN`].
pub fn cached_cron(expr: &str) -> Result<Arc<Cron>, String> {
    let cache = || CRON_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cron) = cache().get(expr) {
        return Ok(cron.clone());
    }
    let cron = Arc::new(parse_cron(expr)?);
    let mut cache = cache();
    if cache.len() >= CRON_CACHE_LEN {
        cache.clear();
    }
    cache.insert(expr.to_owned(), cron.clone());
    Ok(cron)
}

impl Timetable {
    /// The first fire time strictly after `after`, or `None` if there is
    /// none (a cron that never matches; fixed delay, which depends on runs).
    pub fn next_after(&self, after: UnixMillis) -> Option<UnixMillis> {
        match self {
            Timetable::Cron { cron, tz } => next_cron(cron, *tz, after),
            Timetable::FixedRate {
                anchor,
                interval_ms,
            } => {
                let interval = (*interval_ms).max(1);
                if after < *anchor + interval {
                    return Some(anchor + interval);
                }
                let k = (after - anchor) / interval + 1;
                Some(anchor + k * interval)
            }
            Timetable::FixedDelay { .. } => None,
        }
    }

    /// The next fire of a fixed-delay schedule whose previous run ended at
    /// `ended_at`; for other kinds, the same as [`Timetable::next_after`].
    pub fn next_after_run(&self, ended_at: UnixMillis) -> Option<UnixMillis> {
        match self {
            Timetable::FixedDelay { interval_ms } => Some(ended_at + interval_ms),
            other => other.next_after(ended_at),
        }
    }
}

fn next_cron(cron: &Cron, tz: Tz, after: UnixMillis) -> Option<UnixMillis> {
    let after_dt = DateTime::<Utc>::from_timestamp_millis(after)?;
    // Walk wall-clock matches, starting from the wall time of `after`.
    let mut cursor = naive_as_utc(after_dt.with_timezone(&tz).naive_local());
    for _ in 0..MAX_STEPS {
        let next = cron.find_next_occurrence(&cursor, false).ok()?;
        let at = place(tz, next.naive_utc())?;
        if at > after {
            return Some(at);
        }
        cursor = next;
    }
    None
}

fn naive_as_utc(naive: NaiveDateTime) -> DateTime<Utc> {
    Utc.from_utc_datetime(&naive)
}

/// The instant of a wall time in `tz`: the only one, the first of two
/// (fall-back overlap), or the end of the gap it falls in (spring forward).
fn place(tz: Tz, wall: NaiveDateTime) -> Option<UnixMillis> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(dt) => Some(dt.timestamp_millis()),
        LocalResult::Ambiguous(first, _) => Some(first.timestamp_millis()),
        LocalResult::None => gap_end(tz, wall),
    }
}

/// The first instant whose wall time in `tz` is at or after `wall`, for a
/// `wall` inside a gap: binary search over the ±15 h that contain every
/// offset (no zone has two transitions that close together).
fn gap_end(tz: Tz, wall: NaiveDateTime) -> Option<UnixMillis> {
    let base = naive_as_utc(wall).timestamp_millis();
    let mut lo = base - 15 * 3_600_000;
    let mut hi = base + 15 * 3_600_000;
    let wall_at = |ms: UnixMillis| -> Option<NaiveDateTime> {
        let utc = DateTime::<Utc>::from_timestamp_millis(ms)?;
        let offset = tz.offset_from_utc_datetime(&utc.naive_utc()).fix();
        Some(utc.naive_utc() + chrono::Duration::seconds(i64::from(offset.local_minus_utc())))
    };
    // Invariant: wall_at(lo) < wall <= wall_at(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if wall_at(mid)? >= wall {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests;
