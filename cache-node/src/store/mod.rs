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
//! Owns: entries (sealed, opaque frames: `sealed.rs`), the budget, TTL, eviction. Must
//! not import tonic, arrow-flight, hyper or h2 (`scripts/check-layers`), nor `flight/`,
//! `wire/` or `routing/`.

mod clock;
mod config;
mod entry;
mod eviction;
mod expiry;
mod journal;
mod put;
mod sealed;
mod sketch;
mod state;
pub mod weight;

#[cfg(test)]
mod tests;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::config::{EvictionPolicy, RemovalCause, StoreConfig, TtlMode};
pub use self::entry::Entry;
pub use self::journal::{Journal, JournalSettings};
pub use self::put::PendingPut;
pub use self::sealed::{SealedBatch, SealedEntry, SealedSchema, WireMessage};
use self::state::Inner;
pub use self::weight::BATCH_OVERHEAD_BYTES;
pub use self::weight::{batch_weight, entry_weight};

/// Budget held for bytes of a put still arriving; released on drop.
pub struct IntakeReservation {
    shared: Arc<Shared>,
    bytes: u64,
}

impl IntakeReservation {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back what is held above `bytes` (a reservation never grows).
    pub fn shrink_to(&mut self, bytes: u64) {
        let released = self.bytes.saturating_sub(bytes);
        if released > 0 {
            self.bytes -= released;
            self.shared
                .with_inner(|inner| inner.release_intake(released));
        }
    }
}

impl std::fmt::Debug for IntakeReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntakeReservation")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Drop for IntakeReservation {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.shared.with_inner(|inner| inner.release_intake(bytes));
    }
}

/// Whether every message of one DoPut so far had its bytes reserved as it arrived
/// ([`Store::reserve_intake`], by the wire layer). While that holds, the put need not
/// reserve a message's received bytes a second time while it decodes them: the intake
/// reservation still covers them (it is released only when the next message is read).
/// One per request, shared by the wire layer (which sets it) and the put.
///
/// It also carries the bodies of large messages that the wire layer received straight
/// into their own exactly sized allocation (`wire::intake`), each with its intake
/// reservation: the put reads the message, takes its body back
/// ([`take_body`](Self::take_body)) and, once the body is sealed as it is, turns that
/// reservation into the entry's charge ([`claim`](Self::claim),
/// [`PendingPut::reserve_replacing`]) so the bytes are counted once. At most the messages
/// the gRPC decoder has read ahead of the put wait here (it reads a message only when
/// the put asks for the next one), and the bytes of every one are reserved.
#[derive(Debug, Default)]
pub struct IntakeCover {
    uncovered: std::sync::atomic::AtomicBool,
    /// Bodies received but not yet read by the put, in message order.
    diverted: Mutex<std::collections::VecDeque<DivertedBody>>,
    /// The reservation of the body of the message the put reads now, until the put
    /// claims it or reads the next message; with the body's address and length.
    reading: Mutex<Option<(usize, usize, IntakeReservation)>>,
}

/// A message body the wire layer received into its own allocation.
#[derive(Debug)]
struct DivertedBody {
    /// The message's place in the request stream (0 for the first).
    sequence: u64,
    body: Bytes,
    reservation: Option<IntakeReservation>,
}

impl IntakeCover {
    /// Keeps the body of message `sequence` (received into its own allocation, with the
    /// intake reservation that covers it) until the put reads the message.
    pub fn divert(&self, sequence: u64, body: Bytes, reservation: Option<IntakeReservation>) {
        self.diverted.lock().push_back(DivertedBody {
            sequence,
            body,
            reservation,
        });
    }

    /// The body of message `sequence`, if the wire layer received it apart; called once
    /// per message as the put reads it, in order. The reservation of the message read
    /// before is given back unless the put claimed it.
    pub fn take_body(&self, sequence: u64) -> Option<Bytes> {
        let mut reading = self.reading.lock();
        *reading = None;
        let mut diverted = self.diverted.lock();
        // Bodies of messages the reader never saw (none, in order) are dropped.
        while diverted.front().is_some_and(|d| d.sequence < sequence) {
            diverted.pop_front();
        }
        if diverted.front().is_none_or(|d| d.sequence != sequence) {
            return None;
        }
        let taken = diverted.pop_front()?;
        if let Some(reservation) = taken.reservation {
            *reading = Some((taken.body.as_ptr() as usize, taken.body.len(), reservation));
        }
        Some(taken.body)
    }

