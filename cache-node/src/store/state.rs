//! The store's state behind its one lock, and every state transition: reads,
//! two-phase puts, removals, room-making and live reconfiguration.
//!
//! Callers pass `now` and the key hash in, so every method here is a deterministic
//! function of its inputs. Removed entries are parked in `graveyard` so the caller
//! can drop their Arrow memory after releasing the lock. No I/O.
//!
//! Owns: every change to the store's state. No I/O; like all of `store/`, imports
//! nothing outside the store and no gRPC or Flight crate.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::config::{RemovalCause, StoreConfig, TtlMode};
use super::entry::{Entry, Tags};
use super::error::{Error, Result};
use super::eviction::{EvictionOrder, Incoming, Selection, Shares, SlotId};
use super::expiry::{ExpiryIndex, compute_deadline};
use super::journal::JournalSettings;
use super::sealed::SealedEntry;
use super::sketch::FrequencySketch;
use super::types::{CommitOutcome, HandoffEntry, Lifetime, RemovalCounts, StoreStats};

mod reconfigure;

/// A stored entry and the bookkeeping that points at it.
#[derive(Debug)]
struct Slot {
    key: Bytes,
    entry: Arc<Entry>,
    last_access: Duration,
    deadline: Duration,
}

/// A put between `begin_put` and commit or drop.
#[derive(Debug)]
struct PutState {
    key: Bytes,
    reserved: u64,
    /// The tag invalidations counted when it began: one counted since refuses the put at
    /// commit if the entry carries its tag (its tags may arrive after the first bytes).
    tag_invalidations_before: u64,
    /// An invalidation covering `key` happened after `begin_put`.
    invalidated: bool,
    /// Set once the put failed; its reservation is then already released.
    aborted: Option<Error>,
}

/// The data of an entry being committed, weighed outside the lock.
#[derive(Debug)]
pub(crate) struct NewEntry {
    pub(crate) key_hash: u64,
    pub(crate) sealed: SealedEntry,
    pub(crate) weight: u64,
    pub(crate) lifetime: Lifetime,
}

/// Everything the store lock protects.
#[derive(Debug)]
pub(crate) struct Inner {
    config: StoreConfig,
    shares: Shares,
    /// Key to slot, ordered so prefix listing and invalidation are range scans.
    index: BTreeMap<Bytes, SlotId>,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<SlotId>,
    order: EvictionOrder,
    expiry: ExpiryIndex,
    sketch: FrequencySketch,
    puts: HashMap<u64, PutState>,
    next_put_id: u64,
    used_bytes: u64,
    reserved_bytes: u64,
    /// The part of `reserved_bytes` held by intake reservations (bytes of puts still
    /// arriving, not yet tied to an entry).
    intake_bytes: u64,
    /// Freed memory the allocator keeps resident for reuse (sampled, see
    /// `crate::allocator`): not part of `reserved_bytes`, but room for new bytes counts it.
    allocator_bytes: u64,
    hits: u64,
    misses: u64,
    inserts: u64,
    evictions: RemovalCounts,
    rejected_puts: u64,
    discarded_puts: u64,
    /// Removed entries waiting to be dropped outside the lock.
    pub(crate) graveyard: Vec<Arc<Entry>>,
    /// Recent invalidations (a key, or a prefix; `clear` is the empty prefix) and when
    /// they happened, so a handover of an older copy cannot bring the data back.
    tombstones: VecDeque<(Bytes, bool, Duration)>,
    /// Tag to the keys of the stored entries carrying it.
    tag_index: HashMap<Arc<str>, HashSet<Bytes>>,
    /// Recent tag invalidations: each tag's last one, and all of them in order (to forget
    /// the oldest first), so neither a put in flight nor a handover of an older copy
    /// brings back an entry carrying the tag.
    tag_tombstones: HashMap<Arc<str>, TagTombstone>,
    tag_tombstone_order: VecDeque<(Arc<str>, TagTombstone)>,
    /// Tag invalidations so far (the sequence number of the next one).
    tag_invalidations: u64,
    /// Told of every change of the contents, in order (the disk tier), if set.
    journal: Option<JournalSettings>,
}

