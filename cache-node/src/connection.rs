//! What the Flight server knows of each connection it accepted, handed to every call on
//! it (tonic puts a connection's connect info in each request's extensions): the
//! client's address, and whether the connection has carried an authenticated call yet.
//!
//! The auth layer marks a connection when a call on it is admitted
//! ([`ConnectionInfo::mark_authenticated`]); the accept layer (`wire/accept`) ends a
//! connection that has carried none within [`UNAUTHENTICATED_CONNECTION_LIMIT`] of its
//! acceptance, so nobody without a credential keeps one of the node's places by answering
//! pings. Must not import anything of the crate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic::codegen::http;
use tonic::transport::server::TlsConnectInfo;

/// How long a connection may stay open without carrying an authenticated call: the
/// gRPC health probe and a refused call fit in it (each answered in milliseconds), so
/// does a Handshake at its own bounds (its first message within 10 s, the client's close
/// within 5 s of its answer), and a client that opens a connection for its calls makes
/// its first at once.
pub const UNAUTHENTICATED_CONNECTION_LIMIT: Duration = Duration::from_secs(20);

/// One accepted connection, as every call on it sees it.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    remote: Option<SocketAddr>,
    authenticated: Arc<AtomicBool>,
}

impl ConnectionInfo {
    /// A connection from `remote` that has carried no authenticated call yet.
    pub fn new(remote: Option<SocketAddr>) -> Self {
        Self {
            remote,
            authenticated: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The client's address.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }

    /// A call on this connection was admitted: the connection may stay open.
    pub fn mark_authenticated(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
    }

    /// Whether a call on this connection has been admitted.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// The connection a request arrived on, plain or under TLS (`None` for a server
    /// that does not accept through `wire/accept`, such as a test's).
    pub fn of(extensions: &http::Extensions) -> Option<&Self> {
        extensions.get::<Self>().or_else(|| {
            extensions
                .get::<TlsConnectInfo<Self>>()
                .map(TlsConnectInfo::get_ref)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_seen_through_every_clone() {
        let info = ConnectionInfo::new("127.0.0.1:9".parse().ok());
        let handed_to_a_call = info.clone();
        assert!(!info.is_authenticated());
        handed_to_a_call.mark_authenticated();
        assert!(info.is_authenticated());
        assert_eq!(info.remote_addr(), "127.0.0.1:9".parse().ok());
    }

    #[test]
    fn the_connection_is_found_in_a_plain_request_and_not_in_a_bare_one() {
        let mut extensions = http::Extensions::new();
        assert!(ConnectionInfo::of(&extensions).is_none());
        extensions.insert(ConnectionInfo::new(None));
        assert!(ConnectionInfo::of(&extensions).is_some());
    }
}
