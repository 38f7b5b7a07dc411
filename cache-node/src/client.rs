//! A ring-aware Rust client: it fetches the ring from any node (the `topology` action),
//! sends each key's calls straight to the owner, and refreshes the ring and retries once
//! when a call fails with UNAVAILABLE (owner gone, ring changed). Connections are pooled:
//! one lazily connected HTTP/2 channel per member address.
//!
//! Without a topology on the node (a single node) every call goes to the seed address.
//! Does network I/O; no state beyond the ring and the channels.
//!
//! ```no_run
//! # async fn demo(batches: Vec<arrow_array::RecordBatch>) -> Result<(), cache_node::client::ClientError> {
//! use arrow_flight::FlightDescriptor;
//! let client = cache_node::client::RingClient::connect("127.0.0.1:50051", None).await?;
//! let key = FlightDescriptor::new_path(vec!["reports".into(), "daily".into()]);
//! client.put(key.clone(), batches).await?;
//! let got = client.get(&key).await?;
//! # Ok(()) }
//! ```
//!
//! Owns: the client side only (ring refresh, one channel per member, the retry). It
//! shares the ticket format (`crate::ticket`), keys and the ring (`routing::members`)
//! with the node, and takes only the message-size limit from `flight/`; must not import
//! the node's server side (the Flight service, `wire/`, `cluster/`, `store/`,
//! `server.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{Action, FlightClient, FlightDescriptor, Ticket};
use bytes::Bytes;
use crds::admin::{self, AdminAction, InvalidateAnswer, LeaseAnswer, PutAnswer, TopologyAnswer};
use crds::node_config::Topology;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::flight::MAX_FLIGHT_DATA_BYTES;
use crate::headers::PREVIOUS_ATTEMPTS_HEADER;
use crate::key::CacheKey;
use crate::routing::members::Membership;
use crate::ticket::CacheTicket;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a call failed before any server processed it, so sending it once more cannot
/// run it twice: gRPC's transparent retry (gRFC A6), which grpc-core (pyarrow), grpc-java
/// and grpc-go do inside the library and tonic does not. Three cases, all decided by
/// HTTP/2 itself:
/// - the server's GOAWAY names a last stream below this call's (RFC 9113 §6.8: "streams
///   ... with identifiers higher than the last stream identifier were not processed"),
///   or the call was started on a connection that had already received a GOAWAY — what
///   a client sees when the pod behind a Service stops gracefully under load (tonic
///   reports it as INTERNAL "h2 protocol error: http2 error");
/// - the server refused the stream (RST_STREAM REFUSED_STREAM, §8.7);
/// - hyper canceled the call because its connection closed before the call was sent.
///
/// Answers, deadlines, resets of processed streams and broken connections are never in
/// this set.
pub fn never_reached_the_server(err: &FlightError) -> bool {
    let FlightError::Tonic(status) = err else {
        return false;
    };
    if never_left_the_client(err) {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> =
        std::error::Error::source(&**status);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && (h2.is_go_away()
                    || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)));
        }
        source = err.source();
    }
    false
}

/// Tries in all for a call that never left the client (hyper canceled it before writing
/// it because its connection was closing: no server saw it, and the next try may meet the
/// same closing connection). gRFC A6 retries such calls without a count limit, within
/// the deadline; a few suffice here.
pub const UNSENT_CALL_ATTEMPTS: u32 = 3;

/// Whether a call that failed with `err` on try `attempt` (from 1) is sent once more, as
/// gRPC's transparent retry does (gRFC A6): one that never left the client up to
/// [`UNSENT_CALL_ATTEMPTS`] tries, one the server received but did not process (GOAWAY,
/// REFUSED_STREAM) once. Nothing else: answers, deadlines and broken calls are failures.
pub fn retry_unprocessed(err: &FlightError, attempt: u32) -> bool {
    if never_left_the_client(err) {
        return attempt < UNSENT_CALL_ATTEMPTS;
    }
    attempt == 1 && never_reached_the_server(err)
}

/// Tries in all for a call whose connection was lost under it ([`connection_lost`]).
/// Five, the most a gRPC service config's `retryPolicy` allows: behind a Service each try
/// connects anew, and kube-proxy may pick the dead pod again until its endpoint is gone.
pub const LOST_CONNECTION_ATTEMPTS: u32 = 5;

