//! In-flight tries per receiver, so one slow or silent receiver holds at
//! most `per_host` of the deliverer's slots and never delays another's
//! callbacks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// First and longest wait of an entry put back because its receiver was
/// full; the wait doubles each time the receiver is found full again and
/// resets when one of its tries ends.
const FULL_BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));

#[derive(Default)]
struct Host {
    in_flight: usize,
    /// Times found full since a try of it last ended.
    full_streak: u32,
}

/// The receivers with tries in flight.
pub(crate) struct Hosts {
    per_host: usize,
    map: Arc<Mutex<HashMap<String, Host>>>,
}

/// A receiver's slot, given back on drop.
pub(crate) struct Slot {
    key: String,
    map: Arc<Mutex<HashMap<String, Host>>>,
}

impl Hosts {
    pub(crate) fn new(per_host: usize) -> Self {
        Self {
            per_host,
            map: Arc::default(),
        }
    }

    /// A slot of `url`'s receiver, or how long to put the entry back for.
    pub(crate) fn enter(&self, url: &str) -> Result<Slot, Duration> {
        let key = receiver(url);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let host = map.entry(key.clone()).or_default();
        if host.in_flight >= self.per_host {
            let wait = FULL_BACKOFF
                .0
                .saturating_mul(1 << host.full_streak.min(16))
                .min(FULL_BACKOFF.1);
            host.full_streak = host.full_streak.saturating_add(1);
            return Err(wait);
        }
        host.in_flight += 1;
        Ok(Slot {
            key,
            map: self.map.clone(),
        })
    }

    #[cfg(test)]
    fn in_flight(&self, url: &str) -> usize {
        let map = self.map.lock().unwrap();
        map.get(&receiver(url)).map_or(0, |h| h.in_flight)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(host) = map.get_mut(&self.key) {
            host.in_flight = host.in_flight.saturating_sub(1);
            host.full_streak = 0;
            if host.in_flight == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// `scheme://host:port` of a URL (the URL itself if it does not parse).
fn receiver(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}:{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port_or_known_default().unwrap_or(0)
        ),
        Err(_) => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_receiver_backs_off_and_others_are_not_affected() {
        let hosts = Hosts::new(2);
        let a1 = hosts.enter("http://a.example/x").unwrap();
        let _a2 = hosts.enter("http://A.example:80/y").unwrap();
        assert_eq!(
            hosts.enter("http://a.example/z").err(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            hosts.enter("http://a.example/z").err(),
            Some(Duration::from_millis(500))
        );
        let _b = hosts
            .enter("http://b.example/")
            .expect("another receiver has room");
        assert_eq!(hosts.in_flight("http://a.example/"), 2);
        drop(a1);
        assert_eq!(hosts.in_flight("http://a.example/"), 1);
        let _a3 = hosts.enter("http://a.example/").expect("a slot came back");
        assert_eq!(
            hosts.enter("http://a.example/").err(),
            Some(Duration::from_millis(250)),
            "the streak restarted when a try ended"
        );
        for _ in 0..30 {
            let _ = hosts.enter("http://a.example/");
        }
        assert_eq!(hosts.enter("http://a.example/").err(), Some(FULL_BACKOFF.1));
    }
}
