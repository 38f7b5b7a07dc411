//! The stream types the Flight service and the cluster layer hand each other: every
//! streaming answer ([`FlightStream`]) and the rest of a DoPut upload ([`UploadRest`]).
//!
//! Owns: type aliases only; no logic, no I/O. Imports nothing of the crate, so the
//! Flight adapter (`flight/`) and the cluster layer (`cluster/`) share it instead of
//! importing each other.

use arrow_flight::FlightData;
use tonic::Status;

/// Every streaming answer: of the Flight service, and of a peer relayed through it.
pub type FlightStream<T> = futures::stream::BoxStream<'static, std::result::Result<T, Status>>;

/// The rest of a DoPut upload after its first message: the client's stream, or (when a
/// relay to an owner broke off) the messages already relayed, kept, followed by what the
/// client has not sent yet.
pub type UploadRest = FlightStream<FlightData>;
