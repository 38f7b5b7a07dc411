//! TLS on the Flight port: served with the certificate from the files, plaintext refused,
//! peers verifying each other against the CA, and a rotated certificate (the files
//! replaced, as the kubelet does with a Secret volume) served to new connections while
//! calls on an open connection go on without a failure, and a TLS connection kept only
//! once a call on it was admitted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow_flight::FlightClient;
use cache_node::server::RunningNode;
use cache_node::wire::tls::RELOAD_INTERVAL;
use common::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A CA that signs node certificates.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { ca }
    }

    fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses) and its key, as PEM.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// The TLS files of one node in `dir`.
struct NodeFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl NodeFiles {
    fn write(dir: &Path, pki: &Pki) -> Self {
        let files = Self {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        };
        files.rotate(pki);
        files
    }

    /// Replaces the files as the kubelet does: each written beside and renamed over.
    fn rotate(&self, pki: &Pki) {
        let (cert, key) = pki.leaf(&["localhost", "127.0.0.1"]);
        for (path, text) in [
            (&self.ca, pki.ca_pem()),
            (&self.key, key),
            (&self.cert, cert),
        ] {
            let temporary = path.with_extension("new");
            std::fs::write(&temporary, text).unwrap();
            std::fs::rename(&temporary, path).unwrap();
        }
    }

    fn flags(&self) -> Vec<String> {
        [
            ("--tls-cert-file", &self.cert),
            ("--tls-key-file", &self.key),
            ("--tls-ca-file", &self.ca),
        ]
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.to_str().unwrap().to_owned()])
        .collect()
    }
}

/// The SHA-256 (lowercase hex) of each certificate in the PEM file `path`, as a node's
/// `stats` report them.
fn fingerprints_of(path: &Path) -> Vec<String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(|der| {
            let digest = ring::digest::digest(&ring::digest::SHA256, der.unwrap().as_ref());
            digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
        })
        .collect()
}

/// What `stats` says the node serves and trusts: (served, trusted).
async fn tls_in_use(client: &mut FlightClient) -> (String, Vec<String>) {
    let answer = stats(client).await;
    let tls = &answer["tls"];
    (
        tls["servedSha256"].as_str().unwrap_or_default().to_owned(),
        tls["trustedSha256"]
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

async fn start_tls_node(files: &NodeFiles, extra: &[&str]) -> RunningNode {
    let flags = files.flags();
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    start_node(&args).await
}

/// A channel to `node` over TLS, verifying against `ca_pem`.
async fn tls_channel(node: &RunningNode, ca_pem: &str) -> Result<Channel, tonic::transport::Error> {
    tls_channel_as(node, ca_pem, None).await
}

/// A channel to `node` over TLS, verifying against `ca_pem` and presenting `identity`
/// (certificate and key, PEM) when given.
async fn tls_channel_as(
    node: &RunningNode,
    ca_pem: &str,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://localhost:{}", node.flight_addr.port()))
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
}

/// Whether a `ping` over TLS, presenting `identity`, gets an answer.
async fn ping_as(node: &RunningNode, ca_pem: &str, identity: Option<&(String, String)>) -> bool {
    // With TLS 1.3 the client finishes its handshake before the server has checked the
    // client's certificate: a refusal shows on the first call, not on connect.
    let Ok(channel) = tls_channel_as(node, ca_pem, identity).await else {
        return false;
    };
    action(&mut FlightClient::new(channel), "ping", b"")
        .await
        .is_ok()
}

#[tokio::test]
async fn a_tls_node_serves_its_certificate_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let files = NodeFiles::write(dir.path(), &pki);
    let node = start_tls_node(&files, &[]).await;
    let mut client = FlightClient::new(tls_channel(&node, &pki.ca_pem()).await.unwrap());
    let batches = vec![sample_batch(1000, 3)];
    put(&mut client, path("tls/1"), batches.clone(), None)
        .await
        .unwrap();
    assert_eq!(
        get(&mut client, path_ticket("tls/1")).await.unwrap(),
        batches
    );

    // Plaintext gRPC to a TLS port: no answer but a failed call.
    let mut plain = client_for_plaintext(&node).await;
    let err = action(&mut plain, "ping", b"").await.unwrap_err();
    println!("plaintext call to the TLS port: {err}");
    // A client trusting another CA does not get through the handshake.
    let stranger = Pki::new("another CA");
    assert!(tls_channel(&node, &stranger.ca_pem()).await.is_err());
    node.shutdown().await.unwrap();
}

async fn client_for_plaintext(node: &RunningNode) -> FlightClient {
    let channel = Channel::from_shared(format!("http://{}", node.flight_addr))
        .unwrap()
        .connect_lazy();
    FlightClient::new(channel)
}

#[tokio::test]
async fn a_node_that_cannot_read_its_certificate_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let files = NodeFiles::write(dir.path(), &pki);
    std::fs::write(&files.key, "not a key").unwrap();
    let flags = files.flags();
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let err = cache_node::server::start(
        loopback_config(&args),
        std::sync::Arc::new(cache_node::store::SystemClock::new()),
    )
    .await
    .unwrap_err();
    let message = crds::chain(&err);
    assert!(
        message.contains("tls.key") && message.contains("PRIVATE KEY"),
        "{message}"
    );
}