/// One invalidation of a tag: when (store clock) and its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TagTombstone {
    at: Duration,
    sequence: u64,
}

/// A copy's age travels in whole milliseconds: a copy counts as written up to this much
/// earlier than its age says, so a copy written just before an invalidation is never
/// taken for one written after it.
const COPY_AGE_RESOLUTION: Duration = Duration::from_millis(1);

/// How long an invalidation keeps refusing handovers of older copies of its keys.
pub(crate) const TOMBSTONE_WINDOW: Duration = Duration::from_secs(600);
/// At most this many remembered invalidations (the oldest are forgotten first).
const MAX_TOMBSTONES: usize = 10_000;

impl Inner {
    /// Creates an empty state for an already validated config.
    pub(crate) fn new(config: StoreConfig) -> Self {
        Self {
            shares: Shares::for_caps(config.max_entries, config.budget_bytes),
            sketch: FrequencySketch::for_capacity(config.max_entries),
            config,
            index: BTreeMap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            order: EvictionOrder::new(),
            expiry: ExpiryIndex::new(),
            puts: HashMap::new(),
            next_put_id: 0,
            used_bytes: 0,
            reserved_bytes: 0,
            intake_bytes: 0,
            allocator_bytes: 0,
            hits: 0,
            misses: 0,
            inserts: 0,
            evictions: RemovalCounts::default(),
            rejected_puts: 0,
            discarded_puts: 0,
            graveyard: Vec::new(),
            tombstones: VecDeque::new(),
            tag_index: HashMap::new(),
            tag_tombstones: HashMap::new(),
            tag_tombstone_order: VecDeque::new(),
            tag_invalidations: 0,
            journal: None,
        }
    }

    pub(crate) fn set_journal(&mut self, settings: JournalSettings) {
        self.journal = Some(settings);
    }

    pub(crate) fn touch_in_order(&mut self, keys: &[Bytes]) {
        for key in keys {
            if let Some(&id) = self.index.get(key) {
                self.order.touch(id);
            }
        }
    }

    pub(crate) fn config(&self) -> &StoreConfig {
        &self.config
    }

    // ----- reads -----

    pub(crate) fn get(&mut self, key: &[u8], key_hash: u64, now: Duration) -> Option<Arc<Entry>> {
        self.sketch.increment(key_hash);
        let Some(&id) = self.index.get(key) else {
            self.misses += 1;
            return None;
        };
        let (mode, ttl) = (self.config.ttl_mode, self.config.ttl);
        let Some(slot) = self.slots.get_mut(id).and_then(Option::as_mut) else {
            self.misses += 1;
            return None;
        };
        if slot.deadline <= now {
            self.remove_slot(id, RemovalCause::Expired);
            self.misses += 1;
            return None;
        }
        slot.last_access = now;
        slot.entry.record_hit();
        if let Some(journal) = &self.journal
            && slot.entry.journal_read(now, journal.read_debounce)
        {
            journal.journal.read(&slot.key, now);
        }
        if mode == TtlMode::Sliding {
            let entry_ttl = slot.entry.ttl_override().unwrap_or(ttl);
            let deadline = compute_deadline(mode, slot.entry.created_at(), now, entry_ttl);
            self.expiry.reschedule(id, slot.deadline, deadline);
            slot.deadline = deadline;
            slot.entry.set_expires_at(deadline);
        }
        let entry = Arc::clone(&slot.entry);
        self.order.touch(id);
        self.hits += 1;
        Some(entry)
    }

    pub(crate) fn peek(&self, key: &[u8], now: Duration) -> Option<Arc<Entry>> {
        let slot = self.slot(*self.index.get(key)?)?;
        (slot.deadline > now).then(|| Arc::clone(&slot.entry))
    }

