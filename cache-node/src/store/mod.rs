//! The cache node's in-memory result store: Arrow record batches under opaque byte
//! keys, bounded by a byte budget and an entry count, with TTL expiry and LRU or
//! W-TinyLFU eviction.
//!
//! Inputs are keys ([`Bytes`]; prefix operations compare bytes), Arrow data, a
//! [`StoreConfig`] and a [`Clock`]. No I/O, no async: every method takes one short
//! lock and returns; Arrow memory of removed entries is freed after the lock is
//! released (every test's `check_invariants` asserts it, `lock_scope`). Under the lock
//! only index work happens: sealing, decoding and copying are the wire layer's, before
//! a put reaches the store. Reads hand out `Arc<Entry>` and never copy Arrow data.
//!
//! # Guarantees
//!
//! * `used_bytes + reserved_bytes <= budget_bytes` and `entries <= max_entries` at
//!   every moment, in-flight reservations included. Room is made by removing expired
//!   entries first (cause `Expired`), then the policy's victims (cause `Size`).
//!   Reservations of in-flight puts are never evicted, and nothing is evicted for a
//!   put that could not fit even in an empty store.
//! * Writes are two-phase ([`Store::begin_put`], [`PendingPut::reserve`],
//!   [`PendingPut::commit`]); an entry is visible whole or not at all, and an
//!   invalidation that covers the key after `begin_put` makes the commit fail with
//!   [`Error::InvalidatedDuringPut`].
//!
//! # Expiry
//!
//! An entry's deadline is `anchor + ttl`: `ttl` is its per-entry override if given at
//! commit, else the store TTL; the anchor is the insert time in [`TtlMode::Absolute`]
//! and the last successful `get` in [`TtlMode::Sliding`]. An entry is live while
//! `now < deadline`. Expired entries are invisible to `get`, `peek` and `list`, and
//! are removed by `get`, by [`Store::purge_expired`] (which walks an index ordered by
//! deadline, so it only touches what has expired) or when room is needed.
//!
//! **TTL changes apply to stored entries.** When [`Store::reconfigure`] changes the
//! TTL or the mode, every deadline is recomputed with the new settings, from the same
//! anchors: `created_at + new ttl` (Absolute) or `last access + new ttl` (Sliding).
//! Entries with a per-entry override keep their override but follow the new mode.
//! Entries already past their new deadline expire at the next purge or access. A
//! shrink of the caps evicts down to them with cause `Size`, and entries heavier than
//! a lowered `max_entry_bytes` are evicted; entries that still fit stay.
//!
//! Layout: this file is the store's face ([`Store`] and the names it hands on); below it
//! `put.rs` (the two-phase put), `shared.rs` (the lock and intake reservations),
//! `state.rs` (every state transition), `types.rs` and `error.rs` (the plain types every
//! part uses), so no part of the store imports this file back.
//!
//! Owns: entries (sealed, opaque frames: `sealed.rs`), the budget, TTL, eviction. Must
//! not import tonic, arrow-flight, hyper or h2 (`scripts/check-layers`), nor `flight/`,
//! `wire/` or `routing/`.

mod clock;
mod config;
mod entry;
mod error;
mod eviction;
mod expiry;
mod journal;
mod put;
mod sealed;
mod shared;
mod sketch;
mod state;
mod types;
pub mod weight;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::config::{EvictionPolicy, RemovalCause, StoreConfig, TtlMode};
pub use self::entry::{Entry, Tags};
pub use self::error::{Error, Result};
pub use self::journal::{Journal, JournalSettings};
pub use self::put::PendingPut;
pub use self::sealed::{SealedBatch, SealedEntry, SealedSchema, WireMessage};
use self::shared::Shared;
#[cfg(test)]
pub(crate) use self::shared::lock_scope;
pub use self::shared::{IntakeCover, IntakeReservation};
pub use self::types::{
    CommitOutcome, HandoffEntry, Lifetime, ReconfigureOutcome, RemovalCounts, StoreStats,
};
pub use self::weight::BATCH_OVERHEAD_BYTES;
pub use self::weight::{batch_weight, entry_weight};

