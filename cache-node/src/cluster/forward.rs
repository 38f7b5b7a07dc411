//! Forwarding a request to the ring member that owns its key.
//!
//! A node that does not own a key passes the request on to the owner and streams the
//! answer back: DoGet's FlightData messages and DoPut's upload are relayed message by
//! message (never buffered whole, never decoded), GetFlightInfo, GetSchema and
//! `invalidate` are relayed as single messages. One pooled tonic `Channel` per peer
//! address, connected lazily (HTTP/2 multiplexes every concurrent call over it), with a
//! connect timeout. Calls but DoPut have a deadline for the owner's answer (DoGet: its
//! first message); a forwarded DoPut lasts as long as the client's upload, like a direct one.
//!
//! Forwarded requests carry `x-flightcache-forwarded: <sender member id>` and
//! `x-flightcache-ring-version: <sender's ring version>`; a node never forwards such a
//! request again (see `routing::members::decide`). They carry this node's peer credential
//! (`config::Credentials::peer`), so the owner honours those headers; a node without one passes
//! the caller's `authorization` on. The channels themselves are `peers.rs`'s. When the owner cannot be reached the caller gets
//! UNAVAILABLE naming it: `owner analytics-hot-2 (10.244.0.7:50051) is unreachable: …`.
//! Any answer from the owner itself (NOT_FOUND, RESOURCE_EXHAUSTED, …) is passed on as is.
//!
//! Owns: the calls to peers (counted in `flightcache_node_forwarded_total` /
//! `peer_errors_total` through [`Peers`]), and writing and reading
//! the forwarding headers (named in `crate::headers`; the DoGet relay, `wire::relay`,
//! sends them too). A Flight *client*: must not import
//! the Flight server side, `flight/` or `wire/` (see the `cluster` module docs).

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::{
    Action, Criteria, FlightData, FlightDescriptor, FlightInfo, PutResult, SchemaResult, Ticket,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Status};

use super::peers::{PeerError, Peers, unreachable};
use crate::error::{Error, Result};
use crate::headers::{
    AGE_HEADER, COALESCE_HEADER, FORWARDED_HEADER, IDLE_HEADER, READ_HEADER, REMAINING_HEADER,
    RING_VERSION_HEADER, STOPPING_HEADER, TAGS_HEADER, TTL_HEADER, WRITE_HEADER,
};
use crate::key::CacheKey;
use crate::routing::members::{ForwardedBy, Peer};
use crate::store::{Entry, Lifetime, Tags};
use crate::streams::{FlightStream, UploadRest};

/// The most bytes of a relayed DoPut kept until the owner answers, so that a put whose
/// owner dies or hangs under it (its connection breaks before any answer) can still go
/// to the key's next candidate. A larger put keeps nothing and fails UNAVAILABLE in that
/// case, as the client's own connection breaking would. 4 MiB covers the result sets a
/// cache mostly holds; the kept messages share the buffers already received (no copy),
/// and what they hold is reserved in the store's budget while they are kept: a put whose
/// copy finds no room keeps nothing (and relays on), so kept copies never take memory
/// the budget does not count.
pub const REPLAYABLE_PUT_BYTES: usize = 4 << 20;

/// Bytes held in the node's memory budget until dropped.
pub type HeldBudget = Box<dyn Send + Sync>;

/// Room in the node's memory budget for the copies a relayed put keeps: asked for a
/// number of bytes, it holds them until the value it gives is dropped, or gives none
/// when the budget has no room (the store's intake reservations, handed down by the
/// cluster layer, which sits above the store).
#[derive(Clone)]
pub struct ReplayBudget(Arc<dyn Fn(u64) -> Option<HeldBudget> + Send + Sync>);

impl ReplayBudget {
    /// A budget that holds bytes with `hold`.
    pub fn new(hold: impl Fn(u64) -> Option<HeldBudget> + Send + Sync + 'static) -> Self {
        Self(Arc::new(hold))
    }

    fn hold(&self, bytes: u64) -> Option<HeldBudget> {
        (self.0)(bytes)
    }
}

impl std::fmt::Debug for ReplayBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplayBudget")
    }
}

