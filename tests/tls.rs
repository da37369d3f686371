//! TLS on a real node, with certificates made in the test (rcgen): both
//! ports serve TLS; plaintext and a client trusting another CA are refused;
//! mutual TLS on the gRPC port refuses clients without a certificate of
//! the configured CA while the REST port (whose gateway reaches gRPC in
//! process) keeps working; new certificate files are picked up without a
//! restart.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use taskmesh::v1::{self as pb, task_api_client::TaskApiClient};
use taskmesh_cli::tls::TlsFiles;
use taskmesh_testkit::*;
use taskmesh_worker::ClientTls;

type Ca = CertifiedIssuer<'static, KeyPair>;

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// A certificate of `ca` for `names` (server or client use): PEM cert, key.
fn leaf(ca: &Ca, names: &[&str], client: bool) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, names[0]);
    p.extended_key_usages = vec![if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    (p.signed_by(&key, ca).unwrap().pem(), key.serialize_pem())
}

/// Writes the server's certificate of `ca` (for 127.0.0.1 and localhost)
/// into `dir`; the files.
fn server_files(dir: &Path, ca: &Ca, client_ca: Option<&Ca>) -> TlsFiles {
    let (cert, key) = leaf(ca, &["localhost", "127.0.0.1"], false);
    // Key first, then the certificate, each replaced whole (rename): a
    // reload never reads half a file.
    let put = |name: &str, text: &str| {
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
        dir.join(name)
    };
    let key = put("server.key", &key);
    let cert = put("server.crt", &cert);
    let client_ca = client_ca.map(|c| put("client-ca.crt", &c.pem()));
    TlsFiles {
        cert,
        key,
        client_ca,
    }
}

async fn tls_node(dir: &Path, files: TlsFiles) -> taskmesh_cli::node::RunningNode {
    let mut opts = node_options(dir);
    opts.tls = Some(files);
    opts.tls_reload_interval = Duration::from_millis(100);
    start_node(opts).await
}

/// A `ListTasks` over `url` trusting `ca`, presenting `identity`: whether
/// it worked, and the error if not.
async fn list_over(
    url: &str,
    ca: Option<&Ca>,
    identity: Option<(String, String)>,
) -> Result<usize, String> {
    let tls = ClientTls {
        ca_pem: ca.map(|c| c.pem().into_bytes()),
        identity: identity.map(|(c, k)| (c.into_bytes(), k.into_bytes())),
    };
    let endpoint = ClientTls::endpoint(Some(&tls), url)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    TaskApiClient::new(channel)
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .map(|r| r.into_inner().tasks.len())
        .map_err(|s| format!("{s:?}"))
}

fn https(addr: std::net::SocketAddr) -> String {
    format!("https://127.0.0.1:{}", addr.port())
}

fn rest_client(ca: &Ca) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .build()
        .unwrap()
}

/// `POST /api/tasks` over TLS to the REST port `http`, expecting 202; the
/// new task's id.
async fn submit_over_rest(rest: &reqwest::Client, http: u16) -> String {
    let reply = rest
        .post(format!("https://127.0.0.1:{http}/api/tasks"))
        .header("content-type", "application/json")
        .body(r#"{"handler":"echo"}"#)
        .send()
        .await
        .expect("REST over TLS");
    assert_eq!(reply.status(), reqwest::StatusCode::ACCEPTED);
    let body: serde_json::Value = serde_json::from_str(&reply.text().await.unwrap()).unwrap();
    body["taskId"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn both_ports_serve_tls_and_refuse_plaintext_and_other_cas() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, ca2) = (ca("taskmesh test CA 1"), ca("taskmesh test CA 2"));
    let node = tls_node(dir.path(), server_files(dir.path(), &ca1, None)).await;
    let url = https(node.grpc_addr);

    assert_eq!(
        list_over(&url, Some(&ca1), None).await,
        Ok(0),
        "TLS with the right CA"
    );
    let plaintext = list_over(
        &format!("http://127.0.0.1:{}", node.grpc_addr.port()),
        None,
        None,
    )
    .await;
    assert!(
        plaintext.is_err(),
        "plaintext to the TLS port: {plaintext:?}"
    );
    let stranger = list_over(&url, Some(&ca2), None).await;
    assert!(
        stranger.is_err(),
        "a client trusting another CA: {stranger:?}"
    );

    // REST over TLS; plain HTTP to it fails.
    let rest = rest_client(&ca1);
    let http = node.http_addr.port();
    submit_over_rest(&rest, http).await;
    assert_eq!(
        list_over(&url, Some(&ca1), None).await,
        Ok(1),
        "the REST submit reached the store"
    );
    let health = rest
        .get(format!("https://127.0.0.1:{http}/healthz"))
        .send()
        .await
        .expect("healthz over TLS");
    assert_eq!(health.status(), reqwest::StatusCode::OK);
    let plain = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{http}/healthz"))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP to the TLS port: {plain:?}");
    stop_node(node).await;
}

