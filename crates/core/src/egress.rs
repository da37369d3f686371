//! Where the server may connect on a client's behalf: callback URLs and
//! push workers' addresses are chosen by callers, so without a rule the
//! server would scan and reach whatever it can (a cloud metadata service
//! at 169.254.169.254, the database on loopback, the office network).
//!
//! [`EgressPolicy`] refuses the addresses no public service has —
//! loopback, private, link-local, shared (CGNAT), unspecified, multicast,
//! broadcast, documentation, benchmarking and reserved ranges, in IPv4 and
//! IPv6 (IPv4-mapped and NAT64 forms included) — unless the operator lists
//! them. Callers check a URL's literal host when it is submitted
//! ([`EgressPolicy::check_url`]) and every resolved address again right
//! before connecting ([`EgressPolicy::allows`]), so a name that resolves to
//! a public address at submit time and to loopback later (DNS rebinding)
//! is still refused. Nothing here does I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;

/// Why an address or URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The URL does not parse, or is not an absolute http(s) URL with a host.
    #[error("{0}")]
    Malformed(String),
    /// The URL carries a user name or password.
    #[error(
        "must not carry credentials (a user name or password before the host); send them another way"
    )]
    Credentials,
    /// The host is an address the policy refuses.
    #[error(
        "points at {0}, an address the server does not connect to (loopback, private, link-local and other non-public ranges are refused unless the operator allows them with --egress-allow)"
    )]
    Refused(String),
}

/// The ranges the server may reach beyond public unicast addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow: Vec<IpNet>,
}

impl EgressPolicy {
    /// Public addresses only (the default of `serve`).
    pub fn public_only() -> Self {
        Self::default()
    }

    /// Public addresses and `allow`.
    pub fn allowing(allow: Vec<IpNet>) -> Self {
        Self { allow }
    }

    /// Public addresses and loopback (`taskmesh dev`, tests).
    pub fn allowing_loopback() -> Self {
        Self::allowing(loopback_nets())
    }

    /// Everything (for benches and tests that need private addresses).
    pub fn allowing_all() -> Self {
        Self::allowing(vec![
            IpNet::from_str("0.0.0.0/0").expect("literal"),
            IpNet::from_str("::/0").expect("literal"),
        ])
    }

    /// The ranges allowed beyond public unicast.
    pub fn allowed(&self) -> &[IpNet] {
        &self.allow
    }

    /// Whether the server may connect to `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        is_public(ip) || self.allow.iter().any(|net| net.contains(&ip))
    }

    /// Keeps the resolved addresses of `host` the policy allows; refuses
    /// when it allows none (saying which was refused), so a caller only
    /// ever connects to an address checked here.
    pub fn filter_resolved(
        &self,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Result<Vec<SocketAddr>, EgressError> {
        let mut refused = None;
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| {
                let ok = self.allows(a.ip());
                if !ok {
                    refused.get_or_insert(a.ip());
                }
                ok
            })
            .collect();
        match (allowed.is_empty(), refused) {
            (false, _) => Ok(allowed),
            (true, Some(ip)) => Err(EgressError::Refused(ip.to_string())),
            (true, None) => Err(EgressError::Malformed("resolves to no address".into())),
        }
    }

    /// Checks a URL a caller wants the server to call: absolute http(s),
    /// a host, no credentials, and a literal address (or `localhost`) the
    /// policy allows. Names are checked again at connect time, after
    /// resolution.
    pub fn check_url(&self, url: &str) -> Result<(), EgressError> {
        self.parse_url(url).map(|_| ())
    }

    /// [`EgressPolicy::check_url`], keeping the parsed URL for the caller
    /// that goes on to connect (so it is parsed once).
    pub fn parse_url(&self, url: &str) -> Result<url::Url, EgressError> {
        // The parser forgives "http:///x" and "http:x" (WHATWG); a caller
        // who wrote them meant something else.
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        if !rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/')) {
            return Err(EgressError::Malformed(
                "must be an absolute http:// or https:// URL".into(),
            ));
        }
        let parsed = url::Url::parse(url)
            .map_err(|e| EgressError::Malformed(format!("does not parse as a URL ({e})")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(EgressError::Malformed(
                "must be an absolute http:// or https:// URL".into(),
            ));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(EgressError::Credentials);
        }
        let ip = match parsed.host() {
            None => return Err(EgressError::Malformed("has no host".into())),
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                if name == "localhost" || name.ends_with(".localhost") {
                    // RFC 6761: always loopback, whatever DNS says.
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    return Ok(parsed);
                }
            }
        };
        if self.allows(ip) {
            Ok(parsed)
        } else {
            Err(EgressError::Refused(ip.to_string()))
        }
    }
}

