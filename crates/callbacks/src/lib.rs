//! Callback delivery: posts each ended task with a `callback_url` to its
//! receiver, from the store's durable outbox.
//!
//! The store queues the outbox entry in the same transaction as the task's
//! terminal transition, so a crash can delay a callback but never lose one.
//! This loop claims due entries (a lease, so one try runs at a time across
//! replicas and a crashed try comes back), posts the `TaskCallback` JSON
//! signed in the Standard Webhooks scheme, and records the outcome:
//! delivered on 2xx, otherwise retried with exponential backoff (equal
//! jitter) until the policy's tries run out. Delivery is at least once;
//! receivers de-duplicate on the delivery id.
//!
//! One receiver cannot hold up another's callbacks: tries run on their own
//! (the loop claims more as soon as a slot frees, it never waits for a
//! round's slowest POST), at most `per_host` at once per receiver
//! (`scheme://host:port`); entries for a receiver at its limit are put
//! back for a moment, longer each time it is still full. Where a callback
//! may go is the egress policy's: a literal address is checked before the
//! POST, a name's resolved addresses before the connect (only those are
//! dialled), redirects are never followed and no proxy is used. What is
//! stored for callers is a class ("HTTP 503", "timeout", "connect failed",
//! "refused by the egress policy"); the detail goes to the server log.
//!
//! Architecture invariant: this crate talks to the store through the
//! `Store` trait only (no SQL) and knows nothing of gRPC servers or the
//! REST gateway; it uses the contract only to encode the body.

mod egress;
mod hosts;
mod payload;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use taskmesh_core::egress::EgressPolicy;
use taskmesh_core::{CallbackJob, CallbackOutcome, CallbackPolicy, Clock};
use taskmesh_store::Store;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use payload::{
    DELIVERY_HEADER, Encoder, SECRET_PREFIX, SIGNATURE_HEADER, TIMESTAMP_HEADER, message,
    signature, signatures, signing_key,
};

/// What can go wrong building or running the deliverer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The compiled contract lacks what the body needs.
    #[error("contract: {0}")]
    Contract(String),
    /// The HTTP client cannot be built.
    #[error("http client: {0}")]
    Client(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] taskmesh_store::Error),
}

/// How callbacks are delivered.
#[derive(Debug, Clone)]
pub struct CallbackOptions {
    /// Signing secrets (`whsec_` + base64, or plain text); every one signs,
    /// so keys can be rotated. Empty sends callbacks unsigned.
    pub secrets: Vec<String>,
    /// Tries and backoff.
    pub policy: CallbackPolicy,
    /// One POST is given up after this.
    pub request_timeout: Duration,
    /// Opening the connection is given up after this.
    pub connect_timeout: Duration,
    /// A claimed entry comes back to the queue after this if its try never
    /// records an outcome (the deliverer died); longer than a try can take.
    pub lease: Duration,
    /// Entries claimed per round.
    pub batch: usize,
    /// POSTs in flight at once.
    pub concurrency: usize,
    /// POSTs in flight at once to one receiver (`scheme://host:port`).
    pub per_host: usize,
    /// Longest sleep between rounds, so entries queued by another replica
    /// are picked up even without a local wake-up.
    pub idle_poll: Duration,
    /// Where callbacks may go.
    pub egress: EgressPolicy,
}

impl Default for CallbackOptions {
    fn default() -> Self {
        Self {
            secrets: Vec::new(),
            policy: CallbackPolicy::default(),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(60),
            batch: 64,
            concurrency: 64,
            per_host: 8,
            idle_poll: Duration::from_secs(5),
            egress: EgressPolicy::public_only(),
        }
    }
}

/// The delivery loop.
pub struct Deliverer {
    inner: Arc<Inner>,
}

struct Inner {
    opts: CallbackOptions,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    client: reqwest::Client,
    encoder: Encoder,
    keys: Vec<Vec<u8>>,
    hosts: hosts::Hosts,
}

