//! Demo and benchmark handlers: `echo`, `sleep`, `fail` and `log`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use crate::{Handler, HandlerError, Output, TaskContext};

/// Names of the built-in handlers, for [`builtin`].
pub const BUILTIN_NAMES: &[&str] = &["echo", "sleep", "fail", "log"];

/// The built-in handler called `name`, if any.
pub fn builtin(name: &str) -> Option<Arc<dyn Handler>> {
    match name {
        "echo" => Some(Arc::new(Echo)),
        "sleep" => Some(Arc::new(Sleep)),
        "fail" => Some(Arc::new(Fail)),
        "log" => Some(Arc::new(Log)),
        _ => None,
    }
}

/// Returns its payload unchanged, with the same content type.
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

#[async_trait]
impl Handler for Echo {
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        Ok(Output::new(ctx.payload, ctx.content_type))
    }
}

/// Sleeps `{"ms": N}` milliseconds; returns early with a retryable
/// `cancelled` error when the execution is cancelled.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sleep;

#[derive(Deserialize)]
struct SleepArgs {
    ms: u64,
}

#[async_trait]
impl Handler for Sleep {
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        let args: SleepArgs = parse(&ctx, r#"{"ms": N}"#)?;
        ctx.log
            .info(format!("sleeping {} ms (attempt {})", args.ms, ctx.attempt));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(args.ms)) => {
                ctx.log.info(format!("slept {} ms", args.ms));
                Ok(Output::json(format!(r#"{{"slept_ms":{}}}"#, args.ms)))
            }
            _ = ctx.cancel.cancelled() => {
                ctx.log.warn("cancelled while sleeping");
                Err(HandlerError::retryable("cancelled"))
            }
        }
    }
}

/// Fails with a retryable error while `attempt <= times` (payload
/// `{"times": N}`), then succeeds echoing its payload.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fail;

#[derive(Deserialize)]
struct FailArgs {
    times: u32,
}

#[async_trait]
impl Handler for Fail {
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        let args: FailArgs = parse(&ctx, r#"{"times": N}"#)?;
        if ctx.attempt <= args.times {
            return Err(HandlerError::retryable(format!(
                "planned failure: attempt {} of {} failing attempts",
                ctx.attempt, args.times
            )));
        }
        Ok(Output::new(ctx.payload, ctx.content_type))
    }
}

/// Logs `{"lines": N}` lines ("line 1 of N", ...), `every_ms` apart
/// (default 0), then returns `{"logged": N}`; stops early, failing
/// retryably, when cancelled. With `"tracing": true` the lines are
/// `tracing` events instead (task lines only where the subscriber has
/// [`capture_layer`](crate::capture_layer), as `taskmesh worker`'s has).
/// For tests and demos of task logs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Log;

#[derive(Deserialize)]
struct LogArgs {
    lines: u64,
    #[serde(default)]
    every_ms: u64,
    #[serde(default)]
    tracing: bool,
}

#[async_trait]
impl Handler for Log {
    async fn run(&self, ctx: TaskContext) -> Result<Output, HandlerError> {
        let args: LogArgs = parse(&ctx, r#"{"lines": N, "every_ms": M, "tracing": false}"#)?;
        for i in 1..=args.lines {
            if i > 1 && args.every_ms > 0 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(args.every_ms)) => {}
                    _ = ctx.cancel.cancelled() => return Err(HandlerError::retryable("cancelled")),
                }
            }
            if args.tracing {
                tracing::info!(handler = "log", "line {i} of {}", args.lines);
            } else {
                ctx.log.info(format!("line {i} of {}", args.lines));
            }
        }
        Ok(Output::json(format!(r#"{{"logged":{}}}"#, args.lines)))
    }
}

/// Parses the JSON payload, or a non-retryable error naming the shape expected.
fn parse<T: for<'de> Deserialize<'de>>(ctx: &TaskContext, shape: &str) -> Result<T, HandlerError> {
    serde_json::from_slice(&ctx.payload).map_err(|e| {
        HandlerError::fatal(format!(
            "invalid {} payload: expected JSON {shape}: {e}",
            ctx.handler
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tokio_util::sync::CancellationToken;

    fn ctx(handler: &str, attempt: u32, payload: &[u8]) -> TaskContext {
        TaskContext {
            task_id: "t1".into(),
            attempt,
            execution_id: "e1".into(),
            handler: handler.into(),
            payload: payload.to_vec(),
            content_type: "application/json".into(),
            deadline: None,
            timeout: None,
            trace_context: HashMap::new(),
            labels: HashMap::new(),
            cancel: CancellationToken::new(),
            log: crate::TaskLog::discard(),
            children: crate::Children::detached("t1"),
            workflow_id: String::new(),
            workflow_step: String::new(),
            parent_outputs: HashMap::new(),
            parent_errors: HashMap::new(),
            shard: None,
        }
    }

    #[test]
    fn lookup_by_name() {
        for name in BUILTIN_NAMES {
            assert!(builtin(name).is_some(), "{name}");
        }
        assert!(builtin("nope").is_none());
    }

    #[tokio::test]
    async fn echo_returns_payload() {
        let mut c = ctx("echo", 1, b"hello");
        c.content_type = "text/plain".into();
        let out = Echo.run(c).await.unwrap();
        assert_eq!(out, Output::new(b"hello".to_vec(), "text/plain"));
    }

    #[tokio::test]
    async fn sleep_sleeps() {
        let out = Sleep.run(ctx("sleep", 1, br#"{"ms":5}"#)).await.unwrap();
        assert_eq!(out.data, br#"{"slept_ms":5}"#);
    }

    #[tokio::test]
    async fn sleep_returns_early_on_cancel() {
        let c = ctx("sleep", 1, br#"{"ms":60000}"#);
        c.cancel.cancel();
        let err = tokio::time::timeout(Duration::from_secs(5), Sleep.run(c))
            .await
            .expect("sleep ignored cancel")
            .unwrap_err();
        assert_eq!(err, HandlerError::retryable("cancelled"));
    }

    #[tokio::test]
    async fn bad_json_is_fatal() {
        for (h, handler) in [
            ("sleep", builtin("sleep")),
            ("fail", builtin("fail")),
            ("log", builtin("log")),
        ] {
            let err = handler
                .unwrap()
                .run(ctx(h, 1, b"not json"))
                .await
                .unwrap_err();
            assert!(!err.retryable);
            assert!(
                err.message.contains(&format!("invalid {h} payload")),
                "{}",
                err.message
            );
        }
    }

    #[tokio::test]
    async fn fail_fails_first_attempts() {
        let payload = br#"{"times":2}"#;
        for attempt in 1..=2 {
            let err = Fail.run(ctx("fail", attempt, payload)).await.unwrap_err();
            assert!(err.retryable);
        }
        let out = Fail.run(ctx("fail", 3, payload)).await.unwrap();
        assert_eq!(out.data, payload);
    }
}
