//! Plain-words notes on daylight-saving changes that touch a cron
//! schedule: a wall time it names that a spring-forward gap skips (it fires
//! at the gap's end instead) or that a fall-back overlap repeats (it fires
//! at the first pass only). For previews, so a person sees it before
//! saving the schedule.

use chrono::{DateTime, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;

use super::naive_as_utc;
use crate::UnixMillis;

const DAY_MS: i64 = 86_400_000;

/// Longest span looked through for changes (a preview of a yearly cron
/// reaches years ahead; ten are plenty).
const MAX_SPAN_MS: i64 = 10 * 366 * DAY_MS;

/// Notes on every offset change of `tz` in `(from, to]` where `cron`
/// names a wall time that the change skips or repeats.
pub fn dst_notes(cron: &Cron, tz: Tz, from: UnixMillis, to: UnixMillis) -> Vec<String> {
    let to = to.min(from.saturating_add(MAX_SPAN_MS));
    let mut notes = Vec::new();
    let mut t = from;
    while t < to {
        let step = (t + DAY_MS).min(to);
        let (before, after) = (offset_s(tz, t), offset_s(tz, step));
        if let (Some(before), Some(after)) = (before, after)
            && before != after
            && let Some(at) = change_at(tz, t, step)
            && let Some(note) = note(cron, tz, at, before, after)
        {
            notes.push(note);
        }
        t = step;
    }
    notes
}

/// The zone's offset from UTC at `ms`, in seconds.
fn offset_s(tz: Tz, ms: UnixMillis) -> Option<i32> {
    let utc = DateTime::<Utc>::from_timestamp_millis(ms)?;
    Some(
        tz.offset_from_utc_datetime(&utc.naive_utc())
            .fix()
            .local_minus_utc(),
    )
}

/// The first instant in `(lo, hi]` with the offset `hi` has.
fn change_at(tz: Tz, mut lo: UnixMillis, mut hi: UnixMillis) -> Option<UnixMillis> {
    let target = offset_s(tz, hi)?;
    while hi - lo > 1_000 {
        let mid = lo + (hi - lo) / 2;
        if offset_s(tz, mid)? == target {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // Offsets change on whole seconds.
    Some(hi - hi.rem_euclid(1_000))
}

fn wall(ms: UnixMillis, offset_s: i32) -> Option<NaiveDateTime> {
    let utc = DateTime::<Utc>::from_timestamp_millis(ms)?;
    Some(utc.naive_utc() + chrono::Duration::seconds(i64::from(offset_s)))
}

/// The first wall time `cron` names in `[start, end)`, if any.
fn first_match(cron: &Cron, start: NaiveDateTime, end: NaiveDateTime) -> Option<NaiveDateTime> {
    let found = cron
        .find_next_occurrence(&naive_as_utc(start), true)
        .ok()?
        .naive_utc();
    (found < end).then_some(found)
}

fn note(cron: &Cron, tz: Tz, at: UnixMillis, before: i32, after: i32) -> Option<String> {
    let old_wall = wall(at, before)?;
    let new_wall = wall(at, after)?;
    let day = new_wall.format("%Y-%m-%d");
    let hm = |w: NaiveDateTime| w.format("%H:%M").to_string();
    if after > before {
        // Spring forward: wall times [old_wall, new_wall) do not exist.
        let skipped = first_match(cron, old_wall, new_wall)?;
        Some(format!(
            "On {day} the clocks in {tz} go forward from {} to {}: the wall time {} does not exist that day, so that fire happens at {} instead.",
            hm(old_wall),
            hm(new_wall),
            skipped.format("%H:%M:%S"),
            hm(new_wall),
        ))
    } else {
        // Fall back: wall times [new_wall, old_wall) come twice.
        let repeated = first_match(cron, new_wall, old_wall)?;
        Some(format!(
            "On {day} the clocks in {tz} go back from {} to {}: the wall time {} comes twice that day, and the schedule fires at the first only.",
            hm(old_wall),
            hm(new_wall),
            repeated.format("%H:%M:%S"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timetable::{parse_cron, parse_zone};

    fn ms(rfc3339: &str) -> UnixMillis {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn a_fire_in_the_spring_gap_and_in_the_autumn_overlap_is_named() {
        let cron = parse_cron("0 30 2 * * *").unwrap();
        let berlin = parse_zone("Europe/Berlin").unwrap();
        let spring = dst_notes(
            &cron,
            berlin,
            ms("2027-03-25T00:00:00Z"),
            ms("2027-03-31T00:00:00Z"),
        );
        assert_eq!(spring.len(), 1, "{spring:?}");
        assert!(spring[0].contains("2027-03-28"), "{spring:?}");
        assert!(
            spring[0].contains("go forward from 02:00 to 03:00"),
            "{spring:?}"
        );
        assert!(spring[0].contains("02:30:00"), "{spring:?}");
        let autumn = dst_notes(
            &cron,
            berlin,
            ms("2027-10-28T00:00:00Z"),
            ms("2027-11-02T00:00:00Z"),
        );
        assert_eq!(autumn.len(), 1, "{autumn:?}");
        assert!(autumn[0].contains("2027-10-31"), "{autumn:?}");
        assert!(
            autumn[0].contains("go back from 03:00 to 02:00"),
            "{autumn:?}"
        );
    }

    #[test]
    fn a_change_the_schedule_never_meets_says_nothing() {
        let cron = parse_cron("0 0 12 * * *").unwrap();
        let berlin = parse_zone("Europe/Berlin").unwrap();
        assert!(
            dst_notes(
                &cron,
                berlin,
                ms("2027-03-01T00:00:00Z"),
                ms("2027-11-30T00:00:00Z")
            )
            .is_empty()
        );
        let utc = parse_zone("").unwrap();
        let every_minute = parse_cron("* * * * *").unwrap();
        assert!(
            dst_notes(
                &every_minute,
                utc,
                ms("2027-01-01T00:00:00Z"),
                ms("2028-01-01T00:00:00Z")
            )
            .is_empty()
        );
    }
}
