//! Identifiers. Task ids are UUIDv7 (time-ordered, so the primary key index
//! stays append-mostly); execution, session and callback delivery ids are
//! UUIDv4.

use uuid::Uuid;

/// A new task id: a UUIDv7 in hyphenated lowercase text.
pub fn new_task_id() -> String {
    Uuid::now_v7().hyphenated().to_string()
}

/// A new execution id for one attempt.
pub fn new_execution_id() -> String {
    Uuid::new_v4().hyphenated().to_string()
}

/// A new delivery id for one task's callback (the same on every retry).
pub fn new_delivery_id() -> String {
    Uuid::new_v4().hyphenated().to_string()
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
