//! TLS on the node's two ports, and on the clients' connections.
//!
//! The server side: certificates and the key are read from PEM files,
//! reloaded on SIGHUP or when the files change (checked every few seconds;
//! a reload that fails keeps the old ones and says why), and the gRPC port
//! may require client certificates signed by a given CA (mutual TLS).
//! rustls through tokio-rustls rather than tonic's `ServerTlsConfig`, which
//! cannot swap certificates without a restart. Handshakes run on tasks of
//! their own, bounded by [`HANDSHAKE_TIMEOUT`], so a client that stalls its
//! handshake holds up nobody else's. The REST gateway reaches the gRPC
//! service through an in-process pipe ([`local_channel`]) rather than over
//! the TLS port, which would need a client certificate of its own under
//! mutual TLS.
//!
//! The client side: [`ClientTlsFiles`] (the `--tls-ca`, `--tls-cert` and
//! `--tls-key` flags) becomes tonic's client TLS configuration for
//! `https://` URLs.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::conn::{Gate, Gated};

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS handshakes that failed or timed out, by port (`grpc`, `http`).
pub const HANDSHAKE_FAILURES: &str = "taskmesh_tls_handshake_failures_total";

/// The server's certificate files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates on the gRPC port must
    /// chain to; `None` asks for no client certificate.
    pub client_ca: Option<PathBuf>,
}

/// The server's TLS configurations, swapped whole on reload.
pub struct Tls {
    files: TlsFiles,
    grpc: RwLock<Arc<ServerConfig>>,
    http: RwLock<Arc<ServerConfig>>,
    stamps: Mutex<Vec<Option<SystemTime>>>,
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not a PEM certificate file", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{} holds no PEM certificate",
        path.display()
    );
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| {
        format!(
            "cannot read a private key (PEM: PKCS#8, PKCS#1 or SEC1) from {}",
            path.display()
        )
    })
}

