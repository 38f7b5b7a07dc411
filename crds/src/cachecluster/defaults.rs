//! Defaults of every optional `CacheCluster` field, as named functions.
//!
//! serde calls them when a field is missing, and schemars writes their values into the
//! CRD schema, so the API server fills in the same defaults on every create and update
//! (`kubectl get cc -o yaml` shows them). Pure; no I/O.

use crate::node_config::{EvictionPolicy, TtlMode};

/// Flight port of every cache node, and of the pools' client Services.
pub const PORT: i32 = 50051;
/// Port of every cache node's Prometheus `/metrics` endpoint.
pub const METRICS_PORT: i32 = 9090;
/// Cache nodes in a pool.
pub const SHARDS: i32 = 3;
/// Entry cap per node (the node's own default).
pub const MAX_ENTRIES: i64 = 100_000;
/// Default time-to-live of an entry (the node's own default).
pub const TTL: &str = "1h";
/// Container memory limit of each node.
pub const MEMORY_LIMIT: &str = "512Mi";
/// Copies of each key.
pub const REPLICAS: i32 = 1;
/// Key in the auth Secret that holds the token.
pub const AUTH_KEY: &str = "token";
/// Node labels a pool's pods spread over: zones first, then the nodes within them (the
/// well-known labels every kubelet and cloud provider set).
pub const SPREAD_TOPOLOGY_KEYS: [&str; 2] =
    ["topology.kubernetes.io/zone", "kubernetes.io/hostname"];

/// `spec.port`: [`PORT`].
pub fn port() -> i32 {
    PORT
}

/// `spec.monitoring.metricsPort`: [`METRICS_PORT`].
pub fn metrics_port() -> i32 {
    METRICS_PORT
}

/// `spec.monitoring.serviceMonitor`: off (it needs the prometheus-operator CRDs).
pub fn service_monitor() -> bool {
    false
}

/// `spec.auth.key`: [`AUTH_KEY`].
pub fn auth_key() -> String {
    AUTH_KEY.to_owned()
}

/// `spec.pools[].shards`: [`SHARDS`].
pub fn shards() -> i32 {
    SHARDS
}

/// `spec.pools[].maxEntries`: [`MAX_ENTRIES`].
pub fn max_entries() -> i64 {
    MAX_ENTRIES
}

/// `spec.pools[].ttl`: [`TTL`].
pub fn ttl() -> String {
    TTL.to_owned()
}

/// `spec.pools[].ttlMode`: absolute (an entry is not re-warmed by reads).
pub fn ttl_mode() -> TtlMode {
    TtlMode::Absolute
}

/// `spec.pools[].memoryLimit`: [`MEMORY_LIMIT`].
pub fn memory_limit() -> String {
    MEMORY_LIMIT.to_owned()
}

/// `spec.pools[].eviction`: W-TinyLFU (keeps the hot set through scans).
pub fn eviction() -> EvictionPolicy {
    EvictionPolicy::Tinylfu
}

/// `spec.pools[].replicas`: [`REPLICAS`].
pub fn replicas() -> i32 {
    REPLICAS
}

/// `spec.pools[].scheduling.spread.topologyKeys`: [`SPREAD_TOPOLOGY_KEYS`].
pub fn spread_topology_keys() -> Vec<String> {
    SPREAD_TOPOLOGY_KEYS.map(str::to_owned).to_vec()
}
