//! Scenarios for schedules: CRUD with compare-and-set, due queries, and the
//! all-or-nothing fire commit that never creates two tasks for one fire.

use taskmesh_core::schedule::{
    FireOutcome, FireRecord, MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord,
    TaskTemplate,
};
use taskmesh_core::{Event, RetryPolicy, TaskState};

use super::{StoreFixture, T0, get};
use crate::{FireCommit, Store};

pub(super) fn schedule(id: &str, next: Option<i64>) -> ScheduleRecord {
    ScheduleRecord {
        id: id.into(),
        namespace: "default".into(),
        name: format!("name-{id}"),
        kind: ScheduleKind::Cron,
        cron_expression: "* * * * * *".into(),
        interval_ms: 0,
        time_zone: "Europe/London".into(),
        template: TaskTemplate {
            handler: "echo".into(),
            payload: b"{\"s\":1}".to_vec(),
            content_type: "application/json".into(),
            priority: 2,
            labels: [("zone".to_string(), "eu".to_string())].into(),
            routing_key: "rk".into(),
            retry: RetryPolicy::default(),
            timeout_ms: 30_000,
            callback_url: String::new(),
            balancer: None,
            concurrency: Some(taskmesh_core::Concurrency {
                key: "nightly".into(),
                limit: 1,
            }),
            broadcast: false,
        },
        workflow: None,
        misfire: MisfirePolicy::CatchUp,
        max_catch_up: 3,
        overlap: OverlapPolicy::Skip,
        paused: false,
        next_fire_at: next,
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: T0,
        updated_at: T0,
        version: 1,
    }
}

pub(super) fn fire_commit(store_sched: &ScheduleRecord, fire_at: i64, task_id: &str) -> FireCommit {
    let mut next = store_sched.clone();
    next.version += 1;
    next.last_fire_at = Some(fire_at);
    next.last_task_id = Some(task_id.to_string());
    next.next_fire_at = Some(fire_at + 1_000);
    next.fire_count += 1;
    FireCommit {
        tasks: vec![(
            store_sched.new_task(task_id.to_string(), fire_at, fire_at),
            "fp".into(),
        )],
        fires: vec![FireRecord {
            fire_at,
            handled_at: fire_at,
            outcome: FireOutcome::Created,
            task_id: Some(task_id.to_string()),
        }],
        schedule: next,
        expected_version: store_sched.version,
        cancel: None,
    }
}

