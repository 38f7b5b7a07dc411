//! The FlightCache API contract shared by the operator and the cache node.
//!
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

pub mod cachecluster;
pub mod conditions;
pub mod generate;
pub mod node_config;
pub mod quantity;

pub use cachecluster::{CacheCluster, CacheClusterSpec, CacheClusterStatus};
