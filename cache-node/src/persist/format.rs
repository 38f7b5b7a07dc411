//! The on-disk form of one entry: a fixed header, the key, the entry's tags, then its
//! stored IPC messages exactly as the store holds them (ADR 0007), all under one checksum.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "FCDE"
//!      4     2  format version (2; version 1, without tags, is still read)
//!      6     2  tags length T (0 in version 1, where the field was reserved)
//!      8     4  CRC-32 of every other byte of the file
//!     12     4  key length K
//!     16     4  message count M (the schema message, then one per batch)
//!     20     8  creation time, Unix milliseconds
//!     28     8  the entry's own TTL in milliseconds (0: the pool's TTL applies)
//!     36     8  schema fingerprint (stable hash of the schema message's IPC header)
//!     44     8  payload length P
//!     52     K  key (the store key: kind byte + key bytes)
//!   52+K     T  each tag: its length (1), its bytes
//! 52+K+T     P  M times: IPC header length (4), body length (8), IPC header, body
//! ```
//!
//! All integers little-endian. Decoding treats the file as untrusted: every length is
//! checked against what is there before it is used, the checksum covers the rest, and
//! the messages are then read by the same intake as a DoPut. Pure: no I/O.
//!
//! Owns: the file format and its encoding and checks. Bytes only: no file I/O (that is
//! `persist/mod.rs`); imports the store's [`Entry`](crate::store::Entry) and the ring's
//! key hash, nothing of the transport.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes};

use crate::routing::ring::key_hash;
use crate::store::Entry;

/// First bytes of every entry file.
pub const MAGIC: [u8; 4] = *b"FCDE";
/// The format this build writes.
pub const VERSION: u16 = 2;
/// The oldest format this build reads (a warm restart after an upgrade keeps its files).
pub const OLDEST_READ_VERSION: u16 = 1;
/// Bytes before the key.
pub const FIXED_HEADER_BYTES: usize = 52;
/// Longest key a file may name (keys are bounded far below this by the node).
pub const MAX_KEY_BYTES: u32 = 1 << 20;

/// Why a file is not a readable entry. Such a file is never served: the reload counts
/// and removes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Shorter than its header or its declared lengths.
    #[error("truncated: {needed} bytes needed, {found} present")]
    Truncated {
        /// Bytes the header declares.
        needed: u64,
        /// Bytes present.
        found: u64,
    },
    /// Not an entry file of this product.
    #[error("not an entry file (magic {found:02x?})")]
    Foreign {
        /// The first bytes found.
        found: [u8; 4],
    },
    /// Written by another format version.
    #[error("format version {0} (this build reads {OLDEST_READ_VERSION} to {VERSION})")]
    Version(u16),
    /// A length field is out of bounds.
    #[error("{field} of {value} is out of bounds")]
    Bounds {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// The bytes do not match their checksum (a torn or damaged file).
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum {
        /// From the header.
        stored: u32,
        /// Over the bytes found.
        computed: u32,
    },
    /// The schema message does not match the header's fingerprint.
    #[error("schema fingerprint mismatch")]
    Fingerprint,
}

/// The header fields of an entry file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The store key.
    pub key: Bytes,
    /// When the entry was first written.
    pub created: SystemTime,
    /// The entry's own TTL, if it has one.
    pub ttl_override: Option<Duration>,
    /// Stable hash of the schema message's IPC header.
    pub schema_fingerprint: u64,
    /// Number of stored messages.
    pub message_count: u32,
    /// Bytes of the messages (after the key and the tags).
    pub payload_len: u64,
    /// Bytes of the tags block after the key.
    pub tags_len: u16,
}

/// One stored IPC message: its flatbuffer header and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    /// The IPC message header (`FlightData.data_header`).
    pub header: Bytes,
    /// The IPC body (`FlightData.data_body`).
    pub body: Bytes,
}

/// A decoded entry file: its header and its messages, sharing the file's buffer.
#[derive(Debug, Clone)]
pub struct DecodedEntry {
    /// The header.
    pub head: Head,
    /// The schema message, then one message per batch.
    pub messages: Vec<StoredMessage>,
    /// The entry's tags, as stored (the reload checks them like a put's).
    pub tags: Vec<String>,
}

/// The parts of an entry file, in order, for a vectored write.
#[derive(Debug)]
pub struct EncodedEntry {
    /// Header, key and every message's length prefix and IPC header.
    pub parts: Vec<Bytes>,
    /// Sum of the parts' lengths.
    pub len: u64,
}

fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Encodes `entry` stored under `key`, first written at `created`. The message bodies
/// are shared, not copied.
pub fn encode(key: &[u8], entry: &Entry, created: SystemTime) -> EncodedEntry {
    let messages = entry.wire_messages();
    let schema_fingerprint = messages
        .first()
        .map(|schema| key_hash(&schema.ipc_header()))
        .unwrap_or(0);
    let mut payload: Vec<Bytes> = Vec::with_capacity(messages.len() * 2);
    let mut payload_len = 0u64;
    for message in messages {
        let header = message.ipc_header();
        let body = message.body().clone();
        let mut prefix = Vec::with_capacity(12 + header.len());
        prefix.extend_from_slice(
            &u32::try_from(header.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        prefix.extend_from_slice(&(body.len() as u64).to_le_bytes());
        prefix.extend_from_slice(&header);
        payload_len += (prefix.len() + body.len()) as u64;
        payload.push(Bytes::from(prefix));
        if !body.is_empty() {
            payload.push(body);
        }
    }
    // Tags are at most 128 bytes each and 16 per entry (`crds::tags`): the block fits
    // its u16 length; one that would not is left out rather than written wrong.
    let mut tags_block = Vec::new();
    for tag in entry.tags().iter() {
        if let Ok(len) = u8::try_from(tag.len()) {
            tags_block.push(len);
            tags_block.extend_from_slice(tag.as_bytes());
        }
    }
    let tags_len = u16::try_from(tags_block.len()).unwrap_or(0);
    if tags_len == 0 {
        tags_block.clear();
    }
    let mut after_crc = Vec::with_capacity(FIXED_HEADER_BYTES - 12 + key.len() + tags_block.len());
    after_crc.extend_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_le_bytes());
    after_crc.extend_from_slice(
        &u32::try_from(messages.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    after_crc.extend_from_slice(&unix_millis(created).to_le_bytes());
    after_crc.extend_from_slice(&entry.ttl_override().map(millis).unwrap_or(0).to_le_bytes());
    after_crc.extend_from_slice(&schema_fingerprint.to_le_bytes());
    after_crc.extend_from_slice(&payload_len.to_le_bytes());
    after_crc.extend_from_slice(key);
    after_crc.extend_from_slice(&tags_block);
    let after_crc = Bytes::from(after_crc);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&MAGIC);
    crc.update(&VERSION.to_le_bytes());
    crc.update(&tags_len.to_le_bytes());
    crc.update(&after_crc);
    for part in &payload {
        crc.update(part);
    }
    let mut first = Vec::with_capacity(12);
    first.extend_from_slice(&MAGIC);
    first.extend_from_slice(&VERSION.to_le_bytes());
    first.extend_from_slice(&tags_len.to_le_bytes());
    first.extend_from_slice(&crc.finalize().to_le_bytes());
    let mut parts = Vec::with_capacity(payload.len() + 2);
    parts.push(Bytes::from(first));
    parts.push(after_crc);
    parts.extend(payload);
    let len = parts.iter().map(|part| part.len() as u64).sum();
    EncodedEntry { parts, len }
}

/// Reads the header and key from the first bytes of a file (at least
/// [`FIXED_HEADER_BYTES`] plus the key). Checks magic, version and bounds, not the
/// checksum: enough to learn which key a file holds.
///
/// # Errors
/// [`FormatError`] for a foreign, short or out-of-bounds header.
pub fn decode_head(bytes: &[u8]) -> Result<Head, FormatError> {
    if bytes.len() < FIXED_HEADER_BYTES {
        return Err(FormatError::Truncated {
            needed: FIXED_HEADER_BYTES as u64,
            found: bytes.len() as u64,
        });
    }
    let mut cursor = bytes;
    let mut magic = [0u8; 4];
    cursor.copy_to_slice(&mut magic);
    if magic != MAGIC {
        return Err(FormatError::Foreign { found: magic });
    }
    let version = cursor.get_u16_le();
    if !(OLDEST_READ_VERSION..=VERSION).contains(&version) {
        return Err(FormatError::Version(version));
    }
    let tags_len = match cursor.get_u16_le() {
        // Reserved in version 1.
        _ if version == 1 => 0,
        len => len,
    };
    let _crc = cursor.get_u32_le();
    let key_len = cursor.get_u32_le();
    let message_count = cursor.get_u32_le();
    let created_ms = cursor.get_u64_le();
    let ttl_ms = cursor.get_u64_le();
    let schema_fingerprint = cursor.get_u64_le();
    let payload_len = cursor.get_u64_le();
    if key_len > MAX_KEY_BYTES {
        return Err(FormatError::Bounds {
            field: "key length",
            value: key_len.into(),
        });
    }
    let key_len = key_len as usize;
    if cursor.len() < key_len {
        return Err(FormatError::Truncated {
            needed: (FIXED_HEADER_BYTES + key_len) as u64,
            found: bytes.len() as u64,
        });
    }
    let key = Bytes::copy_from_slice(&cursor[..key_len]);
    Ok(Head {
        key,
        created: UNIX_EPOCH + Duration::from_millis(created_ms),
        ttl_override: (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms)),
        schema_fingerprint,
        message_count,
        payload_len,
        tags_len,
    })
}

/// Decodes a whole file. The messages share `file`'s buffer.
///
/// # Errors
/// [`FormatError`] for anything but an intact file of this format.
pub fn decode(file: Bytes) -> Result<DecodedEntry, FormatError> {
    let head = decode_head(&file)?;
    let tags_start = FIXED_HEADER_BYTES + head.key.len();
    let payload_start = tags_start + usize::from(head.tags_len);
    let needed = (payload_start as u64).saturating_add(head.payload_len);
    if needed != file.len() as u64 {
        return Err(FormatError::Truncated {
            needed,
            found: file.len() as u64,
        });
    }
    let stored = u32::from_le_bytes([file[8], file[9], file[10], file[11]]);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&file[..8]);
    crc.update(&file[12..]);
    let computed = crc.finalize();
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    let tags = decode_tags(&file[tags_start..payload_start])?;
    // At least 12 bytes per message: a count beyond that is a lie the checksum missed.
    if u64::from(head.message_count) > head.payload_len / 12 {
        return Err(FormatError::Bounds {
            field: "message count",
            value: head.message_count.into(),
        });
    }
    let mut messages = Vec::with_capacity(head.message_count as usize);
    let mut at = payload_start;
    for _ in 0..head.message_count {
        let rest = file.len() - at;
        if rest < 12 {
            return Err(FormatError::Truncated {
                needed: (at + 12) as u64,
                found: file.len() as u64,
            });
        }
        let mut lengths = &file[at..at + 12];
        let header_len = lengths.get_u32_le() as u64;
        let body_len = lengths.get_u64_le();
        let total = 12u64.saturating_add(header_len).saturating_add(body_len);
        if total > rest as u64 {
            return Err(FormatError::Bounds {
                field: "message length",
                value: total,
            });
        }
        let header_start = at + 12;
        let body_start = header_start + header_len as usize;
        let end = body_start + body_len as usize;
        messages.push(StoredMessage {
            header: file.slice(header_start..body_start),
            body: file.slice(body_start..end),
        });
        at = end;
    }
    if at != file.len() {
        return Err(FormatError::Bounds {
            field: "payload length",
            value: head.payload_len,
        });
    }
    let fingerprint = messages
        .first()
        .map(|schema| key_hash(&schema.header))
        .unwrap_or(0);
    if fingerprint != head.schema_fingerprint {
        return Err(FormatError::Fingerprint);
    }
    Ok(DecodedEntry {
        head,
        messages,
        tags,
    })
}

