//! The FlightCache API contract shared by the operator and the cache node.
//!
//! - [`admin`]: the node-admin actions (Flight `DoAction`) with their request and answer
//!   bodies, spoken by the node, the operator and the load generator.
//! - [`cachecluster`]: the `CacheCluster` resource (`flightcache.dev/v1alpha1`): types,
//!   defaults, the CEL rules the API server enforces, the same checks in Rust, and the
//!   change class of every field.
//! - [`conditions`]: condition types and reasons of its status.
//! - [`node_config`]: the node configuration file (written by the operator into a
//!   ConfigMap, read by `flightcache-node --config`), and the body of the
//!   `configure` action.
//! - [`quantity`]: byte sizes and durations as users write them (`512MiB`, `64Mi`, `1h`).
//! - [`generate`]: renders the CRD YAML and `docs/crd-reference.md` (the `crdgen` binary).
//!
//! This crate carries kube (derive only), k8s-openapi, schemars and serde, so neither
//! binary pulls in the other's dependencies.

pub mod admin;
pub mod cachecluster;
pub mod conditions;
pub mod generate;
pub mod node_config;
pub mod quantity;

pub use cachecluster::{CacheCluster, CacheClusterSpec, CacheClusterStatus};

/// An error and its sources on one line (`failed to apply: connection refused`), for
/// logs, status messages and answers to clients that cannot walk `source()`.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_joins_every_source() {
        let err = Outer(std::io::Error::other("inner"));
        assert_eq!(super::chain(&err), "outer: inner");
    }
}
