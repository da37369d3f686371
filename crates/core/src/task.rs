//! The task as the domain sees it, independent of the wire and the store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{UnixMillis, state::TaskState};

/// Default total attempts of a task.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Default backoff before the first retry.
pub const DEFAULT_INITIAL_BACKOFF_MS: i64 = 1_000;
/// Default growth factor of the backoff.
pub const DEFAULT_BACKOFF_MULTIPLIER: f64 = 2.0;
/// Default cap of any backoff.
pub const DEFAULT_MAX_BACKOFF_MS: i64 = 300_000;
/// Default execution timeout of one attempt.
pub const DEFAULT_TIMEOUT_MS: i64 = 600_000;

/// When a failed attempt is tried again. Always stored with defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Total attempts allowed, the first included (at least 1).
    pub max_attempts: u32,
    /// Backoff before the first retry.
    pub initial_backoff_ms: i64,
    /// Factor applied after each retry (at least 1.0).
    pub multiplier: f64,
    /// Upper bound of any backoff.
    pub max_backoff_ms: i64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            initial_backoff_ms: DEFAULT_INITIAL_BACKOFF_MS,
            multiplier: DEFAULT_BACKOFF_MULTIPLIER,
            max_backoff_ms: DEFAULT_MAX_BACKOFF_MS,
        }
    }
}

/// How the dispatcher chooses among the streams that can take a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Strategy {
    /// Fewest active tasks, ties broken round robin.
    LeastActive,
    /// Each eligible stream in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// Smooth weighted round robin.
    WeightedRoundRobin,
    /// Consistent hash of the routing key.
    ConsistentHash,
    /// Lowest load figure.
    EqualCost,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 6] = [
        Strategy::LeastActive,
        Strategy::RoundRobin,
        Strategy::Random,
        Strategy::WeightedRoundRobin,
        Strategy::ConsistentHash,
        Strategy::EqualCost,
    ];

    /// Stable text form used in the store and configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::LeastActive => "LEAST_ACTIVE",
            Strategy::RoundRobin => "ROUND_ROBIN",
            Strategy::Random => "RANDOM",
            Strategy::WeightedRoundRobin => "WEIGHTED_ROUND_ROBIN",
            Strategy::ConsistentHash => "CONSISTENT_HASH",
            Strategy::EqualCost => "EQUAL_COST",
        }
    }

    /// Parses [`Strategy::as_str`], case-insensitively.
    pub fn parse(text: &str) -> Option<Self> {
        Strategy::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(text))
    }
}

/// The most tasks of one concurrency key a limit may allow in flight.
pub const MAX_CONCURRENCY_LIMIT: u32 = 10_000;

/// A concurrency key: across the cluster, at most `limit` tasks of the
/// namespace carrying `key` are DISPATCHING or RUNNING at once. The store
/// enforces it when it claims (the limit of the task being claimed is the
/// one applied); tasks of one key never hold back tasks of another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Concurrency {
    /// The key, for example `customer:42` (a handler's name caps that
    /// handler). Non-empty, at most 256 characters, no control characters.
    pub key: String,
    /// At most this many in flight, 1..=[`MAX_CONCURRENCY_LIMIT`].
    pub limit: u32,
}

impl Concurrency {
    /// The concurrency of a request's `key` and `limit`: `None` for an empty
    /// key with limit 0, an error naming the problem for any other pair
    /// that is not a valid key with a limit in 1..=[`MAX_CONCURRENCY_LIMIT`].
    pub fn from_parts(key: &str, limit: u32) -> Result<Option<Self>, String> {
        match (key.is_empty(), limit) {
            (true, 0) => Ok(None),
            (true, _) => Err(format!(
                "concurrency_limit {limit} needs a concurrency_key (or give 0)"
            )),
            (false, 0) => Err(format!(
                "concurrency_key needs a concurrency_limit of 1-{MAX_CONCURRENCY_LIMIT}"
            )),
            (false, n) if n > MAX_CONCURRENCY_LIMIT => Err(format!(
                "concurrency_limit {n} is above the limit of {MAX_CONCURRENCY_LIMIT}"
            )),
            (false, _) => {
                crate::validate::short_text("concurrency_key", key)?;
                Ok(Some(Self {
                    key: key.to_string(),
                    limit,
                }))
            }
        }
    }
}

