//! The FlightCache API contract shared by the operator and the cache node.
//!
//! - [`admin`]: the node-admin actions (Flight `DoAction`) with their request and answer
//!   bodies, spoken by the node, the operator and the load generator.
//! - [`cachecluster`]: the `CacheCluster` resource (`flightcache.dev/v1alpha1`): types,
//!   defaults, the CEL rules the API server enforces, the same checks in Rust, and the
//!   change class of every field.
//! - [`cacheinvalidation`]: the `CacheInvalidation` resource: a one-shot removal of
//!   entries by key, prefix or tag that the operator runs on every node of a cluster.
//! - [`conditions`]: condition types and reasons of the CacheCluster's status.
//! - [`invalidation`]: the bounds of an invalidation's selectors (the CRD's and the
//!   node's `invalidate-local`).
//! - [`node_config`]: the node configuration file (written by the operator into a
//!   ConfigMap, read by `flightcache-node --config`), and the body of the
//!   `configure` action.
//! - [`quantity`]: byte sizes and durations as users write them (`512MiB`, `64Mi`, `1h`).
//! - [`tags`]: what an entry tag is (`invalidate-tag` removes the entries carrying one).
//! - `generate` (feature `generate`, on by default): renders the CRD YAML and
//!   `docs/crd-reference.md` (the `crdgen` binary). The node and the operator build
//!   without it.
//!
//! This crate carries kube (derive only), k8s-openapi, schemars and serde, so neither
//! binary pulls in the other's dependencies.

pub mod admin;
pub mod cachecluster;
pub mod cacheinvalidation;
pub mod conditions;
#[cfg(feature = "generate")]
pub mod generate;
pub mod invalidation;
pub mod node_config;
pub mod quantity;
pub mod tags;

pub use cachecluster::{CacheCluster, CacheClusterSpec, CacheClusterStatus};
pub use cacheinvalidation::{CacheInvalidation, CacheInvalidationSpec, CacheInvalidationStatus};

/// Reads a JSON body that must be an object into `T`. serde's derive also accepts a JSON
/// array for a struct (its fields by position: `[9,null,null,2]`), which would bypass
/// `deny_unknown_fields` and the names a person reads; request bodies and documents are
/// objects only.
///
/// # Errors
/// The serde error for invalid JSON, a value that is not an object, or an object that is
/// not a `T`.
pub fn from_json_object<T: serde::de::DeserializeOwned>(
    text: &[u8],
) -> Result<T, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_slice(text)?;
    json_object_value(value)
}

/// [`from_json_object`] for an already parsed value.
///
/// # Errors
/// As [`from_json_object`].
pub fn json_object_value<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, serde_json::Error> {
    if !value.is_object() {
        let found = match value {
            serde_json::Value::Null => "null",
            serde_json::Value::Bool(_) => "a boolean",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::Object(_) => "an object",
        };
        return Err(serde::de::Error::custom(format!(
            "expected a JSON object, found {found}"
        )));
    }
    serde_json::from_value(value)
}

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
