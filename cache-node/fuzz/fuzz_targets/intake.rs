//! The gRPC framing of a DoPut body (`wire::intake::IntakeBody`): the 5-byte prefixes,
//! the reservation of each announced message, the refusal of one over the max entry
//! size, and the walk of the protobuf fields before `data_body` that receives a large
//! body apart. The first input byte cuts the rest into HTTP/2 frames.
#![no_main]

mod common;

use std::sync::Arc;

use arrow_flight::FlightData;
use bytes::Bytes;
use cache_node::store::IntakeCover;
use cache_node::wire::intake::IntakeBody;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The messages of a gRPC stream: each one's bytes, `None` for one cut short.
fn messages(stream: &[u8]) -> Vec<Option<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = stream;
    while let Some((prefix, tail)) = rest.split_first_chunk::<5>() {
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if tail.len() < len {
            out.push(None);
            break;
        }
        out.push(Some(&tail[..len]));
        rest = &tail[len..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    // Frames of 1 to 256 bytes, so prefixes and field keys split every way.
    let cut = usize::from(cut) + 1;
    let frames: Vec<Result<http_body::Frame<Bytes>, tonic::Status>> = stream
        .chunks(cut)
        .map(|chunk| Ok(http_body::Frame::data(Bytes::copy_from_slice(chunk))))
        .collect();
    let inner = tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
        frames,
    )));
    // Max entry 512 KiB: a prefix above it is refused, one from 256 KiB diverted.
    let store = common::store(4 << 20, 512 << 10);
    let cover = Arc::new(IntakeCover::default());
    let mut body = IntakeBody::new(inner, Arc::clone(&store)).covering(Arc::clone(&cover));
    let mut out = Vec::new();
    let mut refused = false;
    futures::executor::block_on(async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        out.extend_from_slice(&data);
                    }
                }
                Err(_) => refused = true,
            }
        }
    });
    drop(body);
    // What the decoder and the put read together is what the client sent, message by
    // message (a body received apart put back in its place).
    let sent = messages(stream);
    let read = messages(&out);
    if !refused {
        assert_eq!(sent.len(), read.len(), "as many messages read as sent");
    }
    for (index, (sent, read)) in sent.iter().zip(&read).enumerate() {
        let (Some(sent), Some(read)) = (sent, read) else {
            continue;
        };
        let Ok(sent) = FlightData::decode(*sent) else {
            continue;
        };
        let mut read = match FlightData::decode(*read) {
            Ok(read) => read,
            Err(err) => panic!("message {index} decoded as sent but not as read: {err}"),
        };
        // As `flight::put` does: protobuf keeps the last `data_body` should a message
        // repeat the field, and the wire layer took the first out.
        if let Some(body) = cover.take_body(index as u64)
            && read.data_body.is_empty()
        {
            read.data_body = body;
        }
        assert_eq!(sent, read, "message {index}");
    }
    drop(cover);
    assert_eq!(
        store.stats().reserved_bytes,
        0,
        "every reservation is released"
    );
});
