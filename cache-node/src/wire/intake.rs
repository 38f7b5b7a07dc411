//! Budget for DoPut bytes still arriving, and large bodies received where they will be
//! kept.
//!
//! The gRPC layer buffers a whole message before the put sees it, so a put can only
//! reserve a message's bytes after they already take memory; under a storm of large
//! puts the node would briefly hold more than its budget. And the put would copy each
//! body once more, out of gRPC's buffer into the exactly sized allocation an entry
//! keeps. This body wrapper reads the
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
//!
//! An uncompressed message of [`DIVERTED_MESSAGE_BYTES`] or more is received apart: the
//! protobuf fields before its `data_body` are read (at most 64 KiB of them), the body's
//! bytes are copied from the HTTP/2 frames straight into an allocation of exactly its
//! length, and the decoder gets the message without that field. The body waits in the
//! request's [`IntakeCover`] with the message's reservation (shrunk to what stays) until
//! the put reads the message and takes it back (`flight::put::restored`); sealing keeps
//! that allocation as the entry's body, and the reservation becomes the entry's charge.
//! A message of another shape (its body after 64 KiB of other fields, a malformed field)
//! passes to the decoder whole, which judges it; a message cut short by the end of the
//! request reaches the decoder cut short, so the put fails and stores nothing.
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

/// Uncompressed messages at least this long are received apart: their `data_body` goes
/// straight into its own exactly sized allocation, the one the stored entry keeps, and
/// the gRPC decoder gets the message without it (see [`IntakeBody`]). Below it, one
/// more copy of the body costs less than a separate allocation.
pub const DIVERTED_MESSAGE_BYTES: u64 = 256 << 10;

/// Most bytes of a diverted message's fields before `data_body` (the IPC header,
/// descriptor, app_metadata) kept while looking for it; a message whose body comes later
/// passes to the gRPC decoder whole, as any other.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// Protobuf key of `FlightData.data_body` (field 1000, length-delimited).
const DATA_BODY_FIELD: u64 = 1000;

/// Bytes a message holds beyond its own length while it arrives: the HTTP/2 frame being
/// copied into the message buffer still sits in the connection's read buffer.
fn in_transit(length: u64) -> u64 {
    length.min(MAX_INCOMING_FRAME_BYTES)
}

/// Where the parser is in the gRPC framing.
#[derive(Debug)]
enum Framing {
    /// Reading a message prefix; `have` of its bytes seen so far.
    Prefix {
        bytes: [u8; PREFIX_BYTES],
        have: usize,
    },
    /// Inside a message body that passes to the decoder; `remaining` bytes to go.
    Message { remaining: u64 },
    /// Inside a message whose `data_body` is received apart.
    Diverting(Box<Diverting>),
}

/// A large message being received apart: its fields before `data_body` (`head`), the
/// body in its own allocation, and any fields after it (`tail`).
#[derive(Debug)]
struct Diverting {
    sequence: u64,
    prefix: [u8; PREFIX_BYTES],
    /// Message bytes announced by the prefix, and seen so far.
    length: u64,
    received: u64,
    head: Vec<u8>,
    /// Allocated with the exact length once the body's field is found.
    body: Option<Vec<u8>>,
    body_len: usize,
    tail: Vec<u8>,
}

/// What a chunk of a diverted message led to.
enum Fed {
    /// More bytes of the message are needed.
    More,
    /// The message does not have the expected shape: these bytes (prefix and what was
    /// kept) pass to the decoder, and the rest of the message after them.
    PassThrough(Bytes),
    /// The whole message arrived: the decoder gets `placeholder` (the message without
    /// its `data_body`), the put gets `body`.
    Complete { placeholder: Bytes, body: Bytes },
}

impl Diverting {
    fn new(sequence: u64, prefix: [u8; PREFIX_BYTES], length: u64) -> Self {
        Self {
            sequence,
            prefix,
            length,
            received: 0,
            head: Vec::new(),
            body: None,
            body_len: 0,
            tail: Vec::new(),
        }
    }