/// How long a peer may take to answer a forwarded call (DoGet: to start answering).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a previous holder may take to answer (DoGet: to start answering). Short: it
/// is asked only after the key's current holders missed, and an unreachable one makes
/// the read a miss.
pub const PREVIOUS_HOLDER_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether a read asks only for what this node holds (see [`READ_HEADER`]).
pub fn is_held_read(metadata: &MetadataMap) -> bool {
    metadata
        .get(READ_HEADER)
        .is_some_and(|value| matches!(value.as_bytes(), b"held" | b"repair"))
}

/// Whether a read for what this node holds also asks for a copy of a hit
/// (`x-flightcache-read: repair`): the asker is one of the key's owners and missed it (it
/// came back empty from a restart, or has not been handed the key yet).
pub fn wants_a_copy(metadata: &MetadataMap) -> bool {
    metadata
        .get(READ_HEADER)
        .is_some_and(|value| value.as_bytes() == b"repair")
}

/// What kind of copy a DoPut marked with [`WRITE_HEADER`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// The second copy of a write, sent by the key's owner after it committed.
    Replica,
    /// An entry handed over by `rebalance`.
    Migration,
    /// A put whose owner could not be reached, stored on the key's next candidate; the
    /// next rebalance after the owner is back hands it to the owner.
    Fallback,
}

impl WriteKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Replica => "replica",
            Self::Migration => "migration",
            Self::Fallback => "fallback",
        }
    }
}

/// The copy kind of a DoPut, if it is one.
pub fn write_kind(metadata: &MetadataMap) -> Option<WriteKind> {
    match metadata.get(WRITE_HEADER)?.to_str().ok()? {
        "replica" => Some(WriteKind::Replica),
        "migration" => Some(WriteKind::Migration),
        "fallback" => Some(WriteKind::Fallback),
        _ => None,
    }
}

/// The lifetime a copy carries in its headers (fresh for a plain put).
///
/// # Errors
/// INVALID_ARGUMENT for a tags header that is not a valid list of tags.
pub fn carried_lifetime(metadata: &MetadataMap, kind: Option<WriteKind>) -> Result<Lifetime> {
    let millis = |name: &str| {
        metadata
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
    };
    let tags = match metadata.get(TAGS_HEADER) {
        Some(value) => crate::tags::from_json(value.as_bytes())
            .map_err(|reason| Error::BadPutStream(format!("{TAGS_HEADER}: {reason}")))?,
        None => Tags::default(),
    };
    Ok(Lifetime {
        ttl_override: millis(TTL_HEADER),
        age: millis(AGE_HEADER).unwrap_or_default(),
        idle: millis(IDLE_HEADER).unwrap_or_default(),
        remaining: millis(REMAINING_HEADER),
        if_absent: kind == Some(WriteKind::Migration),
        journaled: false,
        tags,
    })
}

