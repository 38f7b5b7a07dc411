//! The in-process cluster of the routing tests: nodes `n-0 … n-N-1` on 127.0.0.1:0
//! sharing a topology (sent with the `configure` action once their ports are known).

#![allow(
    dead_code,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightClient, FlightData};
use cache_node::routing::ring::{MemberState, Ring, RingMember};
use cache_node::server::RunningNode;
use futures::TryStreamExt;
use serde_json::json;

use crate::common::*;

pub struct Cluster {
    pub nodes: Vec<Option<RunningNode>>,
    pub addresses: Vec<String>,
    pub replicas: u8,
    /// The credentials of a secured cluster (`start_secured`), and the folder of their files.
    pub tokens: Option<(Tokens, tempfile::TempDir)>,
}

/// The tokens of a secured cluster.
#[derive(Clone)]
pub struct Tokens {
    pub client: String,
    pub admin: String,
    pub peer: String,
}

impl Cluster {
    pub async fn start(n: usize) -> Self {
        Self::start_with_replicas(n, 1).await
    }

    pub async fn start_with_replicas(n: usize, replicas: u8) -> Self {
        Self::start_with(n, replicas, None).await
    }

    /// A cluster whose nodes need a client token and know an admin and a peer token;
    /// its rings are published with the admin token.
    pub async fn start_secured(n: usize) -> Self {
        let tokens = Tokens {
            client: "client-token".into(),
            admin: "admin-token".into(),
            peer: "peer-token".into(),
        };
        Self::start_with(n, 1, Some(tokens)).await
    }

    async fn start_with(n: usize, replicas: u8, tokens: Option<Tokens>) -> Self {
        let tokens = tokens.map(|tokens| (tokens, tempfile::tempdir().unwrap()));
        let mut flags: Vec<String> = Vec::new();
        if let Some((tokens, dir)) = &tokens {
            for (flag, token) in [
                ("--auth-token-file", &tokens.client),
                ("--admin-token-file", &tokens.admin),
                ("--peer-token-file", &tokens.peer),
            ] {
                let file = dir.path().join(flag.trim_start_matches('-'));
                std::fs::write(&file, token).unwrap();
                flags.extend([flag.to_owned(), file.to_str().unwrap().to_owned()]);
            }
        }
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = format!("n-{i}");
            let mut args: Vec<&str> = vec!["--member-id", &id];
            args.extend(flags.iter().map(String::as_str));
            nodes.push(Some(start_node(&args).await));
        }
        let addresses = nodes
            .iter()
            .map(|node| node.as_ref().unwrap().flight_addr.to_string())
            .collect();
        let cluster = Self {
            nodes,
            addresses,
            replicas,
            tokens,
        };
        cluster.publish(1, &[]).await;
        cluster
    }

    pub fn topology(&self, version: u64, draining: &[usize]) -> serde_json::Value {
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
    pub fn topology_with(&self, version: u64, states: &[&str]) -> serde_json::Value {
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
    pub async fn publish_document(&self, topology: serde_json::Value) {
        let body = json!({ "topology": topology }).to_string();
        for node in self.nodes.iter().flatten() {
            action(&mut self.admin(node).await, "configure", body.as_bytes())
                .await
                .unwrap();
        }
    }

    /// The ring the nodes route by, for picking keys by owner.
    pub fn ring(&self, draining: &[usize]) -> Ring {
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

    pub async fn publish(&self, version: u64, draining: &[usize]) {
        let body = json!({"topology": self.topology(version, draining)}).to_string();
        for node in self.nodes.iter().flatten() {
            let answer = action(&mut self.admin(node).await, "configure", body.as_bytes())
                .await
                .unwrap();
            let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(answer["ringVersion"], version);
        }
    }

    /// A client of `node` that presents the admin token, if the cluster has one.
    pub async fn admin(&self, node: &RunningNode) -> FlightClient {
        let mut admin = client(node).await;
        if let Some((tokens, _)) = &self.tokens {
            admin
                .add_header("authorization", &format!("Bearer {}", tokens.admin))
                .unwrap();
        }
        admin
    }

    pub async fn client(&self, i: usize) -> FlightClient {
        client(self.nodes[i].as_ref().unwrap()).await
    }

    pub fn node(&self, i: usize) -> &RunningNode {
        self.nodes[i].as_ref().unwrap()
    }

    pub async fn stop(&mut self, i: usize) {
        self.nodes[i].take().unwrap().shutdown().await.unwrap();
    }

    /// Puts `count` keys `prefix/N` that node `owner` owns through node `via`, each a
    /// `rows`-row batch numbered by its index; returns the keys.
    pub async fn put_keys_owned_by(
        &self,
        owner: usize,
        prefix: &str,
        count: usize,
        via: usize,
        rows: usize,
    ) -> Vec<String> {
        let keys = keys_owned_by(&self.ring(&[]), &format!("n-{owner}"), prefix, count);
        let mut client = self.client(via).await;
        for (i, key) in keys.iter().enumerate() {
            put(
                &mut client,
                path(key),
                vec![sample_batch(rows, i as i64)],
                None,
            )
            .await
            .unwrap();
        }
        keys
    }

    /// Puts `node` (started with `--member-id n-{i}`) in node `i`'s place, at its new
    /// address, and publishes ring `version` with the same members (a replaced pod).
    pub async fn replace(&mut self, i: usize, node: RunningNode, version: u64) {
        self.addresses[i] = node.flight_addr.to_string();
        self.nodes[i] = Some(node);
        self.publish(version, &[]).await;
    }

    pub async fn shutdown(mut self) {
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            node.shutdown().await.unwrap();
        }
    }
}

/// Path keys `prefix/0..` whose owner under `ring` is `owner`.
pub fn keys_owned_by(ring: &Ring, owner: &str, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}/{i}"))
        .filter(|key| ring.owner(format!("P{key}").as_bytes()).unwrap() == owner)
        .take(count)
        .collect()
}

/// A path key `prefix/N` whose first ring choice is `owner` and second `next`.
pub fn key_with_choices(ring: &Ring, prefix: &str, owner: &str, next: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}/{i}"))
        .find(|key| ring.owners(format!("P{key}").as_bytes(), 2) == [owner, next])
        .unwrap()
}

pub async fn raw_get(node: &RunningNode, key: &str) -> Vec<FlightData> {
    let mut raw = FlightServiceClient::new(channel(node).await);
    raw.do_get(path_ticket(key))
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap()
}

pub fn node_index(id: &str) -> usize {
    id.trim_start_matches("n-").parse().unwrap()
}

/// The ring's first two choices for path `key`, as node indices.
pub fn two_owners(ring: &Ring, key: &str) -> (usize, usize) {
    let owners = ring.owners(format!("P{key}").as_bytes(), 2);
    (node_index(owners[0]), node_index(owners[1]))
}

/// The path keys `node`'s store holds (without the kind byte), sorted.
pub fn store_keys(node: &RunningNode) -> Vec<String> {
    node.store
        .list(b"", usize::MAX)
        .into_iter()
        .map(|(key, _)| String::from_utf8(key[1..].to_vec()).unwrap())
        .collect()
}

pub fn holds(node: &RunningNode, key: &str) -> bool {
    node.store.peek(format!("P{key}").as_bytes()).is_some()
}