/// Create, get, list, update by compare-and-set, delete.
pub async fn schedule_crud_with_cas(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let a = schedule("sched-a", Some(T0 + 1_000));
    store.create_schedule(&a).await.expect("create");
    assert!(
        store.create_schedule(&a).await.is_err(),
        "a taken id is refused"
    );
    assert_eq!(
        store.get_schedule("sched-a").await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(store.get_schedule("nope").await.unwrap(), None);
    for id in ["sched-b", "sched-c"] {
        store.create_schedule(&schedule(id, None)).await.unwrap();
    }
    let (page, next) = store.list_schedules(None, None, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["sched-a", "sched-b"]
    );
    let (rest, none) = store
        .list_schedules(None, next.as_deref(), 2)
        .await
        .unwrap();
    assert_eq!(
        rest.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["sched-c"]
    );
    assert_eq!(none, None);

    let mut paused = a.clone();
    paused.paused = true;
    paused.version = 2;
    assert!(store.update_schedule(&paused, 1).await.unwrap());
    assert!(
        !store.update_schedule(&paused, 1).await.unwrap(),
        "a stale version writes nothing"
    );
    assert_eq!(store.get_schedule("sched-a").await.unwrap(), Some(paused));
    assert!(store.delete_schedule("sched-a").await.unwrap());
    assert!(!store.delete_schedule("sched-a").await.unwrap());
    assert!(
        store.update_schedule(&a, 2).await.is_err(),
        "updating a deleted schedule is NotFound"
    );
}

/// Due schedules are active ones whose next fire time has passed.
pub async fn due_schedules_and_next_due(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    store
        .create_schedule(&schedule("s1", Some(T0 + 2_000)))
        .await
        .unwrap();
    store
        .create_schedule(&schedule("s2", Some(T0 + 1_000)))
        .await
        .unwrap();
    let mut paused = schedule("s3", Some(T0));
    paused.paused = true;
    store.create_schedule(&paused).await.unwrap();
    store.create_schedule(&schedule("s4", None)).await.unwrap();

    assert_eq!(
        store.next_schedule_due_at().await.unwrap(),
        Some(T0 + 1_000)
    );
    assert!(
        store.due_schedules(T0 + 999, 10).await.unwrap().is_empty(),
        "never early"
    );
    let due = store.due_schedules(T0 + 2_000, 10).await.unwrap();
    assert_eq!(
        due.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["s2", "s1"]
    );
}

/// A fire commit writes the schedule, the fire record and the task together;
/// a stale commit writes nothing; the same fire key never makes two tasks.
pub async fn fire_commit_is_atomic_and_idempotent(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    let s = schedule("fire", Some(T0));
    store.create_schedule(&s).await.unwrap();
    let mut changes = store.subscribe_schedules();

    let task_id = taskmesh_core::id::new_task_id();
    let commit = fire_commit(&s, T0, &task_id);
    let done = store
        .commit_fires(commit.clone(), T0 + 5)
        .await
        .unwrap()
        .expect("committed");
    assert_eq!(done.tasks.len(), 1);
    let task = get(store, &task_id).await;
    assert_eq!(task.schedule_id.as_deref(), Some("fire"));
    assert_eq!(task.client_request_id, Some(s.fire_key(T0)));
    assert_eq!((task.state, task.priority), (TaskState::Ready, 2));
    let stored = store.get_schedule("fire").await.unwrap().unwrap();
    assert_eq!((stored.version, stored.fire_count), (2, 1));
    assert_eq!(changes.try_recv().unwrap().next_fire_at, Some(T0 + 1_000));

    // The same commit again: the schedule moved on, nothing is written.
    assert!(store.commit_fires(commit, T0 + 6).await.unwrap().is_none());
    // A commit from the new version that repeats the fire key finds the task.
    let again = fire_commit(&stored, T0, &taskmesh_core::id::new_task_id());
    let done = store
        .commit_fires(again, T0 + 7)
        .await
        .unwrap()
        .expect("committed");
    assert_eq!(
        done.tasks[0].id, task_id,
        "one fire never creates two tasks"
    );
    let fires = store.recent_fires("fire", 10).await.unwrap();
    assert_eq!(fires.len(), 1);
    assert_eq!(
        (fires[0].fire_at, fires[0].outcome),
        (T0, FireOutcome::Created)
    );
    let page = store
        .list_tasks(&crate::TaskFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.tasks.len(), 1);
}

/// Schedules due together are written in one go: a new fire creates its
/// task, a fire whose key a task holds already answers with that task, a
/// stale compare-and-set writes nothing for its schedule only. When the
/// batch cannot be written (here: two fires claiming one key), every
/// schedule still gets its own answer, one task per key.
pub async fn fire_commits_of_many_schedules_go_together(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    for id in ["ma", "mb", "mc"] {
        store
            .create_schedule(&schedule(id, Some(T0)))
            .await
            .unwrap();
    }
    let a = schedule("ma", Some(T0));
    let c = schedule("mc", Some(T0));
    // mb fired T0 once already.
    let b_first = taskmesh_core::id::new_task_id();
    store
        .commit_fires(fire_commit(&schedule("mb", Some(T0)), T0, &b_first), T0)
        .await
        .unwrap()
        .expect("first fire of mb");
    let b = store.get_schedule("mb").await.unwrap().unwrap();

    let a_task = taskmesh_core::id::new_task_id();
    let mut stale = fire_commit(&c, T0, &taskmesh_core::id::new_task_id());
    stale.expected_version = 7;
    let results = store
        .commit_fires_many(
            vec![
                fire_commit(&a, T0, &a_task),
                fire_commit(&b, T0, &taskmesh_core::id::new_task_id()),
                stale,
            ],
            T0 + 5,
            None,
        )
        .await
        .unwrap();
    assert_eq!(results.len(), 3);
    let ids = |r: &crate::Result<Option<crate::FireCommitted>>| -> Option<Vec<String>> {
        r.as_ref()
            .expect("no error")
            .as_ref()
            .map(|d| d.tasks.iter().map(|t| t.id.clone()).collect())
    };
    assert_eq!(ids(&results[0]), Some(vec![a_task.clone()]));
    assert_eq!(
        ids(&results[1]),
        Some(vec![b_first.clone()]),
        "a held key answers with its task"
    );
    assert_eq!(
        ids(&results[2]),
        None,
        "a stale compare-and-set writes nothing"
    );
    assert_eq!(get(store, &a_task).await.schedule_id.as_deref(), Some("ma"));
    let versions = [
        store.get_schedule("ma").await.unwrap().unwrap().version,
        store.get_schedule("mb").await.unwrap().unwrap().version,
        store.get_schedule("mc").await.unwrap().unwrap().version,
    ];
    assert_eq!(versions, [2, 3, 1]);
    assert_eq!(store.recent_fires("ma", 10).await.unwrap().len(), 1);
    assert_eq!(store.recent_fires("mb", 10).await.unwrap().len(), 1);
    assert!(store.recent_fires("mc", 10).await.unwrap().is_empty());

    // Two fires claiming one key in one batch: the batch cannot be written
    // whole; each schedule still gets an answer and the key one task.
    let a = store.get_schedule("ma").await.unwrap().unwrap();
    let c = store.get_schedule("mc").await.unwrap().unwrap();
    let first = taskmesh_core::id::new_task_id();
    let mut clash = fire_commit(&c, T0 + 1_000, &taskmesh_core::id::new_task_id());
    clash.tasks[0].0.client_request_id = Some(a.fire_key(T0 + 1_000));
    let results = store
        .commit_fires_many(
            vec![fire_commit(&a, T0 + 1_000, &first), clash],
            T0 + 1_005,
            None,
        )
        .await
        .unwrap();
    assert_eq!(ids(&results[0]), Some(vec![first.clone()]));
    assert_eq!(
        ids(&results[1]),
        Some(vec![first.clone()]),
        "the key's one task"
    );
    let page = store
        .list_tasks(&crate::TaskFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.tasks.len(), 3, "ma twice, mb once: {:?}", page.tasks);
}

/// CANCEL_PREVIOUS: the previous run is cancelled in the same transaction.
pub async fn fire_commit_cancels_the_previous_run(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    let s = schedule("cp", Some(T0));
    store.create_schedule(&s).await.unwrap();
    let first = taskmesh_core::id::new_task_id();
    store
        .commit_fires(fire_commit(&s, T0, &first), T0)
        .await
        .unwrap()
        .unwrap();
    let s = store.get_schedule("cp").await.unwrap().unwrap();
    let second = taskmesh_core::id::new_task_id();
    let mut commit = fire_commit(&s, T0 + 1_000, &second);
    commit.cancel = Some((
        first.clone(),
        Event::Cancel {
            reason: "overlap".into(),
        },
    ));
    let done = store
        .commit_fires(commit, T0 + 1_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.cancelled.map(|t| t.state), Some(TaskState::Ready));
    assert_eq!(get(store, &first).await.state, TaskState::Cancelled);
    assert_eq!(get(store, &second).await.state, TaskState::Ready);
}

/// Fixed-delay schedules waiting for their run are listed with that run.
pub async fn awaiting_run_end_lists_fixed_delay_waiters(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    let mut s = schedule("fd", Some(T0));
    s.kind = ScheduleKind::FixedDelay;
    s.interval_ms = 5_000;
    store.create_schedule(&s).await.unwrap();
    assert!(
        store
            .schedules_awaiting_run_end(10)
            .await
            .unwrap()
            .is_empty()
    );
    let task_id = taskmesh_core::id::new_task_id();
    let mut commit = fire_commit(&s, T0, &task_id);
    commit.schedule.next_fire_at = None;
    store.commit_fires(commit, T0).await.unwrap().unwrap();
    let waiting = store.schedules_awaiting_run_end(10).await.unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].0.id, "fd");
    assert_eq!(
        waiting[0].1.as_ref().map(|t| t.id.as_str()),
        Some(task_id.as_str())
    );
}