    pub(crate) fn list(
        &self,
        prefix: &[u8],
        now: Duration,
        limit: usize,
    ) -> Vec<(Bytes, Arc<Entry>)> {
        self.prefix_range(prefix)
            .filter_map(|(_, &id)| self.slot(id))
            .filter(|slot| slot.deadline > now)
            .take(limit)
            .map(|slot| (slot.key.clone(), Arc::clone(&slot.entry)))
            .collect()
    }

    pub(crate) fn handoff_list(&self, now: Duration) -> Vec<HandoffEntry> {
        self.index
            .values()
            .filter_map(|&id| self.slot(id))
            .filter(|slot| slot.deadline > now)
            .map(|slot| HandoffEntry {
                key: slot.key.clone(),
                entry: Arc::clone(&slot.entry),
                last_access: slot.last_access,
            })
            .collect()
    }

    pub(crate) fn remove_if_same(
        &mut self,
        key: &[u8],
        entry: &Arc<Entry>,
        cause: RemovalCause,
    ) -> bool {
        let Some(&id) = self.index.get(key) else {
            return false;
        };
        if !self
            .slot(id)
            .is_some_and(|slot| Arc::ptr_eq(&slot.entry, entry))
        {
            return false;
        }
        self.remove_slot(id, cause);
        true
    }

    // ----- two-phase puts -----

    pub(crate) fn begin_put(&mut self, key: Bytes) -> u64 {
        let id = self.next_put_id;
        self.next_put_id += 1;
        let put = PutState {
            key,
            reserved: 0,
            tag_invalidations_before: self.tag_invalidations,
            invalidated: false,
            aborted: None,
        };
        self.puts.insert(id, put);
        id
    }

    pub(crate) fn reserved_by(&self, put_id: u64) -> u64 {
        self.puts.get(&put_id).map_or(0, |put| put.reserved)
    }

    /// Grows a put's reservation. `counts_toward_entry` is false for bytes held only
    /// while a message is decoded (they are not part of the entry's size, so they do
    /// not count against `max_entry_bytes`, only against the budget).
    pub(crate) fn reserve(
        &mut self,
        put_id: u64,
        additional: u64,
        counts_toward_entry: bool,
        now: Duration,
    ) -> Result<()> {
        // A put's state lives until its commit or drop, so this is unreachable.
        let Some(put) = self.puts.get(&put_id) else {
            return Err(Error::InvalidatedDuringPut);
        };
        if let Some(error) = &put.aborted {
            return Err(error.clone());
        }
        if put.invalidated {
            return self.abort_put(put_id, Error::InvalidatedDuringPut);
        }
        let total = put.reserved.saturating_add(additional);
        let max = self.config.max_entry_bytes;
        if counts_toward_entry && total > max {
            return self.abort_put(put_id, Error::EntryTooLarge { size: total, max });
        }
        let reserved_by_others = self.reserved_bytes - put.reserved;
        if total > self.config.budget_bytes.saturating_sub(reserved_by_others) {
            let available = self.free_bytes();
            let error = Error::OverBudget {
                needed: additional,
                available,
            };
            return self.abort_put(put_id, error);
        }
        let incoming = Incoming {
            entries: 1,
            bytes: total,
        };
        if !self.make_room(additional, incoming, now).1 {
            let available = self.free_bytes();
            let error = Error::OverBudget {
                needed: additional,
                available,
            };
            return self.abort_put(put_id, error);
        }
        if let Some(put) = self.puts.get_mut(&put_id) {
            put.reserved = total;
            self.reserved_bytes += additional;
        }
        Ok(())
    }

