//! What the operator reports about a `CacheCluster` (its `/status` subresource).
//!
//! Condition types and reasons are the constants of [`crate::conditions`]. Pure types;
//! no I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a FlightCache cluster, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CacheClusterStatus {
    /// `metadata.generation` of the spec the operator last acted on. The other fields
    /// describe that generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Current state as Kubernetes conditions: `Ready` (every shard of every pool is
    /// ready), `Progressing` (a rollout, resize or ring change is under way) and
    /// `Degraded` (the spec cannot be carried out, or nodes fail). Keyed by type.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Names of the pools, comma-separated in spec order (e.g. `hot,batch`); the Pools
    /// column of `kubectl get cc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_names: Option<String>,

    /// Ready and desired cache nodes over all pools, as `ready/desired` (e.g. `5/6`);
    /// the Shards column of `kubectl get cc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_ready: Option<String>,

    /// Newest node configuration generation the operator has written (the highest of
    /// the pools' `configGeneration`); the Config column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_generation: Option<i64>,

    /// Cache nodes, over all pools, that run their pool's newest configuration
    /// generation; the Up-To-Date column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_shards: Option<i32>,

    /// Per-pool state, keyed by pool name.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,

    /// Share of lookups that found their entry, over every pool, in the window
    /// `pools[].usage` describes (e.g. `93.1%`; `idle` when that window had no lookup);
    /// the Hit-Ratio column of `kubectl get cc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_ratio: Option<String>,

    /// Arrow bytes held over the byte budget, over every pool's nodes, in binary units
    /// (e.g. `1.2Gi/3.0Gi`); the Memory column of `kubectl get cc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used: Option<String>,

    /// The Secret holding the token(s) clients present, as `<secret>/<key>` (e.g.
    /// `analytics-client-token/token`): the one `spec.auth.secretName` names or the one
    /// the operator generated. Unset when `spec.auth.disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_token_secret: Option<String>,

    /// The Secret holding the CA clients trust (key `ca.crt`) when the operator issues
    /// the cluster's certificate (`spec.tls` naming no Secret), e.g. `analytics-ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,

    /// The Secrets the operator generated for this cluster (`<cluster>-internal`,
    /// `<cluster>-client-token`, with TLS `<cluster>-node-tls` (the nodes' copy of the
    /// TLS Secret), and with `spec.tls: {}` `<cluster>-ca-key`, `<cluster>-ca` and
    /// `<cluster>-tls`), each with the uid it had when the operator created it.
    /// The operator uses a Secret of those names only when its uid is the one recorded
    /// here: an ownerReference can be written by anyone who may create Secrets, this
    /// status only by the operator.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generated_secrets: Vec<GeneratedSecret>,
}

/// A Secret the operator created, as it recorded it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedSecret {
    /// The Secret's name.
    pub name: String,
    /// Its `metadata.uid` when the operator created it.
    pub uid: String,
}

/// Observed state of one pool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// Name of the pool (as in `spec.pools[].name`).
    pub name: String,

    /// Desired cache nodes of the pool (its `shards`).
    #[serde(default)]
    pub shards: i32,

    /// Cache nodes of the pool that are ready to serve.
    #[serde(default)]
    pub ready_shards: i32,

    /// Configuration generation the operator has written for this pool; every node
    /// reports the generation it runs.
    #[serde(default)]
    pub config_generation: i64,

    /// Cache nodes of the pool that are up to date: they run `configGeneration` and the
    /// current pod template.
    #[serde(default)]
    pub updated_shards: i32,

    /// Cache nodes of the pool that report running `configGeneration` (live settings
    /// such as TTL and eviction reach nodes without a restart, one node at a time).
    #[serde(default)]
    pub configured_shards: i32,

    /// Version of the pool's hash ring (its members and their states) published to the
    /// nodes; it grows with every membership change.
    #[serde(default)]
    pub ring_version: i64,

    /// Address clients use: `grpc+tls://<cluster>-<pool>.<namespace>.svc:<port>` with
    /// TLS (the default), `grpc://…` in plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// What the pool is doing: `Settled`, `WaitingForNodes`, `Configuring` (live config
    /// rolling), `Resizing <node>` (a memory limit changing in place), `Restarting
    /// <node>` (a restart with handoff), `ScalingOut <nodes>` or `ScalingIn <nodes>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,

    /// How the last `memoryLimit` change reached the nodes: `InPlace` (pod resize, no
    /// restart: the byte budget lowered before the limit, raised after it) or
    /// `RestartWithHandoff` (where the cluster cannot resize pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_resize: Option<String>,

    /// What the pool is doing, in one sentence (what `kubectl describe cc` shows under
    /// each pool), e.g. `Restarting demo-hot-1 with handoff: its entries move to its
    /// peers before it stops; 2/3 nodes up to date.`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// What the pool's nodes hold and serve, sampled from their `stats` at most every
    /// 30 s (not on every pass), when every node of the pool answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<PoolUsage>,

    /// The pool's nodes as the operator last saw them, by name: every node while the
    /// CacheCluster has at most 2,048, else a share of 2,048 per pool, nodes that need
    /// attention (not Ready, not active, behind) first, so the object stays within etcd's
    /// request limit.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeStatus>,
}

/// What a pool's nodes hold and serve, as the operator last sampled it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    /// When the nodes were asked.
    pub sampled_at: Time,

    /// Entries held over the pool's nodes (copies counted once per node).
    #[serde(default)]
    pub entries: u64,

    /// Arrow bytes held over the pool's nodes.
    #[serde(default)]
    pub used_bytes: u64,

    /// The nodes' byte budgets added up.
    #[serde(default)]
    pub budget_bytes: u64,

    /// Lookups that found their entry, over the pool's nodes since each started (the
    /// counters the window of `hitRatio` is taken from).
    #[serde(default)]
    pub hits: u64,

    /// Lookups that found none, counted like `hits`.
    #[serde(default)]
    pub misses: u64,

    /// Hits over lookups since the previous sample (or since the nodes started, when a
    /// node restarted in between), e.g. `93.1%`; `idle` when there was no lookup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_ratio: Option<String>,

    /// Lookups in that window that found their entry (the numerator of `hitRatio`).
    #[serde(default)]
    pub window_hits: u64,

    /// Lookups in that window (the denominator of `hitRatio`).
    #[serde(default)]
    pub window_lookups: u64,
}

/// One cache node as the operator last saw it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Pod name, which is also the node's ring member id.
    pub name: String,

    /// Whether the pod is Ready.
    #[serde(default)]
    pub ready: bool,

    /// Ring state of the node: `active`, `joining` or `draining`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,

    /// Configuration generation the node reports running (absent when it did not
    /// answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_generation: Option<i64>,

    /// Ring version the node reports routing by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_version: Option<i64>,

    /// Entries the node holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<i64>,

    /// Whether the pod runs the current pod template.
    #[serde(default)]
    pub current_template: bool,
}
