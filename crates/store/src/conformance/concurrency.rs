//! Conformance scenarios: concurrency keys, enforced where tasks are
//! claimed.

use std::sync::Arc;

use taskmesh_core::id::new_execution_id;
use taskmesh_core::{Concurrency, Event, NewTask, TaskRecord, TaskState};

use super::{StoreFixture, T0, create, new_task};
use crate::{Claim, Store};

fn keyed(handler: &str, key: &str, limit: u32) -> NewTask {
    NewTask {
        concurrency: Some(Concurrency {
            key: key.into(),
            limit,
        }),
        ..new_task(handler)
    }
}

fn claim_all(_: &TaskRecord) -> Option<Claim> {
    Some(Claim {
        execution_id: new_execution_id(),
        worker_id: "w-1".into(),
        ack_deadline: T0 + 60_000,
    })
}

async fn claim(store: &dyn Store, handler: &str, limit: usize) -> Vec<TaskRecord> {
    store
        .claim_ready("default", handler, limit, T0 + 1, &mut claim_all)
        .await
        .expect("claim")
}

fn keys_of(tasks: &[TaskRecord]) -> Vec<String> {
    let mut keys: Vec<String> = tasks
        .iter()
        .map(|t| t.concurrency.as_ref().map_or("-".into(), |c| c.key.clone()))
        .collect();
    keys.sort();
    keys
}

/// A claim offers a keyed task only while fewer than its limit of the
/// namespace's tasks with that key are DISPATCHING or RUNNING; tasks held
/// back by one key do not hold back other keys or unkeyed tasks; a task of
/// the key that ends makes room for one more; the same key in another
/// namespace is another key; a keyed task is never dispatched at submit.
pub async fn concurrency_keys_cap_claims(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let mut k = Vec::new();
    for _ in 0..5 {
        k.push(create(store, keyed("ck", "k", 2), T0).await);
    }
    create(store, keyed("ck", "other", 1), T0).await;
    create(store, keyed("ck", "other", 1), T0).await;
    create(store, new_task("ck"), T0).await;
    let elsewhere = create(
        store,
        NewTask {
            namespace: "ns-b".into(),
            ..keyed("ck", "k", 1)
        },
        T0,
    )
    .await;

    let got = claim(store, "ck", 10).await;
    assert_eq!(
        keys_of(&got),
        ["-", "k", "k", "other"],
        "two of k, one of other, the unkeyed task"
    );
    assert!(
        claim(store, "ck", 10).await.is_empty(),
        "every key is at its limit"
    );
    let b = store
        .claim_ready("ns-b", "ck", 10, T0 + 1, &mut claim_all)
        .await
        .expect("claim ns-b");
    assert_eq!(
        b.len(),
        1,
        "the same key in another namespace is another key"
    );
    assert_eq!(b[0].id, elsewhere.id);

    // One of k's ends: room for exactly one more of k.
    let first_k = got
        .iter()
        .find(|t| t.concurrency.as_ref().is_some_and(|c| c.key == "k"))
        .expect("a task of k");
    let cancel = Event::Cancel {
        reason: "done".into(),
    };
    let ended = store
        .transition(&first_k.id, &cancel, T0 + 2)
        .await
        .expect("cancel");
    assert_eq!(ended.state, TaskState::Cancelled);
    let next = claim(store, "ck", 10).await;
    assert_eq!(keys_of(&next), ["k"], "one more of k, none of other");
    assert!(claim(store, "ck", 10).await.is_empty());

    // Keyed tasks are left READY by a create that dispatches at submit.
    let mut offered = 0;
    let created = store
        .create_tasks_dispatching(vec![(keyed("ck2", "k2", 5), "fp".into())], T0, &mut |t| {
            offered += 1;
            claim_all(t)
        })
        .await
        .expect("create")
        .remove(0)
        .expect("created");
    assert_eq!(offered, 0, "a keyed task waits for a claim");
    assert_eq!(created.task.state, TaskState::Ready);
    assert_eq!(
        claim(store, "ck2", 10).await.len(),
        1,
        "and a claim takes it"
    );
}