    pub(crate) fn commit(
        &mut self,
        put_id: u64,
        new: NewEntry,
        now: Duration,
    ) -> Result<CommitOutcome> {
        // Whatever happens next, the put is over and its reservation released.
        // A put's state lives until its commit or drop, so this is unreachable.
        let Some(put) = self.puts.remove(&put_id) else {
            return Err(Error::InvalidatedDuringPut);
        };
        self.reserved_bytes -= put.reserved;
        if let Some(error) = put.aborted {
            return Err(error);
        }
        let tags = &new.lifetime.tags;
        // A copy (a second copy, a handover) is as old as its age says: a tag invalidated
        // since it was written makes it stale, as one invalidated since this put began
        // does any put.
        let copy = new.lifetime.remaining.is_some() || new.lifetime.if_absent;
        let written = now
            .saturating_sub(new.lifetime.age)
            .saturating_sub(COPY_AGE_RESOLUTION);
        let stale_copy = copy && self.tag_invalidated_at_or_after(tags, written);
        if put.invalidated
            || self.tag_invalidated_after(tags, put.tag_invalidations_before)
            || (stale_copy && !new.lifetime.if_absent)
        {
            self.discarded_puts += 1;
            return Err(Error::InvalidatedDuringPut);
        }
        let max = self.config.max_entry_bytes;
        if new.weight > max {
            self.rejected_puts += 1;
            return Err(Error::EntryTooLarge {
                size: new.weight,
                max,
            });
        }
        // Every stored entry is evictable, reservations of other puts are not; refuse
        // before evicting anything if even an empty store could not hold the entry.
        if new.weight > self.config.budget_bytes.saturating_sub(self.reserved_bytes) {
            self.rejected_puts += 1;
            let available = self.free_bytes();
            return Err(Error::OverBudget {
                needed: new.weight,
                available,
            });
        }
        let mut replaced = false;
        if new.lifetime.if_absent {
            let live = self
                .index
                .get(&put.key)
                .and_then(|&old| self.slot(old))
                .filter(|slot| slot.deadline > now)
                .map(|slot| slot.deadline);
            let written = now.saturating_sub(new.lifetime.age);
            if live.is_some() || self.invalidated_since(&put.key, written) || stale_copy {
                return Ok(CommitOutcome {
                    weight_bytes: 0,
                    replaced: false,
                    evicted: 0,
                    expires_at: live.unwrap_or(now),
                    kept_existing: true,
                });
            }
        }
        if let Some(&old) = self.index.get(&put.key) {
            let old_expired = self.slot(old).is_some_and(|slot| slot.deadline <= now);
            replaced = !old_expired;
            let cause = if old_expired {
                RemovalCause::Expired
            } else {
                RemovalCause::Replaced
            };
            self.remove_slot(old, cause);
        }
        let incoming = Incoming {
            entries: 1,
            bytes: new.weight,
        };
        let (mut evicted, fits) = self.make_room(new.weight, incoming, now);
        while fits && self.index.len() as u64 >= self.config.max_entries {
            match self.evict_one(incoming, now) {
                Some(_) => evicted += 1,
                None => break,
            }
        }
        if !fits || self.index.len() as u64 >= self.config.max_entries {
            // Unreachable while the accounting invariants hold: max_entries >= 1 and
            // the feasibility check above guarantee evicting everything makes room.
            self.rejected_puts += 1;
            let available = self.free_bytes();
            return Err(Error::OverBudget {
                needed: new.weight,
                available,
            });
        }
        let lifetime = new.lifetime;
        let ttl = lifetime.ttl_override.unwrap_or(self.config.ttl);
        let created_at = now.saturating_sub(lifetime.age);
        let last_access = now.saturating_sub(lifetime.idle).max(created_at);
        let mut deadline = compute_deadline(self.config.ttl_mode, created_at, last_access, ttl);
        if let Some(remaining) = lifetime.remaining {
            deadline = deadline.min(now.saturating_add(remaining));
        }
        let entry = Entry::new(
            new.sealed,
            new.weight,
            created_at,
            lifetime.ttl_override,
            Tags::clone(&lifetime.tags),
            deadline,
            last_access,
        );
        let entry = Arc::new(entry);
        if let Some(journal) = &self.journal
            && !lifetime.journaled
        {
            journal.journal.stored(&put.key, &entry, last_access);
        }
        let id = self.alloc_slot(Slot {
            key: put.key.clone(),
            entry,
            last_access,
            deadline,
        });
        for tag in lifetime.tags.iter() {
            self.tag_index
                .entry(Arc::clone(tag))
                .or_default()
                .insert(put.key.clone());
        }
        self.index.insert(put.key, id);
        self.order
            .insert(id, new.key_hash, new.weight, self.config.eviction);
        self.expiry.insert(deadline, id);
        self.used_bytes += new.weight;
        self.inserts += 1;
        Ok(CommitOutcome {
            weight_bytes: new.weight,
            replaced,
            evicted,
            expires_at: deadline,
            kept_existing: false,
        })
    }

