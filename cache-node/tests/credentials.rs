//! The credential matrix of `docs/security.md` against a secured two-node cluster (client
//! token, admin token, peer token): every RPC and every action, on a key the node owns and
//! on one it forwards, with no credential, a wrong one, the client's, the admin's and the
//! peer's; the internal headers from callers that are not peers; a forged ring.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod common;

use arrow_flight::FlightClient;
use arrow_flight::error::FlightError;
use bytes::Bytes;
use cluster::*;
use common::*;
use crds::admin::AdminAction;
use futures::TryStreamExt;
use serde_json::json;
use tonic::Code;

/// What a call may get: through (any answer but a credential refusal), or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Through,
    Unauthenticated,
    PermissionDenied,
}

fn outcome<T>(result: Result<T, FlightError>) -> (Outcome, String) {
    match result {
        Ok(_) => (Outcome::Through, "ok".into()),
        Err(err) => {
            let status = status(err);
            let outcome = match status.code() {
                Code::Unauthenticated => Outcome::Unauthenticated,
                Code::PermissionDenied => Outcome::PermissionDenied,
                _ => Outcome::Through,
            };
            (
                outcome,
                format!("{:?}: {}", status.code(), status.message()),
            )
        }
    }
}

/// A body each action accepts, on `key`.
fn action_body(action: AdminAction, key: &str) -> Vec<u8> {
    match action {
        AdminAction::Invalidate | AdminAction::Lease => key.as_bytes().to_vec(),
        AdminAction::InvalidatePrefix => b"matrix-gone/".to_vec(),
        AdminAction::InvalidateTag => json!({"tags": ["matrix-gone"]}).to_string().into_bytes(),
        AdminAction::InvalidateLocal => {
            json!({"prefixes": ["matrix-gone/"], "tags": ["matrix-gone"]})
                .to_string()
                .into_bytes()
        }
        AdminAction::Configure => json!({"ttl": "1h"}).to_string().into_bytes(),
        AdminAction::Rebalance => json!({"dryRun": true}).to_string().into_bytes(),
        AdminAction::Held => crds::admin::HeldRequest {
            keys: vec![
                cache_node::key::CacheKey::Path(key.to_owned())
                    .to_store_bytes()
                    .to_vec(),
            ],
        }
        .encode(),
        AdminAction::Ping | AdminAction::Clear | AdminAction::Stats | AdminAction::Topology => {
            Vec::new()
        }
    }
}

/// Every RPC and action of `client` on `key`, each with its outcome.
async fn every_call(client: &mut FlightClient, key: &str) -> Vec<(String, Outcome, String)> {
    let mut calls = Vec::new();
    let mut record = |name: &str, (outcome, detail): (Outcome, String)| {
        calls.push((name.to_owned(), outcome, detail));
    };
    record(
        "DoPut",
        outcome(put(client, path(key), vec![sample_batch(10, 0)], None).await),
    );
    record("DoGet", outcome(get(client, path_ticket(key)).await));
    record(
        "Handshake",
        outcome(client.handshake(Bytes::from_static(b"hello")).await),
    );
    record(
        "GetFlightInfo",
        outcome(client.get_flight_info(path(key)).await),
    );
    record("GetSchema", outcome(client.get_schema(path(key)).await));
    let listed = match client.list_flights(Bytes::new()).await {
        Ok(stream) => stream.try_collect::<Vec<_>>().await,
        Err(err) => Err(err),
    };
    record("ListFlights", outcome(listed));
    let actions = match client.list_actions().await {
        Ok(stream) => stream.try_collect::<Vec<_>>().await,
        Err(err) => Err(err),
    };
    record("ListActions", outcome(actions));
    for kind in AdminAction::ALL {
        let body = action_body(kind, key);
        record(
            &format!("DoAction {kind}"),
            outcome(action(client, kind.as_str(), &body).await),
        );
    }
    calls
}

/// What `who` should get from `call`.
fn expected(who: &str, call: &str) -> Outcome {
    // The admin actions as docs/security.md lists them.
    let admin_action = [
        "DoAction clear",
        "DoAction stats",
        "DoAction configure",
        "DoAction rebalance",
        "DoAction held",
        "DoAction invalidate-local",
    ]
    .contains(&call);
    match who {
        "no credential" | "a wrong token" => Outcome::Unauthenticated,
        "admin" => Outcome::Through,
        "peer" if call == "DoAction clear" || call == "DoAction held" => Outcome::Through,
        "client" | "peer" if admin_action => Outcome::PermissionDenied,
        _ => Outcome::Through,
    }
}

