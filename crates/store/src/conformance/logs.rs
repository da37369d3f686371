//! Conformance scenario: task logs. Lines are stored under the attempt
//! their execution id names, numbered in order across batches; the cap
//! keeps an attempt's first lines and counts the rest; lines of an
//! unknown execution, or of an attempt that ended more than
//! `LATE_LINES_MS` before, are not stored; an open attempt takes lines
//! however long it runs; reads page by (attempt, seq) and by one attempt;
//! the lines go with their task.

use taskmesh_core::TaskState;
use taskmesh_core::logs::{
    LATE_LINES_MS, LogBatch, LogCap, LogCursor, LogLevel, LogLine, LogQuery,
};

use taskmesh_core::Event;

use super::{StoreFixture, T0, ack, create, dispatch, new_task, step, succeed};
use crate::Store;

fn lines(prefix: &str, n: usize) -> Vec<LogLine> {
    (0..n)
        .map(|i| LogLine {
            at: T0 + i as i64,
            level: if i % 2 == 0 {
                LogLevel::Info
            } else {
                LogLevel::Warn
            },
            message: format!("{prefix} {i}"),
        })
        .collect()
}

fn batch(task_id: &str, exec: &str, lines: Vec<LogLine>, dropped: u64) -> LogBatch {
    LogBatch {
        task_id: task_id.into(),
        execution_id: exec.into(),
        lines,
        dropped,
    }
}

fn all(after: LogCursor, limit: usize) -> LogQuery {
    LogQuery {
        attempt: None,
        after,
        limit,
    }
}

/// See the module documentation.
pub async fn task_logs_are_kept_per_attempt_within_the_cap(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    let cap = LogCap {
        lines: 5,
        bytes: 1 << 20,
    };
    // Attempt 1 fails (retryable), attempt 2 runs.
    let t = create(store, new_task("logs"), T0).await;
    let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 60_000), T0 + 1).await;
    let t = step(store, &t, ack("exec-1"), T0 + 2).await;
    let got = store
        .append_logs(
            &[
                batch(&t.id, "exec-1", lines("first", 3), 0),
                // A second batch of the same attempt in the same flush.
                batch(&t.id, "exec-1", lines("more", 1), 2),
                batch(&t.id, "exec-nobody", lines("stray", 4), 0),
            ],
            cap,
            T0 + 2,
        )
        .await
        .expect("append");
    assert_eq!((got.stored, got.truncated, got.unknown), (4, 0, 4));
    // Over the cap: the first line that fits is kept, the rest counted.
    let got = store
        .append_logs(&[batch(&t.id, "exec-1", lines("over", 3), 0)], cap, T0 + 2)
        .await
        .expect("append");
    assert_eq!((got.stored, got.truncated), (1, 2));
    let fail = Event::Fail {
        execution_id: "exec-1".into(),
        message: "boom".into(),
        retryable: true,
        jitter: 0.0,
    };
    let t = step(store, &t, fail, T0 + 3).await;
    assert_eq!(t.state, TaskState::Retrying);

    let t = store.get_task(&t.id).await.unwrap().expect("task");
    let due = t.next_at.expect("a retry time");
    let t = step(store, &t, Event::Due, due).await;
    let t = step(store, &t, dispatch("exec-2", "w-2", due + 60_000), due + 1).await;
    let got = store
        .append_logs(
            &[batch(&t.id, "exec-2", lines("second", 2), 0)],
            cap,
            // Long after the attempt began: it is still open.
            due + 100 * LATE_LINES_MS,
        )
        .await
        .expect("append");
    assert_eq!(
        (got.stored, got.late),
        (2, 0),
        "an open attempt is never late"
    );

    let (attempts, page) = store
        .task_logs(&t.id, &all(LogCursor::default(), 100))
        .await
        .expect("read");
    assert_eq!(attempts.len(), 2);
    let a1 = attempts[0];
    assert_eq!(
        (a1.attempt, a1.lines, a1.truncated_lines, a1.dropped),
        (1, 5, 2, 2)
    );
    assert!(a1.truncated());
    assert_eq!(
        a1.bytes,
        page[..5]
            .iter()
            .map(|e| e.line.message.len() as u64)
            .sum::<u64>()
    );
    assert!(!attempts[1].truncated());
    let seen: Vec<(u32, u64, &str)> = page
        .iter()
        .map(|e| (e.attempt, e.seq, e.line.message.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, 1, "first 0"),
            (1, 2, "first 1"),
            (1, 3, "first 2"),
            (1, 4, "more 0"),
            (1, 5, "over 0"),
            (2, 1, "second 0"),
            (2, 2, "second 1"),
        ]
    );
    assert_eq!(page[1].line.level, LogLevel::Warn);
    assert_eq!(page[1].line.at, T0 + 1);

    // Paging: after a cursor, across the attempt boundary.
    let (_, next) = store
        .task_logs(&t.id, &all(page[3].cursor(), 2))
        .await
        .expect("read");
    let seqs: Vec<(u32, u64)> = next.iter().map(|e| (e.attempt, e.seq)).collect();
    assert_eq!(seqs, vec![(1, 5), (2, 1)]);
    // One attempt alone, from its start and after a cursor in it.
    let only = |attempt, after| LogQuery {
        attempt: Some(attempt),
        after,
        limit: 100,
    };
    let (_, second) = store
        .task_logs(&t.id, &only(2, LogCursor::default()))
        .await
        .expect("read");
    assert_eq!(second.len(), 2);
    let (_, rest) = store
        .task_logs(&t.id, &only(1, LogCursor { attempt: 1, seq: 3 }))
        .await
        .expect("read");
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    let (_, none) = store
        .task_logs(&t.id, &only(1, LogCursor { attempt: 2, seq: 0 }))
        .await
        .expect("read");
    assert!(
        none.is_empty(),
        "a cursor past the attempt reads nothing of it"
    );

    // Lines may trail their attempt's end by LATE_LINES_MS, no more.
    let t = step(store, &t, ack("exec-2"), due + 2).await;
    step(store, &t, succeed("exec-2", b"ok"), due + 3).await;
    let trailing = |text| [batch(&t.id, "exec-2", lines(text, 1), 0)];
    let got = store
        .append_logs(&trailing("trailing"), cap, due + 3 + LATE_LINES_MS)
        .await
        .expect("append");
    assert_eq!((got.stored, got.late), (1, 0), "in time after the end");
    let got = store
        .append_logs(&trailing("late"), cap, due + 4 + LATE_LINES_MS)
        .await
        .expect("append");
    assert_eq!((got.stored, got.late), (0, 1), "too long after the end");
    let (attempts, _) = store
        .task_logs(&t.id, &all(LogCursor::default(), 100))
        .await
        .expect("read");
    assert_eq!(attempts[1].lines, 3, "the late line was not kept");

    // The lines go with their task.
    let removed = store
        .remove_ended(TaskState::Succeeded, due + 10, 0, 10)
        .await
        .expect("remove");
    assert_eq!(removed, 1);
    let (attempts, page) = store
        .task_logs(&t.id, &all(LogCursor::default(), 100))
        .await
        .expect("read");
    assert!(
        attempts.is_empty() && page.is_empty(),
        "logs went with the task"
    );
    let got = store
        .append_logs(
            &[batch(&t.id, "exec-2", lines("after", 1), 0)],
            cap,
            due + 10,
        )
        .await
        .expect("append to a removed task");
    assert_eq!(got.unknown, 1, "lines of a removed task are not stored");
}

