//! Entry tags end to end on real Flight clients: a put's `tags` option, `invalidate-tag`
//! on one node and fanned out over a pool with two copies per key, tags carried by
//! handovers (`rebalance`), and the refusals a client reads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod common;

use std::sync::Arc;

use cluster::*;
use common::*;
use serde_json::json;
use tonic::Code;

fn tagged(tags: &[&str]) -> String {
    json!({ "tags": tags }).to_string()
}

async fn invalidate_tags(client: &mut arrow_flight::FlightClient, tags: &[&str]) -> u64 {
    let body = json!({ "tags": tags }).to_string();
    let answer = action(client, "invalidate-tag", body.as_bytes())
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    answer["removed"].as_u64().unwrap()
}

#[tokio::test]
async fn a_tag_invalidation_removes_exactly_the_entries_put_with_that_tag() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let puts = [
        ("reports/daily", tagged(&["sales.orders", "tenant:acme"])),
        ("reports/weekly", tagged(&["sales.orders"])),
        ("crm/users", tagged(&["crm.users", "tenant:acme"])),
        ("misc/untagged", json!({"ttl": "10m"}).to_string()),
    ];
    for (key, options) in &puts {
        put(
            &mut client,
            path(key),
            vec![sample_batch(50, 1)],
            Some(options),
        )
        .await
        .unwrap();
    }
    assert_eq!(invalidate_tags(&mut client, &["sales.orders"]).await, 2);
    assert_eq!(store_keys(&node), ["crm/users", "misc/untagged"]);
    let err = get(&mut client, path_ticket("reports/daily"))
        .await
        .unwrap_err();
    assert_eq!(status(err).code(), Code::NotFound);
    // Several tags at once; a tag nobody carries removes nothing.
    assert_eq!(
        invalidate_tags(&mut client, &["tenant:acme", "nobody"]).await,
        1
    );
    assert_eq!(store_keys(&node), ["misc/untagged"]);
    let stats = stats(&mut client).await;
    assert_eq!(stats["evictions"]["explicit"], 3);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_tags_and_bad_bodies_are_refused_with_the_rule_they_break() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let seventeen: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    let too_many = json!({ "tags": seventeen }).to_string();
    let long = tagged(&[&"x".repeat(129)]);
    for (options, says) in [
        (tagged(&[""]), "tag 0 is empty"),
        (tagged(&["a", "a"]), "given twice"),
        (long, "at most 128"),
        (tagged(&["caf\u{e9}"]), "printable ASCII"),
        (too_many, "at most 16"),
        (json!({"tags": "orders"}).to_string(), "app_metadata"),
    ] {
        let err = put(
            &mut client,
            path("refused"),
            vec![sample_batch(5, 0)],
            Some(&options),
        )
        .await
        .unwrap_err();
        let err = status(err);
        assert_eq!(err.code(), Code::InvalidArgument, "{options}");
        assert!(err.message().contains(says), "{options}: {}", err.message());
    }
    assert_eq!(stats(&mut client).await["entries"], 0);

    let sixty_five: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    for (body, says) in [
        (b"orders".to_vec(), "must be JSON"),
        (br#"{"tags": []}"#.to_vec(), "at least one tag"),
        (br#"{"tag": ["a"]}"#.to_vec(), "unknown field"),
        (
            json!({ "tags": sixty_five }).to_string().into_bytes(),
            "at most 64",
        ),
        (br#"{"tags": ["a\n"]}"#.to_vec(), "printable ASCII"),
    ] {
        let err = status(
            action(&mut client, "invalidate-tag", &body)
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains(says),
            "{}: {}",
            String::from_utf8_lossy(&body),
            err.message()
        );
    }
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_tag_invalidation_reaches_every_copy_on_every_member_of_the_pool() {
    let cluster = Cluster::start_with_replicas(3, 2).await;
    let mut via0 = cluster.client(0).await;
    for i in 0..30 {
        let tags = if i % 3 == 0 {
            tagged(&["sales.orders"])
        } else {
            tagged(&["crm.users"])
        };
        put(
            &mut via0,
            path(&format!("q/{i}")),
            vec![sample_batch(20, i)],
            Some(&tags),
        )
        .await
        .unwrap();
    }
    let copies: usize = (0..3).map(|i| store_keys(cluster.node(i)).len()).sum();
    assert_eq!(copies, 60, "two copies of each of 30 keys");
    // Asked of one node, answered for the pool: every copy of the 10 tagged keys.
    let mut via1 = cluster.client(1).await;
    assert_eq!(invalidate_tags(&mut via1, &["sales.orders"]).await, 20);
    for i in 0..3 {
        let node = cluster.node(i);
        assert!(
            store_keys(node).iter().all(|key| {
                let n: usize = key["q/".len()..].parse().unwrap();
                !n.is_multiple_of(3)
            }),
            "node {i} still holds a tagged key"
        );
        for (_, entry) in node.store.list(b"", usize::MAX) {
            assert_eq!(&**entry.tags(), &[Arc::<str>::from("crm.users")]);
        }
    }
    for i in [0, 3, 27] {
        let err = get(&mut via1, path_ticket(&format!("q/{i}")))
            .await
            .unwrap_err();
        assert_eq!(status(err).code(), Code::NotFound, "q/{i}");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn handed_over_entries_keep_their_tags() {
    let cluster = Cluster::start(3).await;
    let mut via0 = cluster.client(0).await;
    let on2 = keys_owned_by(&cluster.ring(&[]), "n-2", "moved", 12);
    for key in &on2 {
        put(
            &mut via0,
            path(key),
            vec![sample_batch(10, 0)],
            Some(&tagged(&["sales.orders", "tenant:acme"])),
        )
        .await
        .unwrap();
    }
    // n-2 drains: its entries go to their new owners, in migration batches.
    cluster.publish(2, &[2]).await;
    let answer = action(&mut client(cluster.node(2)).await, "rebalance", b"")
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["moved"], 12, "{answer}");
    assert!(store_keys(cluster.node(2)).is_empty());
    let mut received = 0;
    for i in 0..2 {
        for (_, entry) in cluster.node(i).store.list(b"", usize::MAX) {
            let tags: Vec<&str> = entry.tags().iter().map(|tag| &**tag).collect();
            assert_eq!(tags, ["sales.orders", "tenant:acme"]);
            received += 1;
        }
    }
    assert_eq!(received, 12);
    let mut via1 = cluster.client(1).await;
    assert_eq!(invalidate_tags(&mut via1, &["tenant:acme"]).await, 12);
    assert!(store_keys(cluster.node(0)).is_empty() && store_keys(cluster.node(1)).is_empty());
    cluster.shutdown().await;
}

async fn invalidate_local(
    client: &mut arrow_flight::FlightClient,
    body: serde_json::Value,
) -> Result<u64, tonic::Status> {
    let answer = action(client, "invalidate-local", body.to_string().as_bytes())
        .await
        .map_err(status)?;
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    Ok(answer["removed"].as_u64().unwrap())
}

#[tokio::test]
async fn invalidate_local_removes_what_it_selects_on_the_node_asked_alone() {
    // What the operator sends each node for a CacheInvalidation: no fan-out, so each
    // node's answer counts its own store and a node that is down is retried alone.
    let cluster = Cluster::start_with_replicas(3, 2).await;
    let mut via0 = cluster.client(0).await;
    for i in 0..30 {
        let tags = tagged(&[if i % 3 == 0 {
            "sales.orders"
        } else {
            "crm.users"
        }]);
        let key = if i % 5 == 0 {
            format!("old/{i}")
        } else {
            format!("q/{i}")
        };
        put(
            &mut via0,
            path(&key),
            vec![sample_batch(20, i)],
            Some(&tags),
        )
        .await
        .unwrap();
    }
    put(
        &mut via0,
        path("reports/daily"),
        vec![sample_batch(5, 0)],
        None,
    )
    .await
    .unwrap();
    // Selected: the key, every key under old/ and every key tagged sales.orders (its
    // number a multiple of 3).
    let selected = |key: &str| {
        key == "reports/daily"
            || key.starts_with("old/")
            || key
                .rsplit('/')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n.is_multiple_of(3))
    };
    let body = json!({"keys": ["reports/daily"], "prefixes": ["old/"], "tags": ["sales.orders"]});
    let before: Vec<Vec<String>> = (0..3).map(|i| store_keys(cluster.node(i))).collect();
    let mut admin0 = cluster.admin(cluster.node(0)).await;
    let removed = invalidate_local(&mut admin0, body.clone()).await.unwrap();
    let held_by_0 = before[0].iter().filter(|k| selected(k)).count() as u64;
    assert!(
        held_by_0 > 0,
        "node 0 held some selected keys: {:?}",
        before[0]
    );
    assert_eq!(removed, held_by_0, "node 0 counts its own store");
    assert!(store_keys(cluster.node(0)).iter().all(|k| !selected(k)));
    for (i, keys) in before.iter().enumerate().skip(1) {
        assert_eq!(&store_keys(cluster.node(i)), keys, "node {i} was not asked");
    }
    // The other nodes, each asked in turn: every copy of the selected keys goes.
    let mut total = removed;
    for i in 1..3 {
        let mut admin = cluster.admin(cluster.node(i)).await;
        total += invalidate_local(&mut admin, body.clone()).await.unwrap();
    }
    let selected_copies: usize = before
        .iter()
        .map(|keys| keys.iter().filter(|k| selected(k)).count())
        .sum();
    assert_eq!(total, selected_copies as u64);
    for i in 0..3 {
        assert!(
            store_keys(cluster.node(i)).iter().all(|k| !selected(k)),
            "node {i}"
        );
        assert!(
            !store_keys(cluster.node(i)).is_empty(),
            "node {i} keeps the rest"
        );
    }
    // Asked again, nothing is left to remove.
    assert_eq!(invalidate_local(&mut admin0, body).await.unwrap(), 0);
    // Bad bodies: INVALID_ARGUMENT naming the rule, nothing removed.
    let kept: usize = (0..3).map(|i| store_keys(cluster.node(i)).len()).sum();
    for (body, says) in [
        (json!({}), "at least one key, prefix or tag"),
        (json!({"prefixes": [""]}), "prefix 0 is empty"),
        (json!({"keys": ["k"], "tag": ["x"]}), "unknown field"),
        (json!({"tags": ["caf\u{e9}"]}), "printable ASCII"),
        (json!({"keys": vec!["k"; 65]}), "65 keys; at most 64"),
        (json!(["q/1"]), "expected a JSON object"),
    ] {
        let err = invalidate_local(&mut admin0, body.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{body}: {err:?}");
        assert!(err.message().contains(says), "{body}: {}", err.message());
    }
    let after: usize = (0..3).map(|i| store_keys(cluster.node(i)).len()).sum();
    assert_eq!(after, kept);
    cluster.shutdown().await;
}
