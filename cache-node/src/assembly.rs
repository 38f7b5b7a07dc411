//! One cache entry assembled from its IPC messages into a pending put: a DoPut's (the
//! Flight adapter, `flight::put`) or an entry file's on reload (the disk tier,
//! `persist`), message by message the same way.
//!
//! Each message is reserved in the store's budget while it is decoded (unless the wire
//! layer's reservation of it still holds, `store::IntakeCover`), its batch sealed
//! through `wire::seal` and reserved at its stored weight, and its receive buffer
//! released before the next one; commit installs the entry atomically. Also the mapping
//! of the store's refusals to the node's [`Error`] ([`store_error`]).
//!
//! Owns: the assembly of one entry. Below both of its users, so neither imports the
//! other: must not import `flight/`, `persist/` or `cluster/`. No I/O.

use std::sync::Arc;

use arrow_flight::FlightData;

use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::store::{
    self, IntakeCover, Lifetime, SealedBatch, SealedEntry, SealedSchema, batch_weight,
};
use crate::wire::seal::{Intake, IntakeError, Received};

/// One entry being assembled from its IPC messages into a pending put: a DoPut's, or an
/// entry file's on reload (`persist`). Each message is reserved in the budget while it
/// is decoded, its batch sealed and reserved at its stored weight, and its receive
/// buffer released before the next one.
pub struct Assembly {
    pending: store::PendingPut,
    intake: Intake,
    batches: Vec<SealedBatch>,
    rows: u64,
    max_entry_bytes: u64,
    /// The dictionary columns would hydrate past the entry size: a refused put.
    hydration_refused: bool,
    /// Set for a DoPut whose messages the wire layer reserved as they arrived.
    cover: Option<Arc<IntakeCover>>,
}

impl Assembly {
    /// Starts assembling into `pending`; dictionary columns may expand to at most
    /// `max_entry_bytes` (more could never be stored).
    pub fn new(pending: store::PendingPut, max_entry_bytes: u64) -> Self {
        Self {
            pending,
            intake: Intake::new(max_entry_bytes),
            batches: Vec::new(),
            rows: 0,
            max_entry_bytes,
            hydration_refused: false,
            cover: None,
        }
    }

    /// The wire layer's word on a DoPut's messages: reserved as they arrived (then
    /// they are not reserved again while each is decoded).
    pub fn with_cover(mut self, cover: Option<Arc<IntakeCover>>) -> Self {
        self.cover = cover;
        self
    }

    /// Record batches accepted so far.
    pub fn batches(&self) -> usize {
        self.batches.len()
    }

    /// Refuses the put on the caller's side (counted as rejected).
    pub fn reject(self) {
        self.pending.reject();
    }

    /// Ends the put after `accept` failed with `err`: a put refused for its size is
    /// counted as rejected; returns `err`.
    pub fn fail(self, err: Error) -> Error {
        if self.hydration_refused {
            self.pending.reject();
        }
        err
    }

    /// Takes one IPC message (one with an empty `data_header` carries none: skip it).
    ///
    /// # Errors
    /// A bad IPC message or a schema change (INVALID_ARGUMENT), an oversized entry or
    /// no room (RESOURCE_EXHAUSTED), a racing invalidation (ABORTED).
    pub fn accept(&mut self, message: FlightData, key: &CacheKey) -> Result<()> {
        // The message sits in its receive buffer until it has been read and sealed:
        // reserved here unless the wire layer's reservation of it still holds.
        let covered = self.cover.as_ref().is_some_and(|cover| cover.all_covered());
        // A body the wire layer received apart carries its reservation: it becomes the
        // batch's charge below, when the body is kept as it is.
        let intake = self
            .cover
            .as_ref()
            .and_then(|cover| cover.claim(&message.data_body));
        let received = if covered || intake.is_some() {
            0
        } else {
            (message.data_header.len() + message.data_body.len()) as u64
        };
        self.pending
            .reserve_transient(received)
            .map_err(store_error(key))?;
        let outcome = match self.intake.receive(message) {
            Ok(outcome) => outcome,
            Err(IntakeError::HydratesTooLarge { size }) => {
                self.hydration_refused = true;
                return Err(Error::EntryTooLarge {
                    size,
                    max: self.max_entry_bytes,
                });
            }
            Err(IntakeError::Arrow(err)) => {
                return Err(Error::BadPutStream(format!(
                    "message {}: {err}",
                    self.batches.len()
                )));
            }
        };
        match outcome {
            Received::Dictionary => {}
            Received::Schema(next) => match self.intake.schema() {
                Some(current) if current.input().fields() != next.fields() => {
                    return Err(Error::SchemaMismatch {
                        batch: self.batches.len(),
                        expected: current.input().to_string(),
                        found: next.to_string(),
                    });
                }
                Some(_) => {}
                None => {
                    let sealed = SealedSchema::new(Arc::new(next)).map_err(|err| {
                        Error::BadPutStream(format!("the schema cannot be stored: {err}"))
                    })?;
                    self.intake.set_schema(sealed);
                }
            },
            Received::Batches(sealed) => {
                let weight = sealed
                    .iter()
                    .map(|part| batch_weight(&part.batch) + part.message.head_bytes())
                    .fold(0, u64::saturating_add);
                match intake {
                    Some(intake) => self.pending.reserve_replacing(weight, intake),
                    None => self.pending.reserve(weight),
                }
                .map_err(store_error(key))?;
                self.rows += sealed
                    .iter()
                    .map(|part| part.batch.num_rows() as u64)
                    .sum::<u64>();
                self.batches.extend(sealed);
            }
        }
        self.pending.release(received);
        Ok(())
    }

    /// Installs the entry with `lifetime`; returns what the store did, the rows and the
    /// record batches stored.
    ///
    /// # Errors
    /// No schema (INVALID_ARGUMENT), or the store's refusal.
    pub fn commit(
        self,
        lifetime: Lifetime,
        key: &CacheKey,
    ) -> Result<(store::CommitOutcome, u64, u64)> {
        let schema = self.intake.into_schema().ok_or_else(|| {
            Error::BadPutStream(
                "the stream carried no schema; a DoPut needs at least a schema".into(),
            )
        })?;
        let batch_count = self.batches.len() as u64;
        let outcome = self
            .pending
            .commit_sealed(
                SealedEntry {
                    schema,
                    batches: self.batches,
                },
                lifetime,
            )
            .map_err(store_error(key))?;
        Ok((outcome, self.rows, batch_count))
    }
}

/// Maps a store refusal to the node error for `key`.
pub fn store_error(key: &CacheKey) -> impl Fn(store::Error) -> Error + '_ {
    move |err| match err {
        store::Error::EntryTooLarge { size, max } => Error::EntryTooLarge { size, max },
        store::Error::OverBudget { needed, available } => Error::OverBudget { needed, available },
        store::Error::InvalidatedDuringPut => Error::InvalidatedDuringPut {
            key: key.to_string(),
        },
        store::Error::Unencodable(reason) => Error::BadPutStream(reason),
        store::Error::InvalidConfig { field, rule } => {
            Error::ConfigRejected(format!("{field} {rule}"))
        }
    }
}
