//! The node's error type and its one mapping to gRPC status codes.
//!
//! Every variant is mapped explicitly (no `_` arm) so a new failure forces a decision
//! about its code. Client mistakes carry a message a person can act on; internal
//! failures are logged and answered with a bare INTERNAL, never with internal details.

use tonic::{Code, Status};

use crate::routing::members::RoutingError;

/// Result with the node's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a Flight request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A ticket that is not a FlightCache ticket, or is malformed.
    #[error("bad ticket: {0}")]
    BadTicket(String),
    /// A descriptor that names no usable key.
    #[error("bad descriptor: {0}")]
    BadDescriptor(String),
    /// DoPut `app_metadata` that is not the documented JSON.
    #[error("bad DoPut app_metadata: {0}; send JSON like {{\"ttl\": \"30s\"}} or no app_metadata")]
    BadPutOptions(String),
    /// A DoPut stream that is not a well-formed Arrow IPC stream.
    #[error("bad DoPut stream: {0}")]
    BadPutStream(String),
    /// A DoPut batch whose schema differs from the stream's first schema.
    #[error(
        "DoPut batch {batch} has a different schema from the stream's first schema; an entry holds \
         one schema (expected {expected}, got {found})"
    )]
    SchemaMismatch {
        /// Zero-based index of the offending batch.
        batch: usize,
        /// The stream's schema.
        expected: String,
        /// The batch's schema.
        found: String,
    },
    /// The key is not cached (never put, expired, evicted or invalidated).
    #[error("{key} is not cached (never stored, expired, evicted or invalidated)")]
    UnknownKey {
        /// The key, as printed by `CacheKey`'s Display.
        key: String,
    },
    /// An entry larger than the node's max entry size.
    #[error(
        "entry is larger than the max entry size: {size} bytes received so far, the limit is {max} \
         bytes; nothing was stored"
    )]
    EntryTooLarge {
        /// Bytes seen when the put was refused.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// Not enough room in the byte budget, even after evicting.
    #[error(
        "no room in the memory budget: {needed} more bytes needed, {available} can be freed now \
         (other puts in flight hold the rest); nothing was stored, retry later"
    )]
    OverBudget {
        /// Bytes the put needed.
        needed: u64,
        /// Bytes that could be made free.
        available: u64,
    },
    /// An invalidation matching the key arrived while the put was in flight.
    #[error("{key} was invalidated while this put was in flight; the put was discarded, retry it")]
    InvalidatedDuringPut {
        /// The key.
        key: String,
    },
    /// A DoAction with a body the action cannot use.
    #[error("bad body for action '{action}': {reason}")]
    BadActionBody {
        /// The action type.
        action: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A DoAction type this node does not offer.
    #[error("unknown action '{0}'; ListActions shows the actions this node offers")]
    UnknownAction(String),
    /// A configuration change that cannot be applied.
    #[error("configuration rejected: {0}")]
    ConfigRejected(String),
    /// A configuration generation older than the running one.
    #[error("configuration generation {requested} is older than the running generation {running}")]
    StaleGeneration {
        /// The generation asked for.
        requested: u64,
        /// The generation running.
        running: u64,
    },
    /// Missing or wrong credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// The method is not offered by a cache node.
    #[error("{0} is not offered by a FlightCache node")]
    Unimplemented(&'static str),
    /// The ring refused a topology or cannot route (see [`RoutingError`]).
    #[error(transparent)]
    Routing(#[from] RoutingError),
    /// The member owning the key cannot be reached.
    #[error("owner {owner} ({address}) is unreachable: {reason}")]
    OwnerUnreachable {
        /// The owner's member id.
        owner: String,
        /// Its address.
        address: String,
        /// What failed (connect error, deadline).
        reason: String,
    },
    /// The owner answered a forwarded request with this status; it is passed on as is.
    #[error("{}", .0.message())]
    Forwarded(Status),
    /// A peer answered a fanned-out action with a body that is not its documented JSON.
    #[error("member {peer} answered with a body that is not the documented JSON")]
    BadPeerAnswer {
        /// The member.
        peer: String,
        /// What could not be read.
        #[source]
        source: crds::admin::AnswerError,
    },
    /// Encoding an answer failed (a bug or corrupt state).
    #[error("failed to encode the answer")]
    Encode(#[source] arrow_flight::error::FlightError),
}

impl Error {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        match self {
            Self::BadTicket(_)
            | Self::BadDescriptor(_)
            | Self::BadPutOptions(_)
            | Self::BadPutStream(_)
            | Self::SchemaMismatch { .. }
            | Self::BadActionBody { .. }
            | Self::ConfigRejected(_)
            | Self::Routing(RoutingError::TopologyRejected(_)) => Code::InvalidArgument,
            Self::UnknownKey { .. } => Code::NotFound,
            Self::EntryTooLarge { .. } | Self::OverBudget { .. } => Code::ResourceExhausted,
            Self::InvalidatedDuringPut { .. } => Code::Aborted,
            Self::StaleGeneration { .. } | Self::Routing(RoutingError::StaleTopology { .. }) => {
                Code::FailedPrecondition
            }
            Self::Routing(RoutingError::NoOwner { .. } | RoutingError::RingDisagreement { .. })
            | Self::OwnerUnreachable { .. } => Code::Unavailable,
            Self::Forwarded(status) => status.code(),
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::UnknownAction(_) | Self::Unimplemented(_) => Code::Unimplemented,
            Self::Encode(_) | Self::BadPeerAnswer { .. } => Code::Internal,
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let code = err.code();
        if let Error::Forwarded(status) = err {
            // The owner already chose the code and message (and hid internal details); its
            // transport headers (content-type, date) are not passed on.
            return Self::with_details(
                status.code(),
                status.message(),
                status.details().to_vec().into(),
            );
        }
        if code == Code::Internal {
            tracing::error!(error = %err, source = ?std::error::Error::source(&err), "flight request failed");
            return Self::internal("internal error");
        }
        tracing::debug!(error = %err, ?code, "flight request refused");
        Self::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_keep_their_message_and_internal_ones_do_not_leak() {
        let status = Status::from(Error::UnknownKey {
            key: "path 'a/b'".into(),
        });
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().contains("path 'a/b' is not cached"));
        let status = Status::from(Error::Encode(arrow_flight::error::FlightError::protocol(
            "secret detail",
        )));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "internal error");
    }

    #[test]
    fn an_owner_status_is_passed_on_without_its_transport_headers() {
        let mut owner = Status::not_found("path 'a' is not cached");
        owner
            .metadata_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        let status = Status::from(Error::Forwarded(owner));
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "path 'a' is not cached");
        assert!(status.metadata().is_empty());
    }

    #[test]
    fn resource_errors_say_nothing_was_stored() {
        let status = Status::from(Error::EntryTooLarge { size: 10, max: 5 });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("nothing was stored"));
    }
}