/// A long queue of one full key ahead of another key's task does not hide
/// it: a claim passes over the full key's tasks without spending its scan
/// on them.
pub async fn a_full_key_does_not_block_the_tasks_behind_it(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let batch: Vec<(NewTask, String)> = (0..600)
        .map(|_| (keyed("kb", "big", 1), "fp".to_string()))
        .collect();
    for r in store.create_tasks(batch, T0).await.expect("create") {
        r.expect("created");
    }
    let small = create(store, keyed("kb", "small", 1), T0).await;
    let plain = create(store, new_task("kb"), T0).await;
    let first = claim(store, "kb", 1).await;
    assert_eq!(keys_of(&first), ["big"]);
    let got = claim(store, "kb", 10).await;
    let mut ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    let mut want = [small.id.as_str(), plain.id.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want, "past 599 held-back tasks of the full key");
}

/// Waiting keys are claimed round robin: a claim with less room than
/// candidates takes one task of each key (and those without a key) before
/// a second of any, though one key's tasks are all older; then fills what
/// is left in order.
pub async fn waiting_keys_are_claimed_round_robin(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    // Claimed in id order: six of "a", then three of "b", then one without.
    for i in 0..10 {
        let task = match i {
            0..6 => keyed("rr", "a", 10),
            6..9 => keyed("rr", "b", 10),
            _ => new_task("rr"),
        };
        create(
            store,
            NewTask {
                id: format!("rr-{i:02}"),
                ..task
            },
            T0,
        )
        .await;
    }
    let got = claim(store, "rr", 4).await;
    assert_eq!(
        keys_of(&got),
        ["-", "a", "a", "b"],
        "one of each, then a's next"
    );
    let mut ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["rr-00", "rr-01", "rr-06", "rr-09"],
        "each key's oldest first"
    );
    let next = claim(store, "rr", 2).await;
    assert_eq!(keys_of(&next), ["a", "b"], "one of each again");
    let rest = claim(store, "rr", 10).await;
    assert_eq!(keys_of(&rest), ["a", "a", "a", "b"]);

    // A full key between two tasks of one key: the claim still takes both
    // (the second pass reads what the first left out with the picked key).
    let ids = ["rq-00", "rq-01", "rq-02", "rq-03"];
    for (id, key, limit) in [
        (ids[0], "f", 1),
        (ids[1], "a", 10),
        (ids[2], "f", 1),
        (ids[3], "a", 10),
    ] {
        create(
            store,
            NewTask {
                id: id.into(),
                ..keyed("rq", key, limit)
            },
            T0,
        )
        .await;
    }
    assert_eq!(
        keys_of(&claim(store, "rq", 1).await),
        ["f"],
        "f is full now"
    );
    let got = claim(store, "rq", 2).await;
    let mut got: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    got.sort_unstable();
    assert_eq!(got, [ids[1], ids[3]]);
}

/// Two replicas claiming one key at once never have more than its limit in
/// flight together, and between them fill it.
pub async fn two_replicas_never_exceed_a_concurrency_limit(fixture: &dyn StoreFixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    for i in 0..40 {
        let store = if i % 2 == 0 { &a } else { &b };
        create(store.as_ref(), keyed("kr", "shared", 3), T0).await;
    }
    let claimer = |store: Arc<dyn Store>| {
        tokio::spawn(async move {
            let mut n = 0;
            for _ in 0..20 {
                n += claim(store.as_ref(), "kr", 2).await.len();
            }
            n
        })
    };
    for round in 0..5 {
        let (x, y) = (claimer(Arc::clone(&a)), claimer(Arc::clone(&b)));
        let claimed = x.await.expect("claimer a") + y.await.expect("claimer b");
        let in_flight = a.in_flight(None).await.expect("in_flight");
        assert!(
            in_flight.len() <= 3,
            "round {round}: {} in flight with a limit of 3",
            in_flight.len()
        );
        if round == 0 {
            assert_eq!(claimed, 3, "the two replicas fill the limit");
        } else {
            assert_eq!(claimed, 0, "the key stays full");
        }
    }
    // One ends on a, and b may claim exactly one more.
    let running = a.in_flight(None).await.expect("in_flight");
    let cancel = Event::Cancel {
        reason: "done".into(),
    };
    a.transition(&running[0].id, &cancel, T0 + 2)
        .await
        .expect("cancel");
    assert_eq!(claim(b.as_ref(), "kr", 5).await.len(), 1);
    assert_eq!(b.in_flight(None).await.expect("in_flight").len(), 3);
}
