//! Routing across the members of a pool: which node owns a key and how a node learns
//! the ring.
//!
//! - [`ring`]: pure rendezvous hashing over stable member ids, member states, versions.
//! - [`members`]: the topology document (members, addresses, states, version) arriving
//!   at the edge, and the node's current routing table that never goes back in version.
//! - [`health`]: which peers calls skip (a circuit breaker per peer).
//!
//! Owns: where a key goes; no I/O. Must not import tonic, `crate::error` (the
//! gRPC-aware error; only tests map to it), `flight/`, `wire/` or `cluster/`: they
//! import routing, never the reverse.

pub mod health;
pub mod members;
pub mod ring;
