//! How the load reaches the cache: straight to the target address (one HTTP/2 connection
//! per worker, so a Service spreads them over its pods) or through the ring-aware
//! [`RingClient`]. Does network I/O; classifies every failure into a [`CallError`].
//!
//! Owns: the calls and their failure classes. Imports `record` and `workload` of the
//! load generator and, of `cache_node`, only the client and the Flight message-size
//! limit.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{Action, FlightClient, Ticket};
use cache_node::client::{
    ClientError, LOST_CONNECTION_ATTEMPTS, RingClient, connection_lost, connection_refused,
    lost_connection_backoff, retry_unprocessed,
};
use cache_node::flight::MAX_FLIGHT_DATA_BYTES;
use cache_node::headers::{AUTHORIZATION_HEADER, PREVIOUS_ATTEMPTS_HEADER};
use crds::admin::AdminAction;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::record::CallError;
use crate::workload::Workload;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 keepalive of a direct connection: a ping after 1 s without a frame while calls
/// are open, and the connection ends when its ack does not come within 1 s — so a call on
/// a connection to a hung process fails (and is tried again) within ~2 s instead of
/// waiting for its deadline. The node's peers use the same (`cluster::peers`).
const KEEPALIVE: Duration = Duration::from_secs(1);
/// How long a try after a lost connection waits for its whole answer (a small get or put
/// answers in milliseconds) before it is tried again on a new connection. The Service may
/// hand the new connection to the same process while it still hangs (it leaves the
/// Service's endpoints ~3 s after it froze): its TCP handshake succeeds (the kernel
/// answers) but nothing else comes, and the keepalive would take 2 s to say so — two such
/// landings after the first loss used a 5 s deadline up (a freeze in CI, 2026-11-28).
const FRESH_CONNECTION_ANSWER: Duration = Duration::from_secs(1);

/// How many new connections a reconnect after a lost one opens at once through the
/// Service: the first on which a server answers is kept, the others closed. A lost
/// node's pod stays among the Service's endpoints until the operator has seen its
/// heartbeat stop (~20 s), so one new connection in three went to it, and three such
/// landings in a row used up a call's 5 s deadline (node-lost and node-hung, 2 calls per
/// multi-node run); all three racing connections land there one time in 27.
const RACED_CONNECTIONS: usize = 3;

/// Where the calls go; shared by the workers.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// Every call to the target address; the node forwards to the owner.
    Direct {
        endpoint: Box<Endpoint>,
        token: Option<String>,
    },
    /// Each call to the key's owner.
    Ring(Arc<RingClient>),
}

/// One worker's handle on the target.
#[derive(Debug)]
pub(crate) enum Caller {
    Direct {
        client: Box<FlightClient>,
        /// Where a new connection is made when a try after a lost connection gets no
        /// answer ([`FRESH_CONNECTION_ANSWER`]).
        endpoint: Box<Endpoint>,
        /// The failures of calls tried again because their connection was lost, since
        /// the last [`Caller::take_retried`].
        retried: Vec<CallError>,
    },
    Ring(Arc<RingClient>),
}

/// What a DoGet came back with.
#[derive(Debug)]
pub(crate) enum Got {
    Batches(Vec<RecordBatch>),
    NotFound,
}