#[tokio::test]
async fn mutual_tls_on_the_grpc_port_needs_a_certificate_of_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, clients, other) = (ca("server CA"), ca("client CA"), ca("another CA"));
    let node = tls_node(dir.path(), server_files(dir.path(), &ca1, Some(&clients))).await;
    let url = https(node.grpc_addr);

    let none = list_over(&url, Some(&ca1), None).await;
    assert!(none.is_err(), "no client certificate: {none:?}");
    let wrong = list_over(&url, Some(&ca1), Some(leaf(&other, &["intruder"], true))).await;
    assert!(
        wrong.is_err(),
        "a client certificate of another CA: {wrong:?}"
    );
    let good = leaf(&clients, &["worker-1"], true);
    assert_eq!(list_over(&url, Some(&ca1), Some(good.clone())).await, Ok(0));

    // The REST port asks for no certificate, and its gateway still reaches
    // the gRPC service.
    let id = submit_over_rest(&rest_client(&ca1), node.http_addr.port()).await;
    assert_eq!(list_over(&url, Some(&ca1), Some(good.clone())).await, Ok(1));

    // The Rust SDK's worker over mutual TLS runs it.
    let mut opts = taskmesh_worker::WorkerOptions::new(vec![url.clone()]);
    opts.worker_id = "tls-worker".into();
    opts.tls = Some(ClientTls {
        ca_pem: Some(ca1.pem().into_bytes()),
        identity: Some((good.0.into_bytes(), good.1.into_bytes())),
    });
    let mut worker = taskmesh_worker::Worker::new(opts);
    worker.add_handler("echo", taskmesh_worker::builtin("echo").unwrap());
    let worker = TestWorker::spawn(worker);
    assert!(
        worker.handle.wait_connected(Duration::from_secs(10)).await,
        "the worker connects over mutual TLS"
    );
    let channel = ClientTls::endpoint(
        Some(&ClientTls {
            ca_pem: Some(ca1.pem().into_bytes()),
            identity: Some(leaf(&clients, &["reader"], true))
                .map(|(c, k)| (c.into_bytes(), k.into_bytes())),
        }),
        &url,
    )
    .unwrap()
    .connect()
    .await
    .unwrap();
    wait_task_state(
        &TaskApiClient::new(channel),
        &id,
        pb::TaskState::Succeeded,
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;
    stop_node(node).await;
}

#[tokio::test]
async fn new_certificate_files_are_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, ca2) = (ca("before"), ca("after"));
    let node = tls_node(dir.path(), server_files(dir.path(), &ca1, None)).await;
    let url = https(node.grpc_addr);
    assert_eq!(list_over(&url, Some(&ca1), None).await, Ok(0));

    server_files(dir.path(), &ca2, None);
    wait_for(
        "the node to serve the new certificate",
        Duration::from_secs(10),
        || async { list_over(&url, Some(&ca2), None).await.ok() },
    )
    .await;
    let old = list_over(&url, Some(&ca1), None).await;
    assert!(
        old.is_err(),
        "new connections get the new certificate: {old:?}"
    );
    stop_node(node).await;
}