#[tokio::test]
async fn every_rpc_and_action_answers_each_credential_as_the_matrix_says() {
    let cluster = Cluster::start_secured(2).await;
    let tokens = cluster.tokens.as_ref().unwrap().0.clone();
    let ring = cluster.ring(&[]);
    let local = keys_owned_by(&ring, "n-0", "matrix", 1).remove(0);
    let forwarded = keys_owned_by(&ring, "n-1", "matrix", 1).remove(0);
    let mut checked = 0;
    for (who, token) in [
        ("no credential", None),
        ("a wrong token", Some("guess")),
        ("client", Some(tokens.client.as_str())),
        ("peer", Some(tokens.peer.as_str())),
        ("admin", Some(tokens.admin.as_str())),
    ] {
        // Node 0 serves `local` itself and forwards `forwarded` to node 1 with its peer
        // token: a client's forwarded call works, an admin action stays refused.
        for key in [&local, &forwarded] {
            let mut client = cluster.client(0).await;
            if let Some(token) = token {
                client
                    .add_header("authorization", &format!("Bearer {token}"))
                    .unwrap();
            }
            for (call, got, detail) in every_call(&mut client, key).await {
                let want = expected(who, &call);
                assert_eq!(got, want, "{call} on {key} by {who}: {detail}");
                if got == Outcome::PermissionDenied {
                    assert!(
                        detail.contains("needs the cluster's admin credential"),
                        "{detail}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 5 * 2 * (7 + AdminAction::ALL.len()));
    println!("{checked} calls checked against the credential matrix");
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_client_put_through_a_node_that_forwards_reaches_the_owner_with_the_peer_token() {
    let cluster = Cluster::start_secured(2).await;
    let tokens = cluster.tokens.as_ref().unwrap().0.clone();
    let ring = cluster.ring(&[]);
    let key = keys_owned_by(&ring, "n-1", "fwd", 1).remove(0);
    let mut via0 = cluster.client(0).await;
    via0.add_header("authorization", &format!("Bearer {}", tokens.client))
        .unwrap();
    let batches = vec![sample_batch(100, 7)];
    put(&mut via0, path(&key), batches.clone(), None)
        .await
        .unwrap();
    assert!(holds(cluster.node(1), &key) && !holds(cluster.node(0), &key));
    assert_eq!(get(&mut via0, path_ticket(&key)).await.unwrap(), batches);
    // The admin's clear reaches node 1 through node 0 (sent on with the peer token).
    let mut admin = cluster.admin(cluster.node(0)).await;
    let removed = action(&mut admin, "clear", b"").await.unwrap();
    assert_eq!(&removed[..], br#"{"removed":1}"#);
    assert!(!holds(cluster.node(1), &key));
    cluster.shutdown().await;
}

#[tokio::test]
async fn internal_headers_are_refused_from_clients_and_the_admin() {
    let cluster = Cluster::start_secured(2).await;
    let tokens = cluster.tokens.as_ref().unwrap().0.clone();
    for (who, token) in [("client", &tokens.client), ("admin", &tokens.admin)] {
        for (header, value) in [
            ("x-flightcache-forwarded", "n-1"),
            ("x-flightcache-ring-version", "18446744073709551615"),
            ("x-flightcache-write", "migration"),
            ("x-flightcache-write", "fallback"),
            ("x-flightcache-write", "migration-batch"),
            ("x-flightcache-read", "held"),
            ("x-flightcache-entry-ttl-ms", "1"),
        ] {
            let mut client = cluster.client(0).await;
            client
                .add_header("authorization", &format!("Bearer {token}"))
                .unwrap();
            client.add_header(header, value).unwrap();
            let err = status(
                put(
                    &mut client,
                    path("forged/1"),
                    vec![sample_batch(1, 0)],
                    None,
                )
                .await
                .unwrap_err(),
            );
            assert_eq!(err.code(), Code::PermissionDenied, "{header} from {who}");
            assert!(
                err.message().contains(header)
                    && err.message().contains("only from the pool's nodes"),
                "{}",
                err.message()
            );
        }
    }
    assert_eq!(cluster.node(0).store.stats().entries, 0);
    // The same header from a peer is honoured: a migration copy is stored here.
    let mut peer = cluster.client(0).await;
    peer.add_header("authorization", &format!("Bearer {}", tokens.peer))
        .unwrap();
    peer.add_header("x-flightcache-write", "migration").unwrap();
    put(&mut peer, path("handed/1"), vec![sample_batch(1, 0)], None)
        .await
        .unwrap();
    assert!(holds(cluster.node(0), "handed/1"));
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_forged_ring_from_a_client_is_refused_and_the_operators_rings_still_apply() {
    let cluster = Cluster::start_secured(2).await;
    let tokens = cluster.tokens.as_ref().unwrap().0.clone();
    let forged = json!({"topology": {
        "version": u64::MAX,
        "replicas": 1,
        "members": [{"id": "n-0", "address": "198.51.100.7:50051", "state": "active"}],
    }})
    .to_string();
    let mut client = cluster.client(0).await;
    client
        .add_header("authorization", &format!("Bearer {}", tokens.client))
        .unwrap();
    let err = status(
        action(&mut client, "configure", forged.as_bytes())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(ring_version(&cluster).await, 1);
    // The operator's next ring applies; an older one is refused (rings only go forward).
    cluster.publish(2, &[]).await;
    let mut admin = cluster.admin(cluster.node(0)).await;
    let older = json!({"topology": cluster.topology(1, &[])}).to_string();
    let err = status(
        action(&mut admin, "configure", older.as_bytes())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert_eq!(ring_version(&cluster).await, 2);
    cluster.shutdown().await;
}

/// The ring version node 0 routes by, as its `topology` action says.
async fn ring_version(cluster: &Cluster) -> u64 {
    let mut admin = cluster.admin(cluster.node(0)).await;
    let answer = action(&mut admin, "topology", b"").await.unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    answer["version"].as_u64().unwrap()
}

#[tokio::test]
async fn a_coalescing_read_needs_a_token_like_any_read() {
    let cluster = Cluster::start_secured(2).await;
    let tokens = cluster.tokens.as_ref().unwrap().0.clone();
    let mut anonymous = cluster.client(0).await;
    anonymous.add_header("flightcache-coalesce", "1").unwrap();
    let err = status(
        get(&mut anonymous, path_ticket("coalesced/1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    let mut client = cluster.client(0).await;
    client
        .add_header("authorization", &format!("Bearer {}", tokens.client))
        .unwrap();
    client.add_header("flightcache-coalesce", "1").unwrap();
    let err = status(
        get(&mut client, path_ticket("coalesced/1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.metadata().get("flightcache-lease").unwrap(), "granted");
    cluster.shutdown().await;
}

/// Writes `text` to `path` the way the kubelet updates a Secret volume: a new file
/// swapped in whole.
fn replace_file(path: &std::path::Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Polls `call` until it gives `want` (an authenticated call's outcome), at most twice the
/// reload interval; returns how long it took.
async fn outcome_within<F, Fut>(want: bool, mut call: F) -> std::time::Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    let limit = 2 * cache_node::server::TOKEN_RELOAD_INTERVAL;
    loop {
        if call().await == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "the rotation was not in use within {limit:?} (want accepted = {want})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_rotated_client_token_file_takes_effect_on_open_connections_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "token-old\n").unwrap();
    let node = start_node(&["--auth-token-file", file.to_str().unwrap()]).await;
    // Two connections opened before the rotation, kept open through it.
    let channel = channel(&node).await;
    let accepted = |token: &'static str| {
        let channel = channel.clone();
        move || {
            let channel = channel.clone();
            async move {
                let mut client = FlightClient::new(channel);
                client
                    .add_header("authorization", &format!("Bearer {token}"))
                    .unwrap();
                match client.list_actions().await {
                    Ok(_) => true,
                    Err(err) => {
                        assert_eq!(status(err).code(), Code::Unauthenticated);
                        false
                    }
                }
            }
        }
    };
    assert!(accepted("token-old")().await);
    assert!(!accepted("token-new")().await);

    // Step 1: the new token beside the old one. Both work; nothing restarted.
    replace_file(&file, "token-old\ntoken-new\n");
    let took = outcome_within(true, accepted("token-new")).await;
    println!("the second token accepted {took:?} after it was written");
    assert!(accepted("token-old")().await);

    // Step 2: the old token gone. It is refused on the open connection from then on.
    replace_file(&file, "token-new\n");
    let took = outcome_within(false, accepted("token-old")).await;
    println!("the removed token refused {took:?} after it was written");
    assert!(accepted("token-new")().await);

    // A file that cannot be used keeps the tokens in use, and says so in a counter.
    replace_file(&file, "\n");
    tokio::time::sleep(cache_node::server::TOKEN_RELOAD_INTERVAL * 2).await;
    assert!(accepted("token-new")().await);
    assert!(!accepted("token-old")().await);
    let metrics = scrape(node.metrics_addr).await;
    assert!(
        metrics.contains("flightcache_node_token_reloads_total 2"),
        "{metrics}"
    );
    let failures = metrics
        .lines()
        .find_map(|line| line.strip_prefix("flightcache_node_token_reload_failures_total "))
        .and_then(|value| value.parse::<u64>().ok())
        .unwrap();
    assert!(failures >= 1, "{failures}");
    node.shutdown().await.unwrap();
}
