//! Conformance scenarios: claiming READY tasks for workers: order, limit, chooser, and exclusivity under concurrency.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use taskmesh_core::id::new_execution_id;
use taskmesh_core::{NewTask, TaskRecord, TaskState};

use super::{StoreFixture, T0, create, get, new_task, without_attempts};
use crate::Claim;

/// Claims take the highest priority first, FIFO within a priority, at most
/// `limit`, only READY tasks of the handler, and skip what the chooser
/// leaves.
pub async fn claim_order_limit_and_chooser(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let mut by_priority = Vec::new();
    for priority in [0, 5, 0, 5, 1] {
        let task = NewTask {
            priority,
            ..new_task("claim")
        };
        by_priority.push(create(store, task, T0).await);
    }
    let other = create(
        store,
        NewTask {
            priority: 9,
            ..new_task("other")
        },
        T0,
    )
    .await;
    let pending = create(
        store,
        NewTask {
            priority: 10,
            run_at: T0 + 60_000,
            ..new_task("claim")
        },
        T0,
    )
    .await;
    let [p0a, p5a, p0b, p5b, p1]: [String; 5] = by_priority
        .into_iter()
        .map(|t| t.id)
        .collect::<Vec<_>>()
        .try_into()
        .expect("five tasks");

    let claim_all = |_: &TaskRecord| {
        Some(Claim {
            execution_id: new_execution_id(),
            worker_id: "w-1".into(),
            ack_deadline: T0 + 5_000,
        })
    };
    let mut calls = 0;
    let none = store
        .claim_ready("default", "claim", 0, T0 + 1, &mut |_| {
            calls += 1;
            None
        })
        .await
        .expect("claim 0");
    assert!(none.is_empty());
    assert_eq!(calls, 0, "limit 0 asks the chooser nothing");

    let got = store
        .claim_ready("default", "claim", 2, T0 + 1, &mut claim_all.clone())
        .await
        .expect("claim");
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        [p5a.as_str(), p5b.as_str()],
        "priority first, then FIFO"
    );
    for t in &got {
        assert_eq!(t.state, TaskState::Dispatching);
        assert_eq!(t.worker_id.as_deref(), Some("w-1"));
        assert_eq!((t.attempt, t.version, t.next_at), (1, 2, Some(T0 + 5_000)));
        assert_eq!(without_attempts(get(store, &t.id).await), *t);
    }

    // The chooser leaves the first candidate (p1) READY: the tasks behind it
    // are still claimed (a task no stream can take blocks nothing).
    let mut seen = Vec::new();
    let got = store
        .claim_ready("default", "claim", 2, T0 + 2, &mut |t: &TaskRecord| {
            seen.push(t.id.clone());
            if t.id == p1 { None } else { claim_all(t) }
        })
        .await
        .expect("claim");
    assert_eq!(
        seen,
        [p1.clone(), p0a.clone(), p0b.clone()],
        "chooser sees candidates in order"
    );
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [p0a.as_str(), p0b.as_str()]);
    let left = get(store, &p1).await;
    assert_eq!((left.state, left.version), (TaskState::Ready, 1));

    let got = store
        .claim_ready("default", "claim", 10, T0 + 3, &mut claim_all.clone())
        .await
        .expect("claim");
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [p1.as_str()]);
    let again = store
        .claim_ready("default", "claim", 10, T0 + 4, &mut claim_all.clone())
        .await
        .expect("claim");
    assert!(again.is_empty(), "nothing READY is left for the handler");
    assert_eq!(get(store, &other.id).await.state, TaskState::Ready);
    assert_eq!(get(store, &pending.id).await.state, TaskState::Pending);
}

