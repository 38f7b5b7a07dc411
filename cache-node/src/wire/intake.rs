//! Budget for DoPut bytes still arriving.
//!
//! The gRPC layer buffers a whole message before the put sees it, so a put can only
//! reserve a message's bytes after they already take memory; under a storm of large
//! puts the node would briefly hold more than its budget. This body wrapper reads the
//! gRPC framing of a DoPut request as its HTTP/2 data arrives: when a message's 5-byte
//! prefix announces its length, that many bytes (plus the frame in transit, see
//! [`in_transit`]) are reserved in the store's budget (evicting to make room) before
//! they are buffered. The reservation is released on
//! the next read of the body after the message has passed through, which the gRPC
//! layer only makes once the put has taken the message (and reserved what it keeps),
//! or when the request ends. A message that cannot be reserved (other reservations hold
//! the budget) passes unreserved, and the put's own checks refuse it. A message whose
//! prefix announces more than the max entry size ends the request body with
//! RESOURCE_EXHAUSTED right there: its bytes are never buffered (the gRPC decoder would
//! otherwise take up to its decode limit, 64 MiB, per message before the put refused it).
//! No I/O. Must not import the Flight service (`flight/`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

use crate::store::{IntakeCover, IntakeReservation, Store};

/// The gRPC path of DoPut.
const DO_PUT_PATH: &str = "/arrow.flight.protocol.FlightService/DoPut";

/// The Flight server `S` with each DoPut's request body wrapped in an [`IntakeBody`].
/// Every other call passes through untouched.
#[derive(Debug, Clone)]
pub struct IntakeLayer<S> {
    inner: S,
    store: std::sync::Arc<Store>,
}

impl<S> IntakeLayer<S> {
    /// Wraps `inner`, reserving DoPut bytes in `store`.
    pub fn new(inner: S, store: std::sync::Arc<Store>) -> Self {
        Self { inner, store }
    }
}

impl<S: NamedService> NamedService for IntakeLayer<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for IntakeLayer<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != DO_PUT_PATH {
            return Box::pin(self.inner.call(request));
        }
        // Reserve each message's bytes as soon as its length is known; the put learns
        // from the request's extensions whether every message was covered.
        let (mut parts, body) = request.into_parts();
        let cover = std::sync::Arc::new(IntakeCover::default());
        parts.extensions.insert(std::sync::Arc::clone(&cover));
        let body = IntakeBody::new(body, std::sync::Arc::clone(&self.store)).covering(cover);
        Box::pin(
            self.inner
                .call(http::Request::from_parts(parts, Body::new(body))),
        )
    }
}

/// Bytes of the gRPC message prefix: compression flag and big-endian length.
const PREFIX_BYTES: usize = 5;

/// Largest HTTP/2 frame the server accepts (`server.rs` advertises it).
pub const MAX_INCOMING_FRAME_BYTES: u64 = 1 << 20;

/// Bytes a message holds beyond its own length while it arrives: the HTTP/2 frame being
/// copied into the message buffer still sits in the connection's read buffer.
fn in_transit(length: u64) -> u64 {
    length.min(MAX_INCOMING_FRAME_BYTES)
}

/// Where the parser is in the gRPC framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Reading a message prefix; `have` of its bytes seen so far.
    Prefix {
        bytes: [u8; PREFIX_BYTES],
        have: usize,
    },
    /// Inside a message body; `remaining` bytes to go.
    Message { remaining: u64 },
}

/// A DoPut request body that reserves each message's bytes as soon as its length is
/// known.
pub struct IntakeBody {
    inner: Body,
    store: std::sync::Arc<Store>,
    framing: Framing,
    /// The reservation of the message arriving now.
    current: Option<IntakeReservation>,
    /// Reservations of messages that have passed through, released on the next read.
    passed: Vec<IntakeReservation>,
    /// Set once a message over the max entry size was announced: the body answers this
    /// error once, then ends.
    refused: Option<Refusal>,
    /// Told when a message passes unreserved.
    cover: std::sync::Arc<IntakeCover>,
}

/// A message over the max entry size, seen in its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Not yet answered to the reader.
    Pending { size: u64, max: u64 },
    /// Answered; the body ends.
    Answered,
}