#[tokio::test]
async fn peers_forward_over_tls_verified_against_the_ca() {
    let pki = Pki::new("pool CA");
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let files: Vec<NodeFiles> = dirs
        .iter()
        .map(|d| NodeFiles::write(d.path(), &pki))
        .collect();
    let nodes = [
        start_tls_node(&files[0], &["--member-id", "n-0"]).await,
        start_tls_node(&files[1], &["--member-id", "n-1"]).await,
    ];
    let members: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            json!({"id": format!("n-{i}"), "address": format!("localhost:{}", node.flight_addr.port()), "state": "active"})
        })
        .collect();
    let body = json!({"topology": {"version": 1, "replicas": 1, "members": members}}).to_string();
    let mut clients = Vec::new();
    for node in &nodes {
        let mut client = FlightClient::new(tls_channel(node, &pki.ca_pem()).await.unwrap());
        action(&mut client, "configure", body.as_bytes())
            .await
            .unwrap();
        clients.push(client);
    }
    // Every key put through node 0 is read back through node 1: half of them live on the
    // other node, so both DoPut and DoGet were forwarded over TLS.
    for i in 0..20 {
        let key = format!("tls-fwd/{i}");
        let batches = vec![sample_batch(50, i)];
        put(&mut clients[0], path(&key), batches.clone(), None)
            .await
            .unwrap();
        assert_eq!(
            get(&mut clients[1], path_ticket(&key)).await.unwrap(),
            batches
        );
    }
    let held: Vec<u64> = nodes.iter().map(|n| n.store.stats().entries).collect();
    assert!(held.iter().all(|&n| n > 0), "both nodes own keys: {held:?}");
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_connections_without_a_failed_call() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Pki::new("old CA");
    let files = NodeFiles::write(dir.path(), &old_ca);
    let node = start_tls_node(&files, &[]).await;
    let mut client = FlightClient::new(tls_channel(&node, &old_ca.ca_pem()).await.unwrap());
    let batches = vec![sample_batch(200, 1)];
    put(&mut client, path("rotate/1"), batches.clone(), None)
        .await
        .unwrap();
    // `stats` says which certificate it serves and which CAs it trusts (the operator
    // moves a CA rotation on from these).
    let before = (
        fingerprints_of(&files.cert).remove(0),
        fingerprints_of(&files.ca),
    );
    assert_eq!(tls_in_use(&mut client).await, before);

    // A half-written file is not served: the node keeps its certificate.
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\ntruncated").unwrap();
    tokio::time::sleep(RELOAD_INTERVAL + Duration::from_secs(1)).await;
    assert!(tls_channel(&node, &old_ca.ca_pem()).await.is_ok());
    assert!(counter(&node, "flightcache_node_tls_reload_failures_total").await >= 1);
    assert_eq!(
        counter(&node, "flightcache_node_tls_reloads_total").await,
        0
    );

    // The certificate rotates (here to a new CA, so which one a handshake got is visible)
    // while the open connection keeps reading.
    let new_ca = Pki::new("new CA");
    files.rotate(&new_ca);
    let started = Instant::now();
    let mut calls = 0;
    loop {
        assert_eq!(
            get(&mut client, path_ticket("rotate/1")).await.unwrap(),
            batches,
            "call {calls} on the open connection"
        );
        calls += 1;
        if tls_channel(&node, &new_ca.ca_pem()).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < RELOAD_INTERVAL * 3,
            "the rotated certificate was not served within {:?}",
            RELOAD_INTERVAL * 3
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "rotated certificate served after {:?} (reload interval {RELOAD_INTERVAL:?}); {calls} calls on the open connection, none failed",
        started.elapsed()
    );
    assert!(tls_channel(&node, &old_ca.ca_pem()).await.is_err());
    // The certificate and the CA.
    assert_eq!(
        counter(&node, "flightcache_node_tls_reloads_total").await,
        2
    );
    let after = (
        fingerprints_of(&files.cert).remove(0),
        fingerprints_of(&files.ca),
    );
    assert_ne!(after, before);
    assert_eq!(tls_in_use(&mut client).await, after);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn silent_connections_give_their_handshake_places_back_within_the_first_byte_timeout() {
    // Worst case: every handshake place taken by connections that never send a byte.
    // Each gives its place back after FIRST_BYTE_TIMEOUT (1 s), so a real client gets
    // through within about that; before, it waited for the 10 s handshake timeout.
    use cache_node::wire::tls::{FIRST_BYTE_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("pool CA");
    let files = NodeFiles::write(dir.path(), &pki);
    let node = start_tls_node(&files, &[]).await;
    let failures_before = counter(&node, "flightcache_node_tls_handshake_failures_total").await;
    let mut silent = Vec::new();
    for _ in 0..MAX_PENDING_HANDSHAKES {
        silent.push(
            tokio::net::TcpStream::connect(node.flight_addr)
                .await
                .unwrap(),
        );
    }
    let started = std::time::Instant::now();
    assert!(
        ping_as(&node, &pki.ca_pem(), None).await,
        "a client gets through"
    );
    let took = started.elapsed();
    // Budget: the first-byte timeout, then the handshake and a ping on loopback; 2 s
    // more for a loaded machine. Waiting for the handshake timeout instead breaks it.
    let budget = FIRST_BYTE_TIMEOUT + std::time::Duration::from_secs(2);
    println!(
        "a TLS client behind {} silent connections got through in {took:?} (budget {budget:?})",
        silent.len()
    );
    assert!(took < budget && budget < HANDSHAKE_TIMEOUT, "{took:?}");
    // Each silent connection is counted once its first-byte timeout has passed (they
    // time out together, about a second after they connected): polled for 5 s.
    let wanted = failures_before + MAX_PENDING_HANDSHAKES as u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while counter(&node, "flightcache_node_tls_handshake_failures_total").await < wanted {
        assert!(
            std::time::Instant::now() < deadline,
            "each silent connection is counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(silent);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn with_client_auth_required_only_certificates_from_the_ca_get_in() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("pool CA");
    let files = NodeFiles::write(dir.path(), &pki);
    let node = start_tls_node(&files, &["--tls-client-auth", "required"]).await;
    let ca = pki.ca_pem();
    let failures_before = counter(&node, "flightcache_node_tls_handshake_failures_total").await;
    assert!(!ping_as(&node, &ca, None).await, "no client certificate");
    let stranger = Pki::new("another CA").leaf(&["client"]);
    assert!(
        !ping_as(&node, &ca, Some(&stranger)).await,
        "a certificate of another CA"
    );
    assert_eq!(
        counter(&node, "flightcache_node_tls_handshake_failures_total").await,
        failures_before + 2,
        "each refused handshake is counted"
    );
    let member = pki.leaf(&["client"]);
    let mut client = FlightClient::new(tls_channel_as(&node, &ca, Some(&member)).await.unwrap());
    let batches = vec![sample_batch(300, 5)];
    put(&mut client, path("mtls/1"), batches.clone(), None)
        .await
        .unwrap();
    assert_eq!(
        get(&mut client, path_ticket("mtls/1")).await.unwrap(),
        batches
    );
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn peers_that_require_client_certificates_forward_with_their_own() {
    let pki = Pki::new("pool CA");
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let files: Vec<NodeFiles> = dirs
        .iter()
        .map(|d| NodeFiles::write(d.path(), &pki))
        .collect();
    let nodes = [
        start_tls_node(
            &files[0],
            &["--member-id", "n-0", "--tls-client-auth", "required"],
        )
        .await,
        start_tls_node(
            &files[1],
            &["--member-id", "n-1", "--tls-client-auth", "required"],
        )
        .await,
    ];
    let members: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            json!({"id": format!("n-{i}"), "address": format!("localhost:{}", node.flight_addr.port()), "state": "active"})
        })
        .collect();
    let body = json!({"topology": {"version": 1, "replicas": 1, "members": members}}).to_string();
    let identity = pki.leaf(&["client"]);
    let mut clients = Vec::new();
    for node in &nodes {
        let channel = tls_channel_as(node, &pki.ca_pem(), Some(&identity))
            .await
            .unwrap();
        let mut client = FlightClient::new(channel);
        action(&mut client, "configure", body.as_bytes())
            .await
            .unwrap();
        clients.push(client);
    }
    for i in 0..20 {
        let key = format!("mtls-fwd/{i}");
        let batches = vec![sample_batch(50, i)];
        put(&mut clients[0], path(&key), batches.clone(), None)
            .await
            .unwrap();
        assert_eq!(
            get(&mut clients[1], path_ticket(&key)).await.unwrap(),
            batches
        );
    }
    let held: Vec<u64> = nodes.iter().map(|n| n.store.stats().entries).collect();
    assert!(held.iter().all(|&n| n > 0), "both nodes own keys: {held:?}");
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_rotated_ca_admits_its_clients_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Pki::new("old CA");
    let files = NodeFiles::write(dir.path(), &old_ca);
    let node = start_tls_node(&files, &["--tls-client-auth", "required"]).await;
    let old_client = old_ca.leaf(&["client"]);
    assert!(ping_as(&node, &old_ca.ca_pem(), Some(&old_client)).await);
    let new_ca = Pki::new("new CA");
    let new_client = new_ca.leaf(&["client"]);
    assert!(!ping_as(&node, &old_ca.ca_pem(), Some(&new_client)).await);
    files.rotate(&new_ca);
    let started = Instant::now();
    while !ping_as(&node, &new_ca.ca_pem(), Some(&new_client)).await {
        assert!(
            started.elapsed() < RELOAD_INTERVAL * 3,
            "a client of the rotated CA was not admitted within {:?}",
            RELOAD_INTERVAL * 3
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "a client of the rotated CA admitted after {:?} (reload interval {RELOAD_INTERVAL:?})",
        started.elapsed()
    );
    // The node now serves the new CA's certificate: a client of the old CA no longer
    // trusts it, and a certificate of the old CA no longer gets in.
    assert!(!ping_as(&node, &new_ca.ca_pem(), Some(&old_client)).await);
    node.shutdown().await.unwrap();
}

#[test]
fn client_auth_without_tls_is_refused_with_its_reason() {
    let cli = <cache_node::config::Cli as clap::Parser>::try_parse_from([
        "flightcache-node",
        "--tls-client-auth",
        "required",
    ])
    .unwrap();
    let err = cache_node::config::Config::from_cli(cli).unwrap_err();
    assert!(err.to_string().contains("tls-client-auth"), "{err}");
    assert!(
        crds::chain(&err).contains("need TLS"),
        "{}",
        crds::chain(&err)
    );
    let bad = <cache_node::config::Cli as clap::Parser>::try_parse_from([
        "flightcache-node",
        "--tls-client-auth",
        "optional",
    ])
    .unwrap_err();
    assert!(bad.to_string().contains("use none or required"), "{bad}");
}

#[tokio::test]
async fn over_tls_a_connection_is_kept_once_a_call_on_it_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("limit CA");
    let files = NodeFiles::write(dir.path(), &pki);
    let node = start_tls_node(&files, &[]).await;
    // Admitted (this node takes calls without a token) on one connection; another
    // finishes its TLS handshake and carries no call.
    let mut admitted = FlightClient::new(tls_channel(&node, &pki.ca_pem()).await.unwrap());
    action(&mut admitted, "ping", b"").await.unwrap();
    let _idle = tls_channel(&node, &pki.ca_pem()).await.unwrap();
    let limit = cache_node::connection::UNAUTHENTICATED_CONNECTION_LIMIT;
    tokio::time::sleep(limit + Duration::from_secs(2)).await;
    // The idle one was closed at its limit; the admitted one still answers (found under
    // the TLS connect info, not only the plain one).
    assert_eq!(
        counter(
            &node,
            "flightcache_node_unauthenticated_connections_closed_total"
        )
        .await,
        1
    );
    action(&mut admitted, "ping", b"").await.unwrap();
    assert_eq!(
        counter(
            &node,
            "flightcache_node_unauthenticated_connections_closed_total"
        )
        .await,
        1,
        "the admitted connection was not the one closed"
    );
    node.shutdown().await.unwrap();
}

/// The value of counter `name` on the node's metrics endpoint.
async fn counter(node: &RunningNode, name: &str) -> u64 {
    let text = scrape(node.metrics_addr).await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// A server whose kernel accepts connections that its process never answers: a frozen
/// (SIGSTOP) node. Returns its port and the task holding the accepted connections.
async fn silent_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            kept.push(stream);
        }
    });
    (port, held)
}

