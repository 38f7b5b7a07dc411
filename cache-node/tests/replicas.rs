//! Component tests of replicas per key and of ListFlights across the pool, on three
//! in-process nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod common;

use std::time::Duration;

use arrow_flight::FlightClient;
use cluster::*;
use common::*;
use futures::TryStreamExt;
use tonic::Code;

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

#[tokio::test]
async fn the_ring_aware_client_reads_the_second_copy_while_the_owner_is_down() {
    use cache_node::client::RingClient;
    let mut cluster = Cluster::start_with_replicas(3, 2).await;
    let client = RingClient::connect(&cluster.addresses[0], None)
        .await
        .unwrap();
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-1", "ring-aware", 1).remove(0);
    let batch = sample_batch(500, 8);
    client.put(path(&key), vec![batch.clone()]).await.unwrap();
    let (_, second) = two_owners(&ring, &key);
    assert!(holds(cluster.node(second), &key));
    cluster.stop(1).await;
    assert_eq!(client.get(&path(&key)).await.unwrap(), vec![batch]);
    cluster.shutdown().await;
}

#[tokio::test]
async fn an_owner_back_empty_is_sent_a_copy_of_each_key_it_reads_from_the_other_copy() {
    // A node back from an unplanned restart (a deleted pod) holds nothing; the ring has
    // not changed, so no rebalance refills it. Each key it misses and reads from its
    // other copy is sent back to it (read repair), so the next fault does not find the
    // key with a single copy — whichever node the read came in through.
    let cluster = Cluster::start_with_replicas(3, 2).await;
    let ring = cluster.ring(&[]);
    let keys: Vec<String> = (0..5)
        .map(|i| key_with_choices(&ring, &format!("repair{i}"), "n-0", "n-1"))
        .collect();
    let mut via0 = cluster.client(0).await;
    for key in &keys {
        put(&mut via0, path(key), vec![sample_batch(50, 1)], None)
            .await
            .unwrap();
    }
    let before: Vec<_> = keys.iter().map(|k| raw_get(cluster.node(1), k)).collect();
    let before = futures::future::join_all(before).await;
    // As after a restart: gone without a trace (a `clear` would also refuse copies
    // written before it, as stale).
    for key in &keys {
        let store_key = format!("P{key}");
        let entry = cluster.node(0).store.peek(store_key.as_bytes()).unwrap();
        assert!(
            cluster
                .node(0)
                .store
                .remove_migrated(store_key.as_bytes(), &entry)
        );
    }
    assert!(keys.iter().all(|key| !holds(cluster.node(0), key)));
    for key in &keys {
        get(&mut via0, path_ticket(key)).await.unwrap();
    }
    // The copies are sent in the background.
    for _ in 0..100 {
        if keys.iter().all(|key| holds(cluster.node(0), key)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (key, original) in keys.iter().zip(&before) {
        assert!(holds(cluster.node(0), key), "{key} sent back to n-0");
        assert_eq!(
            &raw_get(cluster.node(0), key).await,
            original,
            "{key} byte-identical"
        );
    }
    let repairs = scrape(cluster.node(1).metrics_addr).await;
    assert!(
        repairs.contains("flightcache_node_read_repairs_total 5"),
        "{}",
        repairs
            .lines()
            .filter(|l| l.contains("repair"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A key both copies hold costs no copy: n-2 (no copy) reads one, nothing is sent.
    let mut via2 = cluster.client(2).await;
    get(&mut via2, path_ticket(&keys[0])).await.unwrap();
    let again = scrape(cluster.node(1).metrics_addr).await;
    assert!(again.contains("flightcache_node_read_repairs_total 5"));
    // Read through n-2, a key n-0 lost is repaired too: n-2 forwards to n-0, which
    // misses and asks n-1 for a copy.
    let lost = format!("P{}", keys[1]);
    let entry = cluster.node(0).store.peek(lost.as_bytes()).unwrap();
    assert!(
        cluster
            .node(0)
            .store
            .remove_migrated(lost.as_bytes(), &entry)
    );
    get(&mut via2, path_ticket(&keys[1])).await.unwrap();
    for _ in 0..100 {
        if holds(cluster.node(0), &keys[1]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        holds(cluster.node(0), &keys[1]),
        "repaired through a node without a copy"
    );
    cluster.shutdown().await;
}

/// With zones in the ring (3 members in `zone-a`, 1 in `zone-b`), the second copy of a
/// key owned in `zone-a` is on the one member of `zone-b`, not on the best-ranked member
/// of its own zone; the owner is the one it would be without zones.
#[tokio::test]
async fn with_zones_a_keys_second_copy_is_written_in_another_zone() {
    let cluster = Cluster::start_with_replicas(4, 2).await;
    let mut topology = cluster.topology_with(2, &["active"; 4]);
    let zones = ["zone-a", "zone-a", "zone-a", "zone-b"];
    for (member, zone) in topology["members"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .zip(zones)
    {
        member["zone"] = serde_json::json!(zone);
    }
    cluster.publish_document(topology).await;
    // Owners do not depend on zones: the zoneless ring names them.
    let ring = cluster.ring(&[]);
    let mut via1 = cluster.client(1).await;
    for owner in 0..3 {
        for (i, key) in keys_owned_by(&ring, &format!("n-{owner}"), "zoned", 4)
            .iter()
            .enumerate()
        {
            put(&mut via1, path(key), vec![sample_batch(50, i as i64)], None)
                .await
                .unwrap();
            for node in 0..4 {
                let expected = node == owner || node == 3;
                assert_eq!(
                    holds(cluster.node(node), key),
                    expected,
                    "{key} (owner n-{owner}) on n-{node}"
                );
            }
        }
    }
    // The topology answer carries each member's zone, for ring-aware clients.
    let answer = action(&mut cluster.admin(cluster.node(2)).await, "topology", b"")
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["members"][3]["zone"], "zone-b");
    cluster.shutdown().await;
}
