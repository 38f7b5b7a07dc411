//! FlightCache cache node: an Arrow Flight server that holds query results (Arrow record
//! batches) under keys, within a strict byte budget.
//!
//! - [`auth`]: the one authentication layer in front of every Flight call.
//! - [`config`]: flags, environment and config file into one validated [`config::Config`].
//! - [`store`]: the in-memory store (budget, TTL, eviction); no gRPC, no Flight.
//! - [`wire`]: all gRPC/HTTP/2 framing: sealing entries into frames, DoPut intake
//!   reservations, serving stored frames and relaying forwarded DoGets.
//! - [`headers`]: the names of the node's own gRPC metadata headers, in one low module.
//! - [`ticket`]: the ticket wire format, read by the Flight adapter and the DoGet relay.
//! - [`cluster`]: what a node does with its peers: forwarding, copies, read repair,
//!   rebalance and exit handoff, fill leases, the pool fan-out; typed answers.
//! - [`flight`]: the Flight service adapter (decode, call store or cluster, encode),
//!   DoPut ingestion, admin actions.
//! - [`routing`]: the consistent-hash ring and the topology a node routes by.
//! - [`client`]: a ring-aware Rust client that goes straight to each key's owner.
//! - [`put_runtime`]: the lower-priority runtime large put messages are sealed on, so
//!   hits never queue behind their sealing.
//! - [`assembly`]: one entry assembled from its IPC messages, shared by DoPut and the
//!   disk tier's reload; [`streams`]: the stream types `flight/` and `cluster/` share.
//! - [`live`]: live reconfiguration; [`metrics`]: the registry and its instruments (its
//!   [`metrics::collector`] reads the parts at scrape time); [`server`]: start and stop.
//!
//! Layering (the floors of every module in `docs/architecture.md`, checked on the
//! imports by `scripts/check-layers`): imports only go down, in no circle; the store
//! imports no gRPC or Flight crate; `wire/` does not import `flight/`; `cluster/`
//! imports neither `flight/` nor `wire/`; `flight/` does not import the relay's
//! internals; `ticket.rs` imports none of the three. `server.rs` alone stacks the
//! layers.

pub mod allocator;
pub mod assembly;
pub mod auth;
pub mod cgroup;
pub mod client;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod dial;
pub mod error;
pub mod flight;
pub mod headers;
pub mod key;
pub mod live;
pub mod metrics;
pub mod persist;
pub mod put_runtime;
pub mod readiness;
pub mod routing;
pub mod server;
pub mod store;
pub mod streams;
pub mod tags;
pub mod telemetry;
pub mod ticket;
pub mod wire;
