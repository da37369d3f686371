use chrono::{NaiveDate, TimeZone, Utc};

use super::*;

/// Milliseconds of a UTC wall time.
fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> UnixMillis {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
        .unwrap()
        .timestamp_millis()
}

/// Renders an instant in `tz` as "YYYY-MM-DD HH:MM:SS+HH:MM".
fn show(tz: Tz, ms: UnixMillis) -> String {
    tz.timestamp_millis_opt(ms)
        .unwrap()
        .format("%Y-%m-%d %H:%M:%S%:z")
        .to_string()
}

/// The next `n` fires after `from` (a UTC instant), rendered in the zone.
fn fires(expr: &str, zone: &str, from: UnixMillis, n: usize) -> Vec<String> {
    let tz = parse_zone(zone).unwrap();
    let tt = Timetable::Cron {
        cron: std::sync::Arc::new(parse_cron(expr).unwrap()),
        tz,
    };
    let mut out = Vec::new();
    let mut t = from;
    for _ in 0..n {
        t = tt.next_after(t).expect("a next fire");
        out.push(show(tz, t));
    }
    out
}

#[test]
fn new_york_spring_forward_gap_fires_once_at_the_end_of_the_gap() {
    // 2026-03-08: 02:00 EST jumps to 03:00 EDT.
    let from = utc(2026, 3, 7, 12, 0, 0);
    assert_eq!(
        fires("30 2 * * *", "America/New_York", from, 3),
        [
            "2026-03-08 03:00:00-04:00", // 02:30 does not exist: first instant after the gap
            "2026-03-09 02:30:00-04:00",
            "2026-03-10 02:30:00-04:00",
        ]
    );
    // Several wall times inside the gap still fire only once.
    let from = utc(2026, 3, 8, 6, 40, 0); // 01:40 EST
    assert_eq!(
        fires("0 */20 * * * *", "America/New_York", from, 4),
        [
            "2026-03-08 03:00:00-04:00", // 02:00, 02:20, 02:40 collapse into one fire
            "2026-03-08 03:20:00-04:00",
            "2026-03-08 03:40:00-04:00",
            "2026-03-08 04:00:00-04:00",
        ]
    );
}

#[test]
fn new_york_fall_back_overlap_fires_once_at_the_first_occurrence() {
    // 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:xx happens twice.
    let from = utc(2026, 10, 31, 12, 0, 0);
    assert_eq!(
        fires("30 1 * * *", "America/New_York", from, 2),
        ["2026-11-01 01:30:00-04:00", "2026-11-02 01:30:00-05:00"]
    );
    let from = utc(2026, 11, 1, 4, 50, 0); // 00:50 EDT
    assert_eq!(
        fires("*/30 * * * *", "America/New_York", from, 4),
        [
            "2026-11-01 01:00:00-04:00",
            "2026-11-01 01:30:00-04:00",
            // the repeated hour (01:00-01:59 EST) fires nothing
            "2026-11-01 02:00:00-05:00",
            "2026-11-01 02:30:00-05:00",
        ]
    );
}

#[test]
fn london_across_both_changes() {
    // 2026-03-29 01:00 GMT -> 02:00 BST; 2026-10-25 02:00 BST -> 01:00 GMT.
    assert_eq!(
        fires(
            "0 30 1 * * *",
            "Europe/London",
            utc(2026, 3, 28, 12, 0, 0),
            2
        ),
        ["2026-03-29 02:00:00+01:00", "2026-03-30 01:30:00+01:00"]
    );
    assert_eq!(
        fires(
            "0 30 1 * * *",
            "Europe/London",
            utc(2026, 10, 24, 12, 0, 0),
            2
        ),
        ["2026-10-25 01:30:00+01:00", "2026-10-26 01:30:00+00:00"]
    );
    // A daily 09:00 stays at 09:00 local across both changes.
    assert_eq!(
        fires("0 9 * * *", "Europe/London", utc(2026, 3, 28, 10, 0, 0), 2),
        ["2026-03-29 09:00:00+01:00", "2026-03-30 09:00:00+01:00"]
    );
}

