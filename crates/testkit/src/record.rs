//! The proof of a run of a cluster under faults (the chaos test, the fault
//! tests): the store's record checked against the workers' ledgers (one
//! line per handler execution, written before it runs).
//!
//! [`prove`] asserts, failing the test otherwise:
//! - the store holds each accepted task once (retried batches doubled
//!   nothing) and every one SUCCEEDED (the handlers never fail);
//! - no task SUCCEEDED twice: one SUCCEEDED attempt per task, and that
//!   attempt's execution is in a ledger exactly once;
//! - every handler execution is one attempt (execution id, task, attempt
//!   number and worker agree with the store), and every execution beyond
//!   the first of a task is a later attempt whose earlier executions the
//!   caller's `explain` accounts for (a kill, a cut link);
//! - a schedule's fires: one record per fire time, one task per created
//!   fire, no fire time with two tasks.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::db::{Arg, AttemptRow, Db};
use crate::process::LedgerLine;

/// The figures of a proven run.
#[derive(Debug, Default)]
pub struct Proof {
    /// Tasks accepted by the submitter.
    pub accepted: usize,
    /// Of them, SUCCEEDED (all of them, or `prove` failed).
    pub succeeded: usize,
    /// Handler executions in the ledgers.
    pub executions: usize,
    /// Executions beyond the first of a task.
    pub extra: usize,
    /// Tasks executed more than once.
    pub tasks_run_again: usize,
    /// Earlier executions per explanation (what `explain` said).
    pub explained: BTreeMap<String, usize>,
    /// Earlier executions per attempt outcome and message.
    pub why: BTreeMap<String, usize>,
    /// Attempts in the store.
    pub attempts: usize,
    /// Fire records of the schedule, and the tasks they created.
    pub fires: i64,
    pub fire_tasks: usize,
}

impl Proof {
    /// One line of figures: `accepted N lost 0 succeeded-twice 0 …`.
    pub fn summary(&self) -> String {
        let explained: Vec<String> = self
            .explained
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        format!(
            "accepted {} lost 0 succeeded-twice 0 executions {} extra {} on {} tasks \
             (explained: {}) fires {} tasks-per-fire {}",
            self.accepted,
            self.executions,
            self.extra,
            self.tasks_run_again,
            if explained.is_empty() {
                "none needed".into()
            } else {
                explained.join(", ")
            },
            self.fires,
            if self.fires == 0 {
                "-".into()
            } else {
                format!("{:.2}", self.fire_tasks as f64 / self.fires as f64)
            }
        )
    }
}

