//! The pooled channels to peers: one lazily connected tonic `Channel` per peer address
//! (HTTP/2 multiplexes every concurrent call over it), with a connect timeout and
//! keepalive pings, TLS verified against the cluster CA (and this node's client
//! certificate when peers require one; both rotate without a restart), this node's peer
//! credential, and which peers calls skip for now (`routing::health`).
//!
//! Owns: the channels and the counts of calls and failures on them
//! (`flightcache_node_forwarded_total`, `peer_errors_total`); `forward.rs` makes the calls,
//! the DoGet relay (`wire::relay`) borrows a channel. A Flight *client*: must not import
//! the Flight server side, `flight/` or `wire/` (see the `cluster` module docs). Network
//! I/O happens on the channels it hands out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use bytes::Bytes;
use parking_lot::Mutex;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::routing::health::PeerHealth;
use crate::routing::members::Peer;

/// How long calls skip a peer that a call could not reach (a connect or transport
/// failure): they fail over at once — a read to the next copy or candidate, a write to
/// the next candidate — instead of each waiting for a connect attempt; then one call
/// tries it (see [`crate::routing::health`]).
pub const PEER_DOWN_FOR: Duration = crate::routing::health::DOWN_FOR;
/// How often a peer connection is pinged, and how long the answer may take before the
/// connection counts as dead.
pub const PEER_KEEPALIVE: Duration = Duration::from_secs(1);
/// How long connecting to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The least [`message_limit`]: clients that send a big batch as one message need it.
pub const MIN_MESSAGE_LIMIT: usize = 64 << 20;

/// The largest gRPC message a node decodes: its largest entry as one message plus 1 MiB
/// of framing and schema, and never less than [`MIN_MESSAGE_LIMIT`]. The Flight port
/// takes at most this much per message from clients and peers, and a peer's answer is
/// held to it too (a peer that sends more gets its call failed, not buffered).
pub fn message_limit(max_entry_bytes: u64) -> usize {
    usize::try_from(max_entry_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20)
        .max(MIN_MESSAGE_LIMIT)
}

/// The pooled channels to peers, one per address, and the counts of calls made on them.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Addresses a call could not reach, and whether calls skip them (fast failure
    /// detection: a dead or frozen peer holds one call per [`PEER_DOWN_FOR`], not every
    /// call).
    health: Arc<Mutex<PeerHealth>>,
    metrics: Option<Arc<Metrics>>,
    /// The `authorization` this node presents to its peers (`Bearer <peer token>`);
    /// none: the caller's own is passed on.
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    /// How peers are called when they speak TLS; replaced (and the channels
    /// reconnected) when the CA or this node's certificate rotates.
    tls: Arc<Mutex<PeerTls>>,
    /// The largest message decoded from (or sent to) a peer; none: [`MIN_MESSAGE_LIMIT`].
    max_message_bytes: Option<usize>,
}

/// The TLS side of calls to peers.
#[derive(Default)]
struct PeerTls {
    /// The CA (PEM) peers' certificates are verified against; none: plaintext.
    ca: Option<Bytes>,
    /// The certificate chain and key (PEM) this node presents to peers that require
    /// client certificates.
    identity: Option<(Bytes, Bytes)>,
    /// The certificate chain (PEM) this node serves, for its `stats` ([`Peers::tls_in_use`]).
    served: Option<Bytes>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("ca", &self.ca.as_ref().map(Bytes::len))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

pub use crate::metrics::PeerError;

impl Peers {
    /// Peers whose calls and failures are counted in `metrics`.
    pub fn with_metrics(metrics: Arc<Metrics>) -> Self {
        Self {
            channels: Arc::default(),
            health: Arc::default(),
            metrics: Some(metrics),
            authorization: None,
            tls: Arc::default(),
            max_message_bytes: None,
        }
    }

    /// These peers, their messages held to `bytes` ([`message_limit`]).
    #[must_use]
    pub fn limiting_messages(mut self, bytes: usize) -> Self {
        self.max_message_bytes = Some(bytes);
        self
    }

    /// These peers, called over TLS verified against `ca` (PEM), when it is given.
    #[must_use]
    pub fn verifying(self, ca: Option<Bytes>) -> Self {
        self.tls.lock().ca = ca;
        self
    }

