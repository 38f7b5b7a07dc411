//! DoGet without encoding: a hit is answered with the entry's stored gRPC frames, and a
//! forwarded DoGet with the owner's HTTP/2 response relayed frame by frame.
//!
//! A tower service in front of the generated Flight server. For a DoGet whose ticket's
//! first choice is this node and whose entry is here, it answers with the entry's
//! stored messages (`wire::seal`): the frame heads and the IPC bodies are handed to
//! HTTP/2 as they are, so a hit allocates and copies nothing in the node (the generated
//! server would copy every body into a fresh message buffer). For a DoGet whose ticket's
//! first choice is another member, it sends the request body as received (one gRPC
//! message: the Ticket) to the owner over the pooled channel, with the forwarding
//! headers, and answers with the owner's response: its headers, its body frames (the
//! FlightData messages, never decoded, copied or re-framed here) and its trailers. That
//! saves the forwarding node a decode into a per-message buffer and a prost re-encode
//! into another, for each ≤ 2 MiB message (see docs/benchmarks.md).
//!
//! Everything else goes to the generated server unchanged, and so does a DoGet this
//! relay does not take: a miss here, a forwarded request this node does not hold, one
//! that carries an unusual body, a peer's read of what this node holds
//! (`x-flightcache-read: held`), an owner that cannot be reached (the normal
//! path then names it or falls back to the second copy), and, with `replicas: 2`, an
//! owner that answers NOT_FOUND or UNAVAILABLE (the normal path then asks both copies).
//! A hit the normal path finds comes back as an empty answer carrying a
//! `wire::hit::StoredHit`, and is sent from its stored frames like the relay's own
//! (`stored_answer`, the one place a hit becomes its answer).
//! Does network I/O. Must not import the Flight adapter (`flight/`, checked by
//! `scripts/check-layers`): tickets come from `crate::ticket`, the peer channels from
//! the cluster layer (`crate::cluster`), the forwarding headers and the coalescing header
//! from `crate::headers`.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::cluster::forward::{self, CALL_TIMEOUT};
use crate::cluster::peers::{PeerError, Peers};
use crate::metrics::Metrics;
use crate::metrics::RpcTimer;
use crate::routing::members::RoutingTable;
use crate::routing::members::{Peer, Route};
use crate::store::{Entry, Store};
use crate::ticket::CacheTicket;
use crate::wire::hit::StoredHit;
use crate::wire::stall::{Answer, Next, StallWatch};
use std::sync::Arc;
use std::time::Duration;

/// The gRPC path of DoGet.
const DO_GET_PATH: &str = "/arrow.flight.protocol.FlightService/DoGet";
/// Largest DoGet request body read here (a ticket is a key of at most 64 KiB).
const MAX_REQUEST_BYTES: usize = 80 << 10;

/// What the relay needs of the node: the store it serves hits from, the ring it routes
/// by, the pooled peer channels and the RPC metrics. (Calls reach it authenticated, by
/// `auth::AuthLayer`.)
#[derive(Debug, Clone)]
pub struct RelayNode {
    /// The node's store.
    pub store: Arc<Store>,
    /// The RPC metrics.
    pub metrics: Arc<Metrics>,
    /// The ring.
    pub routing: Arc<RoutingTable>,
    /// The pooled channels to peers (shared with the Flight service).
    pub peers: Peers,
    /// Ends a local hit's answer whose client takes no frame for the stall limit, and
    /// lets go of the entry's bytes.
    pub stalled_readers: StallWatch,
}

/// The Flight server `S` with DoGet hits served from stored frames and forwarded DoGets
/// relayed at the HTTP/2 level. Only DoGet is touched.
#[derive(Debug, Clone)]
pub struct DoGetRelay<S> {
    inner: S,
    node: RelayNode,
}

impl<S> DoGetRelay<S> {
    /// Wraps `inner` (the generated Flight server of the same node).
    pub fn new(inner: S, node: RelayNode) -> Self {
        Self { inner, node }
    }
}

impl<S: NamedService> NamedService for DoGetRelay<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for DoGetRelay<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != DO_GET_PATH {
            return Box::pin(self.inner.call(request));
        }
        // The ready clone answers this call; a fresh clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let service = self.node.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let message = match read_small_body(body).await {
                Ok(message) => message,
                Err(status) => return Ok(status.into_http()),
            };
            if let Some(response) = service.relay_do_get(&parts, &message).await {
                return Ok(response);
            }
            let request = http::Request::from_parts(parts, Body::new(Once(Some(message))));
            let response = inner.call(request).await?;
            Ok(service.send_handed_over_hit(response))
        })
    }
}

