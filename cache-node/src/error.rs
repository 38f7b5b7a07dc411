//! The node's error type and its one mapping to gRPC status codes.
//!
//! Every variant is mapped explicitly (no `_` arm) so a new failure forces a decision
//! about its code. Client mistakes carry a message a person can act on; internal
//! failures are logged and answered with a bare INTERNAL, never with internal details.
//!
//! Owns: [`Error`] and the one `Error` → `Status` mapping. Imports the routing layer's
//! [`RoutingError`] and the header names (`crate::headers`); must not import `cluster/`,
//! `flight/`, `wire/` or the store (their callers map their errors into this one).

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
    /// This node has begun to stop (a SIGTERM): it takes no copies of entries (handovers,
    /// replica, fallback and repair writes) and answers no `held` question, so a sender
    /// keeps its entry instead of handing it to a process about to end. Answered with
    /// [`crate::headers::STOPPING_HEADER`] so peers tell it from other refusals.
    #[error(
        "this node is stopping: it takes no copies of entries; keep the entry or send it to \
         the key's next holder"
    )]
    Stopping,
    /// A handover (rebalance or exit handoff) from a peer that routes by an older ring
    /// than this node: it chose where its entries go by a ring that has moved on, and
    /// what it holds may predate changes made since (the old process of a pod already
    /// replaced, thawed or back from a partition). Refused; the sender keeps the entry.
    #[error(
        "{from} handed this entry over by ring version {theirs}, this node routes by \
         {ours}: a handover by an outdated ring is refused (its entries may predate \
         changes made since)"
    )]
    HandoffByOutdatedRing {
        /// The sender's member id.
        from: String,
        /// The ring version it routed by.
        theirs: u64,
        /// This node's.
        ours: u64,
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
    /// Valid credentials without the right to this call (a client calling an admin
    /// action, an internal header from someone not a peer).
    #[error("{0}")]
    PermissionDenied(String),
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
    /// A read whose every copy could not be reached: for a cache that is a miss (the
    /// client computes the result), not a failure.
    #[error("{key} is not cached: no copy can be reached ({reason}); answered as a miss")]
    CopiesUnreachable {
        /// The key, as printed by `CacheKey`'s Display.
        key: String,
        /// The first copy's failure (owner, address and cause).
        reason: String,
    },
    /// A coalescing DoGet's miss that took the key's fill lease: the caller computes the
    /// value and puts it; concurrent coalescing readers wait for that put.
    #[error(
        "{key} is not cached; this call holds its fill lease for {lease_ms} ms: compute the \
         value and DoPut it (coalescing readers of the key wait for that put)"
    )]
    MissWithLease {
        /// The key, as printed by `CacheKey`'s Display.
        key: String,
        /// How long the lease lasts.
        lease_ms: u64,
    },
    /// The wire layer refused a put message as its length arrived (over the max entry
    /// size, `wire::intake`); its RESOURCE_EXHAUSTED status is answered as is.
    #[error("{}", .0.message())]
    RefusedOnArrival(Status),
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
    /// A peer answered `held` with another number of flags than keys asked about.
    #[error("member {peer} answered {flags} flags for {keys} keys to 'held'")]
    HeldCountMismatch {
        /// The member.
        peer: String,
        /// Flags in its answer.
        flags: usize,
        /// Keys asked about.
        keys: usize,
    },
    /// Encoding an answer failed (a bug or corrupt state).
    #[error("failed to encode the answer")]
    Encode(#[source] arrow_flight::error::FlightError),
    /// A put's work on the put runtime ended without an answer (it panicked); nothing
    /// was stored.
    #[error("{0}; nothing was stored")]
    PutLost(#[from] crate::put_runtime::Lost),
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
            Self::UnknownKey { .. }
            | Self::CopiesUnreachable { .. }
            | Self::MissWithLease { .. } => Code::NotFound,
            Self::EntryTooLarge { .. } | Self::OverBudget { .. } => Code::ResourceExhausted,
            Self::InvalidatedDuringPut { .. } => Code::Aborted,
            Self::StaleGeneration { .. }
            | Self::Routing(RoutingError::StaleTopology { .. })
            | Self::HandoffByOutdatedRing { .. } => Code::FailedPrecondition,
            Self::Routing(RoutingError::NoOwner { .. } | RoutingError::RingDisagreement { .. })
            | Self::OwnerUnreachable { .. }
            | Self::Stopping => Code::Unavailable,
            Self::Forwarded(status) | Self::RefusedOnArrival(status) => status.code(),
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::UnknownAction(_) | Self::Unimplemented(_) => Code::Unimplemented,
            Self::Encode(_)
            | Self::PutLost(_)
            | Self::BadPeerAnswer { .. }
            | Self::HeldCountMismatch { .. } => Code::Internal,
        }
    }
}

