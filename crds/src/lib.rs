//! The FlightCache API contract shared by the operator and the cache node.
//!
//! - [`node_config`]: the node configuration file (written by the operator into a
//!   ConfigMap, read by `flightcache-node --config`), and the body of the
//!   `configure` action.
//! - [`quantity`]: byte sizes and durations as users write them (`512MiB`, `64Mi`, `1h`).
//!
//! This crate carries serde and schemars only, so neither binary pulls in the other's
//! dependencies.

pub mod node_config;
pub mod quantity;