    /// These peers, presented `identity` (certificate chain and key, PEM) as this node's
    /// client certificate when it is given.
    #[must_use]
    pub fn presenting_certificate(self, identity: Option<(Bytes, Bytes)>) -> Self {
        self.tls.lock().identity = identity;
        self
    }

    /// These peers' node serves `cert` (PEM chain), as its `stats` say.
    #[must_use]
    pub fn serving(self, cert: Option<Bytes>) -> Self {
        self.tls.lock().served = cert;
        self
    }

    /// The TLS material in use, as fingerprints: the certificate served and each CA
    /// certificate peers are verified against; none for a plaintext node.
    pub fn tls_in_use(&self) -> Option<crds::admin::TlsInUse> {
        let tls = self.tls.lock();
        let ca = tls.ca.as_ref()?;
        Some(crds::admin::TlsInUse {
            served_sha256: tls
                .served
                .as_deref()
                .and_then(|pem| {
                    crds::admin::certificate_fingerprints(pem)
                        .into_iter()
                        .next()
                })
                .unwrap_or_default(),
            trusted_sha256: crds::admin::certificate_fingerprints(ca),
        })
    }

    /// Verifies peers against `ca` from now on: new channels are made with it (calls
    /// under way finish on the channels they have).
    pub fn rotate_ca(&self, ca: Bytes) {
        self.tls.lock().ca = Some(ca);
        self.channels.lock().clear();
    }

    /// Presents `cert` and `key` to peers from now on, if this node presents a client
    /// certificate at all (calls under way finish on the channels they have).
    pub fn rotate_identity(&self, cert: Bytes, key: Bytes) {
        let mut tls = self.tls.lock();
        tls.served = Some(cert.clone());
        if tls.identity.is_some() {
            tls.identity = Some((cert, key));
            drop(tls);
            self.channels.lock().clear();
        }
    }

    /// These peers, called with `authorization` (the peer credential's header value)
    /// instead of the caller's. A value that is not a valid header is not used.
    #[must_use]
    pub fn presenting(mut self, authorization: Option<&str>) -> Self {
        self.authorization = authorization.and_then(|value| value.parse().ok());
        self
    }

