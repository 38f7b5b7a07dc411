//! Component tests of routing: three in-process nodes on 127.0.0.1:0 sharing a topology
//! (sent with the `configure` action once their ports are known).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightClient, FlightData, Ticket};
use cache_node::routing::ring::{MemberState, Ring, RingMember};
use cache_node::server::RunningNode;
use common::*;
use futures::TryStreamExt;
use serde_json::json;
use tonic::Code;

struct Cluster {
    nodes: Vec<Option<RunningNode>>,
    addresses: Vec<String>,
    replicas: u8,
}

impl Cluster {
    async fn start(n: usize) -> Self {
        Self::start_with_replicas(n, 1).await
    }

    async fn start_with_replicas(n: usize, replicas: u8) -> Self {
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = format!("n-{i}");
            nodes.push(Some(start_node(&["--member-id", &id]).await));
        }
        let addresses = nodes
            .iter()
            .map(|node| node.as_ref().unwrap().flight_addr.to_string())
            .collect();
        let cluster = Self {
            nodes,
            addresses,
            replicas,
        };
        cluster.publish(1, &[]).await;
        cluster
    }

    fn topology(&self, version: u64, draining: &[usize]) -> serde_json::Value {
        let states: Vec<_> = (0..self.addresses.len())
            .map(|i| {
                if draining.contains(&i) {
                    "draining"
                } else {
                    "active"
                }
            })
            .collect();
        self.topology_with(version, &states)
    }

    /// A topology with one state per member.
    fn topology_with(&self, version: u64, states: &[&str]) -> serde_json::Value {
        let members: Vec<_> = self
            .addresses
            .iter()
            .zip(states)
            .enumerate()
            .map(|(i, (address, state))| {
                json!({"id": format!("n-{i}"), "address": address, "state": state})
            })
            .collect();
        json!({"version": version, "replicas": self.replicas, "members": members})
    }

    /// Sends `topology` to every running node.
    async fn publish_document(&self, topology: serde_json::Value) {
        let body = json!({ "topology": topology }).to_string();
        for node in self.nodes.iter().flatten() {
            action(&mut client(node).await, "configure", body.as_bytes())
                .await
                .unwrap();
        }
    }

    /// The ring the nodes route by, for picking keys by owner.
    fn ring(&self, draining: &[usize]) -> Ring {
        Ring::new(
            1,
            (0..self.addresses.len())
                .map(|i| {
                    let state = if draining.contains(&i) {
                        MemberState::Draining
                    } else {
                        MemberState::Active
                    };
                    RingMember::new(format!("n-{i}"), state)
                })
                .collect(),
        )
    }

    async fn publish(&self, version: u64, draining: &[usize]) {
        let body = json!({"topology": self.topology(version, draining)}).to_string();
        for node in self.nodes.iter().flatten() {
            let answer = action(&mut client(node).await, "configure", body.as_bytes())
                .await
                .unwrap();
            let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(answer["ringVersion"], version);
        }
    }

    async fn client(&self, i: usize) -> FlightClient {
        client(self.nodes[i].as_ref().unwrap()).await
    }

    fn node(&self, i: usize) -> &RunningNode {
        self.nodes[i].as_ref().unwrap()
    }

    async fn stop(&mut self, i: usize) {
        self.nodes[i].take().unwrap().shutdown().await.unwrap();
    }

    async fn shutdown(mut self) {
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            node.shutdown().await.unwrap();
        }
    }
}

/// Path keys `prefix/0..` whose owner under `ring` is `owner`.
fn keys_owned_by(ring: &Ring, owner: &str, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}/{i}"))
        .filter(|key| ring.owner(format!("P{key}").as_bytes()).unwrap() == owner)
        .take(count)
        .collect()
}

