//! A DoGet hit found by the Flight adapter, handed to the relay to send.
//!
//! Every DoGet hit leaves the node one way: the relay's stored-frames answer
//! (`wire::relay`, the entry's stored gRPC frames as they are). The relay finds most hits
//! itself (this node is the key's first choice). The others only the Flight adapter finds:
//! a coalesced read after the fill lease, a peer's read of what this node holds, this node
//! answering as a key's second copy or next candidate. For those the adapter answers with
//! an empty stream and a [`StoredHit`] in the response's extensions; the relay, which sits
//! in front of the generated server, takes the entry and the RPC's timer out of it and
//! answers from the entry's stored frames.
//!
//! Owns: that handoff. `flight/` may import this module (not `wire::relay`); it must not
//! import `flight/`. No I/O.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::metrics::RpcTimer;
use crate::store::Entry;

/// A hit to send as stored frames, with the timer of its RPC (recorded when the answer
/// ends). Taken once: a clone shares the same hit.
#[derive(Clone)]
pub struct StoredHit(Arc<Mutex<Option<Hit>>>);

/// A hit's entry and the timer of its RPC.
type Hit = (Arc<Entry>, RpcTimer);

impl StoredHit {
    /// The hit `entry`, answering the RPC `timer` times.
    pub fn new(entry: Arc<Entry>, timer: RpcTimer) -> Self {
        Self(Arc::new(Mutex::new(Some((entry, timer)))))
    }

    /// The entry and the timer; `None` once taken.
    pub fn take(&self) -> Option<Hit> {
        self.0.lock().take()
    }
}