/// A validated request to create a task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewTask {
    /// Id chosen for the task (used only if it is created).
    pub id: String,
    /// The namespace it belongs to (its idempotency key is unique within
    /// it; nothing outside it sees the task).
    pub namespace: String,
    /// Handler name.
    pub handler: String,
    /// Input bytes.
    pub payload: Vec<u8>,
    /// Media type of the payload.
    pub content_type: String,
    /// Higher runs first.
    pub priority: i32,
    /// Labels a worker must carry.
    pub labels: BTreeMap<String, String>,
    /// Consistent-hash key.
    pub routing_key: String,
    /// Idempotency key, if the caller gave one.
    pub client_request_id: Option<String>,
    /// Callback URL, empty for none.
    pub callback_url: String,
    /// Retry policy with defaults filled in.
    pub retry: RetryPolicy,
    /// Execution timeout of one attempt.
    pub timeout_ms: i64,
    /// Earliest instant to run.
    pub run_at: UnixMillis,
    /// W3C traceparent of the submitter, empty for none.
    pub traceparent: String,
    /// Balancer override; `None` means the server's choice for the handler.
    pub balancer: Option<Strategy>,
    /// The schedule that fired this task, if any.
    pub schedule_id: Option<String>,
    /// Its concurrency key and limit, if any.
    pub concurrency: Option<Concurrency>,
    /// The workflow step it is, if any: a step with parents is stored
    /// waiting (PENDING, never due) until they succeed.
    pub workflow: Option<crate::workflow::StepLink>,
    /// The task it is a child of, if any (cancelling that task cancels
    /// this one).
    pub parent_task_id: Option<String>,
    /// A sharding broadcast: stored PENDING (never READY), and spread into
    /// one shard per live worker of its handler when due.
    pub broadcast: bool,
    /// The run of a schedule whose template is a workflow: stored PENDING
    /// (never READY), and spread into that workflow when due.
    pub runs_workflow: bool,
    /// The shard of a broadcast it is, if any.
    pub shard: Option<ShardOf>,
}

/// A shard of a sharding broadcast: its index among `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOf {
    /// 0 to `total - 1`.
    pub index: u32,
    /// How many shards the broadcast has.
    pub total: u32,
}

impl NewTask {
    /// A task of `handler` due at `run_at`, with a fresh id and the
    /// defaults of a request that names nothing else: an empty JSON object
    /// as payload, priority 0, no labels, key or callback, the default
    /// retry policy and a 60 s timeout. Change fields with struct update
    /// syntax: `NewTask { priority: 5, ..NewTask::new("echo", now) }`.
    pub fn new(handler: impl Into<String>, run_at: UnixMillis) -> Self {
        Self {
            id: crate::id::new_task_id(),
            namespace: crate::validate::DEFAULT_NAMESPACE.to_string(),
            handler: handler.into(),
            payload: b"{}".to_vec(),
            content_type: "application/json".into(),
            priority: 0,
            labels: BTreeMap::new(),
            routing_key: String::new(),
            client_request_id: None,
            callback_url: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: 60_000,
            run_at,
            traceparent: String::new(),
            balancer: None,
            schedule_id: None,
            concurrency: None,
            workflow: None,
            parent_task_id: None,
            broadcast: false,
            runs_workflow: false,
            shard: None,
        }
    }