    /// Takes the next `chunk` of the message (never past its end).
    fn feed(&mut self, mut chunk: &[u8]) -> Fed {
        self.received += chunk.len() as u64;
        loop {
            match &mut self.body {
                None => {
                    let take = (MAX_HEAD_BYTES - self.head.len()).min(chunk.len());
                    self.head.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    match locate_body(&self.head) {
                        Located::Body {
                            key_start,
                            body_start,
                            body_len,
                        } if (body_start as u64).saturating_add(body_len) <= self.length => {
                            // Within the message, so within the max entry size.
                            let body_len = usize::try_from(body_len).unwrap_or(usize::MAX);
                            let after = self.head.split_off(body_start);
                            self.head.truncate(key_start);
                            let in_body = after.len().min(body_len);
                            let mut body = Vec::with_capacity(body_len);
                            body.extend_from_slice(&after[..in_body]);
                            self.tail.extend_from_slice(&after[in_body..]);
                            self.body = Some(body);
                            self.body_len = body_len;
                        }
                        Located::NeedMore if chunk.is_empty() && self.received < self.length => {
                            return Fed::More;
                        }
                        _ => {
                            let mut whole =
                                Vec::with_capacity(PREFIX_BYTES + self.head.len() + chunk.len());
                            whole.extend_from_slice(&self.prefix);
                            whole.extend_from_slice(&self.head);
                            whole.extend_from_slice(chunk);
                            return Fed::PassThrough(Bytes::from(whole));
                        }
                    }
                }
                Some(body) if body.len() < self.body_len => {
                    let take = (self.body_len - body.len()).min(chunk.len());
                    body.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                }
                Some(_) => {
                    self.tail.extend_from_slice(chunk);
                    chunk = &[];
                }
            }
            if self.received == self.length
                && chunk.is_empty()
                && let Some(body) = self.body.take()
            {
                return Fed::Complete {
                    placeholder: self.placeholder(),
                    body: Bytes::from(body),
                };
            }
            if chunk.is_empty() {
                return Fed::More;
            }
        }
    }

    /// The message without its `data_body` field, framed for the decoder.
    fn placeholder(&self) -> Bytes {
        let fields = self.head.len() + self.tail.len();
        let mut message = Vec::with_capacity(PREFIX_BYTES + fields);
        message.push(0);
        // At most the message's own length, which fit the prefix.
        message.extend_from_slice(&u32::try_from(fields).unwrap_or(u32::MAX).to_be_bytes());
        message.extend_from_slice(&self.head);
        message.extend_from_slice(&self.tail);
        Bytes::from(message)
    }
}

/// Where `data_body` starts in the first bytes of a `FlightData` message.
#[derive(Debug, PartialEq, Eq)]
enum Located {
    /// Its key starts at `key_start`, its bytes at `body_start`.
    Body {
        key_start: usize,
        body_start: usize,
        body_len: u64,
    },
    /// Not found in these bytes yet.
    NeedMore,
    /// Not a shape to divert (a group, a bad varint, `data_body` not length-delimited);
    /// the decoder will judge it.
    NotDivertible,
}

/// Walks the protobuf fields of `head` up to `data_body`'s key and length.
fn locate_body(head: &[u8]) -> Located {
    let mut at = 0;
    loop {
        let key_start = at;
        let Some((key, used)) = varint(&head[at..]) else {
            return if head.len() - at < 10 {
                Located::NeedMore
            } else {
                Located::NotDivertible
            };
        };
        at += used;
        let skip = match key & 7 {
            0 => match varint(&head[at..]) {
                Some((_, used)) => used as u64,
                None => return Located::NeedMore,
            },
            1 => 8,
            5 => 4,
            2 => {
                let Some((len, used)) = varint(&head[at..]) else {
                    return Located::NeedMore;
                };
                at += used;
                if key >> 3 == DATA_BODY_FIELD {
                    return Located::Body {
                        key_start,
                        body_start: at,
                        body_len: len,
                    };
                }
                len
            }
            _ => return Located::NotDivertible,
        };
        if key >> 3 == DATA_BODY_FIELD {
            return Located::NotDivertible;
        }
        match usize::try_from(skip)
            .ok()
            .and_then(|skip| at.checked_add(skip))
        {
            Some(next) if next < head.len() => at = next,
            _ => return Located::NeedMore,
        }
    }
}