impl RelayNode {
    /// Relays a DoGet to the ticket's owner if this relay takes it (see the module docs);
    /// `None` hands it to the normal path.
    async fn relay_do_get(
        &self,
        parts: &http::request::Parts,
        message: &Bytes,
    ) -> Option<http::Response<Body>> {
        let metadata = MetadataMap::from_headers(parts.headers.clone());
        // A peer's read of what this node holds: the normal path answers it uncounted.
        if forward::is_held_read(&metadata) {
            return None;
        }
        let ticket = ticket_bytes(message)?;
        let key = CacheTicket::try_decode(&ticket).ok()?.key;
        let forwarded = forward::forwarded_by(&metadata);
        let store_key = key.to_store_bytes();
        let choices = self.routing.choices(&store_key, forwarded.as_ref()).ok()?;
        let peer = match choices.first()? {
            Route::Local => return self.serve_stored(&store_key),
            Route::Forward(_) if forwarded.is_some() => return None,
            Route::Forward(peer) => peer,
        };
        let mut timer = self.metrics.rpc("DoGet");
        timer.set_forwarded();
        let mut channel = self.peers.channel(peer).ok()?;
        self.peers.count_call(peer, "DoGet");
        let mut outgoing = http::Request::builder()
            .method(http::Method::POST)
            .uri(DO_GET_PATH)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Body::new(Once(Some(message.clone()))))
            .ok()?;
        add_forwarding_headers(
            outgoing.headers_mut(),
            &metadata,
            &forward::Sender::of(&self.routing).routed_to(peer),
            &self.peers,
        );
        let call = async {
            std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
            channel.call(outgoing).await
        };
        let deadline = self.peers.read_deadline(peer, CALL_TIMEOUT);
        let response = match tokio::time::timeout(deadline, call).await {
            Ok(Ok(response)) => {
                self.peers.answered(peer);
                response
            }
            // Unreachable or too slow: the normal path names the owner or asks the second
            // copy. The timer is dropped unrecorded (the normal path records the call).
            Ok(Err(_)) => {
                self.peers.count_error(PeerError::Unreachable, peer);
                timer.discard();
                return None;
            }
            Err(_) => {
                self.peers.count_error(PeerError::Timeout, peer);
                timer.discard();
                return None;
            }
        };
        // A trailers-only answer carries its status in the headers.
        let early = Status::from_header_map(response.headers()).map(|status| status.code());
        if early == Some(Code::Unavailable) {
            self.peers.count_error(PeerError::Refused, peer);
        }
        if let Some(code) = early
            && choices.len() > 1
            && matches!(code, Code::NotFound | Code::Unavailable)
        {
            timer.discard();
            return None;
        }
        tracing::debug!(owner = %peer.id, %key, "relaying DoGet from the owner");
        let (mut head, body) = response.into_parts();
        // The owner's date header is not ours to pass on.
        head.headers.remove(http::header::DATE);
        let timed = Timed {
            body,
            timer: Some(timer),
            code: early.unwrap_or(Code::Ok),
            owner: peer.clone(),
            peers: self.peers.clone(),
            ended: false,
        };
        Some(http::Response::from_parts(head, Body::new(timed)))
    }
}

impl RelayNode {
    /// Answers a DoGet for `key` from this node's store with the entry's stored frames;
    /// `None` (a miss) hands it to the normal path, which reports the miss or asks the
    /// second copy.
    fn serve_stored(&self, key: &Bytes) -> Option<http::Response<Body>> {
        // Peek first so a miss is counted once, by the normal path.
        self.store.peek(key)?;
        let timer = self.metrics.rpc("DoGet");
        let Some(entry) = self.store.get(key) else {
            timer.discard();
            return None;
        };
        Some(self.stored_answer(&entry, timer))
    }

    /// The normal path's answer to a DoGet, with a hit it found (`wire::hit`) sent as
    /// that entry's stored frames.
    fn send_handed_over_hit(&self, response: http::Response<Body>) -> http::Response<Body> {
        let hit = response
            .extensions()
            .get::<StoredHit>()
            .and_then(StoredHit::take);
        match hit {
            Some((entry, timer)) => self.stored_answer(&entry, timer),
            None => response,
        }
    }

