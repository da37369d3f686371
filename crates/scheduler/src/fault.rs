//! Test-only fault injection: hold a scheduler round between its lease check
//! and its commit, so an end-to-end test can pause a leader at the one moment
//! that matters for fencing (a deposed leader about to write with its old
//! token). A random SIGSTOP almost never lands there. Off unless
//! [`SchedulerOptions::fault_hold_round`](crate::SchedulerOptions) is set
//! (`serve` reads `TASKMESH_FAULT_HOLD_ROUND`); never set it in production.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::warn;

/// While the file at `path` exists, waits (polling), after writing
/// `<path>.held` with the round's fencing token so the test knows the round
/// is held and with which token.
pub(crate) async fn hold_round(path: &Path, fence: u64) {
    if !path.exists() {
        return;
    }
    let marker = held_marker(path);
    warn!(fence, path = %path.display(), "fault hook: scheduler round held before its commit");
    if let Err(err) = std::fs::write(&marker, fence.to_string()) {
        warn!(error = %err, path = %marker.display(), "fault hook: cannot write the held marker");
    }
    while path.exists() {
        // Polling a file the test removes; this hook exists only in tests.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    warn!(fence, "fault hook: scheduler round released, committing");
}

/// `<path>.held`.
pub fn held_marker(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".held");
    PathBuf::from(name)
}