/// Who forwarded this request, if anyone.
pub fn forwarded_by(metadata: &MetadataMap) -> Option<ForwardedBy> {
    let member = metadata.get(FORWARDED_HEADER)?.to_str().ok()?.to_owned();
    let ring_version = metadata
        .get(RING_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(ForwardedBy {
        member,
        ring_version,
    })
}

/// The sender of forwarded requests: this node's id and ring version.
#[derive(Debug, Clone)]
pub struct Sender {
    /// This node's member id (`-` when it is not a member, e.g. a pure router).
    pub member: String,
    /// The ring version it routed by.
    pub ring_version: u64,
    /// Whether the call asks for what the peer holds ([`READ_HEADER`]).
    pub held_read: bool,
    /// Whether it also asks for a copy of a hit ([`wants_a_copy`]).
    pub wants_a_copy: bool,
    /// How long the peer may take to answer (DoGet: to start answering).
    pub deadline: Duration,
}

impl Sender {
    /// The sender of requests forwarded by the node routing with `routing`.
    pub fn of(routing: &crate::routing::members::RoutingTable) -> Self {
        Self {
            member: routing.self_id().unwrap_or("-").to_owned(),
            ring_version: routing.version(),
            held_read: false,
            wants_a_copy: false,
            deadline: CALL_TIMEOUT,
        }
    }

    /// This sender, naming `peer`'s ring version ([`Peer::ring_version`]) as the one it
    /// routed by: a request the node forwards for a client names the ring that chose its
    /// peer, not one installed since.
    #[must_use]
    pub fn routed_to(mut self, peer: &Peer) -> Self {
        self.ring_version = peer.ring_version;
        self
    }

    /// This sender, asking for what the peer holds ([`READ_HEADER`]): the peer answers
    /// from its store alone, without asking the key's other copies or previous holders.
    #[must_use]
    pub fn asking_what_is_held(mut self) -> Self {
        self.held_read = true;
        self
    }

    /// This sender, asking for what the peer holds and for a copy of a hit ([`wants_a_copy`]):
    /// this node owns the key and missed it.
    #[must_use]
    pub fn asking_for_a_copy(mut self) -> Self {
        self.wants_a_copy = true;
        self.asking_what_is_held()
    }

    /// This sender, asking a previous holder for what it holds, within
    /// [`PREVIOUS_HOLDER_TIMEOUT`].
    #[must_use]
    pub fn asking_previous_holder(self) -> Self {
        Self {
            deadline: PREVIOUS_HOLDER_TIMEOUT,
            ..self.asking_what_is_held()
        }
    }

    /// How long the peer may take to answer.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
}

fn outgoing<T>(peers: &Peers, message: T, incoming: &MetadataMap, sender: &Sender) -> Request<T> {
    let mut request = Request::new(message);
    let metadata = request.metadata_mut();
    if let Some(auth) = peers.authorization(incoming) {
        metadata.insert(crate::headers::AUTHORIZATION_HEADER, auth.clone());
    }
    if let Ok(member) = MetadataValue::try_from(sender.member.as_str()) {
        metadata.insert(FORWARDED_HEADER, member);
    }
    metadata.insert(
        RING_VERSION_HEADER,
        MetadataValue::from(sender.ring_version),
    );
    if sender.held_read {
        let value = if sender.wants_a_copy {
            "repair"
        } else {
            "held"
        };
        metadata.insert(READ_HEADER, MetadataValue::from_static(value));
    } else if let Some(coalesce) = incoming.get(COALESCE_HEADER) {
        // The owner coalesces the miss, so it must see the caller's request to.
        metadata.insert(COALESCE_HEADER, coalesce.clone());
    }
    request
}

/// Awaits `call` for at most `deadline`.
async fn with_deadline<T>(
    peers: &Peers,
    peer: &Peer,
    deadline: Duration,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T> {
    match tokio::time::timeout(deadline, call).await {
        Ok(Ok(answer)) => {
            peers.answered(peer);
            Ok(answer)
        }
        Ok(Err(status)) => Err(owner_error(peers, peer)(status)),
        Err(_) => Err(peers.failed(
            PeerError::Timeout,
            peer,
            &format!("no answer within {deadline:?}"),
        )),
    }
}

/// Classifies a failed forwarded call: a status the owner sent is passed on; one made up
/// on this side (connect failure, deadline, broken connection: no response metadata)
/// means the owner is unreachable.
fn owner_error<'a>(peers: &'a Peers, peer: &'a Peer) -> impl Fn(Status) -> Error + 'a {
    move |status| {
        if status.metadata().is_empty() {
            tracing::debug!(owner = %peer.id, address = %peer.address, %status, "owner unreachable");
            peers.failed(PeerError::Unreachable, peer, status.message())
        } else {
            // The owner answered itself: it is reachable.
            peers.answered(peer);
            if status.code() == tonic::Code::Unavailable {
                peers.count_error(PeerError::Refused, peer);
                if status.metadata().contains_key(STOPPING_HEADER) {
                    peers.stopping(peer);
                }
            }
            Error::Forwarded(status)
        }
    }
}

/// A failure mid-stream: one made up on this side means the owner's stream broke off.
fn stream_error(peers: &Peers, peer: &Peer, status: Status) -> Status {
    if status.metadata().is_empty() {
        peers.count_error(PeerError::Broken, peer);
        return Status::from(unreachable(peer, status.message()));
    }
    Status::from(Error::Forwarded(status))
}

/// Relays a DoGet to `peer`, streaming its FlightData back message by message.
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the owner's status.
pub async fn do_get(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    ticket: Ticket,
    incoming: &MetadataMap,
) -> Result<FlightStream<FlightData>> {
    let mut client = peers.client(peer, "DoGet")?;
    let response = with_deadline(
        peers,
        peer,
        peers.read_deadline(peer, sender.deadline()),
        client.do_get(outgoing(peers, ticket, incoming, sender)),
    )
    .await?;
    let (peers, peer) = (peers.clone(), peer.clone());
    let stream = response
        .into_inner()
        .map_err(move |status| stream_error(&peers, &peer, status));
    Ok(stream.boxed())
}

/// Longest a failed DoPut waits for its untouched upload to come back.
const HAND_BACK_WAIT: Duration = Duration::from_secs(1);

/// A DoPut the owner never took: the call failed before the owner read its first
/// message (it could not be reached), so the upload is whole and can go elsewhere.
pub struct Undelivered {
    /// The first message (already read here to find the key).
    pub first: FlightData,
    /// The rest of the upload: the client's stream, after the messages the owner was
    /// sent and never answered for.
    pub rest: UploadRest,
    /// Why the owner did not take it.
    pub error: Error,
}

/// What became of a relayed DoPut that did not succeed.
pub enum PutFailure {
    /// The owner could not be reached, or its connection broke before it answered, and
    /// the upload is whole: nothing of it was sent, or what was sent was kept
    /// ([`REPLAYABLE_PUT_BYTES`]).
    Undelivered(Box<Undelivered>),
    /// Anything else (the owner's own answer, a broken client stream, a connection lost
    /// under an upload too large to keep): the error stands.
    Failed(Error),
}

impl From<Error> for PutFailure {
    fn from(err: Error) -> Self {
        Self::Failed(err)
    }
}

/// Relays a DoPut to `peer`: `first` (already read to find the key) and then the rest of
/// the client's stream, message by message. A client stream that fails cancels the
/// forwarded call, so the owner stores nothing. `kind` marks the put as a copy the peer
/// stores without forwarding it (a fallback write).
///
/// The client's stream is read only once the owner has taken the first message (hyper
/// polls a request body only after the connection is up and the stream open), and the
/// messages relayed are kept (up to [`REPLAYABLE_PUT_BYTES`]) until the owner answers.
/// So when the owner cannot be reached, or its connection breaks before it answered (it
/// crashed or hangs: the keepalive ends the connection), nothing of the upload is lost
/// and it comes back as [`PutFailure::Undelivered`], for the caller to store elsewhere.
///
/// # Errors
/// [`PutFailure::Undelivered`], or [`PutFailure::Failed`] with
/// [`Error::OwnerUnreachable`], [`Error::BadPutStream`] when the client stream fails, or
/// the owner's status.
#[allow(clippy::too_many_arguments)] // each is a distinct part of the relayed call
pub async fn do_put(
    peers: &Peers,
    budget: &ReplayBudget,
    peer: &Peer,
    sender: &Sender,
    first: FlightData,
    rest: UploadRest,
    incoming: &MetadataMap,
    kind: Option<WriteKind>,
) -> std::result::Result<FlightStream<PutResult>, PutFailure> {
    let mut client = match peers.client(peer, "DoPut") {
        Ok(client) => client,
        // Nothing was sent: the upload is whole.
        Err(error) => {
            return Err(PutFailure::Undelivered(Box::new(Undelivered {
                first,
                rest,
                error,
            })));
        }
    };
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<Status>();
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel::<()>();
    // A small bounded channel relays the upload with backpressure. On a client error the
    // reader reports it and keeps the channel open: ending the upload would let the owner
    // commit a partial entry; the select below cancels the call instead.
    let (tx, rx) = tokio::sync::mpsc::channel::<FlightData>(4);
    let kept = ReplayCopies::new(budget.clone(), &first);
    let reader = tokio::spawn(relay_upload(rest, tx, failed_tx, taken_rx, kept));
    let head = first.clone();
    let upload = futures::stream::once(async move {
        let _ = taken_tx.send(());
        head
    })
    .chain(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut request = outgoing(peers, upload, incoming, sender);
    if let Some(kind) = kind {
        request
            .metadata_mut()
            .insert(WRITE_HEADER, MetadataValue::from_static(kind.as_str()));
    }
    let call = client.do_put(request);
    let response = tokio::select! {
        response = call => response,
        Ok(status) = failed_rx => {
            return Err(Error::BadPutStream(format!("the client stream failed: {}", status.message())).into());
        }
    };
    let response = match response {
        Ok(response) => {
            peers.answered(peer);
            response
        }
        Err(status) => {
            let error = owner_error(peers, peer)(status);
            if !matches!(error, Error::OwnerUnreachable { .. }) {
                return Err(PutFailure::Failed(error));
            }
            // The call is over, so its upload stream is dropped: the reader hands back the
            // client's stream, after the messages it relayed if it kept them all.
            return Err(match tokio::time::timeout(HAND_BACK_WAIT, reader).await {
                Ok(Ok(Some(rest))) => {
                    PutFailure::Undelivered(Box::new(Undelivered { first, rest, error }))
                }
                _ => PutFailure::Failed(error),
            });
        }
    };
    let (peers, peer) = (peers.clone(), peer.clone());
    let stream = response
        .into_inner()
        .map_err(move |status| stream_error(&peers, &peer, status));
    Ok(stream.boxed())
}

/// Relays a GetFlightInfo to `peer`; the owner's answer carries its own location.
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the owner's status.
pub async fn get_flight_info(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    descriptor: FlightDescriptor,
    incoming: &MetadataMap,
) -> Result<FlightInfo> {
    let mut client = peers.client(peer, "GetFlightInfo")?;
    let response = with_deadline(
        peers,
        peer,
        sender.deadline(),
        client.get_flight_info(outgoing(peers, descriptor, incoming, sender)),
    )
    .await?;
    Ok(response.into_inner())
}

/// Relays a GetSchema to `peer`.
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the owner's status.
pub async fn get_schema(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    descriptor: FlightDescriptor,
    incoming: &MetadataMap,
) -> Result<SchemaResult> {
    let mut client = peers.client(peer, "GetSchema")?;
    let response = with_deadline(
        peers,
        peer,
        sender.deadline(),
        client.get_schema(outgoing(peers, descriptor, incoming, sender)),
    )
    .await?;
    Ok(response.into_inner())
}

/// Relays an action to `peer` and returns the body of its first result.
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the owner's status.
pub async fn do_action(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    action: Action,
    incoming: &MetadataMap,
) -> Result<Bytes> {
    let mut client = peers.client(peer, "DoAction")?;
    let first = with_deadline(peers, peer, sender.deadline(), async {
        let mut results = client
            .do_action(outgoing(peers, action, incoming, sender))
            .await?
            .into_inner();
        results.message().await
    })
    .await?;
    Ok(first.map(|result| result.body).unwrap_or_default())
}

/// Sends a stored entry to `peer` as a DoPut marked `kind`, with its lifetime in the
/// handover headers, and waits for the peer to store it (at most [`CALL_TIMEOUT`]).
/// Returns the peer's PutResult metadata.
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the peer's status.
#[allow(clippy::too_many_arguments)]
pub async fn send_entry(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    key: &CacheKey,
    entry: &Entry,
    kind: WriteKind,
    lifetime: &Lifetime,
    incoming: &MetadataMap,
) -> Result<Bytes> {
    // Not skipped while the peer is marked down: a handover or copy is worth its own
    // connect attempt (a failure keeps the entry here).
    let mut client = peers.client_even_if_down(peer, "DoPut")?;
    // The stored messages as they are (no encoding); the first names the key.
    let mut messages: Vec<FlightData> = entry
        .wire_messages()
        .iter()
        .map(|message| message.to_flight_data())
        .collect();
    if let Some(first) = messages.first_mut() {
        first.flight_descriptor = Some(key.to_descriptor());
    }
    let upload = futures::stream::iter(messages);
    let mut request = outgoing(peers, upload, incoming, sender);
    let metadata = request.metadata_mut();
    metadata.insert(WRITE_HEADER, MetadataValue::from_static(kind.as_str()));
    let millis =
        |d: Duration| MetadataValue::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    metadata.insert(AGE_HEADER, millis(lifetime.age));
    metadata.insert(IDLE_HEADER, millis(lifetime.idle));
    if let Some(remaining) = lifetime.remaining {
        metadata.insert(REMAINING_HEADER, millis(remaining));
    }
    if let Some(ttl) = lifetime.ttl_override {
        metadata.insert(TTL_HEADER, millis(ttl));
    }
    if !lifetime.tags.is_empty() {
        // Checked printable ASCII when the entry was stored: a valid header value.
        if let Ok(tags) = MetadataValue::try_from(crate::tags::to_json(&lifetime.tags)) {
            metadata.insert(TAGS_HEADER, tags);
        }
    }
    let reply = with_deadline(peers, peer, sender.deadline(), async {
        let mut results = client.do_put(request).await?.into_inner();
        results.message().await
    })
    .await?;
    Ok(reply.map(|result| result.app_metadata).unwrap_or_default())
}

/// The `x-flightcache-write` value of a handover of many entries in one DoPut (see
/// [`send_batch`]).
pub const MIGRATION_BATCH: &str = "migration-batch";
/// The most entries a migration batch may carry; the receiver refuses a longer one.
pub const MIGRATION_BATCH_MAX_ENTRIES: usize = 256;
/// The largest entry (its messages' bytes) a migration batch may carry: a batch's
/// receiver holds an entry's messages until the next one begins, so only small entries
/// go in a batch; a larger one is handed over by a DoPut of its own ([`send_entry`]).
pub const MIGRATION_BATCH_ENTRY_MAX_BYTES: u64 = 256 << 10;

/// Whether a DoPut is a migration batch ([`MIGRATION_BATCH`]).
pub fn is_migration_batch(metadata: &MetadataMap) -> bool {
    metadata
        .get(WRITE_HEADER)
        .is_some_and(|value| value.as_bytes() == MIGRATION_BATCH.as_bytes())
}

/// An entry's lifetime as a migration batch carries it, in the `app_metadata` of the
/// message that begins the entry (a single handover carries the same in headers).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CarriedLifetime {
    age_ms: u64,
    idle_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remaining_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
}

impl CarriedLifetime {
    fn of(lifetime: &Lifetime) -> Self {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            age_ms: millis(lifetime.age),
            idle_ms: millis(lifetime.idle),
            remaining_ms: lifetime.remaining.map(millis),
            ttl_ms: lifetime.ttl_override.map(millis),
            tags: lifetime.tags.iter().map(|tag| tag.to_string()).collect(),
        }
    }

    /// Reads the lifetime a batch entry carries, as a handover (stored only where the
    /// key is absent).
    ///
    /// # Errors
    /// INVALID_ARGUMENT when the `app_metadata` is not this JSON object.
    pub fn decode(app_metadata: &[u8]) -> Result<Lifetime> {
        let carried: Self = serde_json::from_slice(app_metadata).map_err(|err| {
            Error::BadPutStream(format!(
                "a migration batch entry must begin with its lifetime as JSON \
                 ({{\"ageMs\":…,\"idleMs\":…}}): {err}"
            ))
        })?;
        let tags = crate::tags::entry_tags(carried.tags)
            .map_err(|err| Error::BadPutStream(format!("a migration batch entry's tags: {err}")))?;
        Ok(Lifetime {
            ttl_override: carried.ttl_ms.map(Duration::from_millis),
            age: Duration::from_millis(carried.age_ms),
            idle: Duration::from_millis(carried.idle_ms),
            remaining: carried.remaining_ms.map(Duration::from_millis),
            if_absent: true,
            journaled: false,
            tags,
        })
    }
}

/// The receiver's answer for one entry of a migration batch (one `PutResult` per entry,
/// in order): held (stored, or a live entry was already there) or refused, with why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchEntryAnswer {
    /// The receiver holds the key now.
    pub held: bool,
    /// Why the entry was not stored (no room, a bad stream, an invalidation since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// One entry of a migration batch: its key, the entry and the lifetime it carries.
pub struct BatchEntry<'a> {
    /// The key, as its descriptor names it.
    pub key: &'a CacheKey,
    /// The entry as stored (its messages are sent as they are).
    pub entry: &'a Entry,
    /// The lifetime it carries (age, idle time, deadline, TTL override).
    pub lifetime: Lifetime,
}