/// How a direct target is reached over TLS.
pub(crate) struct TargetTls {
    /// The CA (PEM) the target's certificate is verified against.
    pub(crate) ca: Vec<u8>,
    /// The client certificate chain and key (PEM) presented, if any.
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl Target {
    /// Reaches the target (a `ping`, or the ring's `topology` with `ring`), retrying
    /// transport failures until `patience` has passed.
    ///
    /// # Errors
    /// The last failure, when the target did not answer in time or refused the call
    /// (e.g. UNAUTHENTICATED).
    pub(crate) async fn connect(
        address: &str,
        token: Option<String>,
        tls: Option<TargetTls>,
        ring: bool,
        patience: Duration,
    ) -> Result<Self, CallError> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let attempt = Self::try_connect(address, token.clone(), tls.as_ref(), ring).await;
            match attempt {
                Ok(target) => return Ok(target),
                Err(err) => {
                    let transient = matches!(err.code, "UNAVAILABLE" | "DEADLINE_EXCEEDED");
                    if !transient || tokio::time::Instant::now() >= deadline {
                        return Err(err);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    async fn try_connect(
        address: &str,
        token: Option<String>,
        tls: Option<&TargetTls>,
        ring: bool,
    ) -> Result<Self, CallError> {
        let call = async {
            if ring {
                let client = RingClient::connect(address, token)
                    .await
                    .map_err(|err| client_error(&err))?;
                return Ok(Self::Ring(Arc::new(client)));
            }
            let bad_target = |err: tonic::transport::Error| CallError {
                code: "CLIENT",
                message: format!("bad target '{address}': {err}"),
            };
            let scheme = if tls.is_some() { "https" } else { "http" };
            let mut endpoint =
                Endpoint::from_shared(format!("{scheme}://{address}")).map_err(bad_target)?;
            if let Some(tls) = tls {
                let mut config =
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca));
                if let Some((cert, key)) = &tls.identity {
                    config = config.identity(Identity::from_pem(cert, key));
                }
                endpoint = endpoint.tls_config(config).map_err(bad_target)?;
            }
            let endpoint = endpoint
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_timeout(KEEPALIVE);
            let target = Self::Direct {
                endpoint: Box::new(endpoint),
                token,
            };
            let Caller::Direct { mut client, .. } = target.caller()? else {
                return Err(CallError {
                    code: "CLIENT",
                    message: "unexpected client kind".into(),
                });
            };
            let mut answers = client
                .do_action(Action::new(AdminAction::Ping.as_str(), ""))
                .await
                .map_err(|err| flight_error(&err))?;
            while let Some(answer) = answers.next().await {
                answer.map_err(|err| flight_error(&err))?;
            }
            Ok(target)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT * 2, call).await {
            Ok(result) => result,
            Err(_) => Err(deadline_error(CONNECT_TIMEOUT * 2)),
        }
    }

    /// A handle for one worker (with [`Target::Direct`]: a connection of its own,
    /// connected on first use and reconnected after failures by tonic).
    ///
    /// # Errors
    /// A bad token (not a valid header value).
    pub(crate) fn caller(&self) -> Result<Caller, CallError> {
        match self {
            Self::Direct { endpoint, token } => {
                // Connect and TLS handshake within CONNECT_TIMEOUT (cache_node::dial).
                let channel: Channel = cache_node::dial::lazy_channel(endpoint);
                let mut client = FlightClient::new(channel);
                if let Some(token) = token {
                    client
                        .add_header(AUTHORIZATION_HEADER, &format!("Bearer {token}"))
                        .map_err(|err| flight_error(&err))?;
                }
                Ok(Caller::Direct {
                    client: Box::new(client),
                    endpoint: endpoint.clone(),
                    retried: Vec::new(),
                })
            }
            Self::Ring(client) => Ok(Caller::Ring(Arc::clone(client))),
        }
    }
}

impl Caller {
    /// The failures of the calls tried again since the last take because their
    /// connection was lost ([`connection_lost`]): each was answered on a later try.
    pub(crate) fn take_retried(&mut self) -> Vec<CallError> {
        match self {
            Self::Direct { retried, .. } => std::mem::take(retried),
            Self::Ring(_) => Vec::new(),
        }
    }

    /// DoGet of the key `index`, within `timeout`.
    ///
    /// # Errors
    /// Any failure but NOT_FOUND.
    pub(crate) async fn get(
        &mut self,
        workload: &Workload,
        index: u64,
        timeout: Duration,
    ) -> Result<Got, CallError> {
        let result = match self {
            Self::Direct {
                client,
                endpoint,
                retried,
            } => {
                let ticket = Ticket::new(workload.ticket(index));
                tried_within(
                    timeout,
                    client,
                    endpoint,
                    retried,
                    |client: &mut FlightClient| {
                        let ticket = ticket.clone();
                        async move { client.do_get(ticket).await?.try_collect().await }.boxed()
                    },
                )
                .await?
                .map_err(|err| (flight_code(&err), flight_error(&err)))
            }
            Self::Ring(client) => {
                let descriptor = workload.descriptor(index);
                match tokio::time::timeout(timeout, client.get(&descriptor)).await {
                    Ok(result) => result.map_err(|err| (err.code(), client_error(&err))),
                    Err(_) => return Err(deadline_error(timeout)),
                }
            }
        };
        match result {
            Ok(batches) => Ok(Got::Batches(batches)),
            Err((Some(Code::NotFound), _)) => Ok(Got::NotFound),
            Err((_, err)) => Err(err),
        }
    }

    /// DoPut of the key `index`'s value, within `timeout`.
    ///
    /// # Errors
    /// Any failure.
    pub(crate) async fn put(
        &mut self,
        workload: &Workload,
        index: u64,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let batch = workload.batch(index).map_err(|err| CallError {
            code: "CLIENT",
            message: err.to_string(),
        })?;
        let descriptor = workload.descriptor(index);
        match self {
            Self::Direct {
                client,
                endpoint,
                retried,
            } => tried_within(
                timeout,
                client,
                endpoint,
                retried,
                |client: &mut FlightClient| {
                    let stream = FlightDataEncoderBuilder::new()
                        .with_schema(workload.schema())
                        .with_max_flight_data_size(MAX_FLIGHT_DATA_BYTES)
                        .with_flight_descriptor(Some(descriptor.clone()))
                        .build(futures::stream::iter([Ok(batch.clone())]));
                    async move {
                        client.do_put(stream).await?.try_collect::<Vec<_>>().await?;
                        Ok(())
                    }
                    .boxed()
                },
            )
            .await?
            .map_err(|err| flight_error(&err)),
            Self::Ring(client) => {
                match tokio::time::timeout(timeout, client.put(descriptor, vec![batch])).await {
                    Ok(result) => result.map(|_| ()).map_err(|err| client_error(&err)),
                    Err(_) => Err(deadline_error(timeout)),
                }
            }
        }
    }
}

/// Runs `call` until it answers, as the pool's client settings ask: gRPC's transparent
/// retry, as grpc-core (pyarrow) does it — a call no server processed (the pod behind the
/// Service is stopping: GOAWAY) once more, one that never left the client (its connection
/// was closing) up to three tries (`retry_unprocessed`) — and a call whose connection was
/// lost (the process behind it crashed or hangs) after a backoff, its failure recorded in
/// `retried`; after a lost connection each try goes on a new connection on which a
/// server has answered ([`live_connection`]), waits [`FRESH_CONNECTION_ANSWER`] at most,
/// then the call is tried again on another new connection (also recorded). Server answers and
/// deadlines are never tried again; the caller bounds the whole by its deadline.
///
/// `tries` gets one line per try that did not answer (when, how long, why) and one for
/// the try under way, so a call its deadline cuts off says what its time went to.
async fn tried<T>(
    client: &mut FlightClient,
    endpoint: &Endpoint,
    retried: &mut Vec<CallError>,
    tries: &mut Vec<String>,
    call: impl for<'a> Fn(&'a mut FlightClient) -> BoxFuture<'a, Result<T, FlightError>>,
) -> Result<T, FlightError> {
    let began = std::time::Instant::now();
    let at = || began.elapsed().as_millis();
    let mut attempt = 0;
    let mut after_a_lost_connection = false;
    loop {
        attempt += 1;
        tries.push(format!("#{attempt} from {} ms", at()));
        // Each try says how many came before it, as gRPC's retries do (gRFC A6), so the
        // node counts it; set or cleared on every try (a call cut off by its deadline
        // leaves no stale count on the client).
        mark_attempt(client, attempt);
        // The last try waits as long as the call's deadline lets it.
        let answer = if after_a_lost_connection && attempt < LOST_CONNECTION_ATTEMPTS {
            match tokio::time::timeout(FRESH_CONNECTION_ANSWER, call(client)).await {
                Ok(answer) => answer,
                Err(_) => {
                    tries.push(format!(
                        "#{attempt} no answer by {} ms: new connection",
                        at()
                    ));
                    retried.push(CallError {
                        code: "DEADLINE_EXCEEDED",
                        message: format!(
                            "no answer within {} on a new connection after a lost one; \
                             tried again on another",
                            humantime::format_duration(FRESH_CONNECTION_ANSWER)
                        ),
                    });
                    reconnect(client, endpoint, tries, &at).await;
                    continue;
                }
            }
        } else {
            call(client).await
        };
        if let Err(err) = &answer {
            let failed = flight_error(err);
            let why: String = failed.message.chars().take(80).collect();
            tries.push(format!("#{attempt} {} at {} ms ({why})", failed.code, at()));
        }
        match answer {
            Err(err) if retry_unprocessed(&err, attempt) => {}
            Err(err) if retry_lost_connection(&err, attempt) => {
                retried.push(flight_error(&err));
                after_a_lost_connection = true;
                tokio::time::sleep(lost_connection_backoff(attempt)).await;
                reconnect(client, endpoint, tries, &at).await;
            }
            other => return other,
        }
    }
}

/// Replaces the client's connection with a new one to `endpoint` (the Service picks the
/// node again), keeping its headers (the token): a live one ([`live_connection`]) when a
/// server answers within [`FRESH_CONNECTION_ANSWER`], else one made at the next call.
/// Notes in `tries` which it got.
async fn reconnect(
    client: &mut FlightClient,
    endpoint: &Endpoint,
    tries: &mut Vec<String>,
    at: &impl Fn() -> u128,
) {
    let headers = client.metadata().clone();
    let channel = match live_connection(endpoint, FRESH_CONNECTION_ANSWER).await {
        Some(channel) => {
            tries.push(format!("live connection at {} ms", at()));
            channel
        }
        None => {
            tries.push(format!("no live connection by {} ms", at()));
            cache_node::dial::lazy_channel(endpoint)
        }
    };
    let mut fresh = FlightClient::new(channel);
    *fresh.metadata_mut() = headers;
    *client = fresh;
}

/// A new connection to `endpoint` on which a server has answered — a gRPC health `Check`
/// of the Flight service, which needs no credential, answered `SERVING` — the first of
/// [`RACED_CONNECTIONS`] opened at once, within `within`. As gRPC-core (pyarrow) counts a
/// connection ready only once the server's HTTP/2 SETTINGS came, so a call is never sent
/// on a connection to a process that is gone or hangs (the kernel of a frozen node still
/// completes the TCP handshake).
async fn live_connection(endpoint: &Endpoint, within: Duration) -> Option<Channel> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let attempts = (0..RACED_CONNECTIONS).map(|_| {
        let endpoint = endpoint.clone();
        async move {
            let channel = endpoint.connect().await.map_err(|_| ())?;
            let request = HealthCheckRequest {
                service: FLIGHT_SERVICE.to_owned(),
            };
            let answer = HealthClient::new(channel.clone())
                .check(request)
                .await
                .map_err(|_| ())?;
            if answer.into_inner().status == ServingStatus::Serving as i32 {
                Ok(channel)
            } else {
                Err(())
            }
        }
        .boxed()
    });
    match tokio::time::timeout(within, futures::future::select_ok(attempts)).await {
        Ok(Ok((channel, _others))) => Some(channel),
        _ => None,
    }
}