    /// A digest of everything the caller asked for, so a repeated
    /// `client_request_id` can be told apart from a different request. The id
    /// and `run_at` resolved from a relative delay are left out on purpose.
    pub fn request_fingerprint(&self, requested_run_at: Option<UnixMillis>) -> String {
        use sha2::{Digest, Sha256};
        #[derive(Serialize)]
        struct Fingerprint<'a> {
            handler: &'a str,
            payload: &'a [u8],
            content_type: &'a str,
            priority: i32,
            labels: &'a BTreeMap<String, String>,
            routing_key: &'a str,
            callback_url: &'a str,
            balancer: Option<Strategy>,
            retry: &'a RetryPolicy,
            timeout_ms: i64,
            run_at: Option<UnixMillis>,
            // Left out when unset: fingerprints stored before keys existed
            // still match their requests.
            #[serde(skip_serializing_if = "Option::is_none")]
            concurrency: Option<&'a Concurrency>,
            #[serde(skip_serializing_if = "Option::is_none")]
            parent_task_id: Option<&'a str>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            broadcast: bool,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            runs_workflow: bool,
        }
        let body = serde_json::to_vec(&Fingerprint {
            handler: &self.handler,
            payload: &self.payload,
            content_type: &self.content_type,
            priority: self.priority,
            labels: &self.labels,
            routing_key: &self.routing_key,
            callback_url: &self.callback_url,
            balancer: self.balancer,
            retry: &self.retry,
            timeout_ms: self.timeout_ms,
            run_at: requested_run_at,
            concurrency: self.concurrency.as_ref(),
            parent_task_id: self.parent_task_id.as_deref(),
            broadcast: self.broadcast,
            runs_workflow: self.runs_workflow,
        })
        .unwrap_or_default();
        let digest = Sha256::digest(&body);
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The record of this task as first stored at `now`.
    pub fn into_record(self, now: UnixMillis) -> TaskRecord {
        let waits = self
            .workflow
            .as_ref()
            .is_some_and(|w| !w.depends_on.is_empty() || w.on_failure);
        // A broadcast or a workflow's run is never READY: the leader
        // spreads it when due.
        let due = self.run_at <= now && !waits && !self.broadcast && !self.runs_workflow;
        let state = if due {
            TaskState::Ready
        } else {
            TaskState::Pending
        };
        let mut times = StateTimes::default();
        if due {
            times.ready = Some(now);
        } else {
            times.pending = Some(now);
        }
        TaskRecord {
            id: self.id,
            namespace: self.namespace,
            handler: self.handler,
            payload: self.payload,
            content_type: self.content_type,
            state,
            priority: self.priority,
            labels: self.labels,
            routing_key: self.routing_key,
            client_request_id: self.client_request_id,
            callback_url: self.callback_url,
            retry: self.retry,
            timeout_ms: self.timeout_ms,
            run_at: self.run_at,
            created_at: now,
            updated_at: now,
            times,
            attempt: 0,
            run_count: 0,
            execution_id: None,
            worker_id: None,
            next_at: if due || waits {
                None
            } else {
                Some(self.run_at)
            },
            output: None,
            output_content_type: String::new(),
            error_message: String::new(),
            version: 1,
            traceparent: self.traceparent,
            balancer: self.balancer,
            schedule_id: self.schedule_id,
            concurrency: self.concurrency,
            workflow: self.workflow,
            parent_task_id: self.parent_task_id,
            broadcast: self.broadcast,
            runs_workflow: self.runs_workflow,
            shard: self.shard,
            attempts: Vec::new(),
            callback: None,
        }
    }
}

/// When a task last entered each state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateTimes {
    /// Entered PENDING.
    pub pending: Option<UnixMillis>,
    /// Last entered READY.
    pub ready: Option<UnixMillis>,
    /// Last entered DISPATCHING.
    pub dispatching: Option<UnixMillis>,
    /// Last entered RUNNING.
    pub running: Option<UnixMillis>,
    /// Last entered RETRYING.
    pub retrying: Option<UnixMillis>,
    /// Entered its terminal state.
    pub end: Option<UnixMillis>,
}

