//! Worker configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::Error;

/// A secret (a token, a shared key): shown as `<redacted>` by `Debug`, so it
/// never reaches a log line by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How a worker connects and what it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOptions {
    /// Dispatcher addresses, tried in order on failover, e.g. `http://127.0.0.1:50051`.
    pub servers: Vec<String>,
    /// Stable id of this worker process (1-128 characters).
    pub worker_id: String,
    /// The namespace whose tasks it runs; empty means its token's
    /// (`default` without authentication).
    pub namespace: String,
    /// The API token it presents (`authorization: Bearer …`), a worker
    /// token of its namespace; `None` for a server without authentication.
    pub token: Option<Secret>,
    /// Human-readable name, by default the host name.
    pub name: String,
    /// Slots: the most handlers run at once (at least 1).
    pub concurrency: u32,
    /// Labels matched against task labels.
    pub labels: BTreeMap<String, String>,
    /// Weight for the weighted balancer; 0 means 1.
    pub weight: u32,
    /// First reconnect delay (and lower bound of every delay).
    pub reconnect_initial: Duration,
    /// Upper bound of the reconnect delay.
    pub reconnect_max: Duration,
    /// How long a graceful drain waits for running handlers.
    pub drain_timeout: Duration,
    /// Push mode: serve `taskmesh.v1.Worker` on this address and register
    /// it with `RegisterPushWorker` instead of holding a stream. Port 0
    /// picks a free port.
    pub push_listen: Option<SocketAddr>,
    /// Push mode: the URL the servers call, e.g. `http://10.0.0.7:7070`;
    /// by default `http://` and the address actually bound (which needs a
    /// concrete listen IP, not 0.0.0.0).
    pub push_advertise: Option<String>,
    /// TLS for `https://` servers; `None` trusts the public web roots and
    /// presents no client certificate.
    pub tls: Option<ClientTls>,
    /// Handler log lines buffered while not yet sent; past this the oldest
    /// go, counted as dropped.
    pub log_buffer_lines: usize,
}

/// TLS of the worker's connections to `https://` servers, as PEM bytes:
/// the CA to trust (default: the public web roots) and a certificate and
/// key to present when the server requires one (mutual TLS).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// CA certificate(s) the server's certificate must chain to.
    pub ca_pem: Option<Vec<u8>>,
    /// This worker's certificate and private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(|c| c.len()))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ClientTls {
    /// An endpoint for `server`, with `tls` when it is an `https://` URL.
    pub fn endpoint(
        tls: Option<&ClientTls>,
        server: &str,
    ) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let endpoint = tonic::transport::Endpoint::from_shared(server.to_string())?;
        if !server.starts_with("https://") {
            return Ok(endpoint);
        }
        let mut config = ClientTlsConfig::new();
        config = match tls.and_then(|t| t.ca_pem.as_ref()) {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_webpki_roots(),
        };
        if let Some((cert, key)) = tls.and_then(|t| t.identity.as_ref()) {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint.tls_config(config)
    }
}

impl WorkerOptions {
    /// Options with defaults: a fresh UUIDv4 worker id, the host name, 4 slots,
    /// weight 1, reconnect 200 ms to 10 s, drain timeout 30 s, 10,000
    /// log lines buffered.
    pub fn new(servers: Vec<String>) -> Self {
        WorkerOptions {
            servers,
            worker_id: uuid::Uuid::new_v4().to_string(),
            namespace: String::new(),
            token: None,
            name: hostname(),
            concurrency: 4,
            labels: BTreeMap::new(),
            weight: 1,
            reconnect_initial: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            push_listen: None,
            push_advertise: None,
            tls: None,
            log_buffer_lines: 10_000,
        }
    }

    /// Checks the options: at least one server, each an `http://` or
    /// `https://` URL, a worker id of 1-128 characters and at least one slot.
    pub fn validate(&self) -> Result<(), Error> {
        if self.servers.is_empty() {
            return Err(Error::InvalidOptions(
                "at least one server is required".into(),
            ));
        }
        if let Some(bad) = self
            .servers
            .iter()
            .find(|s| !(s.starts_with("http://") || s.starts_with("https://")))
        {
            return Err(Error::InvalidOptions(format!(
                "server {bad:?} must start with http:// or https://"
            )));
        }
        if self.concurrency == 0 {
            return Err(Error::InvalidOptions(
                "concurrency must be at least 1".into(),
            ));
        }
        let id_len = self.worker_id.chars().count();
        if !(1..=128).contains(&id_len) {
            return Err(Error::InvalidOptions(
                "worker_id must be 1-128 characters".into(),
            ));
        }
        if let Some(token) = &self.token
            && (token.expose().is_empty() || !token.expose().is_ascii())
        {
            return Err(Error::InvalidOptions(
                "the token must be non-empty ASCII".into(),
            ));
        }
        if self.reconnect_initial > self.reconnect_max {
            return Err(Error::InvalidOptions(
                "reconnect_initial must not exceed reconnect_max".into(),
            ));
        }
        if let Some(advertise) = &self.push_advertise {
            if self.push_listen.is_none() {
                return Err(Error::InvalidOptions(
                    "push_advertise needs push_listen (push mode)".into(),
                ));
            }
            if !advertise.starts_with("http://") {
                return Err(Error::InvalidOptions(format!(
                    "push_advertise {advertise:?} must be an http:// URL with a host and port"
                )));
            }
        } else if let Some(listen) = self.push_listen
            && listen.ip().is_unspecified()
        {
            return Err(Error::InvalidOptions(format!(
                "push_listen {listen} binds every interface: give push_advertise, the URL servers should call"
            )));
        }
        Ok(())
    }
}

/// The host name from `/etc/hostname`, or `"worker"` when unavailable.
fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let o = WorkerOptions::new(vec!["http://127.0.0.1:1".into()]);
        assert_eq!(o.concurrency, 4);
        assert!(uuid::Uuid::parse_str(&o.worker_id).is_ok());
        assert!(!o.name.is_empty());
        assert_eq!(o.reconnect_initial, Duration::from_millis(200));
        assert_eq!(o.reconnect_max, Duration::from_secs(10));
        assert_eq!(o.drain_timeout, Duration::from_secs(30));
        o.validate().unwrap();
    }

    #[test]
    fn rejects_bad_options() {
        assert!(WorkerOptions::new(vec![]).validate().is_err());
        assert!(
            WorkerOptions::new(vec!["127.0.0.1:1".into()])
                .validate()
                .is_err()
        );
        let mut o = WorkerOptions::new(vec!["https://a:1".into()]);
        o.concurrency = 0;
        assert!(o.validate().is_err());
        let mut o = WorkerOptions::new(vec!["https://a:1".into()]);
        o.worker_id.clear();
        assert!(o.validate().is_err());
    }

    #[test]
    fn push_mode_needs_an_address_servers_can_call() {
        let mut o = WorkerOptions::new(vec!["http://a:1".into()]);
        o.push_listen = Some("127.0.0.1:0".parse().unwrap());
        o.validate().unwrap();
        o.push_listen = Some("0.0.0.0:7070".parse().unwrap());
        assert!(o.validate().is_err());
        o.push_advertise = Some("http://10.0.0.7:7070".into());
        o.validate().unwrap();
        o.push_advertise = Some("10.0.0.7:7070".into());
        assert!(o.validate().is_err());
        o.push_listen = None;
        o.push_advertise = Some("http://10.0.0.7:7070".into());
        assert!(o.validate().is_err());
    }
}