/// The in-memory result store. Cheap to clone; clones share the same entries.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use arrow_array::{ArrayRef, Int64Array, RecordBatch};
/// use bytes::Bytes;
/// use cache_node::store::{
///     EvictionPolicy, ManualClock, Store, StoreConfig, TtlMode, batch_weight,
/// };
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = StoreConfig {
///     max_entries: 1_000,
///     budget_bytes: 64 << 20,
///     max_entry_bytes: 8 << 20,
///     ttl: Duration::from_secs(300),
///     ttl_mode: TtlMode::Absolute,
///     eviction: EvictionPolicy::Tinylfu,
/// };
/// let store = Store::new(config, Arc::new(ManualClock::new()))?;
///
/// // A DoPut: reserve each batch as it arrives, then commit (sealing it).
/// let column: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
/// let batch = RecordBatch::try_from_iter([("n", column)])?;
/// let mut put = store.begin_put(Bytes::from_static(b"sales/2024"));
/// put.reserve(batch_weight(&batch))?;
/// put.commit(batch.schema(), vec![batch], None)?;
///
/// // A DoGet: the entry is shared, not copied.
/// let entry = store.get(b"sales/2024").ok_or("missing")?;
/// assert_eq!(entry.total_rows(), 3);
/// assert_eq!(store.invalidate_prefix(b"sales/"), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

impl Store {
    /// Creates an empty store.
    ///
    /// # Errors
    ///
    /// Returns [`Error::InvalidConfig`] if `config` fails [`StoreConfig::validate`].
    pub fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            shared: Arc::new(Shared::new(config, clock)),
        })
    }

    /// Reports every later change of the contents to `settings.journal` (a write-behind
    /// tier); replaces any journal set before.
    pub fn set_journal(&self, settings: JournalSettings) {
        self.shared.with_inner(|inner| inner.set_journal(settings));
    }

    /// Marks the stored entries of `keys` as used in this order (the last is the most
    /// recently used), without counting reads: restores the recency order of entries
    /// reloaded in another order.
    pub fn touch_in_order(&self, keys: &[Bytes]) {
        self.shared.with_inner(|inner| inner.touch_in_order(keys));
    }

    /// The settings in force.
    pub fn config(&self) -> StoreConfig {
        self.shared.with_inner(|inner| inner.config().clone())
    }

    /// Starts a put of `key`. Nothing is reserved yet; see [`PendingPut`].
    pub fn begin_put(&self, key: Bytes) -> PendingPut {
        let key_hash = self.shared.key_hash(&key);
        let put_id = self.shared.with_inner(|inner| inner.begin_put(key.clone()));
        PendingPut::new(Arc::clone(&self.shared), put_id, key, key_hash)
    }

    /// Reserves `bytes` of a put that are still arriving over the network (a message
    /// whose length is known before its bytes are buffered), so the budget covers them
    /// before they take memory. Evicts to make room like a put's reservation. `None`
    /// when other reservations leave no room; the put's own reservation then refuses it.
    pub fn reserve_intake(&self, bytes: u64) -> Option<IntakeReservation> {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.reserve_intake(bytes, now))
            .then(|| IntakeReservation {
                shared: Arc::clone(&self.shared),
                bytes,
            })
    }

    /// Records `bytes` of memory the allocator freed but keeps resident for reuse
    /// (`crate::allocator` samples it). They evict nothing by themselves; room made for
    /// new bytes counts them, so a put evicts for what it cannot take from them and
    /// entries + reservations + kept pages stay within the budget.
    pub fn hold_for_allocator(&self, bytes: u64) {
        self.shared
            .with_inner(|inner| inner.hold_for_allocator(bytes));
    }

    /// Looks `key` up for a reader.
    ///
    /// A hit counts in `hits`, makes the entry most recently used and, in `Sliding`
    /// mode, extends its deadline. An expired entry is removed (cause `Expired`) and
    /// counts as a miss. Hits and misses both feed the TinyLFU frequency sketch.
    pub fn get(&self, key: &[u8]) -> Option<Arc<Entry>> {
        let key_hash = self.shared.key_hash(key);
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.get(key, key_hash, now))
    }

    /// Looks `key` up without side effects: no stats, no recency, no TTL refresh.
    /// Expired entries are not returned. For listing and admin views.
    pub fn peek(&self, key: &[u8]) -> Option<Arc<Entry>> {
        let now = self.shared.clock.now();
        self.shared.with_inner(|inner| inner.peek(key, now))
    }

    /// Removes `key` (cause `Explicit`) and fails in-flight puts of it. Returns
    /// whether a live entry was removed; an already expired one is removed with cause
    /// `Expired` and does not count.
    pub fn invalidate(&self, key: &[u8]) -> bool {
        let now = self.shared.clock.now();
        self.shared.with_inner(|inner| inner.invalidate(key, now))
    }

    /// Removes every key starting with `prefix` (cause `Explicit`) and fails
    /// in-flight puts of such keys. Returns how many live entries were removed
    /// (expired ones go too, with cause `Expired`, uncounted).
    pub fn invalidate_prefix(&self, prefix: &[u8]) -> u64 {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.invalidate_prefix(prefix, now))
    }

    /// Removes every entry carrying one of `tags` (cause `Explicit`; expired ones go too,
    /// uncounted) and fails in-flight puts whose entry carries one, whenever their tags
    /// arrived: the commit of a put begun before this call is refused, and so is a
    /// handover of a copy written before it (for 10 minutes). Returns how many live
    /// entries were removed.
    pub fn invalidate_tags(&self, tags: &[Arc<str>]) -> u64 {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.invalidate_tags(tags, now))
    }

    /// Removes every entry (cause `Explicit`, or `Expired` for expired ones) and fails
    /// every in-flight put. Returns how many live entries were removed.
    pub fn clear(&self) -> u64 {
        let now = self.shared.clock.now();
        self.shared.with_inner(|inner| inner.clear(now))
    }

    /// Removes every entry (cause `Explicit`, or `Expired` for expired ones) without
    /// invalidating any key: in-flight puts go on, and later copies of the keys (a
    /// handover, whatever their age) are stored. For a node leaving the key space, whose
    /// entries may be stale while the keys' other holders' are not; [`Store::clear`]
    /// would refuse those holders' handovers for 10 minutes (invalidate wins).
    /// Returns how many live entries were removed.
    pub fn drop_all(&self) -> u64 {
        let now = self.shared.clock.now();
        self.shared.with_inner(|inner| inner.drop_all(now))
    }

    /// Live entries whose key starts with `prefix`, sorted by key, without side
    /// effects. An empty prefix lists everything.
    pub fn list(&self, prefix: &[u8], limit: usize) -> Vec<(Bytes, Arc<Entry>)> {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.list(prefix, now, limit))
    }

    /// Every live entry, hottest first: most hits, then most recently used. What a
    /// handover sends first, so the hot set lands first if the receiver is tight.
    pub fn handoff_list(&self) -> Vec<HandoffEntry> {
        let now = self.shared.clock.now();
        let mut entries = self.shared.with_inner(|inner| inner.handoff_list(now));
        entries.sort_by(|a, b| {
            b.entry
                .hits()
                .cmp(&a.entry.hits())
                .then(b.last_access.cmp(&a.last_access))
                .then_with(|| a.key.cmp(&b.key))
        });
        entries
    }

    /// Removes `key` with cause `Migrated` if it still holds `entry` (not a newer put).
    /// Returns whether it was removed.
    pub fn remove_migrated(&self, key: &[u8], entry: &Arc<Entry>) -> bool {
        self.shared
            .with_inner(|inner| inner.remove_if_same(key, entry, RemovalCause::Migrated))
    }

    /// Removes every expired entry (cause `Expired`) and returns how many. Costs
    /// O(k log n) for k expired entries; meant to run every second.
    pub fn purge_expired(&self) -> u64 {
        let now = self.shared.clock.now();
        self.shared.with_inner(|inner| inner.purge_expired(now))
    }

    /// Applies new settings live, keeping every entry that still fits.
    ///
    /// A TTL or mode change recomputes stored deadlines (see the module docs). Lower
    /// caps evict down to them: expired entries first, then by the new policy (cause
    /// `Size`), entries heavier than a lowered `max_entry_bytes` too. If in-flight
    /// reservations alone exceed the new budget, or one exceeds the new
    /// `max_entry_bytes`, those puts fail (newest first). A policy change keeps the
    /// current recency order; the frequency sketch is resized if `max_entries`
    /// changes enough to change its width.
    ///
    /// # Errors
    ///
    /// Returns [`Error::InvalidConfig`] and changes nothing if `config` is invalid.
    pub fn reconfigure(&self, config: StoreConfig) -> Result<ReconfigureOutcome> {
        let now = self.shared.clock.now();
        self.shared
            .with_inner(|inner| inner.reconfigure(config, now))
    }

    /// The store clock's current time (the time base of [`Entry::expires_at`]).
    pub fn now(&self) -> Duration {
        self.shared.clock.now()
    }

    /// A snapshot of gauges and counters.
    pub fn stats(&self) -> StoreStats {
        self.shared.with_inner(|inner| inner.stats())
    }

    /// Panics if internal structures disagree or a cap is exceeded.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.shared.with_inner(|inner| inner.check_invariants());
        assert_eq!(
            lock_scope::take_freed_under_lock(),
            0,
            "an entry was freed under the store's lock"
        );
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