impl IntakeBody {
    /// Wraps the request body of a DoPut.
    pub fn new(inner: Body, store: std::sync::Arc<Store>) -> Self {
        Self {
            inner,
            store,
            framing: Framing::Prefix {
                bytes: [0; PREFIX_BYTES],
                have: 0,
            },
            current: None,
            passed: Vec::new(),
            refused: None,
            cover: std::sync::Arc::default(),
        }
    }

    /// Reports messages that pass unreserved to `cover` (the put reads it).
    pub fn covering(self, cover: std::sync::Arc<IntakeCover>) -> Self {
        Self { cover, ..self }
    }

    /// Follows the framing through `data`, reserving each message announced in it. When
    /// a message over the max entry size is announced, stops and returns how many bytes
    /// of `data` come before its prefix (those still belong to earlier messages).
    fn observe(&mut self, frame: &[u8]) -> Option<usize> {
        let mut data = frame;
        while !data.is_empty() {
            match &mut self.framing {
                Framing::Prefix { bytes, have } => {
                    let prefix_start = (frame.len() - data.len()).saturating_sub(*have);
                    let take = (PREFIX_BYTES - *have).min(data.len());
                    bytes[*have..*have + take].copy_from_slice(&data[..take]);
                    *have += take;
                    data = &data[take..];
                    if *have == PREFIX_BYTES {
                        let length =
                            u64::from(u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]));
                        // Refused before a byte of it is buffered, nothing evicted for it.
                        let max = self.store.config().max_entry_bytes;
                        if length > max {
                            self.refused = Some(Refusal::Pending { size: length, max });
                            return Some(prefix_start);
                        }
                        self.current = self.store.reserve_intake(length + in_transit(length));
                        if self.current.is_none() {
                            self.cover.note_uncovered();
                        }
                        self.framing = Framing::Message { remaining: length };
                        if length == 0 {
                            self.message_passed();
                        }
                    }
                }
                Framing::Message { remaining } => {
                    let take = usize::try_from(*remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    *remaining -= take as u64;
                    data = &data[take..];
                    if *remaining == 0 {
                        self.message_passed();
                    }
                }
            }
        }
        None
    }

    fn message_passed(&mut self) {
        self.passed.extend(self.current.take());
        self.framing = Framing::Prefix {
            bytes: [0; PREFIX_BYTES],
            have: 0,
        };
    }

    /// Bytes currently reserved by this body (for tests).
    #[cfg(test)]
    fn reserved(&self) -> u64 {
        self.current
            .iter()
            .chain(&self.passed)
            .map(IntakeReservation::bytes)
            .sum()
    }
}

