//! The Flight adapter: decode the request, call the store, encode the answer.
//!
//! Offered: Handshake, DoPut, DoGet, GetFlightInfo, GetSchema, ListFlights, DoAction,
//! ListActions. DoExchange and PollFlightInfo answer UNIMPLEMENTED. Calls arrive
//! authenticated (`crate::auth::AuthLayer` sits in front); every call is timed into the
//! RPC metrics and mapped to a gRPC status in one place (`error.rs`). What involves other
//! members — forwarding to a key's owner, the copies of a key, leases, rebalance and the
//! pool fan-out of `invalidate-prefix`, `clear` and ListFlights — is the cluster layer's
//! (`crate::cluster`): this module calls it and encodes what it answers.
//!
//! Owns: the Flight methods' decode → call → encode. Must not import the wire layer's
//! tower services or raw HTTP bodies (`wire::relay`, `wire::intake`; checked by
//! `scripts/check-layers`) nor check credentials (`crate::auth` does, in front).

pub mod actions;
pub use crate::cluster::fan_out::{MAX_LISTED_BYTES, MAX_LISTED_FLIGHTS};
pub use crate::streams::FlightStream;
pub mod put;

use std::sync::Arc;

use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use arrow_ipc::writer::IpcWriteOptions;
use bytes::Bytes;
use crds::admin::{self, AdminAction as NodeAction};
use crds::node_config::LocationMode;
use futures::StreamExt;
use serde_json::json;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::auth::{Auth, Caller};
use crate::cluster::forward::{self, WriteKind};
use crate::cluster::peers::Peers;
use crate::cluster::{Cluster, ForwardedPut, Upload, lease};
use crate::error::Error;
use crate::key::CacheKey;
use crate::live::LiveConfig;
use crate::metrics::{InvalidationKind, Metrics};
use crate::routing::members::{Route, RoutingTable};
use crate::store::{Entry, IntakeCover, Store};
use crate::streams::UploadRest;
use crate::ticket::CacheTicket;
use crate::wire::hit::StoredHit;
use crate::wire::stall::StallWatch;

/// Largest FlightData message the node sends; keeps every message well under gRPC's
/// default 4 MiB limit whatever the batch size.
pub const MAX_FLIGHT_DATA_BYTES: usize = crate::wire::seal::MAX_MESSAGE_BODY_BYTES;

/// How long a Handshake waits for the client to finish sending after the reply.
const HANDSHAKE_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a Handshake waits for its first message.
pub const HANDSHAKE_FIRST_MESSAGE: std::time::Duration = std::time::Duration::from_secs(10);

/// The Flight service of one cache node.
///
/// Served behind the DoGet relay (`wire::relay::DoGetRelay`, stacked in `server.rs`): a
/// DoGet hit found here is answered with an empty stream carrying a `wire::hit::StoredHit`,
/// which the relay sends as the entry's stored frames.
#[derive(Debug, Clone)]
pub struct FlightCacheService {
    store: Arc<Store>,
    live: Arc<LiveConfig>,
    metrics: Arc<Metrics>,
    auth: Auth,
    cluster: Cluster,
    /// Lets go of a listing whose client stopped reading it (shared with the DoGet relay).
    stalled_readers: StallWatch,
}

impl FlightCacheService {
    /// A service over `store`, calling peers over `peers` (shared with the DoGet relay).
    pub fn new(
        store: Arc<Store>,
        live: Arc<LiveConfig>,
        metrics: Arc<Metrics>,
        auth: Auth,
        routing: Arc<RoutingTable>,
        peers: Peers,
        stalled_readers: StallWatch,
    ) -> Self {
        let cluster = Cluster::new(Arc::clone(&store), Arc::clone(&metrics), routing, peers);
        Self {
            store,
            live,
            metrics,
            auth,
            cluster,
            stalled_readers,
        }
    }

