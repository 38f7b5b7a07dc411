//! Outgoing channels whose whole connect is bounded, TLS handshake included.
//!
//! tonic bounds the TCP connect of a channel made by `Endpoint::connect_lazy` and nothing
//! after it: a TLS handshake with a process that is frozen (SIGSTOP, a hung VM; its kernel
//! still accepts the connection) waits for a ServerHello that never comes, and every call
//! queued on the channel waits with it until its own deadline. HTTP/2 keepalive cannot
//! help before the handshake is done; in plaintext it does (the client starts HTTP/2 at
//! once and its pings go unanswered), so this is what TLS lost. A channel from
//! [`lazy_channel`] uses tonic's own connector under its connect-with-connector path,
//! which bounds the connector's whole future (TCP, then TLS) by the endpoint's connect
//! timeout: the connection fails, the queued calls get `UNAVAILABLE`, and callers fail
//! over as they do in plaintext. Must not import anything of the crate.

use hyper_util::client::legacy::connect::HttpConnector;
use tonic::transport::{Channel, Endpoint};

/// A lazily connected channel to `endpoint` (its TLS settings, if any, applied as tonic
/// applies them) whose connect, TLS handshake included, ends within the endpoint's
/// connect timeout.
pub fn lazy_channel(endpoint: &Endpoint) -> Channel {
    let mut http = HttpConnector::new();
    // The URI may be https: TLS is layered on this connector's stream by tonic.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(endpoint.get_connect_timeout());
    endpoint.connect_with_connector_lazy(http)
}