    /// Counts a put the caller refused before reserving its bytes.
    pub(crate) fn note_rejected_put(&mut self) {
        self.rejected_puts += 1;
    }

    /// Forgets a put that was dropped without commit, releasing its reservation.
    /// Reserves `bytes` of a put still arriving, evicting (expired entries first, then
    /// by policy) to make room. False, with nothing reserved or evicted, when other
    /// reservations leave no room for them.
    pub(crate) fn reserve_intake(&mut self, bytes: u64, now: Duration) -> bool {
        if bytes > self.config.budget_bytes.saturating_sub(self.reserved_bytes) {
            return false;
        }
        let incoming = Incoming { entries: 0, bytes };
        if !self.make_room(bytes, incoming, now).1 {
            return false;
        }
        self.reserved_bytes += bytes;
        self.intake_bytes += bytes;
        true
    }

    /// Gives back an intake reservation.
    pub(crate) fn release_intake(&mut self, bytes: u64) {
        let released = bytes.min(self.intake_bytes);
        self.intake_bytes -= released;
        self.reserved_bytes -= released;
    }

    /// Records `bytes` of freed memory the allocator keeps resident. They evict nothing
    /// by themselves (evicting an entry only adds its pages to them until they are
    /// reused or returned); room made for a reservation counts them, so a put evicts for
    /// the pages it cannot take from them.
    pub(crate) fn hold_for_allocator(&mut self, bytes: u64) {
        self.allocator_bytes = bytes;
    }

    /// Shrinks a put's reservation by up to `bytes`.
    pub(crate) fn shrink_reservation(&mut self, put_id: u64, bytes: u64) {
        if let Some(put) = self.puts.get_mut(&put_id) {
            let released = bytes.min(put.reserved);
            put.reserved -= released;
            self.reserved_bytes -= released;
        }
    }

    pub(crate) fn release_put(&mut self, put_id: u64) {
        if let Some(put) = self.puts.remove(&put_id) {
            self.reserved_bytes -= put.reserved;
        }
    }

    /// Fails a put: releases its reservation and remembers the error for later calls.
    fn abort_put(&mut self, put_id: u64, error: Error) -> Result<()> {
        if let Some(put) = self.puts.get_mut(&put_id) {
            self.reserved_bytes -= put.reserved;
            put.reserved = 0;
            put.aborted = Some(error.clone());
            match error {
                Error::InvalidatedDuringPut => self.discarded_puts += 1,
                _ => self.rejected_puts += 1,
            }
        }
        Err(error)
    }

    // ----- invalidation and expiry -----

    /// Remembers an invalidation of `key` (or of every key under it when `prefix`).
    fn add_tombstone(&mut self, key: &[u8], prefix: bool, now: Duration) {
        if self.tombstones.len() >= MAX_TOMBSTONES {
            self.tombstones.pop_front();
        }
        self.tombstones
            .push_back((Bytes::copy_from_slice(key), prefix, now));
    }

