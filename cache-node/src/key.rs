//! Cache keys: what a `FlightDescriptor` names, and its byte form in the store.
//!
//! A key is either a path (the descriptor's segments joined by `/`, so `["a", "b"]` and
//! `["a/b"]` are the same key) or a command (opaque bytes, e.g. normalised SQL text).
//! In the store a key is one kind byte (`P` or `C`) followed by the key bytes; the
//! ticket format (`ticket`) wraps exactly these bytes. Pure; no I/O.
//! Must not import the store, `flight/` or `wire/`.

use std::fmt;

use arrow_flight::FlightDescriptor;
use arrow_flight::flight_descriptor::DescriptorType;
use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Result};

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

const PATH_KIND: u8 = b'P';
const COMMAND_KIND: u8 = b'C';

/// A validated cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CacheKey {
    /// Path segments joined by `/`.
    Path(String),
    /// Opaque command bytes.
    Command(Bytes),
}

impl CacheKey {
    /// Reads the key a descriptor names.
    ///
    /// # Errors
    /// [`Error::BadDescriptor`] for an empty path or command, an unknown descriptor type
    /// or a key longer than [`MAX_KEY_BYTES`].
    pub fn from_descriptor(descriptor: &FlightDescriptor) -> Result<Self> {
        let key = match DescriptorType::try_from(descriptor.r#type) {
            Ok(DescriptorType::Path) => {
                if descriptor.path.is_empty() || descriptor.path.iter().all(String::is_empty) {
                    return Err(Error::BadDescriptor(
                        "the descriptor path is empty; name the entry, e.g. [\"reports\", \"daily\"]"
                            .into(),
                    ));
                }
                Self::Path(descriptor.path.join("/"))
            }
            Ok(DescriptorType::Cmd) => {
                if descriptor.cmd.is_empty() {
                    return Err(Error::BadDescriptor(
                        "the descriptor command is empty; use the query text or another key".into(),
                    ));
                }
                Self::Command(descriptor.cmd.clone())
            }
            Ok(DescriptorType::Unknown) | Err(_) => {
                return Err(Error::BadDescriptor(format!(
                    "descriptor type {} is not supported; use PATH or CMD",
                    descriptor.r#type
                )));
            }
        };
        key.check_length()?;
        Ok(key)
    }

    /// Reads a key from its store bytes (kind byte + key bytes).
    ///
    /// # Errors
    /// [`Error::BadTicket`] for an unknown kind, non-UTF-8 path or empty key.
    pub fn try_from_store_bytes(bytes: &Bytes) -> Result<Self> {
        let Some((&kind, rest)) = bytes.split_first() else {
            return Err(Error::BadTicket("the ticket names no key".into()));
        };
        if rest.is_empty() {
            return Err(Error::BadTicket("the ticket names an empty key".into()));
        }
        let key = match kind {
            PATH_KIND => Self::Path(
                std::str::from_utf8(rest)
                    .map_err(|_| Error::BadTicket("the ticket's path key is not UTF-8".into()))?
                    .to_owned(),
            ),
            COMMAND_KIND => Self::Command(bytes.slice(1..)),
            other => {
                return Err(Error::BadTicket(format!(
                    "unknown key kind {other:#04x} in ticket; expected 'P' (path) or 'C' (command)"
                )));
            }
        };
        key.check_length()?;
        Ok(key)
    }

    /// The key's byte form in the store: kind byte + key bytes.
    pub fn to_store_bytes(&self) -> Bytes {
        let (kind, body): (u8, &[u8]) = match self {
            Self::Path(path) => (PATH_KIND, path.as_bytes()),
            Self::Command(cmd) => (COMMAND_KIND, cmd),
        };
        let mut out = BytesMut::with_capacity(1 + body.len());
        out.put_u8(kind);
        out.put_slice(body);
        out.freeze()
    }

    /// The store-byte prefix that selects every path key starting with `prefix`.
    pub fn path_prefix_store_bytes(prefix: &str) -> Bytes {
        Self::Path(prefix.to_owned()).to_store_bytes()
    }

    /// The descriptor that names this key.
    pub fn to_descriptor(&self) -> FlightDescriptor {
        match self {
            Self::Path(path) => {
                FlightDescriptor::new_path(path.split('/').map(str::to_owned).collect())
            }
            Self::Command(cmd) => FlightDescriptor::new_cmd(cmd.clone()),
        }
    }

    fn check_length(&self) -> Result<()> {
        let len = match self {
            Self::Path(path) => path.len(),
            Self::Command(cmd) => cmd.len(),
        };
        if len > MAX_KEY_BYTES {
            return Err(Error::BadDescriptor(format!(
                "the key is {len} bytes; keys may be at most {MAX_KEY_BYTES} bytes (hash long queries)"
            )));
        }
        Ok(())
    }
}

impl fmt::Display for CacheKey {
    /// Paths print as written; commands print as text when short and printable,
    /// otherwise by length, so logs and error messages stay readable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => write!(f, "path '{path}'"),
            Self::Command(cmd) => match std::str::from_utf8(cmd) {
                Ok(text) if text.len() <= 80 && !text.chars().any(char::is_control) => {
                    write!(f, "command '{text}'")
                }
                _ => write!(f, "command of {} bytes", cmd.len()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_join_with_slash() {
        let key = CacheKey::from_descriptor(&FlightDescriptor::new_path(vec![
            "reports".into(),
            "daily".into(),
        ]))
        .unwrap();
        assert_eq!(key, CacheKey::Path("reports/daily".into()));
        assert_eq!(&key.to_store_bytes()[..], b"Preports/daily");
        assert_eq!(
            CacheKey::try_from_store_bytes(&key.to_store_bytes()).unwrap(),
            key
        );
        assert_eq!(
            CacheKey::from_descriptor(&key.to_descriptor()).unwrap(),
            key
        );
    }

    #[test]
    fn commands_are_opaque_bytes() {
        let key =
            CacheKey::from_descriptor(&FlightDescriptor::new_cmd(b"\x00\xffSELECT 1".to_vec()))
                .unwrap();
        assert_eq!(&key.to_store_bytes()[..], b"C\x00\xffSELECT 1");
        assert_eq!(
            CacheKey::try_from_store_bytes(&key.to_store_bytes()).unwrap(),
            key
        );
        assert_eq!(key.to_string(), "command of 10 bytes");
    }

    #[test]
    fn empty_and_oversized_keys_are_refused() {
        assert!(CacheKey::from_descriptor(&FlightDescriptor::new_path(vec![])).is_err());
        assert!(CacheKey::from_descriptor(&FlightDescriptor::new_cmd(Vec::<u8>::new())).is_err());
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let err = CacheKey::from_descriptor(&FlightDescriptor::new_path(vec![long])).unwrap_err();
        assert!(err.to_string().contains("at most 65536 bytes"));
    }
}