#[test]
fn kolkata_half_hour_offset() {
    assert_eq!(
        fires("0 9 * * 1-5", "Asia/Kolkata", utc(2026, 11, 27, 0, 0, 0), 3),
        [
            "2026-11-27 09:00:00+05:30", // Friday
            "2026-11-30 09:00:00+05:30", // Monday
            "2026-12-01 09:00:00+05:30",
        ]
    );
    assert_eq!(utc(2026, 11, 27, 3, 30, 0), {
        let tz = parse_zone("Asia/Kolkata").unwrap();
        tz.from_local_datetime(
            &NaiveDate::from_ymd_opt(2026, 11, 27)
                .unwrap()
                .and_hms_opt(9, 0, 0)
                .unwrap(),
        )
        .unwrap()
        .timestamp_millis()
    });
}

#[test]
fn seconds_field_and_never_early() {
    let from = utc(2026, 1, 1, 0, 0, 0) + 250;
    let tz = parse_zone("").unwrap();
    let tt = Timetable::Cron {
        cron: std::sync::Arc::new(parse_cron("* * * * * *").unwrap()),
        tz,
    };
    assert_eq!(tt.next_after(from), Some(utc(2026, 1, 1, 0, 0, 1)));
    assert_eq!(
        tt.next_after(utc(2026, 1, 1, 0, 0, 1)),
        Some(utc(2026, 1, 1, 0, 0, 2))
    );
}

#[test]
fn fixed_rate_counts_from_its_anchor() {
    let tt = Timetable::FixedRate {
        anchor: 1_000,
        interval_ms: 500,
    };
    assert_eq!(tt.next_after(0), Some(1_500));
    assert_eq!(tt.next_after(1_500), Some(2_000));
    assert_eq!(tt.next_after(1_501), Some(2_000));
    let delay = Timetable::FixedDelay { interval_ms: 300 };
    assert_eq!(delay.next_after(10), None);
    assert_eq!(delay.next_after_run(10), Some(310));
}

#[test]
fn bad_expressions_and_zones_are_refused() {
    for bad in [
        "",
        "* * * *",
        "* * * * * * *",
        "61 * * * *",
        "* * 32 * *",
        "banana * * * *",
        // Empty list elements (a leading one was an empty set whose search
        // took seconds: fuzz/seeds/cron_timezone/empty-list).
        ",  * * * *",
        "* * * * ,",
        "1,,2 * * * *",
        "0 1, * * *",
    ] {
        assert!(parse_cron(bad).is_err(), "{bad:?} should be refused");
    }
    assert!(parse_zone("Mars/Olympus").is_err());
    assert_eq!(parse_zone("").unwrap(), Tz::UTC);
    // Parses, but never fires: the search gives up instead of looping.
    let tt = Timetable::Cron {
        cron: std::sync::Arc::new(parse_cron("0 0 30 2 *").unwrap()),
        tz: Tz::UTC,
    };
    assert_eq!(tt.next_after(0), None);
}

#[test]
fn cached_cron_parses_once_per_text_and_keeps_no_error() {
    let a = cached_cron("17 3 * * * *").unwrap();
    let b = cached_cron("17 3 * * * *").unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&a, &b),
        "the second look-up is the first parse"
    );
    let c = cached_cron("17 4 * * * *").unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a, &c));
    for _ in 0..2 {
        let err = cached_cron("61 * * * *").unwrap_err();
        assert!(err.contains("\"61 * * * *\""), "{err}");
    }
    let tt = Timetable::Cron {
        cron: a,
        tz: Tz::UTC,
    };
    assert_eq!(
        tt.next_after(utc(2026, 1, 1, 0, 0, 0)),
        Some(utc(2026, 1, 1, 0, 3, 17))
    );
}