    /// The intake reservation of `body` if it is the diverted body of the message read
    /// last (the caller then owns it).
    pub fn claim(&self, body: &[u8]) -> Option<IntakeReservation> {
        let mut reading = self.reading.lock();
        match &*reading {
            Some((address, len, _)) if *address == body.as_ptr() as usize && *len == body.len() => {
                reading.take().map(|(_, _, reservation)| reservation)
            }
            _ => None,
        }
    }

    /// A message of the request passed without a reservation (no room beside others).
    pub fn note_uncovered(&self) {
        self.uncovered
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether every message so far was reserved on arrival.
    pub fn all_covered(&self) -> bool {
        !self.uncovered.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Errors of the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A [`StoreConfig`] field breaks a rule.
    #[error("invalid store config: {field} {rule}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The put's total size exceeds `max_entry_bytes`.
    #[error("entry of {size} bytes exceeds the limit of {max} bytes per entry")]
    EntryTooLarge {
        /// The put's size so far (reservation) or its exact weight (commit).
        size: u64,
        /// The configured `max_entry_bytes`.
        max: u64,
    },
    /// The bytes cannot fit in the budget even after evicting every stored entry,
    /// because other puts hold the rest as reservations.
    #[error("store budget exhausted: {needed} bytes needed, {available} free")]
    OverBudget {
        /// Bytes asked for.
        needed: u64,
        /// Bytes free before any eviction.
        available: u64,
    },
    /// An invalidation covering the key happened while the put was in flight; the
    /// data was discarded.
    #[error("put discarded: its key was invalidated while it was being written")]
    InvalidatedDuringPut,
    /// The batches could not be encoded into their stored IPC form (a batch that does
    /// not match the schema).
    #[error("the batches cannot be stored: {0}")]
    Unencodable(String),
}

/// The store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Removals counted per [`RemovalCause`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemovalCounts {
    /// Entries removed because their TTL ran out.
    pub expired: u64,
    /// Entries evicted to respect a cap.
    pub size: u64,
    /// Entries removed by invalidate, invalidate_prefix or clear.
    pub explicit: u64,
    /// Entries replaced by a newer put under the same key.
    pub replaced: u64,
    /// Entries handed to their owners and removed here.
    pub migrated: u64,
}

impl RemovalCounts {
    /// The count for one cause.
    pub fn get(&self, cause: RemovalCause) -> u64 {
        match cause {
            RemovalCause::Expired => self.expired,
            RemovalCause::Size => self.size,
            RemovalCause::Explicit => self.explicit,
            RemovalCause::Replaced => self.replaced,
            RemovalCause::Migrated => self.migrated,
        }
    }

    pub(crate) fn record(&mut self, cause: RemovalCause) {
        let counter = match cause {
            RemovalCause::Expired => &mut self.expired,
            RemovalCause::Size => &mut self.size,
            RemovalCause::Explicit => &mut self.explicit,
            RemovalCause::Replaced => &mut self.replaced,
            RemovalCause::Migrated => &mut self.migrated,
        };
        *counter += 1;
    }
}

/// A snapshot of the store's gauges and counters, for metrics and admin listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries stored, expired-but-not-yet-purged ones included.
    pub entries: u64,
    /// Bytes charged for stored entries.
    pub used_bytes: u64,
    /// Bytes reserved by in-flight puts.
    pub reserved_bytes: u64,
    /// Freed memory the allocator keeps resident for reuse, as last sampled
    /// ([`Store::hold_for_allocator`]); room for new bytes counts it.
    pub allocator_bytes: u64,
    /// The configured byte budget.
    pub budget_bytes: u64,
    /// The configured entry cap.
    pub max_entries: u64,
    /// Puts begun and neither committed nor dropped.
    pub in_flight_puts: u64,
    /// `get`s that returned an entry.
    pub hits: u64,
    /// `get`s that returned nothing (absent or expired).
    pub misses: u64,
    /// Entries installed by a commit.
    pub inserts: u64,
    /// Entries removed, per cause (the `evictions_total{cause}` metric).
    pub evictions: RemovalCounts,
    /// Puts refused as too large or over budget.
    pub rejected_puts: u64,
    /// Puts discarded because an invalidation covered their key.
    pub discarded_puts: u64,
}