/// The gRPC service name of Arrow Flight, as the nodes' health service reports it.
const FLIGHT_SERVICE: &str = "arrow.flight.protocol.FlightService";

/// Sets `grpc-previous-rpc-attempts` on the client's next call to `attempt - 1`, or clears
/// it for a first try.
fn mark_attempt(client: &mut FlightClient, attempt: u32) {
    let metadata = client.metadata_mut();
    metadata.remove(PREVIOUS_ATTEMPTS_HEADER);
    if attempt > 1 {
        metadata.insert(PREVIOUS_ATTEMPTS_HEADER, (attempt - 1).into());
    }
}

/// Whether a call that failed with `err` on try `attempt` is tried again because its
/// connection was lost: up to [`LOST_CONNECTION_ATTEMPTS`] tries, and a refused
/// connection (the call never left the client) until the call's deadline.
fn retry_lost_connection(err: &FlightError, attempt: u32) -> bool {
    connection_lost(err) && (attempt < LOST_CONNECTION_ATTEMPTS || connection_refused(err))
}

/// [`tried`] within the call's `timeout`: its answer, or a deadline error that lists the
/// call's tries.
async fn tried_within<T>(
    timeout: Duration,
    client: &mut FlightClient,
    endpoint: &Endpoint,
    retried: &mut Vec<CallError>,
    call: impl for<'a> Fn(&'a mut FlightClient) -> BoxFuture<'a, Result<T, FlightError>>,
) -> Result<Result<T, FlightError>, CallError> {
    let mut tries = Vec::new();
    let answer = tokio::time::timeout(timeout, tried(client, endpoint, retried, &mut tries, call));
    answer
        .await
        .map_err(|_| deadline_error_after(timeout, &tries))
}