    /// The `authorization` to send with a call made for a caller whose headers are
    /// `incoming`: the peer credential, else the caller's own.
    pub fn authorization<'a>(
        &'a self,
        incoming: &'a MetadataMap,
    ) -> Option<&'a MetadataValue<tonic::metadata::Ascii>> {
        self.authorization
            .as_ref()
            .or_else(|| incoming.get(crate::headers::AUTHORIZATION_HEADER))
    }

    /// Counts a `method` call relayed to `peer`.
    pub fn count_call(&self, peer: &Peer, method: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics.forwarded(&peer.id, method);
        }
    }

    /// Counts a failed call to `peer`; one that could not reach it marks the peer down
    /// for [`PEER_DOWN_FOR`].
    pub fn count_error(&self, reason: PeerError, peer: &Peer) {
        if let Some(metrics) = &self.metrics {
            metrics.peer_error(&peer.id, reason);
        }
        // A timeout alone does not: a slow peer is alive, and a previous holder asked with a
        // short deadline is not down for the calls that are its own.
        let now = std::time::Instant::now();
        match reason {
            PeerError::Unreachable => self.health.lock().unreachable(&peer.address, now),
            PeerError::Timeout => self.health.lock().timed_out(&peer.address, now),
            PeerError::Refused | PeerError::Broken => {}
        }
    }

    /// `peer` answered that it is stopping: its pooled channel is dropped, so the next
    /// call resolves its name anew and reaches its replacement once there is one (a
    /// StatefulSet pod deleted by hand comes back under the same name while the old
    /// process still hands its entries over); calls in flight keep the old connection.
    pub fn stopping(&self, peer: &Peer) {
        self.channels.lock().remove(&peer.address);
    }

    /// `peer` answered a call (any status it sent itself): calls go to it again.
    pub fn answered(&self, peer: &Peer) {
        self.health.lock().answered(&peer.address);
    }

    /// How many peers calls skip right now (down, or being tried): the node's `stats`.
    pub fn skipped_now(&self) -> usize {
        self.health.lock().skipped(std::time::Instant::now())
    }

    /// How long a read admitted to `peer` may wait for it to start answering: `usual`, or
    /// [`crate::routing::health::TRY_READ_DEADLINE`] when it is the one call trying whether
    /// the peer that was down is back.
    pub fn read_deadline(&self, peer: &Peer, usual: Duration) -> Duration {
        if self.health.lock().trying(&peer.address) {
            usual.min(crate::routing::health::TRY_READ_DEADLINE)
        } else {
            usual
        }
    }

    /// Refuses a call to a peer calls skip right now (see [`crate::routing::health`]),
    /// without counting it.
    fn skip_if_down(&self, peer: &Peer) -> Result<()> {
        let admitted = self
            .health
            .lock()
            .admit(&peer.address, std::time::Instant::now());
        admitted.map_err(|skip| unreachable(peer, skip.reason()))
    }

    /// Counts a failure to reach `peer` and names it in the error.
    pub(super) fn failed(&self, reason: PeerError, peer: &Peer, detail: &str) -> Error {
        self.count_error(reason, peer);
        unreachable(peer, detail)
    }

    pub(super) fn client(
        &self,
        peer: &Peer,
        method: &'static str,
    ) -> Result<FlightServiceClient<Channel>> {
        self.skip_if_down(peer)?;
        self.client_even_if_down(peer, method)
    }

    pub(super) fn client_even_if_down(
        &self,
        peer: &Peer,
        method: &'static str,
    ) -> Result<FlightServiceClient<Channel>> {
        let channel = self.pooled_channel(peer)?;
        self.count_call(peer, method);
        let limit = self.max_message_bytes.unwrap_or(MIN_MESSAGE_LIMIT);
        Ok(FlightServiceClient::new(channel)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit))
    }

    /// The pooled channel to `peer` (connected lazily on first use).
    ///
    /// # Errors
    /// [`Error::OwnerUnreachable`] for an address that is not a valid URI authority.
    pub fn channel(&self, peer: &Peer) -> Result<Channel> {
        self.skip_if_down(peer)?;
        self.pooled_channel(peer)
    }

    fn pooled_channel(&self, peer: &Peer) -> Result<Channel> {
        let channel = {
            let mut channels = self.channels.lock();
            match channels.get(&peer.address) {
                Some(channel) => channel.clone(),
                None => {
                    let (ca, identity) = {
                        let tls = self.tls.lock();
                        (tls.ca.clone(), tls.identity.clone())
                    };
                    let scheme = if ca.is_some() { "https" } else { "http" };
                    let mut endpoint =
                        Endpoint::from_shared(format!("{scheme}://{}", peer.address)).map_err(
                            |err| self.failed(PeerError::Unreachable, peer, &err.to_string()),
                        )?;
                    if let Some(ca) = ca {
                        // The peer's name in its address is what its certificate must
                        // carry (`<pod>.<pool>-nodes.<namespace>.svc…` in a cluster).
                        let mut tls =
                            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                        if let Some((cert, key)) = identity {
                            tls = tls.identity(Identity::from_pem(cert, key));
                        }
                        endpoint = endpoint.tls_config(tls).map_err(|err| {
                            self.failed(PeerError::Unreachable, peer, &err.to_string())
                        })?;
                    }
                    let endpoint = endpoint
                        .connect_timeout(CONNECT_TIMEOUT)
                        // A peer that stops answering (a hung or frozen process: its kernel
                        // still accepts) is found within PEER_KEEPALIVE x 2 and its calls
                        // fail over, instead of waiting for their deadlines.
                        .http2_keep_alive_interval(PEER_KEEPALIVE)
                        .keep_alive_timeout(PEER_KEEPALIVE)
                        .keep_alive_while_idle(true)
                        .tcp_nodelay(true)
                        .initial_stream_window_size(4 << 20)
                        .initial_connection_window_size(8 << 20)
                        // As the server side: a relayed 2 MiB message arrives in a few
                        // frames instead of 128 16 KiB ones (fewer reads and wake-ups).
                        .max_frame_size(1 << 20);
                    // Bounded through the TLS handshake: a frozen peer fails the
                    // connect within CONNECT_TIMEOUT instead of holding its calls.
                    let channel = crate::dial::lazy_channel(&endpoint);
                    channels.insert(peer.address.clone(), channel.clone());
                    channel
                }
            }
        };
        Ok(channel)
    }
}

/// The error of a call that could not reach `peer`.
pub(super) fn unreachable(peer: &Peer, reason: &str) -> Error {
    Error::OwnerUnreachable {
        owner: peer.id.clone(),
        address: peer.address.clone(),
        reason: reason.to_owned(),
    }
}
