//! IPC sealing (`wire::seal::Intake::receive`): schema, dictionary and record batch
//! messages as a DoPut delivers them, each checked (buffers within the body, dictionary
//! hydration bounded) before arrow-ipc decodes it, then sealed into stored frames.
//!
//! Input: messages, each `header length (u16 LE) ++ body length (u16 LE) ++ header ++
//! body`; a message cut short takes what is left.
#![no_main]

mod common;

use arrow_flight::FlightData;
use bytes::Bytes;
use cache_node::store::SealedSchema;
use cache_node::wire::seal::{Intake, Received};
use libfuzzer_sys::fuzz_target;

fn take(data: &mut &[u8], len: usize) -> Bytes {
    let (taken, rest) = data.split_at(len.min(data.len()));
    *data = rest;
    Bytes::copy_from_slice(taken)
}

fuzz_target!(|data: &[u8]| {
    common::arrow_panics_unwind();
    let mut data = data;
    // The hydration limit of a 1 MiB entry.
    let mut intake = Intake::new(1 << 20);
    while let Some((lengths, rest)) = data.split_first_chunk::<4>() {
        data = rest;
        let header_len = usize::from(u16::from_le_bytes([lengths[0], lengths[1]]));
        let body_len = usize::from(u16::from_le_bytes([lengths[2], lengths[3]]));
        let message = FlightData {
            data_header: take(&mut data, header_len),
            data_body: take(&mut data, body_len),
            ..FlightData::default()
        };
        match intake.receive(message) {
            // As `assembly` does with the first schema.
            Ok(Received::Schema(schema)) if intake.schema().is_none() => {
                match SealedSchema::new(std::sync::Arc::new(schema)) {
                    Ok(sealed) => intake.set_schema(sealed),
                    Err(_) => return,
                }
            }
            Ok(Received::Batches(sealed)) => {
                for part in sealed {
                    // The stored frame reads back as a message.
                    let _ = part.message.to_flight_data();
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
});
