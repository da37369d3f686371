//! Callback delivery: posts each ended task with a `callback_url` to its
//! receiver, from the store's durable outbox.
//!
//! The store queues the outbox entry in the same transaction as the task's
//! terminal transition, so a crash can delay a callback but never lose one.
//! This loop claims due entries (a lease, so one try runs at a time across
//! replicas and a crashed try comes back), posts the `TaskCallback` JSON
//! signed with HMAC-SHA256, and records the outcome: delivered on 2xx,
//! otherwise retried with exponential backoff (equal jitter) until the
//! policy's tries run out. Delivery is at least once; receivers
//! de-duplicate on the delivery id.
//!
//! Architecture invariant: this crate talks to the store through the
//! `Store` trait only (no SQL) and knows nothing of gRPC servers or the
//! REST gateway; it uses the contract only to encode the body.

mod payload;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use taskmesh_core::{CallbackJob, CallbackOutcome, CallbackPolicy, Clock};
use taskmesh_store::Store;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use payload::{DELIVERY_HEADER, Encoder, SIGNATURE_HEADER, message, signature};

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
    /// Key of the HMAC-SHA256 signature; `None` sends callbacks unsigned.
    pub secret: Option<String>,
    /// Tries and backoff.
    pub policy: CallbackPolicy,
    /// One POST is given up after this.
    pub request_timeout: Duration,
    /// A claimed entry comes back to the queue after this if its try never
    /// records an outcome (the deliverer died); longer than a try can take.
    pub lease: Duration,
    /// Entries claimed per round.
    pub batch: usize,
    /// POSTs in flight at once.
    pub concurrency: usize,
    /// Longest sleep between rounds, so entries queued by another replica
    /// are picked up even without a local wake-up.
    pub idle_poll: Duration,
}

impl Default for CallbackOptions {
    fn default() -> Self {
        Self {
            secret: None,
            policy: CallbackPolicy::default(),
            request_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(60),
            batch: 64,
            concurrency: 16,
            idle_poll: Duration::from_secs(5),
        }
    }
}

/// The delivery loop.
pub struct Deliverer {
    opts: CallbackOptions,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    client: reqwest::Client,
    encoder: Encoder,
}

impl Deliverer {
    /// Builds the deliverer and its HTTP client.
    pub fn build(
        opts: CallbackOptions,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, Error> {
        let client = reqwest::Client::builder()
            .timeout(opts.request_timeout)
            // A signed POST is never replayed somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("taskmesh-callbacks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        if opts.secret.is_none() {
            warn!("no callback secret configured: callbacks are sent unsigned");
        }
        Ok(Self {
            opts,
            store,
            clock,
            client,
            encoder: Encoder::new()?,
        })
    }

    /// Delivers due callbacks until `shutdown`: a round whenever a task ends
    /// on this node, when the earliest retry is due, and at least every
    /// `idle_poll`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut changes = self.store.subscribe();
        info!("callback delivery started");
        loop {
            match self.deliver_due().await {
                // A full batch: more may be due, go again at once.
                Ok(n) if n >= self.opts.batch.max(1) => continue,
                Ok(_) => {}
                Err(err) => warn!(error = %err, "callback round failed"),
            }
            let now = self.clock.now_millis();
            let idle = self.opts.idle_poll;
            let wait = match self.store.next_callback_at().await {
                Ok(Some(at)) => {
                    Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(idle)
                }
                Ok(None) => idle,
                Err(err) => {
                    warn!(error = %err, "cannot read the next callback time");
                    idle
                }
            };
            if wait.is_zero() {
                continue;
            }
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        info!("callback delivery stopped");
                        return;
                    }
                    _ = &mut sleep => break,
                    change = changes.recv() => match change {
                        Ok(c) if c.state.is_terminal() => break,
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => {
                            // The store is gone; only the timer is left.
                            (&mut sleep).await;
                            break;
                        }
                    },
                }
            }
        }
    }

    /// One round: claims due entries and tries each once. Returns how many
    /// were claimed.
    pub async fn deliver_due(&self) -> Result<usize, Error> {
        let now = self.clock.now_millis();
        let lease_ms = i64::try_from(self.opts.lease.as_millis()).unwrap_or(i64::MAX);
        let jobs = self
            .store
            .claim_callbacks(now, self.opts.batch.max(1), lease_ms)
            .await?;
        let claimed = jobs.len();
        futures::stream::iter(jobs)
            .for_each_concurrent(self.opts.concurrency.max(1), |job| self.try_once(job))
            .await;
        Ok(claimed)
    }

    async fn try_once(&self, job: CallbackJob) {
        let delivery = &job.delivery;
        let task_id = job.task.id.as_str();
        let attempt = delivery.attempts + 1;
        let result = match self.encoder.body(&job) {
            Ok(body) => self.post(&job, body).await,
            Err(err) => Err(format!("cannot encode the callback: {err}")),
        };
        let now = self.clock.now_millis();
        let outcome = match result {
            Ok(()) => {
                info!(task_id, delivery_id = %delivery.delivery_id, attempt, "callback delivered");
                CallbackOutcome::Delivered
            }
            Err(error) => {
                let outcome = self.opts.policy.after_failure(
                    delivery.attempts,
                    error.clone(),
                    now,
                    rand::random(),
                );
                match &outcome {
                    CallbackOutcome::Failed { .. } => {
                        warn!(task_id, delivery_id = %delivery.delivery_id, attempt, error = %error, "callback given up")
                    }
                    _ => {
                        debug!(task_id, delivery_id = %delivery.delivery_id, attempt, error = %error, "callback attempt failed")
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
    async fn post(&self, job: &CallbackJob, body: Vec<u8>) -> Result<(), String> {
        let mut request = self
            .client
            .post(&job.delivery.url)
            .header("content-type", "application/json")
            .header(DELIVERY_HEADER, &job.delivery.delivery_id);
        if let Some(secret) = &self.opts.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret.as_bytes(), &body));
        }
        match request.body(body).send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(format!("HTTP {}", response.status().as_u16())),
            Err(err) => Err(transport_error(&err)),
        }
    }
}

/// A transport error with its causes, e.g. "connection refused".
fn transport_error(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
