//! The names of the gRPC metadata headers the node itself reads and writes.
//!
//! One place for every header name, so that the modules that send a header and those
//! that read it (the auth layer, the DoGet relay, the cluster layer, the mapping of
//! errors to statuses) share a low module instead of importing each other.
//!
//! Owns: header-name constants only; no logic, no I/O. Imports nothing of the crate.

/// The standard header carrying a caller's credential (`Bearer <token>`), read by the auth
/// layer and set on calls to peers.
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// The prefix of the headers nodes send each other (forwarding, ring version, copies and
/// their lifetimes); honoured only from peers.
pub const INTERNAL_HEADER_PREFIX: &str = "x-flightcache-";

/// Header naming the member that forwarded a request.
pub const FORWARDED_HEADER: &str = "x-flightcache-forwarded";
/// Header carrying the ring version the forwarding member routed by.
pub const RING_VERSION_HEADER: &str = "x-flightcache-ring-version";
/// Header marking a DoPut as a copy the receiver stores locally, never forwarding or
/// replicating it again: `replica` (a write's second copy) or `migration` (a handover
/// by `rebalance`, stored only where the key is absent).
pub const WRITE_HEADER: &str = "x-flightcache-write";
/// Handover headers (milliseconds): the entry's age and idle time at the sender, the
/// time left until the sender's deadline, and its per-entry TTL override if it has one.
pub const AGE_HEADER: &str = "x-flightcache-entry-age-ms";
/// See [`AGE_HEADER`].
pub const IDLE_HEADER: &str = "x-flightcache-entry-idle-ms";
/// See [`AGE_HEADER`].
pub const REMAINING_HEADER: &str = "x-flightcache-entry-remaining-ms";
/// See [`AGE_HEADER`].
pub const TTL_HEADER: &str = "x-flightcache-entry-ttl-ms";
/// Handover header: the entry's tags as a JSON list of strings (absent when it has none).
pub const TAGS_HEADER: &str = "x-flightcache-entry-tags";

/// Header on a node's UNAVAILABLE answer once it has begun to stop
/// ([`crate::error::Error::Stopping`]): the sender keeps its entry, and calls the peer's
/// name anew (a replacement may answer there by now).
pub const STOPPING_HEADER: &str = "x-flightcache-stopping";

/// Header marking a read sent to a key's previous holder during a ring change
/// (`x-flightcache-read: held`): answered from the receiver's store alone — a hit or
/// NOT_FOUND — never forwarded, never sent on to other copies.
pub const READ_HEADER: &str = "x-flightcache-read";

/// Request header by which a DoGet asks to coalesce its miss with concurrent ones
/// (value `1` or `true`). Not under the internal `x-flightcache-` prefix: any client
/// may send it; it is forwarded to the key's owner with the call.
pub const COALESCE_HEADER: &str = "flightcache-coalesce";
/// Response header on the NOT_FOUND of a coalescing DoGet that took the fill lease.
pub const LEASE_HEADER: &str = "flightcache-lease";
/// Request header gRPC clients put on a retried call: how many tries came before it
/// (gRFC A6; gRPC-core — pyarrow —, grpc-java and grpc-go send it, and the Rust client
/// of [`crate::client`] does too). Counted by the node, so tries no client reports are
/// still seen.
pub const PREVIOUS_ATTEMPTS_HEADER: &str = "grpc-previous-rpc-attempts";
