//! Readiness waits for the advertised name: a node whose name does not lead to it yet
//! is alive but not ready (gRPC health of the Flight service and /readyz), and turns
//! ready once it does. Only `localhost` is looked up (from /etc/hosts): no test sends a
//! DNS query anywhere.

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
    let node = start_node(&["--advertised-host", "localhost", "--pod-ip", "192.0.2.1"]).await;
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
    let node = start_node(&["--advertised-host", "localhost", "--pod-ip", "127.0.0.1"]).await;
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
    ] {
        let mut args = vec!["flightcache-node"];
        args.extend(flags.iter().copied());
        let cli = <cache_node::config::Cli as clap::Parser>::try_parse_from(args).unwrap();
        let err = cache_node::config::Config::from_cli(cli).unwrap_err();
        assert!(err.to_string().contains(message), "{flags:?}: {err}");
    }
}
