//! Reading a node's `/metrics` (the Prometheus text format) the way a
//! scraper does: over HTTP, then sample by sample.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// `GET http://{addr}{path}`: (status, body); `None` when nothing answers
/// within 2 s.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?;
    let resp = client
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// The body of `/metrics` on the loopback HTTP port `http`; `None` when the
/// node does not answer (or not with 200).
pub async fn scrape(http: u16) -> Option<String> {
    scrape_at(([127, 0, 0, 1], http).into()).await
}

/// The body of `/metrics` on the node's HTTP address `addr`.
pub async fn scrape_at(addr: SocketAddr) -> Option<String> {
    let (status, text) = http_get(addr, "/metrics").await?;
    (status == 200).then_some(text)
}

/// Every sample of `name` whose labels include `labels`: their values.
fn samples<'a>(
    text: &'a str,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let have: BTreeMap<&str, &str> = rest
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.trim_matches('"')))
                })
                .collect();
            labels
                .iter()
                .all(|(k, v)| have.get(k) == Some(v))
                .then(|| value.parse().ok())?
        })
}

/// The value of the first sample `name` whose labels include `labels`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text, name, labels).next()
}

/// The sum of every sample of `name` whose labels include `labels` (0 when
/// there is none).
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name, labels).sum()
}

/// The sum of every series of metric `name` on the node's `/metrics`,
/// `Some(0.0)` when the family is absent, `None` when the node does not
/// answer.
pub async fn metric(http: u16, name: &str) -> Option<f64> {
    metric_at(([127, 0, 0, 1], http).into(), name).await
}

/// [`metric`] of the node whose HTTP address is `addr`.
pub async fn metric_at(addr: SocketAddr, name: &str) -> Option<f64> {
    Some(sum(&scrape_at(addr).await?, name, &[]))
}

/// Whether the node reports holding the lease (`taskmesh_leader 1`).
pub async fn leads(http: u16) -> bool {
    leads_at(([127, 0, 0, 1], http).into()).await
}

/// [`leads`] of the node whose HTTP address is `addr`.
pub async fn leads_at(addr: SocketAddr) -> bool {
    metric_at(addr, "taskmesh_leader").await == Some(1.0)
}

/// Lease renewals that failed so far (the coordinator's call histogram);
/// fails the test when the node does not answer.
pub async fn renew_failures(http: u16) -> f64 {
    let text = scrape(http).await.expect("scrape /metrics");
    sum(
        &text,
        "taskmesh_coord_call_duration_seconds_count",
        &[("op", "acquire_or_renew"), ("outcome", "error")],
    )
}