    /// The one place a hit becomes its answer: the entry's stored messages (schema
    /// first) as their gRPC frames, unencoded and uncopied, then `grpc-status: 0`; a
    /// reader that takes no frame for the stall limit is let go (`wire::stall`).
    /// `timer` records the RPC when the answer ends.
    fn stored_answer(&self, entry: &Entry, timer: RpcTimer) -> http::Response<Body> {
        let mut frames = Vec::with_capacity(entry.wire_messages().len() * 2);
        for message in entry.wire_messages() {
            frames.push(message.head().clone());
            if !message.body().is_empty() {
                frames.push(message.body().clone());
            }
        }
        let body = StoredFrames {
            answer: self.stalled_readers.watch(frames),
            max_read_stall: self.stalled_readers.max_stall(),
            timer: Some(timer),
        };
        let mut response = http::Response::new(Body::new(body));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        response
    }
}

/// A DoGet answer from stored frames, then `grpc-status: 0` trailers. Records the RPC
/// as OK when the trailers are taken (CANCELLED, by the timer's drop, if the client
/// goes away first); a reader that stalled past the limit gets DEADLINE_EXCEEDED when it
/// reads again (the frames were let go).
struct StoredFrames {
    answer: Arc<Answer>,
    max_read_stall: Duration,
    timer: Option<RpcTimer>,
}

impl HttpBody for StoredFrames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.answer.take() {
            Next::Frame(frame) => return Poll::Ready(Some(Ok(Frame::data(frame)))),
            Next::End => {}
            Next::LetGo => {
                if let Some(timer) = self.timer.take() {
                    timer.finish(Code::DeadlineExceeded);
                }
                return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                    "the answer was not read for {} s; the node let go of it",
                    self.max_read_stall.as_secs()
                )))));
            }
        }
        let Some(timer) = self.timer.take() else {
            return Poll::Ready(None);
        };
        timer.finish(Code::Ok);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.timer.is_none() && self.answer.is_empty()
    }
}

/// The protobuf `Ticket.ticket` bytes of an uncompressed one-message gRPC body: a 5-byte
/// prefix (flag 0, big-endian length), then field 1 (tag `0x0a`, varint length, bytes)
/// and nothing else. Anything else is left to the normal path.
fn ticket_bytes(message: &Bytes) -> Option<Bytes> {
    let mut buf = message.clone();
    if buf.remaining() < 5 || buf.get_u8() != 0 {
        return None;
    }
    let len = usize::try_from(buf.get_u32()).ok()?;
    if buf.remaining() != len || len == 0 || buf.get_u8() != 0x0a {
        return None;
    }
    let mut size: u64 = 0;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            return None;
        }
        let byte = buf.get_u8();
        size |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    let size = usize::try_from(size).ok()?;
    (buf.remaining() == size).then(|| buf.copy_to_bytes(size))
}

/// Adds the forwarding headers and the `authorization` for the peer (this node's peer
/// credential, else the caller's) to `headers`.
fn add_forwarding_headers(
    headers: &mut http::HeaderMap,
    incoming: &MetadataMap,
    sender: &forward::Sender,
    peers: &Peers,
) {
    if let Some(auth) = peers.authorization(incoming)
        && let Ok(value) = auth.to_str().unwrap_or_default().parse()
    {
        headers.insert(crate::headers::AUTHORIZATION_HEADER, value);
    }
    if let Ok(member) = sender.member.parse() {
        headers.insert(crate::headers::FORWARDED_HEADER, member);
    }
    headers.insert(
        crate::headers::RING_VERSION_HEADER,
        sender.ring_version.into(),
    );
    // The owner coalesces the miss, so it must see the caller's request to.
    if let Some(coalesce) = incoming.get(crate::headers::COALESCE_HEADER)
        && let Ok(value) = coalesce.to_str().unwrap_or_default().parse()
    {
        headers.insert(crate::headers::COALESCE_HEADER, value);
    }
}

/// Reads a request body of at most [`MAX_REQUEST_BYTES`]; RESOURCE_EXHAUSTED (as the
/// request limit answers) if it is larger, the body's own error if it fails.
async fn read_small_body(mut body: Body) -> Result<Bytes, Status> {
    let mut collected = BytesMut::new();
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => return Ok(collected.freeze()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if collected.len() + data.len() > MAX_REQUEST_BYTES {
                        return Err(Status::resource_exhausted(format!(
                            "a DoGet request is at most {MAX_REQUEST_BYTES} bytes (a ticket \
                             names one key of at most 64 KiB)"
                        )));
                    }
                    collected.extend_from_slice(&data);
                }
            }
            // The request limit's refusal (or a broken stream), answered as it is.
            Some(Err(status)) => return Err(status),
        }
    }
}

/// A body of one chunk.
#[derive(Debug)]
struct Once(Option<Bytes>);

impl HttpBody for Once {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |data| data.len() as u64))
    }
}