/// The tags block: each tag's length (one byte, at least 1) and its bytes (UTF-8).
fn decode_tags(mut block: &[u8]) -> Result<Vec<String>, FormatError> {
    let bounds = |value: usize| FormatError::Bounds {
        field: "tag length",
        value: value as u64,
    };
    let mut tags = Vec::new();
    while let Some((&len, rest)) = block.split_first() {
        let len = usize::from(len);
        if len == 0 || len > rest.len() {
            return Err(bounds(len));
        }
        let tag = std::str::from_utf8(&rest[..len]).map_err(|_| bounds(len))?;
        tags.push(tag.to_owned());
        block = &rest[len..];
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_file() -> Bytes {
        sample_file_tagged(&[])
    }

    /// An entry under `Pkey` with `tags`, encoded.
    fn sample_file_tagged(tags: &[&str]) -> Bytes {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Int64Array, RecordBatch};

        use crate::store::{
            EvictionPolicy, ManualClock, Store, StoreConfig, TtlMode, batch_weight,
        };

        let config = StoreConfig {
            max_entries: 10,
            budget_bytes: 1 << 20,
            max_entry_bytes: 1 << 20,
            ttl: Duration::from_secs(60),
            ttl_mode: TtlMode::Absolute,
            eviction: EvictionPolicy::Lru,
        };
        let store = Store::new(config, Arc::new(ManualClock::new())).unwrap();
        let column: ArrayRef = Arc::new(Int64Array::from_iter_values(0..64));
        let batch = RecordBatch::try_from_iter([("n", column)]).unwrap();
        let mut put = store.begin_put(Bytes::from_static(b"Pkey"));
        put.reserve(batch_weight(&batch)).unwrap();
        let lifetime = crate::store::Lifetime {
            ttl_override: Some(Duration::from_secs(90)),
            tags: tags.iter().map(|tag| Arc::<str>::from(*tag)).collect(),
            ..crate::store::Lifetime::default()
        };
        put.commit_with(batch.schema(), vec![batch], lifetime)
            .unwrap();
        let entry = store.peek(b"Pkey").unwrap();
        let encoded = encode(
            b"Pkey",
            &entry,
            UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        );
        assert_eq!(
            encoded.len,
            encoded.parts.iter().map(|p| p.len() as u64).sum::<u64>()
        );
        Bytes::from(encoded.parts.concat())
    }

    #[test]
    fn an_encoded_entry_decodes_to_its_header_and_messages() {
        let file = sample_file();
        let decoded = decode(file).unwrap();
        assert_eq!(decoded.head.key, Bytes::from_static(b"Pkey"));
        assert_eq!(decoded.head.ttl_override, Some(Duration::from_secs(90)));
        assert_eq!(
            decoded.head.created,
            UNIX_EPOCH + Duration::from_secs(1_800_000_000)
        );
        assert_eq!(decoded.messages.len(), 2, "the schema, then the batch");
        assert_eq!(decoded.messages[1].body.len(), 64 * 8);
    }

    #[test]
    fn an_entrys_tags_are_kept_and_a_version_1_file_reads_without_tags() {
        let file = sample_file_tagged(&["sales.orders", "tenant:acme"]);
        assert_eq!(u16::from_le_bytes([file[4], file[5]]), VERSION);
        let decoded = decode(file).unwrap();
        assert_eq!(decoded.tags, ["sales.orders", "tenant:acme"]);
        assert_eq!(decoded.head.tags_len, 2 + 12 + 11);
        assert_eq!(decoded.messages.len(), 2);

        // What a build before tags wrote: version 1, the field reserved (0).
        let mut old = sample_file().to_vec();
        old[4..6].copy_from_slice(&1u16.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&old[..8]);
        crc.update(&old[12..]);
        let sum = crc.finalize().to_le_bytes();
        old[8..12].copy_from_slice(&sum);
        let decoded = decode(Bytes::from(old)).unwrap();
        assert!(decoded.tags.is_empty());
        assert_eq!(decoded.head.key, Bytes::from_static(b"Pkey"));

        // A version from the future is refused, naming what this build reads.
        let mut future = sample_file().to_vec();
        future[4..6].copy_from_slice(&3u16.to_le_bytes());
        let err = decode(Bytes::from(future)).unwrap_err();
        assert_eq!(err, FormatError::Version(3));
        assert!(err.to_string().contains("reads 1 to 2"), "{err}");
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        for file in [sample_file(), sample_file_tagged(&["sales.orders"])] {
            every_truncation_and_flip_of(&file);
        }
    }

    fn every_truncation_and_flip_of(file: &Bytes) {
        for len in 0..file.len() {
            assert!(decode(file.slice(..len)).is_err(), "truncated to {len}");
        }
        for at in 0..file.len() {
            let mut damaged = file.to_vec();
            damaged[at] ^= 0x01;
            assert!(decode(Bytes::from(damaged)).is_err(), "byte {at} flipped");
        }
    }

    proptest::proptest! {
        /// Whatever a file holds: an error or an entry, never a panic.
        #[test]
        fn any_bytes_decode_to_an_error_or_an_entry(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let _ = decode(Bytes::from(bytes.clone()));
            let _ = decode_head(&bytes);
        }
    }
}
