//! The receiving half of Postgres's wake-ups: one LISTEN connection (on a
//! pool of its own, so it never takes a connection callers need) relaying
//! other processes' payloads to this store's subscribers. A lost
//! connection is rebuilt, backing off up to 5 s, and subscribers are then
//! told to re-read: whatever was committed meanwhile was announced to
//! nobody here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::Result;
use crate::wake::Channels;

/// The NOTIFY channel of a schema (Postgres channels are per database, so
/// stores in different schemas of one database must not share one).
pub(super) fn channel_name(schema: Option<&str>) -> String {
    match schema {
        None => "taskmesh".to_string(),
        Some(schema) => format!("taskmesh_{schema}"),
    }
}

/// What the listener needs: where to relay, whose payloads to skip, and
/// where to show its connection's server process id.
pub(super) struct Listen {
    pub(super) channel: String,
    pub(super) origin: String,
    pub(super) channels: Weak<Channels>,
    pub(super) pid: Arc<AtomicU32>,
}

/// Connects the LISTEN connection (on a pool of its own, so it never takes
/// a connection callers need) and spawns the task relaying notifications
/// until the store is dropped.
pub(super) async fn start_listener(
    connect: PgConnectOptions,
    listen: Listen,
) -> Result<tokio::task::AbortHandle> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(connect.application_name("taskmesh-listener"));
    let listener = connect_listener(&pool, &listen).await?;
    let task = tokio::spawn(run(pool, listen, listener));
    Ok(task.abort_handle())
}

async fn connect_listener(pool: &PgPool, listen: &Listen) -> Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is rebuilt here (see `run`), not inside sqlx, so
    // this task knows when it happened.
    listener.eager_reconnect(false);
    listener.listen(&listen.channel).await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut listener)
        .await?;
    listen
        .pid
        .store(u32::try_from(pid).unwrap_or(0), Ordering::SeqCst);
    Ok(listener)
}

/// Relays notifications; on a lost connection, reconnects (backing off up
/// to 5 s) and then tells subscribers to resync. Stops once the store's
/// channels are gone.
async fn run(pool: PgPool, listen: Listen, mut listener: PgListener) {
    let channel = listen.channel.clone();
    loop {
        let error = match listener.try_recv().await {
            Ok(Some(notification)) => {
                let Some(channels) = listen.channels.upgrade() else {
                    return;
                };
                channels.relay(notification.payload(), &listen.origin);
                continue;
            }
            Ok(None) => "connection lost".to_string(),
            Err(err) => err.to_string(),
        };
        listen.pid.store(0, Ordering::SeqCst);
        if listen.channels.strong_count() == 0 {
            return;
        }
        tracing::warn!(error = %error, channel = %channel, "lost the change notification connection; reconnecting");
        drop(listener);
        let mut backoff = Duration::from_millis(100);
        listener = loop {
            if listen.channels.strong_count() == 0 {
                return;
            }
            match connect_listener(&pool, &listen).await {
                Ok(l) => break l,
                Err(err) => {
                    tracing::warn!(error = %err, channel = %channel, "cannot listen for changes yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        };
        let Some(channels) = listen.channels.upgrade() else {
            return;
        };
        tracing::info!(channel = %channel, "listening for changes again; subscribers resync");
        channels.lag();
    }
}
