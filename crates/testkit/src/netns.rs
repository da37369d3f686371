//! Hosts of a test's own on one machine, for the fault tests: each a
//! network namespace with one veth link into a bridge of the test's own in
//! the root namespace, on a private /24 (10.200.0.0–10.249.255.255). The
//! test process itself is the bridge's address ([`Net::observer`]) and
//! sees every host; no route leads anywhere else, so no traffic leaves the
//! test's namespaces.
//!
//! Links are cut with blackhole routes ([`Net::cut`]): packets between the
//! two hosts are dropped silently, so an open TCP connection stays open
//! (half-open, its data retransmitted until the link heals or a keepalive
//! gives up), and a new connection fails at once (`connect` answers
//! EINVAL, as an unreachable route would). This kernel has no `sch_netem`
//! and no tc classifiers or actions (checked: `tc qdisc add … netem`
//! answers "Specified qdisc kind is unknown", `tc filter … u32` "TC
//! classifier not found", and there is no `modprobe`), so delay and
//! random loss cannot be made with tc here; the fault tests cut links on
//! and off instead.
//!
//! Needs root (`ip netns add`); a test without it fails saying so. Every
//! namespace and the bridge are deleted when the [`Net`] is dropped; drop
//! the processes first.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Where a process runs and listens: a namespace of a [`Net`] and its
/// address there, or this process's own namespace on loopback
/// ([`Place::local`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The namespace, `None` for the test's own.
    pub ns: Option<String>,
    /// The address it listens on and is reached at.
    pub ip: Ipv4Addr,
    /// A short name for messages (`r0`, `redis`, …).
    pub name: String,
}

impl Place {
    /// The test's own namespace, on loopback.
    pub fn local() -> Self {
        Self {
            ns: None,
            ip: Ipv4Addr::LOCALHOST,
            name: "local".into(),
        }
    }

    /// `program` to be run in this place (`ip netns exec NS program`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match &self.ns {
            None => Command::new(program),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
        }
    }

    /// `ip:port`.
    pub fn addr(&self, port: u16) -> SocketAddr {
        (self.ip, port).into()
    }

    /// Whether it listens on loopback only.
    pub fn is_loopback(&self) -> bool {
        self.ip.is_loopback()
    }
}

/// A bridge and the hosts on it; see the module documentation.
pub struct Net {
    id: u32,
    net: [u8; 2],
    bridge: String,
    hosts: Vec<Place>,
    /// Blackholed (from namespace, to address) pairs.
    cuts: Mutex<BTreeSet<(Option<String>, Ipv4Addr)>>,
}

/// Runs `ip ARGS`, failing the test with its stderr.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip (apt-get install iproute2): {e}"));
    assert!(
        out.status.success(),
        "ip {}: {} (the fault tests make network namespaces and need root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `ip ARGS` in namespace `ns` (the root one for `None`).
fn ip_in(ns: Option<&str>, args: &[&str]) {
    match ns {
        None => ip(args),
        Some(ns) => {
            let mut all = vec!["-n", ns];
            all.extend_from_slice(args);
            ip(&all);
        }
    }
}

impl Net {
    /// A new bridge with the test process on it as `10.x.y.1`.
    pub fn new() -> Self {
        let id = (std::process::id().wrapping_mul(16) + NEXT.fetch_add(1, Ordering::Relaxed))
            % (50 * 256);
        let net = [200 + (id / 256) as u8, (id % 256) as u8];
        let bridge = format!("tmb{id}");
        // A bridge left by a killed run of the same id would be in the way.
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        let this = Self {
            id,
            net,
            bridge,
            hosts: Vec::new(),
            cuts: Mutex::new(BTreeSet::new()),
        };
        ip(&[
            "addr",
            "add",
            &format!("{}/24", this.address(1)),
            "dev",
            &this.bridge,
        ]);
        ip(&["link", "set", &this.bridge, "up"]);
        this
    }

    fn address(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net[0], self.net[1], host)
    }

    /// The test process's own place on the bridge: it reaches every host.
    pub fn observer(&self) -> Place {
        Place {
            ns: None,
            ip: self.address(1),
            name: "test".into(),
        }
    }

    /// A new host `name` (a namespace with loopback and one link into the
    /// bridge).
    pub fn host(&mut self, name: &str) -> Place {
        let n = self.hosts.len();
        assert!(n < 250, "at most 250 hosts on one test net");
        let ns = format!("tm{}-{name}", self.id);
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        ip(&["netns", "add", &ns]);
        let outside = format!("tm{}h{n}", self.id);
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        ip(&["link", "set", &outside, "master", &self.bridge, "up"]);
        let place = Place {
            ns: Some(ns.clone()),
            ip: self.address(n as u8 + 2),
            name: name.into(),
        };
        ip_in(
            Some(&ns),
            &["addr", "add", &format!("{}/24", place.ip), "dev", "eth0"],
        );
        ip_in(Some(&ns), &["link", "set", "eth0", "up"]);
        ip_in(Some(&ns), &["link", "set", "lo", "up"]);
        self.hosts.push(place.clone());
        place
    }

    /// Every host made so far.
    pub fn hosts(&self) -> &[Place] {
        &self.hosts
    }

    /// Drops what `from` sends to `to` (`to` still sends to `from`, but a
    /// TCP connection between them stalls: its acknowledgements are lost).
    pub fn cut_one_way(&self, from: &Place, to: &Place) {
        let key = (from.ns.clone(), to.ip);
        if self.cuts.lock().unwrap().insert(key) {
            ip_in(
                from.ns.as_deref(),
                &["route", "add", "blackhole", &format!("{}/32", to.ip)],
            );
        }
    }

    /// Cuts the link between `a` and `b` both ways.
    pub fn cut(&self, a: &Place, b: &Place) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Cuts every link between a host of `left` and one of `right`.
    pub fn split(&self, left: &[&Place], right: &[&Place]) {
        for a in left {
            for b in right {
                self.cut(a, b);
            }
        }
    }

    /// Restores the link between `a` and `b` both ways.
    pub fn heal(&self, a: &Place, b: &Place) {
        for (from, to) in [(a, b), (b, a)] {
            let key = (from.ns.clone(), to.ip);
            if self.cuts.lock().unwrap().remove(&key) {
                ip_in(
                    from.ns.as_deref(),
                    &["route", "del", "blackhole", &format!("{}/32", to.ip)],
                );
            }
        }
    }

    /// Restores every cut link.
    pub fn heal_all(&self) {
        let cuts: Vec<_> = std::mem::take(&mut *self.cuts.lock().unwrap())
            .into_iter()
            .collect();
        for (ns, to) in cuts {
            ip_in(
                ns.as_deref(),
                &["route", "del", "blackhole", &format!("{to}/32")],
            );
        }
    }

    /// How many (one-way) cuts are in place.
    pub fn cut_count(&self) -> usize {
        self.cuts.lock().unwrap().len()
    }
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Best effort: a failing test must not fail again here. Routes in
        // the root namespace go first (the namespaces take theirs along).
        for (ns, to) in std::mem::take(&mut *self.cuts.lock().unwrap()) {
            if ns.is_none() {
                let _ = Command::new("ip")
                    .args(["route", "del", "blackhole", &format!("{to}/32")])
                    .output();
            }
        }
        for h in &self.hosts {
            if let Some(ns) = &h.ns {
                let _ = Command::new("ip").args(["netns", "del", ns]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}
