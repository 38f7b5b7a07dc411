//! The write half of the two-phase put: a [`PendingPut`] that grows a byte
//! reservation while a stream arrives, then installs the entry atomically.
//!
//! Weighing the batches happens here, outside the store lock; the state change
//! itself is one short critical section per call. No I/O.
//!
//! Owns: a put's reservation and its commit. Like all of `store/`, imports nothing
//! outside the store and no gRPC or Flight crate: batches arrive already sealed
//! (`wire::seal`).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::error::Result;
use super::sealed::SealedEntry;
use super::shared::{IntakeReservation, Shared};
use super::state::{Inner, NewEntry};
use super::types::{CommitOutcome, Lifetime};

/// A put in progress, from [`Store::begin_put`](super::Store::begin_put) until
/// [`commit`](Self::commit) or drop.
///
/// Its reservation counts against the store budget, is never evicted, and is
/// released when the put commits, fails or is dropped. An invalidation covering the
/// key (exact key, a prefix of it, or a clear) made after `begin_put` makes the put
/// fail with [`Error::InvalidatedDuringPut`](super::Error::InvalidatedDuringPut), so
/// an invalidate always wins over a put that started before it.
pub struct PendingPut {
    shared: Arc<Shared>,
    put_id: u64,
    key: Bytes,
    key_hash: u64,
}

impl PendingPut {
    pub(crate) fn new(shared: Arc<Shared>, put_id: u64, key: Bytes, key_hash: u64) -> Self {
        Self {
            shared,
            put_id,
            key,
            key_hash,
        }
    }

    /// The key this put will install.
    pub fn key(&self) -> &Bytes {
        &self.key
    }

    /// Bytes currently reserved by this put (0 once it has failed).
    pub fn reserved_bytes(&self) -> u64 {
        self.shared
            .with_inner(|inner| inner.reserved_by(self.put_id))
    }

    /// Grows the reservation by `additional_bytes`, evicting stored entries if needed:
    /// expired ones first (cause `Expired`), then by policy (cause `Size`).
    ///
    /// Call it per incoming message with the bytes it holds while it is decoded and
    /// sealed, so memory is claimed before it piles up; [`release`](Self::release)
    /// what is freed.
    ///
    /// # Errors
    ///
    /// * [`Error::EntryTooLarge`](super::Error::EntryTooLarge) once the put's total
    ///   exceeds `max_entry_bytes`;
    /// * [`Error::OverBudget`](super::Error::OverBudget) if the bytes cannot fit even
    ///   after evicting every stored entry (then nothing is evicted);
    /// * [`Error::InvalidatedDuringPut`](super::Error::InvalidatedDuringPut) if the
    ///   key was invalidated since `begin_put`.
    ///
    /// A failure releases the whole reservation; every later `reserve` or `commit`
    /// returns the same error, so the caller can simply stop and drop the put.
    pub fn reserve(&mut self, additional_bytes: u64) -> Result<()> {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.reserve(self.put_id, additional_bytes, true, now))
    }

    /// Like [`reserve`](Self::reserve), paying first with `intake`: the reservation of
    /// the received bytes that now are (part of) what the put keeps. One step under the
    /// lock, so the same bytes are never counted twice and nothing is evicted for them
    /// twice.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve); `intake` is given back either way.
    pub fn reserve_replacing(
        &mut self,
        additional_bytes: u64,
        mut intake: IntakeReservation,
    ) -> Result<()> {
        let now = self.shared.clock.now();
        let held = std::mem::take(&mut intake.bytes);
        self.shared.with_inner(|inner| {
            inner.release_intake(held);
            inner.reserve(self.put_id, additional_bytes, true, now)
        })
    }

    /// Like [`reserve`](Self::reserve) for bytes held only while a message is being
    /// decoded (its receive buffer): they count against the budget, not against the
    /// max entry size. [`release`](Self::release) them when they are freed.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve), without `EntryTooLarge`.
    pub fn reserve_transient(&mut self, bytes: u64) -> Result<()> {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.reserve(self.put_id, bytes, false, now))
    }

    /// Gives back `bytes` of the reservation (e.g. a receive buffer that was freed),
    /// never below zero. Nothing happens after the put has failed.
    pub fn release(&mut self, bytes: u64) {
        self.shared
            .with_inner(|inner| inner.shrink_reservation(self.put_id, bytes));
    }

    /// Installs an entry sealed as its batches arrived (`wire::seal` seals them; its
    /// `commit`/`commit_with` wrap this for callers holding whole batches).
    ///
    /// # Errors
    ///
    /// As [`commit`](Self::commit).
    pub fn commit_sealed(self, sealed: SealedEntry, lifetime: Lifetime) -> Result<CommitOutcome> {
        let key_bytes = u64::try_from(self.key.len()).unwrap_or(u64::MAX);
        let weight = sealed
            .weight()
            .saturating_add(key_bytes)
            .saturating_add(super::weight::tags_weight(&lifetime.tags));
        let new_entry = NewEntry {
            key_hash: self.key_hash,
            sealed,
            weight,
            lifetime,
        };
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.commit(self.put_id, new_entry, now))
    }
}

impl PendingPut {
    /// Refuses this put on the caller's side (e.g. its wire bytes passed the max
    /// entry size before they were decoded): counts it as a rejected put and
    /// releases its reservation.
    pub fn reject(self) {
        self.shared.with_inner(Inner::note_rejected_put);
    }
}

impl Drop for PendingPut {
    fn drop(&mut self) {
        // After a commit the put is already gone and this does nothing.
        self.shared
            .with_inner(|inner| inner.release_put(self.put_id));
    }
}

impl fmt::Debug for PendingPut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingPut")
            .field("put_id", &self.put_id)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