/// Two claimers racing over 200 READY tasks never get the same task, and
/// between them claim every one.
///
/// A claim may come back short while the other claimer holds the remaining
/// READY rows (Postgres skips rows locked by a concurrent claim rather than
/// wait for them), so each claimer goes on until nothing is READY any more,
/// not for a fixed number of rounds.
pub async fn concurrent_claimers_never_double_claim(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let mut all = BTreeSet::new();
    for _ in 0..200 {
        all.insert(create(store.as_ref(), new_task("race"), T0).await.id);
    }
    let claimer = |worker: &'static str| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let mut claimed = Vec::new();
            for round in 0..2_000 {
                let got = store
                    .claim_ready("default", "race", 2, T0 + 1 + round, &mut |_| {
                        Some(Claim {
                            execution_id: new_execution_id(),
                            worker_id: worker.into(),
                            ack_deadline: T0 + 10_000,
                        })
                    })
                    .await
                    .expect("claim_ready");
                assert!(got.len() <= 2, "a claim of 2 returned {}", got.len());
                if got.is_empty() && store.ready_counts().await.expect("counts").is_empty() {
                    return claimed;
                }
                claimed.extend(got.into_iter().map(|t| (t.id, worker)));
            }
            panic!("200 tasks not drained in 2000 claims");
        })
    };
    let (a, b) = (claimer("w-a"), claimer("w-b"));
    let claimed: Vec<(String, &str)> = [a.await.expect("join"), b.await.expect("join")].concat();

    let mut owner = BTreeMap::new();
    for (id, worker) in &claimed {
        assert!(
            owner.insert(id.clone(), *worker).is_none(),
            "task {id} claimed twice"
        );
    }
    assert_eq!(claimed.len(), 200, "every task claimed exactly once");
    assert_eq!(owner.keys().cloned().collect::<BTreeSet<_>>(), all);
    let in_flight = store.in_flight(None).await.expect("in_flight");
    assert_eq!(in_flight.len(), 200);
    for task in in_flight {
        assert_eq!(task.state, TaskState::Dispatching);
        assert_eq!(task.worker_id.as_deref(), owner.get(&task.id).copied());
        assert_eq!(task.version, 2, "each task written once");
    }
    assert!(store.ready_counts().await.expect("counts").is_empty());
}

/// `create_tasks_dispatching`: a new READY task the chooser claims is stored
/// DISPATCHING for that claim with its attempt opened, in the create's own
/// transaction; a delayed task and an idempotent repeat are never offered;
/// one the chooser leaves is stored READY; the change feed sees the
/// dispatched state, not READY.
pub async fn create_dispatching_claims_new_ready_tasks(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let kept = create(
        store,
        NewTask {
            client_request_id: Some("kept".into()),
            ..new_task("at-submit")
        },
        T0,
    )
    .await;
    let mut feed = store.subscribe();
    let mut offered: Vec<String> = Vec::new();
    let mut chooser = |task: &TaskRecord| {
        offered.push(task.id.clone());
        // The second task offered is left READY.
        (offered.len() != 2).then(|| Claim {
            execution_id: format!("exec-{}", offered.len()),
            worker_id: "w-submit".into(),
            ack_deadline: T0 + 5_000,
        })
    };
    let entries = vec![
        (new_task("at-submit"), "fp".to_string()),
        (new_task("at-submit"), "fp".to_string()),
        (
            NewTask {
                run_at: T0 + 60_000,
                ..new_task("at-submit")
            },
            "fp".to_string(),
        ),
        (
            NewTask {
                client_request_id: Some("kept".into()),
                ..new_task("at-submit")
            },
            "fp".to_string(),
        ),
    ];
    let results = store
        .create_tasks_dispatching(entries, T0, &mut chooser)
        .await
        .expect("create");
    let results: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("each entry created"))
        .collect();
    assert_eq!(offered.len(), 2, "only the two new READY tasks are offered");
    let (claimed, left, delayed, repeat) = (&results[0], &results[1], &results[2], &results[3]);
    assert_eq!(claimed.task.state, TaskState::Dispatching);
    assert_eq!(claimed.task.execution_id.as_deref(), Some("exec-1"));
    assert_eq!(claimed.task.worker_id.as_deref(), Some("w-submit"));
    assert_eq!(claimed.task.next_at, Some(T0 + 5_000), "the ACK deadline");
    assert_eq!(left.task.state, TaskState::Ready);
    assert_eq!(delayed.task.state, TaskState::Pending);
    assert!(repeat.existing);
    assert_eq!(repeat.task.id, kept.id);

    let stored = get(store, &claimed.task.id).await;
    assert_eq!(stored.state, TaskState::Dispatching);
    assert_eq!(stored.attempt, 1);
    assert_eq!(stored.attempts.len(), 1, "its attempt is opened with it");
    assert_eq!(stored.attempts[0].execution_id, "exec-1");
    assert_eq!(stored.attempts[0].worker_id, "w-submit");
    assert_eq!(get(store, &left.task.id).await.state, TaskState::Ready);

    let states = super::feed_states(&mut feed, 3).await;
    assert_eq!(states[&claimed.task.id], TaskState::Dispatching);
    assert_eq!(states[&left.task.id], TaskState::Ready);

    // The claimed task goes on like any claimed one.
    store
        .transition(&claimed.task.id, &super::ack("exec-1"), T0 + 10)
        .await
        .expect("ack");
    assert_eq!(get(store, &claimed.task.id).await.state, TaskState::Running);
}
