//! The wire layer: everything that knows gRPC and HTTP/2 framing.
//!
//! - [`seal`]: an entry's IPC messages encoded once into the gRPC frames a DoGet sends
//!   (protobuf tags, gRPC prefixes); the store keeps them opaque.
//! - [`intake`]: a tower layer in front of DoPut that reserves each message's bytes in
//!   the budget as soon as its gRPC prefix announces its length.
//! - [`accept`]: the Flight listener as a bounded stream of connections (a connection
//!   limit, back-off when out of file descriptors).
//! - [`limits`]: a tower layer that bounds the request bytes of every Flight method but
//!   DoPut (small for unary calls and for the unauthenticated Handshake).
//! - [`relay`]: a tower layer in front of DoGet that answers every hit with the stored
//!   frames and relays a forwarded DoGet frame by frame.
//! - [`hit`]: a hit the Flight adapter found, handed to the relay to send.
//! - [`stall`]: the register of open stored-frames answers and the sweeper that lets go
//!   of those whose reader stopped reading.
//! - [`slow`]: a tower layer outermost on the Flight port that logs calls whose answer
//!   began only after a second.
//! - [`tls`]: TLS on the Flight port with a certificate that reloads when its files
//!   change, and handshakes that never hold up accepting.
//!
//! `flight/` must not import `intake` or `relay` internals: it only mounts the layers
//! (`server.rs`), uses [`seal`] through the store's sealed types and hands hits over
//! through [`hit`]. The wire layer in
//! turn must not import `flight/`: the relay reads tickets through `crate::ticket` and
//! calls owners and reads the lease header through the cluster layer
//! (`crate::cluster::forward`, `crate::cluster::lease`). Both checked by
//! `scripts/check-layers`.

pub mod accept;
pub mod hit;
pub mod intake;
pub mod limits;
pub mod relay;
pub mod seal;
pub mod slow;
pub mod stall;
pub mod tls;
