//! The ticket (`ticket::CacheTicket::try_decode`) and the descriptor
//! (`key::CacheKey::from_descriptor`), each from the protobuf message a client sends.
#![no_main]

use arrow_flight::{FlightDescriptor, Ticket};
use bytes::Bytes;
use cache_node::key::CacheKey;
use cache_node::ticket::CacheTicket;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    // The ticket bytes as they are (the `invalidate`/`lease` bodies), and a decoded ticket
    // encodes back to the same bytes.
    if let Ok(ticket) = CacheTicket::try_decode(&bytes) {
        assert_eq!(ticket.encode(), bytes, "a ticket round-trips");
    }
    // The same bytes as the protobuf `Ticket` of a DoGet, and as a `FlightDescriptor`.
    if let Ok(ticket) = Ticket::decode(bytes.clone()) {
        let _ = CacheTicket::try_decode(&ticket.ticket);
    }
    if let Ok(descriptor) = FlightDescriptor::decode(bytes) {
        if let Ok(key) = CacheKey::from_descriptor(&descriptor) {
            // A key the node accepts reads back from its store bytes.
            let back = CacheKey::try_from_store_bytes(&key.to_store_bytes());
            assert!(back.is_ok_and(|back| back == key), "a key round-trips");
        }
    }
});