    /// The node's cluster side (forwarding, copies, handover), e.g. for the exit handoff.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Stores a put here: `first` and the rest of `input`, with the lifetime a copy
    /// carries (`copy`), then lets the cluster send a client's own put to the key's other
    /// copies. Stored or refused, the put ends any fill lease on the key.
    async fn store_put(
        &self,
        key: CacheKey,
        first: FlightData,
        input: UploadRest,
        metadata: &MetadataMap,
        copy: Option<WriteKind>,
        cover: Option<Arc<IntakeCover>>,
    ) -> Result<FlightStream<PutResult>, Error> {
        let ingested = match forward::carried_lifetime(metadata, copy) {
            Ok(lifetime) => {
                put::ingest(&self.store, key.clone(), first, input, lifetime, cover).await
            }
            Err(err) => Err(err),
        };
        self.cluster.put_finished(&key);
        let summary = ingested?;
        self.cluster
            .stored(&key, copy, summary.kept_existing, summary.bytes, metadata)
            .await;
        let metadata = admin::encode(&summary);
        let reply = PutResult {
            app_metadata: Bytes::from(metadata),
        };
        Ok(futures::stream::iter([Ok(reply)]).boxed())
    }

    /// Counts an invalidation a client asked of this node (`flightcache_node_invalidations_total`
    /// and `_invalidated_entries_total`): the node it asked counts it once, with what the
    /// pool removed; the calls it fans out or forwards are not counted again.
    fn count_invalidation(&self, action: NodeAction, removed: u64, metadata: &MetadataMap) {
        let kind = match action {
            NodeAction::Invalidate => InvalidationKind::Key,
            NodeAction::InvalidatePrefix => InvalidationKind::Prefix,
            NodeAction::InvalidateTag => InvalidationKind::Tag,
            NodeAction::Clear => InvalidationKind::Clear,
            NodeAction::InvalidateLocal => InvalidationKind::Resource,
            _ => return,
        };
        if forward::forwarded_by(metadata).is_none() {
            self.metrics.invalidated(kind, removed);
        }
    }

    /// A migration batch (`forward::send_batch`): entry after entry, each begun by a
    /// message naming its key and carrying its lifetime, stored as a handover (only where
    /// the key is absent), answered by one `PutResult` per entry in order. An entry's
    /// messages are held until the next entry begins, so a batch takes only small
    /// entries ([`forward::MIGRATION_BATCH_ENTRY_MAX_BYTES`] each) and at most
    /// [`forward::MIGRATION_BATCH_MAX_ENTRIES`]; past either the call fails
    /// INVALID_ARGUMENT (the entries before it stay stored: each is whole).
    async fn store_migration_batch(
        &self,
        first: FlightData,
        key: CacheKey,
        mut input: UploadRest,
        metadata: &MetadataMap,
    ) -> Result<FlightStream<PutResult>, Error> {
        let stream_failed = |status: Status| {
            Error::BadPutStream(format!(
                "the migration batch stream failed: {}",
                status.message()
            ))
        };
        let mut answers = Vec::new();
        let mut next = Some((first, key));
        while let Some((mut head, key)) = next.take() {
            if answers.len() == forward::MIGRATION_BATCH_MAX_ENTRIES {
                return Err(Error::BadPutStream(format!(
                    "a migration batch carries at most {} entries",
                    forward::MIGRATION_BATCH_MAX_ENTRIES
                )));
            }
            let lifetime = forward::CarriedLifetime::decode(&head.app_metadata)?;
            head.app_metadata = Bytes::new();
            let mut bytes = (head.data_header.len() + head.data_body.len()) as u64;
            let mut rest = Vec::new();
            while let Some(message) = input.next().await {
                let message = message.map_err(stream_failed)?;
                if let Some(descriptor) = &message.flight_descriptor {
                    let key = CacheKey::from_descriptor(descriptor)?;
                    next = Some((message, key));
                    break;
                }
                bytes += (message.data_header.len() + message.data_body.len()) as u64;
                if bytes > forward::MIGRATION_BATCH_ENTRY_MAX_BYTES {
                    return Err(Error::BadPutStream(format!(
                        "the entry {key} of a migration batch is larger than {} bytes; \
                         hand it over with a DoPut of its own",
                        forward::MIGRATION_BATCH_ENTRY_MAX_BYTES
                    )));
                }
                rest.push(Ok(message));
            }
            let rest = futures::stream::iter(rest).boxed();
            let ingested = put::ingest(&self.store, key.clone(), head, rest, lifetime, None).await;
            self.cluster.put_finished(&key);
            let answer = match ingested {
                Ok(summary) => {
                    let copy = Some(WriteKind::Migration);
                    self.cluster
                        .stored(&key, copy, summary.kept_existing, summary.bytes, metadata)
                        .await;
                    forward::BatchEntryAnswer {
                        held: true,
                        refused: None,
                    }
                }
                Err(err) => forward::BatchEntryAnswer {
                    held: false,
                    refused: Some(err.to_string()),
                },
            };
            let encoded = serde_json::to_vec(&answer).unwrap_or_default();
            answers.push(Ok(PutResult {
                app_metadata: Bytes::from(encoded),
            }));
        }
        Ok(futures::stream::iter(answers).boxed())
    }