impl HttpBody for IntakeBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        // The reader asks for more only after it has taken the messages that passed
        // (and the put has reserved what it keeps), so their budget can go back now.
        this.passed.clear();
        if this.refused == Some(Refusal::Answered) {
            return Poll::Ready(None);
        }
        if this.refused.is_none() {
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            let Poll::Ready(Some(Ok(frame))) = polled else {
                if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
                    this.current = None;
                }
                return polled;
            };
            let Some(data) = frame.data_ref() else {
                return Poll::Ready(Some(Ok(frame)));
            };
            let Some(cut) = this.observe(data) else {
                return Poll::Ready(Some(Ok(frame)));
            };
            // The messages before the refused one still reach the put (it counts the
            // refusal); the refused message's bytes and everything after are dropped.
            if cut > 0 {
                return Poll::Ready(Some(Ok(Frame::data(data.slice(..cut)))));
            }
        }
        if let Some(Refusal::Pending { size, max }) = this.refused {
            this.refused = Some(Refusal::Answered);
            this.current = None;
            this.passed.clear();
            return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                "a put message of {size} bytes is larger than the max entry size of {max} \
                 bytes; refused before it was read, nothing was stored"
            )))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.refused == Some(Refusal::Answered) || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::{EvictionPolicy, StoreConfig, SystemClock, TtlMode};

    fn store(budget: u64) -> Arc<Store> {
        let config = StoreConfig {
            max_entries: 100,
            budget_bytes: budget,
            max_entry_bytes: budget,
            ttl: std::time::Duration::from_secs(60),
            ttl_mode: TtlMode::Absolute,
            eviction: EvictionPolicy::Lru,
        };
        Arc::new(Store::new(config, Arc::new(SystemClock::new())).unwrap())
    }

    fn message(len: usize) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend(std::iter::repeat_n(7u8, len));
        out
    }

    #[test]
    fn a_message_is_reserved_when_its_prefix_arrives_and_released_after_it_passed() {
        assert_eq!(in_transit(5 << 20), MAX_INCOMING_FRAME_BYTES);
        let store = store(1 << 20);
        let mut body = IntakeBody::new(Body::empty(), Arc::clone(&store));
        let first = message(1_000);
        // The prefix split across two frames, then part of the body.
        body.observe(&first[..3]);
        assert_eq!(body.reserved(), 0);
        body.observe(&first[3..100]);
        // The message and the frame carrying it, which may be in two buffers at once.
        assert_eq!(body.reserved(), 2_000);
        assert_eq!(store.stats().reserved_bytes, 2_000);
        // The rest of the first message and all of a second one in one frame.
        let mut rest = first[100..].to_vec();
        rest.extend(message(500));
        body.observe(&rest);
        assert_eq!(body.passed.len(), 2);
        assert!(body.current.is_none());
        assert_eq!(store.stats().reserved_bytes, 3_000);
        body.passed.clear();
        assert_eq!(store.stats().reserved_bytes, 0);
        drop(body);
        assert_eq!(store.stats().reserved_bytes, 0);
    }

    #[test]
    fn a_message_the_budget_cannot_hold_passes_unreserved_and_the_framing_is_followed() {
        let store = store(1_000);
        let held = store.reserve_intake(900).unwrap();
        let cover = Arc::new(IntakeCover::default());
        let mut body =
            IntakeBody::new(Body::empty(), Arc::clone(&store)).covering(Arc::clone(&cover));
        assert!(cover.all_covered());
        body.observe(&message(500)[..50]);
        assert_eq!(body.reserved(), 0, "no room: the put's own checks decide");
        assert!(
            !cover.all_covered(),
            "the put is told to reserve the received bytes itself"
        );
        assert_eq!(body.refused, None, "within the max entry size");
        // The framing is still followed: the next message is seen and reserved.
        body.observe(&message(500)[50..]);
        body.observe(&message(10)[..5]);
        assert_eq!(body.reserved(), 20);
        assert!(
            !cover.all_covered(),
            "once uncovered, always: the put stays careful"
        );
        drop(body);
        drop(held);
        assert_eq!(store.stats().reserved_bytes, 0);
    }

    #[test]
    fn a_message_over_the_max_entry_size_is_refused_when_its_prefix_arrives() {
        let config = StoreConfig {
            max_entry_bytes: 100,
            ..store(1_000).config()
        };
        let store = Arc::new(Store::new(config, Arc::new(SystemClock::new())).unwrap());
        let mut body = IntakeBody::new(Body::empty(), Arc::clone(&store));
        // A message within the limit, then the prefix of one over it in the same frame.
        let mut data = message(60);
        data.extend_from_slice(&message(5_000)[..5]);
        assert_eq!(
            body.observe(&data),
            Some(65),
            "the first message comes before the cut"
        );
        assert_eq!(
            body.refused,
            Some(Refusal::Pending {
                size: 5_000,
                max: 100
            })
        );
        assert_eq!(
            store.stats().reserved_bytes,
            120,
            "nothing reserved or evicted for the refused message"
        );
        drop(body);
        assert_eq!(store.stats().reserved_bytes, 0);
    }

    #[tokio::test]
    async fn the_refusal_is_answered_once_as_resource_exhausted_then_the_body_ends() {
        use http_body_util::BodyExt;
        let config = StoreConfig {
            max_entry_bytes: 100,
            ..store(1_000).config()
        };
        let store = Arc::new(Store::new(config, Arc::new(SystemClock::new())).unwrap());
        let mut over = message(0);
        over[1..5].copy_from_slice(&(64u32 << 20).to_be_bytes());
        let frames = [Ok::<_, Status>(Frame::data(Bytes::from(over)))];
        let inner = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let mut body = IntakeBody::new(inner, store);
        let status = body.frame().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status
                .message()
                .contains("67108864 bytes is larger than the max entry size of 100"),
            "{}",
            status.message()
        );
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
    }
}
