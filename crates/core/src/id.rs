//! Identifiers. Task, execution and callback delivery ids are UUIDv7:
//! time-ordered, so each index keyed by one (tasks' primary key, attempts'
//! `execution_id`, callbacks' primary key) grows at its right edge and its
//! oldest rows, the ones retention removes, sit together at its left. A
//! UUIDv4 key lands each insert and each delete on a random leaf page,
//! which a store whose index outgrows its page cache reads back from the
//! file every time (and Postgres logs a full page image of after each
//! checkpoint). None of them is a secret: a push-mode report proves
//! itself with its assignment's secret, not its execution id. Session ids
//! are not stored in an index and stay UUIDv4.

use uuid::Uuid;

/// A UUIDv7 in hyphenated lowercase text: every id a store keys an index
/// by (the module's comment).
fn time_ordered() -> String {
    Uuid::now_v7().hyphenated().to_string()
}

/// A new task id.
pub fn new_task_id() -> String {
    time_ordered()
}

/// A new execution id for one attempt.
pub fn new_execution_id() -> String {
    time_ordered()
}

/// A new delivery id for one task's callback (the same on every retry).
pub fn new_delivery_id() -> String {
    time_ordered()
}

/// A new session id for one worker stream.
pub fn new_session_id() -> String {
    Uuid::new_v4().hyphenated().to_string()
}

/// Parses a task id given by a caller, returning it in canonical form.
pub fn parse_task_id(text: &str) -> Option<String> {
    Uuid::try_parse(text.trim())
        .ok()
        .map(|u| u.hyphenated().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_round_trip_and_sort_by_time() {
        let a = new_task_id();
        let b = new_task_id();
        assert_eq!(parse_task_id(&a).as_deref(), Some(a.as_str()));
        assert!(a < b, "UUIDv7 ids must sort by creation: {a} !< {b}");
    }

    #[test]
    fn execution_and_delivery_ids_sort_by_time() {
        // Indexes keyed by them grow at one edge (the module's comment).
        for new in [new_execution_id, new_delivery_id] {
            let ids: Vec<String> = (0..1_000).map(|_| new()).collect();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "ids must sort by creation"
            );
            assert_eq!(Uuid::try_parse(&ids[0]).map(|u| u.get_version_num()), Ok(7));
        }
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            "42",
            "not-a-uuid",
            "0190b5c8-aaaa-7bbb-8ccc-dddddddddddz",
        ] {
            assert_eq!(parse_task_id(bad), None, "{bad:?}");
        }
    }
}