impl Deliverer {
    /// Builds the deliverer and its HTTP client.
    pub fn build(
        opts: CallbackOptions,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, Error> {
        let keys = opts
            .secrets
            .iter()
            .map(|s| signing_key(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::Client)?;
        let client = reqwest::Client::builder()
            .timeout(opts.request_timeout)
            .connect_timeout(opts.connect_timeout)
            // A signed POST is never replayed somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would connect where the egress policy cannot see.
            .no_proxy()
            .dns_resolver(Arc::new(egress::Resolver::new(opts.egress.clone())))
            .user_agent(concat!("taskmesh-callbacks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        if keys.is_empty() {
            warn!("no callback secret configured: callbacks are sent unsigned");
        }
        let hosts = hosts::Hosts::new(opts.per_host.max(1));
        Ok(Self {
            inner: Arc::new(Inner {
                opts,
                store,
                clock,
                client,
                encoder: Encoder::new()?,
                keys,
                hosts,
            }),
        })
    }

    /// Delivers due callbacks until `shutdown`: claims whenever a slot is
    /// free and something is due — when a task with a callback ends, when a
    /// try ends, when the earliest retry is due, and at least every
    /// `idle_poll`. Tries still running at shutdown are dropped; their
    /// leases bring them back.
    pub async fn run(self, shutdown: CancellationToken) {
        let inner = &self.inner;
        // Only changes that queued a callback (and resync markers).
        let mut changes = inner
            .store
            .subscribe_to(taskmesh_store::ChangeInterest::Callbacks);
        let slots = inner.opts.concurrency.max(1);
        let mut running: JoinSet<()> = JoinSet::new();
        info!("callback delivery started");
        loop {
            while running.try_join_next().is_some() {}
            let free = slots
                .saturating_sub(running.len())
                .min(inner.opts.batch.max(1));
            if free > 0 {
                match inner.round(free).await {
                    Ok(round) => {
                        let started = round.tries.len();
                        for t in round.tries {
                            running.spawn(t);
                        }
                        // A full claim with something started: more may be
                        // due, go again at once.
                        if round.claimed >= free && started > 0 {
                            continue;
                        }
                    }
                    Err(err) => warn!(error = %err, "callback round failed"),
                }
            }
            let wait = if free == 0 {
                inner.opts.idle_poll
            } else {
                inner.until_next_due().await
            };
            if wait.is_zero() && free > 0 {
                continue;
            }
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            tokio::select! {
                _ = shutdown.cancelled() => {
                    running.shutdown().await;
                    info!("callback delivery stopped");
                    return;
                }
                _ = &mut sleep => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
                change = changes.recv() => {
                    // The channel carries only changes that queued a
                    // callback (and resync markers), each of which may make
                    // one due now; other ends cost no round.
                    if let Err(RecvError::Closed) = change {
                        // The store is gone; only the timer is left.
                        (&mut sleep).await;
                    }
                }
            }
        }
    }

    /// One round, for tests and tools: claims due entries, tries each whose
    /// receiver has room once and waits for them (the rest are put back).
    /// Returns how many were claimed.
    pub async fn deliver_due(&self) -> Result<usize, Error> {
        let round = self.inner.round(self.inner.opts.batch.max(1)).await?;
        futures::future::join_all(round.tries).await;
        Ok(round.claimed)
    }
}

/// What one claim started.
struct Round {
    claimed: usize,
    tries: Vec<BoxFuture<'static, ()>>,
}

impl Inner {
    /// Claims up to `limit` due entries; returns the tries of those whose
    /// receiver has room (each holding its receiver's slot) and puts the
    /// others back.
    async fn round(self: &Arc<Self>, limit: usize) -> Result<Round, Error> {
        let now = self.clock.now_millis();
        let lease_ms = i64::try_from(self.opts.lease.as_millis()).unwrap_or(i64::MAX);
        let jobs = self.store.claim_callbacks(now, limit, lease_ms).await?;
        let claimed = jobs.len();
        let mut tries = Vec::with_capacity(claimed);
        let mut full: Vec<(String, Duration)> = Vec::new();
        for job in jobs {
            match self.hosts.enter(&job.delivery.url) {
                Ok(slot) => {
                    let inner = self.clone();
                    tries.push(Box::pin(async move {
                        inner.try_once(job).await;
                        drop(slot);
                    }) as BoxFuture<'static, ()>);
                }
                Err(backoff) => full.push((job.delivery.delivery_id, backoff)),
            }
        }
        if !full.is_empty() {
            debug!(
                postponed = full.len(),
                "callback receivers at their in-flight limit"
            );
            // Each group with its receiver's backoff; one write per backoff.
            full.sort_by_key(|(_, b)| *b);
            for group in full.chunk_by(|a, b| a.1 == b.1) {
                let at =
                    now.saturating_add(i64::try_from(group[0].1.as_millis()).unwrap_or(i64::MAX));
                let ids: Vec<&str> = group.iter().map(|(id, _)| id.as_str()).collect();
                // If this fails the lease brings them back instead.
                if let Err(err) = self.store.postpone_callbacks(&ids, at).await {
                    warn!(error = %err, "cannot put back callbacks of busy receivers");
                }
            }
        }
        Ok(Round { claimed, tries })
    }

    /// How long until the earliest pending entry is due (at most the idle
    /// poll).
    async fn until_next_due(&self) -> Duration {
        let now = self.clock.now_millis();
        let idle = self.opts.idle_poll;
        match self.store.next_callback_at().await {
            Ok(Some(at)) => Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(idle),
            Ok(None) => idle,
            Err(err) => {
                warn!(error = %err, "cannot read the next callback time");
                idle
            }
        }
    }

    async fn try_once(&self, job: CallbackJob) {
        let delivery = &job.delivery;
        let task_id = job.task.id.as_str();
        let attempt = delivery.attempts + 1;
        let result = match self.encoder.body(&job) {
            Ok(body) => self.post(&job, body).await,
            Err(err) => Err(Failure::fatal(
                "cannot encode the callback",
                err.to_string(),
            )),
        };
        let now = self.clock.now_millis();
        let outcome = match result {
            Ok(()) => {
                info!(task_id, delivery_id = %delivery.delivery_id, attempt, "callback delivered");
                CallbackOutcome::Delivered
            }
            Err(Failure {
                class,
                detail,
                retry,
            }) => {
                let outcome = if retry {
                    self.opts.policy.after_failure(
                        delivery.attempts,
                        class.clone(),
                        now,
                        rand::random(),
                    )
                } else {
                    CallbackOutcome::Failed {
                        error: class.clone(),
                    }
                };
                match &outcome {
                    CallbackOutcome::Failed { .. } => {
                        warn!(task_id, delivery_id = %delivery.delivery_id, url = %delivery.url, attempt, error = %class, detail = %detail, "callback given up")
                    }
                    _ => {
                        debug!(task_id, delivery_id = %delivery.delivery_id, url = %delivery.url, attempt, error = %class, detail = %detail, "callback attempt failed")
                    }
                }
                outcome
            }
        };
        if let Err(err) = self
            .store
            .finish_callback(&delivery.delivery_id, &outcome, now)
            .await
        {
            // The lease brings the entry back; it will be tried again.
            warn!(task_id, delivery_id = %delivery.delivery_id, error = %err, "cannot record the callback outcome");
        }
    }

    /// Posts the body; `Err` says why the receiver did not accept it.
    async fn post(&self, job: &CallbackJob, body: Vec<u8>) -> Result<(), Failure> {
        // A literal address never reaches the resolver: check it here (and
        // hand reqwest the URL parsed once).
        let url = self
            .opts
            .egress
            .parse_url(&job.delivery.url)
            .map_err(|err| Failure::fatal(egress::REFUSED, err.to_string()))?;
        let id = &job.delivery.delivery_id;
        let timestamp = self.clock.now_millis().div_euclid(1_000);
        let mut request = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header(DELIVERY_HEADER, id)
            .header(TIMESTAMP_HEADER, timestamp.to_string());
        if !self.keys.is_empty() {
            request = request.header(
                SIGNATURE_HEADER,
                signatures(&self.keys, id, timestamp, &body),
            );
        }
        match request.body(body).send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(Failure::retry(
                format!("HTTP {}", response.status().as_u16()),
                String::new(),
            )),
            Err(err) => Err(egress::classify(&err)),
        }
    }
}

/// A failed try: the class stored for callers, the detail for the log.
#[derive(Debug)]
pub(crate) struct Failure {
    class: String,
    detail: String,
    retry: bool,
}

impl Failure {
    pub(crate) fn retry(class: impl Into<String>, detail: String) -> Self {
        Self {
            class: class.into(),
            detail,
            retry: true,
        }
    }

    pub(crate) fn fatal(class: impl Into<String>, detail: String) -> Self {
        Self {
            class: class.into(),
            detail,
            retry: false,
        }
    }
}