/// The pause before try `attempt + 1` of a call whose connection was lost: 50 ms doubling
/// to at most 400 ms (so the tries span ~0.75 s, the time kube-proxy needs to forget a
/// crashed pod), as a `retryPolicy` with `initialBackoff: 0.05s`, `backoffMultiplier: 2`,
/// `maxBackoff: 0.4s` waits (gRPC-core draws it at random below that bound).
pub fn lost_connection_backoff(attempt: u32) -> Duration {
    Duration::from_millis(50 << attempt.saturating_sub(1).min(3))
}

/// Whether a call failed because its connection was lost before the call completed: the
/// status was made up by this client (no response metadata: no server answered), not a
/// deadline. A process that crashed under the call (connection reset), hung under it (the
/// HTTP/2 keepalive ended the connection) or cannot be connected to (refused). The cache's
/// calls are idempotent (a read changes nothing; a put stores the key's value, once or
/// twice alike), so such a call may be sent again on a fresh connection: what a gRPC
/// service config's `retryPolicy` for UNAVAILABLE does in gRPC-core (pyarrow), grpc-java
/// and grpc-go (docs/failure-model.md, "Client settings"). A server's own answer,
/// UNAVAILABLE included, is never in this set.
pub fn connection_lost(err: &FlightError) -> bool {
    match err {
        FlightError::Tonic(status) => {
            status.metadata().is_empty() && status.code() != Code::DeadlineExceeded
        }
        _ => false,
    }
}

/// Whether the call failed because its connection was refused (nothing listens there: a
/// process that died, not yet replaced): the call never left the client, so — as gRPC
/// does for a call that waits for a connection — it may be tried until its deadline, not
/// only [`LOST_CONNECTION_ATTEMPTS`] times.
pub fn connection_refused(err: &FlightError) -> bool {
    let FlightError::Tonic(status) = err else {
        return false;
    };
    if !status.metadata().is_empty() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> =
        std::error::Error::source(&**status);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = err.source();
    }
    false
}

fn is_unavailable(err: &FlightError) -> bool {
    matches!(err, FlightError::Tonic(status) if status.code() == Code::Unavailable)
}

/// Whether hyper canceled the call before writing it (its connection was closing).
fn never_left_the_client(err: &FlightError) -> bool {
    matches!(err, FlightError::Tonic(status)
        if status.code() == Code::Cancelled && status.message().contains("operation was canceled"))
}

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The descriptor names no usable key.
    #[error("bad key: {0}")]
    BadKey(String),
    /// An address that is not `host:port`.
    #[error("bad address '{0}'")]
    BadAddress(String),
    /// The `topology` answer could not be read.
    #[error("cannot read the topology from {address}: {reason}")]
    Topology {
        /// The node asked.
        address: String,
        /// Why.
        reason: String,
    },
    /// The call failed (the node's gRPC status is inside).
    #[error("flight call to {address} failed")]
    Flight {
        /// The node called.
        address: String,
        /// The error.
        #[source]
        source: FlightError,
    },
}

impl ClientError {
    /// The gRPC code of a failed call, if it got that far.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Flight {
                source: FlightError::Tonic(status),
                ..
            } => Some(status.code()),
            _ => None,
        }
    }
}