    /// This node's live entries under `prefix` as FlightInfos under their store keys,
    /// sorted by key, the first within the listing bounds (count and bytes).
    fn list_local(&self, prefix: &[u8]) -> Result<Vec<(Bytes, FlightInfo)>, Error> {
        let mut infos = Vec::new();
        let mut bytes = 0usize;
        for (store_key, entry) in self.store.list(prefix, MAX_LISTED_FLIGHTS) {
            let key = CacheKey::try_from_store_bytes(&store_key)?;
            let info = self.flight_info(&key, &entry)?;
            bytes = bytes.saturating_add(prost::Message::encoded_len(&info));
            if bytes > MAX_LISTED_BYTES {
                break;
            }
            infos.push((store_key, info));
        }
        Ok(infos)
    }

    fn flight_info(&self, key: &CacheKey, entry: &Entry) -> Result<FlightInfo, Error> {
        let ticket = CacheTicket::new(key.clone()).encode();
        let mut endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
        // `proxy`: no location, so the client redeems the ticket on the address it asked
        // (a Service, a load balancer) and that node forwards the DoGet.
        if self.live.location_mode() == LocationMode::Direct
            && let Some(address) = self.cluster.routing().self_address()
        {
            endpoint = endpoint.with_location(format!("grpc://{address}"));
        }
        let remaining = entry.expires_at().saturating_sub(self.store.now());
        let metadata = json!({
            "ttlRemainingMs": u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
            "hits": entry.hits(),
        });
        let info = FlightInfo::new()
            .try_with_schema(entry.schema())
            .map_err(|e| Error::Encode(e.into()))?
            .with_descriptor(key.to_descriptor())
            .with_endpoint(endpoint)
            .with_total_records(i64::try_from(entry.total_rows()).unwrap_or(i64::MAX))
            .with_total_bytes(i64::try_from(entry.weight_bytes()).unwrap_or(i64::MAX))
            .with_ordered(true)
            .with_app_metadata(Bytes::from(metadata.to_string()));
        Ok(info)
    }

    fn lookup_for_info(&self, key: &CacheKey) -> Result<Arc<Entry>, Error> {
        self.store
            .peek(&key.to_store_bytes())
            .ok_or_else(|| Error::UnknownKey {
                key: key.to_string(),
            })
    }
}

/// What a DoGet found.
enum DoGetAnswer {
    /// A hit here: the DoGet relay in front sends its stored frames (`wire::hit`).
    Stored(Arc<Entry>),
    /// A peer's answer, relayed message by message.
    Relayed(FlightStream<FlightData>),
}

/// Finishes `timer` with the outcome of `result` and converts errors to a Status.
fn finish<T>(timer: crate::metrics::RpcTimer, result: Result<T, Error>) -> Result<T, Status> {
    match result {
        Ok(value) => {
            timer.finish(Code::Ok);
            Ok(value)
        }
        Err(err) => {
            timer.finish(err.code());
            Err(err.into())
        }
    }
}