    /// True if `key` was invalidated at or after `written` (within the window): a
    /// handed-over copy written then is stale.
    fn invalidated_since(&self, key: &[u8], written: Duration) -> bool {
        self.tombstones.iter().any(|(covered, prefix, at)| {
            *at >= written
                && if *prefix {
                    key.starts_with(covered)
                } else {
                    key == &covered[..]
                }
        })
    }

    pub(crate) fn invalidate(&mut self, key: &[u8], now: Duration) -> bool {
        self.add_tombstone(key, false, now);
        self.mark_puts_invalidated(|put_key| put_key == key);
        match self.index.get(key) {
            Some(&id) => self.remove_invalidated(id, now),
            None => false,
        }
    }

    pub(crate) fn invalidate_prefix(&mut self, prefix: &[u8], now: Duration) -> u64 {
        self.add_tombstone(prefix, true, now);
        self.mark_puts_invalidated(|put_key| put_key.starts_with(prefix));
        let ids: Vec<SlotId> = self.prefix_range(prefix).map(|(_, &id)| id).collect();
        self.remove_all_invalidated(ids, now)
    }

    pub(crate) fn clear(&mut self, now: Duration) -> u64 {
        self.add_tombstone(b"", true, now);
        self.mark_puts_invalidated(|_| true);
        let ids: Vec<SlotId> = self.index.values().copied().collect();
        self.remove_all_invalidated(ids, now)
    }

    /// Removes every entry carrying one of `tags`; remembers the invalidation so that a
    /// put of such an entry begun before it, or a handover of an older copy, is refused.
    pub(crate) fn invalidate_tags(&mut self, tags: &[Arc<str>], now: Duration) -> u64 {
        let mut ids: Vec<SlotId> = Vec::new();
        for tag in tags {
            self.add_tag_tombstone(tag, now);
            if let Some(keys) = self.tag_index.get(tag) {
                ids.extend(keys.iter().filter_map(|key| self.index.get(key).copied()));
            }
        }
        ids.sort_unstable();
        ids.dedup();
        self.remove_all_invalidated(ids, now)
    }

    fn add_tag_tombstone(&mut self, tag: &Arc<str>, now: Duration) {
        if self.tag_tombstone_order.len() >= MAX_TOMBSTONES {
            self.forget_oldest_tag_tombstone();
        }
        self.tag_invalidations += 1;
        let tombstone = TagTombstone {
            at: now,
            sequence: self.tag_invalidations,
        };
        self.tag_tombstones.insert(Arc::clone(tag), tombstone);
        self.tag_tombstone_order
            .push_back((Arc::clone(tag), tombstone));
    }

    fn forget_oldest_tag_tombstone(&mut self) {
        if let Some((tag, at)) = self.tag_tombstone_order.pop_front()
            && self.tag_tombstones.get(&tag) == Some(&at)
        {
            self.tag_tombstones.remove(&tag);
        }
    }

    /// True if one of `tags` was invalidated after the first `sequence` invalidations.
    fn tag_invalidated_after(&self, tags: &Tags, sequence: u64) -> bool {
        sequence < self.tag_invalidations
            && self.any_tag_tombstone(tags, |tombstone| tombstone.sequence > sequence)
    }

    /// True if one of `tags` was invalidated at or after `since` (within the window).
    fn tag_invalidated_at_or_after(&self, tags: &Tags, since: Duration) -> bool {
        self.any_tag_tombstone(tags, |tombstone| tombstone.at >= since)
    }

    fn any_tag_tombstone(&self, tags: &Tags, matches: impl Fn(&TagTombstone) -> bool) -> bool {
        !self.tag_tombstones.is_empty()
            && tags
                .iter()
                .any(|tag| self.tag_tombstones.get(tag).is_some_and(&matches))
    }

