//! Servers a test spawns on its own runtime (axum receivers, scripted tonic
//! services, a gateway alone): each is stopped by the test and its outcome
//! checked, so a server that failed or panicked fails the test instead of
//! vanishing with a dropped handle.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a stopped server may take to end.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// A server running on a task of the test's runtime until its token is
/// cancelled. Dropping it cancels the token (a test that failed still
/// ends it) but checks nothing: call [`stop`](Self::stop).
pub struct BackgroundServer {
    /// Cancelled to stop the server.
    pub token: CancellationToken,
    /// The server's task; `None` once stopped.
    pub join: Option<JoinHandle<Result<(), String>>>,
    what: String,
}

impl BackgroundServer {
    /// Spawns `serve(token)` as `what` (for messages).
    pub fn spawn<F, Fut, E>(what: &str, serve: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        let token = CancellationToken::new();
        let fut = serve(token.clone());
        let join = tokio::spawn(async move { fut.await.map_err(|e| e.to_string()) });
        Self {
            token,
            join: Some(join),
            what: what.to_string(),
        }
    }

    /// Serves `app` on `listener` with axum, shutting down gracefully.
    pub fn axum(what: &str, listener: tokio::net::TcpListener, app: axum::Router) -> Self {
        Self::spawn(what, |token| async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await
        })
    }

    /// Whether the server's task has ended (by itself, unless stopped).
    pub fn is_finished(&self) -> bool {
        self.join.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Cancels the token, waits for the server to end, and fails the test
    /// if it does not within 10 s, panicked, or returned an error.
    pub async fn stop(mut self) {
        self.token.cancel();
        let join = self.join.take().expect("a running server");
        let ended = tokio::time::timeout(STOP_LIMIT, join)
            .await
            .unwrap_or_else(|_| panic!("{} did not stop within {STOP_LIMIT:?}", self.what));
        let served = ended.unwrap_or_else(|e| panic!("{} panicked: {e}", self.what));
        if let Err(e) = served {
            panic!("{} failed: {e}", self.what);
        }
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        self.token.cancel();
    }
}