/// A protobuf varint at the start of `bytes` and its length; `None` if incomplete (or
/// longer than ten bytes, which [`locate_body`] tells apart by the bytes available).
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (index, byte) in bytes.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
    }
    None
}

/// A DoPut request body that reserves each message's bytes as soon as its length is
/// known, and receives the `data_body` of each large message apart, into the exactly
/// sized allocation the stored entry will keep (handed to the put through the
/// [`IntakeCover`]; the gRPC decoder gets the message without it). What the decoder
/// reads is the request's messages in order, reframed: prefixes pass as their own
/// chunks, message bytes as slices of the frames that carried them.
pub struct IntakeBody {
    inner: Body,
    store: std::sync::Arc<Store>,
    framing: Framing,
    /// Messages whose prefix has been read (the next message's sequence).
    messages: u64,
    /// Chunks for the decoder, in order; `emitted` of them handed out so far.
    out: std::collections::VecDeque<Bytes>,
    emitted: u64,
    /// The reservation of the message arriving now.
    current: Option<IntakeReservation>,
    /// Reservations of messages that have passed through, with the count of chunks
    /// handed out once their last one is: released on the read after that.
    passed: Vec<(u64, IntakeReservation)>,
    /// Set once a message over the max entry size was announced: the body answers this
    /// error once (after the chunks before it), then ends.
    refused: Option<Refusal>,
    /// Told when a message passes unreserved, and given the bodies received apart.
    cover: std::sync::Arc<IntakeCover>,
    /// The request body has ended.
    inner_done: bool,
}

