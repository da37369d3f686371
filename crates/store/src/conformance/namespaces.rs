//! Conformance scenarios: namespaces keep tasks, keys, claims, counts and
//! schedules apart; tokens are stored, listed and revoked; the cluster key
//! is made once.

use taskmesh_core::auth::{Role, new_token};
use taskmesh_core::id::new_execution_id;
use taskmesh_core::{NewTask, TaskState};

use super::schedules::schedule;
use super::{StoreFixture, T0, create, new_task};
use crate::{Claim, Error, TaskFilter};

fn in_ns(namespace: &str, handler: &str) -> NewTask {
    NewTask {
        namespace: namespace.into(),
        ..new_task(handler)
    }
}

/// One idempotency key in two namespaces is two tasks; a list, a claim and
/// the READY counts of one namespace never show the other's.
pub async fn namespaces_keep_tasks_apart(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let keyed = |ns: &str| NewTask {
        client_request_id: Some("same-key".into()),
        ..in_ns(ns, "h")
    };
    let a = create(store, keyed("a"), T0).await;
    let b = create(store, keyed("b"), T0).await;
    assert_ne!(a.id, b.id, "a key is unique within its namespace only");
    assert_eq!((a.namespace.as_str(), b.namespace.as_str()), ("a", "b"));
    let again = store
        .create_task(keyed("a"), "fp", T0)
        .await
        .expect("repeat");
    assert!(again.existing && again.task.id == a.id);
    let a2 = create(store, in_ns("a", "h"), T0).await;

    let list = |ns: &str| TaskFilter {
        namespace: Some(ns.into()),
        limit: 10,
        ..TaskFilter::default()
    };
    let ids = |page: crate::TaskPage| page.tasks.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_tasks(&list("a")).await.unwrap()),
        [a2.id.as_str(), a.id.as_str()]
    );
    assert_eq!(
        ids(store.list_tasks(&list("b")).await.unwrap()),
        [b.id.as_str()]
    );
    assert!(store.list_tasks(&list("c")).await.unwrap().tasks.is_empty());
    let all = TaskFilter {
        limit: 10,
        ..TaskFilter::default()
    };
    assert_eq!(store.list_tasks(&all).await.unwrap().tasks.len(), 3);

    assert_eq!(
        store.ready_counts().await.unwrap(),
        [
            ("a".to_string(), "h".to_string(), 2),
            ("b".into(), "h".into(), 1)
        ]
    );
    let mut offered = Vec::new();
    let claimed = store
        .claim_ready("b", "h", 10, T0, &mut |t: &taskmesh_core::TaskRecord| {
            offered.push(t.namespace.clone());
            Some(Claim {
                execution_id: new_execution_id(),
                worker_id: "w-b".into(),
                ack_deadline: T0 + 5_000,
            })
        })
        .await
        .unwrap();
    assert_eq!(offered, ["b"], "a claim in b is offered b's tasks only");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, b.id);
    assert_eq!(claimed[0].state, TaskState::Dispatching);
}

/// Schedules listed by namespace show only that namespace's; their fires
/// create tasks in it.
pub async fn schedules_list_by_namespace(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    for (id, ns) in [("s-1", "a"), ("s-2", "b"), ("s-3", "a")] {
        let s = taskmesh_core::schedule::ScheduleRecord {
            namespace: ns.into(),
            ..schedule(id, Some(T0))
        };
        store.create_schedule(&s).await.expect("create");
    }
    let (in_a, next) = store.list_schedules(Some("a"), None, 10).await.unwrap();
    assert_eq!(
        in_a.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["s-1", "s-3"]
    );
    assert!(next.is_none());
    assert!(in_a.iter().all(|s| s.namespace == "a"));
    let (all, _) = store.list_schedules(None, None, 10).await.unwrap();
    assert_eq!(all.len(), 3);
    let s2 = store.get_schedule("s-2").await.unwrap().expect("s-2");
    assert_eq!(s2.namespace, "b");
    assert_eq!(s2.new_task("t".into(), T0, T0).namespace, "b");
}

/// Tokens: stored as given, listed by namespace, revoked once; a taken id
/// and a missing one are errors.
pub async fn tokens_are_stored_listed_and_revoked(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let (_, admin) = new_token("ops", "a", Role::Admin, T0, None);
    let (_, reader) = new_token("dash", "a", Role::Reader, T0, Some(T0 + 60_000));
    let (_, worker) = new_token("pool", "b", Role::Worker, T0, None);
    for t in [&admin, &reader, &worker] {
        store.create_token(t).await.expect("create");
    }
    let err = store.create_token(&admin).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert_eq!(
        store.get_token(&reader.id).await.unwrap(),
        Some(reader.clone())
    );
    assert_eq!(store.get_token("000000000000").await.unwrap(), None);
    let in_a = store.list_tokens(Some("a")).await.unwrap();
    let mut want = vec![admin.clone(), reader.clone()];
    want.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(in_a, want);
    assert_eq!(store.list_tokens(None).await.unwrap().len(), 3);

    assert!(store.revoke_token(&reader.id, T0 + 5).await.unwrap());
    assert!(!store.revoke_token(&reader.id, T0 + 6).await.unwrap());
    let revoked = store.get_token(&reader.id).await.unwrap().expect("kept");
    assert_eq!(revoked.revoked_at, Some(T0 + 5));
    assert!(!revoked.is_live(T0 + 10));
    let err = store.revoke_token("000000000000", T0).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

/// The cluster key is made by the first caller and then the same for every
/// caller, across a reopen.
pub async fn cluster_key_is_made_once(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let first = store.cluster_key().await.expect("key");
    assert_eq!(first.len(), 32);
    assert_eq!(store.cluster_key().await.expect("key"), first);
    drop(store);
    let store = fixture.open().await;
    assert_eq!(store.cluster_key().await.expect("key"), first);
}
