//! Component tests of routing: three in-process nodes on 127.0.0.1:0 sharing a topology
//! (sent with the `configure` action once their ports are known).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod common;

use std::time::Duration;

use arrow_flight::Ticket;
use arrow_flight::flight_service_client::FlightServiceClient;
use cluster::*;
use common::*;
use serde_json::json;
use tonic::Code;

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
async fn an_unreachable_owner_costs_a_miss_that_names_it_while_other_keys_are_served() {
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

    // Reads of its keys are misses (the client computes them), within the connect
    // timeout, and say why; GetFlightInfo too.
    let started = std::time::Instant::now();
    let err = get(&mut via0, path_ticket(&on1)).await.unwrap_err();
    let status = status(err);
    assert_eq!(status.code(), Code::NotFound);
    let expected = format!("owner n-1 ({}) is unreachable", cluster.addresses[1]);
    assert!(status.message().contains(&expected), "{}", status.message());
    assert!(
        status.message().contains("answered as a miss"),
        "{}",
        status.message()
    );
    let bound = cache_node::cluster::peers::CONNECT_TIMEOUT * 2;
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    // The failed connect marked n-1 down: for the next second calls to it fail over at
    // once, without another connect attempt (one counted peer error, not one per call).
    let other_on1 = keys_owned_by(&ring, "n-1", "dash-more", 1).remove(0);
    let err = common::status(get(&mut via0, path_ticket(&other_on1)).await.unwrap_err());
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message().contains("not tried again"),
        "{}",
        err.message()
    );
    // Its `stats` say so: one peer skipped now (a check waits for 0 instead of sleeping).
    let answer = action(&mut cluster.admin(cluster.node(0)).await, "stats", b"")
        .await
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(stats["peersSkipped"], 1, "{stats}");
    let err = via0.get_flight_info(path(&on1)).await.unwrap_err();
    assert_eq!(common::status(err).code(), Code::NotFound);
    // A write goes to the key's next candidate and is read back from there while the
    // owner is down.
    put(&mut via0, path(&on1), vec![batch.clone()], None)
        .await
        .unwrap();
    assert_eq!(
        get(&mut via0, path_ticket(&on1)).await.unwrap(),
        vec![batch.clone()]
    );

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
    assert_eq!(stats["memberState"], serde_json::Value::Null);
    assert_eq!(stats["replicas"], 1);
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
        tokens: None,
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
    assert_eq!(client.lease(&path(&key)).await.unwrap().as_str(), "granted");
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