/// A message over the max entry size, seen in its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Not yet answered to the reader: the message is over the max entry size.
    Pending { size: u64, max: u64 },
    /// Not yet answered: the budget has no room for the message (puts in flight hold
    /// it), so it is not buffered outside the budget.
    NoRoom { size: u64, budget: u64 },
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
            messages: 0,
            out: std::collections::VecDeque::new(),
            emitted: 0,
            current: None,
            passed: Vec::new(),
            refused: None,
            cover: std::sync::Arc::default(),
            inner_done: false,
        }
    }

    /// Reports messages that pass unreserved, and hands the bodies received apart, to
    /// `cover` (the put reads it).
    pub fn covering(self, cover: std::sync::Arc<IntakeCover>) -> Self {
        Self { cover, ..self }
    }

    /// Follows the framing through `frame`, reserving each message announced in it and
    /// queueing what the decoder reads. Stops at the prefix of a message over the max
    /// entry size (then `refused` is set).
    fn observe(&mut self, frame: &Bytes) {
        let mut at = 0;
        while at < frame.len() && self.refused.is_none() {
            let data = &frame[at..];
            match &mut self.framing {
                Framing::Prefix { bytes, have } => {
                    let take = (PREFIX_BYTES - *have).min(data.len());
                    bytes[*have..*have + take].copy_from_slice(&data[..take]);
                    *have += take;
                    at += take;
                    if *have == PREFIX_BYTES {
                        let prefix = *bytes;
                        self.prefix_read(prefix);
                    }
                }
                Framing::Message { remaining } => {
                    let take = usize::try_from(*remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    *remaining -= take as u64;
                    let done = *remaining == 0;
                    self.out.push_back(frame.slice(at..at + take));
                    at += take;
                    if done {
                        self.message_passed();
                    }
                }
                Framing::Diverting(diverting) => {
                    let take = usize::try_from(diverting.length - diverting.received)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    let fed = diverting.feed(&data[..take]);
                    at += take;
                    let (sequence, remaining) =
                        (diverting.sequence, diverting.length - diverting.received);
                    match fed {
                        Fed::More => {}
                        Fed::PassThrough(bytes) => {
                            self.out.push_back(bytes);
                            self.framing = Framing::Message { remaining };
                            if remaining == 0 {
                                self.message_passed();
                            }
                        }
                        Fed::Complete { placeholder, body } => {
                            // What stays: the body (kept by the entry) and the small
                            // placeholder until the decoder has read it.
                            let mut reservation = self.current.take();
                            if let Some(reservation) = &mut reservation {
                                reservation.shrink_to((body.len() + placeholder.len()) as u64);
                            }
                            self.cover.divert(sequence, body, reservation);
                            self.out.push_back(placeholder);
                            self.framing = Framing::Prefix {
                                bytes: [0; PREFIX_BYTES],
                                have: 0,
                            };
                        }
                    }
                }
            }
        }
    }

    /// A message's prefix is complete: refuse, reserve, and decide how it is received.
    fn prefix_read(&mut self, prefix: [u8; PREFIX_BYTES]) {
        let length = u64::from(u32::from_be_bytes([
            prefix[1], prefix[2], prefix[3], prefix[4],
        ]));
        // Refused before a byte of it is buffered, nothing evicted for it.
        let max = self.store.config().max_entry_bytes;
        if length > max {
            self.refused = Some(Refusal::Pending { size: length, max });
            return;
        }
        self.current = self.store.reserve_intake(length + in_transit(length));
        if self.current.is_none() {
            // Buffering it anyway would hold bytes no budget counts; the put's own checks
            // came only after the whole message was in memory.
            self.cover.note_uncovered();
            self.refused = Some(Refusal::NoRoom {
                size: length,
                budget: self.store.config().budget_bytes,
            });
            return;
        }
        let sequence = self.messages;
        self.messages += 1;
        let compressed = prefix[0] != 0;
        if !compressed && length >= DIVERTED_MESSAGE_BYTES {
            self.framing = Framing::Diverting(Box::new(Diverting::new(sequence, prefix, length)));
            return;
        }
        self.out.push_back(Bytes::copy_from_slice(&prefix));
        self.framing = Framing::Message { remaining: length };
        if length == 0 {
            self.message_passed();
        }
    }

    fn message_passed(&mut self) {
        let handed_out_with = self.emitted + self.out.len() as u64;
        self.passed.extend(
            self.current
                .take()
                .map(|reservation| (handed_out_with, reservation)),
        );
        self.framing = Framing::Prefix {
            bytes: [0; PREFIX_BYTES],
            have: 0,
        };
    }

    /// The bytes of an unfinished message not yet handed to the decoder: a partial
    /// prefix, or a diverted message's prefix and fields.
    fn held_back(&mut self) -> Option<Bytes> {
        let framing = std::mem::replace(
            &mut self.framing,
            Framing::Prefix {
                bytes: [0; PREFIX_BYTES],
                have: 0,
            },
        );
        match framing {
            Framing::Prefix { bytes, have } if have > 0 => {
                Some(Bytes::copy_from_slice(&bytes[..have]))
            }
            Framing::Diverting(diverting) => {
                let mut held = diverting.prefix.to_vec();
                held.extend_from_slice(&diverting.head);
                Some(Bytes::from(held))
            }
            _ => None,
        }
    }

    /// Bytes currently reserved by this body (for tests).
    #[cfg(test)]
    fn reserved(&self) -> u64 {
        self.current
            .iter()
            .chain(self.passed.iter().map(|(_, reservation)| reservation))
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
        // The reader asks for more only after it has taken the messages handed out
        // (and the put has reserved what it keeps), so their budget can go back now.
        let emitted = this.emitted;
        this.passed
            .retain(|(handed_out_with, _)| *handed_out_with > emitted);
        loop {
            if let Some(chunk) = this.out.pop_front() {
                this.emitted += 1;
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            match this.refused {
                Some(Refusal::Answered) => return Poll::Ready(None),
                Some(Refusal::Pending { size, max }) => {
                    this.refused = Some(Refusal::Answered);
                    this.current = None;
                    this.passed.clear();
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "a put message of {size} bytes is larger than the max entry size of \
                         {max} bytes; refused before it was read, nothing was stored"
                    )))));
                }
                Some(Refusal::NoRoom { size, budget }) => {
                    this.refused = Some(Refusal::Answered);
                    this.current = None;
                    this.passed.clear();
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "a put message of {size} bytes finds no room in the node's memory \
                         budget of {budget} bytes (puts in flight hold it); refused before it \
                         was read, nothing was stored; retry"
                    )))));
                }
                None => {}
            }
            if this.inner_done {
                return Poll::Ready(None);
            }
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            let Poll::Ready(Some(Ok(frame))) = polled else {
                if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
                    this.current = None;
                }
                if matches!(polled, Poll::Ready(None)) {
                    // A message cut short must reach the decoder as cut short (it
                    // answers an error and nothing is stored), not vanish.
                    this.inner_done = true;
                    if let Some(held) = this.held_back() {
                        this.out.push_back(held);
                        continue;
                    }
                }
                return polled;
            };
            match frame.into_data() {
                // The messages before a refused one still reach the put (it counts the
                // refusal); the refused message's bytes and everything after are dropped.
                Ok(data) => this.observe(&data),
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Bytes held back (a partial prefix, a diverted message) must still reach the
        // decoder when the request ends.
        let holds_back = matches!(
            self.framing,
            Framing::Prefix { have: 1.., .. } | Framing::Diverting(_)
        );
        self.out.is_empty()
            && (self.refused == Some(Refusal::Answered)
                || (self.inner.is_end_stream() && !holds_back))
    }

    fn size_hint(&self) -> SizeHint {
        // Reframing changes the length: only a lower bound of zero holds.
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_flight::FlightData;

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

    fn observe(body: &mut IntakeBody, data: &[u8]) {
        body.observe(&Bytes::copy_from_slice(data));
    }

    #[test]
    fn a_message_is_reserved_when_its_prefix_arrives_and_released_after_it_passed() {
        assert_eq!(in_transit(5 << 20), MAX_INCOMING_FRAME_BYTES);
        let store = store(1 << 20);
        let mut body = IntakeBody::new(Body::empty(), Arc::clone(&store));
        let first = message(1_000);
        // The prefix split across two frames, then part of the body.
        observe(&mut body, &first[..3]);
        assert_eq!(body.reserved(), 0);
        observe(&mut body, &first[3..100]);
        // The message and the frame carrying it, which may be in two buffers at once.
        assert_eq!(body.reserved(), 2_000);
        assert_eq!(store.stats().reserved_bytes, 2_000);
        // The rest of the first message and all of a second one in one frame.
        let mut rest = first[100..].to_vec();
        rest.extend(message(500));
        observe(&mut body, &rest);
        assert_eq!(body.passed.len(), 2);
        assert!(body.current.is_none());
        assert_eq!(store.stats().reserved_bytes, 3_000);
        // Handed out chunk by chunk: the prefix, the first 95 bytes, the rest, then the
        // second message's prefix and bytes.
        let handed: Vec<Bytes> = body.out.drain(..).collect();
        assert_eq!(handed.concat(), [first, message(500)].concat());
        body.emitted += handed.len() as u64;
        let emitted = body.emitted;
        body.passed.retain(|(with, _)| *with > emitted);
        assert_eq!(store.stats().reserved_bytes, 0);
        drop(body);
        assert_eq!(store.stats().reserved_bytes, 0);
    }

    #[test]
    fn a_message_the_budget_cannot_hold_is_refused_when_its_prefix_arrives() {
        let store = store(1_000);
        let held = store.reserve_intake(900).unwrap();
        let cover = Arc::new(IntakeCover::default());
        let mut body =
            IntakeBody::new(Body::empty(), Arc::clone(&store)).covering(Arc::clone(&cover));
        // A message that fits, then one the budget has no room for, in the same frame.
        let mut data = message(10);
        data.extend_from_slice(&message(500)[..50]);
        observe(&mut body, &data);
        assert_eq!(
            body.out.iter().map(Bytes::len).sum::<usize>(),
            15,
            "the first message still reaches the decoder, none of the second"
        );
        assert_eq!(
            body.refused,
            Some(Refusal::NoRoom {
                size: 500,
                budget: 1_000
            })
        );
        assert_eq!(store.stats().reserved_bytes, 920, "nothing reserved for it");
        // Nothing more is read: the rest of the message is never buffered.
        observe(&mut body, &message(500)[50..]);
        assert!(body.out.iter().map(Bytes::len).sum::<usize>() <= 15);
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
        observe(&mut body, &data);
        assert_eq!(
            body.out.iter().map(Bytes::len).sum::<usize>(),
            65,
            "the first message still reaches the decoder"
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

    /// A DoPut body over a 64 MiB store, reporting to its own cover.
    fn covered_body() -> (Arc<Store>, Arc<IntakeCover>, IntakeBody) {
        let store = store(64 << 20);
        let cover = Arc::new(IntakeCover::default());
        let body = IntakeBody::new(Body::empty(), Arc::clone(&store)).covering(Arc::clone(&cover));
        (store, cover, body)
    }

    /// A `FlightData` as a client frames it: prefix, then the protobuf message.
    fn framed(data: &FlightData) -> Vec<u8> {
        use prost::Message;
        let encoded = data.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend(encoded);
        out
    }

    fn flight_data(header: usize, body: usize, metadata: usize, seed: u8) -> FlightData {
        let bytes = |len: usize, salt: u8| {
            Bytes::from(
                (0..len)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed ^ salt))
                    .collect::<Vec<u8>>(),
            )
        };
        FlightData {
            data_header: bytes(header, 1),
            app_metadata: bytes(metadata, 2),
            data_body: bytes(body, 3),
            ..FlightData::default()
        }
    }

    /// What the decoder and the put see: the messages of the reframed stream, each with
    /// its diverted body put back; and how many bodies were diverted.
    fn reassembled(chunks: &[Bytes], cover: &IntakeCover) -> (Vec<FlightData>, usize) {
        use prost::Message;
        let stream = chunks.concat();
        let (mut at, mut messages, mut diverted) = (0, Vec::new(), 0);
        while at < stream.len() {
            assert_eq!(stream[at], 0, "uncompressed");
            let len = u32::from_be_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize;
            let mut data = FlightData::decode(&stream[at + 5..at + 5 + len]).unwrap();
            if let Some(body) = cover.take_body(messages.len() as u64) {
                assert!(
                    data.data_body.is_empty(),
                    "the decoder never sees a diverted body"
                );
                data.data_body = body;
                diverted += 1;
            }
            messages.push(data);
            at += 5 + len;
        }
        (messages, diverted)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// However the HTTP/2 frames cut the stream, the decoder and the put together
        /// read exactly the messages sent; large bodies arrive apart, each in an
        /// allocation of exactly its length.
        #[test]
        fn any_framing_yields_the_messages_sent_with_large_bodies_apart(
            shapes in proptest::collection::vec(
                (0usize..300, proptest::prop_oneof![0usize..2_000, 250_000usize..700_000], 0usize..40),
                1..5,
            ),
            cuts in proptest::collection::vec(1usize..300_000, 1..12),
        ) {
            let sent: Vec<FlightData> = shapes
                .iter()
                .enumerate()
                .map(|(i, (header, body, metadata))| flight_data(*header, *body, *metadata, i as u8))
                .collect();
            let stream: Vec<u8> = sent.iter().flat_map(framed).collect();
            let (_store, cover, mut body) = covered_body();
            let mut at = 0;
            for cut in cuts.iter().cycle() {
                if at == stream.len() {
                    break;
                }
                let end = (at + cut).min(stream.len());
                observe(&mut body, &stream[at..end]);
                at = end;
            }
            let chunks: Vec<Bytes> = body.out.drain(..).collect();
            let large = sent.iter().filter(|m| framed(m).len() - 5 >= DIVERTED_MESSAGE_BYTES as usize).count();
            let (received, diverted) = reassembled(&chunks, &cover);
            proptest::prop_assert_eq!(&received, &sent);
            proptest::prop_assert_eq!(diverted, large);
        }
    }

    #[test]
    fn a_diverted_body_is_its_own_exact_allocation_and_keeps_its_reservation() {
        let (store, cover, mut body) = covered_body();
        let sent = flight_data(200, 1 << 20, 0, 9);
        let stream = framed(&sent);
        for piece in stream.chunks(16 << 10) {
            observe(&mut body, piece);
        }
        let placeholder: Vec<Bytes> = body.out.drain(..).collect();
        assert_eq!(
            placeholder.len(),
            1,
            "one chunk: the message without its body"
        );
        assert!(placeholder[0].len() < 300);
        // Kept: the body and the placeholder, not the frame in transit.
        let kept = (1 << 20) + placeholder[0].len() as u64;
        assert_eq!(store.stats().reserved_bytes, kept);
        let taken = cover.take_body(0).unwrap();
        assert_eq!(taken, sent.data_body);
        // Uniquely owned and exactly sized: sealing keeps it without a copy.
        let unique = taken.clone();
        drop(taken);
        let unique = unique.try_into_mut().unwrap();
        assert_eq!(unique.capacity(), 1 << 20);
        let frozen = unique.freeze();
        // The put claims the reservation of the body it read; anything else claims none.
        assert!(cover.claim(&frozen[1..]).is_none());
        let claimed = cover.claim(&frozen).unwrap();
        assert_eq!(claimed.bytes(), kept);
        assert!(cover.claim(&frozen).is_none(), "claimed once");
        drop(claimed);
        assert_eq!(store.stats().reserved_bytes, 0);
    }

    #[test]
    fn an_unclaimed_body_reservation_goes_back_when_the_next_message_is_read() {
        let (store, cover, mut body) = covered_body();
        observe(&mut body, &framed(&flight_data(10, 300_000, 0, 1)));
        assert!(store.stats().reserved_bytes > 300_000);
        assert!(cover.take_body(0).is_some());
        assert!(
            store.stats().reserved_bytes > 300_000,
            "held while the put reads it"
        );
        assert!(cover.take_body(1).is_none());
        assert_eq!(
            store.stats().reserved_bytes,
            0,
            "a forwarded message is not claimed"
        );
    }

    #[test]
    fn a_body_field_after_more_than_64_kib_of_other_fields_passes_whole() {
        let (_store, cover, mut body) = covered_body();
        let sent = flight_data(100, 300_000, 70_000, 3);
        observe(&mut body, &framed(&sent));
        let chunks: Vec<Bytes> = body.out.drain(..).collect();
        let (received, diverted) = reassembled(&chunks, &cover);
        assert_eq!((received, diverted), (vec![sent], 0));
    }

    #[test]
    fn a_malformed_field_before_the_body_passes_whole_for_the_decoder_to_judge() {
        assert_eq!(
            locate_body(&[0x0b, 1, 2]),
            Located::NotDivertible,
            "a group"
        );
        assert_eq!(
            locate_body(&[0xff; 12]),
            Located::NotDivertible,
            "an endless varint"
        );
        assert_eq!(
            locate_body(&[0xc0, 0x3e, 5]),
            Located::NotDivertible,
            "data_body as a varint"
        );
        assert_eq!(locate_body(&[0x12, 0x03, 1]), Located::NeedMore);
        assert_eq!(
            locate_body(&[0x12, 0x01, 9, 0xc2, 0x3e, 0x80, 0x80, 0x10]),
            Located::Body {
                key_start: 3,
                body_start: 8,
                body_len: 1 << 18
            }
        );
    }

    #[tokio::test]
    async fn a_diverted_message_cut_short_reaches_the_decoder_cut_short() {
        use http_body_util::BodyExt;
        let store = store(64 << 20);
        let sent = framed(&flight_data(50, 400_000, 0, 4));
        let frames = [Ok::<_, Status>(Frame::data(Bytes::copy_from_slice(
            &sent[..200_000],
        )))];
        let inner = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let mut body = IntakeBody::new(inner, Arc::clone(&store));
        let mut handed = Vec::new();
        while let Some(frame) = body.frame().await {
            handed.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        let announced = u32::from_be_bytes(handed[1..5].try_into().unwrap()) as usize;
        assert!(
            handed.len() - 5 < announced,
            "the decoder sees {} of {announced} bytes: an incomplete message, an error",
            handed.len() - 5
        );
        assert!(body.frame().await.is_none());
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