/// A TLS endpoint (connect timeout `connect`) of a [`silent_server`], and the task holding
/// its accepted connections.
async fn silent_tls_endpoint(
    connect: Duration,
) -> (tonic::transport::Endpoint, tokio::task::JoinHandle<()>) {
    let (port, held) = silent_server().await;
    let pki = Pki::new("frozen CA");
    let endpoint = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem())))
        .unwrap()
        .connect_timeout(connect);
    (endpoint, held)
}

#[tokio::test]
async fn a_tls_channel_to_a_frozen_server_fails_within_its_connect_timeout() {
    // The peers' and the load generator's channels (cache_node::dial): the TLS handshake
    // is inside the connect timeout, so calls queued on a connection to a frozen node
    // fail (a transport error) and go elsewhere instead of waiting out their deadlines.
    const CONNECT: Duration = Duration::from_millis(500);
    // The bound is the connect timeout; four times it leaves room for a loaded machine.
    const BUDGET: Duration = Duration::from_secs(2);
    let (endpoint, held) = silent_tls_endpoint(CONNECT).await;
    let started = Instant::now();
    let mut bounded = FlightClient::new(cache_node::dial::lazy_channel(&endpoint));
    let answer = tokio::time::timeout(Duration::from_secs(10), action(&mut bounded, "ping", b""))
        .await
        .expect("the call waited 10 s: the TLS handshake was not bounded");
    let elapsed = started.elapsed();
    let err = answer.expect_err("a silent server answered");
    println!(
        "the call failed after {elapsed:?} (connect timeout {CONNECT:?}, budget {BUDGET:?}): {err}"
    );
    assert!(elapsed < BUDGET, "{elapsed:?}");
    // The error a TCP connect timeout gives too, which callers already fail over on.
    assert!(err.to_string().contains("transport error"), "{err}");
    // The control: tonic's lazy channel bounds only the TCP connect, and the call waits
    // in the handshake.
    let mut unbounded = FlightClient::new(endpoint.connect_lazy());
    assert!(
        tokio::time::timeout(Duration::from_secs(3), action(&mut unbounded, "ping", b""))
            .await
            .is_err(),
        "tonic's own lazy channel gave up on the handshake: the bound is no longer needed"
    );
    held.abort();
}

