//! Component tests of the `rebalance` action (handing entries to their owners after a
//! ring change), on three in-process nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod common;

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::FlightClient;
use cache_node::server::RunningNode;
use cluster::*;
use common::*;
use serde_json::json;

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
    let stats_c = stats(&mut cluster.client(2).await).await;
    assert_eq!(stats_c["memberState"], "draining");
    assert_eq!(stats_c["ringVersion"], 2);
    assert_eq!(stats_c["replicas"], 1);
    assert_eq!(stats_c["entries"], on_c.len());
    // The times the operator compares to find a node that owes a restarted peer.
    assert!(stats_c["uptimeMs"].as_u64().unwrap() > 0, "{stats_c}");
    assert_eq!(stats_c["lastRebalanceMsAgo"], serde_json::Value::Null);
    let dry = rebalance(cluster.node(2), r#"{"dryRun": true}"#).await;
    assert_eq!(dry["moved"], on_c.len());
    assert_eq!(dry["movedBytes"], used_on_c);
    assert_eq!(store_keys(cluster.node(2)), on_c, "a dry run moves nothing");
    let limited = rebalance(cluster.node(2), r#"{"limit": 5}"#).await;
    assert_eq!(limited["moved"], 5);
    assert_eq!(limited["kept"], on_c.len() - 5);
    let not_whole = stats(&mut cluster.client(2).await).await;
    assert_eq!(
        not_whole["lastRebalanceMsAgo"],
        serde_json::Value::Null,
        "a dry run and a limited rebalance do not count as a whole one"
    );
    let report = rebalance(cluster.node(2), "").await;
    let after = stats(&mut cluster.client(2).await).await;
    let ago = after["lastRebalanceMsAgo"].as_u64().unwrap();
    assert!(
        ago <= after["uptimeMs"].as_u64().unwrap() && ago < 60_000,
        "{after}"
    );
    assert_eq!(
        report,
        json!({"moved": on_c.len() - 5, "movedBytes": report["movedBytes"], "failed": 0, "kept": 0, "copied": 0, "copyFailed": 0, "ringVersion": 2})
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
    // The ring that makes n-2 active asks the two others for a handoff: each says it owes
    // one until it has rebalanced on that ring (the operator asks again otherwise); n-2,
    // the newcomer, owes nothing.
    let owes = |i: usize| {
        let cluster = &cluster;
        async move { stats(&mut cluster.client(i).await).await["owesHandover"].clone() }
    };
    assert_eq!(
        [owes(0).await, owes(1).await, owes(2).await],
        [true, true, false]
    );
    let dry = rebalance(cluster.node(0), r#"{"dryRun": true}"#).await;
    assert_eq!(dry["failed"], 0);
    assert_eq!(owes(0).await, true, "a dry run is not the handoff");
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
    assert_eq!(
        [owes(0).await, owes(1).await, owes(2).await],
        [false, false, false]
    );
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
    // A ring that only takes a member out (n-2 cut off: joining) asks nobody.
    cluster
        .publish_document(cluster.topology_with(4, &["active", "active", "joining"]))
        .await;
    assert_eq!([owes(0).await, owes(1).await], [false, false]);
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
    // An owner that could not be reached may be a restarted pod whose name still led to
    // its old address: the pass is not whole, so the operator asks again.
    let stats_c = stats(&mut cluster.client(2).await).await;
    assert_eq!(stats_c["lastRebalanceMsAgo"], serde_json::Value::Null);
    // And it says it owes a handover whatever its peers' ages (an owner cut off and back
    // without a restart is younger than nothing), until a rebalance sends everything.
    assert_eq!(stats_c["owesHandover"], true, "{stats_c}");
    let dry = rebalance(cluster.node(2), r#"{"dryRun": true}"#).await;
    assert_eq!(dry["moved"], to_0.len());
    let stats_c = stats(&mut cluster.client(2).await).await;
    assert_eq!(
        stats_c["owesHandover"], true,
        "a dry run sends nothing: {stats_c}"
    );
    let back = start_node(&["--member-id", "n-0"]).await;
    cluster.replace(0, back, 3).await;
    cluster.publish(4, &[2]).await;
    let report = rebalance(cluster.node(2), "").await;
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(report["moved"], to_0.len(), "{report}");
    assert!(store_keys(cluster.node(2)).is_empty());
    let stats_c = stats(&mut cluster.client(2).await).await;
    assert_eq!(stats_c["owesHandover"], false, "{stats_c}");
    let _ = keys;
    cluster.shutdown().await;
}

#[tokio::test]
async fn rebalance_never_brings_back_a_key_invalidated_after_the_ring_changed() {
    let cluster = Cluster::start(3).await;
    let mut via0 = cluster.client(0).await;
    put_rebalanced_keys(&mut via0, 60).await;
    let on_c = store_keys(cluster.node(2));
    cluster.publish(2, &[2]).await;
    // The invalidate goes to the key's new owner, which has no copy yet; n-2 still has one.
    let gone = &on_c[0];
    let answer = action(&mut via0, "invalidate", gone.as_bytes())
        .await
        .unwrap();
    assert_eq!(&answer[..], br#"{"removed":false}"#);
    let report = rebalance(cluster.node(2), "").await;
    assert_eq!(report["moved"], on_c.len());
    assert_eq!(cluster.node(2).store.stats().entries, 0);
    let err = get(&mut via0, path_ticket(gone)).await.unwrap_err();
    assert_eq!(status(err).code(), tonic::Code::NotFound);
    for key in &on_c[1..] {
        get(&mut via0, path_ticket(key)).await.unwrap();
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn rebalance_fills_the_second_copies_when_replicas_go_from_one_to_two() {
    let mut cluster = Cluster::start(3).await;
    let keys = put_rebalanced_keys(&mut cluster.client(0).await, 90).await;
    let held: u64 = (0..3).map(|i| cluster.node(i).store.stats().entries).sum();
    assert_eq!(held, 90);
    cluster.replicas = 2;
    cluster.publish(2, &[]).await;
    let dry = rebalance(cluster.node(0), r#"{"dryRun": true}"#).await;
    assert_eq!(dry["copied"], cluster.node(0).store.stats().entries);
    let mut copied = 0;
    for i in 0..3 {
        let report = rebalance(cluster.node(i), "").await;
        assert_eq!(report["moved"], 0);
        assert_eq!(report["copyFailed"], 0);
        copied += report["copied"].as_u64().unwrap();
    }
    // Each node sent its keys to their other owner; the copies it received since were
    // already there when it asked, so every key was copied exactly once.
    assert_eq!(copied, 90);
    let ring = cluster.ring(&[]);
    for key in &keys {
        for owner in ring.owners(format!("P{key}").as_bytes(), 2) {
            let node = cluster.node(owner.trim_start_matches("n-").parse().unwrap());
            assert!(
                node.store.peek(format!("P{key}").as_bytes()).is_some(),
                "{key} on {owner}"
            );
        }
    }
    // A second rebalance finds every copy in place.
    for i in 0..3 {
        assert_eq!(rebalance(cluster.node(i), "").await["copied"], 0);
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_member_published_joining_drops_what_it_held_so_it_never_serves_a_stale_copy() {
    // The operator takes a node that stayed unready out of the ring (joining). While it is
    // out, its keys are written and invalidated on the others; the copies it kept must
    // not be served when it is back, so it drops them on the joining ring.
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = keys_owned_by(&ring, "n-1", "out", 5);
    let mut via1 = cluster.client(1).await;
    for key in &keys {
        put(&mut via1, path(key), vec![sample_batch(10, 1)], None)
            .await
            .unwrap();
    }
    assert_eq!(cluster.node(1).store.stats().entries, 5);
    // A ring in which n-0 and n-2 stay active keeps them (only joining drops).
    cluster
        .publish_document(cluster.topology_with(2, &["active", "active", "active"]))
        .await;
    assert_eq!(cluster.node(1).store.stats().entries, 5);

    cluster
        .publish_document(cluster.topology_with(3, &["active", "joining", "active"]))
        .await;
    assert_eq!(
        cluster.node(1).store.stats().entries,
        0,
        "joining holds nothing"
    );
    // Meanwhile a key is rewritten on its new owner and another invalidated there.
    let mut via0 = cluster.client(0).await;
    put(&mut via0, path(&keys[0]), vec![sample_batch(10, 2)], None)
        .await
        .unwrap();
    // Back in: what the ring's owners hold is what is read; nothing old resurfaces.
    cluster
        .publish_document(cluster.topology_with(4, &["active", "active", "active"]))
        .await;
    for key in &keys[1..] {
        let err = get(&mut via0, path_ticket(key)).await.unwrap_err();
        assert_eq!(status(err).code(), tonic::Code::NotFound, "{key}");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn held_answers_from_the_store_alone_which_keys_of_a_batch_it_holds() {
    // The batched copy check of a rebalance: on node 0, whatever the ring says.
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let mine = keys_owned_by(&ring, "n-0", "held", 2);
    let elsewhere = keys_owned_by(&ring, "n-1", "held", 1).remove(0);
    let mut via0 = cluster.client(0).await;
    for key in mine.iter().chain([&elsewhere]) {
        put(&mut via0, path(key), vec![sample_batch(5, 1)], None)
            .await
            .unwrap();
    }
    // `elsewhere` was forwarded to n-1: node 0 does not hold it, and does not ask n-1.
    let store_key = |key: &str| cache_node::key::CacheKey::Path(key.to_owned()).to_store_bytes();
    let request = crds::admin::HeldRequest {
        keys: vec![
            store_key(&mine[0]).to_vec(),
            store_key(&elsewhere).to_vec(),
            store_key("held/never-written").to_vec(),
            store_key(&mine[1]).to_vec(),
        ],
    };
    let answer = action(&mut via0, "held", &request.encode()).await.unwrap();
    assert_eq!(&answer[..], br#"{"held":[true,false,false,true]}"#);

    // A batch cut short, an empty one and one over the limit: INVALID_ARGUMENT, with why.
    let body = request.encode();
    for (bad, why) in [
        (
            body[..body.len() - 1].to_vec(),
            "the body ends inside key 3",
        ),
        (Vec::new(), "no key in the body"),
        (
            crds::admin::HeldRequest {
                keys: vec![store_key("k").to_vec(); 1025],
            }
            .encode(),
            "more than 1024 keys",
        ),
    ] {
        let err = status(action(&mut via0, "held", &bad).await.unwrap_err());
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{}",
            err.message()
        );
        assert!(err.message().contains(why), "{}", err.message());
    }
    cluster.shutdown().await;
}

/// The DoPuts `node` has sent to its peers so far (handovers, copies, forwarded writes).
async fn puts_sent(node: &RunningNode) -> u64 {
    scrape(node.metrics_addr)
        .await
        .lines()
        .filter(|line| {
            line.starts_with("flightcache_node_forwarded_total{")
                && line.contains(r#"grpc_method="DoPut""#)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn with_two_copies_a_draining_node_sends_each_entry_only_to_the_owner_that_lacks_it() {
    let mut cluster = Cluster::start(3).await;
    cluster.replicas = 2;
    cluster.publish(2, &[]).await;
    let keys = put_rebalanced_keys(&mut cluster.client(0).await, 90).await;
    let on_c = store_keys(cluster.node(2));
    assert!(on_c.len() > 30, "{} keys on n-2", on_c.len());
    // Draining n-2 leaves n-0 and n-1 as the two owners of every key: each of n-2's
    // entries is already on one of them.
    cluster.publish(3, &[2]).await;
    let sent_before = puts_sent(cluster.node(2)).await;
    let report = rebalance(cluster.node(2), "").await;
    assert_eq!(report["moved"], on_c.len());
    assert_eq!(report["failed"], 0);
    let sent = puts_sent(cluster.node(2)).await - sent_before;
    assert_eq!(
        sent,
        on_c.len() as u64,
        "one send per entry, not one per owner"
    );
    assert_eq!(cluster.node(2).store.stats().entries, 0);
    for key in &keys {
        for i in 0..2 {
            assert!(
                cluster
                    .node(i)
                    .store
                    .peek(format!("P{key}").as_bytes())
                    .is_some(),
                "{key} on n-{i}"
            );
        }
    }
    cluster.shutdown().await;
}

/// A migration batch's messages: each entry's FlightData (schema and batch), the first
/// naming its key and carrying `lifetime` (JSON) as `app_metadata`.
fn migration_batch(entries: &[(&str, RecordBatch, &str)]) -> Vec<arrow_flight::FlightData> {
    let mut messages = Vec::new();
    for (key, batch, lifetime) in entries {
        let mut entry =
            arrow_flight::utils::batches_to_flight_data(&batch.schema(), [batch]).unwrap();
        entry[0].flight_descriptor = Some(path(key));
        entry[0].app_metadata = bytes::Bytes::from(lifetime.to_string());
        messages.extend(entry);
    }
    messages
}

/// Sends a migration batch to `node` as a peer would; the per-entry answers or the
/// call's status.
async fn send_migration_batch(
    node: &RunningNode,
    messages: Vec<arrow_flight::FlightData>,
) -> Result<Vec<serde_json::Value>, tonic::Status> {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let mut raw = FlightServiceClient::new(channel(node).await);
    let mut request = tonic::Request::new(futures::stream::iter(messages));
    request
        .metadata_mut()
        .insert("x-flightcache-write", "migration-batch".parse().unwrap());
    let mut answers = raw.do_put(request).await?.into_inner();
    let mut all = Vec::new();
    while let Some(answer) = answers.message().await? {
        all.push(serde_json::from_slice(&answer.app_metadata).unwrap());
    }
    Ok(all)
}

#[tokio::test]
async fn a_migration_batch_stores_each_entry_as_a_handover_within_its_bounds() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(0);
    let mut via0 = cluster.client(0).await;
    // A newer write is already here: a handover never overwrites it.
    put(
        &mut via0,
        path("batch/present"),
        vec![sample_batch(2, 7)],
        None,
    )
    .await
    .unwrap();
    let answers = send_migration_batch(
        node,
        migration_batch(&[
            (
                "batch/aged",
                sample_batch(5, 1),
                r#"{"ageMs":60000,"idleMs":1000}"#,
            ),
            (
                "batch/present",
                sample_batch(9, 9),
                r#"{"ageMs":0,"idleMs":0}"#,
            ),
            (
                "batch/own-ttl",
                sample_batch(3, 2),
                r#"{"ageMs":0,"idleMs":0,"ttlMs":600000}"#,
            ),
        ]),
    )
    .await
    .unwrap();
    assert_eq!(answers, vec![json!({"held": true}); 3]);
    assert_eq!(
        get(&mut via0, path_ticket("batch/aged")).await.unwrap(),
        vec![sample_batch(5, 1)]
    );
    assert_eq!(
        get(&mut via0, path_ticket("batch/present")).await.unwrap(),
        vec![sample_batch(2, 7)],
        "the newer write stays"
    );
    let own_ttl = node.store.peek(b"Pbatch/own-ttl").unwrap();
    assert_eq!(own_ttl.ttl_override(), Some(Duration::from_secs(600)));
    // The carried age counts: written a minute ago at the sender, so it has a minute
    // less to live than an entry written now.
    let aged = node.store.peek(b"Pbatch/aged").unwrap();
    let fresh = node.store.peek(b"Pbatch/present").unwrap();
    assert!(
        fresh.expires_at() - aged.expires_at() >= Duration::from_secs(59),
        "aged {:?}, fresh {:?}",
        aged.expires_at(),
        fresh.expires_at()
    );

    // Bounded: an entry too large to be held whole, a lifetime that is not one, more
    // entries than a batch may carry. Each is INVALID_ARGUMENT saying what to do.
    let large = sample_batch(20_000, 3);
    let refused = send_migration_batch(
        node,
        migration_batch(&[("batch/large", large, r#"{"ageMs":0,"idleMs":0}"#)]),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("larger than 262144 bytes")
            && refused.message().contains("DoPut of its own"),
        "{refused:?}"
    );
    assert!(!holds(node, "batch/large"));
    let refused = send_migration_batch(
        node,
        migration_batch(&[("batch/options", sample_batch(1, 0), r#"{"ttl":"30s"}"#)]),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("lifetime"), "{refused:?}");
    assert!(!holds(node, "batch/options"));
    let keys: Vec<String> = (0..257).map(|i| format!("batch/many/{i}")).collect();
    let many: Vec<(&str, RecordBatch, &str)> = keys
        .iter()
        .map(|key| {
            (
                key.as_str(),
                sample_batch(1, 0),
                r#"{"ageMs":0,"idleMs":0}"#,
            )
        })
        .collect();
    let refused = send_migration_batch(node, migration_batch(&many))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("at most 256 entries"),
        "{refused:?}"
    );
    // The entries before the bound are whole, so they stay; the one past it is not stored.
    assert!(holds(node, "batch/many/255"));
    assert!(!holds(node, "batch/many/256"));
    cluster.shutdown().await;
}
