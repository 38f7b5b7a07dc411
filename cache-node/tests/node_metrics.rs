//! Component tests of the node's metrics (issue 11): three in-process nodes on
//! 127.0.0.1:0; each test drives calls and scrapes `/metrics` to see the series move.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod common;

use cluster::*;
use common::*;
use tonic::Code;

/// The value of the series whose line starts with `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn doget_outcomes_forwarded_calls_and_peer_errors_are_counted() {
    let mut cluster = Cluster::start(3).await;
    let ring = cluster.ring(&[]);
    let remote = keys_owned_by(&ring, "n-2", "remote", 1).remove(0);
    // A key of n-2 whose next choice is n-1: the owner, just started, asks there on a
    // miss (never node 0, whose counts are checked).
    let missing = key_with_choices(&ring, "absent", "n-2", "n-1");
    let local = keys_owned_by(&ring, "n-0", "local", 1).remove(0);
    let mut via0 = cluster.client(0).await;
    for key in [&remote, &local] {
        put(&mut via0, path(key), vec![sample_batch(10, 1)], None)
            .await
            .unwrap();
    }
    // A client's retry says so (gRFC A6); a count that is not a number is a first try.
    let mut retrying = cluster.client(0).await;
    retrying
        .add_header("grpc-previous-rpc-attempts", "2")
        .unwrap();
    get(&mut retrying, path_ticket(&remote)).await.unwrap();
    let mut garbled = cluster.client(0).await;
    garbled
        .add_header("grpc-previous-rpc-attempts", "many")
        .unwrap();
    get(&mut garbled, path_ticket(&local)).await.unwrap();
    get(&mut via0, path_ticket(&local)).await.unwrap();
    let err = get(&mut via0, path_ticket(&missing)).await.unwrap_err();
    assert_eq!(status(err).code(), Code::NotFound);

    let text = scrape(cluster.node(0).metrics_addr).await;
    for (series, expected) in [
        (
            r#"flightcache_node_grpc_server_retried_calls_total{grpc_method="DoGet",client="tonic"}"#,
            1.0,
        ),
        (
            r#"flightcache_node_doget_seconds_count{outcome="forwarded_hit"}"#,
            1.0,
        ),
        (
            r#"flightcache_node_doget_seconds_count{outcome="local_hit"}"#,
            2.0,
        ),
        (
            r#"flightcache_node_doget_seconds_count{outcome="miss"}"#,
            1.0,
        ),
        (
            r#"flightcache_node_forwarded_total{peer="n-2",grpc_method="DoGet"}"#,
            2.0,
        ),
        (
            r#"flightcache_node_forwarded_total{peer="n-2",grpc_method="DoPut"}"#,
            1.0,
        ),
        (
            &format!(
                r#"flightcache_node_build_info{{version="{}"}}"#,
                env!("CARGO_PKG_VERSION")
            ),
            1.0,
        ),
    ] {
        assert_eq!(value(&text, series), Some(expected), "{series}\n{text}");
    }
    assert!(
        value(
            &text,
            r#"flightcache_node_doget_seconds_count{outcome="error"}"#
        )
        .is_none()
    );
    let rss = value(&text, "flightcache_node_process_resident_memory_bytes").unwrap();
    assert!(rss > 1_000_000.0, "{rss}");
    // The owner's own DoGets were local hits and misses, not forwarded hits; its only
    // call out was the miss's question to the key's next choice (it just started).
    let owner = scrape(cluster.node(2).metrics_addr).await;
    assert_eq!(
        value(
            &owner,
            r#"flightcache_node_doget_seconds_count{outcome="local_hit"}"#
        ),
        Some(1.0)
    );
    assert!(!owner.contains(r#"outcome="forwarded_hit""#));
    // The relayed retry kept its header; the owner counts no retry of its own for it.
    assert!(
        !owner.contains("flightcache_node_grpc_server_retried_calls_total"),
        "{owner}"
    );
    assert_eq!(
        value(
            &owner,
            r#"flightcache_node_forwarded_total{peer="n-1",grpc_method="DoGet"}"#
        ),
        Some(1.0)
    );

    // The owner goes away: the next forwarded DoGet of a key no node holds is a miss that
    // names it, counted as a miss and as an unreachable miss, never as an error.
    cluster.stop(2).await;
    let err = get(&mut via0, path_ticket(&missing)).await.unwrap_err();
    assert_eq!(status(err).code(), Code::NotFound);
    let text = scrape(cluster.node(0).metrics_addr).await;
    for (series, expected) in [
        (
            r#"flightcache_node_doget_seconds_count{outcome="miss"}"#,
            Some(2.0),
        ),
        ("flightcache_node_unreachable_misses_total", Some(1.0)),
        (
            r#"flightcache_node_doget_seconds_count{outcome="error"}"#,
            None,
        ),
    ] {
        assert_eq!(value(&text, series), expected, "{series}\n{text}");
    }
    let unreachable = value(
        &text,
        r#"flightcache_node_peer_errors_total{peer="n-2",reason="unreachable"}"#,
    )
    .unwrap();
    assert!(unreachable >= 1.0, "{text}");
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_rebalance_is_counted_and_its_gauges_return_to_zero() {
    let cluster = Cluster::start(3).await;
    let mut client = cluster.client(1).await;
    let before = scrape(cluster.node(1).metrics_addr).await;
    assert_eq!(
        value(&before, "flightcache_node_rebalance_in_progress"),
        Some(0.0)
    );
    assert!(value(&before, r#"flightcache_node_rebalances_total{result="ok"}"#).is_none());
    action(&mut client, "rebalance", b"").await.unwrap();
    // A dry run is not a rebalance.
    action(&mut client, "rebalance", br#"{"dryRun": true}"#)
        .await
        .unwrap();
    let text = scrape(cluster.node(1).metrics_addr).await;
    for (series, expected) in [
        (r#"flightcache_node_rebalances_total{result="ok"}"#, 1.0),
        ("flightcache_node_rebalance_in_progress", 0.0),
        ("flightcache_node_rebalance_pending_entries", 0.0),
    ] {
        assert_eq!(value(&text, series), Some(expected), "{series}\n{text}");
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn invalidations_are_counted_once_by_kind_where_the_client_asked() {
    let cluster = Cluster::start(3).await;
    let mut via0 = cluster.client(0).await;
    for i in 0..9 {
        let tags = serde_json::json!({"tags": [if i < 4 { "sales.orders" } else { "crm.users" }]});
        put(
            &mut via0,
            path(&format!("m/{i}")),
            vec![sample_batch(5, i)],
            Some(&tags.to_string()),
        )
        .await
        .unwrap();
    }
    action(&mut via0, "invalidate", b"m/8").await.unwrap();
    action(
        &mut via0,
        "invalidate-tag",
        br#"{"tags": ["sales.orders"]}"#,
    )
    .await
    .unwrap();
    action(&mut via0, "invalidate-prefix", b"m/").await.unwrap();
    let text = scrape(cluster.node(0).metrics_addr).await;
    for (series, expected) in [
        (r#"flightcache_node_invalidations_total{kind="key"}"#, 1.0),
        (
            r#"flightcache_node_invalidated_entries_total{kind="key"}"#,
            1.0,
        ),
        (r#"flightcache_node_invalidations_total{kind="tag"}"#, 1.0),
        (
            r#"flightcache_node_invalidated_entries_total{kind="tag"}"#,
            4.0,
        ),
        (
            r#"flightcache_node_invalidations_total{kind="prefix"}"#,
            1.0,
        ),
        (
            r#"flightcache_node_invalidated_entries_total{kind="prefix"}"#,
            4.0,
        ),
    ] {
        assert_eq!(value(&text, series), Some(expected), "{series}\n{text}");
    }
    // The peers ran their share of the fan-out and the owner its forwarded key: not
    // counted again.
    for i in 1..3 {
        let peer = scrape(cluster.node(i).metrics_addr).await;
        assert!(
            !peer.contains("flightcache_node_invalidations_total{"),
            "node {i}\n{peer}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn readyz_says_serving_and_nothing_else() {
    // The kubelet's probe when the Flight port speaks TLS. It has no credential, so the
    // answer carries no data: one word, and only GET on this path.
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "readyz-test-token").unwrap();
    let node = start_node(&["--auth-token-file", token.to_str().unwrap()]).await;
    let response = http_get(node.metrics_addr, "/readyz").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("\r\n\r\nserving"), "{response}");
    let other = http_get(node.metrics_addr, "/readyz/../stats").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_series_the_node_exposes_is_documented() {
    // docs/metrics.md is the reference dashboards and alerts are written from: a metric
    // added without its row fails here (the "adding a metric" checklist of
    // docs/architecture.md).
    // Read at run time, not included (scripts/source-mtimes: a reused test binary).
    let path = std::path::Path::new(
        &std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
    .join("../docs/metrics.md");
    let docs = std::fs::read_to_string(&path).expect("docs/metrics.md");
    let docs = docs.as_str();
    let node = start_node(&[]).await;
    let text = scrape(node.metrics_addr).await;
    let families: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    assert!(families.len() > 20, "{text}");
    let undocumented: Vec<&&str> = families
        .iter()
        .filter(|name| !docs.contains(&format!("`{name}")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
    node.shutdown().await.unwrap();
}