/// Checks the record; see the module documentation. `schedule` is the id
/// of the schedule that fired during the run, if any. `explain` is asked
/// about every execution of a task run more than once whose attempt did
/// not succeed, with that attempt's row; it names what explains it, or
/// returns `None` (the test fails listing those).
pub async fn prove(
    db: &Db,
    accepted: &[String],
    ledger: &[LedgerLine],
    schedule: Option<&str>,
    explain: impl Fn(&LedgerLine, &AttemptRow) -> Option<String>,
) -> Proof {
    let tasks = db.tasks().await.expect("read the tasks");
    let state_of: HashMap<&str, &str> = tasks
        .iter()
        .map(|(id, s, _, _)| (id.as_str(), s.as_str()))
        .collect();
    let submitted = tasks.iter().filter(|t| t.2.is_none()).count();
    assert_eq!(
        submitted,
        accepted.len(),
        "the store holds each accepted task once (retried batches doubled nothing)"
    );
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for id in accepted {
        let s = state_of
            .get(id.as_str())
            .unwrap_or_else(|| panic!("accepted task {id} is not in the store"));
        *by_state.entry(s).or_default() += 1;
    }
    let succeeded = by_state.get("SUCCEEDED").copied().unwrap_or(0);
    assert_eq!(
        succeeded,
        accepted.len(),
        "every accepted task SUCCEEDED: {by_state:?}"
    );

    let attempts = db.attempts().await.expect("read the attempts");
    let by_exec: HashMap<&str, &AttemptRow> = attempts.iter().map(|a| (a.2.as_str(), a)).collect();
    let mut successes: HashMap<&str, Vec<&str>> = HashMap::new();
    for a in &attempts {
        if a.6.as_deref() == Some("SUCCEEDED") {
            successes.entry(&a.0).or_default().push(&a.2);
        }
    }
    let twice: Vec<_> = successes.iter().filter(|(_, e)| e.len() > 1).collect();
    assert!(twice.is_empty(), "tasks SUCCEEDED twice: {twice:?}");
    // A broadcast runs no attempt of its own: its shards do.
    let broadcasts = db.broadcasts().await.expect("read the broadcasts");
    for (id, state, _, _) in &tasks {
        if state == "SUCCEEDED" && !broadcasts.contains(id) {
            assert_eq!(
                successes.get(id.as_str()).map(Vec::len),
                Some(1),
                "SUCCEEDED task {id} has one SUCCEEDED attempt"
            );
        }
    }

    let mut seen_exec: HashSet<&str> = HashSet::new();
    let mut per_task: HashMap<&str, Vec<&LedgerLine>> = HashMap::new();
    for line in ledger {
        assert!(
            seen_exec.insert(&line.execution_id),
            "execution {} ran twice",
            line.execution_id
        );
        let a = by_exec
            .get(line.execution_id.as_str())
            .unwrap_or_else(|| panic!("ledger execution {line:?} is no attempt in the store"));
        assert_eq!(
            (a.0.as_str(), a.1, a.3.as_str()),
            (line.task_id.as_str(), line.attempt, line.worker_id.as_str()),
            "the ledger and the store agree on execution {}",
            line.execution_id
        );
        per_task.entry(&line.task_id).or_default().push(line);
    }
    for execs in successes.values() {
        assert!(
            seen_exec.contains(execs[0]),
            "the successful execution {} is in a ledger",
            execs[0]
        );
    }
    let mut proof = Proof {
        accepted: accepted.len(),
        succeeded,
        executions: ledger.len(),
        attempts: attempts.len(),
        ..Proof::default()
    };
    let mut unexplained = Vec::new();
    for (task, lines) in &per_task {
        if lines.len() < 2 {
            continue;
        }
        proof.extra += lines.len() - 1;
        proof.tasks_run_again += 1;
        let first = lines.iter().map(|l| l.attempt).min().unwrap();
        for l in lines.iter().filter(|l| l.attempt != first) {
            assert!(
                l.attempt > 1,
                "an extra execution of {task} is a retry: {l:?}"
            );
        }
        for l in lines {
            let a = by_exec[l.execution_id.as_str()];
            if a.6.as_deref() == Some("SUCCEEDED") {
                continue;
            }
            match explain(l, a) {
                Some(reason) => *proof.explained.entry(reason).or_default() += 1,
                None => unexplained.push(format!("{l:?} ended {:?}: {}", a.6, a.7)),
            }
            *proof
                .why
                .entry(format!("{} ({})", a.6.as_deref().unwrap_or("open"), a.7))
                .or_default() += 1;
        }
    }
    assert!(
        unexplained.is_empty(),
        "{} executions are not explained by a fault: {:#?}",
        unexplained.len(),
        &unexplained[..unexplained.len().min(20)]
    );

    if let Some(schedule) = schedule {
        let (fire_rows, fire_times, fire_tasks) = db
            .ints3(
                "SELECT COUNT(*), COUNT(DISTINCT fire_at), COUNT(task_id) FROM schedule_fires \
                 WHERE schedule_id = $1",
                &[Arg::Text(schedule)],
            )
            .await
            .expect("count the fires");
        let fired: Vec<_> = tasks
            .iter()
            .filter(|t| t.2.as_deref() == Some(schedule))
            .collect();
        let keys: HashSet<_> = fired.iter().map(|t| t.3.clone()).collect();
        assert_eq!(fire_rows, fire_times, "one record per fire time");
        assert_eq!(fired.len() as i64, fire_tasks, "one task per created fire");
        assert_eq!(keys.len(), fired.len(), "no fire time has two tasks");
        proof.fires = fire_rows;
        proof.fire_tasks = fired.len();
    }
    proof
}
