//! Connection limits on both ports, applied when a TCP connection is
//! accepted (before any TLS handshake or HTTP parsing costs anything): at
//! most `max_total` open connections per listener and `max_per_peer` per
//! client address; a connection over either is closed at once. And a
//! first-bytes deadline: a connection that sends nothing within
//! `first_bytes` is closed, so silent connections cannot sit on the limits
//! (the REST port's header read timeout and the gRPC port's keepalive
//! PINGs take over once bytes flow).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tracing::{debug, warn};

/// Connections refused by a limit, per port and limit.
pub const REFUSED: &str = "taskmesh_connections_refused_total";

/// The limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections on the listener.
    pub max_total: usize,
    /// Open connections from one client address.
    pub max_per_peer: usize,
    /// A connection must send its first bytes within this.
    pub first_bytes: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_total: 4096,
            max_per_peer: 256,
            first_bytes: Duration::from_secs(10),
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// Admits connections within the limits of one listener.
#[derive(Clone)]
pub struct Gate {
    limits: ConnLimits,
    port: &'static str,
    counts: Arc<Mutex<Counts>>,
}

/// An admitted connection's place, given back on drop.
struct Ticket {
    peer: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl Gate {
    /// A gate for the listener called `port` ("grpc" or "http").
    pub fn new(limits: ConnLimits, port: &'static str) -> Self {
        Self {
            limits,
            port,
            counts: Arc::default(),
        }
    }

    fn admit(&self, peer: IpAddr) -> Result<Ticket, &'static str> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if c.total >= self.limits.max_total {
            return Err("listener");
        }
        let n = c.per_peer.entry(peer).or_insert(0);
        if *n >= self.limits.max_per_peer {
            return Err("peer");
        }
        *n += 1;
        c.total += 1;
        Ok(Ticket {
            peer,
            counts: self.counts.clone(),
        })
    }

    /// Open connections now (for tests and gauges).
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// The next connection on `listener` within the limits (Nagle off);
    /// those over a limit are closed as they come.
    pub async fn accept(&self, listener: &TcpListener) -> (Gated<TcpStream>, SocketAddr) {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of descriptors and the like: the next accept may
                    // work once connections close.
                    warn!(port = self.port, error = %err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            match self.admit(peer.ip()) {
                Ok(ticket) => {
                    if let Err(err) = tcp.set_nodelay(true) {
                        warn!(error = %err, "cannot set TCP_NODELAY on a connection");
                    }
                    return (Gated::new(tcp, ticket, self.limits.first_bytes), peer);
                }
                Err(limit) => {
                    metrics::counter!(REFUSED, "port" => self.port, "limit" => limit).increment(1);
                    debug!(port = self.port, %peer, limit, "connection refused: over the limit");
                    drop(tcp);
                }
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

/// An admitted connection: the stream, its place under the limits, and the
/// first-bytes deadline until something was read.
pub struct Gated<S> {
    inner: S,
    _ticket: Ticket,
    first_bytes: Option<Pin<Box<Sleep>>>,
}

impl<S> Gated<S> {
    fn new(inner: S, ticket: Ticket, first_bytes: Duration) -> Self {
        Self {
            inner,
            _ticket: ticket,
            first_bytes: Some(Box::pin(tokio::time::sleep(first_bytes))),
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.first_bytes = None;
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let expired = this
                    .first_bytes
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent nothing in time",
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Gated<TcpStream> {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The gRPC port's plain connections, within the gate's limits.
pub fn incoming(
    listener: TcpListener,
    gate: Gate,
) -> impl futures::Stream<Item = Result<Gated<TcpStream>, io::Error>> {
    futures::stream::unfold((listener, gate), |(listener, gate)| async move {
        let (conn, _) = gate.accept(&listener).await;
        Some((Ok(conn), (listener, gate)))
    })
}

/// The REST port's plain connections, within the gate's limits, as an
/// axum listener.
pub struct GatedListener {
    listener: TcpListener,
    gate: Gate,
}

impl GatedListener {
    /// `listener` behind `gate`.
    pub fn new(listener: TcpListener, gate: Gate) -> Self {
        Self { listener, gate }
    }
}

impl axum::serve::Listener for GatedListener {
    type Io = Gated<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.gate.accept(&self.listener).await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_listener_and_per_peer() {
        let gate = Gate::new(
            ConnLimits {
                max_total: 3,
                max_per_peer: 2,
                first_bytes: Duration::from_secs(1),
            },
            "test",
        );
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let a1 = gate.admit(a).unwrap();
        let _a2 = gate.admit(a).unwrap();
        assert_eq!(gate.admit(a).err(), Some("peer"));
        let _b1 = gate.admit(b).unwrap();
        assert_eq!(gate.admit(c).err(), Some("listener"));
        assert_eq!(gate.open(), 3);
        drop(a1);
        assert_eq!(gate.open(), 2);
        let _c1 = gate.admit(c).expect("a place came back");
        assert_eq!(gate.admit(a).err(), Some("listener"));
    }
}
