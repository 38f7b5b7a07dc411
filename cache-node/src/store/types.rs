//! The store's plain types: the figures and outcomes its methods take and answer with
//! (removal counts, statistics, a commit's and a reconfiguration's outcome, an entry's
//! lifetime, a handover's entry).
//!
//! Owns: data types only, no logic beyond counting. Below every other module of the
//! store, which all use them; imports only `config` and `entry`. No I/O.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::config::RemovalCause;
use super::entry::{Entry, Tags};

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
    /// ([`Store::hold_for_allocator`](super::Store::hold_for_allocator)); room for new bytes counts it.
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

/// How a committed entry is installed: how long it lives (its TTL override, and for an
/// entry handed over from another node the age it already has there), the tags it
/// carries, and whether it may replace a live entry. [`Lifetime::default`] is a fresh
/// put without tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// The entry's tags (`invalidate-tag` removes it when it names one). Also checked
    /// against the tags invalidated since the put began (or, for a handover, since the
    /// copy was written): an invalidation wins over a put in flight.
    pub tags: Tags,
}

/// One stored entry with the bookkeeping a handover needs ([`Store::handoff_list`](super::Store::handoff_list)).
#[derive(Debug, Clone)]
pub struct HandoffEntry {
    /// The store key.
    pub key: Bytes,
    /// The entry.
    pub entry: Arc<Entry>,
    /// When it was last read or written, on the store clock.
    pub last_access: Duration,
}

/// What a [`Store::reconfigure`](super::Store::reconfigure) did.
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