#[tokio::test]
async fn calls_queued_on_a_channel_to_a_frozen_server_all_fail_with_its_first_connect() {
    // tonic hands a failed connect's error to one queued call and connects again for the
    // next: without cache_node::dial's guard the k-th of these calls failed after k
    // connect timeouts (8 calls: 4 s), as relayed reads queued on a peer's channel did
    // in the changes e2e's node-frozen over TLS (one outlived its client's 5 s deadline).
    const CONNECT: Duration = Duration::from_millis(500);
    const CALLS: usize = 8;
    // The promise is one connect timeout for every queued call; four times it leaves room
    // for a loaded machine and is half of what the serial failures took.
    const BUDGET: Duration = Duration::from_secs(2);
    let (endpoint, held) = silent_tls_endpoint(CONNECT).await;
    let channel = cache_node::dial::lazy_channel(&endpoint);
    let started = Instant::now();
    let calls = (0..CALLS).map(|_| {
        let mut client = FlightClient::new(channel.clone());
        async move {
            let answer =
                tokio::time::timeout(Duration::from_secs(10), action(&mut client, "ping", b""))
                    .await
                    .expect("a queued call waited 10 s");
            (started.elapsed(), answer)
        }
    });
    let failed = futures::future::join_all(calls).await;
    let slowest = failed.iter().map(|(took, _)| *took).max().unwrap();
    println!(
        "{CALLS} calls queued on one channel to a silent server failed by {slowest:?} \
         (connect timeout {CONNECT:?}, budget {BUDGET:?}; one at a time they took {:?})",
        CONNECT * CALLS as u32
    );
    for (took, answer) in &failed {
        let err = answer
            .as_ref()
            .expect_err("a silent server answered")
            .to_string();
        // The first: the connect timed out; the others: the guard's refusal, which says why.
        assert!(
            err.contains("transport error") || err.contains("the last connection got no answer"),
            "{err}"
        );
        assert!(*took < BUDGET, "a queued call failed after {took:?}");
    }
    // Once SILENT_PEER_SKIPPED_FOR is over the channel connects again (a node that is
    // back is reached): this call waits out a whole connect timeout, not a refusal.
    tokio::time::sleep(cache_node::dial::SILENT_PEER_SKIPPED_FOR).await;
    let mut client = FlightClient::new(channel.clone());
    let again = Instant::now();
    let answer = action(&mut client, "ping", b"").await;
    let took = again.elapsed();
    println!("a call after the skip window failed after {took:?}");
    assert!(answer.is_err());
    assert!(
        took >= CONNECT,
        "the channel did not try to connect again after {took:?}"
    );
    held.abort();
}