/// What a successful commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitOutcome {
    /// Bytes charged for the new entry.
    pub weight_bytes: u64,
    /// Whether a live entry under the same key was replaced.
    pub replaced: bool,
    /// Entries removed to make room (expired or by policy).
    pub evicted: u64,
    /// The new entry's deadline on the store clock.
    pub expires_at: Duration,
    /// Nothing was installed: the put asked to store only if absent
    /// ([`Lifetime::if_absent`]) and a live entry was already there, or the key was
    /// invalidated after the copy was written (within the last 10 minutes), so the copy
    /// is stale.
    pub kept_existing: bool,
}

/// How long a committed entry lives: its TTL override, and for an entry handed over from
/// another node the age it already has there. [`Lifetime::default`] is a fresh put.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifetime {
    /// Replaces the store TTL for this entry.
    pub ttl_override: Option<Duration>,
    /// Time since the entry was first written (its insert time becomes `now - age`).
    pub age: Duration,
    /// Time since it was last read or written (its last access becomes `now - idle`).
    pub idle: Duration,
    /// Its deadline is at most `now + remaining` (the sender's deadline, never extended
    /// by a handover).
    pub remaining: Option<Duration>,
    /// Install only if no live entry is stored under the key (a handover must not
    /// overwrite a newer write) and the key was not invalidated since the copy was
    /// written (`now - age`; invalidations are remembered for 10 minutes), so a handover
    /// cannot bring back invalidated data.
    pub if_absent: bool,
    /// The entry comes from the journal itself (a disk tier reloading what it wrote):
    /// it is not reported to the journal as stored again.
    pub journaled: bool,
}

/// One stored entry with the bookkeeping a handover needs ([`Store::handoff_list`]).
#[derive(Debug, Clone)]
pub struct HandoffEntry {
    /// The store key.
    pub key: Bytes,
    /// The entry.
    pub entry: Arc<Entry>,
    /// When it was last read or written, on the store clock.
    pub last_access: Duration,
}

/// What a [`Store::reconfigure`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconfigureOutcome {
    /// Entries whose deadline moved because the TTL or mode changed.
    pub rescheduled_entries: u64,
    /// Entries evicted (cause `Size`) to fit lowered caps.
    pub evicted_entries: u64,
    /// Expired entries removed while making room.
    pub expired_entries: u64,
    /// In-flight puts failed because their reservation no longer fits.
    pub aborted_puts: u64,
}

/// The lock-scope rule, checked in tests: an entry's memory is never freed while the
/// store's lock is held (freeing megabytes of Arrow buffers would make every reader
/// wait). `Entry`'s drop counts violations per thread; `check_invariants` asserts that
/// the calling thread made none.
#[cfg(test)]
pub(crate) mod lock_scope {
    use std::cell::Cell;

    thread_local! {
        /// Whether this thread is inside `Shared::with_inner`.
        pub(crate) static HELD: Cell<bool> = const { Cell::new(false) };
        /// Entries this thread dropped while inside it.
        static FREED_UNDER_LOCK: Cell<u64> = const { Cell::new(0) };
    }

    /// Called when an entry is dropped.
    pub(crate) fn entry_dropped() {
        if HELD.get() {
            FREED_UNDER_LOCK.set(FREED_UNDER_LOCK.get() + 1);
        }
    }

    /// Entries this thread freed under the lock so far; resets the count.
    pub(crate) fn take_freed_under_lock() -> u64 {
        FREED_UNDER_LOCK.replace(0)
    }
}

/// State shared by a [`Store`] and its [`PendingPut`]s.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    clock: Arc<dyn Clock>,
    hasher: RandomState,
}

impl Shared {
    /// Runs `operation` under the lock, then drops removed entries after unlocking,
    /// so freeing Arrow memory never delays other callers.
    pub(crate) fn with_inner<R>(&self, operation: impl FnOnce(&mut Inner) -> R) -> R {
        let (result, removed) = {
            let mut inner = self.inner.lock();
            #[cfg(test)]
            lock_scope::HELD.set(true);
            let result = operation(&mut inner);
            #[cfg(test)]
            lock_scope::HELD.set(false);
            (result, std::mem::take(&mut inner.graveyard))
        };
        drop(removed);
        result
    }

    fn key_hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }
}

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
///     eviction: EvictionPolicy::TinyLfu,
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
        let shared = Shared {
            inner: Mutex::new(Inner::new(config)),
            clock,
            hasher: RandomState::new(),
        };
        Ok(Self {
            shared: Arc::new(shared),
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
