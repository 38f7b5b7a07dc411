//! Routing across the members of a pool: which node owns a key and how a node learns
//! the ring.
//!
//! - [`ring`]: pure rendezvous hashing over stable member ids, member states, versions.
//! - [`members`]: the topology document (members, addresses, states, version) arriving
//!   at the edge, and the node's current routing table that never goes back in version.
//! - [`health`]: which peers calls skip (a circuit breaker per peer).

pub mod health;
pub mod members;
pub mod ring;
