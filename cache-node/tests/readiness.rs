//! Readiness waits for the advertised name: a node whose name does not lead to it yet
//! is alive but not ready (gRPC health of the Flight service and /readyz), and turns
//! ready once it does. Only `localhost` is looked up: from /etc/hosts (`system`), or
//! from a nameserver the test runs on loopback; no test sends a DNS query anywhere else.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{channel, http_get, start_node};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const FLIGHT_SERVICE: &str = "arrow.flight.protocol.FlightService";

async fn health(node: &cache_node::server::RunningNode, service: &str) -> ServingStatus {
    let mut client = HealthClient::new(channel(node).await);
    let answer = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner();
    ServingStatus::try_from(answer.status).unwrap()
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or_default()
}

#[tokio::test]
async fn a_node_whose_name_resolves_elsewhere_is_alive_but_not_ready() {
    // localhost resolves to loopback, never to 192.0.2.1 (TEST-NET-1): a stale record.
    let node = start_node(&[
        "--advertised-host",
        "localhost",
        "--pod-ip",
        "192.0.2.1",
        "--advertised-lookup",
        "system",
    ])
    .await;
    tokio::time::sleep(cache_node::readiness::LOOKUP_INTERVAL * 4).await;
    assert_eq!(health(&node, "").await, ServingStatus::Serving, "liveness");
    assert_eq!(
        health(&node, FLIGHT_SERVICE).await,
        ServingStatus::NotServing,
        "readiness"
    );
    let ready = http_get(node.metrics_addr, "/readyz").await;
    assert!(status_line(&ready).starts_with("HTTP/1.1 503"), "{ready}");
    assert!(ready.ends_with("waiting for the advertised name to resolve to this node"));
    let live = http_get(node.metrics_addr, "/livez").await;
    assert!(status_line(&live).starts_with("HTTP/1.1 200"), "{live}");
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_node_turns_ready_once_its_name_resolves_to_it() {
    let node = start_node(&[
        "--advertised-host",
        "localhost",
        "--pod-ip",
        "127.0.0.1",
        "--advertised-lookup",
        "system",
    ])
    .await;
    let mut waited = 0;
    while health(&node, FLIGHT_SERVICE).await != ServingStatus::Serving {
        waited += 1;
        assert!(waited < 100, "not ready after 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let ready = http_get(node.metrics_addr, "/readyz").await;
    assert!(status_line(&ready).starts_with("HTTP/1.1 200"), "{ready}");
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_an_advertised_name_a_node_is_ready_at_once() {
    let node = start_node(&[]).await;
    assert_eq!(health(&node, FLIGHT_SERVICE).await, ServingStatus::Serving);
    assert_eq!(health(&node, "").await, ServingStatus::Serving);
    node.shutdown().await.unwrap();
}

#[test]
fn an_advertised_name_must_be_a_dns_name_and_the_pod_ip_needs_one() {
    for (flags, message) in [
        (vec!["--advertised-host", "node-0:50051"], "advertised-host"),
        (vec!["--advertised-host", "a..b"], "advertised-host"),
        (vec!["--pod-ip", "10.0.0.1"], "pod-ip"),
        (vec!["--advertised-lookup", "system"], "advertised-lookup"),
    ] {
        let mut args = vec!["flightcache-node"];
        args.extend(flags.iter().copied());
        let cli = <cache_node::config::Cli as clap::Parser>::try_parse_from(args).unwrap();
        let err = cache_node::config::Config::from_cli(cli).unwrap_err();
        assert!(err.to_string().contains(message), "{flags:?}: {err}");
    }
}

#[test]
fn the_lookup_is_dns_system_or_a_nameserver_address() {
    let parse = |value: &str| {
        <cache_node::config::Cli as clap::Parser>::try_parse_from([
            "flightcache-node",
            "--advertised-lookup",
            value,
        ])
    };
    assert!(parse("dns").is_ok() && parse("system").is_ok() && parse("127.0.0.1:53").is_ok());
    let err = parse("10.96.0.10").unwrap_err().to_string();
    assert!(
        err.contains("is not `dns`, `system` or a nameserver's IP:PORT"),
        "{err}"
    );
}

/// A nameserver on loopback that answers every question with NXDOMAIN until `answer`
/// holds an address, then with that A record. Counts the questions.
struct FakeNameserver {
    address: std::net::SocketAddr,
    answer: std::sync::Arc<std::sync::Mutex<Option<[u8; 4]>>>,
    questions: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeNameserver {
    async fn start() -> Self {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let address = socket.local_addr().unwrap();
        let answer = std::sync::Arc::new(std::sync::Mutex::new(None::<[u8; 4]>));
        let questions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let task = tokio::spawn({
            let answer = answer.clone();
            let questions = questions.clone();
            async move {
                let mut buffer = [0_u8; 512];
                while let Ok((len, from)) = socket.recv_from(&mut buffer).await {
                    questions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let query = &buffer[..len];
                    let record = *answer.lock().unwrap();
                    let mut reply = query[..2].to_vec();
                    let rcode: u16 = if record.is_some() { 0 } else { 3 };
                    reply.extend_from_slice(&(0x8180 | rcode).to_be_bytes());
                    reply.extend_from_slice(&[0, 1, 0, u8::from(record.is_some()), 0, 0, 0, 0]);
                    reply.extend_from_slice(&query[12..]);
                    if let Some(ip) = record {
                        // Name pointer to the question, A, IN, TTL 5, 4 bytes.
                        reply.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
                        reply.extend_from_slice(&ip);
                    }
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Self {
            address,
            answer,
            questions,
            task,
        }
    }
}

#[tokio::test]
async fn readiness_follows_the_cluster_dns_not_the_hosts_file() {
    // localhost is in /etc/hosts (as a pod's own name is in a pod's): the system
    // resolver would say ready at once. The nameserver has no record yet.
    let dns = FakeNameserver::start().await;
    let nameserver = dns.address.to_string();
    let node = start_node(&[
        "--advertised-host",
        "localhost",
        "--pod-ip",
        "127.0.0.1",
        "--advertised-lookup",
        &nameserver,
    ])
    .await;
    tokio::time::sleep(cache_node::readiness::LOOKUP_INTERVAL * 4).await;
    assert_eq!(
        health(&node, FLIGHT_SERVICE).await,
        ServingStatus::NotServing,
        "not ready while the cluster DNS has no record"
    );
    assert!(
        dns.questions.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "asked repeatedly"
    );

    // The record of an earlier pod: still not ready.
    *dns.answer.lock().unwrap() = Some([10, 244, 0, 3]);
    tokio::time::sleep(cache_node::readiness::LOOKUP_INTERVAL * 4).await;
    assert_eq!(
        health(&node, FLIGHT_SERVICE).await,
        ServingStatus::NotServing
    );

    *dns.answer.lock().unwrap() = Some([127, 0, 0, 1]);
    let mut waited = 0;
    while health(&node, FLIGHT_SERVICE).await != ServingStatus::Serving {
        waited += 1;
        assert!(waited < 100, "not ready 10 s after the record appeared");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    node.shutdown().await.unwrap();
    dns.task.abort();
}