/// A task whose log holds more lines than one delete takes (2,500 in one
/// attempt) goes whole with retention: its lines in bounded deletes of
/// their own, then the task; a task inside its horizon keeps its lines.
pub async fn long_task_logs_go_with_their_task(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    let cap = LogCap::default();
    let mut ended = Vec::new();
    for (exec, at) in [("exec-old", T0 + 10), ("exec-new", T0 + 5_000)] {
        let t = create(store, new_task("logs"), T0).await;
        let t = step(store, &t, dispatch(exec, "w-1", at + 60_000), at - 2).await;
        let t = step(store, &t, ack(exec), at - 1).await;
        store
            .append_logs(&[batch(&t.id, exec, lines("long", 2_500), 0)], cap, at - 1)
            .await
            .expect("append");
        ended.push(step(store, &t, succeed(exec, b"ok"), at).await.id);
    }
    let n = store
        .remove_ended(TaskState::Succeeded, T0 + 1_000, 0, 10)
        .await
        .expect("remove");
    assert_eq!(n, 1, "only the task past its horizon");
    let (attempts, gone) = store
        .task_logs(&ended[0], &all(LogCursor::default(), 10))
        .await
        .expect("read");
    assert!(
        attempts.is_empty() && gone.is_empty(),
        "its 2,500 lines went with it"
    );
    let (attempts, kept) = store
        .task_logs(&ended[1], &all(LogCursor::default(), 3_000))
        .await
        .expect("read");
    assert_eq!(
        kept.len(),
        2_500,
        "the task inside its horizon keeps every line"
    );
    assert_eq!(attempts[0].lines, 2_500);
}