/// Hands `entries` over to `peer` in one DoPut marked [`MIGRATION_BATCH`]: each entry's
/// stored messages as they are, the first naming its key (descriptor) and carrying its
/// lifetime ([`CarriedLifetime`], as `app_metadata`). One call instead of one per entry
/// saves most of a small handover's cost (its stream, headers and authentication), which
/// decides how much of a force-deleted node's hot set is out before its SIGKILL. Returns,
/// per entry in order, whether the peer holds it now (an answer missing is a `false`).
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the peer's status for the call as a whole.
pub async fn send_batch(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    entries: &[BatchEntry<'_>],
    incoming: &MetadataMap,
) -> Result<Vec<bool>> {
    let mut client = peers.client_even_if_down(peer, "DoPut")?;
    let mut messages = Vec::new();
    for batch_entry in entries {
        // Integers only: serializing cannot fail (an empty lifetime would be refused).
        let lifetime =
            serde_json::to_vec(&CarriedLifetime::of(&batch_entry.lifetime)).unwrap_or_default();
        let first = messages.len();
        messages.extend(
            batch_entry
                .entry
                .wire_messages()
                .iter()
                .map(|message| message.to_flight_data()),
        );
        if let Some(head) = messages.get_mut(first) {
            head.flight_descriptor = Some(batch_entry.key.to_descriptor());
            head.app_metadata = Bytes::from(lifetime);
        }
    }
    let mut request = outgoing(peers, futures::stream::iter(messages), incoming, sender);
    request
        .metadata_mut()
        .insert(WRITE_HEADER, MetadataValue::from_static(MIGRATION_BATCH));
    let answers = with_deadline(peers, peer, sender.deadline(), async {
        let mut results = client.do_put(request).await?.into_inner();
        let mut answers = Vec::with_capacity(entries.len());
        while let Some(result) = results.message().await? {
            answers.push(result.app_metadata);
        }
        Ok(answers)
    })
    .await?;
    let mut held: Vec<bool> = answers
        .iter()
        .map(|answer| {
            serde_json::from_slice::<BatchEntryAnswer>(answer).is_ok_and(|answer| answer.held)
        })
        .collect();
    held.resize(entries.len(), false);
    Ok(held)
}

/// Asks `peer` for its own entries matching `criteria` (marked forwarded, so it lists
/// locally and does not fan out again), reading at most `max_infos` of them and
/// `max_bytes` of their encodings.
///
/// # Errors
/// [`Error::OwnerUnreachable`] or the peer's status.
pub async fn list_flights(
    peers: &Peers,
    peer: &Peer,
    sender: &Sender,
    criteria: Criteria,
    incoming: &MetadataMap,
    (max_infos, max_bytes): (usize, usize),
) -> Result<Vec<FlightInfo>> {
    let mut client = peers.client(peer, "ListFlights")?;
    with_deadline(peers, peer, sender.deadline(), async {
        let mut infos = client
            .list_flights(outgoing(peers, criteria, incoming, sender))
            .await?
            .into_inner();
        // A member lists within the bounds already; one that sends more is not read past
        // them (its list is sorted by key, so what follows could not be merged in).
        let mut all = Vec::new();
        let mut bytes = 0usize;
        while all.len() < max_infos
            && let Some(info) = infos.message().await?
        {
            bytes = bytes.saturating_add(prost::Message::encoded_len(&info));
            if bytes > max_bytes {
                break;
            }
            all.push(info);
        }
        Ok(all)
    })
    .await
}

/// The messages of a relayed put kept for a replay elsewhere, with the budget they hold;
/// `None` inside once the put outgrew [`REPLAYABLE_PUT_BYTES`] or the budget had no room.
struct ReplayCopies {
    budget: ReplayBudget,
    kept: Option<(Vec<FlightData>, Vec<HeldBudget>)>,
    bytes: usize,
}

impl ReplayCopies {
    /// Copies of a put whose `first` message (kept by the caller) is already read.
    fn new(budget: ReplayBudget, first: &FlightData) -> Self {
        let mut copies = Self {
            budget,
            kept: Some((Vec::new(), Vec::new())),
            bytes: 0,
        };
        copies.reserve(first);
        copies
    }

    /// Reserves `message`'s bytes; false (and nothing kept from then on) when the put
    /// outgrew the limit or the budget has no room.
    fn reserve(&mut self, message: &FlightData) -> bool {
        let size = message.data_header.len() + message.data_body.len();
        self.bytes = self.bytes.saturating_add(size);
        let reservation = (self.bytes <= REPLAYABLE_PUT_BYTES)
            .then(|| self.budget.hold(size as u64))
            .flatten();
        match (&mut self.kept, reservation) {
            (Some((_, reservations)), Some(reservation)) => {
                reservations.push(reservation);
                true
            }
            _ => {
                self.kept = None;
                false
            }
        }
    }

    /// Keeps a copy of `message`, if the put is still kept.
    fn keep(&mut self, message: &FlightData) {
        if self.kept.is_some()
            && self.reserve(message)
            && let Some((messages, _)) = &mut self.kept
        {
            messages.push(message.clone());
        }
    }

    /// The kept messages followed by `rest`, the reservations held until the kept ones
    /// are taken; `None` when nothing could be kept.
    fn replay(self, rest: UploadRest) -> Option<UploadRest> {
        let (messages, reservations) = self.kept?;
        let replayed = futures::stream::iter(messages.into_iter().map(Ok)).map(move |message| {
            // Held until the stream is dropped: the copies leave the budget with it.
            let _held = &reservations;
            message
        });
        Some(replayed.chain(rest).boxed())
    }
}

/// Reads the client's stream into `tx` once the owner has taken the first message
/// (`taken`). Returns the stream unread when the call ended before that.
async fn relay_upload(
    mut rest: UploadRest,
    tx: tokio::sync::mpsc::Sender<FlightData>,
    failed: tokio::sync::oneshot::Sender<Status>,
    taken: tokio::sync::oneshot::Receiver<()>,
    mut kept: ReplayCopies,
) -> Option<UploadRest> {
    if taken.await.is_err() {
        return Some(rest);
    }
    loop {
        let next = tokio::select! {
            // The call ended (the owner answered, or its connection broke) while the
            // client's next message is not here yet.
            () = tx.closed() => return kept.replay(rest),
            next = rest.next() => next,
        };
        match next {
            Some(Ok(message)) => {
                kept.keep(&message);
                if tx.send(message).await.is_err() {
                    return kept.replay(rest);
                }
            }
            // The whole upload was relayed; only a failed call asks for it back.
            None => return kept.replay(futures::stream::empty().boxed()),
            Some(Err(status)) => {
                let _ = failed.send(status);
                tx.closed().await;
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EvictionPolicy, ManualClock, Store, StoreConfig, TtlMode};

    fn budget_of(store: &Arc<Store>) -> ReplayBudget {
        let store = Arc::clone(store);
        ReplayBudget::new(move |bytes| {
            store
                .reserve_intake(bytes)
                .map(|held| Box::new(held) as HeldBudget)
        })
    }

    fn store(budget_bytes: u64) -> Arc<Store> {
        let config = StoreConfig {
            max_entries: 10,
            budget_bytes,
            max_entry_bytes: budget_bytes,
            ttl: Duration::from_secs(60),
            ttl_mode: TtlMode::Absolute,
            eviction: EvictionPolicy::Lru,
        };
        Arc::new(Store::new(config, Arc::new(ManualClock::new())).unwrap())
    }

    fn message(bytes: usize) -> FlightData {
        FlightData {
            data_body: Bytes::from(vec![7u8; bytes]),
            ..FlightData::default()
        }
    }

    fn reserved(store: &Store) -> u64 {
        store.stats().reserved_bytes
    }

    #[tokio::test]
    async fn replay_copies_are_in_the_budget_while_kept_and_leave_it_with_them() {
        let store = store(64 << 20);
        let mut copies = ReplayCopies::new(budget_of(&store), &message(1_000));
        copies.keep(&message(2_000));
        copies.keep(&message(3_000));
        assert_eq!(reserved(&store), 6_000);
        let mut replayed = copies.replay(futures::stream::empty().boxed()).unwrap();
        let first = replayed.next().await.unwrap().unwrap();
        assert_eq!(first.data_body.len(), 2_000);
        assert_eq!(reserved(&store), 6_000, "held until the replay is dropped");
        drop(replayed);
        assert_eq!(reserved(&store), 0);
    }

    #[test]
    fn a_put_past_the_limit_keeps_nothing_and_holds_no_budget() {
        let store = store(64 << 20);
        let mut copies = ReplayCopies::new(budget_of(&store), &message(1_000));
        copies.keep(&message(REPLAYABLE_PUT_BYTES));
        assert_eq!(reserved(&store), 0);
        copies.keep(&message(10));
        assert_eq!(reserved(&store), 0);
        assert!(copies.replay(futures::stream::empty().boxed()).is_none());
    }

    #[test]
    fn without_room_in_the_budget_nothing_is_kept() {
        let store = store(5_000);
        let _other = store.reserve_intake(4_000).unwrap();
        let mut copies = ReplayCopies::new(budget_of(&store), &message(500));
        assert_eq!(reserved(&store), 4_500);
        copies.keep(&message(1_000));
        assert_eq!(
            reserved(&store),
            4_000,
            "the copies gave back what they held"
        );
        assert!(copies.replay(futures::stream::empty().boxed()).is_none());
    }
}