    pub(crate) fn drop_all(&mut self, now: Duration) -> u64 {
        // Removed as an invalidation removes (same causes), but no tombstone is laid and
        // no put in flight fails.
        let ids: Vec<SlotId> = self.index.values().copied().collect();
        self.remove_all_invalidated(ids, now)
    }

    pub(crate) fn purge_expired(&mut self, now: Duration) -> u64 {
        if !self.tombstones.is_empty() {
            self.tombstones
                .retain(|(_, _, at)| now.saturating_sub(*at) < TOMBSTONE_WINDOW);
        }
        while self
            .tag_tombstone_order
            .front()
            .is_some_and(|(_, tombstone)| now.saturating_sub(tombstone.at) >= TOMBSTONE_WINDOW)
        {
            self.forget_oldest_tag_tombstone();
        }
        let mut purged = 0;
        while let Some(id) = self.expiry.first_expired(now) {
            self.remove_slot(id, RemovalCause::Expired);
            purged += 1;
        }
        purged
    }

    fn mark_puts_invalidated(&mut self, covers: impl Fn(&[u8]) -> bool) {
        for put in self.puts.values_mut() {
            if covers(&put.key) {
                put.invalidated = true;
            }
        }
    }

    fn remove_all_invalidated(&mut self, ids: Vec<SlotId>, now: Duration) -> u64 {
        ids.into_iter()
            .map(|id| u64::from(self.remove_invalidated(id, now)))
            .sum()
    }

    /// Removes an entry on invalidation: `Explicit` if live, `Expired` (and not
    /// counted as invalidated) if its deadline had already passed.
    fn remove_invalidated(&mut self, id: SlotId, now: Duration) -> bool {
        let live = self.slot(id).is_some_and(|slot| slot.deadline > now);
        let cause = if live {
            RemovalCause::Explicit
        } else {
            RemovalCause::Expired
        };
        self.remove_slot(id, cause);
        live
    }

    // ----- room making -----

    /// Evicts until `needed` more bytes fit: expired entries first, then by policy.
    /// `incoming` is what will enter the eviction window afterwards. Returns the
    /// number evicted and whether the bytes now fit.
    ///
    /// Room counts the pages the allocator keeps ([`Self::hold_for_allocator`]): they
    /// are resident, and a put takes its memory from them first. When no entry is left
    /// to evict, the bytes fit if reservations and entries alone leave room: the put
    /// then reuses those pages instead of adding to them.
    fn make_room(&mut self, needed: u64, incoming: Incoming, now: Duration) -> (u64, bool) {
        let mut evicted = 0;
        while self.free_bytes() < needed {
            if self.evict_one(incoming, now).is_none() {
                let fits = self
                    .config
                    .budget_bytes
                    .saturating_sub(self.used_bytes + self.reserved_bytes)
                    >= needed;
                return (evicted, fits);
            }
            evicted += 1;
        }
        (evicted, true)
    }

    /// Removes one entry to free room: the earliest expired one if any (cause
    /// `Expired`), else the policy's victim (cause `Size`).
    fn evict_one(&mut self, incoming: Incoming, now: Duration) -> Option<RemovalCause> {
        if let Some(id) = self.expiry.first_expired(now) {
            self.remove_slot(id, RemovalCause::Expired);
            return Some(RemovalCause::Expired);
        }
        loop {
            match self
                .order
                .select(self.config.eviction, self.shares, incoming, &self.sketch)?
            {
                Selection::Promote(candidate) => self.order.promote(candidate),
                Selection::Evict { victim, admit } => {
                    if let Some(candidate) = admit {
                        self.order.promote(candidate);
                    }
                    self.remove_slot(victim, RemovalCause::Size);
                    return Some(RemovalCause::Size);
                }
            }
        }
    }

    /// Budget left beside entries, reservations and the allocator's kept pages.
    fn free_bytes(&self) -> u64 {
        self.config
            .budget_bytes
            .saturating_sub(self.used_bytes + self.reserved_bytes + self.allocator_bytes)
    }