/// Parses an `--egress-allow` entry: a CIDR range or a single address.
pub fn parse_net(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if let Ok(net) = IpNet::from_str(text) {
        return Ok(net.trunc());
    }
    IpAddr::from_str(text).map(IpNet::from).map_err(|_| {
        format!("{text:?} is not an address or CIDR range (e.g. 10.0.0.0/8, 127.0.0.1, fd00::/8)")
    })
}

/// 127.0.0.0/8 and ::1.
pub fn loopback_nets() -> Vec<IpNet> {
    vec![
        IpNet::from_str("127.0.0.0/8").expect("literal"),
        IpNet::from_str("::1/128").expect("literal"),
    ]
}

/// An IPv4 address carried in IPv6 (mapped, or NAT64's well-known prefix)
/// as the IPv4 address it reaches.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_unique_local()
        || ip.is_unicast_link_local()
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated)
        || first == 0x2001 && ip.segments()[1] == 0x0db8 // documentation
        || first == 0x2002 // 6to4: reaches an embedded IPv4 address
        || ip.segments()[..5] == [0; 5]) // IPv4-compatible and other ::/80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn non_public_ranges_are_refused_by_default() {
        let p = EgressPolicy::public_only();
        for bad in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "198.18.0.1",
            "192.0.2.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "::127.0.0.1",
            "2001:db8::1",
        ] {
            assert!(!p.allows(ip(bad)), "{bad} should be refused");
        }
        for good in ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "1.1.1.1"] {
            assert!(p.allows(ip(good)), "{good} should be allowed");
        }
    }

    #[test]
    fn the_allow_list_opens_ranges() {
        let p = EgressPolicy::allowing(vec![parse_net("10.0.0.0/8").unwrap()]);
        assert!(p.allows(ip("10.9.8.7")));
        assert!(!p.allows(ip("127.0.0.1")));
        let p = EgressPolicy::allowing_loopback();
        assert!(p.allows(ip("127.0.0.1")) && p.allows(ip("::1")));
        assert!(
            p.allows(ip("::ffff:127.0.0.1")),
            "mapped loopback is loopback"
        );
        assert!(!p.allows(ip("169.254.169.254")));
        assert!(EgressPolicy::allowing_all().allows(ip("169.254.169.254")));
    }

    #[test]
    fn resolved_addresses_are_filtered() {
        let p = EgressPolicy::public_only();
        let a: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "93.184.216.34:80".parse().unwrap();
        assert_eq!(p.filter_resolved([a, b]), Ok(vec![b]));
        assert_eq!(
            p.filter_resolved([a]),
            Err(EgressError::Refused("127.0.0.1".into()))
        );
        assert!(matches!(
            p.filter_resolved([]),
            Err(EgressError::Malformed(_))
        ));
    }

    #[test]
    fn allow_entries_parse() {
        assert_eq!(parse_net("127.0.0.1").unwrap().to_string(), "127.0.0.1/32");
        assert_eq!(parse_net(" 10.1.2.3/8 ").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_net("fd00::/8").unwrap().to_string(), "fd00::/8");
        for bad in ["", "10.0.0.0/33", "example.com", "10.0.0"] {
            assert!(parse_net(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn urls_are_checked_on_their_literal_host() {
        let p = EgressPolicy::public_only();
        assert_eq!(p.check_url("https://example.com/hook"), Ok(()));
        assert_eq!(p.check_url("http://93.184.216.34:8080/x"), Ok(()));
        for (bad, refused) in [
            ("http://169.254.169.254/latest/meta-data", true),
            ("http://127.0.0.1:9/cb", true),
            ("http://[::1]/cb", true),
            ("http://0x7f.1/cb", true),   // 127.0.0.1, spelled another way
            ("http://2130706433/", true), // 127.0.0.1 as one number
            ("http://localhost:80/", true),
            ("http://a.localhost./", true),
            ("http://[::ffff:10.0.0.1]/", true),
        ] {
            assert!(
                matches!(p.check_url(bad), Err(EgressError::Refused(_))) == refused,
                "{bad}: {:?}",
                p.check_url(bad)
            );
        }
        assert_eq!(
            p.check_url("https://user:pw@example.com/"),
            Err(EgressError::Credentials)
        );
        assert_eq!(
            p.check_url("https://user@example.com/"),
            Err(EgressError::Credentials)
        );
        for malformed in ["ftp://example.com/", "http:///x", "http:x", "http://", "x"] {
            assert!(
                matches!(p.check_url(malformed), Err(EgressError::Malformed(_))),
                "{malformed}"
            );
        }
        assert!(
            EgressPolicy::allowing_loopback()
                .check_url("http://127.0.0.1:9/cb")
                .is_ok()
        );
    }
}
