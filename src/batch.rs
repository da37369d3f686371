//! Several `Dispatcher.Connect` messages as one (`ConnectRequestBatch`,
//! `ConnectResponseBatch`), for both ends of the stream.
//!
//! A busy stream carries three server messages a task (the assignment and
//! two receipts) and two worker messages (the ACK and the result), each
//! decoded, dispatched and framed on its own. [`Coalesce`] sits between a
//! stream's outbound queue and the wire: when it is polled it takes the
//! first queued message and, if the other end said it reads batches, every
//! other message already queued, up to [`MAX_BATCH_MESSAGES`] and
//! [`MAX_BATCH_BYTES`], and sends them as one. Nothing waits for company:
//! a message queued alone goes at once, alone, as before; batches form
//! only while the wire is busier than the queue. Each end says in its
//! first message whether it reads batches (`accepts_batches`), so an end
//! that does not is never sent one.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use crate::v1::{
    ConnectRequest, ConnectRequestBatch, ConnectResponse, ConnectResponseBatch, connect_request,
    connect_response,
};

/// The most messages one batch holds.
pub const MAX_BATCH_MESSAGES: usize = 1024;

/// The most encoded bytes [`Coalesce`] gathers into one batch (a single
/// message larger than this still goes, alone): a quarter of gRPC's
/// default 4 MiB receive limit, so a batch never fails where its messages
/// alone would have passed.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// What framing a message adds inside a batch, at most: a tag and a
/// length. [`Coalesce`] counts it with each message.
const FRAMING: usize = 6;

/// The most bytes a batch of [`Coalesce`] encodes to: [`MAX_BATCH_BYTES`]
/// (its messages with their framing) and the batch's own framing. An end
/// whose message limit is below this must not say it reads batches.
pub const MAX_BATCH_ENCODED_BYTES: usize = MAX_BATCH_BYTES + 16;

/// A Connect message that can carry several of its kind.
pub trait Batchable: Message + Sized {
    /// The messages as one batch message, in order.
    fn batch(messages: Vec<Self>) -> Self;

    /// The messages a batch holds, or the message itself (`Err`) when it
    /// is not a batch.
    fn unbatch(self) -> Result<Vec<Self>, Self>;

    /// What the message stands for, in order: a batch's messages, or the
    /// message alone (without allocating for it).
    fn into_messages(self) -> Messages<Self> {
        messages(self.unbatch())
    }
}

/// A message's messages, in order ([`Batchable::into_messages`]).
pub type Messages<T> = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

/// The messages of what [`Batchable::unbatch`] answered: a batch's, or
/// the message alone. For a reader that checks a batch before it reads it.
pub fn messages<T>(unbatched: Result<Vec<T>, T>) -> Messages<T> {
    let (alone, batch) = match unbatched {
        Ok(batch) => (None, batch),
        Err(alone) => (Some(alone), Vec::new()),
    };
    alone.into_iter().chain(batch)
}

/// `Batchable` for a Connect message whose `oneof` has a `batch` case.
macro_rules! batchable {
    ($message:ident, $oneof:ident, $batch:ident) => {
        impl Batchable for $message {
            fn batch(messages: Vec<Self>) -> Self {
                Self {
                    message: Some($oneof::Message::Batch($batch { messages })),
                }
            }

            fn unbatch(self) -> Result<Vec<Self>, Self> {
                match self.message {
                    Some($oneof::Message::Batch(b)) => Ok(b.messages),
                    message => Err(Self { message }),
                }
            }
        }
    };
}

batchable!(ConnectResponse, connect_response, ConnectResponseBatch);
batchable!(ConnectRequest, connect_request, ConnectRequestBatch);

/// Whether a stream's other end reads batches: off until it says so, and
/// may be switched on later (a worker learns it from `registered`, after
/// its stream is open).
#[derive(Debug, Clone, Default)]
pub struct BatchSwitch(Arc<AtomicBool>);