/// `commit_fires_dispatching`: a fire's new READY task the chooser claims is
/// stored DISPATCHING for that claim with its attempt opened, in the fire's
/// own commit; a fire whose key a task holds already answers with that
/// task and is not offered; a task with a concurrency key is not offered;
/// one the chooser leaves is stored READY. A schedule due alone is
/// dispatched the same way.
pub async fn fire_commit_dispatching_claims_the_new_tasks(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    let free = |id: &str| ScheduleRecord {
        template: TaskTemplate {
            concurrency: None,
            ..schedule(id, Some(T0)).template
        },
        ..schedule(id, Some(T0))
    };
    for s in [free("da"), free("db"), free("dc"), schedule("dk", Some(T0))] {
        store.create_schedule(&s).await.unwrap();
    }
    // dc fired T0 once already: its task holds the key.
    let c_first = taskmesh_core::id::new_task_id();
    store
        .commit_fires(fire_commit(&free("dc"), T0, &c_first), T0)
        .await
        .unwrap()
        .expect("first fire of dc");
    let c = store.get_schedule("dc").await.unwrap().unwrap();
    let (a_task, b_task, k_task) = (
        taskmesh_core::id::new_task_id(),
        taskmesh_core::id::new_task_id(),
        taskmesh_core::id::new_task_id(),
    );
    let mut feed = store.subscribe();
    let mut offered: Vec<String> = Vec::new();
    let mut chooser = |task: &taskmesh_core::TaskRecord| {
        offered.push(task.id.clone());
        // db's task is left READY.
        (task.schedule_id.as_deref() != Some("db")).then(|| crate::Claim {
            execution_id: format!("exec-{}", task.schedule_id.as_deref().unwrap_or("?")),
            worker_id: "w-fire".into(),
            ack_deadline: T0 + 5_000,
        })
    };
    let results = store
        .commit_fires_dispatching(
            vec![
                fire_commit(&free("da"), T0, &a_task),
                fire_commit(&free("db"), T0, &b_task),
                fire_commit(&c, T0, &taskmesh_core::id::new_task_id()),
                fire_commit(&schedule("dk", Some(T0)), T0, &k_task),
            ],
            T0 + 5,
            None,
            &mut chooser,
        )
        .await
        .unwrap();
    let mut offered_sorted = offered.clone();
    offered_sorted.sort();
    let mut expected = vec![a_task.clone(), b_task.clone()];
    expected.sort();
    assert_eq!(
        offered_sorted, expected,
        "only new tasks without a key are offered"
    );
    let answered: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("no error").expect("committed").tasks)
        .collect();
    assert_eq!(answered[0][0].state, TaskState::Dispatching);
    assert_eq!(answered[0][0].execution_id.as_deref(), Some("exec-da"));
    assert_eq!(answered[1][0].state, TaskState::Ready);
    assert_eq!(
        answered[2][0].id, c_first,
        "a held key answers with its task"
    );
    assert_eq!(answered[2][0].state, TaskState::Ready);
    assert_eq!(answered[3][0].state, TaskState::Ready);

    let a = get(store, &a_task).await;
    assert_eq!(a.state, TaskState::Dispatching);
    assert_eq!(
        (a.attempt, a.attempts.len()),
        (1, 1),
        "its attempt opened with it"
    );
    assert_eq!(a.attempts[0].execution_id, "exec-da");
    assert_eq!(a.attempts[0].worker_id, "w-fire");
    assert_eq!(a.next_at, Some(T0 + 5_000), "the ACK deadline");
    assert_eq!(a.schedule_id.as_deref(), Some("da"));
    assert_eq!(get(store, &b_task).await.state, TaskState::Ready);
    assert_eq!(get(store, &k_task).await.state, TaskState::Ready);
    let states = super::feed_states(&mut feed, 3).await;
    assert_eq!(states[&a_task], TaskState::Dispatching);
    assert_eq!(states[&b_task], TaskState::Ready);

    // A schedule due alone is dispatched at its fire too.
    let a_next = store.get_schedule("da").await.unwrap().unwrap();
    let alone = taskmesh_core::id::new_task_id();
    let mut claims = 0;
    let mut chooser = |_: &taskmesh_core::TaskRecord| {
        claims += 1;
        Some(crate::Claim {
            execution_id: "exec-alone".into(),
            worker_id: "w-fire".into(),
            ack_deadline: T0 + 6_000,
        })
    };
    store
        .commit_fires_dispatching(
            vec![fire_commit(&a_next, T0 + 1_000, &alone)],
            T0 + 1_005,
            None,
            &mut chooser,
        )
        .await
        .unwrap();
    assert_eq!(claims, 1);
    let alone = get(store, &alone).await;
    assert_eq!(alone.state, TaskState::Dispatching);
    assert_eq!(alone.attempts.len(), 1);
    // The claimed task goes on like any claimed one.
    store
        .transition(&a_task, &super::ack("exec-da"), T0 + 10)
        .await
        .expect("ack");
    assert_eq!(get(store, &a_task).await.state, TaskState::Running);
}
