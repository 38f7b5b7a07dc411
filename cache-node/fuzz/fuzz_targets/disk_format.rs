//! The disk format past its checksum (`persist::format::decode`), then what a reload does
//! with a decoded file: the key, the tags, and the messages through `assembly::Assembly`
//! (the same intake as a DoPut) into the store.
//!
//! The CRC-32 would stop random bytes at the door, so the target writes the checksum of
//! the input into it. The first input byte asks for more fix-ups, so mutations get deep
//! without losing the checks' own coverage: bit 0 sets the payload length to what is
//! there, bit 1 sets the schema fingerprint to the first message's.
#![no_main]

mod common;

use bytes::Bytes;
use cache_node::assembly::Assembly;
use cache_node::key::CacheKey;
use cache_node::persist::format::{self, FIXED_HEADER_BYTES};
use cache_node::routing::ring::key_hash;
use cache_node::store::Lifetime;
use libfuzzer_sys::fuzz_target;

const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// Sets the payload length and/or the fingerprint from the file's own bytes.
fn fix_up(file: &mut [u8], flags: u8) {
    let Ok(head) = format::decode_head(file) else {
        return;
    };
    let payload_start = FIXED_HEADER_BYTES + head.key.len() + usize::from(head.tags_len);
    if flags & 1 != 0
        && let Some(payload) = file.len().checked_sub(payload_start)
    {
        file[44..52].copy_from_slice(&(payload as u64).to_le_bytes());
    }
    if flags & 2 != 0
        && let Some(lengths) = file.get(payload_start..payload_start + 4)
    {
        let header_len = u32::from_le_bytes([lengths[0], lengths[1], lengths[2], lengths[3]]);
        let start = payload_start + 12;
        if let Some(header) = file.get(start..start.saturating_add(header_len as usize)) {
            let fingerprint = key_hash(header);
            file[36..44].copy_from_slice(&fingerprint.to_le_bytes());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    common::arrow_panics_unwind();
    let Some((&flags, file)) = data.split_first() else {
        return;
    };
    let mut file = file.to_vec();
    fix_up(&mut file, flags);
    if file.len() >= 12 {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&file[..8]);
        crc.update(&file[12..]);
        let sum = crc.finalize();
        file[8..12].copy_from_slice(&sum.to_le_bytes());
    }
    let Ok(decoded) = format::decode(Bytes::from(file)) else {
        return;
    };
    // As `persist`'s reload_one, past the file I/O and the clock.
    let Ok(key) = CacheKey::try_from_store_bytes(&decoded.head.key) else {
        return;
    };
    let Ok(tags) = cache_node::tags::entry_tags(decoded.tags) else {
        return;
    };
    let store = common::store(8 << 20, MAX_ENTRY_BYTES);
    let mut assembly = Assembly::new(store.begin_put(decoded.head.key.clone()), MAX_ENTRY_BYTES);
    for message in decoded.messages {
        let message = arrow_flight::FlightData {
            data_header: message.header,
            data_body: message.body,
            ..arrow_flight::FlightData::default()
        };
        if let Err(err) = assembly.accept(message, &key) {
            let _ = assembly.fail(err);
            return;
        }
    }
    let lifetime = Lifetime {
        ttl_override: decoded.head.ttl_override,
        tags,
        ..Lifetime::default()
    };
    let _ = assembly.commit(lifetime, &key);
});