impl BatchSwitch {
    /// A switch in the given position.
    pub fn new(on: bool) -> Self {
        Self(Arc::new(AtomicBool::new(on)))
    }

    /// From now on, queued messages may go as batches.
    pub fn turn_on(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether batches may be sent.
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A stream's outbound queue as the wire sees it: each poll yields the
/// first queued message, joined (while the switch is on) by every message
/// queued behind it within the bounds. Items of the queue are `I`; `open`
/// turns one into a message, or into an error that ends the stream (after
/// the messages queued before it).
pub struct Coalesce<I, T> {
    rx: mpsc::Receiver<I>,
    open: fn(I) -> Result<T, Status>,
    switch: BatchSwitch,
    /// The most bytes of messages one batch gathers.
    max_bytes: usize,
    /// A message that did not fit in the last batch: the next one's first.
    held: Option<T>,
    /// An error read behind a batch: yielded next, then the stream ends.
    error: Option<Status>,
    ended: bool,
}

impl<I, T> Coalesce<I, T> {
    /// Reads `rx`, batching while `switch` is on.
    pub fn new(
        rx: mpsc::Receiver<I>,
        open: fn(I) -> Result<T, Status>,
        switch: BatchSwitch,
    ) -> Self {
        Self {
            rx,
            open,
            switch,
            max_bytes: MAX_BATCH_BYTES,
            held: None,
            error: None,
            ended: false,
        }
    }

    /// Gathers at most `max_bytes` of messages, framing counted, into one
    /// batch (at most [`MAX_BATCH_BYTES`]): for an end whose own message
    /// limit is lower (it encodes what it sends within that limit).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.min(MAX_BATCH_BYTES);
        self
    }
}

impl<I, T: Batchable> Stream for Coalesce<I, T>
where
    I: Unpin,
    T: Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(status) = this.error.take() {
            this.ended = true;
            return Poll::Ready(Some(Err(status)));
        }
        let first = match this.held.take() {
            Some(first) => first,
            None => match this.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(item)) => match (this.open)(item) {
                    Ok(first) => first,
                    Err(status) => {
                        this.ended = true;
                        return Poll::Ready(Some(Err(status)));
                    }
                },
            },
        };
        if !this.switch.is_on() {
            return Poll::Ready(Some(Ok(first)));
        }
        let mut bytes = first.encoded_len() + FRAMING;
        // The batch, begun once a second message comes (`first` then moves
        // into it, so a message alone is never copied).
        let mut first = Some(first);
        let mut batch: Vec<T> = Vec::new();
        while batch.len() < MAX_BATCH_MESSAGES {
            // `try_recv`: what is queued now, outside tokio's budget of
            // polls (which would cut batches at ~128).
            let Ok(item) = this.rx.try_recv() else {
                // Nothing more queued now (or the queue closed: the next
                // poll says so).
                break;
            };
            match (this.open)(item) {
                Ok(next) => {
                    let len = next.encoded_len() + FRAMING;
                    if bytes + len > this.max_bytes {
                        this.held = Some(next);
                        break;
                    }
                    bytes += len;
                    batch.extend(first.take());
                    batch.push(next);
                }
                Err(status) => {
                    this.error = Some(status);
                    break;
                }
            }
        }
        Poll::Ready(Some(Ok(match first {
            Some(alone) => alone,
            None => T::batch(batch),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{TaskAck, connect_request::Message as In};

    fn ack(n: usize) -> ConnectRequest {
        ConnectRequest {
            message: Some(In::Ack(TaskAck {
                task_id: format!("t{n}"),
                execution_id: format!("e{n}"),
            })),
        }
    }

    fn ids(message: &ConnectRequest) -> Vec<String> {
        match message.clone().unbatch() {
            Ok(inner) => inner.iter().flat_map(ids).collect(),
            Err(ConnectRequest {
                message: Some(In::Ack(a)),
            }) => vec![a.task_id],
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    async fn poll<I: Unpin>(
        s: &mut Coalesce<I, ConnectRequest>,
    ) -> Option<Result<ConnectRequest, Status>> {
        std::future::poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
    }

    async fn next(s: &mut Coalesce<ConnectRequest, ConnectRequest>) -> Option<ConnectRequest> {
        poll(s).await.map(|r| r.expect("no error queued"))
    }

    #[tokio::test]
    async fn what_is_queued_goes_as_one_batch_in_order_only_when_switched_on() {
        let (tx, rx) = mpsc::channel(4096);
        let switch = BatchSwitch::new(false);
        let mut s = Coalesce::new(rx, Ok, switch.clone());
        for n in 0..3 {
            tx.send(ack(n)).await.unwrap();
        }
        // Off: one message a poll, none batched.
        for n in 0..3 {
            let m = next(&mut s).await.unwrap();
            assert!(m.clone().unbatch().is_err(), "a batch while off");
            assert_eq!(ids(&m), vec![format!("t{n}")]);
        }
        switch.turn_on();
        for n in 3..1030 {
            tx.send(ack(n)).await.unwrap();
        }
        let first = next(&mut s).await.unwrap();
        let second = next(&mut s).await.unwrap();
        let (a, b) = (ids(&first), ids(&second));
        assert_eq!(a.len(), MAX_BATCH_MESSAGES, "capped at the most messages");
        assert_eq!(b.len(), 3);
        let all: Vec<String> = a.into_iter().chain(b).collect();
        let want: Vec<String> = (3..1030).map(|n| format!("t{n}")).collect();
        assert_eq!(all, want, "every message once, in order");
        // Alone in the queue: alone on the wire, not a batch of one.
        tx.send(ack(7)).await.unwrap();
        let alone = next(&mut s).await.unwrap();
        assert!(alone.unbatch().is_err());
        drop(tx);
        assert!(next(&mut s).await.is_none());
    }

    #[tokio::test]
    async fn a_batch_stops_at_the_byte_bound_and_an_error_ends_the_stream_after_it() {
        let big = |n: usize| ConnectRequest {
            message: Some(In::Ack(TaskAck {
                task_id: format!("t{n}"),
                execution_id: "x".repeat(MAX_BATCH_BYTES / 3),
            })),
        };
        let (tx, rx) = mpsc::channel::<Result<ConnectRequest, Status>>(16);
        let mut s = Coalesce::new(rx, |i| i, BatchSwitch::new(true));
        for n in 0..4 {
            tx.send(Ok(big(n))).await.unwrap();
        }
        tx.send(Err(Status::aborted("gone"))).await.unwrap();
        let first = poll(&mut s).await.unwrap().unwrap();
        assert!(first.encoded_len() <= MAX_BATCH_ENCODED_BYTES);
        assert_eq!(
            ids(&first),
            vec!["t0", "t1"],
            "two thirds fit, the third waits"
        );
        let second = poll(&mut s).await.unwrap().unwrap();
        assert_eq!(ids(&second), vec!["t2", "t3"]);
        let err = poll(&mut s).await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        assert!(poll(&mut s).await.is_none(), "nothing after the error");

        // A lower bound of its own: no batch encodes past it.
        let (tx, rx) = mpsc::channel(64);
        let mut s = Coalesce::new(rx, Ok, BatchSwitch::new(true)).with_max_bytes(200);
        for n in 0..50 {
            tx.send(ack(n)).await.unwrap();
        }
        drop(tx);
        let (mut seen, mut wire) = (Vec::new(), 0);
        while let Some(m) = next(&mut s).await {
            assert!(m.encoded_len() <= 200 + 16, "{} bytes", m.encoded_len());
            seen.extend(ids(&m));
            wire += 1;
        }
        let want: Vec<String> = (0..50).map(|n| format!("t{n}")).collect();
        assert_eq!(seen, want, "every message once, in order");
        assert!((2..50).contains(&wire), "{wire} messages on the wire");
    }
}