async fn raw_get(node: &RunningNode, key: &str) -> Vec<FlightData> {
    let mut raw = FlightServiceClient::new(channel(node).await);
    raw.do_get(path_ticket(key))
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test]
async fn put_through_one_node_and_get_through_another_is_byte_identical() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let (mut via0, mut via1, mut via2) = (
        cluster.client(0).await,
        cluster.client(1).await,
        cluster.client(2).await,
    );
    for owner in 0..3 {
        for key in keys_owned_by(&ring, &format!("n-{owner}"), "reports", 3) {
            let batches = vec![sample_batch(5000, owner as i64), sample_batch(17, 3)];
            put(&mut via0, path(&key), batches.clone(), None)
                .await
                .unwrap();
            assert_eq!(
                get(&mut via2, path_ticket(&key)).await.unwrap(),
                batches,
                "{key}"
            );
            // The relayed messages are the owner's messages, byte for byte.
            let direct = raw_get(cluster.node(owner), &key).await;
            let relayed = raw_get(cluster.node(2), &key).await;
            assert_eq!(direct, relayed, "{key}");

            let info = via1.get_flight_info(path(&key)).await.unwrap();
            assert_eq!(info.total_records, 5017);
            assert_eq!(
                info.endpoint[0].location[0].uri,
                format!("grpc://{}", cluster.addresses[owner])
            );
            let schema = via1.get_schema(path(&key)).await.unwrap();
            assert_eq!(schema, *batches[0].schema());
        }
    }
    // Each entry is held by its owner only.
    for i in 0..3 {
        assert_eq!(cluster.node(i).store.stats().entries, 3, "node {i}");
    }
    // invalidate goes to the owner; invalidate-prefix and clear reach every member.
    let key = &keys_owned_by(&ring, "n-1", "reports", 1)[0];
    let removed = action(&mut via2, "invalidate", key.as_bytes())
        .await
        .unwrap();
    assert_eq!(&removed[..], br#"{"removed":true}"#);
    let err = get(&mut via0, path_ticket(key)).await.unwrap_err();
    assert_eq!(status(err).code(), Code::NotFound);
    let removed = action(&mut via0, "invalidate-prefix", b"reports/")
        .await
        .unwrap();
    assert_eq!(&removed[..], br#"{"removed":8}"#);
    for i in 0..3 {
        assert_eq!(cluster.node(i).store.stats().entries, 0, "node {i}");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_owner_is_named_while_other_keys_are_served() {
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let on1 = keys_owned_by(&ring, "n-1", "dash", 1).remove(0);
    let on2 = keys_owned_by(&ring, "n-2", "dash", 1).remove(0);
    let mut via0 = cluster.client(0).await;
    let batch = sample_batch(100, 0);
    put(&mut via0, path(&on2), vec![batch.clone()], None)
        .await
        .unwrap();
    cluster.stop(1).await;

    let err = get(&mut via0, path_ticket(&on1)).await.unwrap_err();
    let status = status(err);
    assert_eq!(status.code(), Code::Unavailable);
    let expected = format!("owner n-1 ({}) is unreachable", cluster.addresses[1]);
    assert!(status.message().contains(&expected), "{}", status.message());
    let err = put(&mut via0, path(&on1), vec![batch.clone()], None)
        .await
        .unwrap_err();
    assert_eq!(common::status(err).code(), Code::Unavailable);

    assert_eq!(
        get(&mut via0, path_ticket(&on2)).await.unwrap(),
        vec![batch]
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_forwarded_request_is_not_forwarded_again() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let on2 = keys_owned_by(&ring, "n-2", "loop", 1).remove(0);
    let mut raw = FlightServiceClient::new(channel(cluster.node(0)).await);
    let mut request = tonic::Request::new(path_ticket(&on2));
    request
        .metadata_mut()
        .insert("x-flightcache-forwarded", "n-1".parse().unwrap());
    request
        .metadata_mut()
        .insert("x-flightcache-ring-version", "1".parse().unwrap());
    let status = raw.do_get(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("ring disagreement"),
        "{}",
        status.message()
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_new_ring_version_moves_keys_while_traffic_runs() {
    let cluster = Cluster::start(3).await;
    let before = cluster.ring(&[]);
    let after = cluster.ring(&[2]);
    let mut traffic_client = cluster.client(0).await;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // Put and read back distinct keys through node 0 until told to stop.
    let traffic = tokio::spawn(async move {
        let (mut ok, mut transient) = (0usize, 0usize);
        for i in 0.. {
            if *stop_rx.borrow_and_update() {
                break;
            }
            let key = format!("live/{i}");
            let batch = sample_batch(50, i);
            let result = match put(&mut traffic_client, path(&key), vec![batch.clone()], None).await
            {
                Ok(_) => get(&mut traffic_client, path_ticket(&key)).await,
                Err(err) => Err(err),
            };
            match result {
                Ok(got) => {
                    assert_eq!(got, vec![batch]);
                    ok += 1;
                }
                Err(err) => {
                    // While nodes hold different ring versions a forwarded call can meet a
                    // node whose ring disagrees (UNAVAILABLE, retryable), and an entry put
                    // at the old owner just before the switch is a miss at the new one.
                    let status = status(err);
                    let ring_change = status.code() == Code::Unavailable
                        && status.message().contains("ring disagreement");
                    assert!(ring_change || status.code() == Code::NotFound, "{status}");
                    transient += 1;
                }
            }
        }
        (ok, transient)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.publish(2, &[2]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_tx.send(true).unwrap();
    let (ok, _transient) = traffic.await.unwrap();
    assert!(ok > 10, "{ok} round trips");

    // Keys n-2 owned now live on their second choice; n-2 receives no new entries.
    let moved = keys_owned_by(&before, "n-2", "moved", 4);
    let entries_on_2 = cluster.node(2).store.stats().entries;
    let mut via1 = cluster.client(1).await;
    let mut via2 = cluster.client(2).await;
    for key in &moved {
        let batch = sample_batch(10, 1);
        put(&mut via1, path(key), vec![batch.clone()], None)
            .await
            .unwrap();
        assert_eq!(get(&mut via2, path_ticket(key)).await.unwrap(), vec![batch]);
        let new_owner = after.owner(format!("P{key}").as_bytes()).unwrap();
        assert_eq!(new_owner, before.owners(format!("P{key}").as_bytes(), 2)[1]);
        let info = via2.get_flight_info(path(key)).await.unwrap();
        let index: usize = new_owner.trim_start_matches("n-").parse().unwrap();
        assert_eq!(
            info.endpoint[0].location[0].uri,
            format!("grpc://{}", cluster.addresses[index])
        );
    }
    assert_eq!(cluster.node(2).store.stats().entries, entries_on_2);

    // An older ring is refused; the topology action shows the running one.
    let body = json!({"topology": cluster.topology(1, &[])}).to_string();
    let err = action(&mut via1, "configure", body.as_bytes())
        .await
        .unwrap_err();
    let refused = status(err);
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    let topology: serde_json::Value =
        serde_json::from_slice(&action(&mut via1, "topology", b"").await.unwrap()).unwrap();
    assert_eq!(topology["version"], 2);
    assert_eq!(topology["memberId"], "n-1");
    assert_eq!(topology["members"][2]["state"], "draining");
    cluster.shutdown().await;
}

#[tokio::test]
async fn without_a_topology_get_flight_info_has_no_location() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    put(&mut client, path("a"), vec![sample_batch(3, 0)], None)
        .await
        .unwrap();
    let info = client.get_flight_info(path("a")).await.unwrap();
    assert!(info.endpoint[0].location.is_empty());
    let stats = stats(&mut client).await;
    assert_eq!(stats["ringVersion"], 0);
    let _ = Ticket::default();
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_ring_aware_client_goes_straight_to_the_owner_and_follows_ring_changes() {
    use cache_node::client::RingClient;
    let mut cluster = Cluster::start(3).await;
    let client = RingClient::connect(&cluster.addresses[0], None)
        .await
        .unwrap();
    assert_eq!(client.ring_version(), 1);
    let ring = cluster.ring(&[]);
    let batch = sample_batch(300, 7);
    for owner in 0..3 {
        for key in keys_owned_by(&ring, &format!("n-{owner}"), "direct", 2) {
            assert_eq!(
                client.address_for(&path(&key)).unwrap(),
                cluster.addresses[owner]
            );
            client.put(path(&key), vec![batch.clone()]).await.unwrap();
            assert_eq!(client.get(&path(&key)).await.unwrap(), vec![batch.clone()]);
        }
    }
    // No hop: every node handled exactly the two puts and gets of its own keys.
    for i in 0..3 {
        let text = scrape(cluster.node(i).metrics_addr).await;
        assert!(
            text.contains("flightcache_node_ring_version 1\n"),
            "node {i}"
        );
        for method in ["DoPut", "DoGet"] {
            let line = format!(
                "flightcache_node_grpc_server_handled_total{{grpc_method=\"{method}\",grpc_code=\"OK\"}} 2"
            );
            assert!(text.contains(&line), "node {i}: {line}");
        }
    }

    // n-1 goes away and the ring drops it: the client's first call fails, it refreshes
    // and retries at the new owner.
    let key = keys_owned_by(&ring, "n-1", "moving", 1).remove(0);
    cluster.stop(1).await;
    let survivors = Cluster {
        nodes: Vec::new(),
        addresses: cluster.addresses.clone(),
        replicas: 1,
    };
    let body = json!({"topology": survivors.topology(2, &[1])}).to_string();
    for i in [0, 2] {
        action(&mut cluster.client(i).await, "configure", body.as_bytes())
            .await
            .unwrap();
    }
    client.put(path(&key), vec![batch.clone()]).await.unwrap();
    assert_eq!(client.ring_version(), 2);
    assert_ne!(
        client.address_for(&path(&key)).unwrap(),
        cluster.addresses[1]
    );
    assert_eq!(client.get(&path(&key)).await.unwrap(), vec![batch]);
    assert!(client.invalidate(&path(&key)).await.unwrap());
    assert_eq!(client.lease(&path(&key)).await.unwrap()["lease"], "granted");
    let err = client.get(&path(&key)).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound));
    cluster.shutdown().await;
}

#[tokio::test]
async fn concurrent_misses_through_any_node_get_one_fill_lease() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-2", "slow-query", 1).remove(0);
    // The first miss, through node 0, gets the lease.
    let first = action(&mut cluster.client(0).await, "lease", key.as_bytes())
        .await
        .unwrap();
    let first: serde_json::Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(first["lease"], "granted");
    // Eight more misses through every node wait for the holder's put.
    let mut callers = Vec::new();
    for i in 0..8 {
        let mut client = cluster.client(i % 3).await;
        let key = key.clone();
        callers.push(tokio::spawn(async move {
            let answer = action(&mut client, "lease", key.as_bytes()).await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&answer).unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let batch = sample_batch(40, 2);
    put(
        &mut cluster.client(0).await,
        path(&key),
        vec![batch.clone()],
        None,
    )
    .await
    .unwrap();
    for caller in callers {
        let outcome = caller.await.unwrap()["lease"].as_str().unwrap().to_owned();
        // "hit" only if a caller was slower than the put: no second query either way.
        assert!(outcome == "filled" || outcome == "hit", "{outcome}");
    }
    assert_eq!(
        get(&mut cluster.client(1).await, path_ticket(&key))
            .await
            .unwrap(),
        vec![batch]
    );
    let answer = action(&mut cluster.client(1).await, "lease", key.as_bytes())
        .await
        .unwrap();
    assert_eq!(&answer[..], br#"{"lease":"hit"}"#);
    cluster.shutdown().await;
}

#[tokio::test]
async fn location_mode_direct_names_the_owner_and_proxy_names_no_location() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-2", "located", 1).remove(0);
    let batch = sample_batch(64, 9);
    let mut via0 = cluster.client(0).await;
    put(&mut via0, path(&key), vec![batch.clone()], None)
        .await
        .unwrap();
    assert_eq!(stats(&mut via0).await["locationMode"], "direct");
    let info = via0.get_flight_info(path(&key)).await.unwrap();
    assert_eq!(
        info.endpoint[0].location[0].uri,
        format!("grpc://{}", cluster.addresses[2])
    );

    // Switch node 0 (the one the client asks) to proxy, live; the owner stays direct.
    let answer = action(&mut via0, "configure", br#"{"locationMode": "proxy"}"#)
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["generation"], 1);
    assert_eq!(stats(&mut via0).await["locationMode"], "proxy");
    let info = via0.get_flight_info(path(&key)).await.unwrap();
    assert!(info.endpoint[0].location.is_empty(), "{info:?}");
    // Redeeming the ticket on the node asked works: it forwards the DoGet to the owner.
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    assert_eq!(get(&mut via0, ticket).await.unwrap(), vec![batch.clone()]);
    // The owner in proxy mode answers its own keys without a location too.
    let mut via2 = cluster.client(2).await;
    action(&mut via2, "configure", br#"{"locationMode": "proxy"}"#)
        .await
        .unwrap();
    let info = via2.get_flight_info(path(&key)).await.unwrap();
    assert!(info.endpoint[0].location.is_empty(), "{info:?}");
    // And back to direct.
    action(&mut via0, "configure", br#"{"locationMode": "direct"}"#)
        .await
        .unwrap();
    action(&mut via2, "configure", br#"{"locationMode": "direct"}"#)
        .await
        .unwrap();
    let info = via0.get_flight_info(path(&key)).await.unwrap();
    assert_eq!(
        info.endpoint[0].location[0].uri,
        format!("grpc://{}", cluster.addresses[2])
    );
    let err = action(&mut via0, "configure", br#"{"locationMode": "sideways"}"#)
        .await
        .unwrap_err();
    assert_eq!(status(err).code(), Code::InvalidArgument);
    cluster.shutdown().await;
}

#[tokio::test]
async fn the_location_mode_flag_sets_the_starting_mode() {
    let node = start_node(&["--location-mode", "proxy"]).await;
    let mut client = client(&node).await;
    assert_eq!(stats(&mut client).await["locationMode"], "proxy");
    node.shutdown().await.unwrap();
}

fn node_index(id: &str) -> usize {
    id.trim_start_matches("n-").parse().unwrap()
}

/// The ring's first two choices for path `key`, as node indices.
fn two_owners(ring: &Ring, key: &str) -> (usize, usize) {
    let owners = ring.owners(format!("P{key}").as_bytes(), 2);
    (node_index(owners[0]), node_index(owners[1]))
}

fn holds(node: &RunningNode, key: &str) -> bool {
    node.store.peek(format!("P{key}").as_bytes()).is_some()
}

#[tokio::test]
async fn with_two_replicas_both_choices_hold_a_write_and_reads_survive_the_owner_stopping() {
    let mut cluster = Cluster::start_with_replicas(3, 2).await;
    let ring = cluster.ring(&[]);
    // Keys owned by n-1, written through n-0 (a non-owner) and n-1 itself.
    let keys = keys_owned_by(&ring, "n-1", "replicated", 6);
    let mut via0 = cluster.client(0).await;
    let mut via1 = cluster.client(1).await;
    let mut before = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let batches = vec![sample_batch(3000, i as i64), sample_batch(11, 5)];
        let client = if i % 2 == 0 { &mut via0 } else { &mut via1 };
        put(client, path(key), batches, Some(r#"{"ttl": "10m"}"#))
            .await
            .unwrap();
        let (first, second) = two_owners(&ring, key);
        assert_eq!(first, 1);
        let third = 3 - first - second;
        assert!(holds(cluster.node(first), key), "{key} on its owner");
        assert!(
            holds(cluster.node(second), key),
            "{key} on its second choice"
        );
        assert!(
            !holds(cluster.node(third), key),
            "{key} only on its two choices"
        );
        // The copy keeps the per-entry TTL.
        let copy = cluster
            .node(second)
            .store
            .peek(format!("P{key}").as_bytes())
            .unwrap();
        assert_eq!(copy.ttl_override(), Some(Duration::from_secs(600)));
        before.push(raw_get(cluster.node(1), key).await);
    }
    let text = scrape(cluster.node(1).metrics_addr).await;
    assert!(
        text.contains("flightcache_node_replica_write_failures_total 0\n"),
        "{text}"
    );

    // The owner stops: every key is still served, byte for byte, through both others.
    cluster.stop(1).await;
    let mut via2 = cluster.client(2).await;
    for (key, messages) in keys.iter().zip(&before) {
        for i in [0, 2] {
            assert_eq!(
                &raw_get(cluster.node(i), key).await,
                messages,
                "{key} via n-{i}"
            );
        }
        let info = via2.get_flight_info(path(key)).await.unwrap();
        assert_eq!(info.total_records, 3011);
        via0.get_schema(path(key)).await.unwrap();
    }
    // A key never written is still a miss, not UNAVAILABLE.
    let missing = keys_owned_by(&ring, "n-1", "never", 1).remove(0);
    let err = get(&mut via0, path_ticket(&missing)).await.unwrap_err();
    assert_eq!(status(err).code(), Code::NotFound);
    cluster.shutdown().await;
}

#[tokio::test]
async fn with_two_replicas_invalidate_removes_both_copies_and_a_down_replica_does_not_fail_writes()
{
    let mut cluster = Cluster::start_with_replicas(3, 2).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-0", "inv", 1).remove(0);
    let (first, second) = two_owners(&ring, &key);
    let mut via2 = cluster.client(2).await;
    put(&mut via2, path(&key), vec![sample_batch(10, 0)], None)
        .await
        .unwrap();
    assert!(holds(cluster.node(first), &key) && holds(cluster.node(second), &key));
    let answer = action(&mut via2, "invalidate", key.as_bytes())
        .await
        .unwrap();
    assert_eq!(&answer[..], br#"{"removed":true}"#);
    assert!(!holds(cluster.node(first), &key) && !holds(cluster.node(second), &key));

    // A key whose second choice is down: the write succeeds on the owner and is counted.
    let third = 3 - first - second;
    cluster.stop(second).await;
    let mut via_owner = cluster.client(first).await;
    let batch = sample_batch(20, 1);
    put(&mut via_owner, path(&key), vec![batch.clone()], None)
        .await
        .unwrap();
    assert_eq!(
        get(&mut cluster.client(third).await, path_ticket(&key))
            .await
            .unwrap(),
        vec![batch]
    );
    let text = scrape(cluster.node(first).metrics_addr).await;
    assert!(
        text.contains("flightcache_node_replica_write_failures_total 1\n"),
        "{text}"
    );
    // Invalidating while a copy is unreachable says so (the reachable copy is removed).
    let err = action(&mut via_owner, "invalidate", key.as_bytes())
        .await
        .unwrap_err();
    assert_eq!(status(err).code(), Code::Unavailable);
    assert!(!holds(cluster.node(first), &key));
    cluster.shutdown().await;
}

async fn listed(client: &mut FlightClient, prefix: &str) -> Result<Vec<String>, tonic::Status> {
    let infos: Vec<_> = client
        .list_flights(prefix.as_bytes().to_vec())
        .await
        .map_err(status)?
        .try_collect()
        .await
        .map_err(status)?;
    Ok(infos
        .into_iter()
        .map(|info| info.flight_descriptor.unwrap().path.join("/"))
        .collect())
}

#[tokio::test]
async fn list_flights_on_any_node_lists_the_whole_pool_once_per_key() {
    let mut cluster = Cluster::start_with_replicas(3, 2).await;
    let mut via0 = cluster.client(0).await;
    let mut expected = Vec::new();
    for i in 0..12 {
        let key = format!("listing/{i:02}");
        put(&mut via0, path(&key), vec![sample_batch(5, i)], None)
            .await
            .unwrap();
        expected.push(key);
        put(
            &mut via0,
            path(&format!("other/{i}")),
            vec![sample_batch(1, i)],
            None,
        )
        .await
        .unwrap();
    }
    // Every key is held twice, and every node holds only part of them.
    let held: u64 = (0..3).map(|i| cluster.node(i).store.stats().entries).sum();
    assert_eq!(held, 48);
    for i in 0..3 {
        let mut client = cluster.client(i).await;
        assert_eq!(
            listed(&mut client, "listing/").await.unwrap(),
            expected,
            "via n-{i}"
        );
        assert_eq!(listed(&mut client, "").await.unwrap().len(), 24);
    }
    // The owner's FlightInfo is the one kept: its location is the key's owner.
    let ring = cluster.ring(&[]);
    let infos: Vec<_> = via0
        .list_flights(b"listing/".to_vec())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    for info in infos {
        let key = info.flight_descriptor.as_ref().unwrap().path.join("/");
        let owner = node_index(ring.owner(format!("P{key}").as_bytes()).unwrap());
        assert_eq!(
            info.endpoint[0].location[0].uri,
            format!("grpc://{}", cluster.addresses[owner])
        );
    }
    // A member that is down fails the call, naming it, instead of a partial list.
    cluster.stop(1).await;
    let err = listed(&mut via0, "listing/").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("n-1"), "{}", err.message());
    // Once the ring drains n-1 the others list what they hold (its keys' second copies).
    cluster.publish(2, &[1]).await;
    assert_eq!(listed(&mut via0, "listing/").await.unwrap(), expected);
    cluster.shutdown().await;
}

async fn rebalance(node: &RunningNode, body: &str) -> serde_json::Value {
    let answer = action(&mut client(node).await, "rebalance", body.as_bytes())
        .await
        .unwrap();
    serde_json::from_slice(&answer).unwrap()
}

/// The batches put under `rebalanced/{i}`.
fn rebalanced_batches(i: usize) -> Vec<RecordBatch> {
    vec![sample_batch(20 + i % 7, i as i64), sample_batch(3, 1)]
}

async fn put_rebalanced_keys(client: &mut FlightClient, count: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..count {
        let key = format!("rebalanced/{i}");
        // Every tenth entry has its own TTL, which a handover must keep.
        let options = (i % 10 == 0).then_some(r#"{"ttl": "10m"}"#);
        put(client, path(&key), rebalanced_batches(i), options)
            .await
            .unwrap();
        keys.push(key);
    }
    keys
}

fn store_keys(node: &RunningNode) -> Vec<String> {
    node.store
        .list(b"")
        .into_iter()
        .map(|(key, _)| String::from_utf8(key[1..].to_vec()).unwrap())
        .collect()
}

#[tokio::test]
async fn rebalance_on_a_draining_node_hands_every_entry_to_the_new_owners() {
    let cluster = Cluster::start(3).await;
    let mut via0 = cluster.client(0).await;
    let keys = put_rebalanced_keys(&mut via0, 300).await;
    let on_c = store_keys(cluster.node(2));
    assert!(on_c.len() > 50, "{} keys on n-2", on_c.len());
    let used_on_c = cluster.node(2).store.stats().used_bytes;
    let mut before = Vec::new();
    for key in on_c.iter().take(10) {
        before.push(raw_get(cluster.node(2), key).await);
    }
    let override_key = on_c
        .iter()
        .find(|key| {
            key.trim_start_matches("rebalanced/")
                .parse::<usize>()
                .unwrap()
                % 10
                == 0
        })
        .unwrap()
        .clone();
    let left_at_source = {
        let store = &cluster.node(2).store;
        let entry = store.peek(format!("P{override_key}").as_bytes()).unwrap();
        entry.expires_at() - store.now()
    };

    cluster.publish(2, &[2]).await;
    let dry = rebalance(cluster.node(2), r#"{"dryRun": true}"#).await;
    assert_eq!(dry["moved"], on_c.len());
    assert_eq!(dry["movedBytes"], used_on_c);
    assert_eq!(store_keys(cluster.node(2)), on_c, "a dry run moves nothing");
    let limited = rebalance(cluster.node(2), r#"{"limit": 5}"#).await;
    assert_eq!(limited["moved"], 5);
    assert_eq!(limited["kept"], on_c.len() - 5);
    let report = rebalance(cluster.node(2), "").await;
    assert_eq!(
        report,
        json!({"moved": on_c.len() - 5, "movedBytes": report["movedBytes"], "failed": 0, "kept": 0, "ringVersion": 2})
    );
    assert_eq!(
        limited["movedBytes"].as_u64().unwrap() + report["movedBytes"].as_u64().unwrap(),
        used_on_c
    );
    assert_eq!(cluster.node(2).store.stats().entries, 0, "n-2 ends empty");

    // Every key reads back through n-0, the moved ones byte for byte.
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            get(&mut via0, path_ticket(key)).await.unwrap(),
            rebalanced_batches(i),
            "{key}"
        );
    }
    for (key, messages) in on_c.iter().zip(&before) {
        assert_eq!(&raw_get(cluster.node(0), key).await, messages, "{key}");
    }
    // The per-entry TTL is kept and the entry expires no later than at the source.
    let after = cluster.ring(&[2]);
    let owner = node_index(after.owner(format!("P{override_key}").as_bytes()).unwrap());
    let store = &cluster.node(owner).store;
    let entry = store.peek(format!("P{override_key}").as_bytes()).unwrap();
    assert_eq!(entry.ttl_override(), Some(Duration::from_secs(600)));
    assert!(entry.expires_at() - store.now() <= left_at_source);

    let text = scrape(cluster.node(2).metrics_addr).await;
    for line in [
        format!(
            "flightcache_node_migrated_out_entries_total {}\n",
            on_c.len()
        ),
        format!("flightcache_node_migrated_out_bytes_total {used_on_c}\n"),
        format!(
            "flightcache_node_evictions_total{{cause=\"migrated\"}} {}\n",
            on_c.len()
        ),
    ] {
        assert!(text.contains(&line), "{line}");
    }
    let mut received = 0;
    for i in [0, 1] {
        let text = scrape(cluster.node(i).metrics_addr).await;
        let line = text
            .lines()
            .find(|line| line.starts_with("flightcache_node_migrated_in_entries_total "))
            .unwrap();
        received += line.rsplit(' ').next().unwrap().parse::<usize>().unwrap();
        // The others own everything they hold: nothing to move.
        let report = rebalance(cluster.node(i), "").await;
        assert_eq!(report["moved"], 0);
        assert_eq!(report["kept"], cluster.node(i).store.stats().entries);
    }
    assert_eq!(received, on_c.len());
    cluster.shutdown().await;
}

#[tokio::test]
async fn rebalance_after_scale_out_moves_only_the_new_members_keys() {
    let cluster = Cluster::start(3).await;
    // n-2 joins: known, owns nothing yet.
    cluster
        .publish_document(cluster.topology_with(2, &["active", "active", "joining"]))
        .await;
    let keys = put_rebalanced_keys(&mut cluster.client(0).await, 300).await;
    assert_eq!(cluster.node(2).store.stats().entries, 0);
    cluster.publish(3, &[]).await;
    let ring = cluster.ring(&[]);
    let to_c: Vec<_> = keys
        .iter()
        .filter(|key| ring.owner(format!("P{key}").as_bytes()).unwrap() == "n-2")
        .cloned()
        .collect();
    assert!((60..140).contains(&to_c.len()), "{} keys move", to_c.len());
    let moved: u64 = [
        rebalance(cluster.node(0), "").await,
        rebalance(cluster.node(1), "").await,
    ]
    .iter()
    .map(|report| {
        assert_eq!(report["failed"], 0);
        report["moved"].as_u64().unwrap()
    })
    .sum();
    assert_eq!(moved, to_c.len() as u64);
    for i in 0..3 {
        for key in store_keys(cluster.node(i)) {
            assert_eq!(
                ring.owner(format!("P{key}").as_bytes()).unwrap(),
                &format!("n-{i}"),
                "n-{i} holds {key}"
            );
        }
    }
    let mut via1 = cluster.client(1).await;
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            get(&mut via1, path_ticket(key)).await.unwrap(),
            rebalanced_batches(i)
        );
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn rebalance_keeps_entries_it_cannot_hand_over() {
    let mut cluster = Cluster::start(3).await;
    let keys = put_rebalanced_keys(&mut cluster.client(1).await, 120).await;
    let on_c = store_keys(cluster.node(2));
    cluster.publish(2, &[2]).await;
    let after = cluster.ring(&[2]);
    let to_0: Vec<_> = on_c
        .iter()
        .filter(|key| after.owner(format!("P{key}").as_bytes()).unwrap() == "n-0")
        .cloned()
        .collect();
    assert!(!to_0.is_empty());
    cluster.stop(0).await;
    let report = rebalance(cluster.node(2), "").await;
    assert_eq!(report["failed"], to_0.len());
    assert_eq!(report["moved"], on_c.len() - to_0.len());
    assert_eq!(store_keys(cluster.node(2)), to_0, "failed entries stay");
    let _ = keys;
    cluster.shutdown().await;
}
