//! The schedule timetable: a cron expression and an IANA zone, parsed, and
//! when both parse, the next fires after an instant (DST gaps and overlaps
//! included). Input: the expression, a NUL, the zone, a NUL, eight bytes of
//! instant.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskmesh_core::timetable::{Timetable, parse_cron, parse_zone};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let (Some(expr), Some(zone)) = (parts.next(), parts.next()) else {
        return;
    };
    let (Ok(expr), Ok(zone)) = (std::str::from_utf8(expr), std::str::from_utf8(zone)) else {
        return;
    };
    let mut instant = [0u8; 8];
    if let Some(rest) = parts.next() {
        for (i, b) in rest.iter().take(8).enumerate() {
            instant[i] = *b;
        }
    }
    // Within ±300 years of the epoch, where schedules live.
    let after = i64::from_le_bytes(instant) % (300 * 365 * 86_400_000);
    let (Ok(cron), Ok(tz)) = (parse_cron(expr), parse_zone(zone)) else {
        return;
    };
    let timetable = Timetable::Cron {
        cron: std::sync::Arc::new(cron),
        tz,
    };
    let mut at = after;
    for _ in 0..4 {
        match timetable.next_after(at) {
            Some(next) => {
                assert!(next > at, "{expr:?} in {zone}: {next} is not after {at}");
                at = next;
            }
            None => break,
        }
    }
});
