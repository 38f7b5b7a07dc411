//! The ticket wire format: `CacheTicket` `encode()` / `try_decode()`.
//!
//! A ticket names a cache key, and a client can build one from the key alone, so a cache
//! hit is a single `DoGet`. Version 1, all bytes:
//!
//! ```text
//! offset  size  field
//! 0       3     magic "FCT"
//! 3       1     version, 0x01
//! 4       1     key kind: 'P' (path) or 'C' (command)
//! 5       n     key: the path segments joined by '/' as UTF-8, or the command bytes
//! ```
//!
//! Examples: the path `["reports", "daily"]` is `b"FCT\x01Preports/daily"`; the command
//! `SELECT 1` is `b"FCT\x01CSELECT 1"`. A ticket of any other shape is refused with
//! INVALID_ARGUMENT. Pure; no I/O.
//!
//! Owns: the ticket bytes, read by the Flight adapter (`flight/`) and by the DoGet relay
//! (`wire::relay`) on its fast path. Must not import `flight`, `wire` or `cluster`.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Result};
use crate::key::CacheKey;

/// The first bytes of every FlightCache ticket.
pub const TICKET_MAGIC: &[u8; 3] = b"FCT";
/// The ticket version this node writes and reads.
pub const TICKET_VERSION: u8 = 1;

/// A decoded ticket: the key it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheTicket {
    /// The cache key.
    pub key: CacheKey,
}

impl CacheTicket {
    /// The ticket for `key`.
    pub fn new(key: CacheKey) -> Self {
        Self { key }
    }

    /// The wire bytes (see the module docs).
    pub fn encode(&self) -> Bytes {
        let key = self.key.to_store_bytes();
        let mut out = BytesMut::with_capacity(TICKET_MAGIC.len() + 1 + key.len());
        out.put_slice(TICKET_MAGIC);
        out.put_u8(TICKET_VERSION);
        out.put_slice(&key);
        out.freeze()
    }

    /// Reads a ticket.
    ///
    /// # Errors
    /// [`Error::BadTicket`] for a foreign ticket, an unknown version or a malformed key.
    pub fn try_decode(bytes: &Bytes) -> Result<Self> {
        if bytes.len() < TICKET_MAGIC.len() + 1 || &bytes[..TICKET_MAGIC.len()] != TICKET_MAGIC {
            return Err(Error::BadTicket(
                "not a FlightCache ticket: tickets start with \"FCT\\x01\"; take the ticket from \
                 GetFlightInfo or build it from the key"
                    .into(),
            ));
        }
        let version = bytes[TICKET_MAGIC.len()];
        if version != TICKET_VERSION {
            return Err(Error::BadTicket(format!(
                "ticket version {version} is not supported by this node (it reads version {TICKET_VERSION})"
            )));
        }
        let key = CacheKey::try_from_store_bytes(&bytes.slice(TICKET_MAGIC.len() + 1..))?;
        Ok(Self { key })
    }

    /// True if `bytes` start like a FlightCache ticket (used where a body may be a
    /// ticket or a plain path).
    pub fn looks_like_ticket(bytes: &[u8]) -> bool {
        bytes.starts_with(TICKET_MAGIC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden bytes: changing them breaks every client that builds tickets itself.
    #[test]
    fn wire_format_is_stable() {
        let path = CacheTicket::new(CacheKey::Path("reports/daily".into()));
        assert_eq!(&path.encode()[..], b"FCT\x01Preports/daily");
        let cmd = CacheTicket::new(CacheKey::Command(Bytes::from_static(b"SELECT 1")));
        assert_eq!(&cmd.encode()[..], b"FCT\x01CSELECT 1");
        assert_eq!(CacheTicket::try_decode(&path.encode()).unwrap(), path);
        assert_eq!(CacheTicket::try_decode(&cmd.encode()).unwrap(), cmd);
    }

    #[test]
    fn foreign_and_malformed_tickets_are_refused_with_a_reason() {
        let cases: [(&[u8], &str); 6] = [
            (b"", "not a FlightCache ticket"),
            (b"SELECT 1", "not a FlightCache ticket"),
            (b"FCT\x02Pa", "version 2 is not supported"),
            (b"FCT\x01", "names no key"),
            (b"FCT\x01Xabc", "unknown key kind"),
            (b"FCT\x01P\xff\xfe", "not UTF-8"),
        ];
        for (bytes, expected) in cases {
            let err = CacheTicket::try_decode(&Bytes::copy_from_slice(bytes)).unwrap_err();
            assert!(err.to_string().contains(expected), "{bytes:?}: {err}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any bytes, with or without the ticket prefix: a ticket or a reason, never a
        /// panic; a decoded ticket encodes back to the same bytes.
        #[test]
        fn any_bytes_decode_to_a_ticket_or_a_reason(
            prefixed in proptest::prelude::any::<bool>(),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let bytes = if prefixed { [&b"FCT\x01"[..], &tail].concat() } else { tail };
            if let Ok(ticket) = CacheTicket::try_decode(&Bytes::from(bytes.clone())) {
                proptest::prop_assert_eq!(&ticket.encode()[..], &bytes[..]);
            }
        }

        /// Any descriptor (path segments, command bytes): a key or a reason, never a panic.
        #[test]
        fn any_descriptor_gives_a_key_or_a_reason(
            command in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            path in proptest::collection::vec(".{0,12}", 0..4),
            is_command in proptest::prelude::any::<bool>(),
        ) {
            let descriptor = if is_command {
                arrow_flight::FlightDescriptor::new_cmd(command)
            } else {
                arrow_flight::FlightDescriptor::new_path(path)
            };
            let _ = CacheKey::from_descriptor(&descriptor);
        }
    }
}