/// A task as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// Task id.
    pub id: String,
    /// The namespace it belongs to.
    pub namespace: String,
    /// Handler name.
    pub handler: String,
    /// Input bytes.
    pub payload: Vec<u8>,
    /// Media type of the payload.
    pub content_type: String,
    /// Current state.
    pub state: TaskState,
    /// Higher runs first.
    pub priority: i32,
    /// Labels a worker must carry.
    pub labels: BTreeMap<String, String>,
    /// Consistent-hash key.
    pub routing_key: String,
    /// Idempotency key.
    pub client_request_id: Option<String>,
    /// Callback URL, empty for none.
    pub callback_url: String,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Execution timeout of one attempt.
    pub timeout_ms: i64,
    /// Earliest instant to run.
    pub run_at: UnixMillis,
    /// When accepted.
    pub created_at: UnixMillis,
    /// When last changed.
    pub updated_at: UnixMillis,
    /// When each state was entered.
    pub times: StateTimes,
    /// Pushes so far (the current attempt's number while DISPATCHING/RUNNING).
    pub attempt: u32,
    /// Attempts that reached RUNNING.
    pub run_count: u32,
    /// Current attempt's execution id while DISPATCHING or RUNNING.
    pub execution_id: Option<String>,
    /// Current attempt's worker while DISPATCHING or RUNNING.
    pub worker_id: Option<String>,
    /// The instant this task next needs attention: run_at while PENDING, the
    /// backoff end while RETRYING, the ACK deadline while DISPATCHING, the
    /// execution deadline while RUNNING; `None` otherwise. One indexed column
    /// serves the promoter and both reapers.
    pub next_at: Option<UnixMillis>,
    /// Output bytes once SUCCEEDED.
    pub output: Option<Vec<u8>>,
    /// Media type of the output.
    pub output_content_type: String,
    /// Last error message.
    pub error_message: String,
    /// Bumped by every transition; the compare-and-set key.
    pub version: i64,
    /// W3C traceparent of the submitter.
    pub traceparent: String,
    /// Balancer override; `None` means the server's choice for the handler.
    pub balancer: Option<Strategy>,
    /// The schedule that fired this task, if any.
    pub schedule_id: Option<String>,
    /// Its concurrency key and limit, if any.
    pub concurrency: Option<Concurrency>,
    /// The workflow step it is, if any.
    pub workflow: Option<crate::workflow::StepLink>,
    /// The task it is a child of, if any.
    pub parent_task_id: Option<String>,
    /// A sharding broadcast ([`NewTask::broadcast`]).
    pub broadcast: bool,
    /// A schedule's workflow run ([`NewTask::runs_workflow`]).
    pub runs_workflow: bool,
    /// The shard of a broadcast it is, if any.
    pub shard: Option<ShardOf>,
    /// Attempts, oldest first (may be left empty by list queries).
    pub attempts: Vec<AttemptRecord>,
    /// The callback outbox entry, once the task ended with a callback URL.
    /// Read from the outbox, not the task row: transitions never write it
    /// (the store queues it, see [`TaskRecord::wants_callback`]).
    pub callback: Option<crate::callback::CallbackDelivery>,
}

impl TaskRecord {
    /// True for a task the leader spreads into a workflow of children when
    /// it falls due (a broadcast into its shards, a schedule's workflow run
    /// into its steps) instead of making it READY: RUNNING without an
    /// attempt of its own while they run, ended with them.
    pub fn spreads(&self) -> bool {
        self.broadcast || self.runs_workflow
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttemptOutcome {
    /// Handler succeeded.
    Succeeded,
    /// Handler failed.
    Failed,
    /// Ran past the timeout.
    TimedOut,
    /// Task cancelled during the attempt.
    Cancelled,
    /// No ACK in time.
    AckTimeout,
    /// Worker refused the push.
    Rejected,
    /// Worker's stream closed or the server restarted.
    WorkerLost,
}

impl AttemptOutcome {
    /// Stable text form used in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "SUCCEEDED",
            AttemptOutcome::Failed => "FAILED",
            AttemptOutcome::TimedOut => "TIMED_OUT",
            AttemptOutcome::Cancelled => "CANCELLED",
            AttemptOutcome::AckTimeout => "ACK_TIMEOUT",
            AttemptOutcome::Rejected => "REJECTED",
            AttemptOutcome::WorkerLost => "WORKER_LOST",
        }
    }

    /// Parses [`AttemptOutcome::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "SUCCEEDED" => AttemptOutcome::Succeeded,
            "FAILED" => AttemptOutcome::Failed,
            "TIMED_OUT" => AttemptOutcome::TimedOut,
            "CANCELLED" => AttemptOutcome::Cancelled,
            "ACK_TIMEOUT" => AttemptOutcome::AckTimeout,
            "REJECTED" => AttemptOutcome::Rejected,
            "WORKER_LOST" => AttemptOutcome::WorkerLost,
            _ => return None,
        })
    }
}

/// One try at running a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// 1-based number among all pushes of the task.
    pub number: u32,
    /// Unique id of the attempt.
    pub execution_id: String,
    /// Worker it was pushed to.
    pub worker_id: String,
    /// When pushed.
    pub started_at: UnixMillis,
    /// When ended.
    pub ended_at: Option<UnixMillis>,
    /// How it ended; `None` while under way.
    pub outcome: Option<AttemptOutcome>,
    /// Reason or error message.
    pub message: String,
}