#[tokio::test]
async fn a_forwarded_get_streams_large_entries_and_is_timed_with_the_owners_status() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-2", "large", 1).remove(0);
    // A key of n-2 whose next choice is n-1: the owner, just started, asks there on a
    // miss, and node 0's own counts are checked below.
    let missing = key_with_choices(&ring, "absent", "n-2", "n-1");
    // About 6 MB: several FlightData messages, each relayed as the owner framed it.
    let batches = vec![sample_batch(200_000, 3), sample_batch(10, 4)];
    let mut via0 = cluster.client(0).await;
    put(&mut via0, path(&key), batches.clone(), None)
        .await
        .unwrap();
    let direct = raw_get(cluster.node(2), &key).await;
    assert!(direct.len() > 3, "{} messages", direct.len());
    // The encoder splits the big batch to keep messages under 2 MiB, so compare with what
    // the owner itself answers.
    let from_owner = get(&mut cluster.client(2).await, path_ticket(&key))
        .await
        .unwrap();
    let rows: usize = from_owner.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 200_010);
    for _ in 0..3 {
        assert_eq!(get(&mut via0, path_ticket(&key)).await.unwrap(), from_owner);
    }
    assert_eq!(raw_get(cluster.node(0), &key).await, direct);
    let err = get(&mut via0, path_ticket(&missing)).await.unwrap_err();
    let status = status(err);
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("is not cached"), "{status}");
    let text = scrape(cluster.node(0).metrics_addr).await;
    for line in [
        "flightcache_node_grpc_server_handled_total{grpc_method=\"DoGet\",grpc_code=\"OK\"} 4\n",
        "flightcache_node_grpc_server_handled_total{grpc_method=\"DoGet\",grpc_code=\"NotFound\"} 1\n",
    ] {
        assert!(text.contains(line), "{line}");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_key_on_the_move_stays_readable_until_it_has_arrived() {
    let mut cluster = Cluster::start(3).await;
    let before = cluster.ring(&[]);
    let after = cluster.ring(&[2]);
    // Keys n-2 owns, stored there through node 0.
    let moving = keys_owned_by(&before, "n-2", "moving", 6);
    let mut via0 = cluster.client(0).await;
    for (i, key) in moving.iter().enumerate() {
        put(&mut via0, path(key), vec![sample_batch(20, i as i64)], None)
            .await
            .unwrap();
    }
    // n-2 drains: the keys' new owners are n-0 and n-1, which do not hold them yet
    // (no rebalance ran). Each read is answered by the previous holder, byte-identical,
    // through every node and by GetFlightInfo and GetSchema as well.
    cluster.publish(2, &[2]).await;
    for (i, key) in moving.iter().enumerate() {
        let new_owner = node_index(after.owner(format!("P{key}").as_bytes()).unwrap());
        assert!(
            !holds(cluster.node(new_owner), key),
            "{key} has not moved yet"
        );
        for via in 0..3 {
            let mut client = cluster.client(via).await;
            let got = get(&mut client, path_ticket(key))
                .await
                .unwrap_or_else(|err| panic!("{key} through n-{via}: {err}"));
            assert_eq!(got, vec![sample_batch(20, i as i64)]);
        }
        let mut owner = cluster.client(new_owner).await;
        owner.get_flight_info(path(key)).await.unwrap();
        owner.get_schema(path(key)).await.unwrap();
    }
    let mut hits = 0;
    for i in [0, 1] {
        let metrics = scrape(cluster.node(i).metrics_addr).await;
        hits += metric_value(&metrics, "flightcache_node_previous_holder_hits_total");
    }
    // Three DoGets, one GetFlightInfo and one GetSchema per key: the first is answered
    // by the new owner from the previous holder, which also sends the new owner a copy
    // (read repair, in the background); reads after it has landed are local hits.
    let n = moving.len() as u64;
    assert!(
        (n..=5 * n).contains(&hits),
        "previous-holder hits on the new owners: {hits}"
    );
    for _ in 0..100 {
        if moving.iter().all(|key| {
            holds(
                cluster.node(node_index(
                    after.owner(format!("P{key}").as_bytes()).unwrap(),
                )),
                key,
            )
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for key in &moving {
        let new_owner = node_index(after.owner(format!("P{key}").as_bytes()).unwrap());
        assert!(
            holds(cluster.node(new_owner), key),
            "{key} sent to its new owner on read"
        );
    }
    let repairs = metric_value(
        &scrape(cluster.node(2).metrics_addr).await,
        "flightcache_node_read_repairs_total",
    );
    assert!(
        repairs >= n,
        "read repairs from the previous holder: {repairs}"
    );

    // A key nobody holds is still a plain miss.
    let nowhere = keys_owned_by(&after, "n-0", "nowhere", 1).remove(0);
    let err = get(&mut via0, path_ticket(&nowhere)).await.unwrap_err();
    assert_eq!(status(err).code(), Code::NotFound);

    // The previous holder leaves (SIGTERM): its exit handoff sends what it still holds
    // to the keys' owners, so the moved keys are local hits there from now on.
    cluster.stop(2).await;
    for (i, key) in moving.iter().enumerate() {
        let new_owner = node_index(after.owner(format!("P{key}").as_bytes()).unwrap());
        assert!(
            holds(cluster.node(new_owner), key),
            "{key} handed to n-{new_owner}"
        );
        assert_eq!(
            get(&mut via0, path_ticket(key)).await.unwrap(),
            vec![sample_batch(20, i as i64)]
        );
    }
    cluster.shutdown().await;
}

fn metric_value(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_write_whose_owner_is_down_goes_to_the_next_candidate_and_is_read_from_there() {
    for replicas in [1, 2] {
        let mut cluster = Cluster::start_with_replicas(3, replicas).await;
        let ring = cluster.ring(&[]);
        // Keys n-2 owns, one whose second choice is each of the other nodes.
        let keys = keys_owned_by(&ring, "n-2", "fallback", 12);
        cluster.stop(2).await;
        for (i, key) in keys.iter().enumerate() {
            let (owner, next) = two_owners(&ring, key);
            assert_eq!(owner, 2);
            let batch = sample_batch(30, i as i64);
            // Through the next candidate itself and through the third node.
            for via in [next, 1 - next] {
                let mut client = cluster.client(via).await;
                put(&mut client, path(key), vec![batch.clone()], None)
                    .await
                    .unwrap_or_else(|err| panic!("replicas {replicas}, {key} via n-{via}: {err}"));
                assert_eq!(
                    get(&mut client, path_ticket(key)).await.unwrap(),
                    vec![batch.clone()]
                );
            }
            assert!(
                holds(cluster.node(next), key),
                "{key} is on its next candidate n-{next}"
            );
        }
        let mut fallbacks = 0;
        for i in [0, 1] {
            let metrics = scrape(cluster.node(i).metrics_addr).await;
            fallbacks += metric_value(&metrics, "flightcache_node_fallback_writes_total");
        }
        assert_eq!(fallbacks, 2 * keys.len() as u64, "replicas {replicas}");
        cluster.shutdown().await;
    }
}

#[tokio::test]
async fn coalescing_dogets_that_miss_together_wait_for_one_put() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-2", "coalesced", 1).remove(0);
    // Eight DoGets through every node, each asking to coalesce its miss.
    let mut readers = Vec::new();
    for i in 0..8 {
        let mut client = cluster.client(i % 3).await;
        client.add_header("flightcache-coalesce", "1").unwrap();
        let key = key.clone();
        readers.push(tokio::spawn(async move {
            get(&mut client, path_ticket(&key)).await.map_err(status)
        }));
    }
    // Exactly one of them is answered at once: a miss that holds the fill lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (done, waiting): (Vec<_>, Vec<_>) = readers.into_iter().partition(|r| r.is_finished());
    assert_eq!(done.len(), 1, "one reader answered before the put");
    let holder = done.into_iter().next().unwrap().await.unwrap().unwrap_err();
    assert_eq!(holder.code(), Code::NotFound);
    assert_eq!(
        holder.metadata().get("flightcache-lease").unwrap(),
        "granted"
    );
    assert!(
        holder.message().contains("holds its fill lease"),
        "{}",
        holder.message()
    );

    // The holder puts; every waiting reader gets that entry.
    let batch = sample_batch(40, 5);
    put(
        &mut cluster.client(0).await,
        path(&key),
        vec![batch.clone()],
        None,
    )
    .await
    .unwrap();
    for reader in waiting {
        assert_eq!(reader.await.unwrap().unwrap(), vec![batch.clone()]);
    }
    let metrics = scrape(cluster.node(2).metrics_addr).await;
    assert_eq!(
        metric_value(&metrics, "flightcache_node_coalesced_reads_total"),
        7
    );

    // Without the header a miss is a plain miss, at once, with no lease.
    let other = keys_owned_by(&ring, "n-2", "plain-miss", 1).remove(0);
    let plain = status(
        get(&mut cluster.client(0).await, path_ticket(&other))
            .await
            .unwrap_err(),
    );
    assert_eq!(plain.code(), Code::NotFound);
    assert!(plain.metadata().get("flightcache-lease").is_none());
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_node_stopped_without_a_plan_hands_its_entries_over_and_finds_them_when_back() {
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = cluster.put_keys_owned_by(2, "exit", 10, 0, 25).await;
    let mut via0 = cluster.client(0).await;
    // SIGTERM (shutdown) with n-2 still active in the ring: its entries are copied to
    // each key's next choice before it stops.
    cluster.stop(2).await;
    for (i, key) in keys.iter().enumerate() {
        let (_, next) = two_owners(&ring, key);
        assert!(
            holds(cluster.node(next), key),
            "{key} was handed to n-{next}"
        );
        // While n-2 is away its keys are hits, read from there.
        assert_eq!(
            get(&mut via0, path_ticket(key)).await.unwrap(),
            vec![sample_batch(25, i as i64)]
        );
    }

    // n-2 comes back empty at a new address (ring v2, same members): for its first
    // minutes a miss asks the key's next choice, so its keys are hits through it at once.
    let back = start_node(&["--member-id", "n-2"]).await;
    cluster.replace(2, back, 2).await;
    assert_eq!(cluster.node(2).store.stats().entries, 0);
    for (i, key) in keys.iter().enumerate() {
        let mut via2 = cluster.client(2).await;
        assert_eq!(
            get(&mut via2, path_ticket(key)).await.unwrap(),
            vec![sample_batch(25, i as i64)],
            "{key} through its owner, back empty"
        );
    }
    let metrics = scrape(cluster.node(2).metrics_addr).await;
    assert_eq!(
        metric_value(&metrics, "flightcache_node_previous_holder_hits_total"),
        keys.len() as u64
    );
    cluster.shutdown().await;
}

/// Node `i`'s answer to a whole `rebalance`.
async fn rebalance_node(cluster: &Cluster, i: usize) -> serde_json::Value {
    let answer = action(&mut cluster.admin(cluster.node(i)).await, "rebalance", b"")
        .await
        .unwrap();
    serde_json::from_slice(&answer).unwrap()
}

/// How many of `keys` have node `i` as their second ring choice (where an exit handoff of
/// their owner puts them).
fn held_by_next_choice(ring: &cache_node::routing::ring::Ring, keys: &[String], i: usize) -> usize {
    keys.iter()
        .filter(|key| two_owners(ring, key).1 == i)
        .count()
}

#[tokio::test]
async fn a_node_given_exit_handoff_copies_after_its_rebalance_reports_it_owes_another() {
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = cluster
        .put_keys_owned_by(2, "late-handoff", 10, 2, 12)
        .await;
    // n-0 and n-1 rebalance first: the operator asks them once a force-deleted pod's
    // replacement is Ready, which can be while the old process is still handing off.
    for i in 0..2 {
        action(&mut cluster.admin(cluster.node(i)).await, "rebalance", b"")
            .await
            .unwrap();
        let stats = stats(&mut cluster.client(i).await).await;
        assert!(stats["lastRebalanceMsAgo"].is_u64(), "n-{i}: {stats}");
        assert_eq!(stats["holdsStrays"], false, "n-{i}: {stats}");
    }
    // The old process's exit handoff lands after those passes listed their stores.
    cluster.stop(2).await;
    let next_holders: Vec<usize> = (0..2)
        .filter(|&i| keys.iter().any(|key| two_owners(&ring, key).1 == i))
        .collect();
    assert!(!next_holders.is_empty());
    for &i in &next_holders {
        // It reports no whole rebalance since, so the operator asks it for one.
        let stats = stats(&mut cluster.client(i).await).await;
        assert_eq!(
            stats["lastRebalanceMsAgo"],
            serde_json::Value::Null,
            "n-{i} holds handed-off copies: {stats}"
        );
        // And says so on its own, so that it is asked even when no peer started after it.
        assert_eq!(stats["holdsStrays"], true, "n-{i}: {stats}");
    }

    // The replacement is back (empty, a new address); the pass it asks for hands it every
    // key, and reports whole again.
    let back = start_node(&["--member-id", "n-2"]).await;
    cluster.replace(2, back, 2).await;
    for &i in &next_holders {
        let answer = rebalance_node(&cluster, i).await;
        let held_here = held_by_next_choice(&ring, &keys, i);
        assert_eq!(answer["moved"], held_here, "n-{i}: {answer}");
        let stats = stats(&mut cluster.client(i).await).await;
        assert!(stats["lastRebalanceMsAgo"].is_u64(), "n-{i}: {stats}");
        assert_eq!(stats["holdsStrays"], false, "n-{i}: {stats}");
    }
    for key in &keys {
        assert!(holds(cluster.node(2), key), "{key} is back on n-2");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_stopping_node_takes_no_copies_so_a_rebalance_keeps_what_it_would_hand_back() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = cluster.put_keys_owned_by(2, "stopping", 6, 2, 10).await;
    let mut via2 = cluster.client(2).await;
    // Its SIGTERM: the exit handoff copies every entry to the key's next holder, and the
    // process still serves until it ends.
    let handoff = cluster.node(2).begin_stopping().await;
    assert_eq!((handoff.sent, handoff.unsent), (keys.len() as u64, 0));

    // A peer's rebalance at that moment (the operator asks for one once a deleted pod's
    // replacement is Ready, which can be before the old process ends) would hand those
    // copies back to their owner, this process, and remove them: they went with it when
    // it was killed. The stopping node refuses them, so they stay.
    for i in 0..2 {
        let answer = rebalance_node(&cluster, i).await;
        let held_here = held_by_next_choice(&ring, &keys, i);
        assert_eq!(answer["moved"], 0, "n-{i}: {answer}");
        assert_eq!(answer["failed"], held_here, "n-{i}: {answer}");
        // Not a whole rebalance: the operator asks again once the replacement answers.
        let stats = stats(&mut cluster.client(i).await).await;
        assert_eq!(
            stats["lastRebalanceMsAgo"],
            serde_json::Value::Null,
            "n-{i}"
        );
    }
    for key in &keys {
        let (_, next) = two_owners(&ring, key);
        assert!(holds(cluster.node(next), key), "{key} stays on n-{next}");
    }
    // The refusal says why, with a marker peers recognise (UNAVAILABLE alone can be a
    // ring disagreement).
    let mut raw = FlightServiceClient::new(channel(cluster.node(2)).await);
    let batch = sample_batch(1, 0);
    let mut messages =
        arrow_flight::utils::batches_to_flight_data(&batch.schema(), [&batch]).unwrap();
    messages[0].flight_descriptor = Some(path(&keys[0]));
    let mut request = tonic::Request::new(futures::stream::iter(messages));
    request
        .metadata_mut()
        .insert("x-flightcache-write", "migration".parse().unwrap());
    let refused = match raw.do_put(request).await {
        Ok(answer) => answer.into_inner().message().await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("stopping"), "{refused:?}");
    assert_eq!(
        refused.metadata().get("x-flightcache-stopping").unwrap(),
        "true"
    );
    let held = action(
        &mut cluster.admin(cluster.node(2)).await,
        "held",
        &crds::admin::HeldRequest {
            keys: vec![format!("P{}", keys[0]).into_bytes()],
        }
        .encode(),
    )
    .await;
    assert_eq!(status(held.unwrap_err()).code(), Code::Unavailable);

    // A client's put of one of its keys goes on to the key's next holder: stored on the
    // stopping node it would end with the process.
    let late = keys_owned_by(&ring, "n-2", "late", 1).remove(0);
    put(&mut via2, path(&late), vec![sample_batch(4, 9)], None)
        .await
        .unwrap();
    let (_, next) = two_owners(&ring, &late);
    assert!(holds(cluster.node(next), &late), "{late} is on n-{next}");
    assert!(
        !holds(cluster.node(2), &late),
        "{late} is not on the stopping node"
    );
    // Its reads are still answered: it holds its entries until it ends.
    assert_eq!(
        get(&mut via2, path_ticket(&keys[0])).await.unwrap(),
        vec![sample_batch(10, 0)]
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_node_back_in_the_key_space_gets_the_copies_written_while_it_was_out() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = keys_owned_by(&ring, "n-0", "out", 20);
    let mut via1 = cluster.client(1).await;
    for (i, key) in keys.iter().enumerate() {
        put(&mut via1, path(key), vec![sample_batch(3, i as i64)], None)
            .await
            .unwrap();
    }
    let configure = |version: u64, states: [&str; 3]| {
        json!({"topology": cluster.topology_with(version, &states)}).to_string()
    };
    // n-0 hangs: the operator takes it out of the key space; its peers hear it, it does
    // not. Its keys are written anew on their next choice meanwhile.
    let out = configure(2, ["joining", "active", "active"]);
    for i in 1..3 {
        action(
            &mut cluster.admin(cluster.node(i)).await,
            "configure",
            out.as_bytes(),
        )
        .await
        .unwrap();
    }
    for (i, key) in keys.iter().enumerate() {
        put(&mut via1, path(key), vec![sample_batch(5, i as i64)], None)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Thawed, it reads the ring that put it out and drops what it held, which may be
    // stale (its copies were written before the ones its peers now hold).
    action(
        &mut cluster.admin(cluster.node(0)).await,
        "configure",
        out.as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(cluster.node(0).store.stats().entries, 0);
    // Back in: its peers hand it the copies written while it was out, although those were
    // written before its drop (a drop is not an invalidation).
    cluster
        .publish_document(cluster.topology_with(3, &["active", "active", "active"]))
        .await;
    let mut moved = 0;
    for i in 1..3 {
        let answer = action(&mut cluster.admin(cluster.node(i)).await, "rebalance", b"")
            .await
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        moved += answer["moved"].as_u64().unwrap();
    }
    assert_eq!(moved, keys.len() as u64);
    let mut via0 = cluster.client(0).await;
    for (i, key) in keys.iter().enumerate() {
        assert!(holds(cluster.node(0), key), "{key} is back on n-0");
        assert_eq!(
            get(&mut via0, path_ticket(key)).await.unwrap(),
            vec![sample_batch(5, i as i64)],
            "{key}: the copy written while n-0 was out"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn an_exit_handoff_budget_of_zero_hands_nothing_over() {
    let mut cluster = Cluster::start(2).await;
    let ring = cluster.ring(&[]);
    // n-1 replaced (while empty) by a node started with --exit-handoff-budget 0s.
    let quiet = start_node(&["--member-id", "n-1", "--exit-handoff-budget", "0s"]).await;
    cluster.stop(1).await;
    cluster.addresses[1] = quiet.flight_addr.to_string();
    cluster.nodes[1] = Some(quiet);
    cluster.publish(2, &[]).await;
    let keys = keys_owned_by(&ring, "n-1", "no-exit", 5);
    let mut via0 = cluster.client(0).await;
    for key in &keys {
        put(&mut via0, path(key), vec![sample_batch(5, 0)], None)
            .await
            .unwrap();
        assert!(holds(cluster.node(1), key));
    }
    cluster.stop(1).await;
    for key in &keys {
        assert!(!holds(cluster.node(0), key), "{key} was not handed over");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn an_owner_that_accepts_but_never_answers_costs_a_miss_not_a_hang() {
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-2", "frozen", 1).remove(0);
    let held = freeze(&mut cluster, 2).await;
    let started = std::time::Instant::now();
    let err = common::status(
        get(&mut cluster.client(0).await, path_ticket(&key))
            .await
            .unwrap_err(),
    );
    let took = started.elapsed();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    // The budget: the keepalive finds the dead connection within two ping periods, then
    // the read asks the key's next choice (at most its 1 s deadline); 2 s more for a
    // loaded machine. Without keepalive the call would wait for its 30 s deadline.
    let budget = cache_node::cluster::peers::PEER_KEEPALIVE * 2
        + cache_node::cluster::forward::PREVIOUS_HOLDER_TIMEOUT
        + Duration::from_secs(2);
    println!("a read of a frozen owner's key answered NOT_FOUND in {took:?} (budget {budget:?})");
    assert!(took < budget, "{took:?} (budget {budget:?})");
    held.abort();
    cluster.shutdown().await;
}

#[tokio::test]
async fn the_read_that_tries_a_frozen_owner_again_waits_half_a_second_not_the_keepalive() {
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = keys_owned_by(&ring, "n-2", "frozen-again", 2);
    let held = freeze(&mut cluster, 2).await;
    let mut via0 = cluster.client(0).await;
    // The first read finds the owner gone (the peer keepalive ends the connection).
    let first = common::status(get(&mut via0, path_ticket(&keys[0])).await.unwrap_err());
    assert_eq!(first.code(), Code::NotFound, "{first}");
    // Once the owner's down time is over, one read is let through to try it again: a
    // client's read, which now waits TRY_READ_DEADLINE for the owner to start answering
    // (before, the peer keepalive's two periods) and then fails over as the others do.
    tokio::time::sleep(cache_node::routing::health::DOWN_FOR + Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let again = common::status(get(&mut via0, path_ticket(&keys[1])).await.unwrap_err());
    let took = started.elapsed();
    assert_eq!(again.code(), Code::NotFound, "{again}");
    // The budget: the try's deadline (0.5 s), then the key's next choice answers (a
    // miss) on loopback; 1 s more for a loaded machine. Waiting out the peer keepalive
    // instead (two 1 s periods: 2.0 s measured) breaks it.
    let budget = Duration::from_millis(1_500);
    assert!(cache_node::routing::health::TRY_READ_DEADLINE <= Duration::from_millis(500));
    println!(
        "the read trying a frozen owner again answered NOT_FOUND in {took:?} (budget {budget:?})"
    );
    assert!(took < budget, "{took:?} (budget {budget:?})");
    held.abort();
    cluster.shutdown().await;
}

/// Replaces node `i` by a listener that accepts connections and never answers (a frozen
/// process whose kernel still completes the TCP handshake) and publishes the ring again.
async fn freeze(cluster: &mut Cluster, i: usize) -> tokio::task::JoinHandle<()> {
    cluster.stop(i).await;
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    cluster.addresses[i] = frozen.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            open.push(socket);
        }
    });
    cluster.publish(2, &[]).await;
    held
}

#[tokio::test]
async fn a_put_whose_owner_hangs_under_it_goes_to_the_next_candidate_if_it_was_kept() {
    // Up to REPLAYABLE_PUT_BYTES the relayed messages are kept until the owner answers;
    // a larger put keeps nothing, so it fails as the broken connection did.
    let kept = cache_node::cluster::forward::REPLAYABLE_PUT_BYTES;
    for (rows, replayable) in [(2_000, true), (250_000, false)] {
        let mut cluster = Cluster::start(3).await;
        let ring = cluster.ring(&[]);
        let key = keys_owned_by(&ring, "n-2", "hung", 1).remove(0);
        let (_, next) = two_owners(&ring, &key);
        let via = if next == 0 { 1 } else { 0 };
        let held = freeze(&mut cluster, 2).await;
        let batch = sample_batch(rows, 3);
        let size = batch.get_array_memory_size();
        let started = std::time::Instant::now();
        let put_result = put(
            &mut cluster.client(via).await,
            path(&key),
            vec![batch.clone()],
            None,
        )
        .await;
        let took = started.elapsed();
        // The keepalive ends the hung connection within two ping periods; 2 s more for a
        // loaded machine. Without the kept copy the put would fail there.
        let budget = cache_node::cluster::peers::PEER_KEEPALIVE * 2 + Duration::from_secs(2);
        println!(
            "a {size}-byte put to a hung owner (kept up to {kept}) answered {:?} in {took:?} (budget {budget:?})",
            put_result.as_ref().map(|_| ())
        );
        assert!(took < budget, "{took:?} (budget {budget:?})");
        if replayable {
            put_result.unwrap_or_else(|err| panic!("{size} bytes via n-{via}: {err}"));
            assert!(
                holds(cluster.node(next), &key),
                "{key} is on its next candidate n-{next}"
            );
            assert_eq!(
                get(&mut cluster.client(via).await, path_ticket(&key))
                    .await
                    .unwrap(),
                vec![batch]
            );
            let metrics = scrape(cluster.node(next).metrics_addr).await;
            let fallbacks = metric_value(&metrics, "flightcache_node_fallback_writes_total")
                + metric_value(
                    &scrape(cluster.node(via).metrics_addr).await,
                    "flightcache_node_fallback_writes_total",
                );
            assert_eq!(fallbacks, 1);
        } else {
            assert!(size > kept, "{size} bytes");
            let err = common::status(put_result.unwrap_err());
            assert_eq!(err.code(), Code::Unavailable, "{err}");
            assert!(err.message().contains("owner n-2"), "{err}");
            assert!(!holds(cluster.node(next), &key));
        }
        held.abort();
        cluster.shutdown().await;
    }
}

#[tokio::test]
async fn a_pool_listing_answers_at_most_the_cap_the_pools_first_keys_first() {
    use futures::TryStreamExt;
    let cluster = Cluster::start(2).await;
    let cap = cache_node::flight::MAX_LISTED_FLIGHTS;
    let batch = sample_batch(1, 0);
    // 12,000 keys over the two nodes, alternating (stored directly, wherever they land):
    // each node lists 6,000, the merge has 12,000 and answers the first 10,000 by key.
    for i in 0..cap + 2_000 {
        let key = cache_node::key::CacheKey::Path(format!("k/{i:06}"));
        cluster
            .node(i % 2)
            .store
            .begin_put(key.to_store_bytes())
            .commit(batch.schema(), vec![batch.clone()], None)
            .unwrap();
    }
    let mut client = cluster.client(0).await;
    let listed: Vec<String> = client
        .list_flights(bytes::Bytes::new())
        .await
        .unwrap()
        .map_ok(|info| info.flight_descriptor.unwrap().path.join("/"))
        .try_collect()
        .await
        .unwrap();
    let expected: Vec<String> = (0..cap).map(|i| format!("k/{i:06}")).collect();
    assert_eq!(
        listed.len(),
        cap,
        "the pool's 12,000 keys are cut at the cap"
    );
    assert!(
        listed == expected,
        "the first keys of both nodes, in key order"
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_pool_listing_of_long_keys_answers_at_most_its_byte_bound_the_first_keys_first() {
    use futures::TryStreamExt;
    use prost::Message as _;
    let cluster = Cluster::start(3).await;
    let bound = cache_node::flight::MAX_LISTED_BYTES;
    let batch = sample_batch(1, 0);
    // 300 keys of 60 KB over the three nodes: each FlightInfo carries its key twice
    // (descriptor and ticket), ~120 KB, so the 300 would answer ~36 MB; the bound keeps
    // the first ~135 by key, and every node held and merged at most that much.
    let long = "x".repeat(60_000);
    let keys: Vec<String> = (0..300).map(|i| format!("long/{i:04}/{long}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let key = cache_node::key::CacheKey::Path(key.clone());
        cluster
            .node(i % 3)
            .store
            .begin_put(key.to_store_bytes())
            .commit(batch.schema(), vec![batch.clone()], None)
            .unwrap();
    }
    let mut client = cluster.client(0).await;
    let infos: Vec<arrow_flight::FlightInfo> = client
        .list_flights(bytes::Bytes::new())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let answered: usize = infos.iter().map(|info| info.encoded_len()).sum();
    let largest = infos.iter().map(|info| info.encoded_len()).max().unwrap();
    let listed: Vec<String> = infos
        .iter()
        .map(|info| info.flight_descriptor.clone().unwrap().path.join("/"))
        .collect();
    println!(
        "{} of 300 long keys listed, {answered} bytes (bound {bound}, largest info {largest})",
        listed.len()
    );
    assert!(answered <= bound, "{answered} bytes");
    assert!(
        answered + largest > bound,
        "cut only where the next info would pass the bound"
    );
    assert_eq!(
        listed,
        keys[..listed.len()],
        "the first keys of the pool, in key order"
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn an_exit_handoff_by_an_outdated_ring_is_refused_and_the_peers_store_nothing() {
    let cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let keys = cluster.put_keys_owned_by(2, "outdated", 6, 2, 10).await;
    // n-2 hung; meanwhile the ring moved on without it (n-0 and n-1 route by v2): its pod
    // was replaced, and its keys may have been changed or invalidated since.
    let body = serde_json::json!({ "topology": cluster.topology(2, &[]) }).to_string();
    for i in 0..2 {
        action(
            &mut cluster.admin(cluster.node(i)).await,
            "configure",
            body.as_bytes(),
        )
        .await
        .unwrap();
    }
    // Thawed, its old process gets the kubelet's SIGTERM: its exit handoff, by ring v1,
    // is refused, so nothing it held comes back onto its peers.
    let handoff = cluster.node(2).begin_stopping().await;
    assert_eq!(
        (handoff.sent, handoff.failed),
        (0, keys.len() as u64),
        "{handoff:?}"
    );
    for key in &keys {
        let (_, next) = two_owners(&ring, key);
        assert!(!holds(cluster.node(next), key), "{key} landed on n-{next}");
    }
    let refused: u64 = {
        let mut total = 0;
        for i in 0..2 {
            let metrics = scrape(cluster.node(i).metrics_addr).await;
            total += metric_value(&metrics, "flightcache_node_outdated_handoffs_refused_total");
        }
        total
    };
    assert!(refused > 0, "the refusals are counted");
    cluster.shutdown().await;
}

/// A peer that answers every DoAction with one message of `bytes` bytes (a broken or
/// compromised node with the peer credential) and refuses everything else.
#[derive(Clone)]
struct OversizedAnswers {
    bytes: usize,
}

type Answers<T> =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl arrow_flight::flight_service_server::FlightService for OversizedAnswers {
    type HandshakeStream = Answers<arrow_flight::HandshakeResponse>;
    type ListFlightsStream = Answers<arrow_flight::FlightInfo>;
    type DoGetStream = Answers<arrow_flight::FlightData>;
    type DoPutStream = Answers<arrow_flight::PutResult>;
    type DoExchangeStream = Answers<arrow_flight::FlightData>;
    type DoActionStream = Answers<arrow_flight::Result>;
    type ListActionsStream = Answers<arrow_flight::ActionType>;

    async fn handshake(
        &self,
        _: tonic::Request<tonic::Streaming<arrow_flight::HandshakeRequest>>,
    ) -> Result<tonic::Response<Self::HandshakeStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn list_flights(
        &self,
        _: tonic::Request<arrow_flight::Criteria>,
    ) -> Result<tonic::Response<Self::ListFlightsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn get_flight_info(
        &self,
        _: tonic::Request<arrow_flight::FlightDescriptor>,
    ) -> Result<tonic::Response<arrow_flight::FlightInfo>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn poll_flight_info(
        &self,
        _: tonic::Request<arrow_flight::FlightDescriptor>,
    ) -> Result<tonic::Response<arrow_flight::PollInfo>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn get_schema(
        &self,
        _: tonic::Request<arrow_flight::FlightDescriptor>,
    ) -> Result<tonic::Response<arrow_flight::SchemaResult>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn do_get(
        &self,
        _: tonic::Request<Ticket>,
    ) -> Result<tonic::Response<Self::DoGetStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn do_put(
        &self,
        _: tonic::Request<tonic::Streaming<arrow_flight::FlightData>>,
    ) -> Result<tonic::Response<Self::DoPutStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn do_exchange(
        &self,
        _: tonic::Request<tonic::Streaming<arrow_flight::FlightData>>,
    ) -> Result<tonic::Response<Self::DoExchangeStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
    async fn do_action(
        &self,
        _: tonic::Request<arrow_flight::Action>,
    ) -> Result<tonic::Response<Self::DoActionStream>, tonic::Status> {
        let body = bytes::Bytes::from(vec![b'x'; self.bytes]);
        let answer = futures::stream::iter([Ok(arrow_flight::Result { body })]);
        Ok(tonic::Response::new(Box::pin(answer)))
    }
    async fn list_actions(
        &self,
        _: tonic::Request<arrow_flight::Empty>,
    ) -> Result<tonic::Response<Self::ListActionsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("impostor"))
    }
}

#[tokio::test]
async fn a_peers_answer_over_the_message_limit_is_refused_not_buffered() {
    // Worst case: a member answers a forwarded action with one message past the node's
    // limit (its largest entry + 1 MiB, at least 64 MiB). The node decodes peers'
    // answers under that limit: the caller gets an error naming it, nothing is held.
    let limit = cache_node::cluster::peers::MIN_MESSAGE_LIMIT;
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-2", "impostor", 1).remove(0);
    cluster.stop(2).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    cluster.addresses[2] = listener.local_addr().unwrap().to_string();
    let impostor =
        arrow_flight::flight_service_server::FlightServiceServer::new(OversizedAnswers {
            bytes: limit + (1 << 20),
        })
        .max_encoding_message_size(usize::MAX);
    let served = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(impostor)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    cluster.publish(2, &[]).await;
    let mut via0 = cluster.client(0).await;
    let err = status(
        action(&mut via0, "lease", key.as_bytes())
            .await
            .unwrap_err(),
    );
    println!(
        "a {} MiB answer from a peer: {:?} {}",
        (limit >> 20) + 1,
        err.code(),
        err.message()
    );
    // Refused as it was decoded from the peer (without the limit the whole answer was
    // decoded and held, and only the node's own encoding limit stopped it going out).
    assert!(
        err.message().contains("decoded message length too large"),
        "{err}"
    );
    // The node still serves: a key of its own round-trips.
    let own = keys_owned_by(&ring, "n-0", "still-serving", 1).remove(0);
    put(&mut via0, path(&own), vec![sample_batch(10, 1)], None)
        .await
        .unwrap();
    let batches = get(&mut via0, path_ticket(&own)).await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
    served.abort();
    cluster.shutdown().await;
}