/// A client that routes every key to its owner.
#[derive(Debug)]
pub struct RingClient {
    seed: String,
    token: Option<String>,
    membership: Mutex<Option<Arc<Membership>>>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl RingClient {
    /// Connects through `seed` (`host:port` of any node) and fetches the ring.
    ///
    /// # Errors
    /// [`ClientError`] when the seed cannot be reached or answers no topology.
    pub async fn connect(seed: &str, token: Option<String>) -> Result<Self, ClientError> {
        let client = Self {
            seed: seed.to_owned(),
            token,
            membership: Mutex::new(None),
            channels: Mutex::new(HashMap::new()),
        };
        client.refresh().await?;
        Ok(client)
    }

    /// Fetches the ring again (from the seed, else from any known member) and returns
    /// its version; an older ring than the one held is ignored.
    ///
    /// # Errors
    /// [`ClientError`] when no node answers.
    pub async fn refresh(&self) -> Result<u64, ClientError> {
        let mut candidates = vec![self.seed.clone()];
        if let Some(current) = self.membership.lock().clone() {
            candidates.extend(current.topology().members.iter().map(|m| m.address.clone()));
        }
        let mut last_error = None;
        for address in candidates {
            match self.fetch_topology(&address).await {
                Ok(Some(topology)) => {
                    let next = Membership::new(topology).map_err(|err| ClientError::Topology {
                        address: address.clone(),
                        reason: err.to_string(),
                    })?;
                    let mut current = self.membership.lock();
                    let newer = current
                        .as_ref()
                        .is_none_or(|m| m.ring().version() < next.ring().version());
                    if newer {
                        *current = Some(Arc::new(next));
                    }
                    return Ok(current.as_ref().map_or(0, |m| m.ring().version()));
                }
                Ok(None) => return Ok(0),
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| ClientError::BadAddress(self.seed.clone())))
    }

    /// The ring version the client routes by (0: no topology, all calls to the seed).
    pub fn ring_version(&self) -> u64 {
        self.membership
            .lock()
            .as_ref()
            .map_or(0, |m| m.ring().version())
    }

    /// The address calls for `descriptor` go to.
    ///
    /// # Errors
    /// [`ClientError::BadKey`].
    pub fn address_for(&self, descriptor: &FlightDescriptor) -> Result<String, ClientError> {
        let key = CacheKey::from_descriptor(descriptor)
            .map_err(|err| ClientError::BadKey(err.to_string()))?;
        Ok(self.address_for_key(&key))
    }

    fn address_for_key(&self, key: &CacheKey) -> String {
        let membership = self.membership.lock().clone();
        membership
            .and_then(|m| {
                let owner = m.ring().owner(&key.to_store_bytes())?.clone();
                m.peer(&owner).map(|peer| peer.address)
            })
            .unwrap_or_else(|| self.seed.clone())
    }

    /// Stores `batches` under `descriptor` on its owner; returns what the node stored.
    ///
    /// # Errors
    /// [`ClientError`] (also for an answer without the contract's [`PutAnswer`]);
    /// UNAVAILABLE is retried once after a ring refresh.
    pub async fn put(
        &self,
        descriptor: FlightDescriptor,
        batches: Vec<RecordBatch>,
    ) -> Result<PutAnswer, ClientError> {
        let key = CacheKey::from_descriptor(&descriptor)
            .map_err(|err| ClientError::BadKey(err.to_string()))?;
        let schema = batches
            .first()
            .map(RecordBatch::schema)
            .ok_or_else(|| ClientError::BadKey("a put needs at least one batch".into()))?;
        self.with_retry(&key, |mut client| {
            let stream = FlightDataEncoderBuilder::new()
                .with_schema(schema.clone())
                .with_max_flight_data_size(MAX_FLIGHT_DATA_BYTES)
                .with_flight_descriptor(Some(descriptor.clone()))
                .build(futures::stream::iter(batches.clone().into_iter().map(Ok)));
            async move {
                let results: Vec<_> = client.do_put(stream).await?.try_collect().await?;
                let result = results
                    .first()
                    .ok_or_else(|| FlightError::protocol("the DoPut answer has no PutResult"))?;
                serde_json::from_slice::<PutAnswer>(&result.app_metadata)
                    .map_err(|err| FlightError::ExternalError(Box::new(err)))
            }
        })
        .await
    }

    /// Reads the entry under `descriptor` from its owner (NOT_FOUND on a miss). With
    /// `replicas: 2`, an owner still unreachable after the ring refresh is skipped: the
    /// read goes to the key's second choice, which serves its copy.
    ///
    /// # Errors
    /// [`ClientError`]; UNAVAILABLE is retried once after a ring refresh.
    pub async fn get(
        &self,
        descriptor: &FlightDescriptor,
    ) -> Result<Vec<RecordBatch>, ClientError> {
        let key = CacheKey::from_descriptor(descriptor)
            .map_err(|err| ClientError::BadKey(err.to_string()))?;
        let ticket = Ticket::new(CacheTicket::new(key.clone()).encode());
        let result = self
            .with_retry(&key, |mut client| {
                let ticket = ticket.clone();
                async move { client.do_get(ticket).await?.try_collect().await }
            })
            .await;
        match result {
            Err(err) if err.code() == Some(Code::Unavailable) => {
                let Some(address) = self.second_choice(&key) else {
                    return Err(err);
                };
                tracing::debug!(%address, "owner unavailable; reading the second copy");
                let mut client = self.flight_client(&address)?;
                let read = async { client.do_get(ticket).await?.try_collect().await };
                read.await
                    .map_err(|source| ClientError::Flight { address, source })
            }
            other => other,
        }
    }

    /// The address of `key`'s second choice when the ring keeps two copies.
    fn second_choice(&self, key: &CacheKey) -> Option<String> {
        let membership = self.membership.lock().clone()?;
        let owners = membership.owners(&key.to_store_bytes());
        let second = owners.get(1)?;
        membership.peer(second).map(|peer| peer.address)
    }

    /// Removes the entry under `descriptor` on its owner; true if there was one.
    ///
    /// # Errors
    /// [`ClientError`]; UNAVAILABLE is retried once after a ring refresh.
    pub async fn invalidate(&self, descriptor: &FlightDescriptor) -> Result<bool, ClientError> {
        let key = CacheKey::from_descriptor(descriptor)
            .map_err(|err| ClientError::BadKey(err.to_string()))?;
        let body = CacheTicket::new(key.clone()).encode();
        let answer = self
            .with_retry(&key, |mut client| {
                let action = Action::new(AdminAction::Invalidate.as_str(), body.clone());
                async move { first_body(client.do_action(action).await?).await }
            })
            .await?;
        // An answer that is not the contract's counts as nothing removed.
        let answer = admin::decode::<InvalidateAnswer>(AdminAction::Invalidate, &answer);
        Ok(answer.is_ok_and(|answer| answer.removed))
    }

    /// Asks the owner for a fill lease on a missing key (miss coalescing): the answer is
    /// [`LeaseAnswer::Granted`] (run the query and [`RingClient::put`]),
    /// [`LeaseAnswer::Filled`] or [`LeaseAnswer::Hit`] ([`RingClient::get`]) or
    /// [`LeaseAnswer::Timeout`].
    ///
    /// # Errors
    /// [`ClientError`] (also for an answer that is not a [`LeaseAnswer`]); UNAVAILABLE is
    /// retried once after a ring refresh.
    pub async fn lease(&self, descriptor: &FlightDescriptor) -> Result<LeaseAnswer, ClientError> {
        let key = CacheKey::from_descriptor(descriptor)
            .map_err(|err| ClientError::BadKey(err.to_string()))?;
        let body = CacheTicket::new(key.clone()).encode();
        self.with_retry(&key, |mut client| {
            let action = Action::new(AdminAction::Lease.as_str(), body.clone());
            async move {
                let answer = first_body(client.do_action(action).await?).await?;
                admin::decode::<LeaseAnswer>(AdminAction::Lease, &answer)
                    .map_err(|err| FlightError::ExternalError(Box::new(err)))
            }
        })
        .await
    }

    async fn with_retry<T, F, Fut>(&self, key: &CacheKey, call: F) -> Result<T, ClientError>
    where
        F: Fn(FlightClient) -> Fut,
        Fut: Future<Output = Result<T, FlightError>>,
    {
        let address = self.address_for_key(key);
        let mut attempt = 1;
        let mut first = call(self.flight_client(&address)?).await;
        while matches!(&first, Err(err) if retry_unprocessed(err, attempt)) {
            attempt += 1;
            first = call(self.retry_client(&address, attempt)?).await;
        }
        match first {
            // The owner answered UNAVAILABLE (it is not the key's owner any more, or
            // cannot reach the copy it needs), or its connection was lost under the call.
            Err(err) if is_unavailable(&err) || connection_lost(&err) => {
                tracing::debug!(%address, %err, "routing error; refreshing the ring");
                // The ring may have changed; if not, the retry goes to the same owner.
                if self.refresh().await.is_err() {
                    return Err(ClientError::Flight {
                        address,
                        source: err,
                    });
                }
                let address = self.address_for_key(key);
                call(self.retry_client(&address, attempt + 1)?)
                    .await
                    .map_err(|source| ClientError::Flight { address, source })
            }
            other => other.map_err(|source| ClientError::Flight { address, source }),
        }
    }

    async fn fetch_topology(&self, address: &str) -> Result<Option<Topology>, ClientError> {
        let mut client = self.flight_client(address)?;
        let topology = Action::new(AdminAction::Topology.as_str(), "");
        let body = async { first_body(client.do_action(topology).await?).await }
            .await
            .map_err(|source| ClientError::Flight {
                address: address.to_owned(),
                source,
            })?;
        let bad = |reason: String| ClientError::Topology {
            address: address.to_owned(),
            reason,
        };
        let answer: TopologyAnswer =
            admin::decode(AdminAction::Topology, &body).map_err(|err| bad(crds::chain(&err)))?;
        if answer.version == 0 {
            return Ok(None);
        }
        let replicas = u8::try_from(answer.replicas).map_err(|err| bad(err.to_string()))?;
        Ok(Some(Topology {
            version: answer.version,
            replicas,
            members: answer.members,
        }))
    }

    /// A client for try `attempt` (from 2) of a call: it says how many tries came before
    /// (`grpc-previous-rpc-attempts`, gRFC A6), so the node counts the retry.
    fn retry_client(&self, address: &str, attempt: u32) -> Result<FlightClient, ClientError> {
        let mut client = self.flight_client(address)?;
        client
            .metadata_mut()
            .insert(PREVIOUS_ATTEMPTS_HEADER, (attempt - 1).into());
        Ok(client)
    }

    fn flight_client(&self, address: &str) -> Result<FlightClient, ClientError> {
        let channel = {
            let mut channels = self.channels.lock();
            match channels.get(address) {
                Some(channel) => channel.clone(),
                None => {
                    let channel = Endpoint::from_shared(format!("http://{address}"))
                        .map_err(|_| ClientError::BadAddress(address.to_owned()))?
                        .connect_timeout(CONNECT_TIMEOUT)
                        .tcp_nodelay(true)
                        .connect_lazy();
                    channels.insert(address.to_owned(), channel.clone());
                    channel
                }
            }
        };
        let mut client = FlightClient::new(channel);
        if let Some(token) = &self.token {
            client
                .add_header(
                    crate::headers::AUTHORIZATION_HEADER,
                    &format!("Bearer {token}"),
                )
                .map_err(|source| ClientError::Flight {
                    address: address.to_owned(),
                    source,
                })?;
        }
        Ok(client)
    }
}

async fn first_body(
    mut results: futures::stream::BoxStream<'static, Result<Bytes, FlightError>>,
) -> Result<Bytes, FlightError> {
    results.next().await.unwrap_or(Ok(Bytes::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// How the one-connection HTTP/2 server below treats the DoGet it is sent.
    #[derive(Clone, Copy)]
    enum Server {
        /// GOAWAY naming no processed stream, before reading any request.
        GoesAwayFirst,
        /// RST_STREAM with this reason once it has read the request.
        Resets(h2::Reason),
        /// A gRPC answer: trailers-only NOT_FOUND.
        AnswersNotFound,
        /// A gRPC answer: trailers-only UNAVAILABLE.
        AnswersUnavailable,
        /// Closes the connection once it has read the request (the process died).
        Dies,
    }

    /// A DoGet from a real Flight client against a raw HTTP/2 server behaving as `server`.
    async fn do_get_against(server: Server) -> FlightError {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let serve = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut connection = h2::server::handshake(socket).await.unwrap();
            if let Server::GoesAwayFirst = server {
                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
            }
            while let Some(Ok((_request, mut respond))) = connection.accept().await {
                let status = match server {
                    Server::GoesAwayFirst | Server::Resets(_) | Server::Dies => None,
                    Server::AnswersNotFound => Some(("5", "no entry")),
                    Server::AnswersUnavailable => Some(("14", "cannot reach the owner")),
                };
                match server {
                    Server::GoesAwayFirst => {}
                    Server::Resets(reason) => respond.send_reset(reason),
                    Server::Dies => return,
                    Server::AnswersNotFound | Server::AnswersUnavailable => {
                        let (code, message) = status.unwrap();
                        let answer = tonic::codegen::http::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", code)
                            .header("grpc-message", message)
                            .body(())
                            .unwrap();
                        respond.send_response(answer, true).unwrap();
                    }
                }
            }
        });
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect_lazy();
        let mut client = FlightClient::new(channel);
        let result = async {
            client
                .do_get(Ticket::new("k"))
                .await?
                .try_collect::<Vec<_>>()
                .await
        };
        let err = result.await.expect_err("the server answers no data");
        drop(client);
        serve.abort();
        err
    }

    #[tokio::test]
    async fn a_call_above_the_servers_goaway_never_reached_it() {
        let err = do_get_against(Server::GoesAwayFirst).await;
        assert!(
            never_reached_the_server(&err),
            "not seen as unprocessed: {err:?}"
        );
    }

    #[tokio::test]
    async fn a_refused_stream_never_reached_the_server() {
        let err = do_get_against(Server::Resets(h2::Reason::REFUSED_STREAM)).await;
        assert!(
            never_reached_the_server(&err),
            "not seen as unprocessed: {err:?}"
        );
    }

    #[tokio::test]
    async fn a_reset_after_the_server_read_the_call_is_not_retried() {
        let err = do_get_against(Server::Resets(h2::Reason::INTERNAL_ERROR)).await;
        assert!(
            !never_reached_the_server(&err),
            "seen as unprocessed: {err:?}"
        );
    }

    #[test]
    fn a_call_that_never_left_the_client_is_tried_a_few_times_one_the_server_refused_once() {
        let unsent =
            FlightError::Tonic(Box::new(tonic::Status::cancelled("operation was canceled")));
        let tries = (1..10)
            .take_while(|&n| retry_unprocessed(&unsent, n))
            .count() as u32
            + 1;
        assert_eq!(tries, UNSENT_CALL_ATTEMPTS);
        // A cancellation the server sent is an answer.
        let answered = FlightError::Tonic(Box::new(tonic::Status::cancelled("client went away")));
        assert!(!retry_unprocessed(&answered, 1));
    }

    #[tokio::test]
    async fn a_goaway_above_the_call_is_retried_once() {
        let err = do_get_against(Server::GoesAwayFirst).await;
        assert!(retry_unprocessed(&err, 1) && !retry_unprocessed(&err, 2));
    }

    #[tokio::test]
    async fn a_call_whose_server_died_under_it_lost_its_connection_and_may_be_tried_again() {
        let err = do_get_against(Server::Dies).await;
        assert!(connection_lost(&err), "not a lost connection: {err:?}");
        // It reached the server: gRPC's transparent retry would not send it again.
        assert!(!never_reached_the_server(&err), "{err:?}");
    }

    #[tokio::test]
    async fn a_servers_unavailable_answer_is_not_a_lost_connection() {
        let err = do_get_against(Server::AnswersUnavailable).await;
        assert!(
            matches!(&err, FlightError::Tonic(status) if status.code() == Code::Unavailable),
            "{err:?}"
        );
        assert!(!connection_lost(&err), "{err:?}");
        let deadline = FlightError::Tonic(Box::new(tonic::Status::deadline_exceeded("late")));
        assert!(!connection_lost(&deadline));
    }

    #[tokio::test]
    async fn a_call_to_a_port_nothing_listens_on_was_refused_and_lost_its_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect_lazy();
        let err = async {
            FlightClient::new(channel)
                .do_get(Ticket::new("k"))
                .await?
                .try_collect::<Vec<_>>()
                .await
        }
        .await
        .expect_err("nothing listens");
        assert!(connection_refused(&err), "{err:?}");
        assert!(connection_lost(&err), "{err:?}");
        // A call that reached a server which then died was not refused.
        let died = do_get_against(Server::Dies).await;
        assert!(!connection_refused(&died), "{died:?}");
    }

    #[test]
    fn tries_after_a_lost_connection_back_off_from_50_ms_to_400_ms() {
        let pauses: Vec<u64> = (1..LOST_CONNECTION_ATTEMPTS)
            .map(|attempt| lost_connection_backoff(attempt).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400]);
        assert_eq!(lost_connection_backoff(9).as_millis(), 400);
    }

    #[tokio::test]
    async fn a_servers_answer_is_not_retried() {
        let err = do_get_against(Server::AnswersNotFound).await;
        assert!(
            matches!(&err, FlightError::Tonic(status) if status.code() == Code::NotFound),
            "{err:?}"
        );
        assert!(!never_reached_the_server(&err));
    }
}