    // ----- stats -----

    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.index.len() as u64,
            used_bytes: self.used_bytes,
            reserved_bytes: self.reserved_bytes,
            allocator_bytes: self.allocator_bytes,
            budget_bytes: self.config.budget_bytes,
            max_entries: self.config.max_entries,
            in_flight_puts: self.puts.len() as u64,
            hits: self.hits,
            misses: self.misses,
            inserts: self.inserts,
            evictions: self.evictions,
            rejected_puts: self.rejected_puts,
            discarded_puts: self.discarded_puts,
        }
    }

    // ----- slots -----

    fn slot(&self, id: SlotId) -> Option<&Slot> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    fn alloc_slot(&mut self, slot: Slot) -> SlotId {
        match self.free_slots.pop() {
            Some(id) => {
                if let Some(free) = self.slots.get_mut(id) {
                    *free = Some(slot);
                }
                id
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    /// Removes a stored entry from every structure and counts the removal.
    fn remove_slot(&mut self, id: SlotId, cause: RemovalCause) {
        let Some(slot) = self.slots.get_mut(id).and_then(Option::take) else {
            return;
        };
        self.index.remove(&slot.key);
        for tag in slot.entry.tags().iter() {
            if let Some(keys) = self.tag_index.get_mut(tag) {
                keys.remove(&slot.key);
                if keys.is_empty() {
                    self.tag_index.remove(tag);
                }
            }
        }
        self.order.remove(id);
        self.expiry.remove(slot.deadline, id);
        self.used_bytes -= slot.entry.weight_bytes();
        self.evictions.record(cause);
        self.free_slots.push(id);
        if let Some(journal) = &self.journal {
            journal.journal.removed(&slot.key);
        }
        self.graveyard.push(slot.entry);
    }

    fn prefix_range<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Bytes, &'a SlotId)> + 'a {
        self.index
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(key, _)| key.starts_with(prefix))
    }

    /// Panics if the internal structures disagree or a cap is exceeded.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let live: Vec<&Slot> = self.slots.iter().flatten().collect();
        assert_eq!(live.len(), self.index.len(), "slots vs index");
        assert_eq!(self.order.len(), self.index.len() as u64, "order vs index");
        assert_eq!(self.expiry.len(), self.index.len(), "expiry vs index");
        let weights: u64 = live.iter().map(|slot| slot.entry.weight_bytes()).sum();
        assert_eq!(weights, self.used_bytes, "used bytes");
        assert_eq!(self.order.bytes(), self.used_bytes, "order bytes");
        let reserved: u64 = self.puts.values().map(|put| put.reserved).sum();
        assert_eq!(
            reserved + self.intake_bytes,
            self.reserved_bytes,
            "reserved bytes"
        );
        assert!(
            self.used_bytes + self.reserved_bytes <= self.config.budget_bytes,
            "budget exceeded"
        );
        assert!(
            self.index.len() as u64 <= self.config.max_entries,
            "entry cap exceeded"
        );
        let tagged: usize = live.iter().map(|slot| slot.entry.tags().len()).sum();
        let indexed: usize = self.tag_index.values().map(HashSet::len).sum();
        assert_eq!(tagged, indexed, "tag index vs entries' tags");
        for (tag, keys) in &self.tag_index {
            assert!(!keys.is_empty(), "empty tag set kept");
            for key in keys {
                let slot = self.slot(self.index[key]).expect("tagged key is stored");
                assert!(slot.entry.tags().contains(tag), "tag index vs entry");
            }
        }
        for (key, &id) in &self.index {
            let slot = self.slot(id).expect("indexed slot exists");
            assert_eq!(&slot.key, key);
            assert_eq!(slot.entry.expires_at(), slot.deadline);
            assert!(
                slot.entry.weight_bytes() <= self.config.max_entry_bytes,
                "entry too large"
            );
        }
    }
}