/// Records `timer` when `stream` ends: OK at its end, the code of its first error, or
/// CANCELLED (by the timer's drop) when the client goes away mid-stream.
fn timed<T, S>(stream: S, timer: crate::metrics::RpcTimer) -> FlightStream<T>
where
    T: Send + 'static,
    S: futures::Stream<Item = Result<T, Status>> + Send + 'static,
{
    futures::stream::unfold(
        (stream.boxed(), Some(timer)),
        |(mut stream, mut timer)| async move {
            match stream.next().await {
                Some(Ok(item)) => Some((Ok(item), (stream, timer))),
                Some(Err(status)) => {
                    if let Some(timer) = timer.take() {
                        timer.finish(status.code());
                    }
                    Some((Err(status), (stream, timer)))
                }
                None => {
                    if let Some(timer) = timer.take() {
                        timer.finish(Code::Ok);
                    }
                    None
                }
            }
        },
    )
    .boxed()
}

#[tonic::async_trait]
impl FlightService for FlightCacheService {
    type HandshakeStream = FlightStream<HandshakeResponse>;
    type ListFlightsStream = FlightStream<FlightInfo>;
    type DoGetStream = FlightStream<FlightData>;
    type DoPutStream = FlightStream<PutResult>;
    type DoExchangeStream = FlightStream<FlightData>;
    type DoActionStream = FlightStream<arrow_flight::Result>;
    type ListActionsStream = FlightStream<ActionType>;

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "Handshake"))]
    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let timer = self.metrics.rpc("Handshake");
        let metadata = request.metadata().clone();
        let mut input = request.into_inner();
        // The first message (it may carry the token) within a deadline: a Handshake runs
        // before authentication, and an open one must not wait forever.
        let first = match tokio::time::timeout(HANDSHAKE_FIRST_MESSAGE, input.message()).await {
            // A body error (e.g. the Handshake size limit) is the call's answer.
            Ok(message) => match message {
                Ok(message) => message.unwrap_or_default(),
                Err(status) => {
                    timer.finish(status.code());
                    return Err(status);
                }
            },
            Err(_) => {
                timer.finish(tonic::Code::DeadlineExceeded);
                return Err(Status::deadline_exceeded(format!(
                    "no HandshakeRequest within {} s",
                    HANDSHAKE_FIRST_MESSAGE.as_secs()
                )));
            }
        };
        let result = self
            .auth
            .handshake(&metadata, &first.payload)
            .map(move |header| {
                let reply = HandshakeResponse {
                    protocol_version: first.protocol_version,
                    payload: header
                        .as_deref()
                        .and_then(|h| h.strip_prefix("Bearer "))
                        .map(|t| Bytes::copy_from_slice(t.as_bytes()))
                        .unwrap_or_default(),
                };
                // The call stays open until the client has finished sending (its
                // half-close, bounded by HANDSHAKE_DRAIN): a server that ends the call
                // first races the client's close of its side, which clients such as
                // pyarrow then report as a failed handshake.
                let until_client_done = futures::stream::once(async move {
                    let drain = async { while let Ok(Some(_)) = input.message().await {} };
                    let _ = tokio::time::timeout(HANDSHAKE_DRAIN, drain).await;
                    None
                })
                .filter_map(futures::future::ready);
                let stream: Self::HandshakeStream = futures::stream::iter([Ok(reply)])
                    .chain(until_client_done)
                    .boxed();
                let mut response = Response::new(stream);
                if let Some(value) = header.and_then(|h| h.parse().ok()) {
                    response
                        .metadata_mut()
                        .insert(crate::headers::AUTHORIZATION_HEADER, value);
                }
                response
            });
        finish(timer, result)
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "ListFlights"))]
    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let timer = self.metrics.rpc("ListFlights");
        let result = async {
            let expression = &request.get_ref().expression;
            let prefix = if expression.is_empty() {
                Bytes::new()
            } else {
                let text = std::str::from_utf8(expression).map_err(|_| {
                    Error::BadDescriptor("ListFlights criteria must be a UTF-8 path prefix".into())
                })?;
                CacheKey::path_prefix_store_bytes(text)
            };
            let mut infos = self
                .cluster
                .list_pool(request.get_ref(), request.metadata(), || {
                    self.list_local(&prefix)
                })
                .await?;
            // As for GetFlightInfo: in proxy mode clients come back here, whatever the
            // listing member's own mode says.
            if self.live.location_mode() == LocationMode::Proxy {
                for info in &mut infos {
                    for endpoint in &mut info.endpoint {
                        endpoint.location.clear();
                    }
                }
            }
            // Sent as the client reads; one that stops reading for --max-read-stall
            // no longer holds the infos left (up to MAX_LISTED_BYTES).
            let let_go = Status::deadline_exceeded(format!(
                "the listing was not read for {} s; the node let go of it",
                self.stalled_readers.max_stall().as_secs()
            ));
            Ok(Response::new(
                self.stalled_readers.stream(infos, let_go).boxed(),
            ))
        }
        .await;
        finish(timer, result)
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "GetFlightInfo"))]
    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let timer = self.metrics.rpc("GetFlightInfo");
        let result = async {
            let key = CacheKey::from_descriptor(request.get_ref())?;
            let mut info = self
                .cluster
                .read_copies(
                    &key,
                    request.metadata(),
                    || self.flight_info(&key, &*self.lookup_for_info(&key)?),
                    |peer, sender| {
                        let descriptor = request.get_ref().clone();
                        let (peers, metadata) = (self.cluster.peers(), request.metadata());
                        async move {
                            forward::get_flight_info(peers, &peer, &sender, descriptor, metadata)
                                .await
                        }
                    },
                )
                .await?;
            // The node the client asked decides: in proxy mode the client must come back
            // here whatever the owner's own mode says.
            if self.live.location_mode() == LocationMode::Proxy {
                for endpoint in &mut info.endpoint {
                    endpoint.location.clear();
                }
            }
            Ok(info)
        }
        .await;
        finish(timer, result.map(Response::new))
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "PollFlightInfo"))]
    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        let timer = self.metrics.rpc("PollFlightInfo");
        finish(
            timer,
            Err(Error::Unimplemented("PollFlightInfo (use GetFlightInfo)")),
        )
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "GetSchema"))]
    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let timer = self.metrics.rpc("GetSchema");
        let result = async {
            let key = CacheKey::from_descriptor(request.get_ref())?;
            self.cluster
                .read_copies(
                    &key,
                    request.metadata(),
                    || {
                        let entry = self.lookup_for_info(&key)?;
                        let options = IpcWriteOptions::default();
                        let schema = SchemaAsIpc::new(entry.schema(), &options);
                        SchemaResult::try_from(schema).map_err(|e| Error::Encode(e.into()))
                    },
                    |peer, sender| {
                        let descriptor = request.get_ref().clone();
                        let (peers, metadata) = (self.cluster.peers(), request.metadata());
                        async move {
                            forward::get_schema(peers, &peer, &sender, descriptor, metadata).await
                        }
                    },
                )
                .await
        }
        .await;
        finish(timer, result.map(Response::new))
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "DoGet"))]
    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let mut timer = self.metrics.rpc("DoGet");
        let (metadata, _, ticket) = request.into_parts();
        // Set when a peer's copy answered, so the hit is counted as forwarded.
        let relayed = std::sync::atomic::AtomicBool::new(false);
        let result = async {
            let key = CacheTicket::try_decode(&ticket.ticket)?.key;
            // A read for what this node holds (a peer's previous-holder read) neither
            // counts as a hit or miss here nor touches recency: the peer's client sees one
            // read, counted where it asked.
            let held = forward::is_held_read(&metadata);
            let read = self
                .cluster
                .read_copies(
                    &key,
                    &metadata,
                    || {
                        let store_key = key.to_store_bytes();
                        let entry = if held {
                            self.store.peek(&store_key)
                        } else {
                            self.store.get(&store_key)
                        };
                        let entry = entry.ok_or_else(|| Error::UnknownKey {
                            key: key.to_string(),
                        })?;
                        Ok(DoGetAnswer::Stored(entry))
                    },
                    |peer, sender| {
                        let ticket = ticket.clone();
                        let (peers, metadata) = (self.cluster.peers(), &metadata);
                        let relayed = &relayed;
                        async move {
                            let stream =
                                forward::do_get(peers, &peer, &sender, ticket, metadata).await?;
                            relayed.store(true, std::sync::atomic::Ordering::Relaxed);
                            Ok(DoGetAnswer::Relayed(stream))
                        }
                    },
                )
                .await;
            if read.is_ok() && held && forward::wants_a_copy(&metadata) {
                self.cluster.send_a_copy_back(&key, &metadata);
            }
            match read {
                Err(Error::UnknownKey { .. })
                    if lease::coalescing(&metadata)
                        && matches!(self.cluster.route(&key, &metadata), Ok(Route::Local)) =>
                {
                    let entry = self.cluster.coalesce_miss(&key).await?;
                    Ok(DoGetAnswer::Stored(entry))
                }
                other => other,
            }
        }
        .await;
        if relayed.load(std::sync::atomic::Ordering::Relaxed) {
            timer.set_forwarded();
        }
        match result {
            Ok(DoGetAnswer::Relayed(stream)) => Ok(Response::new(timed(stream, timer))),
            Ok(DoGetAnswer::Stored(entry)) => {
                // The relay in front sends the entry's stored frames and records the RPC.
                let mut response = Response::new(futures::stream::empty().boxed());
                response
                    .extensions_mut()
                    .insert(StoredHit::new(entry, timer));
                Ok(response)
            }
            Err(err) => finish(timer, Err(err)),
        }
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "DoPut"))]
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let timer = self.metrics.rpc("DoPut");
        let (metadata, extensions, input) = request.into_parts();
        // Whether the wire layer reserved every message's bytes as they arrived.
        let cover = extensions.get::<Arc<IntakeCover>>().cloned();
        let result = async {
            let mut input = put::restored(input, cover.clone());
            let (first, key) = put::read_first(&mut input).await?;
            // A copy (replica write, handover) is stored here, never forwarded again.
            let copy = forward::write_kind(&metadata);
            let stopping = self.cluster.is_stopping();
            if forward::is_migration_batch(&metadata) || copy == Some(WriteKind::Migration) {
                self.cluster.refuse_outdated_handoff(&metadata)?;
            }
            if forward::is_migration_batch(&metadata) {
                if stopping {
                    return Err(Error::Stopping);
                }
                return self
                    .store_migration_batch(first, key, input, &metadata)
                    .await;
            }
            if copy.is_some() && stopping {
                return Err(Error::Stopping);
            }
            let route = match copy {
                Some(_) => Route::Local,
                None => self.cluster.route(&key, &metadata)?,
            };
            match route {
                Route::Local if stopping => {
                    let sent_on = self
                        .cluster
                        .put_while_stopping(&key, first, input, &metadata)
                        .await?;
                    match sent_on {
                        ForwardedPut::Relayed(answer) => Ok(answer),
                        ForwardedPut::StoreHere(upload) => {
                            let Upload { first, rest } = *upload;
                            self.store_put(key, first, rest, &metadata, None, cover)
                                .await
                        }
                    }
                }
                Route::Local => {
                    self.store_put(key, first, input, &metadata, copy, cover)
                        .await
                }
                Route::Forward(peer) => {
                    let forwarded = self
                        .cluster
                        .forward_put(&key, &peer, first, input, &metadata)
                        .await?;
                    match forwarded {
                        ForwardedPut::Relayed(answer) => Ok(answer),
                        ForwardedPut::StoreHere(upload) => {
                            let Upload { first, rest } = *upload;
                            let copy = Some(WriteKind::Fallback);
                            // Part of the stream went to the owner first: charge every
                            // message as the put receives it.
                            self.store_put(key, first, rest, &metadata, copy, None)
                                .await
                        }
                    }
                }
            }
        }
        .await;
        finish(timer, result.map(Response::new))
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "DoExchange"))]
    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        let timer = self.metrics.rpc("DoExchange");
        finish(timer, Err(Error::Unimplemented("DoExchange")))
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "DoAction"))]
    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let timer = self.metrics.rpc("DoAction");
        let result = async {
            let (action, metadata) = (request.get_ref(), request.metadata());
            let kind = actions::parse(&action.r#type)?;
            // The auth layer identified the caller; without it (a service built alone) the
            // caller has a client's rights.
            let caller = request
                .extensions()
                .get::<Caller>()
                .copied()
                .unwrap_or(Caller::Client);
            self.auth.authorize_action(caller, kind)?;
            if kind == NodeAction::Held && self.cluster.is_stopping() {
                // A rebalance removes what its owners hold: a stopping node holds
                // nothing for long.
                return Err(Error::Stopping);
            }
            let routing = self.cluster.routing();
            let body = match kind {
                NodeAction::Ping => actions::ping(),
                NodeAction::Invalidate => {
                    let key = actions::key_from_body(kind, &action.body)?;
                    // Routed first: a call for a key this node cannot route fails here.
                    self.cluster.route(&key, metadata)?;
                    let removed = self
                        .cluster
                        .invalidate_copies(&key, action, metadata)
                        .await?;
                    self.count_invalidation(kind, u64::from(removed), metadata);
                    Bytes::from(admin::encode(&admin::InvalidateAnswer { removed }))
                }
                NodeAction::Lease => {
                    let key = actions::key_from_body(kind, &action.body)?;
                    match self.cluster.route(&key, metadata)? {
                        Route::Local => Bytes::from(admin::encode(&self.cluster.lease(&key).await)),
                        Route::Forward(peer) => {
                            self.cluster
                                .forward_action(&peer, action.clone(), metadata)
                                .await?
                        }
                    }
                }
                NodeAction::InvalidatePrefix | NodeAction::InvalidateTag | NodeAction::Clear => {
                    let here = actions::remove_here(kind, &action.body, &self.store)?;
                    let elsewhere = self.cluster.remove_elsewhere(action, metadata).await?;
                    let removed = here + elsewhere;
                    self.count_invalidation(kind, removed, metadata);
                    Bytes::from(admin::encode(&admin::RemovedAnswer { removed }))
                }
                NodeAction::Rebalance => {
                    let request =
                        admin::RebalanceRequest::from_body(&action.body).map_err(|err| {
                            Error::BadActionBody {
                                action: kind.as_str(),
                                reason: format!(
                                    "{err}; send JSON like {{\"dryRun\": true, \"limit\": 100}}"
                                ),
                            }
                        })?;
                    let report = self.cluster.rebalance(request, metadata).await;
                    Bytes::from(admin::encode(&report))
                }
                NodeAction::Stats => {
                    let millis =
                        |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                    let answer = admin::StatsAnswer {
                        uptime_ms: Some(millis(self.cluster.uptime())),
                        last_rebalance_ms_ago: self.cluster.last_rebalance_ago().map(millis),
                        holds_strays: self.cluster.holds_strays(),
                        owes_handover: self.cluster.owes_handover(),
                        tls: self.cluster.peers().tls_in_use(),
                        peers_skipped: u64::try_from(self.cluster.peers().skipped_now())
                            .unwrap_or(u64::MAX),
                        ..actions::node_stats(&self.store, &self.live, routing)
                    };
                    Bytes::from(admin::encode(&answer))
                }
                NodeAction::Configure => {
                    actions::configure(&action.body, &self.live, routing, &self.store)?
                }
                NodeAction::Topology => actions::topology(routing),
                NodeAction::Held => actions::held(&action.body, &self.store)?,
                NodeAction::InvalidateLocal => {
                    let removed = actions::invalidate_local(&action.body, &self.store)?;
                    self.count_invalidation(kind, removed, metadata);
                    Bytes::from(admin::encode(&admin::RemovedAnswer { removed }))
                }
            };
            let reply = arrow_flight::Result { body };
            Ok(futures::stream::iter([Ok(reply)]).boxed())
        }
        .await;
        finish(timer, result.map(Response::new))
    }

    #[tracing::instrument(name = "rpc", skip_all, fields(rpc.method = "ListActions"))]
    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let timer = self.metrics.rpc("ListActions");
        let types = NodeAction::ALL.into_iter().map(|action| {
            Ok(ActionType {
                r#type: action.as_str().to_owned(),
                description: action.description().to_owned(),
            })
        });
        let response = Response::new(futures::stream::iter(types.collect::<Vec<_>>()).boxed());
        finish(timer, Ok(response))
    }
}