/// The most bytes of a status message a node sends. Messages quote client input (keys,
/// action names, `app_metadata`, schemas); unbounded, a 20 KB key made the message
/// exceed the clients' metadata limit, and they saw that error instead of the real code.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// `message` cut to at most [`MAX_STATUS_MESSAGE_BYTES`] (at a character boundary),
/// saying how much was cut.
pub fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_STATUS_MESSAGE_BYTES {
        return message.to_owned();
    }
    // Room for the suffix, so the result stays within the bound.
    let mut end = MAX_STATUS_MESSAGE_BYTES - 48;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… (message cut: {} of {} bytes shown)",
        &message[..end],
        end,
        message.len()
    )
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let code = err.code();
        if let Error::Forwarded(status) = err {
            // The owner already chose the code and message (and hid internal details); its
            // transport headers (content-type, date) are not passed on, its lease is.
            let mut passed = Self::with_details(
                status.code(),
                bounded_message(status.message()),
                status.details().to_vec().into(),
            );
            if let Some(lease) = status.metadata().get(crate::headers::LEASE_HEADER) {
                passed
                    .metadata_mut()
                    .insert(crate::headers::LEASE_HEADER, lease.clone());
            }
            return passed;
        }
        if let Error::MissWithLease { .. } = err {
            let mut status = Self::new(code, bounded_message(&err.to_string()));
            status.metadata_mut().insert(
                crate::headers::LEASE_HEADER,
                tonic::metadata::MetadataValue::from_static("granted"),
            );
            return status;
        }
        if let Error::Stopping = err {
            let mut status = Self::new(code, err.to_string());
            status.metadata_mut().insert(
                crate::headers::STOPPING_HEADER,
                tonic::metadata::MetadataValue::from_static("true"),
            );
            return status;
        }
        if code == Code::Internal {
            tracing::error!(error = %err, source = ?std::error::Error::source(&err), "flight request failed");
            return Self::internal("internal error");
        }
        // The whole chain: a client error that keeps its cause as a source (a rejected
        // topology) reads as one message, "what: why".
        let message = bounded_message(&crds::chain(&err));
        tracing::debug!(error = %message, ?code, "flight request refused");
        Self::new(code, message)
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
    fn messages_quoting_client_input_are_bounded() {
        let long_action = "x".repeat(100_000);
        let full = Error::UnknownAction(long_action.clone()).to_string().len();
        let status = Status::from(Error::UnknownAction(long_action));
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        assert!(status.message().starts_with("unknown action 'xxx"));
        assert!(
            status
                .message()
                .ends_with(&format!("of {full} bytes shown)")),
            "{}",
            status.message()
        );
        // Multi-byte characters are never split.
        let status = Status::from(Error::BadTicket("é".repeat(5_000)));
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        let forwarded = Status::from(Error::Forwarded(Status::not_found("k".repeat(50_000))));
        assert!(forwarded.message().len() <= MAX_STATUS_MESSAGE_BYTES);
        // Short messages are untouched.
        assert_eq!(bounded_message("short"), "short");
    }

    #[test]
    fn a_rejected_topology_is_answered_with_its_cause() {
        let err = Error::Routing(RoutingError::TopologyRejected(
            crds::node_config::NodeConfigError::Topology("member ids must all differ".into()),
        ));
        let status = Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "topology rejected: node config field 'topology' is invalid: member ids must all differ"
        );
    }

    #[test]
    fn resource_errors_say_nothing_was_stored() {
        let status = Status::from(Error::EntryTooLarge { size: 10, max: 5 });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("nothing was stored"));
    }
}
