//! A cached result ([`Entry`]): its Arrow data plus the bookkeeping readers may
//! show (weight, timestamps, hits).
//!
//! Entries are immutable once installed and shared as `Arc<Entry>`, so a read never
//! copies Arrow data and a reader keeps a consistent view even if the entry is
//! evicted meanwhile. Only the expiry deadline (sliding TTL, TTL changes) and the hit
//! counter move, through atomics. No I/O.
//!
//! Owns: an entry's data and bookkeeping. Like all of `store/`, imports nothing outside
//! the store (arrow's schema and array types only) and no gRPC or Flight crate.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::clock::duration_to_nanos;
use super::sealed::{SealedEntry, WireMessage};

/// The tags an entry carries (checked before they reach the store: `crds::tags`), shared
/// by the entry, the store's tag index and the copies sent to peers.
pub type Tags = std::sync::Arc<[std::sync::Arc<str>]>;

/// One cached result set, visible whole or not at all.
pub struct Entry {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// The schema message, then one message per batch: what a DoGet sends.
    messages: Vec<WireMessage>,
    total_rows: u64,
    weight_bytes: u64,
    created_at: Duration,
    ttl_override: Option<Duration>,
    tags: Tags,
    expires_at_nanos: AtomicU64,
    hits: AtomicU64,
    /// The last access reported to the store's journal (store clock, nanoseconds).
    journaled_access_nanos: AtomicU64,
}

impl Entry {
    /// Builds an entry; `weight_bytes` is what the store charges for it.
    pub(crate) fn new(
        sealed: SealedEntry,
        weight_bytes: u64,
        created_at: Duration,
        ttl_override: Option<Duration>,
        tags: Tags,
        expires_at: Duration,
        last_access: Duration,
    ) -> Self {
        let schema = sealed.schema.schema;
        let mut messages = Vec::with_capacity(sealed.batches.len() + 1);
        messages.push(sealed.schema.message);
        let mut batches = Vec::with_capacity(sealed.batches.len());
        for part in sealed.batches {
            batches.push(part.batch);
            messages.push(part.message);
        }
        let total_rows = batches
            .iter()
            .map(|batch| u64::try_from(batch.num_rows()).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        Self {
            schema,
            batches,
            messages,
            total_rows,
            weight_bytes,
            created_at,
            ttl_override,
            tags,
            expires_at_nanos: AtomicU64::new(duration_to_nanos(expires_at)),
            hits: AtomicU64::new(0),
            journaled_access_nanos: AtomicU64::new(duration_to_nanos(last_access)),
        }
    }

    /// The schema of the result, also valid when there are no batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The record batches in put order. Cloning one is cheap: columns are `Arc`s.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// The entry as stored IPC messages: the schema message, then one per batch, each
    /// sharing its body with the batch. A read sends these as they are.
    pub fn wire_messages(&self) -> &[WireMessage] {
        &self.messages
    }

    /// Rows across all batches.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Bytes charged against the store budget (see the `weight` module).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// When the entry was installed, on the store clock.
    pub fn created_at(&self) -> Duration {
        self.created_at
    }

    /// When the entry expires, on the store clock, as of the last read or TTL change.
    ///
    /// Moves forward on hits in `Sliding` mode and when the store TTL changes.
    pub fn expires_at(&self) -> Duration {
        Duration::from_nanos(self.expires_at_nanos.load(Ordering::Relaxed))
    }

    /// The TTL given at put time, replacing the store TTL for this entry.
    pub fn ttl_override(&self) -> Option<Duration> {
        self.ttl_override
    }

    /// The tags the put gave it (empty when none).
    pub fn tags(&self) -> &Tags {
        &self.tags
    }

    /// Successful `get`s of this entry.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub(crate) fn set_expires_at(&self, deadline: Duration) {
        self.expires_at_nanos
            .store(duration_to_nanos(deadline), Ordering::Relaxed);
    }

    /// Records `now` as the last access reported to the journal if the one before is at
    /// least `debounce` old; returns whether it did (the read is then reported).
    pub(crate) fn journal_read(&self, now: Duration, debounce: Duration) -> bool {
        let now_nanos = duration_to_nanos(now);
        let last = self.journaled_access_nanos.load(Ordering::Relaxed);
        if now_nanos.saturating_sub(last) < duration_to_nanos(debounce) {
            return false;
        }
        self.journaled_access_nanos
            .store(now_nanos, Ordering::Relaxed);
        true
    }

    pub(crate) fn record_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
impl Drop for Entry {
    fn drop(&mut self) {
        super::lock_scope::entry_dropped();
    }
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("batches", &self.batches.len())
            .field("total_rows", &self.total_rows)
            .field("weight_bytes", &self.weight_bytes)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at())
            .field("ttl_override", &self.ttl_override)
            .field("tags", &self.tags)
            .field("hits", &self.hits())
            .finish_non_exhaustive()
    }
}
