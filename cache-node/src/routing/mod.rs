//! Routing across the members of a pool: which node owns a key.
//!
//! - [`ring`]: pure rendezvous hashing over stable member ids, member states, versions.

pub mod ring;