fn server_config(
    files: &TlsFiles,
    alpn: &[&[u8]],
    client_auth: bool,
) -> anyhow::Result<ServerConfig> {
    let builder = ServerConfig::builder();
    let builder = match (&files.client_ca, client_auth) {
        (Some(ca), true) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(ca)? {
                roots
                    .add(cert)
                    .with_context(|| format!("a CA certificate in {} is unusable", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .context("cannot build the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(read_certs(&files.cert)?, read_key(&files.key)?)
        .with_context(|| {
            format!(
                "the key in {} does not fit the certificate in {}",
                files.key.display(),
                files.cert.display()
            )
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

impl Tls {
    /// Reads the files; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> anyhow::Result<Arc<Self>> {
        let (grpc, http) = Self::build(&files)?;
        let stamps = stamps(&files);
        Ok(Arc::new(Self {
            files,
            grpc: RwLock::new(grpc),
            http: RwLock::new(http),
            stamps: Mutex::new(stamps),
        }))
    }

    fn build(files: &TlsFiles) -> anyhow::Result<(Arc<ServerConfig>, Arc<ServerConfig>)> {
        // gRPC is HTTP/2 only; the REST port speaks both.
        let grpc = server_config(files, &[b"h2"], true)?;
        let http = server_config(files, &[b"h2", b"http/1.1"], false)?;
        Ok((Arc::new(grpc), Arc::new(http)))
    }

    /// Reads the files again and uses them for new connections; on an
    /// error the current certificates stay.
    pub fn reload(&self) -> anyhow::Result<()> {
        let (grpc, http) = Self::build(&self.files)?;
        *self.grpc.write().unwrap_or_else(|e| e.into_inner()) = grpc;
        *self.http.write().unwrap_or_else(|e| e.into_inner()) = http;
        Ok(())
    }

    fn acceptor(&self, grpc: bool) -> TlsAcceptor {
        let lock = if grpc { &self.grpc } else { &self.http };
        TlsAcceptor::from(lock.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Reloads on SIGHUP, and when a file's modification time changes
    /// (checked every `every`), until `shutdown`.
    pub fn watch(self: &Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let tls = self.clone();
        tokio::spawn(async move {
            let mut hangup = match tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::hangup(),
            ) {
                Ok(s) => Some(s),
                Err(err) => {
                    warn!(error = %err, "cannot watch SIGHUP; certificates reload on file changes only");
                    None
                }
            };
            loop {
                let why = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
                    () = tokio::time::sleep(every) => {
                        let now = stamps(&tls.files);
                        let mut seen = tls.stamps.lock().unwrap_or_else(|e| e.into_inner());
                        if *seen == now {
                            continue;
                        }
                        *seen = now;
                        "the files changed"
                    }
                };
                match tls.reload() {
                    Ok(()) => {
                        info!(reason = why, cert = %tls.files.cert.display(), "TLS certificates reloaded")
                    }
                    Err(err) => warn!(
                        reason = why,
                        error = format!("{err:#}"),
                        "TLS certificates not reloaded; the current ones stay"
                    ),
                }
            }
        });
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
    .collect()
}

/// Accepts TCP connections on `listener` and hands each finished handshake
/// to `tx` (as `wrap` makes it), until `shutdown`.
fn accept<T: Send + 'static>(
    listener: TcpListener,
    gate: Gate,
    tls: Arc<Tls>,
    grpc: bool,
    wrap: fn(TlsStream<Gated<TcpStream>>) -> T,
    tx: mpsc::Sender<T>,
    shutdown: CancellationToken,
) {
    let port = if grpc { "grpc" } else { "http" };
    tokio::spawn(async move {
        loop {
            // Within the connection limits before the handshake costs
            // anything.
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = gate.accept(&listener) => accepted,
            };
            let acceptor = tls.acceptor(grpc);
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        // The server stopped when nobody receives.
                        let _ = tx.send(wrap(stream)).await;
                    }
                    Ok(Err(err)) => {
                        metrics::counter!(HANDSHAKE_FAILURES, "port" => port).increment(1);
                        debug!(port, %peer, error = %err, "TLS handshake failed");
                    }
                    Err(_) => {
                        metrics::counter!(HANDSHAKE_FAILURES, "port" => port).increment(1);
                        debug!(port, %peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
}

/// A connection to the gRPC server: a TLS client, or the node's own REST
/// gateway through an in-process pipe.
pub enum Conn {
    /// Over the network, after the handshake.
    Tls(Box<TlsStream<Gated<TcpStream>>>),
    /// The gateway, in process.
    Local(DuplexStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Local(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Local(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Local(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Local(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// The gRPC port's connections (TLS clients and the gateway's pipe) and a
/// channel for the gateway, until `shutdown`.
pub fn grpc_incoming(
    listener: TcpListener,
    gate: Gate,
    tls: Arc<Tls>,
    shutdown: CancellationToken,
) -> (
    impl futures::Stream<Item = Result<Conn, io::Error>>,
    tonic::transport::Channel,
) {
    let (tx, rx) = mpsc::channel(64);
    accept(
        listener,
        gate,
        tls,
        true,
        |s| Conn::Tls(Box::new(s)),
        tx.clone(),
        shutdown,
    );
    let incoming = futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok);
    (incoming, local_channel(tx))
}

/// A channel whose every connection is a fresh in-process pipe handed to
/// the gRPC server.
fn local_channel(tx: mpsc::Sender<Conn>) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_static("http://in-process.invalid")
        .connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
            let tx = tx.clone();
            async move {
                let (client, server) = tokio::io::duplex(64 * 1024);
                tx.send(Conn::Local(server)).await.map_err(|_| {
                    io::Error::new(io::ErrorKind::NotConnected, "the gRPC server stopped")
                })?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(client))
            }
        }))
}

/// The REST port's TLS connections, as an axum listener.
pub struct TlsListener {
    rx: mpsc::Receiver<TlsStream<Gated<TcpStream>>>,
    addr: SocketAddr,
}

/// The REST port's listener over `listener`, until `shutdown`.
pub fn http_listener(
    listener: TcpListener,
    gate: Gate,
    tls: Arc<Tls>,
    shutdown: CancellationToken,
) -> io::Result<TlsListener> {
    let addr = listener.local_addr()?;
    let (tx, rx) = mpsc::channel(64);
    accept(listener, gate, tls, false, |s| s, tx, shutdown);
    Ok(TlsListener { rx, addr })
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Gated<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(stream) => {
                let peer = stream
                    .get_ref()
                    .0
                    .get_ref()
                    .peer_addr()
                    .unwrap_or(self.addr);
                (stream, peer)
            }
            // Stopped: serve's graceful shutdown ends the loop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// A client's TLS files: the CA to trust (else the bundled web roots) and
/// its own certificate and key for mutual TLS.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsFiles {
    /// CA certificate(s), PEM, that the server's certificate must chain to
    /// (for https:// servers; default: the public web roots).
    #[arg(long, env = crate::env::TLS_CA, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// This client's certificate, PEM, for servers that require one
    /// (mutual TLS); with --tls-key.
    #[arg(long, env = crate::env::TLS_CLIENT_CERT, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM.
    #[arg(long, env = crate::env::TLS_CLIENT_KEY, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// The files' contents for the worker SDK (`None` when none is given).
    pub fn load(&self) -> anyhow::Result<Option<taskmesh_worker::ClientTls>> {
        if self.tls_ca.is_none() && self.tls_cert.is_none() {
            return Ok(None);
        }
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()));
        let ca_pem = self.tls_ca.as_ref().map(read).transpose()?;
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            _ => None,
        };
        Ok(Some(taskmesh_worker::ClientTls { ca_pem, identity }))
    }
}