/// A deadline error that lists the call's tries ([`tried`]).
fn deadline_error_after(timeout: Duration, tries: &[String]) -> CallError {
    let mut error = deadline_error(timeout);
    error.message = format!("{}; tries: {}", error.message, tries.join(", "));
    error
}

fn deadline_error(timeout: Duration) -> CallError {
    CallError {
        code: "DEADLINE_EXCEEDED",
        message: format!(
            "no answer within {} (client deadline)",
            humantime::format_duration(timeout)
        ),
    }
}

fn flight_code(err: &FlightError) -> Option<Code> {
    match err {
        FlightError::Tonic(status) => Some(status.code()),
        _ => None,
    }
}

/// A Flight failure as a [`CallError`]: the gRPC code's name and the status message, or
/// `CLIENT` for failures that are not a gRPC status (decoding, protocol).
pub(crate) fn flight_error(err: &FlightError) -> CallError {
    match err {
        FlightError::Tonic(status) => CallError {
            code: code_name(status.code()),
            message: status.message().to_owned(),
        },
        other => CallError {
            code: "CLIENT",
            message: other.to_string(),
        },
    }
}

fn client_error(err: &ClientError) -> CallError {
    match err {
        ClientError::Flight { address, source } => {
            let mut call = flight_error(source);
            call.message = format!("{address}: {}", call.message);
            call
        }
        ClientError::BadKey(_) | ClientError::BadAddress(_) | ClientError::Topology { .. } => {
            CallError {
                code: "CLIENT",
                message: err.to_string(),
            }
        }
    }
}

/// The canonical gRPC name of a status code (`UNAVAILABLE`, `NOT_FOUND`, ...).
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call whose deadline cuts it off names its tries: here a server that accepts the
    /// connection and never answers, as a frozen process does.
    #[tokio::test]
    async fn a_call_cut_off_by_its_deadline_lists_its_tries() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE);
        let target = Target::Direct {
            endpoint: Box::new(endpoint),
            token: None,
        };
        let mut caller = target.caller().unwrap();
        let workload = Workload::new("load", 1);
        let err = caller
            .get(&workload, 0, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert_eq!(err.code, "DEADLINE_EXCEEDED");
        assert!(
            err.message.contains("within 500ms") && err.message.contains("tries: #1 from 0 ms"),
            "{}",
            err.message
        );
        held.abort();
    }
}