/// The owner's response body, passed through; records the RPC with the owner's
/// `grpc-status` when it ends (CANCELLED if the client goes away first).
///
/// If the owner's stream breaks off (its connection ends while it stops), the client
/// gets gRPC trailers with UNAVAILABLE naming the owner, not a reset HTTP/2 stream that
/// clients report as a bare protocol error.
struct Timed {
    body: Body,
    timer: Option<RpcTimer>,
    code: Code,
    owner: Peer,
    peers: Peers,
    ended: bool,
}

impl Timed {
    fn broken_off(&mut self, cause: &Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.ended = true;
        self.code = Code::Unavailable;
        self.peers.count_error(PeerError::Broken, &self.owner);
        if let Some(timer) = self.timer.take() {
            timer.finish(self.code);
        }
        let status = Status::unavailable(format!(
            "owner {} ended its answer early ({}: {}); retry",
            self.owner.id,
            cause.code(),
            cause.message()
        ));
        let mut trailers = http::HeaderMap::new();
        match status.add_header(&mut trailers) {
            Ok(()) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Err(_) => Poll::Ready(Some(Err(status))),
        }
    }
}

impl HttpBody for Timed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Err(cause))) = &polled {
            let cause = cause.clone();
            return this.broken_off(&cause);
        }
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    this.code = Status::from_header_map(trailers)
                        .map_or(Code::Unknown, |status| status.code());
                }
            }
            Poll::Ready(Some(Err(_))) => {}
            Poll::Ready(None) => {
                if let Some(timer) = this.timer.take() {
                    timer.finish(this.code);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        // Ended by a trailers frame the client read, without a final poll: record it.
        if let Some(timer) = self.timer.take()
            && self.body.is_end_stream()
        {
            timer.finish(self.code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(message: &[u8]) -> Bytes {
        let mut out = vec![0u8];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        Bytes::from(out)
    }

    #[test]
    fn the_ticket_is_read_from_a_plain_request_only() {
        let ticket = b"FCT\x01Preports/daily";
        let mut message = vec![0x0a, ticket.len() as u8];
        message.extend_from_slice(ticket);
        assert_eq!(ticket_bytes(&grpc(&message)).as_deref(), Some(&ticket[..]));
        // A long ticket: two-byte varint.
        let long = vec![b'x'; 300];
        let mut message = vec![0x0a, 0xac, 0x02];
        message.extend_from_slice(&long);
        assert_eq!(ticket_bytes(&grpc(&message)).as_deref(), Some(&long[..]));
        // Compressed, truncated, another field or trailing bytes: not taken.
        let mut compressed = grpc(&[0x0a, 1, b'a']).to_vec();
        compressed[0] = 1;
        for bad in [
            Bytes::from(compressed),
            grpc(&[0x0a, 5, b'a']),
            grpc(&[0x12, 1, b'a']),
            grpc(&[0x0a, 1, b'a', 0x12, 0]),
            grpc(&[]),
            Bytes::from_static(b"\0\0"),
        ] {
            assert_eq!(ticket_bytes(&bad), None, "{bad:?}");
        }
    }

    /// A body that sends one data frame, then fails the way a closed connection does.
    struct BreaksOff(u8);

    impl HttpBody for BreaksOff {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            self.0 += 1;
            Poll::Ready(Some(match self.0 {
                1 => Ok(Frame::data(Bytes::from_static(b"part"))),
                _ => Err(Status::internal("h2 protocol error: http2 error")),
            }))
        }
    }

    #[tokio::test]
    async fn an_owner_stream_that_breaks_off_ends_in_unavailable_trailers_naming_it() {
        use http_body_util_free::next_frame;
        let mut timed = Timed {
            body: Body::new(BreaksOff(0)),
            timer: None,
            code: Code::Ok,
            owner: Peer {
                id: "pool-2".into(),
                address: "127.0.0.1:1".into(),
                ring_version: 1,
            },
            peers: Peers::default(),
            ended: false,
        };
        let first = next_frame(&mut timed).await.unwrap().unwrap();
        assert_eq!(first.data_ref().map(|d| &d[..]), Some(&b"part"[..]));
        let last = next_frame(&mut timed).await.unwrap().unwrap();
        let status = Status::from_header_map(last.trailers_ref().unwrap()).unwrap();
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().contains("owner pool-2"),
            "{}",
            status.message()
        );
        assert!(timed.is_end_stream());
        assert!(next_frame(&mut timed).await.is_none());
    }

    /// `http_body_util::BodyExt::frame` without the extra dependency.
    mod http_body_util_free {
        use super::*;

        pub(super) async fn next_frame(body: &mut Timed) -> Option<Result<Frame<Bytes>, Status>> {
            std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
        }
    }
}
